"""The cupy matrix backend's CUDA C++ SpMV source and launch code, run on the CPU.

CuPy needs a GPU, so ``test_matrix.py`` checks the cupy backend only on a
GPU machine. Here ``_cupy.KERNEL_SOURCE`` is compiled with g++ behind the
emulation header of ``_cuda_emulator``, which runs each block's threads one
at a time between barriers (so a missing ``__syncthreads`` before the group
sum shows up as a wrong result) and surrounds every array with guard zones
(a read or write outside an array fails the test). The launches go through
``_cupy.spmv`` itself: only ``_cupy._kernel`` (which would compile with
NVRTC) is replaced, so argument order, scalar types and grids are tested
too. The emulator passes int32 arrays only: the int64-index instances are
compiled here but run on a GPU only.
"""

import numpy as np
import pytest
from _cuda_emulator import CpuKernel, compile_library

from hpcgpu.kernels.matrix import _cupy

sparse = pytest.importorskip("scipy.sparse")  # the test extra has it; a bare GPU image may not

INT32_EXPRESSIONS = tuple(e for e in _cupy.NAME_EXPRESSIONS if ", int," in e)


@pytest.fixture(scope="module")
def library(tmp_path_factory):
    return compile_library(_cupy.KERNEL_SOURCE, INT32_EXPRESSIONS,
                           tmp_path_factory.mktemp("matrix_cupy"), "matrix_cupy_emulated")


@pytest.fixture
def emulated(library, monkeypatch):
    """``_cupy`` with its kernels compiled by g++ instead of NVRTC."""
    kernels = {}

    def kernel(expression):
        assert expression in INT32_EXPRESSIONS, f"{expression} is not instantiated"
        if expression not in kernels:
            kernels[expression] = CpuKernel(library, expression)
        return kernels[expression]

    monkeypatch.setattr(_cupy, "_kernel", kernel)
    return kernels


def _matrix(rng, n_rows, n_cols, per_row, dtype):
    """About ``per_row`` values per row, with empty rows at the ends and inside."""
    dense = rng.standard_normal((n_rows, n_cols)) * (rng.random((n_rows, n_cols)) < per_row / n_cols)
    dense[[0, n_rows // 2, n_rows - 1]] = 0
    return sparse.csr_matrix(dense.astype(dtype))


@pytest.mark.parametrize("lanes", _cupy.LANES)
@pytest.mark.parametrize("dtype", [np.dtype("float32"), np.dtype("float64")], ids=["float32", "float64"])
def test_spmv_kernel_for_every_group_size(emulated, monkeypatch, lanes, dtype, rng):
    """Rows shorter and longer than a group, over two blocks, some empty."""
    monkeypatch.setattr(_cupy, "lanes_for", lambda n_rows, nnz: lanes)
    n_rows = _cupy.THREADS // lanes + 7
    n_cols = max(64, 3 * lanes)
    A = _matrix(rng, n_rows, n_cols, lanes + 0.5, dtype)
    x = rng.standard_normal(n_cols).astype(dtype)
    out = np.full(n_rows, np.nan, dtype)
    _cupy.spmv(A.data, A.indices.astype(np.int32), A.indptr.astype(np.int32), x, out)
    reference = A.astype(np.float64) @ x.astype(np.float64)
    tolerance = 5e-6 if dtype == np.float32 else 1e-13
    assert np.abs(out - reference).max() <= tolerance * np.abs(reference).max()
    assert (out[[0, n_rows // 2, n_rows - 1]] == 0).all()
    (expression,) = emulated
    assert f", {lanes}>" in expression
    (grid, block), = emulated[expression].launches
    assert block == (_cupy.THREADS, 1, 1) and grid == (2, 1, 1)


def test_lanes_grow_with_the_mean_row_length():
    """One thread per row up to 6 values a row (5-point and 7-point stencils), then a lane per 6."""
    assert [_cupy.lanes_for(100, 100 * m) for m in (0, 1, 3, 5, 6, 7, 12, 13, 16, 31, 48, 49, 97, 1000)] == \
        [1, 1, 1, 1, 1, 2, 2, 4, 4, 8, 8, 16, 32, 32]


@pytest.mark.parametrize("mean", [0.5, 5, 5.9, 6, 6.1, 20, 95.9, 96, 96.5, 500])
def test_lanes_follow_kokkos_kernels(mean):
    """Kokkos Kernels' CSR SpMV: ``while (vl < 32 && vl * 6 < nnz_per_row) vl *= 2``."""
    n_rows = 1000
    nnz = int(round(mean * n_rows))
    expected = 1
    while expected < 32 and expected * 6 < nnz / n_rows:
        expected *= 2
    assert _cupy.lanes_for(n_rows, nnz) == expected


def _periodic_poisson(n, dtype):
    """The 2-D periodic 5-point Laplacian on an n x n grid: five values in every row."""
    ones = np.ones(n)
    d1 = sparse.diags([ones[:-1], -2 * ones, ones[:-1]], [-1, 0, 1], format="lil")
    d1[0, n - 1] = d1[n - 1, 0] = 1.0
    eye = sparse.identity(n)
    return sparse.csr_matrix((sparse.kron(eye, d1) + sparse.kron(d1, eye)).astype(dtype))


@pytest.mark.parametrize("dtype", [np.dtype("float32"), np.dtype("float64")], ids=["float32", "float64"])
def test_poisson_rows_take_one_thread_each_in_csr_order(emulated, dtype, rng):
    """The 5-value rows of the Poisson matrix run the one-lane instance (no shared memory, no
    barrier), summing each row in CSR order: bitwise the sequential sum, which is what the
    ``cuda`` backend's kernel computes too."""
    n = 23  # 529 rows: three blocks, the last partly past the end
    A = _periodic_poisson(n, dtype)
    assert (np.diff(A.indptr) == 5).all()
    x = rng.standard_normal(n * n).astype(dtype)
    out = np.full(n * n, np.nan, dtype)
    _cupy.spmv(A.data, A.indices.astype(np.int32), A.indptr.astype(np.int32), x, out)
    (expression,) = emulated
    assert expression.endswith(", 1>")
    (grid, block), = emulated[expression].launches
    assert grid == (-(-n * n // _cupy.THREADS), 1, 1) and block == (_cupy.THREADS, 1, 1)
    # The sequential sum per row, in the dtype, in CSR order.
    values = A.data.reshape(-1, 5)
    gathered = x[A.indices.reshape(-1, 5)]
    total = np.zeros(n * n, dtype)
    for k in range(5):
        total = total + values[:, k] * gathered[:, k]
    np.testing.assert_array_equal(out, total)
    reference = A.astype(np.float64) @ x.astype(np.float64)
    tolerance = 5e-6 if dtype == np.float32 else 1e-13
    assert np.abs(out - reference).max() <= tolerance * np.abs(reference).max()


def test_int64_index_instances_compile(tmp_path):
    """The emulator runs int32 indices only; the int64 instances must still compile."""
    instances = "".join(
        f"template void {e}(const {t}*, const long long*, const long long*, const {t}*, {t}*, long long);\n"
        for e in _cupy.NAME_EXPRESSIONS if "long long" in e
        for t in [e.split("<")[1].split(",")[0]])
    compile_library(_cupy.KERNEL_SOURCE + instances, (), tmp_path, "matrix_cupy_int64")


def test_source_has_every_instance():
    assert len(_cupy.NAME_EXPRESSIONS) == 2 * 2 * len(_cupy.LANES)
    assert len(INT32_EXPRESSIONS) == 2 * len(_cupy.LANES)
