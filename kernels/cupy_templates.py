"""CUDA C++ template instances compiled by CuPy on first use: the cache every ``_cupy`` backend file shares.

A CuPy backend file (``kernels/*/_cupy.py``) holds one CUDA C++ source with
templated kernels and lists the instances it launches (``name_expressions``
such as ``"direct_kernel<float, 256, false>"``). :class:`TemplateKernels`
compiles them with NVRTC through :class:`cupy.RawModule` the first time one
is launched, once per group: the default launches share one module, and the
alternative launches that only ``scripts/gpu_kernel_variants.py`` times
share a second one, compiled only when a variant runs. CuPy itself compiles
each module once per device and caches the binary on disk.

Nothing here imports CuPy until a kernel is asked for, so the backend files
import on machines without a GPU (their tests emulate the kernels by
replacing the module's ``_kernel``).

Examples
--------
>>> templates = TemplateKernels("template <typename T> __global__ void k(T* x) {}", ("-std=c++17",),
...                             ["k<float>"], ["k<float>", "k<double>"])
>>> templates.defaults, templates.variants
(('k<float>',), ('k<double>',))
>>> templates.kernel("k<int>")
Traceback (most recent call last):
...
hpcgpu.errors.ConfigError: no compiled instance 'k<int>'; the instances are k<float>, k<double>
"""

import threading

import numpy as np

from hpcgpu.errors import ConfigError

__all__ = ["TemplateKernels", "array_module"]


class TemplateKernels:
    """The compiled instances of one CUDA C++ source, built on first use.

    Parameters
    ----------
    source : str
        CUDA C++ with the templated kernels.
    options : tuple of str
        NVRTC options (``-std=c++17``, ``--use_fast_math`` ...).
    defaults : sequence of str
        Instances of the default launches (one module, compiled when the
        first of them is launched).
    variants : sequence of str, optional
        Further instances (a second module, compiled only when one of them
        is launched); those already in ``defaults`` are dropped.
    hint : str, optional
        Appended to the error for an instance in neither list (where to add it).
    """

    def __init__(self, source, options, defaults, variants=(), hint=""):
        self.source = source
        self.options = tuple(options)
        self.defaults = tuple(defaults)
        self.variants = tuple(e for e in variants if e not in self.defaults)
        self.hint = hint
        self._modules = {}
        self._kernels = {}
        # two rank threads of one worker may launch their first kernel together
        self._lock = threading.Lock()

    def kernel(self, expression):
        """The compiled instance ``expression`` (a :class:`cupy.RawKernel`; compiled per device on launch)."""
        found = self._kernels.get(expression)
        if found is not None:
            return found
        group = self.defaults if expression in self.defaults else self.variants
        if expression not in group:
            known = ", ".join(self.defaults + self.variants)
            raise ConfigError(f"no compiled instance {expression!r}; the instances are {known}"
                              + (f" ({self.hint})" if self.hint else ""))
        with self._lock:
            if group not in self._modules:
                import cupy

                self._modules[group] = cupy.RawModule(code=self.source, options=self.options,
                                                      name_expressions=group)
            found = self._kernels[expression] = self._modules[group].get_function(expression)
        return found


def array_module(array):
    """``cupy`` for a CuPy array, else ``numpy`` (without importing CuPy for host arrays).

    Examples
    --------
    >>> array_module(np.zeros(3)).__name__
    'numpy'
    """
    if type(array).__module__.split(".")[0] == "cupy":
        import cupy

        return cupy
    return np
