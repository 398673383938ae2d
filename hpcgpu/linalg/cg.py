"""Conjugate gradient with the rows of a sparse matrix spread over dask workers: the client's side.

:func:`conjugate_gradient` checks its input, splits the matrix into row
blocks (:func:`hpcgpu.linalg.cg_ranks.split`), opens a communicator session
on the workers, places each block on its worker once and submits one pinned
task per worker and round (:func:`hpcgpu.linalg.cg_ranks.solve_task`). It
watches the session's workers while the ranks iterate, checks the true
residual ``b - A x`` after each round and restarts from there when rounding
made it part from the recursive one. What a rank does, and how the ranks
keep their decisions identical, is told in :mod:`hpcgpu.linalg.cg_ranks`.
"""

import math
import time
import uuid

import numpy as np

from hpcgpu.cluster import worker_info
from hpcgpu.errors import ClusterError, CommError, ConfigError, ConvergenceError, WorkerLost
from hpcgpu.linalg import cg_ranks
from hpcgpu.partition.epoch_watch import watched_gather
from hpcgpu.partition.faults import DEADLINE_ENV, deadline_error, deadline_floor
from hpcgpu.partition.layout import split_rows
from hpcgpu.partition.rank_activity import activity_here, operations_here
from hpcgpu.partition.worker_ranks import abort_session_here
from hpcgpu.validation import check_int, check_relative_tolerance

__all__ = ["conjugate_gradient"]

_POLL_S = 1.0
"""How often the client, waiting for the ranks, checks that the session's workers are alive."""
_SETTLE_S = 5.0
"""How long the client waits, after a rank failed, for the others to return (an abort releases them at once)."""


def conjugate_gradient(matrix, b, *, client, partitions=None, x0=None, tol=1e-8, max_iter=None,
                       preconditioner="jacobi", backend="auto", check_every=8, max_restarts=3):
    """Solve ``A x = b`` (A sparse, symmetric positive definite) with rows spread over the workers.

    Parameters
    ----------
    matrix : hpcgpu.kernels.matrix.CSRMatrix or scipy.sparse matrix
        Square, symmetric positive definite.
    b : array (n,)
    client : distributed.Client
    partitions : int, optional
        Row blocks (default: one per worker).
    x0 : array (n,), optional
        Initial guess (default zero).
    tol : float
        Stop when ``||b - A x|| <= tol ||b||``; in (0, 1), checked as the
        single-process solver checks it (:func:`hpcgpu.validation.check_relative_tolerance`).
    max_iter : int, optional
        Default ``10 n``.
    preconditioner : {"jacobi", None}
    backend : str
        Backend of the local kernels on each worker.
    check_every : int
        Kept for compatibility, no longer used (>= 1): the ranks test for
        convergence every iteration on the workers, at no extra cost (the
        residual norm travels with the dot products the iteration reduces
        anyway).
    max_restarts : int
        Times a round whose worker was lost is solved again on the workers
        left (>= 0): the same row blocks from the round's start, which the
        client holds, so the answer is bitwise the undisturbed one; a
        ``RuntimeWarning`` says so each time.

    Returns
    -------
    hpcgpu.kernels.matrix.CGResult
        ``x`` (gathered to the client), iterations, the relative residual history, converged.

    Raises
    ------
    ConvergenceError
        A non-positive curvature ``p.Ap`` (not SPD), a non-finite residual,
        a stall or ``max_iter`` reached; it carries the residual history
        and the iterations.
    ConfigError
        Bad shapes, dtypes or parameters.
    WorkerLost
        A worker lost during the solve (named) more than ``max_restarts``
        times, or with no worker left (a :class:`ClusterError`).
    ClusterError
        No workers. An error
        raised on one partition ends every partition at once and is
        re-raised here.
    EpochDeadline
        No rank began an iteration within the deadline's floor
        (``HPCGPU_EPOCH_DEADLINE_S``, default 60 s; see
        :mod:`hpcgpu.partition.faults`): a rank is stuck; every rank was
        aborted and the error names what each was doing.

    Examples
    --------
    >>> import scipy.sparse as sp  # doctest: +SKIP
    >>> A = sp.diags([-1.0, 4.0, -1.0], [-1, 0, 1], shape=(1000, 1000), format="csr")  # doctest: +SKIP
    >>> result = conjugate_gradient(A, np.ones(1000), client=client, tol=1e-10)  # doctest: +SKIP
    >>> result.converged, bool(np.abs(A @ result.x - 1).max() < 1e-7)  # doctest: +SKIP
    (True, True)
    """
    from hpcgpu.kernels import matrix as kernels
    from hpcgpu.kernels.matrix import CGResult
    from hpcgpu.partition.dask_session import close_session, open_session

    A = _host_csr(matrix)
    n = A.shape[0]
    if A.shape[0] != A.shape[1]:
        raise ConfigError(f"matrix must be square; got shape {A.shape}")
    b = np.asarray(b)
    if b.shape != (n,):
        raise ConfigError(f"b must have shape ({n},) to match the matrix; got {b.shape}")
    if b.dtype != A.dtype:
        raise ConfigError(f"b must have the matrix's dtype {A.dtype}; got {b.dtype}")
    tol = check_relative_tolerance("tol", tol)
    max_iter = 10 * n if max_iter is None else check_int("max_iter", max_iter, minimum=1)
    check_int("check_every", check_every, minimum=1)
    max_restarts = check_int("max_restarts", max_restarts, minimum=0)
    if preconditioner not in ("jacobi", None):
        raise ConfigError(f"preconditioner must be 'jacobi' or None; got {preconditioner!r}")
    workers = sorted(worker_info(client))
    if not workers:
        raise ClusterError("the dask cluster has no workers")
    partitions = len(workers) if partitions is None else check_int("partitions", partitions, minimum=1,
                                                                   maximum=n)
    diagonal = np.asarray(A.diagonal())
    if preconditioner == "jacobi" and not np.all(diagonal > 0):
        raise ConfigError("preconditioner='jacobi' needs a positive diagonal (an SPD matrix has one); "
                          f"the smallest diagonal entry is {diagonal.min():.3g}")
    b_norm = math.sqrt(kernels.dot(b, b, backend="numpy"))
    if b_norm == 0:
        return CGResult(np.zeros_like(b), 0, (0.0,), True)
    if not math.isfinite(b_norm):
        raise ConfigError("b holds NaN or inf")
    x = np.zeros_like(b) if x0 is None else np.asarray(x0, dtype=b.dtype).copy()
    if x.shape != (n,):
        raise ConfigError(f"x0 must have shape ({n},); got {x.shape}")
    r = b - kernels.spmv(A, x, backend="numpy")
    history = [math.sqrt(kernels.dot(r, r, backend="numpy")) / b_norm]
    if history[-1] <= tol:
        return CGResult(x, 0, tuple(history), True)
    if not math.isfinite(history[-1]):
        _fail("the residual b - A x is not finite (check x0)", history, 0, tol)
    bounds = split_rows(n, [1.0] * partitions)
    parts = cg_ranks.split(A, bounds, jacobi=preconditioner == "jacobi")
    owner = [workers[p % len(workers)] for p in range(partitions)]
    name = backend if isinstance(backend, str) else backend.name
    session = open_session(client, owner, cg_ranks.TIMEOUT_S)
    solver = None
    try:
        iterations = 0
        # the stall test's state lives across rounds, as across the single-process solver's restarts: a
        # round that restarts from the true residual at the rounding floor must not start a fresh window
        # (each round used to, and a tolerance below the floor ran to max_iter instead of stalling)
        stall = dict(best=history[0], best_at=0, energy=(0.0,))
        restarts = []
        while True:
            try:
                if solver is None:
                    solver = _Solver(client, session, owner, bounds, parts, name)
                job = cg_ranks.CGJob(session, name, tol, b_norm, max_iter, iterations, round=solver.rounds,
                                     stall_window=cg_ranks.STALL_WINDOW, **stall)
                found, iterations, failure, x, stall = solver.run(job, x, r)
            except WorkerLost as lost:
                if len(restarts) >= max_restarts:
                    raise
                restarts.append(lost)
                # the round again, from the x and r the client holds, on the workers left
                solver, session = _restart(client, solver, session, bounds, parts, partitions, name, lost,
                                           len(restarts))
                continue
            history.extend(found)
            if failure is not None:
                _fail(failure, history, iterations, tol)
            # the recursive residual drifts from b - A x in finite precision: check the true one, which
            # replaces it in the history (as in the single-process solver)
            r = b - kernels.spmv(A, x, backend="numpy")
            history[-1] = math.sqrt(kernels.dot(r, r, backend="numpy")) / b_norm
            if history[-1] <= tol:
                return CGResult(x, iterations, tuple(history), True)
    finally:
        if solver is not None:
            solver.release()
        close_session(client, session)


def _restart(client, solver, session, bounds, parts, partitions, backend, lost, count):
    """A new session and solver on the workers left, at the failed round; ``(solver, session)``.

    ``solver`` is None when the loss came while the first one was being
    made. The new ones are made before the old ones go, so that whatever
    fails here leaves the caller holding a session it can close.
    """
    import warnings

    from hpcgpu.partition.dask_session import close_session, open_session

    workers = sorted(worker_info(client))
    if not workers:
        raise WorkerLost(f"{lost}; no worker is left to solve on") from lost
    owner = [workers[p % len(workers)] for p in range(partitions)]
    fresh_session = open_session(client, owner, cg_ranks.TIMEOUT_S)
    try:
        fresh = _Solver(client, fresh_session, owner, bounds, parts, backend)
    except BaseException:
        close_session(client, fresh_session)
        raise
    failed_round = solver.rounds if solver is not None else 1
    fresh.rounds = failed_round - 1  # the failed round is solved again under its own number
    try:
        if solver is not None:
            solver.release()
        close_session(client, session)
    except Exception:  # noqa: BLE001 - the old session's worker is gone; the rest is best effort
        pass
    warnings.warn(f"{lost}; restart {count}: round {failed_round} solved again on {len(workers)} worker(s)",
                  RuntimeWarning, stacklevel=3)
    return fresh, fresh_session


def _host_csr(matrix):
    from hpcgpu.kernels.matrix import CSRMatrix

    if isinstance(matrix, CSRMatrix):
        return matrix if not matrix.on_gpu else matrix.to_backend("numpy")
    if hasattr(matrix, "tocsr"):
        return CSRMatrix.from_scipy(matrix.tocsr())
    raise ConfigError(f"matrix must be a CSRMatrix or a scipy.sparse matrix; got {type(matrix).__name__}")


class _Solver:
    """The client's side of one solve: the parts resident on their workers, rounds submitted and watched."""

    def __init__(self, client, session, owner, bounds, parts, backend):
        self.client, self.session, self.owner, self.bounds = client, session, owner, bounds
        self.token = uuid.uuid4().hex[:12]
        self.rounds = 0
        self.ranks = {}
        for rank, worker in enumerate(owner):
            self.ranks.setdefault(worker, []).append(rank)
        # the matrix blocks travel once per solve, not once per round
        self.parts = {worker: self._scatter([parts[r] for r in ranks], worker)
                      for worker, ranks in self.ranks.items()}

    def _scatter(self, data, worker):
        """``data`` onto ``worker``; a worker gone meanwhile is a :class:`~hpcgpu.errors.WorkerLost`."""
        try:
            return self.client.scatter(data, workers=[worker], hash=False)
        except OSError as error:  # distributed's CommClosedError is one
            missing, until = self._missing(), time.monotonic() + _SETTLE_S
            while not missing and time.monotonic() < until:  # the scheduler may not have seen it go yet
                time.sleep(_POLL_S)
                missing = self._missing()
            if missing:
                raise WorkerLost(f"distributed conjugate gradient: worker {', '.join(missing)} left the cluster "
                                 "during the solve; its rows are gone") from error
            raise

    def release(self):
        """Drop the parts from the workers' memory."""
        self.client.cancel([future for futures in self.parts.values() for future in futures])
        self.parts = {}

    def run(self, job, x, r):
        """One round from ``x`` (residual ``r``); ``(history, iterations, failure, x, stall state)``."""
        self.rounds += 1
        futures = []
        for k, (worker, ranks) in enumerate(self.ranks.items()):
            blocks = self._scatter([(x[a:b], r[a:b]) for a, b in (self.bounds[rank] for rank in ranks)], worker)
            futures.append(self.client.submit(
                cg_ranks.solve_task, job, ranks, self.parts[worker], blocks,
                key=(f"cg-solve-{self.token}", job.round, k), workers=[worker], allow_other_workers=False,
                pure=False, retries=0))
        try:
            self._wait(futures)
        except BaseException as error:
            # a whole solve is one task: ranks left running (the client was interrupted, or gave up on a
            # lost worker) would hold their workers until they converge; the abort stops them at their next wait
            self._abort(f"the client stopped waiting: {type(error).__name__}: {error}")
            raise
        results = [None] * len(self.owner)
        def lost(why):
            raise WorkerLost(f"distributed conjugate gradient: a worker was lost during the solve ({why}); "
                             "its rows are gone")

        for ranks, found in zip(self.ranks.values(), watched_gather(self.client, futures, self.owner, lost)):
            for rank, result in zip(ranks, found):
                results[rank] = result
        first = results[0]
        # every rank took the same decisions on the same values: rank 0's stall state is everyone's
        stall = dict(best=first.best, best_at=first.best_at, energy=first.energy)
        if first.failure is not None:
            return first.history, first.iterations, first.failure, x, stall
        return first.history, first.iterations, None, np.concatenate([result.x for result in results]), stall

    def _abort(self, reason):
        alive = sorted(set(self.owner) & set(worker_info(self.client)))
        try:
            self.client.run(abort_session_here, self.session.id, reason, workers=alive)
        except Exception:  # noqa: BLE001 - best effort: the ranks also stop at their timeout
            pass

    def _missing(self):
        return sorted(set(self.owner) - set(worker_info(self.client)))

    def _wait(self, futures):
        """Wait for every rank, watching the session's workers and their progress; raise the root cause of a failure.

        A round has no expected length (it runs to convergence), so its
        deadline is on progress: when no rank began an iteration within the
        floor of :func:`hpcgpu.partition.faults.deadline_floor` (checked
        every floor seconds, so within twice it), the ranks are stuck:
        :class:`~hpcgpu.errors.EpochDeadline` names them (the caller aborts them).
        """
        from distributed import wait

        floor = deadline_floor()
        checked, seen = time.monotonic(), {}
        while True:
            pending = [f for f in futures if f.status == "pending"]
            try:  # wakes on the first to finish or fail (dask has no FIRST_EXCEPTION)
                wait(pending, timeout=_POLL_S, return_when="FIRST_COMPLETED")
            except Exception:  # noqa: BLE001 - a timeout (not done yet) or cancelled futures (seen below)
                pass
            if any(f.status in ("error", "cancelled", "lost") for f in futures):
                self._raise_failure(futures)
            if all(f.status == "finished" for f in futures):
                return
            missing = self._missing()
            if missing:
                self.client.cancel(futures)
                raise WorkerLost(f"distributed conjugate gradient: worker {', '.join(missing)} left the cluster "
                                 "during the solve; its rows are gone")
            if time.monotonic() - checked >= floor:
                checked, last = time.monotonic(), seen
                seen = self._ask(operations_here)
                if seen == last:
                    self._stuck(futures, floor)

    def _ask(self, function):
        """``function(session id)`` on the session's workers: ``{worker: answer}`` (an exception where one failed)."""
        try:
            return self.client.run(function, self.session.id, workers=sorted(self.ranks), on_error="return")
        except Exception:  # noqa: BLE001 - a gone worker is seen by _missing
            return {}

    def _stuck(self, futures, floor):
        """No rank began an iteration within ``floor`` seconds: the EpochDeadline naming the ranks not done."""
        pending = {w: ranks for (w, ranks), f in zip(self.ranks.items(), futures) if f.status != "finished"}
        self.client.cancel(futures)
        raise deadline_error(f"distributed conjugate gradient: round {self.rounds}", floor,
                             f"no rank began an iteration within the floor, set by {DEADLINE_ENV} or the default",
                             pending, self._ask(activity_here), self.owner)

    def _raise_failure(self, futures):
        """Raise the error of the rank that failed (not the aborts it caused) once every rank has returned."""
        from distributed import wait
        from distributed.scheduler import KilledWorker

        try:
            wait(futures, timeout=_SETTLE_S)  # the abort released the other ranks: they return at once
        except Exception:  # noqa: BLE001 - dask's TimeoutError: report what there is
            pass
        errors = []
        for future in futures:
            if future.status == "error":
                try:
                    errors.append(future.exception(timeout=10))
                except Exception as error:  # noqa: BLE001 - the future went away with its worker
                    errors.append(error)
        missing = self._missing()
        self.client.cancel(futures)
        own = [e for e in errors if not isinstance(e, (CommError, KilledWorker))]
        if own:
            raise own[0]
        if missing:
            raise WorkerLost(f"distributed conjugate gradient: worker {', '.join(missing)} left the cluster "
                             "during the solve; its rows are gone")
        if not errors:
            raise ClusterError("distributed conjugate gradient: the solve's tasks were "
                               f"{', '.join(sorted({f.status for f in futures}))} before they finished")
        raise ClusterError("distributed conjugate gradient: a rank failed or a worker was lost during the solve "
                           f"({type(errors[0]).__name__}: {errors[0]})") from errors[0]


def _fail(reason, history, k, tol):
    raise ConvergenceError(f"distributed conjugate gradient stopped after {k} iteration(s): {reason}; relative "
                           f"residual {history[-1]:.3e} (best {min(history):.3e}), tol {tol:.3e}",
                           residuals=history, iterations=k)
