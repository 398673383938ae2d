"""What each rank of the distributed conjugate gradient runs: its rows, its messages, its iteration.

The client's side (:func:`hpcgpu.linalg.conjugate_gradient`, in
:mod:`hpcgpu.linalg.cg`) splits the matrix with :func:`split`, places the
parts and submits :func:`solve_task` once per worker and round.

Partition ``p`` is rank ``p`` of a communicator session
(:mod:`hpcgpu.partition.dask_communicator`). It holds rows ``[a_p, b_p)`` of the
matrix and the same entries of every vector (x, r, z, p, q). Its rows
reference columns of other partitions; those entries of the search
direction are its *ghosts*, and the partitions that own them send exactly
those entries (the matrix's sparsity fixes the send lists once, as PETSc's
scatter contexts do).

One task per worker, pinned there and never retried, runs the whole solve
for the ranks of that worker (one thread each beyond the first, through
:mod:`hpcgpu.partition.worker_ranks`, as the engine's epochs): the
scheduler sees one task per worker per solve, not a graph of tasks per
iteration. One iteration of rank ``p`` sends two messages to each peer,
directly (worker to worker), and nothing else::

    matvec      q_p = A_p [p_p, ghosts of p]                      local
    message 1   its part of p.q to every rank                     (allgather of one float)
    update      x += alpha p, r -= alpha q, z = D^-1 r            local
    message 2   its parts of r.z and r.r to every rank, with the  (one message per peer)
                entries of z that the peer's rows reference
    direction   p = z + beta p, and the ghosts of p the same way  local

The ghosts of the new direction are not sent after ``beta`` is known: a
partition's ghosts of ``p = z + beta p`` follow from its ghosts of ``z``
(which travel with the sums that give ``beta``) and of the old ``p``, so
every rank updates them itself, with the same elementwise kernel on the
same values as their owner (they stay equal to the owner's entries). That
saves a third message, and its wait, per iteration.

Every rank adds the same partial sums in the same (rank) order with
``math.fsum``, so every rank has the same ``alpha``, ``beta`` and residual,
bitwise, and takes the same decisions (converged, not SPD, not finite,
stalled, ``max_iter``) at the same iteration, with no message about them.
Nothing reaches the client during the solve: at the end rank 0 returns the
residual history and every rank its block of x. The client then checks the
true residual ``b - A x`` (it replaces the last recursive one in the
history, as in :func:`hpcgpu.kernels.matrix.conjugate_gradient`); if
rounding made the two part, CG restarts from there in the same session.

Faults: a rank that raises aborts the session, so every other rank's wait
ends at once, and the client re-raises that rank's own error once every
rank has returned; a worker lost during the solve is a
:class:`~hpcgpu.errors.ClusterError` naming it (the client watches the
session's workers while it waits); a client that stops waiting (an
interrupt) aborts the ranks too, so they do not hold their workers until
they converge. Every wait has a timeout: nothing hangs. Each rank records
the iteration it begins (:mod:`hpcgpu.partition.rank_activity`): when no
rank began one within the deadline's floor, the client aborts them and
raises :class:`~hpcgpu.errors.EpochDeadline` saying what each was doing.
"""

import math
from dataclasses import dataclass

import numpy as np

from hpcgpu.partition.communicator import DEFAULT_TIMEOUT_S
from hpcgpu.partition.rank_activity import recording
from hpcgpu.partition.worker_ranks import aborting_on_failure, run_ranks

__all__ = ["CGPart", "CGJob", "CGRankResult", "split", "solve_task", "STALL_WINDOW", "TIMEOUT_S"]

STALL_WINDOW = 200
"""Iterations without a 1 % drop of the best residual, and without a fall of the A-norm error
beyond rounding, that count as a stall: the default ``stall_window`` of
:func:`hpcgpu.kernels.matrix.conjugate_gradient` (a test holds the two equal), so that both solvers
give up on the same system at the same point. CG's residual may rise for hundreds of iterations
while the error it minimises falls; the error test, not a short window, tells that from a stall."""
TIMEOUT_S = DEFAULT_TIMEOUT_S
"""Longest wait of a rank for one message, in seconds (a hung or lost peer; not the solve's length)."""


@dataclass(frozen=True)
class CGPart:
    """The static piece of one partition: its rows (local column numbering) and its send lists."""

    matrix: object        # CSRMatrix (rows, own + ghosts): own columns first, then ghosts in owner order
    inverse_diagonal: object  # None without a preconditioner
    sends: tuple          # ((partition, indices of own entries it needs), ...)
    receives: tuple       # partitions whose entries are this part's ghosts, in ghost order
    ghost_counts: tuple   # how many ghosts each of ``receives`` owns


@dataclass(frozen=True)
class CGJob:
    """What every rank of one round (a CG run from one start) needs besides its part."""

    session: object
    backend: str
    tol: float
    b_norm: float
    max_iter: int
    start: int            # iterations before this round
    best: float           # best relative residual so far, and the iteration it was reached
    best_at: int
    round: int
    # the stall test's state carried over from the rounds before (as the single-process solver keeps
    # it over its restarts): a restart must not make a stalled solve look new. energy: the last
    # ``stall_window + 1`` running sums of the A-norm error's fall, all the test reads
    energy: tuple = (0.0,)
    stall_window: int = STALL_WINDOW


@dataclass(frozen=True)
class CGRankResult:
    x: object             # this rank's block of x (host), None after a failure
    history: list         # relative residual after each iteration of the round (rank 0 only)
    iterations: int       # iterations counted from the first round
    failure: str          # why CG stopped without converging, or None
    best: float = None    # the stall test's state at the end, for the next round's CGJob
    best_at: int = None
    energy: tuple = None


def split(matrix, bounds, jacobi=True):
    """The :class:`CGPart` of each row block ``bounds`` of a host CSR matrix."""
    from hpcgpu.kernels.matrix import CSRMatrix

    data, indices, indptr = (np.asarray(a) for a in (matrix.data, matrix.indices, matrix.indptr))
    starts = np.array([a for a, _ in bounds])
    diagonal = np.asarray(matrix.diagonal())
    needs = {}
    pieces = []
    for p, (a, b) in enumerate(bounds):
        lo, hi = int(indptr[a]), int(indptr[b])
        columns = indices[lo:hi].astype(np.int64)
        own = (columns >= a) & (columns < b)
        external = np.unique(columns[~own])
        owners = np.searchsorted(starts, external, side="right") - 1
        local = np.where(own, columns - a, (b - a) + np.searchsorted(external, columns))
        receives, counts = (tuple(int(v) for v in values) for values in np.unique(owners, return_counts=True))
        for q in receives:
            needs.setdefault(q, []).append((p, external[owners == q] - starts[q]))
        local_matrix = CSRMatrix(data[lo:hi], local, indptr[a:b + 1] - lo, shape=(b - a, (b - a) + len(external)))
        pieces.append((local_matrix, 1.0 / diagonal[a:b] if jacobi else None, receives, counts))
    return [CGPart(m, d, tuple((p, idx.astype(np.int64)) for p, idx in needs.get(q, [])), r, c)
            for q, (m, d, r, c) in enumerate(pieces)]


# -- the ranks ------------------------------------------------------------------------------------
def _sum_over_ranks(comm, value):
    """``value`` summed over all ranks, the same bitwise on every rank."""
    return math.fsum(comm.allgather(value))


class _Neighbours:
    """One rank's combined message of each iteration: its partial sums to every rank, ghosts to those that need them.

    The ghosts of the new direction ``p = z + beta p`` are the ghosts of
    ``z`` and of the old ``p`` combined with ``beta``, and ``z`` is known
    before the sums that give ``beta``: so the entries of ``z`` a neighbour
    references travel in the same message as the sums, and every rank
    updates its ghosts of ``p`` itself. One message per peer and iteration
    instead of two (a reduction, then a ghost exchange that waits for it).
    """

    def __init__(self, comm, part, backend, tag):
        self.comm, self.tag, self.backend = comm, tag, backend
        self.peers = [q for q in range(comm.size) if q != comm.rank]
        self.sends = {dest: backend.asarray(index) for dest, index in part.sends}
        rows = part.matrix.shape[0]
        self.slices = {}
        for source, count in zip(part.receives, part.ghost_counts):
            self.slices[source] = slice(rows, rows + count)
            rows += count

    def share(self, sums, z):
        """``(totals of sums over all ranks, {source: its entries of z that this rank's rows reference})``."""
        if not self.peers:
            return sums, {}
        outgoing = {q: (sums, z[self.sends[q]] if q in self.sends else None) for q in self.peers}
        received = self.comm.exchange(outgoing, self.peers, self.tag)
        received[self.comm.rank] = (sums, None)
        # every rank adds the same values in the same (rank) order: the same totals bitwise
        totals = tuple(math.fsum(received[q][0][i] for q in range(self.comm.size)) for i in range(len(sums)))
        return totals, {source: self.backend.asarray(received[source][1]) for source in self.slices}


def _cg_rank(comm, part, x, r, job, activity=None):
    """CG on one rank from its blocks ``x``, ``r`` (host) until every rank stops; its :class:`CGRankResult`.

    ``activity`` (:class:`~hpcgpu.partition.rank_activity.RankActivity`)
    records each iteration: the client's sign of progress.
    """
    from hpcgpu.backends import get_backend
    from hpcgpu.kernels.matrix import axpy, dot, error_stalled, spmv

    backend = get_backend(job.backend)
    xp = backend.xp
    A = part.matrix.to_backend(backend)
    inverse = None if part.inverse_diagonal is None else backend.asarray(part.inverse_diagonal)
    neighbours = _Neighbours(comm, part, backend, ("cg", job.round))
    rows, columns = A.shape
    # copies: the blocks arrive in read-only buffers, and x and r are updated in place
    x, r = xp.array(backend.asarray(x)), xp.array(backend.asarray(r))
    # the direction is the head of the product's input, its ghosts behind it: no concatenate per product
    full = xp.zeros(columns, dtype=r.dtype)
    p = full[:rows]
    q = xp.empty_like(r)
    z = r if inverse is None else inverse * r

    def share_residual():
        """``(r.z, r.r)`` over all ranks and the neighbours' entries of ``z``."""
        if z is r:
            (rr,), ghosts = neighbours.share((dot(r, r, backend=backend),), z)
            return rr, rr, ghosts
        (rz, rr), ghosts = neighbours.share((dot(r, z, backend=backend), dot(r, r, backend=backend)), z)
        return rz, rr, ghosts

    rz, _, ghosts = share_residual()
    p[...] = z
    for source, where in neighbours.slices.items():
        full[where] = ghosts[source]
    k, best, best_at, history, failure = job.start, job.best, job.best_at, [], None
    # running sum of alpha (r . z) since the first round: the fall of ||e||_A^2, the same on every rank
    # (a round starts where the last one ended, so the sums of the rounds add up)
    energy, rounding = list(job.energy), float(np.finfo(r.dtype).eps)
    window = job.stall_window
    while True:
        if activity is not None:
            activity.set(f"round {job.round + 1} of the conjugate gradient, iteration {k + 1}")
        spmv(A, full, out=q, backend=backend)
        pq = _sum_over_ranks(comm, dot(p, q, backend=backend))
        if not pq > 0:
            failure = f"p.A p = {pq:.3e} <= 0: the matrix is not symmetric positive definite"
            break
        alpha = rz / pq
        if not math.isfinite(alpha):
            failure = f"the step length rz / p.A p = {rz:.3e} / {pq:.3e} is not finite"
            break
        axpy(alpha, p, x, out=x, backend=backend)
        axpy(-alpha, q, r, out=r, backend=backend)
        if z is not r:
            xp.multiply(inverse, r, out=z)
        rz_new, rr, ghosts = share_residual()
        k += 1
        history.append(math.sqrt(max(rr, 0.0)) / job.b_norm)
        energy.append(energy[-1] + alpha * rz)
        if not (math.isfinite(history[-1]) and math.isfinite(rz_new)):
            failure = "the residual is not finite"
            break
        # the best is updated before the convergence test, as in the single-process solver: the round's
        # last residual counts towards the next round's stall test
        if history[-1] < 0.99 * best:
            best, best_at = history[-1], k
        if history[-1] <= job.tol:
            break
        if k - best_at >= window and error_stalled(energy, window, rounding):
            failure = (f"stalled: no 1 % progress in the last {window} iterations (the tolerance may be "
                       f"below the rounding floor of {np.dtype(r.dtype).name}, or the system is inconsistent)")
            break
        if k >= job.max_iter:
            failure = f"max_iter={job.max_iter} reached without convergence"
            break
        beta = rz_new / rz if rz > 0 else 0.0
        if not math.isfinite(beta):
            failure = f"the direction update r.z_new / r.z = {rz_new:.3e} / {rz:.3e} is not finite"
            break
        # the owners update the same entries with the same kernel: ghosts stay equal to their p
        axpy(beta, p, z, out=p, backend=backend)
        for source, where in neighbours.slices.items():
            axpy(beta, full[where], ghosts[source], out=full[where], backend=backend)
        rz = rz_new
    backend.synchronize()
    return CGRankResult(None if failure else backend.to_host(x), history if comm.rank == 0 else None, k, failure,
                        best, best_at, tuple(energy[-(window + 1):]))


def _run_rank(job, rank, part, x, r, worker):
    """One rank's solve; a rank that raises aborts the session first, so that no other rank waits for it."""
    from hpcgpu.partition.dask_communicator import communicator

    comm = None
    with aborting_on_failure(job.session, rank, worker, lambda: comm), recording(job.session.id, rank) as activity:
        comm = communicator(job.session, rank, worker)
        activity.comm = comm
        return _cg_rank(comm, part, x, r, job, activity)


def solve_task(job, ranks, parts, blocks):
    """The solve of the ranks on this worker (one thread each beyond the first); their results in order."""
    from distributed import get_worker

    worker = get_worker()  # the rank threads are not task threads: they get it from here
    return run_ranks(ranks, lambda k: _run_rank(job, ranks[k], parts[k], *blocks[k], worker), name="hpcgpu-cg-rank")
