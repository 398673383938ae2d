"""Find out whether a GPU is usable without creating a CUDA context.

``import hpcgpu`` must not touch the GPU: an early context on device 0 is the
classic multi-GPU bug under dask-cuda. So the probe talks to the driver
library directly through ctypes (``cuInit`` creates no context), and looks at
installed packages through their metadata, without importing them.
"""

import ctypes
import functools
import importlib.metadata
import importlib.util
import os
from dataclasses import dataclass, field

__all__ = ["DriverReport", "probe_driver", "cupy_distribution", "simulator_enabled"]


@dataclass(frozen=True)
class DriverReport:
    """What the CUDA driver said, or why it could not be asked.

    Attributes
    ----------
    loaded : bool
        ``libcuda`` could be loaded and initialised.
    driver_cuda_version : int
        Highest CUDA version the driver supports, e.g. 12040 for 12.4 (0 if
        unknown).
    devices : tuple of str
        Names of the visible devices.
    problem : str
        Empty when ``loaded``; otherwise what went wrong.
    """

    loaded: bool
    driver_cuda_version: int = 0
    devices: tuple = field(default_factory=tuple)
    problem: str = ""

    @property
    def version_text(self):
        v = self.driver_cuda_version
        return f"{v // 1000}.{(v % 1000) // 10}" if v else "unknown"


def simulator_enabled():
    """True when Numba's CUDA simulator is switched on for this process."""
    return os.environ.get("NUMBA_ENABLE_CUDASIM", "0") not in ("", "0")


@functools.cache
def probe_driver():
    """Ask the CUDA driver for its version and devices; never raises.

    Examples
    --------
    >>> report = probe_driver()
    >>> isinstance(report.loaded, bool)
    True
    """
    lib = None
    for name in ("libcuda.so.1", "libcuda.so", "nvcuda.dll", "libcuda.dylib"):
        try:
            lib = ctypes.CDLL(name)
            break
        except OSError:
            continue
    if lib is None:
        return DriverReport(False, problem="no NVIDIA driver found (libcuda could not be loaded)")
    status = lib.cuInit(0)
    if status != 0:
        return DriverReport(False, problem=f"the NVIDIA driver is installed but cuInit failed (CUresult {status})")
    version = ctypes.c_int(0)
    lib.cuDriverGetVersion(ctypes.byref(version))
    count = ctypes.c_int(0)
    if lib.cuDeviceGetCount(ctypes.byref(count)) != 0 or count.value == 0:
        return DriverReport(False, version.value, problem=(
            f"the NVIDIA driver (CUDA {version.value // 1000}.{(version.value % 1000) // 10}) "
            "sees no GPU; check CUDA_VISIBLE_DEVICES"))
    names = []
    for index in range(count.value):
        dev = ctypes.c_int(0)
        buf = ctypes.create_string_buffer(256)
        if lib.cuDeviceGet(ctypes.byref(dev), index) == 0 and lib.cuDeviceGetName(buf, 256, dev) == 0:
            names.append(buf.value.decode(errors="replace"))
        else:
            names.append(f"device {index}")
    return DriverReport(True, version.value, tuple(names))


@functools.cache
def cupy_distribution():
    """Return ``(distribution_name, cuda_major)`` of the installed CuPy, or None.

    Reads package metadata only; CuPy is not imported. Cached: scanning every
    installed distribution takes ~10 ms, and ``get_backend("auto")`` runs in
    worker tasks.
    """
    for dist in importlib.metadata.distributions():
        name = (dist.metadata["Name"] or "").lower()
        if name.startswith("cupy-cuda"):
            digits = name.removeprefix("cupy-cuda")[:2]
            major = int(digits) if digits.isdigit() else 0
            return name, major
        if name == "cupy":
            return name, 0
    return None


def module_installed(module_name):
    """True if ``module_name`` could be imported (it is not imported here)."""
    try:
        return importlib.util.find_spec(module_name) is not None
    except (ImportError, ValueError):
        return False
