"""The layout of the package: no import cycles, dependencies one way, one name for one thing.

Every module of the installed ``hpcgpu`` (``kernels/`` and ``workloads/``
included, as ``hpcgpu.kernels`` and ``hpcgpu.workloads``) is parsed with
:mod:`ast`, not imported. An import is *module-level* when it runs as the
module is imported (at the top, or in an ``if`` / ``try`` / class body
there) and *function-level* when it runs only when a function is called.
Imports under ``if TYPE_CHECKING:`` never run and are skipped.

An edge ``a -> b`` means that importing ``a`` executes ``b``: ``import
hpcgpu.x.y`` and ``from hpcgpu.x import y`` (``y`` a submodule) point at
``hpcgpu.x.y``; ``from hpcgpu.x import name`` (not a submodule) points at
the package ``hpcgpu.x``. The parent packages that Python initialises on
the way are left out: a package's ``__init__`` importing its own modules
is how packages work, not a cycle.
"""

import ast
import importlib
import importlib.util
import sys
import tomllib
from pathlib import Path

import pytest

ROOTS = ("hpcgpu", "hpcgpu.kernels", "hpcgpu.workloads")
"""Packages whose folders hold the source (pyproject maps the last two to top-level folders)."""

CORE_IMPORTS_OF_WORKLOADS = {
    # Core modules that import a workload when they are imported. Empty: core
    # reaches workloads only through the registry (hpcgpu.registry, entry
    # points). Do not add to it.
}

CORE_FUNCTION_IMPORTS_OF_WORKLOADS = {
    # Core modules that import a workload inside a function. Empty: the CLI,
    # the plan, the summaries, the HTML views and the benchmark suites read
    # the registry (a benchmark builds its model with
    # ``registry.get(name).model_class()``). Do not add to it.
}

CYCLES_THROUGH_FUNCTIONS = [
    # Circles that close only through imports inside functions: harmless at
    # import time, but each one is two modules that cannot be read, tested or
    # moved apart. Known ones, to be removed; the list may only shrink
    # (remove what is fixed, add nothing).
]

CORE_IMPORTS_OF_KERNELS = {
    # Core modules that import a kernel family when they are imported
    # (``workloads -> kernels -> core``: core reaches kernels through the
    # backend's lookup, on first use). The benchmark harness times kernels
    # directly. Do not add to it; remove what is fixed.
}

KERNEL_INTERNALS_USED_OUTSIDE = {
    # Modules outside kernels/ that reach past a family's public API (a
    # private kernel module, a private name, or a backend file through
    # ``backend.kernels(...)``). The benchmark harness times the backend
    # kernels themselves, without the public functions' checks, and reads
    # their launch tables. Do not add to it; remove what is fixed.
}

DUPLICATE_CLASS_NAMES = {
    # Class names defined in more than one module. Empty: one class per name.
}


def _folder(package):
    spec = importlib.util.find_spec(package)
    return Path(next(iter(spec.submodule_search_locations)))


def _modules():
    """``{module name: source path}`` of every module, mapped folders included."""
    modules = {}
    folders = {package: _folder(package) for package in ROOTS}
    for package, folder in folders.items():
        for path in sorted(folder.rglob("*.py")):
            relative = path.relative_to(folder).with_suffix("")
            parts = relative.parts
            if any(other != package and other.startswith(package + ".")
                   and path.is_relative_to(folders[other]) for other in folders):
                continue  # another root's folder that happens to sit inside this one
            if "__pycache__" in parts:
                continue
            if parts[-1] == "__init__":
                parts = parts[:-1]
            modules[".".join((package, *parts))] = path
    return modules


MODULES = _modules()


def _is_package(name):
    return MODULES[name].name == "__init__.py"


def _resolve(module, level, target):
    """The absolute name of a (possibly relative) import ``from {'.' * level}{target}`` in ``module``."""
    if level == 0:
        return target
    package = module if _is_package(module) else module.rpartition(".")[0]
    for _ in range(level - 1):
        package = package.rpartition(".")[0]
    return f"{package}.{target}" if target else package


def _internal(name):
    """The module ``name`` (or its nearest known ancestor) if it belongs to hpcgpu, else None."""
    while name:
        if name in MODULES:
            return name
        name = name.rpartition(".")[0]
    return None


def _type_checking(test):
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(module):
    """``(module-level targets, function-level targets)``: the hpcgpu modules ``module`` imports."""
    tree = ast.parse(MODULES[module].read_text(), filename=str(MODULES[module]))
    found = {"module": set(), "function": set()}

    def visit(node, where):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                visit(child, "function")
                continue
            if isinstance(child, ast.If) and _type_checking(child.test):
                for item in child.orelse:
                    visit(ast.Module(body=[item], type_ignores=[]), where)
                continue
            if isinstance(child, ast.Import):
                for alias in child.names:
                    target = _internal(alias.name)
                    if target:
                        found[where].add(target)
            elif isinstance(child, ast.ImportFrom):
                base = _resolve(module, child.level, child.module or "")
                for alias in child.names:
                    submodule = f"{base}.{alias.name}"
                    target = submodule if submodule in MODULES else _internal(base)
                    if target:
                        found[where].add(target)
            visit(child, where)

    visit(tree, "module")
    found["module"].discard(module)
    found["function"] -= found["module"] | {module}
    return found["module"], found["function"]


IMPORTS = {name: _imports(name) for name in MODULES}


def _cycles(edges):
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index, low, stack, on_stack, out = {}, {}, [], set(), []

    def connect(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 10 * len(edges) + 100))
    try:
        for v in sorted(edges):
            if v not in index:
                connect(v)
    finally:
        sys.setrecursionlimit(limit)
    return sorted(out)


def _loop(edges, component):
    """One circle of imports through ``component``, as text (for the failure message)."""
    start, inside = component[0], set(component)
    seen, frontier = {start: None}, [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(edges.get(v, ()) & inside):
                if w == start:
                    chain = [start]
                    while v is not None:
                        chain.append(v)
                        v = seen[v]
                    return " -> ".join(reversed(chain))
                if w not in seen:
                    seen[w] = v
                    nxt.append(w)
        frontier = nxt
    return " <-> ".join(component)


def _describe(edges, cycles):
    return "\n".join(_loop(edges, c) for c in cycles)


def test_the_modules_are_found_in_every_mapped_folder():
    assert {"hpcgpu.simulation", "hpcgpu.kernels.stencil", "hpcgpu.workloads.weather"} <= set(MODULES)


def test_no_import_cycle_among_module_level_imports():
    edges = {name: module for name, (module, _) in IMPORTS.items()}
    cycles = _cycles(edges)
    assert not cycles, "modules that import each other when imported:\n" + _describe(edges, cycles)


def test_cycles_through_function_level_imports_are_only_the_known_ones():
    edges = {name: module | function for name, (module, function) in IMPORTS.items()}
    cycles = _cycles(edges)
    # a known circle that lost modules is still known; one that gained a module is new
    new = [c for c in cycles if not any(set(c) <= set(known) for known in CYCLES_THROUGH_FUNCTIONS)]
    assert not new, "new circles of imports (through functions):\n" + _describe(edges, new)


def test_no_import_cycle_inside_a_subsystem_package_even_through_functions():
    # a package's modules layered one way: a function-level import does not make a circle acceptable
    for package in ("hpcgpu.plan", "hpcgpu.linalg", "hpcgpu.io", "hpcgpu.partition"):
        members = {m for m in MODULES if m.startswith(package + ".")}
        edges = {m: (IMPORTS[m][0] | IMPORTS[m][1]) & members for m in members}
        cycles = _cycles(edges)
        assert not cycles, f"{package}: modules that import each other:\n" + _describe(edges, cycles)


def test_core_imports_no_workload_when_imported():
    core = [m for m in MODULES if not m.startswith("hpcgpu.workloads")]
    offenders = {m: sorted(t for t in IMPORTS[m][0] if t.startswith("hpcgpu.workloads")) for m in core}
    offenders = {m: t for m, t in offenders.items() if t}
    assert offenders == CORE_IMPORTS_OF_WORKLOADS


def test_core_imports_no_workload_even_inside_functions():
    # the registry is the only way from core to a workload
    core = [m for m in MODULES if not m.startswith("hpcgpu.workloads")]
    offenders = {m: sorted(t for t in IMPORTS[m][1] if t.startswith("hpcgpu.workloads")) for m in core}
    offenders = {m: t for m, t in offenders.items() if t}
    new = {m: t for m, t in offenders.items() if not set(t) <= set(CORE_FUNCTION_IMPORTS_OF_WORKLOADS.get(m, ()))}
    assert not new, f"core modules that import a workload (use hpcgpu.registry): {new}"
    gone = {m: [t for t in known if t not in offenders.get(m, ())]
            for m, known in CORE_FUNCTION_IMPORTS_OF_WORKLOADS.items()}
    gone = {m: t for m, t in gone.items() if t}
    assert not gone, f"no longer imported: remove them from CORE_FUNCTION_IMPORTS_OF_WORKLOADS: {gone}"


def test_core_names_no_workload_module_by_string():
    # importlib.import_module("hpcgpu.workloads...") or a table of workload module paths is an import too
    core = [m for m in MODULES if not m.startswith("hpcgpu.workloads")]
    named = {}
    for module in core:
        for node in ast.walk(ast.parse(MODULES[module].read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) \
                    and node.value.startswith("hpcgpu.workloads.") and " " not in node.value:
                named.setdefault(module, []).append(node.value)
    assert not named, f"core modules that name workload modules (register them instead): {named}"


def test_core_imports_no_kernel_when_imported():
    core = [m for m in MODULES if not m.startswith(("hpcgpu.workloads", "hpcgpu.kernels"))]
    offenders = {m: sorted(t for t in IMPORTS[m][0] if t.startswith("hpcgpu.kernels")) for m in core}
    new = {m: t for m, t in offenders.items() if not set(t) <= set(CORE_IMPORTS_OF_KERNELS.get(m, ()))}
    assert not new, f"core modules that import kernels when imported: {new}"


def test_kernels_import_no_workload():
    for module in (m for m in MODULES if m.startswith("hpcgpu.kernels")):
        imported = IMPORTS[module][0] | IMPORTS[module][1]
        assert not [t for t in imported if t.startswith("hpcgpu.workloads")], module


def test_every_package_is_listed_for_the_wheel():
    # pyproject lists packages explicitly: a folder left out installs in editable mode but not from a wheel
    pyproject = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())
    listed = set(pyproject["tool"]["setuptools"]["packages"])
    packages = {m for m in MODULES if _is_package(m)}
    assert packages <= listed, f"not in [tool.setuptools] packages: {sorted(packages - listed)}"


@pytest.mark.parametrize("package", sorted(m for m in MODULES if _is_package(m)))
def test_no_name_in_a_package_hides_its_submodule(package):
    # ``hpcgpu.cluster`` was a function that hid the module of the same name
    imported = importlib.import_module(package)
    for name in sorted(m for m in MODULES if m.rpartition(".")[0] == package):
        short = name.rpartition(".")[2]
        value = imported.__dict__.get(short)
        if value is not None:
            assert getattr(value, "__name__", None) == name, f"{package}.{short} is {value!r}, not the module"


def test_one_class_per_name():
    defined = {}
    for module, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                defined.setdefault(node.name, []).append(module)
    duplicates = {name: sorted(where) for name, where in defined.items() if len(where) > 1}
    assert duplicates == DUPLICATE_CLASS_NAMES


def test_the_old_import_paths_still_work():
    # modules that moved into subsystem packages: code written against the old paths keeps running
    from hpcgpu import display, io, linalg, output, plan, plotting

    assert output.ZarrWriter is io.ZarrWriter and output.open_output is io.open_output
    assert plotting.save_panels is io.save_panels
    assert display.table is io.html_views.table and display.model_time is io.html_views.model_time
    assert linalg.conjugate_gradient.__module__ == "hpcgpu.linalg.cg" and callable(linalg.matmul)
    assert plan.SchedulerModel.__module__ == "hpcgpu.plan.profiles" and callable(plan.run_command)


def _private_kernel_uses(module):
    """What ``module`` reaches inside the kernel families past their public API, sorted.

    A module inside a family (backend files ``_numpy.py`` ... and helper
    modules alike: only ``hpcgpu.kernels.<family>`` is public) or any private
    kernel module, imported or named in ``importlib.import_module``; a
    private name imported from a family; and ``.kernels(...)`` calls, the
    backend's lookup of its backend file (``".kernels()"``).
    """
    tree = ast.parse(MODULES[module].read_text())
    found = set()

    def private(name):
        parts = name.split(".")
        return name.startswith("hpcgpu.kernels.") and (len(parts) > 3 or any(p.startswith("_") for p in parts[2:]))

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if private(a.name))
        elif isinstance(node, ast.ImportFrom):
            base = _resolve(module, node.level, node.module or "")
            if private(base):
                found.add(base)
            elif base.startswith("hpcgpu.kernels"):
                found.update(f"{base}.{a.name}" for a in node.names if a.name.startswith("_"))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            if node.func.attr == "kernels":
                found.add(".kernels()")
            elif node.func.attr == "import_module" and node.args and isinstance(node.args[0], ast.Constant) \
                    and isinstance(node.args[0].value, str) and private(node.args[0].value):
                found.add(node.args[0].value)
    return sorted(found)


def test_outside_kernels_the_public_kernel_api_is_the_only_door():
    # workloads and core call a family's public functions (which check their
    # input) and the fast paths it declares, never its backend files or helpers
    outside = [m for m in MODULES if not m.startswith("hpcgpu.kernels") and m != "hpcgpu.backends"]
    uses = {m: _private_kernel_uses(m) for m in outside}
    new = {m: [u for u in found if u not in KERNEL_INTERNALS_USED_OUTSIDE.get(m, ())] for m, found in uses.items()}
    new = {m: found for m, found in new.items() if found}
    assert not new, f"modules outside kernels/ that reach past a family's public API: {new}"
    gone = {m: [u for u in allowed if u not in uses.get(m, ())] for m, allowed in KERNEL_INTERNALS_USED_OUTSIDE.items()}
    gone = {m: found for m, found in gone.items() if found}
    assert not gone, f"no longer used: remove them from KERNEL_INTERNALS_USED_OUTSIDE: {gone}"


def test_the_private_kernel_check_sees_each_way_in(tmp_path):
    # the check above must notice each form of the back door it forbids
    source = """
import importlib
from hpcgpu.kernels.stencil import _numpy
from hpcgpu.kernels.nbody import _softening_squared
import hpcgpu.kernels.matrix.solvers
from hpcgpu.kernels.md.verlet import wrap
def f(backend):
    backend.kernels("md").forces()
    importlib.import_module("hpcgpu.kernels.nbody.tree")
"""
    MODULES["hpcgpu.workloads._probe"] = path = tmp_path / "probe.py"
    path.write_text(source)
    try:
        found = _private_kernel_uses("hpcgpu.workloads._probe")
    finally:
        del MODULES["hpcgpu.workloads._probe"]
    assert found == [".kernels()", "hpcgpu.kernels.matrix.solvers", "hpcgpu.kernels.md.verlet",
                     "hpcgpu.kernels.nbody._softening_squared",
                     "hpcgpu.kernels.nbody.tree", "hpcgpu.kernels.stencil._numpy"]
