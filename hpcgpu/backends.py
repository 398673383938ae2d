"""Backends: one value that says where arrays live and which kernels run.

=========  =====  ===========================================================
name       where  kernels
=========  =====  ===========================================================
``numpy``  CPU    plain vectorised NumPy: the reference for every other one
``numba``  CPU    ``numba.njit(parallel=True, cache=True)``: fast CPU fallback
``cuda``   GPU    Numba-CUDA kernels (shared-memory tiling), CuPy arrays
``cupy``   GPU    CuPy ``RawKernel`` / cuBLAS / cuFFT
=========  =====  ===========================================================

``"auto"`` picks ``cuda`` when a GPU is usable, else ``numba``. Only
``"auto"`` falls back: asking for a GPU backend on a machine without one
raises :class:`~hpcgpu.errors.BackendUnavailable` saying what was found.

Nothing here imports CuPy or ``numba.cuda`` at import time.
"""

import importlib
from dataclasses import dataclass

import numpy as np

from hpcgpu import _gpu_probe
from hpcgpu.errors import BackendUnavailable, ConfigError

__all__ = [
    "BACKEND_NAMES",
    "Backend",
    "BackendStatus",
    "get_backend",
    "backend_status",
    "backend_info",
]

BACKEND_NAMES = ("numpy", "numba", "cuda", "cupy")
GPU_BACKENDS = ("cuda", "cupy")
# Oldest driver CUDA version the GPU packages we install are built against.
MIN_DRIVER_CUDA = {12: 12000, 13: 13000}


@dataclass(frozen=True)
class BackendStatus:
    """Whether one backend can run here, and why not.

    Attributes
    ----------
    name : str
    usable : bool
    detail : str
        The device or library that would be used, or the reason it cannot.
    """

    name: str
    usable: bool
    detail: str


def backend_status(name):
    """Return the :class:`BackendStatus` of the backend ``name``.

    Examples
    --------
    >>> backend_status("numpy").usable
    True
    """
    if name == "numpy":
        return BackendStatus("numpy", True, f"NumPy {np.__version__} on the CPU")
    if name == "numba":
        if not _gpu_probe.module_installed("numba"):
            return BackendStatus("numba", False, "package missing: pip install numba")
        import numba
        return BackendStatus("numba", True,
                             f"Numba {numba.__version__}, {numba.config.NUMBA_NUM_THREADS} CPU threads")
    if name == "cuda":
        return _cuda_status()
    if name == "cupy":
        return _cupy_status()
    raise ConfigError(f"backend must be one of {', '.join(BACKEND_NAMES)} or 'auto'; got {name!r}")


def backend_info():
    """Status of every backend, in the order of ``BACKEND_NAMES``.

    Examples
    --------
    >>> [s.name for s in backend_info()]
    ['numpy', 'numba', 'cuda', 'cupy']
    """
    return [backend_status(name) for name in BACKEND_NAMES]


def _driver_problem(cuda_major):
    """Why the driver cannot serve packages built for ``cuda_major``, or ''."""
    report = _gpu_probe.probe_driver()
    if not report.loaded:
        return report.problem
    needed = MIN_DRIVER_CUDA.get(cuda_major, 0)
    if needed and report.driver_cuda_version < needed:
        return (f"driver too old: it supports CUDA {report.version_text}, but the installed "
                f"packages need CUDA {needed // 1000}.0; update the NVIDIA driver or install "
                f"hpcgpu[cuda{report.driver_cuda_version // 1000}]")
    return ""


def _gpu_detail():
    report = _gpu_probe.probe_driver()
    return f"{len(report.devices)} GPU(s): {', '.join(report.devices)}; driver CUDA {report.version_text}"


def _cuda_status():
    if _gpu_probe.simulator_enabled():
        return BackendStatus("cuda", True,
                             "Numba CUDA simulator (NUMBA_ENABLE_CUDASIM=1): runs on the CPU, for tests only")
    if not _gpu_probe.module_installed("numba"):
        return BackendStatus("cuda", False, "package missing: numba (pip install 'hpcgpu[cuda]')")
    cupy = _gpu_probe.cupy_distribution()
    if cupy is None:
        return BackendStatus("cuda", False, _no_cupy())
    problem = _driver_problem(cupy[1])
    if problem:
        return BackendStatus("cuda", False, problem)
    return BackendStatus("cuda", True, "Numba-CUDA kernels on " + _gpu_detail())


def _cupy_status():
    cupy = _gpu_probe.cupy_distribution()
    if cupy is None:
        return BackendStatus("cupy", False, _no_cupy())
    problem = _driver_problem(cupy[1])
    if problem:
        return BackendStatus("cupy", False, problem)
    return BackendStatus("cupy", True, f"{cupy[0]} on " + _gpu_detail())


def _no_cupy():
    """Why a GPU backend is unusable without CuPy: the driver's problem first, when it has one.

    On a machine without a GPU, "pip install 'hpcgpu[cuda]'" alone would send
    the user to download CuPy only to learn then that there is no GPU.
    """
    report = _gpu_probe.probe_driver()
    if not report.loaded:
        return f"no usable GPU: {report.problem} (and cupy is not installed)"
    return "package missing: cupy (pip install 'hpcgpu[cuda]')"


def _resolve_auto():
    cuda = backend_status("cuda")
    if cuda.usable and not _gpu_probe.simulator_enabled():
        return "cuda"
    return "numba" if backend_status("numba").usable else "numpy"


@dataclass(frozen=True)
class Backend:
    """Where arrays live and which kernels run: one of ``BACKEND_NAMES``.

    Build it with :func:`get_backend` (which resolves ``"auto"``) or directly
    by name. Construction checks that the backend is usable here, so a
    ``Backend`` object is always valid. It pickles by name, so it travels to
    dask workers, which resolve the array module on first use.

    Parameters
    ----------
    name : str
        ``"numpy"``, ``"numba"``, ``"cuda"`` or ``"cupy"``.

    Raises
    ------
    BackendUnavailable
        The backend cannot run here; the message says what was found.

    Examples
    --------
    >>> backend = Backend("numpy")
    >>> backend.to_host(backend.asarray([1.0, 2.0])).sum()
    np.float64(3.0)
    """

    name: str

    def __post_init__(self):
        if self.name not in BACKEND_NAMES:
            raise ConfigError(
                f"backend must be one of {', '.join(BACKEND_NAMES)} or 'auto'; got {self.name!r}")
        status = backend_status(self.name)
        if not status.usable:
            raise BackendUnavailable(
                f"backend {self.name!r} is not usable here: {status.detail}. "
                f"Use backend='auto' to fall back to the CPU, or run 'hpcgpu info'.")

    @property
    def on_gpu(self):
        """True when arrays live in GPU memory (or the CUDA simulator)."""
        return self.name in GPU_BACKENDS

    @property
    def simulated(self):
        """True for the ``cuda`` backend under Numba's CUDA simulator."""
        return self.name == "cuda" and _gpu_probe.simulator_enabled()

    @property
    def xp(self):
        """The array module: ``numpy``, or ``cupy`` on a real GPU."""
        if self.on_gpu and not self.simulated:
            import cupy
            return cupy
        return np

    def asarray(self, array, dtype=None):
        """Return ``array`` on this backend's device (copies only if needed)."""
        return self.xp.asarray(array, dtype=dtype)

    def to_host(self, array):
        """Return ``array`` as a NumPy array in host memory."""
        if isinstance(array, np.ndarray):
            return array
        if hasattr(array, "get"):
            return array.get()
        return np.asarray(array)

    def zeros(self, shape, dtype):
        """Zero-filled array on this backend's device."""
        return self.xp.zeros(shape, dtype=dtype)

    def empty(self, shape, dtype):
        """Uninitialised array on this backend's device."""
        return self.xp.empty(shape, dtype=dtype)

    def synchronize(self):
        """Wait until all queued device work has finished (no-op on the CPU)."""
        if self.on_gpu and not self.simulated:
            import cupy
            cupy.cuda.get_current_stream().synchronize()
            cupy.cuda.runtime.deviceSynchronize()

    def kernels(self, family):
        """The module of kernels of ``family`` for this backend.

        Examples
        --------
        >>> Backend("numpy").kernels("stencil").__name__
        'hpcgpu.kernels.stencil._numpy'
        """
        return importlib.import_module(f"hpcgpu.kernels.{family}._{self.name}")

    def __repr__(self):
        return f"Backend({self.name!r})"


def get_backend(backend="auto"):
    """Return a usable :class:`Backend` for a name, ``"auto"`` or a Backend.

    Parameters
    ----------
    backend : str or Backend
        A name from ``BACKEND_NAMES``, ``"auto"`` (``cuda`` when a GPU is
        usable, else ``numba``), or an existing Backend (returned as is).

    Raises
    ------
    ConfigError
        Unknown name.
    BackendUnavailable
        A named backend cannot run here.

    Examples
    --------
    >>> get_backend("numpy").name
    'numpy'
    """
    if isinstance(backend, Backend):
        return backend
    if not isinstance(backend, str):
        raise ConfigError(
            f"backend must be one of {', '.join(BACKEND_NAMES)}, 'auto' or a Backend; got {backend!r}")
    name = backend.lower()
    if name == "auto":
        name = _resolve_auto()
    return Backend(name)
