"""Sphinx configuration of the hpcgpu documentation site.

Why Sphinx (and not MkDocs): every docstring in hpcgpu is numpydoc, that is
reStructuredText (``literals``, ``::`` blocks, ``.. math::``), which Sphinx reads
natively and numpydoc lays out; mkdocstrings would read them as Markdown.
The guide pages are Markdown through MyST, and myst-nb renders the notebooks
without pandoc. Nothing is fetched while building (no intersphinx): the site
builds offline, and CI builds it with warnings as errors (``-W --keep-going``).

Build: ``python -m sphinx -W --keep-going -b html docs docs/_build/html``.
"""

import os
import sys

import hpcgpu

# The docstrings' examples are doctests; the test suite runs them
# (tests/test_doc_examples.py). Here they are only shown.
project = "hpcgpu"
author = "hpcgpu developers"
copyright = "hpcgpu developers, BSD-3-Clause"
release = hpcgpu.__version__
version = release

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.mathjax",
    "sphinx.ext.viewcode",
    "numpydoc",
    "myst_nb",
]

source_suffix = {".rst": "restructuredtext", ".md": "myst-nb", ".ipynb": "myst-nb"}
root_doc = "index"
exclude_patterns = ["_build", "**.ipynb_checkpoints", "*.jsonl", "img"]

# Notebooks are shown as stored: executing them here would start dask clusters
# and run the models at full size. tests/test_notebooks.py executes them at small sizes.
nb_execution_mode = "off"
myst_enable_extensions = ["colon_fence", "deflist", "dollarmath"]
myst_heading_anchors = 3

autodoc_default_options = {"members": True, "show-inheritance": False}
autodoc_member_order = "bysource"
autodoc_typehints = "none"
autosummary_generate = False
numpydoc_show_class_members = False
numpydoc_class_members_toctree = False
numpydoc_xref_param_type = False
# import hpcgpu loads no GPU module: the API pages build on a machine without a GPU.
autodoc_mock_imports = ["cupy", "cupyx", "pynvml", "dask_cuda", "dask_jobqueue"]

html_theme = "pydata_sphinx_theme"
html_title = f"hpcgpu {release}"
html_theme_options = {
    "navigation_with_keys": False,
    "show_toc_level": 2,
    # the theme would fetch a version switcher and icons otherwise: nothing online
    "icon_links": [],
}
html_static_path = []
html_show_sourcelink = False

sys.path.insert(0, os.path.dirname(__file__))

# Every cross-reference must resolve (nitpicky), so a renamed or misspelt name in
# a docstring fails the build. A docstring may also name an internal module or
# helper that the reference does not document (``:mod:`hpcgpu.partition.grid```):
# such a reference is not broken as long as the name imports, and it is shown as
# plain code. Names that do not import stay warnings.
nitpicky = True
nitpick_ignore = [
    ("py:class", "distributed.Client"),  # dask's, not documented here (no intersphinx: offline)
    ("py:func", "numpy.sum"),
    ("py:func", "sum"),
    ("py:func", "float"),
]


def _imports(dotted):
    """Whether ``dotted`` names a module, or an attribute reachable from one."""
    import importlib

    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            found = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        try:
            for name in parts[cut:]:
                found = getattr(found, name)
        except AttributeError:
            return False
        return True
    return False


def _internal_reference(app, env, node, contnode):
    if node.get("refdomain") != "py":
        return None
    target = node.get("reftarget", "")
    module = node.get("py:module") or ""
    classname = node.get("py:class") or ""
    relative = target.lstrip(".")
    candidates = [target]
    if module:
        candidates += [f"{module}.{relative}", f"{module.rsplit('.', 1)[0]}.{relative}"]
        if classname:
            candidates.append(f"{module}.{classname}.{relative}")
    if any(_imports(name) for name in candidates if name):
        return contnode
    if "." not in relative and _defined_in_package(relative, module):
        return contnode
    return None


def _defined_in_package(name, module):
    """Whether a bare ``name`` is defined in hpcgpu: a module-level name, or a
    method, attribute or field of a class of ``module`` (where the docstring is)."""
    import sys

    for module_name, found in list(sys.modules.items()):
        if module_name.startswith("hpcgpu.") and name in getattr(found, "__dict__", {}):
            return True
    for value in vars(sys.modules.get(module) or object()).values():
        if isinstance(value, type) and (hasattr(value, name) or name in getattr(value, "__annotations__", {})
                                         or name in getattr(value, "__dataclass_fields__", {})):
            return True
    return False


def setup(app):
    app.connect("missing-reference", _internal_reference)
