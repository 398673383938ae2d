"""Conjugate gradient and the matrix-free Poisson operator: known answers, failures, bad input."""

import math
import pickle

import numpy as np
import pytest
from _support import small, tolerance

from hpcgpu.errors import ConfigError, ConvergenceError
from hpcgpu.kernels.matrix.poisson import PoissonOperator
from hpcgpu.kernels.matrix.solvers import CGResult, as_operator, conjugate_gradient

# Manufactured solutions per axis on [0, L]: f(s) and f''(s) in s = x / L.
# A wall axis needs f(0) = f(1) = 0; a periodic one, f periodic. Neither is an
# eigenfunction of the discrete Laplacian, so the error is the scheme's O(h^2).
_PROFILES = {
    "wall": (lambda s: np.sin(np.pi * s) * np.exp(s),
             lambda s: np.exp(s) * (2 * np.pi * np.cos(np.pi * s) + (1 - np.pi**2) * np.sin(np.pi * s))),
    "periodic": (lambda s: np.exp(np.sin(2 * np.pi * s)),
                 lambda s: 4 * np.pi**2 * (np.cos(2 * np.pi * s) ** 2 - np.sin(2 * np.pi * s))
                 * np.exp(np.sin(2 * np.pi * s))),
}
BOUNDARIES = ["wall", ("periodic", "wall"), ("wall", "periodic"), "periodic"]
LX, LY = 1.0, 1.5


def _manufactured(ny, nx, boundary):
    """``(psi, lap psi)`` sampled on the points ``x = i dx``, ``y = j dy``."""
    bx, by = (boundary, boundary) if isinstance(boundary, str) else boundary
    x = np.arange(nx) / nx
    y = np.arange(ny) / ny
    fx, fxx = (f(x)[None, :] for f in _PROFILES[bx])
    fy, fyy = (f(y)[:, None] for f in _PROFILES[by])
    return fx * fy, fxx * fy / LX**2 + fx * fyy / LY**2


def _true_residual(op, x, b):
    b = op.project(b)
    return float(np.linalg.norm(b - op.matvec(x)) / np.linalg.norm(b))


@pytest.mark.parametrize("boundary", BOUNDARIES, ids=str)
def test_manufactured_poisson_solution_converges_at_second_order(boundary):
    tol = 1e-10
    errors = []
    for n in (16, 32, 64):
        ny, nx = 3 * n // 2, n
        psi, rhs = _manufactured(ny, nx, boundary)
        op = PoissonOperator((ny, nx), dx=LX / nx, dy=LY / ny, boundary=boundary, backend="numpy")
        result = conjugate_gradient(op, -rhs, tol=tol)  # A = -lap
        assert isinstance(result, CGResult) and result.converged
        assert _true_residual(op, result.x, -rhs) <= tol
        assert result.residuals[-1] <= tol and len(result.residuals) == result.iterations + 1
        exact = op.project(psi)  # zero on walls (already), mean-zero gauge when doubly periodic
        errors.append(float(np.abs(result.x - exact).max() / np.abs(exact).max()))
    orders = [math.log2(errors[k] / errors[k + 1]) for k in range(2)]
    print(f"{boundary}: max errors {errors}, observed orders {orders}")
    assert all(1.9 < order < 2.1 for order in orders)


@pytest.mark.parametrize("boundary", BOUNDARIES, ids=str)
def test_cg_agrees_with_the_fft_solver_to_its_tolerance(boundary, rng):
    op = PoissonOperator((24, 20), dx=0.7, dy=1.1, boundary=boundary, backend="numpy")
    rhs = rng.standard_normal((24, 20))
    direct = op.solve_fft(rhs)
    assert np.abs(op.laplacian(direct) - op.project(rhs)).max() < 1e-12 * np.abs(rhs).max() * 20
    tol = 1e-9
    result = conjugate_gradient(op, -rhs, tol=tol)
    # A (x_cg - x_fft) is exactly the CG residual: the difference is within tol in that norm.
    difference = np.linalg.norm(op.matvec(result.x - direct)) / np.linalg.norm(op.project(rhs))
    assert difference <= tol * (1 + 1e-6)


def test_operator_is_symmetric_positive_definite_on_its_range():
    for boundary in BOUNDARIES:
        op = PoissonOperator((6, 5), dx=1.0, dy=2.0, boundary=boundary, backend="numpy")
        basis = np.eye(30).reshape(30, 6, 5)
        A = np.stack([op.matvec(e).ravel() for e in basis])
        P = np.stack([op.project(e).ravel() for e in basis])
        np.testing.assert_allclose(A, A.T, atol=1e-14)
        assert np.abs(A @ P - P @ A).max() < 1e-12  # the projection commutes with A
        eigenvalues = np.linalg.eigvalsh(P @ A @ P)
        assert (eigenvalues > -1e-12).all()
        assert np.sum(eigenvalues > 1e-9) == np.linalg.matrix_rank(P)
        np.testing.assert_array_equal(op.diagonal(), np.diag(A).reshape(6, 5))


def test_backends_solve_the_same_poisson_problem(backend, dtype):
    n = small(backend, 24, 6)
    _, rhs = _manufactured(n, n, "periodic")
    op = PoissonOperator((n, n), dx=LX / n, dy=LY / n, boundary="periodic", dtype=dtype, backend=backend)
    reference = PoissonOperator((n, n), dx=LX / n, dy=LY / n, boundary="periodic", backend="numpy")
    field = np.random.default_rng(1).standard_normal((n, n))
    expected = reference.matvec(field)
    got = backend.to_host(op.matvec(backend.asarray(field, dtype=dtype))).astype(np.float64)
    scale = np.abs(expected).max()
    assert np.abs(got - expected).max() <= 10 * max(tolerance(backend, dtype), np.finfo(dtype).eps) * scale
    tol = 1e-5 if dtype == np.float32 else 1e-10
    result = conjugate_gradient(op, backend.asarray(-rhs, dtype=dtype), tol=tol)
    exact = reference.solve_fft(rhs)
    x = backend.to_host(result.x).astype(np.float64)
    assert np.linalg.norm(reference.matvec(x - exact)) <= 2 * tol * np.linalg.norm(reference.project(rhs))


def test_dense_and_scipy_sparse_matrices_are_operators(rng):
    scipy_sparse = pytest.importorskip("scipy.sparse")
    n = 40
    q, _ = np.linalg.qr(rng.standard_normal((n, n)))
    dense = q @ np.diag(np.linspace(1.0, 50.0, n)) @ q.T
    b = rng.standard_normal(n)
    expected = np.linalg.solve(dense, b)
    diagonal = np.diag(dense).copy()
    for matrix in (dense, scipy_sparse.csr_matrix(dense)):
        for preconditioner in ("jacobi", None, lambda r: r / diagonal):
            result = conjugate_gradient(matrix, b, tol=1e-12, preconditioner=preconditioner)
            np.testing.assert_allclose(result.x, expected, rtol=1e-9, atol=1e-9)
            assert result.iterations <= 2 * n
    op = as_operator(dense)
    assert op.shape == (n, n) and as_operator(op) is op


def test_hpcgpu_csr_matrix_is_applied_by_spmv():
    matrix_module = pytest.importorskip("hpcgpu.kernels.matrix")
    if not hasattr(matrix_module, "CSRMatrix"):
        pytest.skip("hpcgpu.kernels.matrix.CSRMatrix is not there yet")
    scipy_sparse = pytest.importorskip("scipy.sparse")
    n = 30
    lap = scipy_sparse.diags([-np.ones(n - 1), 2.5 * np.ones(n), -np.ones(n - 1)], [-1, 0, 1]).tocsr()
    csr = matrix_module.CSRMatrix.from_scipy(lap)
    b = np.linspace(-1.0, 1.0, n)
    result = conjugate_gradient(csr, b, tol=1e-12)
    np.testing.assert_allclose(lap @ result.x, b, atol=1e-10)


def test_non_spd_matrix_ends_with_convergence_error_and_residual_history():
    eigenvalues = np.concatenate([np.linspace(1.0, 10.0, 19), [-5.0]])
    with pytest.raises(ConvergenceError, match="not symmetric positive definite") as info:
        conjugate_gradient(np.diag(eigenvalues), np.ones(20), preconditioner=None)
    error = info.value
    assert error.iterations >= 1 and len(error.residuals) == error.iterations + 1
    assert error.residuals[0] == 1.0
    assert "p.A p" in str(error)
    again = pickle.loads(pickle.dumps(error))  # crosses processes (dask) intact
    assert again.residuals == error.residuals and again.iterations == error.iterations


def test_jacobi_on_a_non_positive_diagonal_is_a_convergence_error():
    with pytest.raises(ConvergenceError, match="diagonal has an entry .* <= 0"):
        conjugate_gradient(np.diag([1.0, 2.0, -1.0]), np.ones(3))


def test_stall_below_the_rounding_floor_ends_with_convergence_error():
    n = 32
    op = PoissonOperator((n, n), boundary="wall", dtype="float32", backend="numpy")
    _, rhs = _manufactured(n, n, "wall")
    with pytest.raises(ConvergenceError, match="stalled.*float32") as info:
        conjugate_gradient(op, rhs.astype(np.float32), tol=1e-12, stall_window=25)
    residuals = info.value.residuals
    assert min(residuals) > 1e-12 and min(residuals) < 1e-4  # it got to float32 rounding, then stuck
    assert len(residuals) < 10 * n * n


def test_a_residual_that_rises_before_it_falls_is_not_a_stall(rng):
    # CG's residual is not monotone: on a Poisson problem with a smooth right-hand side it
    # rises several-fold and is back below its start only after ~0.6 side iterations (328 at
    # 512^2), while the A-norm of the error falls at every step. A window shorter than the hump
    # used to end a solvable system in "stalled".
    side = 64
    matrix = PoissonOperator((side, side), boundary="wall", backend="numpy")
    rhs = rng.random((side, side))
    result = conjugate_gradient(matrix, rhs, tol=1e-8, stall_window=20)
    residuals = np.array(result.residuals)
    assert result.converged and residuals.max() > 2.0  # the hump was there
    assert np.argmax(residuals[1:] < 0.99) + 1 > 20  # longer than the window
    assert residuals[-1] <= 1e-8  # the true residual, recomputed from x at the end


def test_a_fortran_ordered_right_hand_side_gives_the_same_solution(rng):
    # the solver updates x, r and p in place through flat views: they must be its own C-ordered arrays
    op = PoissonOperator((24, 24), boundary="wall", backend="numba")
    _, rhs = _manufactured(24, 24, "wall")
    c_order = conjugate_gradient(op, np.ascontiguousarray(rhs), tol=1e-10)
    f_order = conjugate_gradient(op, np.asfortranarray(rhs), tol=1e-10)
    assert c_order.converged and f_order.converged and c_order.iterations == f_order.iterations
    np.testing.assert_allclose(f_order.x, c_order.x, rtol=0, atol=1e-12 * np.abs(c_order.x).max())


def test_max_iter_ends_with_convergence_error():
    op = PoissonOperator((32, 32), boundary="wall", backend="numpy")
    _, rhs = _manufactured(32, 32, "wall")
    with pytest.raises(ConvergenceError, match="max_iter=5 reached") as info:
        conjugate_gradient(op, rhs, max_iter=5)
    assert info.value.iterations == 5 and len(info.value.residuals) == 6


def test_zero_right_hand_side_and_warm_start():
    op = PoissonOperator((8, 8), boundary="wall", backend="numpy")
    zero = conjugate_gradient(op, np.zeros((8, 8)))
    assert zero.iterations == 0 and not zero.x.any()
    _, rhs = _manufactured(8, 8, "wall")
    cold = conjugate_gradient(op, rhs, tol=1e-12)
    warm = conjugate_gradient(op, rhs, x0=cold.x, tol=1e-10)
    assert warm.iterations < cold.iterations // 2


@pytest.mark.parametrize("kwargs, word", [
    (dict(tol=0.0), "tol"), (dict(tol=-1e-3), "tol"), (dict(tol=1.5), "tol"), (dict(tol=float("nan")), "tol"),
    (dict(max_iter=0), "max_iter"), (dict(stall_window=0), "stall_window"),
    (dict(preconditioner="ilu"), "preconditioner"), (dict(x0=np.zeros(5)), "x0"),
])
def test_bad_parameters_are_config_errors_naming_them(kwargs, word):
    with pytest.raises(ConfigError, match=word):
        conjugate_gradient(np.eye(4), np.ones(4), **kwargs)


def test_bad_systems_are_config_errors():
    with pytest.raises(ConfigError, match="square"):
        conjugate_gradient(np.ones((3, 4)), np.ones(3))
    with pytest.raises(ConfigError, match="entries"):
        conjugate_gradient(np.eye(4), np.ones(5))
    with pytest.raises(ConfigError, match="dtype"):
        conjugate_gradient(np.eye(4), np.ones(4, dtype=np.float32))
    with pytest.raises(ConfigError, match="matvec"):
        conjugate_gradient("not a matrix", np.ones(4))
    with pytest.raises(ConfigError, match="boundary"):
        PoissonOperator((8, 8), boundary=("periodic", "open", "open"), backend="numpy")
    with pytest.raises(ConfigError, match="dx"):
        PoissonOperator((8, 8), dx=0.0, backend="numpy")
    with pytest.raises(ConfigError, match="nx"):
        PoissonOperator((8, 2), backend="numpy")
    with pytest.raises(ConfigError, match="shape"):
        PoissonOperator((8, 8), backend="numpy").solve_fft(np.ones((4, 4)))
