"""What every Numba-CUDA backend file needs to work on CuPy arrays.

The ``cuda`` backend keeps its data in CuPy arrays (so that CuPy, cuBLAS
and the RMM pool share them) and launches Numba-CUDA kernels on them. These
helpers wrap a CuPy array for Numba without a host synchronisation, launch
on CuPy's current stream so the two queue in order, and let the CUDA
simulator (NumPy arrays, ``NUMBA_ENABLE_CUDASIM=1``) pass through unchanged.
Imported only by the ``_cuda`` backend files: it imports ``numba.cuda``.
"""

import numpy as np
from numba import cuda

__all__ = ["on_device", "stream_of", "array_module"]


def on_device(array):
    """A Numba view of a CuPy array without a host sync; NumPy arrays (simulator) pass through."""
    if isinstance(array, np.ndarray):
        return array
    return cuda.as_cuda_array(array, sync=False)


def stream_of(array):
    """CuPy's current stream as a Numba stream, so kernels queue behind CuPy's work."""
    if isinstance(array, np.ndarray):
        return 0
    import cupy
    ptr = cupy.cuda.get_current_stream().ptr
    return cuda.external_stream(ptr) if ptr else 0


def array_module(array):
    """``numpy`` for simulator arrays, ``cupy`` for device arrays."""
    if isinstance(array, np.ndarray):
        return np
    import cupy
    return cupy
