"""Matrix kernels for the CPU with Numba.

``matmul`` calls BLAS. Numba compiles ``np.dot`` on two matrices into a
direct call of ``sgemm``/``dgemm`` through SciPy's BLAS bindings
(``scipy.linalg.cython_blas``: the OpenBLAS bundled with SciPy), so with
SciPy installed the ``numba`` backend's GEMM is the same kind of library
code as the ``numpy`` backend's, at the same speed (on this project's 2-core
x86 machine, float32, n = 2048 and 4096: 0.99-1.01x NumPy with the two
interleaved, 0.94-1.00x in ``hpcgpu bench matrix`` runs that outside load
left alone; docs/journal.md). No Numba loop written by hand comes near a tuned
BLAS: its packing, micro-kernels in assembly and cache blocking are years of
work. Without SciPy (Numba's linear algebra needs it) :func:`matmul` falls
back to :func:`gemm_tiled`, a Numba loop blocked for the caches and four
rows of registers: 39 GFLOP/s against BLAS's 360 on the same machine
(float32, n = 2048), about a ninth. :data:`BLAS` says which path runs.

``spmv``: the rows are cut into chunks of about equal work (stored values
plus rows, found by binary search in ``indptr``), several per thread so
uneven threads balance; each row's sum runs in the dtype, in storage order.
Where most rows of the matrix hold the same diagonals (a stencil's matrix),
runs of such rows are read as bands, without their column indices
(:mod:`hpcgpu.kernels.matrix.banded_numba`: bitwise the same sums, 3-4x
faster for the 5-point Poisson matrix at 2048^2); whether that or the
plain CSR loop runs is timed once per machine
(:func:`spmv_variant`, :mod:`hpcgpu.autotune`).
``dot`` sums float64 products over fixed chunks of :data:`DOT_CHUNK`
elements in parallel and adds the chunk sums in order, so the result does
not depend on the number of threads. ``axpy`` is one parallel loop. Each of
the three runs on one thread or all of them, whichever measures faster at
its size (:func:`hpcgpu.kernels.threads.adaptive_threads`): with another
busy process on two cores, a 512^2 Poisson SpMV took 12 ms on two threads
and 3.4 ms on one.
"""

import functools
import importlib.util

import numba
import numpy as np
from numba import njit, prange

from hpcgpu import autotune
from hpcgpu.kernels.matrix.banded_numba import band_structure, spmv_banded
from hpcgpu.kernels.threads import adaptive_threads

BLAS = importlib.util.find_spec("scipy") is not None
"""True when ``matmul`` calls BLAS (SciPy is installed); else it runs :func:`gemm_tiled`."""

DOT_CHUNK = 1 << 14
"""Elements per parallel chunk of ``dot`` (fixed: the sum is the same on any thread count)."""

SERIAL_BELOW = 1 << 15
"""Work (elements, or stored values plus rows) below which ``spmv``, ``dot`` and ``axpy``
run a serial build of the same loop: waking the thread pool costs more than the work
(and a context switch's worth on a busy machine)."""

# Sums may be reordered into vector lanes (reassoc); no nnan/ninf, so NaN propagates.
_SUM_FLAGS = {"contract", "reassoc"}

ROWS = 4
"""Rows of C that one sweep of :func:`gemm_tiled` updates together (held in registers)."""
COLS = 256
"""Columns of C per panel of :func:`gemm_tiled`: four rows of it stay in L1."""


@njit(cache=True, nogil=True)
def _gemm_blas(a, b, out):
    np.dot(a, b, out)
    return out


@njit(parallel=True, nogil=True, cache=True, fastmath=_SUM_FLAGS)
def _gemm_tiled_kernel(a, b, out, zero):
    m, k = a.shape
    n = b.shape[1]
    for block in prange((m + ROWS - 1) // ROWS):
        i0 = block * ROWS
        i1 = min(i0 + ROWS, m)
        for j0 in range(0, n, COLS):
            j1 = min(j0 + COLS, n)
            width = j1 - j0
            for i in range(i0, i1):
                row = out[i, j0:j1]
                for j in range(width):
                    row[j] = zero
            if i1 - i0 == ROWS:
                c0 = out[i0, j0:j1]
                c1 = out[i0 + 1, j0:j1]
                c2 = out[i0 + 2, j0:j1]
                c3 = out[i0 + 3, j0:j1]
                for p in range(k):
                    a0 = a[i0, p]
                    a1 = a[i0 + 1, p]
                    a2 = a[i0 + 2, p]
                    a3 = a[i0 + 3, p]
                    b_row = b[p, j0:j1]
                    # Loop index from 0 over contiguous slices: vectorised loads and stores.
                    for j in range(width):
                        bj = b_row[j]
                        c0[j] += a0 * bj
                        c1[j] += a1 * bj
                        c2[j] += a2 * bj
                        c3[j] += a3 * bj
            else:
                for i in range(i0, i1):
                    c = out[i, j0:j1]
                    for p in range(k):
                        aip = a[i, p]
                        b_row = b[p, j0:j1]
                        for j in range(width):
                            c[j] += aip * b_row[j]
    return out


def gemm_tiled(a, b, out):
    """``out = a @ b`` by a hand-written parallel Numba loop (the fallback without SciPy).

    Threads take blocks of :data:`ROWS` rows; each block sweeps panels of
    :data:`COLS` columns, keeping four rows of ``a`` in registers and
    updating four rows of C per row of ``b`` read.
    """
    return _gemm_tiled_kernel(a, b, out, a.dtype.type(0))


def matmul(a, b, out, allow_tf32):
    """``out = a @ b``: BLAS through SciPy's bindings, else :func:`gemm_tiled`."""
    if BLAS:
        return _gemm_blas(a, b, out)
    return gemm_tiled(a, b, out)


@njit(cache=True, nogil=True)
def _balanced_bounds(indptr, chunks):
    """Row bounds of ``chunks`` chunks of about equal work (stored values + rows)."""
    n_rows = indptr.shape[0] - 1
    total = indptr[n_rows] + n_rows
    bounds = np.empty(chunks + 1, np.int64)
    bounds[0] = 0
    for c in range(1, chunks):
        target = total * c // chunks
        low = 0
        high = n_rows
        while low < high:  # the first row r with indptr[r] + r >= target
            middle = (low + high) // 2
            if indptr[middle] + middle < target:
                low = middle + 1
            else:
                high = middle
        bounds[c] = low
    bounds[chunks] = n_rows
    return bounds


@njit(parallel=True, nogil=True, cache=True, fastmath={"contract"})
def _spmv_kernel(data, indices, indptr, x, out, bounds, zero):
    for chunk in prange(bounds.shape[0] - 1):
        for i in range(bounds[chunk], bounds[chunk + 1]):
            total = zero
            for e in range(indptr[i], indptr[i + 1]):
                total += data[e] * x[indices[e]]
            out[i] = total
    return out


# The same loops compiled without threads (prange runs as range) for small inputs.
_spmv_serial = njit(cache=True, nogil=True, fastmath={"contract"})(_spmv_kernel.py_func)


SPMV_VARIANTS = {
    "banded": "runs of rows with the same diagonals read without their indices (banded_numba); bitwise the CSR sums",
    "csr": "every row by the CSR loop",
}
"""How ``spmv`` reads a matrix whose rows are mostly banded; both give bitwise the same result."""

DEFAULT_SPMV = "banded"
"""The ``spmv`` variant run with ``HPCGPU_AUTOTUNE=0``."""

TUNING_SIDE = 96
"""Grid side of the 5-point Poisson matrix the two ``spmv`` variants are timed on at first
use (9216 rows: tens of microseconds a product)."""


@functools.lru_cache(maxsize=None)
def _tuning_matrix(dtype_name):
    """The 5-point Poisson matrix (Dirichlet) of a TUNING_SIDE^2 grid as CSR arrays, x, y, and its bands."""
    side = TUNING_SIDE
    n = side * side
    row, col = np.divmod(np.arange(n), side)
    columns = np.stack([row * side + col + d for d in (-side, -1, 0, 1, side)], axis=1)
    valid = (columns >= 0) & (columns < n)
    valid[:, 1] &= col > 0
    valid[:, 3] &= col < side - 1
    indices = columns[valid].astype(np.int32)
    data = np.where(columns == np.arange(n)[:, None], 4.0, -1.0)[valid].astype(dtype_name)
    indptr = np.concatenate([[0], np.cumsum(valid.sum(axis=1))]).astype(np.int32)
    x = np.ones(n, dtype_name)
    return data, indices, indptr, x, np.empty(n, dtype_name), band_structure(indices, indptr)


def _tuning_runs(dtype):
    """The two variants, serial, on the tuning matrix (built at the first timed call only)."""
    def banded():
        data, indices, indptr, x, out, structure = _tuning_matrix(dtype.name)
        spmv_banded(data, indices, indptr, x, out, structure, np.array([0, out.shape[0]], np.int64),
                    parallel=False)

    def csr():
        data, indices, indptr, x, out, _ = _tuning_matrix(dtype.name)
        _spmv_serial(data, indices, indptr, x, out, np.array([0, out.shape[0]], np.int64), data.dtype.type(0))

    return {"banded": banded, "csr": csr}


def spmv_variant(dtype):
    """The ``spmv`` variant (a key of :data:`SPMV_VARIANTS`) for ``dtype`` on this machine, from
    :func:`hpcgpu.autotune.choose`."""
    dtype = np.dtype(dtype)
    return autotune.choose(f"matrix.spmv.format.{dtype.name}", _tuning_runs(dtype), default=DEFAULT_SPMV)


@adaptive_threads(key=lambda data, indices, indptr, x, out: (data.shape[0], out.shape[0]))
def spmv(data, indices, indptr, x, out):
    """``out = A x`` for the CSR arrays of ``A``; see the module docstring."""
    n_rows = out.shape[0]
    zero = data.dtype.type(0)
    serial = data.shape[0] + n_rows < SERIAL_BELOW
    structure = band_structure(indices, indptr) if spmv_variant(data.dtype) == "banded" else None
    if serial:
        bounds = np.array([0, n_rows], np.int64)
    else:
        bounds = _balanced_bounds(indptr, max(1, min(n_rows, 8 * numba.get_num_threads())))
    if structure is not None:
        return spmv_banded(data, indices, indptr, x, out, structure, bounds, parallel=not serial)
    if serial:
        return _spmv_serial(data, indices, indptr, x, out, bounds, zero)
    return _spmv_kernel(data, indices, indptr, x, out, bounds, zero)


@njit(parallel=True, nogil=True, cache=True, fastmath=_SUM_FLAGS)
def _dot_kernel(x, y, chunk):
    n = x.shape[0]
    n_chunks = (n + chunk - 1) // chunk
    partial = np.empty(n_chunks, np.float64)
    for c in prange(n_chunks):
        start = c * chunk
        stop = min(start + chunk, n)
        xs = x[start:stop]
        ys = y[start:stop]
        total = 0.0
        for i in range(stop - start):
            total += np.float64(xs[i]) * np.float64(ys[i])
        partial[c] = total
    total = 0.0
    for c in range(n_chunks):
        total += partial[c]
    return total


_dot_serial = njit(cache=True, nogil=True, fastmath=_SUM_FLAGS)(_dot_kernel.py_func)


@adaptive_threads(key=lambda x, y: x.shape[0])
def dot(x, y):
    """``sum x * y`` accumulated in float64, as a float (the same on any thread count)."""
    kernel = _dot_serial if x.shape[0] < SERIAL_BELOW else _dot_kernel
    return float(kernel(x, y, DOT_CHUNK))


@njit(parallel=True, nogil=True, cache=True, fastmath={"contract"})
def _axpy_kernel(alpha, x, y, out):
    for i in prange(x.shape[0]):
        out[i] = alpha * x[i] + y[i]
    return out


_axpy_serial = njit(cache=True, nogil=True, fastmath={"contract"})(_axpy_kernel.py_func)


@adaptive_threads(key=lambda alpha, x, y, out: x.shape[0])
def axpy(alpha, x, y, out):
    """``out = alpha * x + y`` (``out`` may be ``x`` or ``y``)."""
    kernel = _axpy_serial if x.shape[0] < SERIAL_BELOW else _axpy_kernel
    return kernel(alpha, x, y, out)
