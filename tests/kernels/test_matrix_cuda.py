"""Numba-CUDA matrix kernels at the edges of their tiles, blocks and grids.

Under the CUDA simulator only tiny problems run, so the shared tests in
``test_matrix.py`` use the default GEMM tiles on a few shapes. Here
every tile configuration (:data:`_cuda.VARIANTS` too) gets shapes with two
or more tiles along every dimension, a partial last tile in each, and
shapes smaller than one tile; SpMV gets rows across two blocks with empty
rows on the block boundary.
"""

import numpy as np
import pytest
from _support import simulated, usable_backend

from hpcgpu.kernels.matrix import CSRMatrix, _cuda, spmv


def sparse():
    """scipy.sparse, the SpMV reference (in the test extra; the GPU image may lack it)."""
    return pytest.importorskip("scipy.sparse")


LAUNCHES = list(dict.fromkeys((_cuda.LAUNCH["float32"], _cuda.LAUNCH["float64"], *_cuda.VARIANTS)))


@pytest.fixture(params=[pytest.param("cuda", marks=pytest.mark.cudasim if simulated() else pytest.mark.gpu,
                                     id="cuda-sim" if simulated() else "cuda")])
def cuda_backend(request):
    return usable_backend(request.param)


def _shapes(launch):
    """(m, k, n): over two tiles plus a part in every direction, and one smaller than a tile."""
    bm, bn, bk = launch.block_m, launch.block_n, launch.block_k
    if simulated() and bm * bn > 64 * 64:
        return [(bm + 3, 2 * bk + 1, 5)]  # 256 threads per block: keep the simulator to 2 blocks
    return [(2 * bm + 3, 2 * bk + 1, 2 * bn + 5), (bm - 1, bk - 1, 3), (1, 3 * bk, bn + 1)]


def _dtypes():
    """float64 only under the simulator (slow, and it does not type the kernel anyway)."""
    return [np.dtype("float64")] if simulated() else [np.dtype("float32"), np.dtype("float64")]


@pytest.mark.parametrize("launch", [pytest.param(launch, id="x".join(map(str, launch))) for launch in LAUNCHES])
def test_every_gemm_launch_matches_the_reference(cuda_backend, launch, rng):
    for dtype in _dtypes():
        for m, k, n in _shapes(launch):
            a = rng.standard_normal((m, k)).astype(dtype)
            b = rng.standard_normal((k, n)).astype(dtype)
            reference = a.astype(np.float64) @ b.astype(np.float64)
            out = cuda_backend.asarray(np.full((m, n), np.nan, dtype))
            _cuda.gemm(cuda_backend.asarray(a), cuda_backend.asarray(b), out, launch)
            got = cuda_backend.to_host(out)
            assert np.isfinite(got).all(), "an output element was not written"
            # against the scale of the GEMM rounding bound (see test_matrix.product_scale)
            error = np.abs(got - reference).max() / (np.abs(a.astype(np.float64)) @ np.abs(b.astype(np.float64))).max()
            assert error <= (5e-6 if dtype == np.float32 else 1e-13), (launch, (m, k, n), error)


def _k_ordered_product(a, b):
    """``a @ b`` summed over k in order, one rounded product and one rounded sum at a time."""
    c = np.zeros((a.shape[0], b.shape[1]), a.dtype)
    for p in range(a.shape[1]):
        c = c + a[:, p:p + 1] * b[p:p + 1, :]
    return c


@pytest.mark.parametrize("launch", [pytest.param(launch, id="x".join(map(str, launch))) for launch in LAUNCHES])
@pytest.mark.skipif(not simulated(), reason="the simulator does not fuse multiply-adds; a GPU does")
def test_every_gemm_launch_sums_in_the_order_of_k(cuda_backend, launch, rng):
    """Bitwise the k-ordered sum under the simulator: the register tile, the unrolled k-steps and
    the unchecked interior tiles change nothing in what each output adds up, or in which order."""
    dtype = np.dtype("float64")
    m, k, n = _shapes(launch)[0]
    a = rng.standard_normal((m, k)).astype(dtype)
    b = rng.standard_normal((k, n)).astype(dtype)
    out = cuda_backend.asarray(np.full((m, n), np.nan, dtype))
    _cuda.gemm(cuda_backend.asarray(a), cuda_backend.asarray(b), out, launch)
    np.testing.assert_array_equal(cuda_backend.to_host(out), _k_ordered_product(a, b))


@pytest.mark.skipif(simulated(), reason="on a GPU; under the simulator the test above is stricter")
@pytest.mark.parametrize("dtype", [np.dtype("float32"), np.dtype("float64")], ids=["float32", "float64"])
def test_every_gemm_launch_gives_the_same_bits(cuda_backend, dtype, rng):
    """One fused multiply-add per k, in the order of k, whatever the tile: the default tile
    and the previous one (64 x 64, 4 x 4, kept in VARIANTS) agree to the bit."""
    m, k, n = 300, 77, 260  # interior and edge tiles for every launch
    a = cuda_backend.asarray(rng.standard_normal((m, k)).astype(dtype))
    b = cuda_backend.asarray(rng.standard_normal((k, n)).astype(dtype))
    results = {}
    for launch in LAUNCHES:
        out = cuda_backend.asarray(np.full((m, n), np.nan, dtype))
        _cuda.gemm(a, b, out, launch)
        results[launch] = cuda_backend.to_host(out)
    first = results[_cuda.LAUNCH[dtype.name]]
    assert _cuda.GemmLaunch(64, 64, 8, 4, 4) in results
    for launch, result in results.items():
        np.testing.assert_array_equal(result, first, err_msg=str(launch))


def test_spmv_rows_across_blocks(cuda_backend, rng):
    """Rows over two blocks of THREADS, empty rows at the block boundary and at the ends."""
    n_rows = _cuda.THREADS + 37
    dense = rng.standard_normal((n_rows, 23)) * (rng.random((n_rows, 23)) < 0.2)
    dense[[0, _cuda.THREADS - 1, _cuda.THREADS, n_rows - 1]] = 0
    A = sparse().csr_matrix(dense)
    x = rng.standard_normal(23)
    y = cuda_backend.to_host(spmv(CSRMatrix.from_scipy(A), x, backend=cuda_backend))
    np.testing.assert_allclose(y, A @ x, rtol=1e-12, atol=1e-12)
