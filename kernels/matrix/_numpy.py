"""Matrix kernels in plain NumPy: the reference every other backend is tested against.

``matmul`` is NumPy's BLAS (``np.matmul``: OpenBLAS ``sgemm``/``dgemm`` in
NumPy's wheels). ``spmv`` gathers ``x`` at the column indices, multiplies,
and adds each row's products with ``np.add.reduceat`` (in float64, rounded
once to the dtype at the end; a row without values gets 0). ``dot`` adds float64
products of chunks that stay in cache. The code is array-module generic, so
it also runs on CuPy arrays (a second cross-check on a GPU).
"""

import numpy as np

DOT_CHUNK = 1 << 16
"""Elements per float64 chunk of ``dot``: the casts stay in cache, not in new arrays."""


def _xp(array):
    if type(array).__module__.split(".")[0] == "cupy":
        import cupy
        return cupy
    return np


def matmul(a, b, out, allow_tf32):
    """``out = a @ b`` by BLAS; ``allow_tf32`` is ignored (full precision)."""
    _xp(a).matmul(a, b, out=out)
    return out


def spmv(data, indices, indptr, x, out):
    """``out = A x`` for the CSR arrays of ``A``."""
    xp = _xp(data)
    products = data.astype(np.float64) * x.astype(np.float64)[indices]
    # reduceat needs strictly increasing starts: sum from each non-empty row's
    # start to the next one's (the empty rows between hold nothing).
    nonempty = indptr[1:] > indptr[:-1]
    out[...] = 0
    out[nonempty] = xp.add.reduceat(products, indptr[:-1][nonempty])
    return out


def dot(x, y):
    """``sum x * y`` accumulated in float64, as a float."""
    xp = _xp(x)
    if x.dtype == np.float64:
        return float(xp.dot(x, y))
    total = 0.0
    for start in range(0, x.shape[0], DOT_CHUNK):
        stop = start + DOT_CHUNK
        total += float(xp.dot(x[start:stop].astype(np.float64), y[start:stop].astype(np.float64)))
    return total


def axpy(alpha, x, y, out):
    """``out = alpha * x + y`` (``out`` may be ``x`` or ``y``)."""
    out[...] = alpha * x + y
    return out
