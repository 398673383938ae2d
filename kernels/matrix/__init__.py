"""Matrix kernels: dense GEMM, CSR sparse matrix-vector product, dot and axpy.

The local block of distributed linear algebra and the inner loop of Krylov
solvers. Public functions check their input once and dispatch to the
backend files (``_numpy``, ``_numba``, ``_cuda``, ``_cupy``), which share one
signature on raw arrays:

=========  ==============================  ====================================
backend    ``matmul``                      ``spmv``
=========  ==============================  ====================================
``numpy``  BLAS (``np.matmul``)            vectorised gather + ``reduceat``
``numba``  BLAS too: ``np.dot`` compiled   one thread per chunk of rows,
           by Numba into SciPy's           chunks balanced by stored values
           ``sgemm``/``dgemm``; a hand-
           written tiled loop only
           without SciPy (much slower)
``cuda``   hand-written Numba-CUDA:        one thread per row
           shared-memory tiles and a
           register tile per thread
``cupy``   cuBLAS (``cupy.dot``);          CUDA C++ ``RawKernel``: a group of
           TF32 only with                  1-32 threads per row, sized from
           ``allow_tf32=True``             the mean row length
=========  ==============================  ====================================

Precision: ``matmul`` and ``spmv`` accumulate in the dtype of their inputs
(as BLAS and SciPy do; the ``numpy`` reference sums SpMV rows in float64);
``dot`` accumulates in float64 whatever the dtype and
returns a Python float, because Krylov solvers steer by dot products and a
float32 sum over 10**7 terms loses about three digits. float32 and float64
are supported; both operands of a call must share one dtype (mixing them is
an error, never a silent promotion). NaN and infinity in dense operands
follow IEEE arithmetic (they are not searched for: that would cost as much
as ``dot`` or ``axpy`` itself); a :class:`CSRMatrix` is checked for them once,
when it is built.

Each backend file exports::

    matmul(a, b, out, allow_tf32)          # out (m, n) = a (m, k) @ b (k, n); returns out
    spmv(data, indices, indptr, x, out)    # out (rows,) = A x for the CSR arrays; returns out
    dot(x, y)                              # float: sum x * y, accumulated in float64
    axpy(alpha, x, y, out)                 # out = alpha * x + y; out may be x or y; returns out

Arrays arrive checked, on the backend's device, C-contiguous, in one dtype,
with every dimension >= 1 (empty cases are answered here); ``alpha`` is a
scalar of that dtype; ``out`` shares no memory with the inputs of
``matmul`` and ``spmv``.

Benchmarks and tuning time the kernels themselves: :func:`raw_kernels`
returns a backend's file, the four functions above with no checks, and the
tables they read: ``BLAS`` (``numba``: whether ``matmul`` calls SciPy's
BLAS), ``LAUNCH`` (``cuda``: the GEMM tile sizes per dtype), ``VARIANTS``
and ``gemm(a, b, out, launch)`` (``cuda``: the other tile sizes, and one
GEMM with a given one).

Examples
--------
>>> import numpy as np
>>> from hpcgpu.kernels import matrix
>>> a = np.array([[1.0, 2.0], [3.0, 4.0]])
>>> matrix.matmul(a, a, backend="numpy").tolist()
[[7.0, 10.0], [15.0, 22.0]]
>>> A = matrix.CSRMatrix.from_dense(a)
>>> matrix.spmv(A, np.array([1.0, 1.0]), backend="numpy").tolist()
[3.0, 7.0]
>>> matrix.dot(np.array([1.0, 2.0]), np.array([3.0, 4.0]), backend="numpy")
11.0
"""

from hpcgpu.kernels.matrix.csr import CSRMatrix
from hpcgpu.kernels.matrix.ops import axpy, dot, matmul, raw_kernels, spmv
from hpcgpu.kernels.matrix.solvers import CGResult, as_operator, conjugate_gradient, error_stalled
from hpcgpu.kernels.matrix.poisson import PoissonOperator

__all__ = ["CSRMatrix", "matmul", "spmv", "dot", "axpy", "CGResult", "as_operator", "conjugate_gradient",
           "error_stalled", "PoissonOperator", "raw_kernels"]
