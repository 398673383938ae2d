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
    assert [_cupy.lanes_for(100, 100 * m) for m in (0, 1, 3, 5, 16, 31, 33, 1000)] == \
        [1, 1, 2, 4, 16, 16, 32, 32]


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
