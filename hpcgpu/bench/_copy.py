"""A parallel copy loop: the CPU memory ceiling the Numba kernels are held to."""

from numba import njit, prange

from hpcgpu import _jit_cache

_jit_cache.install()  # before the cached function below is defined


@njit(parallel=True, nogil=True, cache=True)
def parallel_copy(src, dst):
    n = src.shape[0]
    chunks = 64
    for c in prange(chunks):
        for i in range(c * n // chunks, (c + 1) * n // chunks):
            dst[i] = src[i]
