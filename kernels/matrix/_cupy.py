"""Matrix kernels for the GPU with CuPy: cuBLAS, and CUDA C++ where CuPy has no call.

``matmul`` is cuBLAS (``cupy.dot`` on two matrices: ``cublasGemmEx``). Its
float32 compute type is CuPy's per-process setting
(``cupy._core.set_compute_type``; the environment variable ``CUPY_TF32=1``
changes the default to TensorFloat-32). Each call sets it explicitly, under a
lock, and puts the previous value back: ``COMPUTE_TYPE_TF32``
(``CUBLAS_COMPUTE_32F_FAST_TF32``: inputs rounded to 10 mantissa bits on the
tensor cores, float32 accumulation, relative error about 1e-3) only when the
caller passed ``allow_tf32=True``, else ``COMPUTE_TYPE_DEFAULT``
(``CUBLAS_COMPUTE_32F``: IEEE float32 arithmetic). GPUs below compute
capability 8.0 have no TF32; CuPy then warns and computes in float32.
float64 is ``CUBLAS_COMPUTE_64F`` always.

``spmv`` is :data:`KERNEL_SOURCE`, compiled by NVRTC through a cached
:class:`cupy.RawModule`: a group of ``LANES`` consecutive threads per row
(1 to 32, chosen from the mean number of values per row by
:func:`lanes_for`) reads the row's values in strides of ``LANES``, so a
group's loads are consecutive; the lanes' partial sums meet in shared
memory and the group's first thread adds them in lane order. Short rows
(a mean of at most :data:`VALUES_PER_LANE` values: the 5-point Poisson
matrix, 7-point 3-D stencils) get one thread per row, as on the ``cuda``
backend, with no shared memory and no barrier: 32 threads on 32 consecutive
rows read consecutive short runs of ``data`` and ``indices`` that share
cache lines, where a group of 4 would idle 3 of 8 lanes on a 5-value row and
then wait at the barrier for a 4-way sum. Groups take over as rows grow (one
lane per up to 6 values, Kokkos Kernels' rule). The tests compile the same
source with g++ and run it on the CPU
(``tests/kernels/test_matrix_cupy_source.py``).

``dot`` is a :class:`cupy.ReductionKernel` with float64 products and sums;
``axpy`` a :class:`cupy.ElementwiseKernel` (one fused multiply-add per
element). Importing this module imports neither CuPy nor anything on the GPU.
"""

import functools
import threading

import numpy as np

from hpcgpu.kernels import launch_limits
from hpcgpu.kernels.cupy_templates import TemplateKernels

THREADS = 256
"""Threads per block of the SpMV kernel."""

MAX_LANES = 32
"""Most threads per row (a warp)."""

VALUES_PER_LANE = 6
"""A group gets another lane (doubles) while its lanes would each take more than
this many values of a mean row: Kokkos Kernels' CSR SpMV rule (its
``launch_parameters``: ``vector_length * 6 < nnz_per_row``)."""

LANES = (1, 2, 4, 8, 16, 32)
"""Group sizes the SpMV kernel is compiled for."""

CTYPES = {"float32": "float", "float64": "double"}
"""C++ type of each value dtype."""

INDEX_CTYPES = {"int32": "int", "int64": "long long"}
"""C++ type of each index dtype."""

OPTIONS = ("--std=c++17",)
"""NVRTC options of the module."""

KERNEL_SOURCE = r"""
// y = A x for a CSR matrix; a group of LANES consecutive threads per row.
// THREADS is a multiple of LANES, so a group never spans two blocks, and
// every thread of a block meets the one barrier (rows past the end included).
template<typename T, typename I, int THREADS, int LANES>
__global__ void spmv_kernel(const T* __restrict__ data, const I* __restrict__ indices,
                            const I* __restrict__ indptr, const T* __restrict__ x,
                            T* __restrict__ out, I n_rows)
{
    __shared__ T partial[THREADS];
    const int t = (int)threadIdx.x;
    const int lane = t % LANES;
    const long long row = ((long long)blockIdx.x * THREADS + t) / LANES;
    T total = T(0);
    if (row < (long long)n_rows) {
        const I end = indptr[row + 1];
        for (I e = indptr[row] + lane; e < end; e += LANES) {
            total += data[e] * x[indices[e]];
        }
    }
    if (LANES == 1) {
        if (row < (long long)n_rows) out[row] = total;
        return;
    }
    partial[t] = total;
    __syncthreads();
    if (lane == 0 && row < (long long)n_rows) {
        T sum = partial[t];
        for (int k = 1; k < LANES; ++k) sum += partial[t + k];
        out[row] = sum;
    }
}
"""


def spmv_expression(dtype_name, index_name, lanes):
    """The template instance for values ``dtype_name``, indices ``index_name`` and ``lanes``."""
    return f"spmv_kernel<{CTYPES[dtype_name]}, {INDEX_CTYPES[index_name]}, {THREADS}, {lanes}>"


NAME_EXPRESSIONS = tuple(spmv_expression(d, i, lanes) for d in CTYPES for i in INDEX_CTYPES
                         for lanes in LANES)
"""Every template instance the module compiles."""


def lanes_for(n_rows, nnz):
    """Threads per row: the fewest (a power of two, 1..32) that leave each lane at most
    :data:`VALUES_PER_LANE` values of a mean row; one thread per row up to 6 values.

    Examples
    --------
    >>> lanes_for(100, 500), lanes_for(100, 900), lanes_for(10, 1000), lanes_for(10, 3)
    (1, 2, 32, 1)
    """
    mean = nnz / max(n_rows, 1)
    lanes = 1
    while lanes < MAX_LANES and lanes * VALUES_PER_LANE < mean:
        lanes *= 2
    return lanes


def spmv_shared_bytes(dtype_name):
    """Static shared memory the SpMV kernel declares: one partial sum per thread (with one lane a
    row the compiler drops the unused array)."""
    return THREADS * np.dtype(dtype_name).itemsize


def check_spmv(dtype_name, lanes):
    """Raise :class:`~hpcgpu.errors.ConfigError` unless a group of ``lanes`` threads per row tiles
    a block of :data:`THREADS` and the block fits the GPU."""
    if lanes not in LANES or THREADS % lanes:
        from hpcgpu.errors import ConfigError
        raise ConfigError(f"spmv lanes={lanes}: must be one of {LANES} and divide THREADS={THREADS}")
    launch_limits.check("matrix spmv_kernel", (dtype_name, lanes), THREADS, spmv_shared_bytes(dtype_name))


_TEMPLATES = TemplateKernels(KERNEL_SOURCE, OPTIONS, NAME_EXPRESSIONS)
_kernel = _TEMPLATES.kernel
"""The compiled template instance of an expression (the emulation tests replace it)."""


def spmv(data, indices, indptr, x, out):
    """``out = A x`` for the CSR arrays of ``A``; see the module docstring."""
    n_rows = out.shape[0]
    index_dtype = np.dtype(indices.dtype)
    lanes = lanes_for(n_rows, data.shape[0])
    check_spmv(np.dtype(data.dtype).name, lanes)
    blocks = -(-n_rows * lanes // THREADS)
    _kernel(spmv_expression(np.dtype(data.dtype).name, index_dtype.name, lanes))(
        (blocks, 1, 1), (THREADS, 1, 1), (data, indices, indptr, x, out, index_dtype.type(n_rows)))
    return out


_COMPUTE_TYPE_LOCK = threading.Lock()


def _compute_type_api():
    """CuPy's ``(get, set, DEFAULT, TF32)`` for the GEMM compute type, or None if it has none."""
    try:
        from cupy import _core
        from cupy._core import _routines_linalg
        return (_core.get_compute_type, _core.set_compute_type,
                _routines_linalg.COMPUTE_TYPE_DEFAULT, _routines_linalg.COMPUTE_TYPE_TF32)
    except (ImportError, AttributeError):
        return None


def matmul(a, b, out, allow_tf32):
    """``out = a @ b`` by cuBLAS; TF32 tensor cores for float32 only if ``allow_tf32``."""
    import cupy

    api = _compute_type_api()
    if api is None:
        cupy.dot(a, b, out=out)
        return out
    get, set_, default, tf32 = api
    dtype = np.dtype(a.dtype)
    wanted = tf32 if (allow_tf32 and dtype == np.float32) else default
    with _COMPUTE_TYPE_LOCK:
        previous = get(dtype)
        set_(dtype, wanted)
        try:
            cupy.dot(a, b, out=out)
        finally:
            set_(dtype, previous)
    return out


@functools.cache
def _dot_kernel():
    import cupy
    return cupy.ReductionKernel("T x, T y", "float64 total",
                                "static_cast<double>(x) * static_cast<double>(y)", "a + b",
                                "total = a", "0", "hpcgpu_dot", reduce_type="double")


@functools.cache
def _axpy_kernel():
    import cupy
    return cupy.ElementwiseKernel("T alpha, T x, T y", "T out", "out = alpha * x + y", "hpcgpu_axpy")


def dot(x, y):
    """``sum x * y`` accumulated in float64, as a float (waits for the device)."""
    return float(_dot_kernel()(x, y))


def axpy(alpha, x, y, out):
    """``out = alpha * x + y`` (``out`` may be ``x`` or ``y``)."""
    _axpy_kernel()(alpha, x, y, out)
    return out
