"""The four kernel operations of the matrix family, checked and dispatched: ``matmul``, ``spmv``, ``dot``, ``axpy``.

Each checks its input once and calls the backend file's function of the
same name (see :mod:`hpcgpu.kernels.matrix` for the backends and what each
backend file exports). The solvers (:mod:`.solvers`, :mod:`.poisson`) build
on these, so they live below the package's ``__init__``, which re-exports
them.
"""

import numpy as np

from hpcgpu.backends import get_backend
from hpcgpu.errors import ConfigError
from hpcgpu.kernels.matrix.csr import CSRMatrix
from hpcgpu.validation import check_float

__all__ = ["matmul", "spmv", "dot", "axpy", "raw_kernels"]

FLOAT_DTYPES = ("float32", "float64")


def _describe(array):
    return f"{array.dtype} of shape {tuple(array.shape)}"


def _operand(backend, name, array, ndim):
    """``array`` on the backend's device, checked to be a float array of ``ndim`` dimensions."""
    if array is None:
        raise ConfigError(f"{name} must be a {ndim}-D float32 or float64 array, got None")
    array = backend.asarray(array)
    if array.ndim != ndim:
        kind = "matrix" if ndim == 2 else "vector"
        raise ConfigError(f"{name} must be a {ndim}-D array (a {kind}); got {array.ndim}-D, "
                          f"{_describe(array)}")
    if array.dtype.name not in FLOAT_DTYPES:
        raise ConfigError(f"{name} must have dtype float32 or float64; got {array.dtype}")
    return array


def _same_dtype(names, arrays):
    first = arrays[0].dtype
    for name, array in zip(names[1:], arrays[1:]):
        if array.dtype != first:
            raise ConfigError(
                f"{name} has dtype {array.dtype} but {names[0]} has {first}; operands of one call "
                f"must share a dtype (cast one explicitly, e.g. {name}.astype('{first}'))")
    return first


def _output(backend, out, shape, dtype, inputs=()):
    """Where the result goes: ``(target, out)``; ``target`` is C-contiguous.

    ``out`` None: a new array (both the same). Otherwise ``out`` is checked
    (device, shape, dtype, no overlap with ``inputs``); a non-contiguous one
    gets a contiguous scratch ``target`` that :func:`_finish` copies back.
    """
    if out is None:
        array = backend.empty(shape, dtype)
        return array, array
    if not isinstance(out, backend.xp.ndarray):
        raise ConfigError(f"out must be a {backend.xp.__name__} array on the {backend.name!r} "
                          f"backend's device; got {type(out).__name__}")
    if tuple(out.shape) != tuple(shape) or out.dtype != dtype:
        raise ConfigError(f"out must have shape {tuple(shape)} and dtype {dtype}; got {_describe(out)}")
    for name, array in inputs:
        if backend.xp.may_share_memory(out, array):
            raise ConfigError(f"out shares memory with {name}; the result must go to a separate array")
    if out.flags.c_contiguous:
        return out, out
    return backend.empty(shape, dtype), out


def _finish(target, out):
    if target is not out:
        out[...] = target
    return out


def matmul(a, b, out=None, *, backend="auto", allow_tf32=False):
    """Dense matrix product ``C = A B``.

    Parameters
    ----------
    a : array (m, k)
        float32 or float64; NumPy, or CuPy for the GPU backends (host arrays
        are copied to the device).
    b : array (k, n)
        Same dtype as ``a``.
    out : array (m, n), optional
        Where to write ``C`` (same dtype, on the backend's device, sharing
        no memory with ``a`` or ``b``); default a new array.
    backend : str or Backend
        ``numpy`` and ``numba`` call BLAS (``numba`` through SciPy's BLAS
        from compiled code; without SciPy, a hand-written Numba loop);
        ``cuda`` runs hpcgpu's tiled Numba-CUDA kernel; ``cupy`` calls cuBLAS.
    allow_tf32 : bool
        Let the ``cupy`` backend use TensorFloat-32 tensor cores for float32
        (inputs rounded to 10 mantissa bits, float32 accumulation): several
        times faster on Ampere and newer GPUs, but the relative error grows
        to about 1e-3 (against about 1e-6 in float32). Ignored by the other
        backends and for float64, which always compute in full precision.

    Returns
    -------
    out : array (m, n)
        ``C``, in the dtype of the operands, on the backend's device.

    Raises
    ------
    ConfigError
        Operands that are not 2-D float32/float64 arrays, inner dimensions
        that differ, mixed dtypes, or a bad ``out``.

    Examples
    --------
    >>> import numpy as np
    >>> a = np.arange(6.0).reshape(2, 3)
    >>> matmul(a, a.T, backend="numpy").tolist()
    [[5.0, 14.0], [14.0, 50.0]]
    """
    backend = get_backend(backend)
    if not isinstance(allow_tf32, (bool, np.bool_)):
        raise ConfigError(f"allow_tf32 must be True or False; got {allow_tf32!r}")
    a = _operand(backend, "a", a, 2)
    b = _operand(backend, "b", b, 2)
    dtype = _same_dtype(("a", "b"), (a, b))
    (m, k), (k_b, n) = a.shape, b.shape
    if k != k_b:
        raise ConfigError(f"inner dimensions differ: a is {tuple(a.shape)} and b is {tuple(b.shape)}; "
                          "a.shape[1] must equal b.shape[0]")
    target, out = _output(backend, out, (m, n), dtype, (("a", a), ("b", b)))
    if m and n:
        if k == 0:
            target[...] = 0
        else:
            xp = backend.xp
            backend.kernels("matrix").matmul(xp.ascontiguousarray(a), xp.ascontiguousarray(b), target,
                                             bool(allow_tf32))
    return _finish(target, out)


def spmv(matrix, x, out=None, *, backend="auto"):
    """Sparse matrix-vector product ``y = A x`` for a :class:`CSRMatrix` ``A``.

    Parameters
    ----------
    matrix : CSRMatrix
        ``A``, shape ``(rows, columns)``. Its arrays are moved to the
        backend's device on every call unless they are there already: for
        repeated products move it once with ``matrix.to_backend(backend)``.
    x : array (columns,)
        The vector, in the matrix's dtype.
    out : array (rows,), optional
        Where to write ``y`` (not sharing memory with ``x``); default a new
        array.
    backend : str or Backend

    Returns
    -------
    out : array (rows,)
        ``y``; rows without stored values give 0.

    Raises
    ------
    ConfigError
        ``matrix`` not a CSRMatrix, ``x`` not a vector of length
        ``columns``, a dtype that differs from the matrix's, or a bad ``out``.

    Examples
    --------
    >>> import numpy as np
    >>> A = CSRMatrix(np.array([2.0, 1.0]), np.array([1, 0]), np.array([0, 1, 1, 2]), shape=(3, 2))
    >>> spmv(A, np.array([10.0, 20.0]), backend="numpy").tolist()
    [40.0, 0.0, 10.0]
    """
    backend = get_backend(backend)
    if not isinstance(matrix, CSRMatrix):
        raise ConfigError(f"matrix must be a CSRMatrix (see CSRMatrix.from_scipy / from_dense); "
                          f"got {type(matrix).__name__}")
    matrix = matrix.to_backend(backend)
    x = _operand(backend, "x", x, 1)
    n_rows, n_cols = matrix.shape
    if x.shape[0] != n_cols:
        raise ConfigError(f"x must have length columns = {n_cols} for a matrix of shape "
                          f"{matrix.shape}; got {x.shape[0]}")
    _same_dtype(("matrix", "x"), (matrix.data, x))
    target, out = _output(backend, out, (n_rows,), matrix.dtype, (("x", x),))
    if n_rows:
        if matrix.nnz == 0 or n_cols == 0:
            target[...] = 0
        else:
            backend.kernels("matrix").spmv(matrix.data, matrix.indices, matrix.indptr,
                                           backend.xp.ascontiguousarray(x), target)
    return _finish(target, out)


def _vectors(backend, x, y):
    x = _operand(backend, "x", x, 1)
    y = _operand(backend, "y", y, 1)
    if x.shape != y.shape:
        raise ConfigError(f"x and y must have the same length; got {x.shape[0]} and {y.shape[0]}")
    dtype = _same_dtype(("x", "y"), (x, y))
    xp = backend.xp
    return xp.ascontiguousarray(x), xp.ascontiguousarray(y), dtype


def dot(x, y, *, backend="auto"):
    """Inner product ``sum_i x_i y_i`` of two vectors, accumulated in float64.

    Parameters
    ----------
    x, y : array (n,)
        float32 or float64, one dtype.
    backend : str or Backend

    Returns
    -------
    float
        The sum, accumulated in float64 for both dtypes (a float32 sum of
        many terms would lose digits a Krylov solver needs). On a GPU this
        waits for the device (the value comes back to the host).

    Raises
    ------
    ConfigError
        Not 1-D float arrays, different lengths or dtypes.

    Examples
    --------
    >>> import numpy as np
    >>> dot(np.array([1.0, 2.0, 3.0], np.float32), np.array([4.0, 5.0, 6.0], np.float32),
    ...     backend="numpy")
    32.0
    """
    backend = get_backend(backend)
    x, y, _ = _vectors(backend, x, y)
    if x.shape[0] == 0:
        return 0.0
    return float(backend.kernels("matrix").dot(x, y))


def axpy(alpha, x, y, out=None, *, backend="auto"):
    """``alpha * x + y`` for vectors ``x``, ``y`` and a scalar ``alpha``.

    Parameters
    ----------
    alpha : float
        Finite and within the range of the vectors' dtype, in which it is applied.
    x, y : array (n,)
        float32 or float64, one dtype.
    out : array (n,), optional
        Where to write the result; may be ``x`` or ``y`` itself (in place:
        ``axpy(a, x, y, out=y)`` is BLAS's ``y += a x``). Default a new array.
    backend : str or Backend

    Returns
    -------
    out : array (n,)

    Raises
    ------
    ConfigError
        A non-finite ``alpha`` or one beyond the range of the dtype, vectors
        of different lengths or dtypes, or a bad ``out``.

    Examples
    --------
    >>> import numpy as np
    >>> y = np.array([1.0, 1.0])
    >>> axpy(2.0, np.array([3.0, 4.0]), y, out=y, backend="numpy").tolist()
    [7.0, 9.0]
    """
    backend = get_backend(backend)
    alpha = check_float("alpha", alpha)
    x, y, dtype = _vectors(backend, x, y)
    target, out = _output(backend, out, x.shape, dtype)
    # In place on x or y is fine (elementwise); a shifted overlap is not.
    for name, array in (("x", x), ("y", y)):
        if backend.xp.may_share_memory(out, array) and not _same_memory(out, array):
            raise ConfigError(f"out overlaps {name} without being {name}; pass {name} itself or a "
                              "separate array")
    # alpha is applied in the vectors' dtype: one beyond its range would turn into inf
    if abs(alpha) > float(np.finfo(dtype).max):
        raise ConfigError(f"alpha={alpha!r} does not fit the vectors' dtype {dtype} "
                          f"(|alpha| <= {float(np.finfo(dtype).max):.4g})")
    if x.shape[0]:
        backend.kernels("matrix").axpy(dtype.type(alpha), x, y, target)
    return _finish(target, out)


def _address(array):
    data = array.data
    return data.ptr if hasattr(data, "ptr") else array.__array_interface__["data"][0]


def _same_memory(a, b):
    """True when ``a`` and ``b`` view exactly the same elements in the same order."""
    return _address(a) == _address(b) and a.strides == b.strides and a.shape == b.shape


def raw_kernels(backend="auto"):
    """The backend file of the matrix family for ``backend``: its kernels with no input checks.

    For benchmarks and tuning that time the kernels themselves. The
    functions take what the public ones hand them (see "Each backend file
    exports" in :mod:`hpcgpu.kernels.matrix`): checked, C-contiguous arrays
    of one float dtype on the backend's device; anything else is undefined.

    Parameters
    ----------
    backend : str or Backend

    Returns
    -------
    module
        ``matmul``, ``spmv``, ``dot``, ``axpy``, and the backend's tables
        (``BLAS`` for ``numba``; ``LAUNCH``, ``VARIANTS`` and ``gemm`` for ``cuda``).

    Examples
    --------
    >>> raw_kernels("numpy").dot(np.ones(3), np.ones(3))
    3.0
    """
    return get_backend(backend).kernels("matrix")
