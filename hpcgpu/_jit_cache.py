"""Where hpcgpu's compiled Numba kernels are cached: a user cache directory, never the install.

Numba's ``cache=True`` writes its index and object files next to the
source, in the package's own ``__pycache__`` folders, whenever they are
writable. For an installed package that is wrong three ways: ``pip
uninstall`` and upgrades remove only the files they installed, so the
leftover cache files keep ``site-packages/hpcgpu`` alive as a namespace
package that then shadows a later editable install (``cannot import name
... (unknown location)``); a read-only or shared site-packages cannot take
them; and several environments sharing one install would race on them.

:func:`install` puts a cache locator in front of Numba's own for the files
of this package only (``hpcgpu``, ``hpcgpu.kernels``, ``hpcgpu.workloads``,
wherever they are installed), so their cache goes to :func:`cache_dir`:

1. ``$HPCGPU_CACHE_DIR`` if set;
2. else the user cache directory, ``$XDG_CACHE_HOME/hpcgpu`` or
   ``~/.cache/hpcgpu`` on Linux (``numba``'s ``appdirs`` rules elsewhere);
3. else, when that cannot be written, a per-user folder in the temporary
   directory.

Inside it, each source folder gets its own subfolder named by a hash of
its path (as Numba's user-wide cache does), so two installs never mix, and
Numba's index keys every entry by the source file's time stamp and size,
so an upgrade recompiles. ``NUMBA_CACHE_DIR``, when the user sets it,
still wins for every function, these included. Other packages' functions
are cached as Numba always does.

Examples
--------
>>> from hpcgpu import _jit_cache
>>> _jit_cache.install()
>>> import os
>>> os.path.isabs(_jit_cache.cache_dir())
True
"""

import os
import tempfile

__all__ = ["CACHE_DIR_ENV", "cache_dir", "install", "package_folders"]

CACHE_DIR_ENV = "HPCGPU_CACHE_DIR"
"""Environment variable naming the folder for hpcgpu's compiled kernels."""

_installed = False


def package_folders():
    """The folders holding hpcgpu's source: the core, the kernels and the workloads.

    Found from this file's location without importing the subpackages
    (``kernels`` and ``workloads`` may live elsewhere in an editable
    install: their mapping is read from the import system's spec).
    """
    import importlib.util

    here = os.path.dirname(os.path.abspath(__file__))
    folders = {here}
    for name in ("hpcgpu.kernels", "hpcgpu.workloads"):
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            spec = None
        for location in (spec.submodule_search_locations or []) if spec is not None else []:
            folders.add(os.path.abspath(location))
    return sorted(folders)


def cache_dir():
    """The folder hpcgpu's compiled Numba kernels go to (see the module doc for the rules)."""
    chosen = os.environ.get(CACHE_DIR_ENV)
    if chosen:
        return os.path.abspath(os.path.expanduser(chosen))
    from numba.misc.appdirs import AppDirs

    return os.path.join(AppDirs(appname="hpcgpu", appauthor=False).user_cache_dir, "numba")


def _fallback_dir():
    user = os.getuid() if hasattr(os, "getuid") else os.environ.get("USERNAME", "user")
    return os.path.join(tempfile.gettempdir(), f"hpcgpu-cache-{user}", "numba")


def _make_locator_class():
    from numba.core import caching

    class PackageCacheLocator(caching._SourceFileBackedLocatorMixin, caching._CacheLocator):
        """Numba cache locator for hpcgpu's own source files: they cache under :func:`cache_dir`."""

        folders = tuple(os.path.join(folder, "") for folder in package_folders())

        def __init__(self, py_func, py_file, root):
            self._py_file = py_file
            self._lineno = py_func.__code__.co_firstlineno
            self._cache_path = os.path.join(root, self.get_suitable_cache_subpath(py_file))

        def get_cache_path(self):
            return self._cache_path

        @classmethod
        def from_function(cls, py_func, py_file):
            path = os.path.abspath(py_file)
            if not os.path.exists(path) or not path.startswith(cls.folders):
                return None
            for root in (cache_dir(), _fallback_dir()):
                locator = cls(py_func, py_file, root)
                try:
                    locator.ensure_cache_path()
                except OSError:
                    continue
                return locator
            return None

    return PackageCacheLocator


def install():
    """Route the Numba cache of hpcgpu's own functions to :func:`cache_dir` (idempotent).

    Must run before the first ``@njit(cache=True)`` function of the package
    is defined: ``hpcgpu.kernels`` and the other modules that define such
    functions call it on import. Functions of other packages are untouched.
    """
    global _installed
    if _installed:
        return
    from numba.core import caching

    locator = _make_locator_class()
    classes = caching.CacheImpl._locator_classes
    # After the user's NUMBA_CACHE_DIR (their explicit choice), before the in-tree locator.
    position = 1 if classes and classes[0] is caching.UserProvidedCacheLocator else 0
    classes.insert(position, locator)
    _installed = True
