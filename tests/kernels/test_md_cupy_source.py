"""The cupy MD backend's CUDA C++ source and launch code, run on the CPU.

CuPy needs a GPU, so ``test_md.py`` checks the cupy backend only on a GPU
machine. Here ``_cupy.KERNEL_SOURCE`` is compiled with g++ behind the
emulation header of ``_cuda_emulator`` (blocks one after another, every
array inside guard zones: a read or write outside an array fails the test),
and the launches go through ``_cupy``'s own Python code with NumPy arrays:
only ``_cupy._kernel`` (NVRTC) is replaced, so argument order, scalar types,
grids, the cell sort and the list layouts are tested too.

The lists this backend builds are column-major (``_cupy.NEIGHBOR_ORDER``):
the build must write them in place, the forces kernel must read lists of
either layout (and strided views) with bitwise the same result, and both
must agree with the ``numpy`` reference.
"""

import numpy as np
import pytest
from _cuda_emulator import CpuKernel, compile_library
from _support import tolerance

from hpcgpu.kernels import md
from hpcgpu.kernels.md import _cupy, _numpy

DTYPES = [np.dtype("float32"), np.dtype("float64")]
DENSITY = 0.8442


@pytest.fixture(scope="module")
def library(tmp_path_factory):
    return compile_library(_cupy.KERNEL_SOURCE, _cupy.NAME_EXPRESSIONS,
                           tmp_path_factory.mktemp("md_cupy"), "md_cupy_emulated")


@pytest.fixture
def emulated(library, monkeypatch):
    """``_cupy`` with its kernels compiled by g++ instead of NVRTC; the launched kernels by name."""
    kernels = {}

    def kernel(expression):
        assert expression in _cupy.NAME_EXPRESSIONS, f"{expression} is not instantiated"
        if expression not in kernels:
            kernels[expression] = CpuKernel(library, expression)
        return kernels[expression]

    monkeypatch.setattr(_cupy, "_kernel", kernel)
    return kernels


def _liquid(rng, cells, dtype):
    """A jittered fcc lattice at liquid density, shuffled (atom order unrelated to space),
    some atoms outside the box; (positions (3, N), box)."""
    side = (4 / DENSITY) ** (1 / 3)
    basis = np.array([[0, 0, 0], [0.5, 0.5, 0], [0.5, 0, 0.5], [0, 0.5, 0.5]])
    grid = np.stack(np.meshgrid(*(np.arange(cells),) * 3, indexing="ij"), axis=-1).reshape(-1, 1, 3)
    x = ((grid + basis) * side).reshape(-1, 3).T + rng.normal(0.0, 0.05, (3, 4 * cells**3))
    x = x[:, rng.permutation(x.shape[1])]
    box = (cells * side,) * 3
    x[:, :3] += np.array(box)[:, None] * np.array([[1], [-2], [3]])
    return x.astype(dtype), box


def _rows(neighbors, counts):
    return [neighbors[i, :c].tolist() for i, c in enumerate(counts)]


@pytest.mark.parametrize("dtype", DTYPES, ids=["float32", "float64"])
def test_build_writes_a_column_major_list_in_place(emulated, dtype, rng):
    """The list is filled through the strides of a Fortran-ordered array (no scratch copy),
    rows as the row-major build writes them, and the pairs are the reference's."""
    x, box = _liquid(rng, 3, dtype)  # 108 atoms, 3 cells a side at radius 2.0
    n, radius, capacity = x.shape[1], 2.0, 48
    columns = np.full((n, capacity), -1, np.int32, order="F")
    rows = np.full((n, capacity), -1, np.int32)
    counts_f, counts_c = np.empty(n, np.int32), np.empty(n, np.int32)
    largest = _cupy.build_neighbors(x, box, radius, columns, counts_f)
    assert _cupy.build_neighbors(x, box, radius, rows, counts_c) == largest <= capacity
    assert columns.flags.f_contiguous
    np.testing.assert_array_equal(counts_f, counts_c)
    assert _rows(columns, counts_f) == _rows(rows, counts_c)
    reference = np.empty((n, capacity), np.int32)
    counts_ref = np.empty(n, np.int32)
    _numpy.build_neighbors(x, box, radius, reference, counts_ref)
    np.testing.assert_array_equal(counts_f, counts_ref)
    assert [set(r) for r in _rows(columns, counts_f)] == [set(r) for r in _rows(reference, counts_ref)]
    (grid, block), = emulated[f"build_kernel<{_cupy.CTYPES[dtype.name]}>"].launches[:1]
    assert block == (_cupy.THREADS, 1, 1) and grid == (1, 1, 1)


def test_an_overflowing_build_counts_past_the_capacity(emulated, rng):
    """Rows that would overflow are cut at the capacity (column-major too) and counted in full."""
    x, box = _liquid(rng, 3, np.dtype("float64"))
    n = x.shape[1]
    full = np.empty((n, 64), np.int32, order="F")
    counts = np.empty(n, np.int32)
    largest = _cupy.build_neighbors(x, box, 2.0, full, counts)
    cut = np.full((n, 8), -1, np.int32, order="F")
    cut_counts = np.empty(n, np.int32)
    assert _cupy.build_neighbors(x, box, 2.0, cut, cut_counts) == largest > 8
    np.testing.assert_array_equal(cut_counts, counts)
    np.testing.assert_array_equal(cut, full[:, :8])


@pytest.mark.parametrize("dtype", DTYPES, ids=["float32", "float64"])
def test_forces_read_every_layout_to_the_bit(emulated, dtype, rng):
    """Row-major, column-major and a strided view of one list give the same bits; against
    the numpy reference to the cupy tolerance. Entries past the counts are never read."""
    x, box = _liquid(rng, 3, dtype)
    n, capacity = x.shape[1], 48
    rows = np.full((n, capacity), -7, np.int32)
    counts = np.empty(n, np.int32)
    assert _numpy.build_neighbors(x, box, 2.0, rows, counts) <= capacity
    wide = np.full((n, capacity + 5), -7, np.int32)
    wide[:, :capacity] = rows
    layouts = {"rows": rows, "columns": np.asfortranarray(rows), "view": wide[:, :capacity]}
    args = (1.8**2, 0.9, 1.1, md.energy_shift(1.8, epsilon=0.9, sigma=1.1))
    results = {}
    for name, neighbors in layouts.items():
        out = [np.full((3, n), np.nan, dtype), np.full(n, np.nan, dtype), np.full(n, np.nan, dtype),
               np.full(n, -1, np.int32)]
        _cupy.forces(x, box, neighbors, counts, *args, *out)
        results[name] = out
    for name in ("columns", "view"):
        for got, expected in zip(results[name], results["rows"]):
            np.testing.assert_array_equal(got, expected, err_msg=name)
    reference = [np.empty((3, n), dtype), np.empty(n, dtype), np.empty(n, dtype), np.empty(n, np.int32)]
    _numpy.forces(x, box, rows, counts, *args, *reference)
    np.testing.assert_array_equal(results["columns"][3], reference[3])  # pairs inside the cutoff, exactly
    for got, expected in zip(results["columns"][:3], reference[:3]):
        expected = expected.astype(np.float64)
        assert np.abs(got - expected).max() <= tolerance("cupy", dtype) * np.abs(expected).max()

