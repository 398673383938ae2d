"""SpMV of banded matrices: runs of rows read as bands give bitwise the CSR loop's sums, on every variant.

The ``numba`` backend's ``spmv`` has two variants (``hpcgpu.autotune``
picks one per machine): every row by the CSR loop, or runs of rows that
hold the same diagonals read without their indices. Both are pinned in turn
here and compared with the float64 reference on every backend (the other
backends ignore the pin), and with each other bitwise.
"""

import numpy as np
import pytest
from _support import tolerance

from hpcgpu import autotune
from hpcgpu.bench.matrix import poisson_matrix
from hpcgpu.kernels import matrix
from hpcgpu.kernels.matrix import CSRMatrix, _numba, banded_numba

VARIANTS = sorted(_numba.SPMV_VARIANTS)


def pinned_spmv(variant, A, x, backend):
    with autotune.use(f"matrix.spmv.format.{np.dtype(A.dtype).name}", variant):
        return backend.to_host(matrix.spmv(A.to_backend(backend) if hasattr(A, "to_backend") else A,
                                           backend.asarray(x), backend=backend))


def banded_csr(n, offsets, dtype, rng, extra_rows=(), unsorted_rows=()):
    """A random banded n x n CSR matrix with the given diagonals (cut at the edges); rows in
    ``extra_rows`` get one more entry, rows in ``unsorted_rows`` store their columns reversed."""
    indices, data, indptr = [], [], [0]
    for i in range(n):
        columns = [i + o for o in offsets if 0 <= i + o < n]
        if i in extra_rows:
            columns.append((i + n // 2) % n)
        if i in unsorted_rows:
            columns = columns[::-1]
        indices += columns
        data += list(rng.uniform(-1, 1, len(columns)))
        indptr.append(len(indices))
    return CSRMatrix(np.array(data, dtype), np.array(indices, np.int32), np.array(indptr, np.int32), (n, n))


def periodic_poisson(side, dtype):
    """The periodic 5-point Laplacian with each row stored centre, up, down, left, right: the
    interior rows share diagonals in an order that is not increasing."""
    index = np.arange(side * side).reshape(side, side)
    columns = np.stack([index, np.roll(index, 1, 0), np.roll(index, -1, 0), np.roll(index, 1, 1),
                        np.roll(index, -1, 1)], axis=-1).reshape(-1)
    data = np.tile(np.array([4.0, -1.0, -1.0, -1.0, -1.0], dtype), side * side)
    return CSRMatrix(data, columns, np.arange(0, 5 * side * side + 1, 5), shape=(side * side,) * 2)


def reference(A, x):
    """``A x`` in float64 from the CSR arrays (no dense copy: the matrices are large)."""
    rows = np.repeat(np.arange(A.shape[0]), np.diff(A.indptr))
    products = A.data.astype(np.float64) * x.astype(np.float64)[A.indices]
    return np.bincount(rows, weights=products, minlength=A.shape[0])


CASES = {
    "poisson-5-point": lambda dtype, rng: poisson_matrix(np, 181, dtype),
    "poisson-5-point-serial": lambda dtype, rng: poisson_matrix(np, 30, dtype),
    "tridiagonal": lambda dtype, rng: banded_csr(40_000, (-1, 0, 1), dtype, rng),
    "seven-bands-with-odd-rows": lambda dtype, rng: banded_csr(
        9_000, (-900, -30, -1, 0, 1, 30, 900), dtype, rng, extra_rows=range(100, 9000, 97),
        unsorted_rows=range(50, 9000, 131)),
    "periodic-centre-first": lambda dtype, rng: periodic_poisson(120, dtype),
    "five-bands-with-odd-rows": lambda dtype, rng: banded_csr(
        9_000, (-90, -1, 0, 1, 90), dtype, rng, extra_rows=(0, 4500, 4501, 8000), unsorted_rows=(7, 3000)),
}


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("case", sorted(CASES))
def test_every_variant_matches_the_reference(backend, dtype, case, variant):
    rng = np.random.default_rng(3)
    A = CASES[case](dtype, rng)
    if A.shape[0] > 5000 and backend.name == "cuda" and backend.simulated:
        pytest.skip("the CUDA simulator is too slow for this size")
    x = rng.standard_normal(A.shape[1]).astype(dtype)
    got = pinned_spmv(variant, A, x, backend)
    expected = reference(A, x)
    limit = max(tolerance(backend, dtype), 5e-6 if dtype == np.float32 else 1e-14)
    assert np.abs(got - expected).max() / np.abs(expected).max() <= limit


@pytest.mark.parametrize("case", sorted(CASES))
def test_bands_give_bitwise_the_csr_sums(dtype, case, rng):
    from hpcgpu.backends import get_backend

    numba_backend = get_backend("numba")
    A = CASES[case](dtype, np.random.default_rng(5))
    x = rng.standard_normal(A.shape[1]).astype(dtype)
    assert banded_numba.band_structure(A.indices, A.indptr) is not None
    banded, csr = (pinned_spmv(v, A, x, numba_backend) for v in ("banded", "csr"))
    assert np.array_equal(banded, csr)


def test_infinite_x_spreads_only_where_csr_reads_it(rng):
    """A band run never multiplies an entry it does not store (no padding zeros times inf)."""
    from hpcgpu.backends import get_backend

    A = poisson_matrix(np, 64, np.float64)
    x = rng.standard_normal(A.shape[1])
    x[64 * 10 + 63] = np.inf  # the right edge: its right neighbour row must stay finite
    banded, csr = (pinned_spmv(v, A, x, get_backend("numba")) for v in ("banded", "csr"))
    np.testing.assert_array_equal(banded, csr)
    assert np.isfinite(banded[64 * 10 + 64])


def test_new_values_in_the_same_structure_are_read(rng):
    from hpcgpu.backends import get_backend

    A = poisson_matrix(np, 128, np.float32)
    x = rng.standard_normal(A.shape[1]).astype(np.float32)
    first = pinned_spmv("banded", A, x, get_backend("numba"))
    A.data[...] *= 2
    assert np.array_equal(pinned_spmv("banded", A, x, get_backend("numba")), 2 * first)


def test_structure_found_once_and_its_runs():
    A = poisson_matrix(np, 50, np.float64)
    structure = banded_numba.band_structure(A.indices, A.indptr)
    assert banded_numba.band_structure(A.indices, A.indptr) is structure
    assert structure.offsets.tolist() == [-50, -1, 0, 1, 50]
    assert structure.run_starts[0] == 51 and structure.run_stops[0] == 99  # row 1, columns 1..48
    assert structure.covered_rows == 48 * 48


def test_matrices_without_bands_use_csr(rng):
    n = 2000
    indices = rng.integers(0, n, 5 * n).astype(np.int32)
    indptr = np.arange(0, 5 * n + 1, 5, dtype=np.int32)
    assert banded_numba.band_structure(indices, indptr) is None
    empty = np.zeros(1, np.int32)
    assert banded_numba.band_structure(np.zeros(0, np.int32), empty) is None


def test_the_spmv_format_is_tuned_and_listed(tmp_path, monkeypatch):
    monkeypatch.setenv("HPCGPU_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv(autotune.AUTOTUNE_ENV, raising=False)
    autotune.forget()
    try:
        assert _numba.spmv_variant(np.float32) in _numba.SPMV_VARIANTS
        listed = autotune.choices()["kernels"]["matrix.spmv.format.float32"]
        assert set(listed["seconds"]) == set(VARIANTS)
        monkeypatch.setenv(autotune.AUTOTUNE_ENV, "0")
        autotune.forget()
        assert _numba.spmv_variant(np.float64) == _numba.DEFAULT_SPMV
    finally:
        autotune.forget()
