"""Matrix kernels: every backend against a float64 NumPy reference, CSR structure, bad input.

The reference is computed in float64 from the operands as rounded to the
tested dtype, so the error measured is the backend's own rounding:
max |result - reference| / max |reference|. A float32 GEMM or SpMV rounds
each partial sum, so even the ``numpy`` backend is off by about 1e-7 there
(the shared table's 0 for numpy is for numpy against itself); the limit is
the shared table's tolerance or :data:`ROUNDING` for the operation and
dtype, whichever is larger. Measured on the CPU at these sizes (inner
dimension <= 257): GEMM 2.3e-7 in float32 and 2e-16 in float64; SpMV 1e-7
and 4e-16.
"""

import importlib.util
import os
import pickle
import re
import subprocess
import sys
from dataclasses import FrozenInstanceError

import numba
import numpy as np
import pytest
from _support import small, tolerance, usable_backend

from hpcgpu.errors import ConfigError
from hpcgpu.kernels import matrix
from hpcgpu.kernels.matrix import CSRMatrix, _numba


def sparse():
    """scipy.sparse, the SpMV reference (in the test extra; the GPU image may lack it)."""
    return pytest.importorskip("scipy.sparse")


ROUNDING = {
    ("matmul", "float32"): 5e-6,
    ("matmul", "float64"): 1e-13,
    ("spmv", "float32"): 5e-6,
    ("spmv", "float64"): 1e-13,
    ("axpy", "float32"): 2e-7,
    ("axpy", "float64"): 1e-15,
}
"""Rounding of each operation in the dtype against the float64 reference (about 20x
the largest error measured)."""

TF32_TOLERANCE = 5e-3
"""cuBLAS with TF32 tensor cores (10-bit mantissas): about 1e-3 relative at these sizes."""


def limit(backend, dtype, operation):
    return max(tolerance(backend, dtype), ROUNDING[(operation, np.dtype(dtype).name)])


def relative_error(result, reference, backend, scale=None):
    """Largest error over ``scale`` (default: the largest reference entry)."""
    result = backend.to_host(result)
    assert np.isfinite(result).all()
    scale = np.abs(reference).max() if scale is None else scale
    return float(np.abs(result.astype(np.float64) - reference).max() / (scale if scale else 1.0))


def product_scale(a, b):
    """``max(|A| |B|)``, the scale of a GEMM's rounding bound ``|C - C*| <= k eps |A| |B|``.

    An entry of ``A B`` can be small through cancellation while its rounding
    error follows the products summed (a float32 row times a column once
    came out 6.5e-6 of its own value): errors are measured against this.
    """
    return float((np.abs(np.asarray(a, dtype=np.float64)) @ np.abs(np.asarray(b, dtype=np.float64))).max())


# (m, k, n) per case: full size on the CPU (and GPU), tiny under the CUDA
# simulator, where the default 64 x 64 tiles still see partial tiles and two
# tiles along the long side.
SHAPES = {
    "square": ((128, 128, 128), (20, 20, 20)),
    "tall": ((300, 40, 17), (70, 5, 3)),
    "wide": ((9, 50, 310), (3, 6, 70)),
    "odd": ((67, 257, 129), (17, 9, 33)),
    "inner-1": ((31, 1, 29), (5, 1, 7)),
    "row-times-column": ((1, 203, 1), (1, 13, 1)),
}


def random_matrices(rng, m, k, n, dtype):
    a = rng.standard_normal((m, k)).astype(dtype)
    b = rng.standard_normal((k, n)).astype(dtype)
    return a, b


@pytest.mark.parametrize("case", SHAPES)
def test_matmul_matches_float64_reference(backend, dtype, case, rng):
    m, k, n = small(backend, *SHAPES[case])
    a, b = random_matrices(rng, m, k, n, dtype)
    reference = a.astype(np.float64) @ b.astype(np.float64)
    c = matrix.matmul(backend.asarray(a), backend.asarray(b), backend=backend)
    assert c.shape == (m, n) and c.dtype == dtype
    assert isinstance(c, backend.xp.ndarray)
    assert relative_error(c, reference, backend, product_scale(a, b)) <= limit(backend, dtype, "matmul")


def test_matmul_writes_into_out_even_a_strided_one(backend, dtype, rng):
    m, k, n = small(backend, (40, 30, 20), (9, 5, 7))
    a, b = random_matrices(rng, m, k, n, dtype)
    reference = a.astype(np.float64) @ b.astype(np.float64)
    out = backend.zeros((m, n), dtype)
    assert matrix.matmul(a, b, out, backend=backend) is out
    assert relative_error(out, reference, backend, product_scale(a, b)) <= limit(backend, dtype, "matmul")
    wide = backend.zeros((m, 2 * n), dtype)
    strided = wide[:, ::2]
    assert matrix.matmul(a, b, strided, backend=backend) is strided
    host = backend.to_host(wide)
    assert relative_error(host[:, ::2], reference, backend, product_scale(a, b)) <= limit(backend, dtype, "matmul")
    assert (host[:, 1::2] == 0).all()


def test_matmul_of_transposed_views(backend, rng):
    """Non-contiguous operands (transposes, strided slices) give the same product."""
    m, k, n = small(backend, (33, 45, 21), (6, 7, 5))
    a = rng.standard_normal((k, m))
    b = rng.standard_normal((2 * n, k))
    reference = a.T @ b[::2].T
    dev_a, dev_b = backend.asarray(a), backend.asarray(b)
    c = matrix.matmul(dev_a.T, dev_b[::2].T, backend=backend)
    assert relative_error(c, reference, backend, product_scale(a.T, b[::2].T)) <= limit(backend, "float64",
                                                                                           "matmul")


def test_matmul_with_an_empty_dimension(backend):
    zeros = matrix.matmul(np.ones((3, 0)), np.ones((0, 4)), backend=backend)
    assert backend.to_host(zeros).tolist() == [[0.0] * 4] * 3
    assert matrix.matmul(np.ones((0, 5)), np.ones((5, 2)), backend=backend).shape == (0, 2)


def test_matmul_inputs_are_not_modified(backend, rng):
    a, b = random_matrices(rng, 6, 5, 4, np.float64)
    dev_a, dev_b = backend.asarray(a), backend.asarray(b)
    matrix.matmul(dev_a, dev_b, backend=backend, allow_tf32=True)
    np.testing.assert_array_equal(backend.to_host(dev_a), a)
    np.testing.assert_array_equal(backend.to_host(dev_b), b)


def test_matmul_nan_propagates(fast_backend, dtype, rng):
    """NaN is not checked for, but it is never hidden: it reaches its row and column."""
    a, b = random_matrices(rng, 9, 6, 5, dtype)
    a[2, 3] = np.nan
    c = fast_backend.to_host(matrix.matmul(a, b, backend=fast_backend))
    assert np.isnan(c[2]).all()
    assert np.isfinite(np.delete(c, 2, axis=0)).all()


def test_numba_matmul_calls_blas_when_scipy_is_there():
    assert _numba.BLAS is (importlib.util.find_spec("scipy") is not None)


@pytest.mark.parametrize("shape", [(4, 3, 5), (7, 300, 513), (130, 17, 9), (1, 1, 1)])
def test_numba_fallback_gemm_matches_reference(dtype, shape, rng):
    """The hand-written loop that runs without SciPy: blocks of 4 rows, panels of 256 columns."""
    m, k, n = shape
    a, b = random_matrices(rng, m, k, n, dtype)
    reference = a.astype(np.float64) @ b.astype(np.float64)
    out = _numba.gemm_tiled(a, b, np.full((m, n), np.nan, dtype))
    assert relative_error(out, reference, usable_backend("numba"), product_scale(a, b)) <= limit("numba", dtype,
                                                                                                  "matmul")


@pytest.fixture(params=[pytest.param("cupy", marks=pytest.mark.gpu, id="cupy")])
def cupy_backend(request):
    return usable_backend(request.param)


def test_cupy_tf32_only_on_request(cupy_backend, rng):
    """Full float32 by default (even under CUPY_TF32=1), TF32 (about 1e-3) when allowed;
    CuPy's compute-type setting is left as it was."""
    from cupy import _core

    a, b = random_matrices(rng, 512, 1024, 256, np.float32)
    reference = a.astype(np.float64) @ b.astype(np.float64)
    before = _core.get_compute_type(np.float32)
    strict = matrix.matmul(a, b, backend=cupy_backend)
    fast = matrix.matmul(a, b, backend=cupy_backend, allow_tf32=True)
    scale = product_scale(a, b)
    assert relative_error(strict, reference, cupy_backend, scale) <= limit(cupy_backend, "float32", "matmul")
    assert relative_error(fast, reference, cupy_backend, scale) <= TF32_TOLERANCE
    assert _core.get_compute_type(np.float32) == before


# ---- SpMV -------------------------------------------------------------------


def random_csr(rng, n_rows, n_cols, dtype, density=0.1, empty_rows=()):
    """A random CSR matrix with the given rows empty, one long row, unsorted columns
    and a duplicated entry (which counts twice, as in SciPy)."""
    dense = rng.standard_normal((n_rows, n_cols)) * (rng.random((n_rows, n_cols)) < density)
    dense[n_rows // 3, : max(1, n_cols // 2)] = rng.standard_normal(max(1, n_cols // 2))  # a long row
    dense[list(empty_rows)] = 0
    A = sparse().csr_matrix(dense.astype(dtype))
    indices, data, indptr = A.indices.copy(), A.data.copy(), A.indptr.copy()
    row = n_rows // 3
    start, stop = indptr[row], indptr[row + 1]
    indices[start:stop] = indices[start:stop][::-1].copy()
    data[start:stop] = data[start:stop][::-1].copy()
    # Duplicate the row's first entry: one more stored value in that row.
    indices = np.insert(indices, start, indices[start])
    data = np.insert(data, start, data[start])
    indptr[row + 1:] += 1
    return sparse().csr_matrix((data, indices, indptr), shape=(n_rows, n_cols))


SPMV_SHAPES = {"square": ((500, 500), (40, 40)), "tall": ((700, 90), (60, 9)),
               "wide": ((80, 900), (9, 70))}


@pytest.mark.parametrize("case", SPMV_SHAPES)
def test_spmv_matches_scipy(backend, dtype, case, rng):
    n_rows, n_cols = small(backend, *SPMV_SHAPES[case])
    empty = (0, 1, n_rows // 2, n_rows - 1)
    A = random_csr(rng, n_rows, n_cols, dtype, empty_rows=empty)
    x = rng.standard_normal(n_cols).astype(dtype)
    reference = A.astype(np.float64) @ x.astype(np.float64)
    M = CSRMatrix.from_scipy(A).to_backend(backend)
    y = matrix.spmv(M, backend.asarray(x), backend=backend)
    assert y.shape == (n_rows,) and y.dtype == dtype
    assert relative_error(y, reference, backend) <= limit(backend, dtype, "spmv")
    assert (backend.to_host(y)[list(empty)] == 0).all()


@pytest.mark.parametrize("layout", ["uniform", "skewed"])
def test_numba_spmv_in_parallel_chunks(layout, rng):
    """Above SERIAL_BELOW the rows are cut into chunks of equal work; with most values
    in a few rows, chunks are single rows there and long runs of empty rows elsewhere."""
    n_rows, n_cols = 6000, 400
    if layout == "uniform":
        A = random_csr(rng, n_rows, n_cols, np.float64, density=0.03, empty_rows=range(100, 900))
    else:
        dense = np.zeros((n_rows, n_cols))
        dense[[5, 2000, 2001, 5999]] = rng.standard_normal((4, n_cols))
        dense[4000:4100] = rng.standard_normal((100, n_cols)) * (rng.random((100, n_cols)) < 0.9)
        A = sparse().csr_matrix(dense)
    assert A.nnz + n_rows >= _numba.SERIAL_BELOW
    bounds = _numba._balanced_bounds(A.indptr.astype(np.int32), 16)
    assert bounds[0] == 0 and bounds[-1] == n_rows and (np.diff(bounds) >= 0).all()
    x = rng.standard_normal(n_cols)
    y = matrix.spmv(CSRMatrix.from_scipy(A), x, backend="numba")
    assert relative_error(y, A @ x, usable_backend("numba")) <= limit("numba", "float64", "spmv")


def test_spmv_of_host_matrix_and_into_out(backend, rng):
    """A host CSRMatrix works on any backend (moved per call); out receives y."""
    n = small(backend, 300, 30)
    A = random_csr(rng, n, n, np.float64, density=0.05, empty_rows=(3,))
    x = rng.standard_normal(n)
    out = backend.empty((n,), np.float64)
    assert matrix.spmv(CSRMatrix.from_scipy(A), x, out, backend=backend) is out
    assert relative_error(out, A @ x, backend) <= limit(backend, "float64", "spmv")


def test_spmv_without_stored_values_is_zero(backend):
    M = CSRMatrix(np.zeros(0), np.zeros(0, np.int32), np.zeros(4, np.int32), shape=(3, 5))
    y = matrix.spmv(M, np.ones(5), backend=backend)
    assert backend.to_host(y).tolist() == [0.0, 0.0, 0.0]


def test_spmv_of_the_poisson_matrix(backend):
    """The 1-D Dirichlet Laplacian times a parabola is constant inside: (x^2)'' = 2."""
    n = small(backend, 1000, 50)
    h = 1.0 / (n + 1)
    A = sparse().diags([-np.ones(n - 1), 2 * np.ones(n), -np.ones(n - 1)], [-1, 0, 1]) / h**2
    grid = h * np.arange(1, n + 1)
    y = backend.to_host(matrix.spmv(CSRMatrix.from_scipy(A), grid**2, backend=backend))
    np.testing.assert_allclose(-y[1:-1], 2.0, rtol=1e-6)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.dtype("float32"), np.dtype("float64")], ids=["float32", "float64"])
def test_gpu_spmv_backends_agree_bitwise_on_short_rows(dtype, rng):
    """Rows of 5 values: both GPU backends run one thread per row summing in CSR order with
    fused multiply-adds, so they agree to the bit (the cupy one took 4 threads a row before)."""
    cupy_backend, cuda_backend = usable_backend("cupy"), usable_backend("cuda")
    if cuda_backend.simulated:
        pytest.skip("needs the cuda backend on a GPU, not the simulator")
    n = 300
    ones = np.ones(n)
    d1 = sparse().diags([ones[:-1], -2 * ones, ones[:-1]], [-1, 0, 1], format="lil")
    d1[0, n - 1] = d1[n - 1, 0] = 1.0
    eye = sparse().identity(n)
    A = CSRMatrix.from_scipy(sparse().csr_matrix((sparse().kron(eye, d1) + sparse().kron(d1, eye))
                                                 .astype(dtype)))
    x = rng.standard_normal(n * n).astype(dtype)
    y_cupy = cupy_backend.to_host(matrix.spmv(A, cupy_backend.asarray(x), backend=cupy_backend))
    y_cuda = cuda_backend.to_host(matrix.spmv(A, cuda_backend.asarray(x), backend=cuda_backend))
    np.testing.assert_array_equal(y_cupy, y_cuda)


# ---- dot and axpy -----------------------------------------------------------


def test_dot_accumulates_in_float64(backend, dtype, rng):
    n = small(backend, 100_003, 1000)
    x = rng.standard_normal(n).astype(dtype)
    y = rng.standard_normal(n).astype(dtype)
    reference = float(x.astype(np.float64) @ y.astype(np.float64))
    value = matrix.dot(backend.asarray(x), backend.asarray(y), backend=backend)
    assert type(value) is float
    # float64 sums of exact float64 products: about n ulps of float64 at most
    bound = n * np.finfo(np.float64).eps * float(np.abs(x.astype(np.float64) * y).sum())
    assert abs(value - reference) <= bound


def test_dot_keeps_what_a_float32_sum_would_lose(backend):
    x = np.array([1e8, 1.0, -1e8], np.float32)
    assert matrix.dot(x, np.ones(3, np.float32), backend=backend) == 1.0


def test_numba_dot_does_not_depend_on_the_thread_count(dtype, rng):
    """Fixed chunks added in order: bitwise the same on 1 or 2 threads, and in the
    serial build that short vectors use."""
    x, y = rng.standard_normal((2, 300_001)).astype(dtype)
    threads = numba.get_num_threads()
    value = matrix.dot(x, y, backend="numba")
    try:
        numba.set_num_threads(1)
        assert matrix.dot(x, y, backend="numba") == value
    finally:
        numba.set_num_threads(threads)
    assert _numba._dot_serial(x, y, _numba.DOT_CHUNK) == value


def test_axpy_matches_reference_and_works_in_place(backend, dtype, rng):
    n = small(backend, 40_001, 300)
    x = rng.standard_normal(n).astype(dtype)
    y = rng.standard_normal(n).astype(dtype)
    alpha = -0.7
    reference = alpha * x.astype(np.float64) + y.astype(np.float64)
    result = matrix.axpy(alpha, backend.asarray(x), backend.asarray(y), backend=backend)
    assert result.dtype == dtype
    assert relative_error(result, reference, backend) <= limit(backend, dtype, "axpy")
    for target in ("x", "y"):
        dev = {"x": backend.asarray(x.copy()), "y": backend.asarray(y.copy())}
        out = matrix.axpy(alpha, dev["x"], dev["y"], out=dev[target], backend=backend)
        assert out is dev[target]
        assert relative_error(out, reference, backend) <= limit(backend, dtype, "axpy")


# ---- CSRMatrix --------------------------------------------------------------


def test_csr_round_trips_through_scipy_and_dense(rng):
    A = random_csr(rng, 30, 20, np.float64, empty_rows=(0, 29))
    M = CSRMatrix.from_scipy(A)
    assert M.shape == (30, 20) and M.nnz == A.nnz and M.dtype == np.float64
    assert M.indices.dtype == np.int32 and M.indptr.dtype == np.int32
    np.testing.assert_array_equal(M.to_dense(), A.toarray())
    np.testing.assert_array_equal(M.to_scipy().toarray(), A.toarray())
    np.testing.assert_array_equal(CSRMatrix.from_dense(A.toarray()).to_dense(), A.toarray())
    np.testing.assert_array_equal(M.diagonal(), A.diagonal())
    assert "shape=(30, 20)" in repr(M)


def test_csr_converts_index_dtypes_and_is_frozen():
    M = CSRMatrix(np.array([1.0, 2.0]), np.array([1, 0], np.int64), np.array([0, 1, 2], np.uint64),
                  shape=[2, 2])
    assert M.indices.dtype == np.int32 and M.indptr.dtype == np.int32 and M.shape == (2, 2)
    with pytest.raises(FrozenInstanceError):
        M.shape = (3, 3)
    copy = pickle.loads(pickle.dumps(M))
    np.testing.assert_array_equal(copy.to_dense(), M.to_dense())


GOOD = dict(data=np.array([1.0, 2.0, 3.0]), indices=np.array([0, 2, 1]), indptr=np.array([0, 2, 2, 3]),
            shape=(3, 3))

BAD_CSR = {
    "indptr too short": (dict(indptr=np.array([0, 2, 3])), "indptr must have rows + 1 = 4"),
    "indptr not from 0": (dict(indptr=np.array([1, 2, 2, 3])), "indptr must start at 0"),
    "indptr not to nnz": (dict(indptr=np.array([0, 1, 1, 2])), "end at nnz = 3"),
    "indptr decreasing": (dict(indptr=np.array([0, 2, 1, 3])), "non-decreasing"),
    "column too large": (dict(indices=np.array([0, 3, 1])), "0..2; got column 3"),
    "negative column": (dict(indices=np.array([0, -1, 1])), "got column -1"),
    "indices length": (dict(indices=np.array([0, 1])), "one entry per stored value"),
    "float indices": (dict(indices=np.array([0.0, 2.0, 1.0])), "indices must hold integers"),
    "2-D data": (dict(data=np.ones((3, 1))), "data must be a 1-D array"),
    "float16 data": (dict(data=np.ones(3, np.float16)), "float32 or float64"),
    "NaN value": (dict(data=np.array([1.0, np.nan, 3.0])), "non-finite"),
    "infinite value": (dict(data=np.array([1.0, np.inf, 3.0])), "non-finite"),
    "bad shape": (dict(shape=(3,)), "shape must be a pair"),
    "negative shape": (dict(shape=(3, -3)), "shape[1] (columns) must be >= 0"),
}


@pytest.mark.parametrize("case", BAD_CSR)
def test_bad_csr_structure_is_refused(case):
    change, message = BAD_CSR[case]
    with pytest.raises(ConfigError, match=re.escape(message)):
        CSRMatrix(**{**GOOD, **change})


# ---- bad input of the functions ---------------------------------------------


def _refused(message, function, *args, **kwargs):
    with pytest.raises(ConfigError) as info:
        function(*args, **kwargs)
    assert message in str(info.value), str(info.value)


def test_matmul_refuses_bad_operands(backend):
    a32, b64 = np.ones((3, 4), np.float32), np.ones((4, 2))
    _refused("a.shape[1] must equal b.shape[0]", matrix.matmul, np.ones((3, 4)), np.ones((5, 2)),
             backend=backend)
    _refused("b has dtype float64 but a has float32", matrix.matmul, a32, b64, backend=backend)
    _refused("a must be a 2-D array", matrix.matmul, np.ones(4), b64, backend=backend)
    _refused("b must be a 2-D array", matrix.matmul, a32, np.ones((4, 2, 1), np.float32), backend=backend)
    _refused("must have dtype float32 or float64", matrix.matmul, np.ones((3, 4), int), np.ones((4, 2), int),
             backend=backend)
    _refused("a must be a 2-D float32 or float64 array, got None", matrix.matmul, None, b64, backend=backend)
    _refused("allow_tf32 must be True or False", matrix.matmul, b64.T, b64, backend=backend, allow_tf32=1)


def test_matmul_refuses_a_bad_out(backend):
    a, b = np.ones((3, 4)), np.ones((4, 2))
    _refused("out must have shape (3, 2) and dtype float64", matrix.matmul, a, b,
             backend.zeros((2, 3), np.float64), backend=backend)
    _refused("out must have shape (3, 2) and dtype float64", matrix.matmul, a, b,
             backend.zeros((3, 2), np.float32), backend=backend)
    square = backend.asarray(np.ones((3, 3)))
    _refused("out shares memory with a", matrix.matmul, square, square, square, backend=backend)
    if backend.on_gpu and not backend.simulated:
        _refused("out must be a cupy array", matrix.matmul, a, b, np.zeros((3, 2)), backend=backend)


def test_spmv_refuses_bad_input(backend):
    M = CSRMatrix(**GOOD)
    _refused("matrix must be a CSRMatrix", matrix.spmv, np.eye(3), np.ones(3), backend=backend)
    _refused("x must have length columns = 3", matrix.spmv, M, np.ones(4), backend=backend)
    _refused("x has dtype float32 but matrix has float64", matrix.spmv, M, np.ones(3, np.float32),
             backend=backend)
    _refused("x must be a 1-D array", matrix.spmv, M, np.ones((3, 1)), backend=backend)
    x = backend.asarray(np.ones(3))
    _refused("out shares memory with x", matrix.spmv, M, x, x, backend=backend)


def test_dot_and_axpy_refuse_bad_input(backend):
    x = np.ones(3)
    _refused("x and y must have the same length; got 3 and 4", matrix.dot, x, np.ones(4), backend=backend)
    _refused("y has dtype float32 but x has float64", matrix.dot, x, np.ones(3, np.float32), backend=backend)
    _refused("y must be a 1-D array", matrix.dot, x, np.ones((3, 1)), backend=backend)
    _refused("alpha must be finite", matrix.axpy, np.nan, x, x, backend=backend)
    _refused("alpha must be a real number", matrix.axpy, "2", x, x, backend=backend)
    _refused("y has dtype float64 but x has float32", matrix.axpy, 2.0, np.ones(3, np.float32), x,
             backend=backend)
    long = backend.asarray(np.ones(5))
    _refused("out overlaps x without being x", matrix.axpy, 2.0, long[:4], long[1:], long[1:],
             backend=backend)


def test_import_loads_no_gpu_module():
    code = ("import sys, hpcgpu.kernels.matrix; "
            "print(sorted(m for m in sys.modules if m.startswith(('cupy', 'numba.cuda', 'numba_cuda'))))")
    environment = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    result = subprocess.run([sys.executable, "-P", "-c", code], capture_output=True, text=True,
                            env=environment, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"
