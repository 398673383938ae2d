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
    from hpcgpu.kernels.matrix.solvers import conjugate_gradient

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


def test_distributed_cg_does_not_call_a_rising_residual_a_stall(client, monkeypatch):
    # A smooth right-hand side on a 192^2 Poisson problem: the residual rises several-fold and
    # is back below its start only after more than 100 iterations, while the A-norm error falls
    # at every step. The ranks used to stop this solvable system as "stalled". A window of 100
    # (the default is 200) makes the hump outlast it, so the error's check must carry the run.
    from hpcgpu.linalg import cg_ranks

    monkeypatch.setattr(cg_ranks, "STALL_WINDOW", 100)
    side = 192
    A = poisson(side)
    b = np.random.default_rng(5).random(side * side)
    result = linalg.conjugate_gradient(A, b, client=client, partitions=2, tol=1e-8, backend="numba")
    residuals = np.array(result.residuals)
    assert result.converged and residuals.max() > 2.0
    assert np.argmax(residuals[1:] < 0.99) + 1 > 100  # the hump outlasted the stall window
    assert np.linalg.norm(A @ result.x - b) <= 1e-7 * np.linalg.norm(b)


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


# -- distributed CG: SPMD ranks on the communicator ----------------------------------------------------
@pytest.mark.parametrize("partitions", [1, 2, 3])  # 3: two ranks share a worker (threads of one task)
def test_distributed_cg_agrees_with_the_single_process_solver_on_poisson(client, partitions):
    from hpcgpu.kernels.matrix.solvers import conjugate_gradient

    A = poisson(24)
    b = np.random.default_rng(11).standard_normal(576)
    local = conjugate_gradient(CSRMatrix.from_scipy(A), b, tol=1e-10, backend="numpy")
    distributed = linalg.conjugate_gradient(A, b, client=client, partitions=partitions, tol=1e-10, backend="numba")
    assert distributed.converged and abs(distributed.iterations - local.iterations) <= 1
    # the same iteration, summed in another order: the recursive residuals agree to rounding all the way
    # down; the last entry is the true residual b - A x, at 1e-10 of b mostly cancellation of x's rounding
    steps = min(len(local.residuals), len(distributed.residuals)) - 1
    np.testing.assert_allclose(distributed.residuals[:steps], local.residuals[:steps], rtol=1e-10)
    assert len(distributed.residuals) == distributed.iterations + 1  # the true residual replaces the last
    assert distributed.residuals[-1] <= 1e-10 and distributed.residuals[-1] == pytest.approx(local.residuals[-1],
                                                                                             rel=1e-3)
    np.testing.assert_allclose(distributed.x, local.x, rtol=0, atol=1e-12 * np.abs(local.x).max())


def test_distributed_cg_is_bitwise_repeatable_because_every_rank_reduces_in_rank_order(client):
    A = poisson(24)
    b = np.random.default_rng(12).standard_normal(576)
    first, second = (linalg.conjugate_gradient(A, b, client=client, partitions=3, tol=1e-10, backend="numba")
                     for _ in range(2))
    assert first.residuals == second.residuals and first.iterations == second.iterations
    np.testing.assert_array_equal(first.x, second.x)


@pytest.mark.parametrize("partitions", [1, 2, 3])
def test_distributed_cg_stops_every_rank_at_the_first_negative_curvature(client, partitions):
    import time

    from hpcgpu.linalg import cg_ranks
    from hpcgpu.kernels.matrix.solvers import conjugate_gradient

    A = (poisson(12) - 0.2 * sp.eye(144)).tocsr()  # two eigenvalues below zero, diagonal still positive
    b = np.random.default_rng(5).standard_normal(144)
    with pytest.raises(ConvergenceError) as local:
        conjugate_gradient(CSRMatrix.from_scipy(A), b, tol=1e-10, backend="numpy")
    assert local.value.iterations > 3  # the curvature turns negative mid-solve, not at the start
    started = time.monotonic()
    with pytest.raises(ConvergenceError, match="not symmetric positive definite") as info:
        linalg.conjugate_gradient(A, b, client=client, partitions=partitions, tol=1e-10, backend="numba")
    assert time.monotonic() - started < 0.1 * cg_ranks.TIMEOUT_S  # no rank waited for a peer that stopped
    assert info.value.iterations == local.value.iterations
    np.testing.assert_allclose(info.value.residuals, local.value.residuals, rtol=1e-10)


def _executing(dask_worker):
    return dask_worker.state.executing_count


@pytest.mark.parametrize("partitions, failing", [(2, 1), (3, 2)])  # (3, 2): shares its worker with rank 0
def test_a_rank_that_raises_releases_every_rank_at_once_and_its_error_reaches_the_client(
        client, monkeypatch, partitions, failing):
    import time

    from _cg_faults import faulty_split

    from hpcgpu.linalg import cg_ranks

    monkeypatch.setattr(cg_ranks, "split", faulty_split(cg_ranks.split, failing, fail_after=5))
    A = poisson(20)
    b = np.random.default_rng(1).standard_normal(400)
    started = time.monotonic()
    with pytest.raises(ValueError, match="injected failure in a CG partition"):
        linalg.conjugate_gradient(A, b, client=client, partitions=partitions, tol=1e-10, backend="numba")
    # the other ranks were waiting for the failed one: the abort, not their 300 s timeout, ended their waits
    assert time.monotonic() - started < 0.1 * cg_ranks.TIMEOUT_S
    assert set(client.run(_executing).values()) == {0}  # every rank has returned: no task still runs
    monkeypatch.undo()
    assert linalg.conjugate_gradient(A, b, client=client, partitions=partitions, tol=1e-10).converged



def test_a_client_that_stops_waiting_stops_the_ranks(client, monkeypatch):
    import time

    from _cg_faults import faulty_split

    from hpcgpu.linalg import cg, cg_ranks

    def interrupted(self):
        raise KeyboardInterrupt("the user pressed Ctrl-C")

    # rank 1 crawls (0.2 s per product): left alone, the solve would run for many seconds more
    monkeypatch.setattr(cg_ranks, "split", faulty_split(cg_ranks.split, 1, pause=0.2))
    monkeypatch.setattr(cg._Solver, "_missing", interrupted)  # the client's first look at the workers
    A = poisson(20)
    b = np.random.default_rng(3).standard_normal(400)
    started = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        linalg.conjugate_gradient(A, b, client=client, partitions=2, tol=1e-10, backend="numba")
    assert time.monotonic() - started < 10  # the session closed after its ranks returned, not after its timeout
    assert set(client.run(_executing).values()) == {0}

def test_a_worker_lost_without_restarts_is_a_cluster_error_that_names_it(client, monkeypatch):
    import os
    import signal
    import threading
    import time

    from _cg_faults import faulty_split

    from hpcgpu.linalg import cg_ranks
    from hpcgpu.cluster import worker_info
    from hpcgpu.errors import ClusterError

    # rank 1 crawls (0.2 s per product), so the solve is still running when its worker dies
    monkeypatch.setattr(cg_ranks, "split", faulty_split(cg_ranks.split, 1, pause=0.2))
    victim = sorted(worker_info(client))[1]  # rank 1's worker
    pid = client.run(os.getpid, workers=[victim])[victim]
    killer = threading.Timer(2.0, os.kill, (pid, signal.SIGKILL))
    A = poisson(20)
    b = np.random.default_rng(2).standard_normal(400)
    started = time.monotonic()
    killer.start()
    try:
        with pytest.raises(ClusterError, match=f"worker {victim} left the cluster"):
            linalg.conjugate_gradient(A, b, client=client, partitions=2, tol=1e-10, backend="numba",
                                      max_restarts=0)
        assert time.monotonic() - started < 0.1 * cg_ranks.TIMEOUT_S
    finally:
        killer.join()
        client.wait_for_workers(2, timeout=60)


def test_a_worker_killed_during_the_solve_is_survived_with_the_same_answer(client, monkeypatch):
    import os
    import signal
    import threading

    from _cg_faults import faulty_split

    from hpcgpu.cluster import worker_info
    from hpcgpu.linalg import cg_ranks

    A = poisson(20)
    b = np.random.default_rng(3).standard_normal(400)
    # rank 1 crawls (0.1 s per product), so the solve is still running when its worker dies
    monkeypatch.setattr(cg_ranks, "split", faulty_split(cg_ranks.split, 1, pause=0.1))
    undisturbed = linalg.conjugate_gradient(A, b, client=client, partitions=2, tol=1e-10, backend="numba")
    victim = sorted(worker_info(client))[1]
    pid = client.run(os.getpid, workers=[victim])[victim]
    killer = threading.Timer(1.5, os.kill, (pid, signal.SIGKILL))
    killer.start()
    try:
        with pytest.warns(RuntimeWarning, match=f"worker {victim} left the cluster.*restart 1: round 1 solved again"):
            result = linalg.conjugate_gradient(A, b, client=client, partitions=2, tol=1e-10, backend="numba")
    finally:
        killer.join()
        client.wait_for_workers(2, timeout=60)
    assert result.converged and result.iterations == undisturbed.iterations
    np.testing.assert_array_equal(result.x, undisturbed.x)
    assert result.residuals == undisturbed.residuals


def test_a_rank_stuck_in_compute_ends_the_solve_at_its_deadline_naming_what_each_rank_did(
        client, monkeypatch, tmp_path):
    import re
    import time

    from _cg_faults import faulty_split

    from hpcgpu.errors import EpochDeadline
    from hpcgpu.linalg import cg_ranks
    from hpcgpu.partition.faults import DEADLINE_ENV

    floor = 2.0
    monkeypatch.setenv(DEADLINE_ENV, str(floor))
    release = tmp_path / "release"
    monkeypatch.setattr(cg_ranks, "split", faulty_split(cg_ranks.split, 1, stuck_at=20, release=str(release)))
    A = poisson(20)
    b = np.random.default_rng(4).standard_normal(400)
    try:
        with pytest.raises(EpochDeadline) as info:
            linalg.conjugate_gradient(A, b, client=client, partitions=2, tol=1e-10, backend="numpy")
        doing = info.value.doing
        # progress is checked every floor seconds: a stuck round is seen within two of them (the time
        # before it, the session's start on a busy machine, is not the deadline's)
        stuck = float(re.search(r"computing for ([0-9.]+) s", doing[1]).group(1))
        assert stuck < 2 * floor + 2, f"detected {stuck:.1f} s after the rank got stuck: {info.value}"
        assert info.value.ranks == (0, 1) and info.value.deadline == floor
        assert "round 1 of the conjugate gradient, iteration" in doing[1], doing
        assert "waiting" in doing[0] and "from rank 1" in doing[0], doing
        assert set(client.run(_executing).values()) == {0, 1}  # rank 0 was released by the abort
    finally:
        release.touch()
    deadline = time.monotonic() + 10
    while any(client.run(_executing).values()) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert set(client.run(_executing).values()) == {0}


def _lap1d(n):
    """A small 1D SPD tridiagonal matrix (diagonally dominant: CG reaches the rounding floor in ~n steps)."""
    return sp.diags([-1.0, 2.05, -1.0], [-1, 0, 1], shape=(n, n), format="csr")


@pytest.mark.parametrize("tol", [1.0, 2.0])
def test_distributed_cg_rejects_tol_of_one_or_more_as_the_single_process_solver_does(client, tol):
    import re

    from hpcgpu.kernels.matrix.solvers import conjugate_gradient

    # x = 0 meets a relative residual of 1: the distributed solver used to return it, "converged" at iteration 0
    A, b = _lap1d(50), np.random.default_rng(0).standard_normal(50)
    with pytest.raises(ConfigError, match="tol must be") as single:
        conjugate_gradient(CSRMatrix.from_scipy(A), b, tol=tol, backend="numpy")
    with pytest.raises(ConfigError, match=f"^{re.escape(str(single.value))}$"):
        linalg.conjugate_gradient(A, b, client=client, partitions=2, tol=tol, backend="numpy")


def test_distributed_cg_stalls_below_the_rounding_floor_as_the_single_process_solver_does(client):
    from hpcgpu.kernels.matrix.solvers import conjugate_gradient

    # tol = 1e-20 is out of float64's reach. Every round of the distributed solve ends when the recursive
    # residual passes it and restarts from the true one (~1e-16); the rounds used to restart the stall test
    # too, so the solve ran to max_iter instead of stopping as stalled, as the single-process solver does.
    A, b = _lap1d(50), np.random.default_rng(0).standard_normal(50)
    with pytest.raises(ConvergenceError, match="stalled") as single:
        # max_iter as the distributed solve's: at the default 10 n = 500 the stall (200 iterations without
        # progress after the best residual) lands at 524 with NumPy 2.4's rounding
        conjugate_gradient(CSRMatrix.from_scipy(A), b, tol=1e-20, max_iter=1000, backend="numpy")
    with pytest.raises(ConvergenceError, match="stalled") as distributed:
        linalg.conjugate_gradient(A, b, client=client, partitions=2, tol=1e-20, max_iter=1000, backend="numpy")
    # the same reason and hint, the same window (the exact iteration depends on the summation order)
    reason = str(single.value).split(": ", 1)[1].split(";")[0]
    assert "below the rounding floor of float64" in reason
    assert reason in str(distributed.value)
    assert len(distributed.value.residuals) >= distributed.value.iterations + 1
    assert min(distributed.value.residuals) < 1e-14  # it did reach the floor before giving up


def test_distributed_cg_stall_window_is_the_single_process_default():
    import inspect

    from hpcgpu.kernels.matrix.solvers import conjugate_gradient
    from hpcgpu.linalg import cg_ranks

    default = inspect.signature(conjugate_gradient).parameters["stall_window"].default
    assert cg_ranks.STALL_WINDOW == default
