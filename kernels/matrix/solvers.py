"""Preconditioned conjugate gradient on any backend, for SPD operators.

The solver is written once on three vector operations (``dot``, ``axpy``,
a scaled add: :func:`_vector_operations`, the matrix family's one-pass
kernels on CPUs, CuPy's on GPUs) and the operator's ``matvec``, so it runs
on NumPy and CuPy arrays alike; the operator decides where the work happens (a
matrix-free stencil, a CSR matrix through :func:`hpcgpu.kernels.matrix.spmv`,
a dense matrix). Every way it can fail ends in a
:class:`~hpcgpu.errors.ConvergenceError` carrying the residual history,
never in an endless loop.

An operator is any object with ``shape`` ``(n, n)``, ``dtype`` and
``matvec(x)``; ``diagonal()`` for the Jacobi preconditioner; and optionally
``project(x)``, the orthogonal projection onto the subspace where a singular
operator is definite (e.g. mean-zero fields for a doubly periodic Laplacian),
which the solver applies to the right-hand side, the start and every
preconditioned residual. :func:`as_operator` adapts dense arrays,
``scipy.sparse`` matrices and hpcgpu's ``CSRMatrix``.

Examples
--------
>>> import numpy as np
>>> A = np.array([[4.0, 1.0], [1.0, 3.0]])
>>> result = conjugate_gradient(A, np.array([1.0, 2.0]), tol=1e-12)
>>> np.allclose(A @ result.x, [1.0, 2.0]), result.converged
(True, True)
"""

import math
import sys
from dataclasses import dataclass

import numpy as np

from hpcgpu.backends import Backend, get_backend
from hpcgpu.errors import ConfigError, ConvergenceError
from hpcgpu.kernels.matrix.csr import CSRMatrix
from hpcgpu.kernels.matrix.ops import spmv
from hpcgpu.validation import check_int, check_relative_tolerance

__all__ = ["CGResult", "conjugate_gradient", "as_operator"]

# Progress needed within a stall window: the best residual must drop by 1 %,
# or the A-norm of the error by more than the dtype's rounding (see error_stalled).
_STALL_FACTOR = 0.99


@dataclass(frozen=True)
class CGResult:
    """The outcome of :func:`conjugate_gradient`.

    Attributes
    ----------
    x : array
        The solution, shaped like ``b``, on the solver's backend.
    iterations : int
        Iterations taken (matrix-vector products, not counting the checks of
        the true residual).
    residuals : tuple of float
        Relative residual ``||b - A x|| / ||b||`` before the first iteration
        and after each one (the recursively updated residual, replaced by the
        true one where it was recomputed).
    converged : bool
        True: the true relative residual is at most ``tol``.
    """

    x: object
    iterations: int
    residuals: tuple
    converged: bool


def as_operator(matrix, backend=None):
    """Adapt a matrix to the operator protocol of :func:`conjugate_gradient`.

    Parameters
    ----------
    matrix
        An object with ``matvec`` (returned unchanged), an hpcgpu
        ``CSRMatrix`` (applied with :func:`hpcgpu.kernels.matrix.spmv`), a
        ``scipy.sparse`` matrix (host only) or a square 2D NumPy/CuPy array.
    backend : str or Backend, optional
        Where the vectors live (default: inferred from the matrix).

    Returns
    -------
    operator
        With ``shape``, ``dtype``, ``matvec(x)`` and ``diagonal()``.

    Raises
    ------
    ConfigError
        Anything else, or a matrix that is not square.

    Examples
    --------
    >>> import numpy as np
    >>> op = as_operator(np.diag([2.0, 3.0]))
    >>> op.matvec(np.ones(2)).tolist(), op.diagonal().tolist()
    ([2.0, 3.0], [2.0, 3.0])
    """
    if callable(getattr(matrix, "matvec", None)):
        return matrix
    if isinstance(matrix, CSRMatrix):
        return _CSROperator(matrix, get_backend(backend) if backend is not None else _backend_of(matrix.data))
    sparse = sys.modules.get("scipy.sparse")
    if sparse is not None and sparse.issparse(matrix):
        return _MatrixOperator(matrix, get_backend("numpy"), matrix.diagonal)
    if getattr(matrix, "ndim", None) == 2 and hasattr(matrix, "dtype"):
        backend = get_backend(backend) if backend is not None else _backend_of(matrix)
        matrix = backend.asarray(matrix)
        return _MatrixOperator(matrix, backend, lambda: backend.xp.diagonal(matrix).copy())
    raise ConfigError("operator must have a matvec(x) method, or be a CSRMatrix, a scipy.sparse "
                      f"matrix or a square 2D array; got {type(matrix).__name__}")


def conjugate_gradient(operator, b, *, x0=None, tol=1e-8, max_iter=None, preconditioner="jacobi",
                       stall_window=200, backend=None):
    """Solve ``A x = b`` for a symmetric positive definite ``A`` by preconditioned CG.

    Stops when ``||b - A x|| <= tol * ||b||`` holds for the true residual
    (the recursive residual is recomputed from ``x`` when it first passes
    the test, and the iteration restarts from the true one if they
    disagree). For a singular operator with ``project``, ``b`` and ``x0``
    are projected first and ``||b||`` is that of the projected ``b``.

    Parameters
    ----------
    operator
        ``A``: see the module docstring, or anything :func:`as_operator` takes.
    b : array
        Right-hand side, of size ``n``; any shape the operator's ``matvec``
        accepts (a 2D field for a grid operator). float32 or float64, the
        operator's dtype.
    x0 : array, optional
        Start (default zero), shaped like ``b``.
    tol : float
        Relative residual tolerance, in (0, 1).
    max_iter : int, optional
        Most iterations (default ``10 * n``).
    preconditioner : {"jacobi", None} or callable
        ``"jacobi"`` divides by ``operator.diagonal()`` (which must be
        positive); ``None`` is plain CG; a callable ``M(r) -> z`` must be
        symmetric positive definite.
    stall_window : int
        Iterations within which the best residual must fall by 1 % or, when
        it does not, the A-norm of the error must still fall (by more than
        the dtype's rounding of the total so far); neither is a stall (e.g.
        a tolerance below the rounding floor of the dtype). The residual of
        CG is not monotone: on a 512^2 Poisson problem with a smooth
        right-hand side it rises 12-fold and is back below its start only
        after 328 iterations, while the A-norm error, which CG minimises,
        falls at every step.
    backend : str or Backend, optional
        Where the vectors live; default ``operator.backend`` if it has one,
        else the backend of ``b``'s array module.

    Returns
    -------
    CGResult

    Raises
    ------
    ConvergenceError
        Non-SPD operator or preconditioner (``p.A p <= 0`` or ``r.z <= 0``,
        a non-positive diagonal for Jacobi), a stall, non-finite values or
        ``max_iter`` reached; it carries ``residuals`` and ``iterations``.
    ConfigError
        Bad parameters: ``tol`` outside (0, 1), shapes or dtypes that do
        not match the operator, a non-square operator.

    Examples
    --------
    >>> import numpy as np
    >>> A = np.diag(np.arange(1.0, 11.0))
    >>> result = conjugate_gradient(A, np.ones(10), tol=1e-10, preconditioner=None)
    >>> result.iterations <= 10, float(np.abs(A @ result.x - 1).max()) < 1e-9
    (True, True)
    """
    backend = _resolve_backend(operator, b, backend)
    operator = as_operator(operator, backend)
    xp = backend.xp
    tol = check_relative_tolerance("tol", tol)
    stall_window = check_int("stall_window", stall_window, minimum=1)
    n, b, dtype = _check_system(operator, b, backend)
    max_iter = 10 * n if max_iter is None else check_int("max_iter", max_iter, minimum=1)
    project = getattr(operator, "project", None)
    precondition = _preconditioner(preconditioner, operator, xp, dtype)

    if project is not None:
        b = project(b)
    dot, axpy, scale_add = _vector_operations(backend)

    b_norm = math.sqrt(dot(b, b))
    if x0 is None:
        x = xp.zeros_like(b)
    else:
        x = _vector("x0", x0, b, backend, dtype, copy=True)
        if project is not None:
            x = project(x)
    if b_norm == 0.0:
        return CGResult(xp.zeros_like(b), 0, (0.0,), True)
    if not math.isfinite(b_norm):
        raise ConfigError("b holds NaN or inf")

    r = b - operator.matvec(x) if x0 is not None else b.copy()
    # C order: the in-place one-pass updates work on their flat views
    x, r = xp.ascontiguousarray(x), xp.ascontiguousarray(r)
    rel = math.sqrt(dot(r, r)) / b_norm
    history = [rel]
    best, best_at = rel, 0
    # energy[k]: ||e_0||_A^2 - ||e_k||_A^2 = sum of alpha_j (r_j . z_j), j < k (Hestenes-Stiefel):
    # what CG has gained in the norm it minimises, monotone even where the residual is not
    energy = [0.0]
    rounding = float(np.finfo(dtype).eps)

    def fail(reason, k):
        raise ConvergenceError(
            f"conjugate gradient stopped after {k} iteration(s): {reason}; relative residual "
            f"{history[-1]:.3e} (best {min(history):.3e}), tol {tol:.3e}", residuals=history, iterations=k)

    if not math.isfinite(rel):
        fail("the initial residual is not finite (check x0 and the operator)", 0)
    k = 0
    restart, p, rz_old = True, None, None  # a restart sets the direction before any use of these
    while True:
        if rel <= tol:
            # The recursive residual drifts from b - A x in finite precision: check the true one.
            r = xp.ascontiguousarray(b - operator.matvec(x))
            rel = math.sqrt(dot(r, r)) / b_norm
            history[-1] = rel
            if rel <= tol:
                return CGResult(x, k, tuple(history), True)
            restart = True
        if k >= max_iter:
            fail(f"max_iter={max_iter} reached without convergence", k)
        z = precondition(r)
        if project is not None:
            z = project(z)
        rz = dot(r, z)
        if not rz > 0:
            fail(f"r.z = {rz:.3e} <= 0: the preconditioner is not positive definite, or the "
                 "residual vanished in a singular direction", k)
        if restart:
            # a copy: r is updated in place below, and a preconditioner may reuse its output buffer
            p = xp.array(z, copy=True, order="C")
            restart = False
        else:
            scale_add(rz / rz_old, p, z)  # p = beta p + z
        q = operator.matvec(p)
        pq = dot(p, q)
        if not pq > 0:
            what = "not finite" if not math.isfinite(pq) else f"{pq:.3e} <= 0"
            fail(f"p.A p = {what}: the operator is not symmetric positive definite", k)
        alpha = rz / pq
        axpy(alpha, p, x)  # x and r are this solver's own arrays
        axpy(-alpha, q, r)
        rz_old = rz
        k += 1
        rel = math.sqrt(dot(r, r)) / b_norm
        history.append(rel)
        energy.append(energy[-1] + alpha * rz)
        if not math.isfinite(rel):
            fail("the residual is not finite", k)
        if rel < _STALL_FACTOR * best:
            best, best_at = rel, k
        elif k - best_at >= stall_window and error_stalled(energy, stall_window, rounding):
            fail(f"stalled: no 1 % progress in the last {stall_window} iterations (the tolerance "
                 f"may be below the rounding floor of {np.dtype(dtype).name}, or the system is "
                 "inconsistent)", k)


# -- helpers ---------------------------------------------------------------------
def _vector_operations(backend):
    """``(dot, axpy, scale_add)`` for the solver's vectors on ``backend``.

    ``dot(u, v)`` is a float; ``axpy(alpha, u, v)`` sets ``v = alpha u + v``
    and ``scale_add(beta, p, z)`` sets ``p = beta p + z``, in place, on
    C-ordered arrays of the solver's own. On CPU backends these are the
    matrix family's kernels (float64 sums, one threaded pass: NumPy's
    ``vdot`` took 3-12 ms per 512^2 product here, 6x the SpMV, and its
    expressions make a temporary per term). On GPU backends they are CuPy's
    own reductions and element-wise operations: one launch each, where a
    Numba-CUDA kernel adds a launch of its own (and under the CUDA simulator
    one Python thread per element).
    """
    xp = backend.xp
    if backend.on_gpu:
        def dot(u, v):
            return float(xp.vdot(u, v))

        def axpy(alpha, u, v):
            v += alpha * u

        def scale_add(beta, p, z):
            xp.multiply(p, beta, out=p)
            p += z
        return dot, axpy, scale_add

    kernels = backend.kernels("matrix")

    def dot(u, v):
        return float(kernels.dot(u.reshape(-1), v.reshape(-1)))

    def axpy(alpha, u, v):
        kernels.axpy(alpha, u.reshape(-1), v.reshape(-1), v.reshape(-1))

    def scale_add(beta, p, z):
        kernels.axpy(beta, p.reshape(-1), z.reshape(-1), p.reshape(-1))
    return dot, axpy, scale_add


def error_stalled(energy, window, rounding):
    """Whether CG's A-norm error fell by no more than rounding in the last ``window`` iterations.

    The stall test of :func:`conjugate_gradient` and of the distributed CG
    (:mod:`hpcgpu.linalg.cg`). ``energy`` is the running sum of CG's gains
    ``alpha (r . z)``, which is how far the A-norm of the error has fallen;
    a gain below ``rounding`` times the total is what the dtype cannot tell
    from zero (at the rounding floor the gains shrink to far below it). With
    no more than ``window`` sums there is nothing to weigh: stalled.

    Examples
    --------
    >>> error_stalled([0.0, 1.0, 2.0, 2.0, 2.0], 2, 1e-16), error_stalled([0.0, 1.0, 2.0, 3.0], 2, 1e-16)
    (True, False)
    """
    if len(energy) <= window:
        return True
    return energy[-1] - energy[-1 - window] <= rounding * energy[-1]


def _resolve_backend(operator, b, backend):
    if backend is not None:
        return get_backend(backend)
    own = getattr(operator, "backend", None)
    if isinstance(own, Backend):
        return own
    return _backend_of(b)


def _backend_of(array):
    if type(array).__module__.split(".")[0] == "cupy":
        return get_backend("cupy")
    return get_backend("numpy")


def _check_system(operator, b, backend):
    shape = tuple(getattr(operator, "shape", ()) or ())
    if len(shape) != 2:
        raise ConfigError(f"operator must have a 2D shape (n, n); got {shape!r}")
    if shape[0] != shape[1]:
        raise ConfigError(f"operator must be square for conjugate gradient; got shape {shape}")
    dtype = np.dtype(getattr(operator, "dtype", np.float64))
    if dtype.name not in ("float32", "float64"):
        raise ConfigError(f"operator dtype must be float32 or float64; got {dtype}")
    b = _vector("b", b, None, backend, dtype)
    if b.size != shape[0]:
        raise ConfigError(f"b has {b.size} entries (shape {b.shape}) but the operator has shape {shape}")
    return shape[0], b, dtype


def _vector(name, value, like, backend, dtype, copy=False):
    if value is None or not hasattr(value, "dtype"):
        raise ConfigError(f"{name} must be a NumPy or CuPy array; got {type(value).__name__}")
    if np.dtype(value.dtype) != dtype:
        raise ConfigError(f"{name} has dtype {value.dtype} but the operator has {dtype}; "
                          "convert one of them (dtypes are never mixed silently)")
    value = backend.asarray(value)
    if like is not None and value.shape != like.shape:
        raise ConfigError(f"{name} has shape {value.shape} but b has {like.shape}")
    return value.copy() if copy else value


def _preconditioner(kind, operator, xp, dtype):
    if kind is None or kind == "none":
        return lambda r: r
    if callable(kind):
        return kind
    if kind != "jacobi":
        raise ConfigError(f"preconditioner must be 'jacobi', None or a callable; got {kind!r}")
    diagonal = getattr(operator, "diagonal", None)
    if not callable(diagonal):
        raise ConfigError("preconditioner='jacobi' needs operator.diagonal(); pass preconditioner=None")
    d = xp.asarray(diagonal(), dtype=dtype)
    if d.size == 0:
        return lambda r: r  # a 0 x 0 system: nothing to scale (and min() of nothing raises)
    smallest = float(d.min())
    if not smallest > 0:
        raise ConvergenceError(
            f"the operator's diagonal has an entry {smallest:.3e} <= 0, so it is not symmetric "
            "positive definite (and Jacobi cannot precondition it)", residuals=[], iterations=0)
    inverse = 1.0 / d
    return lambda r: r * inverse.reshape(r.shape)


class _MatrixOperator:
    """A dense or scipy.sparse matrix as an operator."""

    def __init__(self, matrix, backend, diagonal):
        self.matrix, self.backend, self._diagonal = matrix, backend, diagonal
        self.shape, self.dtype = tuple(matrix.shape), np.dtype(matrix.dtype)

    def matvec(self, x):
        return (self.matrix @ x.reshape(-1)).reshape(x.shape)

    def diagonal(self):
        return self._diagonal()


class _CSROperator:
    """hpcgpu's CSRMatrix as an operator, applied by :func:`hpcgpu.kernels.matrix.spmv`."""

    def __init__(self, matrix, backend):
        self.matrix, self.backend = matrix.to_backend(backend), backend
        self.shape, self.dtype = tuple(matrix.shape), np.dtype(matrix.data.dtype)

    def matvec(self, x):
        return spmv(self.matrix, x.reshape(-1), backend=self.backend).reshape(x.shape)

    def diagonal(self):
        return self.matrix.diagonal()
