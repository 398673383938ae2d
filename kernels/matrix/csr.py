"""The compressed sparse row (CSR) matrix of the matrix family.

A :class:`CSRMatrix` is three arrays and a shape, the layout of
``scipy.sparse.csr_matrix``: row ``i`` holds the values
``data[indptr[i]:indptr[i + 1]]`` in the columns
``indices[indptr[i]:indptr[i + 1]]``. Columns within a row need not be
sorted, and a column that appears twice in a row counts twice (its values
add up), as in SciPy's matrix-vector product. A row with no entries is a
row of zeros.

The arrays live on one device: all NumPy (host) or all CuPy (GPU);
:meth:`CSRMatrix.to_backend` moves them. The structure is checked once, on
construction, so that a kernel never reads outside an array.
"""

from dataclasses import dataclass

import numpy as np

from hpcgpu.errors import ConfigError
from hpcgpu.validation import check_finite_array, check_int

__all__ = ["CSRMatrix"]

INDEX_LIMIT = 2**31 - 1
"""Largest value an int32 index holds: beyond it indices are int64."""


def _array_module(array):
    if type(array).__module__.split(".")[0] == "cupy":
        import cupy
        return cupy
    return np


def _describe(array):
    return f"{getattr(array, 'dtype', type(array).__name__)} of shape {getattr(array, 'shape', None)}"


@dataclass(frozen=True, eq=False)
class CSRMatrix:
    """A sparse matrix in compressed sparse row form, checked on construction.

    Attributes
    ----------
    data : array (nnz,)
        The stored values, float32 or float64, all finite.
    indices : array (nnz,)
        Column of each stored value, ``0 <= indices < shape[1]``; int32
        (int64 only when ``nnz`` or a dimension exceeds 2**31 - 1). Any
        integer dtype is accepted and converted.
    indptr : array (shape[0] + 1,)
        Row ``i`` is ``data[indptr[i]:indptr[i + 1]]``; ``indptr[0] == 0``,
        non-decreasing, ``indptr[-1] == nnz``; the dtype of ``indices``.
    shape : (int, int)
        ``(rows, columns)``, each >= 0.

    Raises
    ------
    ConfigError
        Arrays that are not 1-D, a float dtype other than float32/float64,
        non-integer indices, arrays on different devices, lengths that do not
        match, a decreasing ``indptr``, a column outside the matrix, or a
        NaN or infinite value.

    Examples
    --------
    >>> import numpy as np
    >>> A = CSRMatrix(np.array([2.0, -1.0, 3.0]), np.array([0, 2, 1]), np.array([0, 2, 2, 3]),
    ...               shape=(3, 3))
    >>> A.nnz, A.dtype.name, A.indices.dtype.name
    (3, 'float64', 'int32')
    >>> A.to_dense().tolist()
    [[2.0, 0.0, -1.0], [0.0, 0.0, 0.0], [0.0, 3.0, 0.0]]
    """

    data: object
    indices: object
    indptr: object
    shape: tuple

    def __post_init__(self):
        shape = self.shape
        if not isinstance(shape, (tuple, list)) or len(shape) != 2:
            raise ConfigError(f"shape must be a pair (rows, columns); got {shape!r}")
        n_rows = check_int("shape[0] (rows)", shape[0], minimum=0)
        n_cols = check_int("shape[1] (columns)", shape[1], minimum=0)
        arrays = {"data": self.data, "indices": self.indices, "indptr": self.indptr}
        modules = set()
        for name, array in arrays.items():
            if array is None or not hasattr(array, "ndim") or not hasattr(array, "dtype"):
                array = np.asarray(array)
            if array.ndim != 1:
                raise ConfigError(f"{name} must be a 1-D array; got {_describe(array)}")
            arrays[name] = array
            modules.add(_array_module(array))
        if len(modules) > 1:
            raise ConfigError("data, indices and indptr must all be NumPy arrays or all CuPy arrays "
                              "(one device); move them together, e.g. with CSRMatrix.to_backend")
        xp = modules.pop()
        data, indices, indptr = arrays["data"], arrays["indices"], arrays["indptr"]
        if data.dtype.name not in ("float32", "float64"):
            raise ConfigError(f"data must have dtype float32 or float64; got {data.dtype}")
        for name, array in (("indices", indices), ("indptr", indptr)):
            if array.dtype.kind not in "iu":
                raise ConfigError(f"{name} must hold integers; got dtype {array.dtype}")
        nnz = data.shape[0]
        if indices.shape[0] != nnz:
            raise ConfigError(f"indices must have one entry per stored value: data has {nnz}, "
                              f"indices has {indices.shape[0]}")
        if indptr.shape[0] != n_rows + 1:
            raise ConfigError(f"indptr must have rows + 1 = {n_rows + 1} entries for shape "
                              f"{(n_rows, n_cols)}; got {indptr.shape[0]}")
        _check_structure(xp, indices, indptr, nnz, n_cols)
        check_finite_array("data", data)
        index_dtype = np.dtype(np.int32 if max(nnz, n_rows, n_cols) <= INDEX_LIMIT else np.int64)
        object.__setattr__(self, "shape", (n_rows, n_cols))
        object.__setattr__(self, "data", xp.ascontiguousarray(data))
        object.__setattr__(self, "indices", xp.ascontiguousarray(indices, dtype=index_dtype))
        object.__setattr__(self, "indptr", xp.ascontiguousarray(indptr, dtype=index_dtype))

    @property
    def nnz(self):
        """Number of stored values (explicit zeros and duplicates included)."""
        return int(self.data.shape[0])

    @property
    def dtype(self):
        """The dtype of the values."""
        return self.data.dtype

    @property
    def on_gpu(self):
        """True when the arrays are CuPy arrays."""
        return _array_module(self.data) is not np

    def to_backend(self, backend):
        """This matrix with its arrays on ``backend``'s device (itself if already there).

        Examples
        --------
        >>> import numpy as np
        >>> A = CSRMatrix.from_dense(np.eye(2))
        >>> A.to_backend("numpy") is A
        True
        """
        from hpcgpu.backends import get_backend

        backend = get_backend(backend)
        if isinstance(self.data, backend.xp.ndarray):
            return self
        return CSRMatrix(backend.asarray(self.data), backend.asarray(self.indices),
                         backend.asarray(self.indptr), self.shape)

    def diagonal(self):
        """The main diagonal (length ``min(shape)``), on the matrix's device; duplicates add up.

        Examples
        --------
        >>> import numpy as np
        >>> CSRMatrix.from_dense(np.array([[4.0, 1.0], [0.0, 3.0]])).diagonal().tolist()
        [4.0, 3.0]
        """
        xp = _array_module(self.data)
        n = min(self.shape)
        rows = _row_of_each_value(xp, self.indptr, self.nnz)
        on_diagonal = (self.indices == rows) & (rows < n)
        diagonal = xp.bincount(rows[on_diagonal], weights=self.data[on_diagonal], minlength=n)
        return diagonal[:n].astype(self.dtype)

    def to_dense(self):
        """The matrix as a dense 2-D array on its device (duplicates added)."""
        xp = _array_module(self.data)
        dense = xp.zeros(self.shape, self.dtype)
        rows = _row_of_each_value(xp, self.indptr, self.nnz)
        if xp is np:
            np.add.at(dense, (rows, self.indices), self.data)
        else:
            import cupyx
            cupyx.scatter_add(dense, (rows, self.indices), self.data)
        return dense

    @classmethod
    def from_dense(cls, array):
        """The nonzero entries of a dense 2-D NumPy or CuPy array, row by row.

        Examples
        --------
        >>> import numpy as np
        >>> CSRMatrix.from_dense(np.array([[0.0, 5.0], [0.0, 0.0]])).indptr.tolist()
        [0, 1, 1]
        """
        if getattr(array, "ndim", None) != 2:
            raise ConfigError(f"from_dense needs a 2-D array; got {_describe(array)}")
        xp = _array_module(array)
        rows, cols = xp.nonzero(array)
        counts = xp.bincount(rows, minlength=array.shape[0])
        indptr = xp.concatenate([xp.zeros(1, np.int64), xp.cumsum(counts)])
        return cls(array[rows, cols], cols, indptr, tuple(array.shape))

    @classmethod
    def from_scipy(cls, matrix):
        """A SciPy sparse matrix or array (any format), converted to CSR on the host.

        Examples
        --------
        >>> import scipy.sparse
        >>> CSRMatrix.from_scipy(scipy.sparse.eye(3, format="coo")).nnz
        3
        """
        import scipy.sparse

        if not scipy.sparse.issparse(matrix):
            raise ConfigError(f"from_scipy needs a scipy.sparse matrix; got {type(matrix).__name__}")
        csr = matrix.tocsr()
        return cls(csr.data, csr.indices, csr.indptr, tuple(csr.shape))

    def to_scipy(self):
        """This matrix as a ``scipy.sparse.csr_matrix`` (host copies of GPU arrays).

        Raises
        ------
        ModuleNotFoundError
            SciPy is not installed (``pip install scipy``).
        """
        import scipy.sparse

        def host(array):
            return array.get() if hasattr(array, "get") else array

        return scipy.sparse.csr_matrix((host(self.data), host(self.indices), host(self.indptr)),
                                       shape=self.shape)

    def __repr__(self):
        where = "GPU" if self.on_gpu else "host"
        return (f"CSRMatrix(shape={self.shape}, nnz={self.nnz}, dtype={self.dtype.name}, "
                f"index={self.indices.dtype.name}, {where})")


def _check_structure(xp, indices, indptr, nnz, n_cols):
    first, last = int(indptr[0]), int(indptr[-1])
    if first != 0 or last != nnz:
        raise ConfigError(f"indptr must start at 0 and end at nnz = {nnz} (the length of data); "
                          f"got indptr[0] = {first}, indptr[-1] = {last}")
    if indptr.shape[0] > 1:
        steps = xp.diff(indptr.astype(np.int64))
        if bool((steps < 0).any()):
            row = int(xp.argmax(steps < 0))
            raise ConfigError(f"indptr must be non-decreasing; it falls from {int(indptr[row])} to "
                              f"{int(indptr[row + 1])} at row {row}")
    if nnz:
        low, high = int(indices.min()), int(indices.max())
        if low < 0 or high >= n_cols:
            bad = low if low < 0 else high
            raise ConfigError(f"indices must lie in 0..columns-1 = 0..{n_cols - 1}; got column {bad}")


def _row_of_each_value(xp, indptr, nnz):
    """The row of each stored value (length nnz), on the arrays' device."""
    return xp.searchsorted(indptr, xp.arange(nnz), side="right") - 1
