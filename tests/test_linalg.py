"""Distributed linear algebra on a real two-worker LocalCluster: matmul and conjugate gradient."""

import numpy as np
import pytest
import scipy.linalg
import scipy.sparse as sp
import scipy.sparse.linalg

from hpcgpu import linalg
from hpcgpu.errors import ConfigError, ConvergenceError
from hpcgpu.kernels.matrix import CSRMatrix


def poisson(n, dtype=np.float64):
    """The 5-point Dirichlet Laplacian on an n x n grid (SPD, condition ~ n^2)."""
    t = sp.diags([-1.0, 2.0, -1.0], [-1, 0, 1], shape=(n, n), dtype=dtype)
    eye = sp.eye(n, dtype=dtype)
    return (sp.kron(eye, t) + sp.kron(t, eye)).tocsr().astype(dtype)


@pytest.mark.parametrize("partitions", [2, 3])
def test_distributed_cg_equals_the_direct_solve(client, partitions):
    rng = np.random.default_rng(partitions)
    A = poisson(20)
    b = rng.standard_normal(400)
    result = linalg.conjugate_gradient(A, b, client=client, partitions=partitions, tol=1e-10)
    exact = scipy.sparse.linalg.spsolve(A.tocsc(), b)
    assert result.converged and result.residuals[-1] <= 1e-10
    np.testing.assert_allclose(A @ result.x, b, atol=1e-9 * np.linalg.norm(b))
    # error <= condition number x residual
    assert np.abs(result.x - exact).max() <= 1e-7 * np.abs(exact).max()
    assert 20 < result.iterations < 200 and len(result.residuals) >= result.iterations + 1


def test_distributed_cg_matches_the_local_solver_on_a_random_spd_matrix(client):
    from hpcgpu.kernels.matrix._solvers import conjugate_gradient

    rng = np.random.default_rng(7)
    n = 300
    B = sp.random(n, n, density=0.02, random_state=rng, format="csr")
    A = (B @ B.T + sp.diags(rng.uniform(1.0, 2.0, n))).tocsr()  # SPD, unsymmetric sparsity of B
    b = rng.standard_normal(n)
    local = conjugate_gradient(CSRMatrix.from_scipy(A), b, tol=1e-10, backend="numpy")
    distributed = linalg.conjugate_gradient(CSRMatrix.from_scipy(A), b, client=client, partitions=3, tol=1e-10,
                                            backend="numba")
    np.testing.assert_allclose(distributed.x, local.x, rtol=0, atol=1e-8 * np.abs(local.x).max())
    # The same iteration in another summation order: the histories agree closely.
    steps = min(len(local.residuals), len(distributed.residuals), 10)
    np.testing.assert_allclose(distributed.residuals[:steps], local.residuals[:steps], rtol=1e-6)


def test_distributed_cg_in_float32(client):
    A = poisson(16, np.float32)
    b = np.random.default_rng(3).standard_normal(256).astype(np.float32)
    result = linalg.conjugate_gradient(A, b, client=client, tol=1e-5)
    assert result.x.dtype == np.float32 and result.converged
    assert np.linalg.norm(A.astype(np.float64) @ result.x - b) <= 2e-5 * np.linalg.norm(b)


def test_distributed_cg_reports_an_indefinite_matrix_with_its_history(client):
    A = poisson(12) - 2.0 * sp.eye(144)  # eigenvalues on both sides of zero, diagonal still positive
    b = np.ones(144)
    with pytest.raises(ConvergenceError, match="not symmetric positive definite") as info:
        linalg.conjugate_gradient(A.tocsr(), b, client=client, tol=1e-10)
    assert len(info.value.residuals) == info.value.iterations + 1  # here p.Ap < 0 at the first step
    assert info.value.residuals[0] == pytest.approx(1.0)


def test_distributed_cg_stops_at_max_iter(client):
    A = poisson(20)
    b = np.random.default_rng(0).standard_normal(400)
    with pytest.raises(ConvergenceError, match="max_iter=5 reached") as info:
        linalg.conjugate_gradient(A, b, client=client, tol=1e-12, max_iter=5)
    assert info.value.iterations == 5


@pytest.mark.parametrize("kwargs, match", [
    (dict(b=np.ones(5)), r"b must have shape \(400,\)"),
    (dict(b=np.ones(400, np.float32)), "b must have the matrix's dtype float64"),
    (dict(tol=0.0), "tol must be > 0"),
    (dict(max_iter=0), "max_iter must be >= 1"),
    (dict(preconditioner="ilu"), "preconditioner must be 'jacobi' or None"),
    (dict(matrix=sp.random(4, 5, density=0.5, format="csr")), "matrix must be square"),
    (dict(matrix=np.eye(400)), "matrix must be a CSRMatrix or a scipy.sparse matrix"),
])
def test_distributed_cg_bad_input_names_the_parameter(client, kwargs, match):
    args = dict(matrix=poisson(20), b=np.ones(400))
    args.update(kwargs)
    with pytest.raises(ConfigError, match=match):
        linalg.conjugate_gradient(args.pop("matrix"), args.pop("b"), client=client, **args)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("shape", [(700, 500, 900), (257, 1031, 3), (64, 64, 64)])
def test_distributed_matmul_equals_the_local_product(client, dtype, shape):
    m, k, n = shape
    rng = np.random.default_rng(m)
    a = rng.standard_normal((m, k)).astype(dtype)
    b = rng.standard_normal((k, n)).astype(dtype)
    product = linalg.matmul(a, b, client=client, backend="numba", tile=256)
    expected = a.astype(np.float64) @ b.astype(np.float64)
    tolerance = 1e-4 if dtype == "float32" else 1e-12
    result = product.compute()
    assert result.dtype == np.dtype(dtype) and result.shape == (m, n)
    np.testing.assert_allclose(result, expected, rtol=0, atol=tolerance * np.sqrt(k) * np.abs(expected).max())


def test_matmul_larger_than_a_worker_uses_tiles_that_fit(client):
    import dask.array as da

    budget = 16e6  # bytes a worker thread may use: smaller than the operands together
    a = da.random.default_rng(1).standard_normal((1500, 1200), chunks=500)  # made on the workers
    b = da.random.default_rng(2).standard_normal((1200, 1300), chunks=500)
    assert a.nbytes + b.nbytes + 1500 * 1300 * 8 > budget
    product = linalg.matmul(a, b, client=client, memory_per_thread=budget)
    tile = max(product.chunks[0])
    assert 3 * tile * tile * 8 <= linalg.MEMORY_FRACTION * budget and tile >= linalg.MIN_TILE
    np.testing.assert_allclose(product.compute(), a.compute() @ b.compute(), rtol=1e-10, atol=1e-10)


def test_choose_tile_balances_the_workers_and_respects_memory():
    assert linalg.choose_tile((8192, 8192), (8192, 8192), 4, workers=8, memory_per_thread=64e9) == 2048
    assert linalg.choose_tile((300, 300), (300, 300), 8, workers=2, memory_per_thread=1e9) == 256
    with pytest.raises(ConfigError, match="cannot hold three 256x256 tiles"):
        linalg.choose_tile((8192, 8192), (8192, 8192), 8, workers=2, memory_per_thread=1e6)


@pytest.mark.parametrize("a, b, match", [
    (np.ones((3, 4)), np.ones((5, 2)), r"inner dimensions must agree: a is \(3, 4\), b is \(5, 2\)"),
    (np.ones((3, 4), np.float32), np.ones((4, 2)), "a and b must share one dtype"),
    (np.ones(3), np.ones((3, 2)), "a must be a 2-D array"),
    (np.ones((3, 4), int), np.ones((4, 2), int), "a must have dtype float32 or float64"),
])
def test_distributed_matmul_bad_input(client, a, b, match):
    with pytest.raises(ConfigError, match=match):
        linalg.matmul(a, b, client=client)
