"""Exceptions raised by hpcgpu.

Every error a caller may want to catch derives from :class:`HpcgpuError`.
Messages name the parameter, the value given and what would be valid.
"""

__all__ = [
    "HpcgpuError",
    "ConfigError",
    "GatherTooLarge",
    "GatherWarning",
    "BackendUnavailable",
    "UnstableSimulation",
    "ClusterError",
    "WorkerLost",
    "PeerLost",
    "EpochDeadline",
    "ConvergenceError",
]


class HpcgpuError(Exception):
    """Base class of every error hpcgpu raises on purpose."""


class ConfigError(HpcgpuError, ValueError):
    """A parameter is out of range, of the wrong type, or inconsistent.

    Also a :class:`ValueError`, so generic input handling still catches it.
    """


class GatherTooLarge(ConfigError):
    """The whole state of a partitioned run, gathered to the client, would not fit the client's memory.

    Raised before anything is gathered (``Simulation.state``, a writer that
    needs the whole state); the message names the bytes needed, the bytes
    the client has, and what reads the run without the gather. A
    :class:`ConfigError`, so code that catches those catches it too.

    Attributes
    ----------
    needed : int
        Bytes the gather would take on the client (the blocks and the joined state).
    available : int
        Bytes the client had available.
    """

    def __init__(self, message, *, needed=0, available=0):
        super().__init__(message)
        self.needed = int(needed)
        self.available = int(available)

    def __reduce__(self):
        return (type(self), (self.args[0],), {"needed": self.needed, "available": self.available})


class GatherWarning(UserWarning):
    """A writer gathers the whole state of a partitioned run to the client for each output (warned once per writer)."""


class BackendUnavailable(HpcgpuError, RuntimeError):
    """The requested backend cannot run on this machine.

    The message says what was found (driver, devices, packages) and what to
    do about it.
    """


class ClusterError(HpcgpuError, RuntimeError):
    """A dask cluster cannot be started or reached, or lost a worker mid-run."""


class WorkerLost(ClusterError):
    """A worker of a partitioned run left the cluster (or its ranks were aborted) mid-run: its partitions are gone.

    The one :class:`ClusterError` a :class:`~hpcgpu.simulation.Simulation`
    recovers from (from its last checkpoint, on the workers left); a closed
    or failed run, or a cluster that cannot start, is not.
    """


class EpochDeadline(ClusterError):
    """An epoch (a round of work of every rank) did not finish within its deadline; every rank was aborted.

    Raised by the client of a partitioned run (or of the distributed
    conjugate gradient) when a rank is stuck: in compute (an endless
    kernel), or waiting for a peer that is. Not a lost worker: running the
    same epoch again would get stuck again, so nothing restarts from it.

    Attributes
    ----------
    ranks : tuple of int
        The ranks that had not finished.
    doing : dict
        ``{rank: what it was doing}`` as its worker reported it at the
        deadline ("epoch 7, advancing steps 400 to 416: computing for
        12.0 s", "... waiting 11.9 s for a message from rank 1 tagged
        'halo|...'"); a rank whose worker did not answer is missing.
    deadline : float
        The deadline that passed, in seconds.
    """

    def __init__(self, message, *, ranks=(), doing=None, deadline=float("nan")):
        super().__init__(message)
        self.ranks = tuple(ranks)
        self.doing = dict(doing or {})
        self.deadline = deadline

    def __reduce__(self):
        return (_rebuild_deadline, (self.args[0], self.ranks, self.doing, self.deadline))


def _rebuild_deadline(message, ranks, doing, deadline):
    return EpochDeadline(message, ranks=ranks, doing=doing, deadline=deadline)


class CommError(ClusterError):
    """A communicator between the ranks of a partitioned run failed (a :class:`ClusterError`).

    Attributes
    ----------
    rank : int or None
        The rank that raised it (None on the client).
    """

    def __init__(self, message, *, rank=None):
        super().__init__(message)
        self.rank = rank

    def __reduce__(self):
        return (_rebuild_comm, (type(self), self.args[0], self.rank))


class CommAborted(CommError):
    """The run was aborted on every rank: another rank failed or a worker was lost.

    The message names the rank (or worker) that caused it and why.
    """


class CommTimeout(CommError):
    """A wait for a message or a send took longer than its timeout (a peer hangs or is gone)."""


class PeerLost(WorkerLost, CommError):
    """A rank's peer fell silent: no heartbeat from its worker for longer than the silence limit.

    Both a :class:`WorkerLost` (the run restarts from its last checkpoint on
    the workers left) and a :class:`CommError` (the communicator found it;
    ``rank`` is the rank that noticed). A worker that is stopped (SIGSTOP),
    cut off the network, or frozen keeps its TCP connections open: only its
    silence shows it (:mod:`hpcgpu.partition.heartbeats`).
    """


def _rebuild_comm(kind, message, rank):
    return kind(message, rank=rank)


class ConvergenceError(HpcgpuError, ArithmeticError):
    """An iterative solver stopped without reaching its tolerance.

    Attributes
    ----------
    residuals : list of float
        The relative residual norm after each iteration (the history a
        numerical analyst wants to see: a stall, a blow-up, a non-SPD matrix).
    iterations : int
        Iterations taken.
    """

    def __init__(self, message, *, residuals, iterations):
        super().__init__(message)
        self.residuals = list(residuals)
        self.iterations = iterations

    def __reduce__(self):
        return (_rebuild_convergence, (self.args[0], self.residuals, self.iterations))


def _rebuild_convergence(message, residuals, iterations):
    return ConvergenceError(message, residuals=residuals, iterations=iterations)


class UnstableSimulation(HpcgpuError, FloatingPointError):
    """A run produced non-finite values or exceeded its stability limit.

    Attributes
    ----------
    step : int
        The step at which the problem was detected.
    field : str
        The offending field (or ``"cfl"``).
    cfl : float
        The CFL number at that step (``nan`` when it could not be computed).
    """

    def __init__(self, message, *, step, field, cfl):
        super().__init__(message)
        self.step = step
        self.field = field
        self.cfl = cfl

    def __reduce__(self):
        # Keyword-only attributes need an explicit reduce to cross processes
        # (dask re-raises worker exceptions on the client).
        return (_rebuild_unstable, (self.args[0], self.step, self.field, self.cfl))


def _rebuild_unstable(message, step, field, cfl):
    return UnstableSimulation(message, step=step, field=field, cfl=cfl)
