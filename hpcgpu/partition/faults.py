"""How the client of a partitioned run judges a failing epoch: how long it may take, which errors mean a lost worker.

Deadlines
    Every wait of the client for an epoch ends at a deadline
    (:func:`epoch_deadline`): :data:`DEADLINE_SLACK` times the time the
    epoch is expected to take (its steps at the speed measured on the
    epochs before it), and never less than a floor: the
    ``epoch_deadline`` argument of
    :class:`~hpcgpu.partition.engine.PartitionedExecutor`, else
    :data:`DEADLINE_ENV` in the client's environment, else
    :data:`DEFAULT_DEADLINE_S` (:func:`deadline_floor`). An epoch whose
    speed is not known yet (the first of a run, or the first with a kind of
    work no epoch had before, the first diagnostics: they may compile
    kernels) may also take as long as a rank's wait timeout. Past the deadline the
    client aborts every rank and raises
    :class:`~hpcgpu.errors.EpochDeadline`, naming the ranks not done and
    what each was doing (:mod:`hpcgpu.partition.rank_activity`).

Lost workers
    Told by the type of the error, never by its words
    (:func:`is_lost_worker`): dask's :class:`~distributed.scheduler.KilledWorker`,
    a closed connection (:class:`~distributed.comm.core.CommClosedError`),
    a cancelled future (its data went with its worker), and hpcgpu's own
    :class:`~hpcgpu.errors.WorkerLost`. A rank's error whose message
    happens to say "lost" or "cancelled" is that rank's error.

Examples
--------
>>> epoch_deadline(expected=2.0, floor=30.0)   # a short epoch: the floor
30.0
>>> epoch_deadline(expected=20.0, floor=30.0)  # a long one: ten times its expected time
200.0
>>> is_lost_worker(ValueError("the connection was lost")), is_lost_worker(WorkerLost("gone"))
(False, True)
"""

import asyncio
import concurrent.futures
import math
import os

from hpcgpu.errors import CommAborted, CommError, ConfigError, EpochDeadline, WorkerLost

__all__ = ["DEADLINE_ENV", "DEADLINE_SLACK", "DEFAULT_DEADLINE_S", "deadline_error", "deadline_floor",
           "epoch_deadline", "is_lost_worker", "root_cause"]

DEADLINE_ENV = "HPCGPU_EPOCH_DEADLINE_S"
"""Environment variable (on the client): the floor of every epoch's deadline, in seconds (> 0)."""
DEFAULT_DEADLINE_S = 60.0
"""The floor of an epoch's deadline when neither the executor's argument nor :data:`DEADLINE_ENV` sets one:
far above an epoch's half second of work, so that only a stuck rank reaches it."""
DEADLINE_SLACK = 10.0
"""An epoch may take this many times its expected time (a busy node, a slow step) before it is stuck."""


def deadline_floor(value=None):
    """The floor of every epoch's deadline in seconds: ``value``, else :data:`DEADLINE_ENV`, else the default.

    Raises
    ------
    ConfigError
        ``value`` (or the environment variable) is not a positive finite number of seconds.

    Examples
    --------
    >>> deadline_floor(5)
    5.0
    >>> deadline_floor(-1)
    Traceback (most recent call last):
    ...
    hpcgpu.errors.ConfigError: epoch_deadline must be a positive finite number of seconds; got -1
    """
    name = "epoch_deadline"
    if value is None:
        value = os.environ.get(DEADLINE_ENV)
        if value is None:
            return DEFAULT_DEADLINE_S
        name = DEADLINE_ENV
    try:
        seconds = float(value) if not isinstance(value, bool) else math.nan
    except (TypeError, ValueError):
        seconds = math.nan
    if not (math.isfinite(seconds) and seconds > 0):
        raise ConfigError(f"{name} must be a positive finite number of seconds; got {value!r}")
    return seconds


def epoch_deadline(expected, floor, unmeasured=0.0):
    """Seconds an epoch may take: :data:`DEADLINE_SLACK` times ``expected``, at least ``floor``.

    See :func:`deadline_why` for the words that say which rule set it.

    Parameters
    ----------
    expected : float or None
        The epoch's expected seconds (its steps at the measured speed);
        None when no epoch has been measured yet.
    floor : float
        The least deadline (:func:`deadline_floor`).
    unmeasured : float
        The least deadline of an epoch whose speed is unknown (the rank's
        wait timeout: the first epoch compiles its kernels).
    """
    if expected is None:
        return max(floor, unmeasured)
    return max(floor, DEADLINE_SLACK * expected)


def _lost_worker_types():
    types = [WorkerLost, concurrent.futures.CancelledError, asyncio.CancelledError]
    try:
        from distributed.comm.core import CommClosedError
        from distributed.scheduler import KilledWorker

        types += [KilledWorker, CommClosedError]
    except ImportError:  # pragma: no cover - dask is a dependency of the partitioned runs
        pass
    return tuple(types)


def is_lost_worker(error):
    """Whether ``error`` says a worker was lost (by its type: see the module doc).

    ``distributed.client.FutureCancelledError`` is a
    ``concurrent.futures.CancelledError``; a worker dask gave up on raises
    ``KilledWorker``; a connection to a dead worker ``CommClosedError``.
    """
    return isinstance(error, _lost_worker_types())


def deadline_why(expected, floor, floor_source):
    """Which rule of :func:`epoch_deadline` set an epoch's deadline, in words (``floor_source``: who set the floor)."""
    if expected is None:
        return f"its speed is not measured yet: a rank's wait timeout, at least the floor {floor:g} s"
    if DEADLINE_SLACK * expected > floor:
        return f"{DEADLINE_SLACK:g} times its expected {expected:.3g} s"
    return f"the floor, set by {floor_source}"


def deadline_error(what, seconds, why, pending, answers, owner):
    """The :class:`~hpcgpu.errors.EpochDeadline` of ``what`` (an epoch, a round), every rank aborted.

    Parameters
    ----------
    what : str
        What passed its deadline ("run-a: epoch 7 (steps 400 to 416)").
    seconds : float
        The deadline; ``why`` says which rule set it.
    pending : dict
        ``{worker: [its ranks]}`` of the workers whose task of ``what`` had not finished.
    answers : dict
        ``{worker: {rank: what it does}}`` as the session's workers
        answered (:func:`~hpcgpu.partition.rank_activity.activity_here`);
        an exception, or nothing, where a worker did not. Every rank
        running is named, of ``what`` or of the epoch after it.
    owner : sequence of str
        The worker of each rank.
    """
    doing = {}
    for found in answers.values():
        if isinstance(found, dict):
            doing.update(found)
    for worker, mine in pending.items():
        found = answers.get(worker)
        if not isinstance(found, dict):
            doing.update((rank, "its worker did not answer (gone, or its event loop is blocked)") for rank in mine)
        elif not any(rank in found for rank in mine):
            doing.update((rank, "not running: not started (its worker's thread is busy with another task), or "
                                "just finished") for rank in mine)
    ranks = sorted(doing)
    listed = "; ".join(f"rank {rank} on {owner[rank]}: {doing[rank]}" for rank in ranks)
    return EpochDeadline(
        f"{what} did not finish within its deadline of {seconds:.3g} s ({why}); every rank was aborted. Not done: "
        f"{listed or 'none (it finished as the deadline passed)'}. A rank stuck in compute keeps its worker's "
        "thread until it returns (client.restart_workers() frees it); the deadline's floor is the epoch_deadline "
        f"argument or {DEADLINE_ENV}", ranks=ranks, doing=doing, deadline=seconds)


def root_cause(errors):
    """The error to report of a failed epoch's ``errors`` and its kind: ``"own"``, ``"lost"`` or ``"comm"``.

    A rank's own error first (whatever its words), then a lost worker's,
    then a communicator's error, a timeout or a broken link before the
    :class:`~hpcgpu.errors.CommAborted` it caused.

    Examples
    --------
    >>> root_cause([CommAborted("rank 0: aborted"), ValueError("rank 1: the particle was lost")])
    (ValueError('rank 1: the particle was lost'), 'own')
    """
    own = [e for e in errors if not isinstance(e, CommError) and not is_lost_worker(e)]
    if own:
        return own[0], "own"
    lost = [e for e in errors if is_lost_worker(e)]
    if lost:
        return lost[0], "lost"
    return sorted(errors, key=lambda e: isinstance(e, CommAborted))[0], "comm"
