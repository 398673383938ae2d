"""A worker's ranks of a session: one function run per rank, each in a thread of its own, and their aborts.

A task pinned to a worker runs every rank of a session that the worker
holds (several where there are more partitions than workers). The
engine's epochs (:func:`hpcgpu.partition.epochs.epoch_task`) and the
distributed conjugate gradient (:func:`hpcgpu.linalg.cg_ranks.solve_task`)
both run their ranks through this module:

- :func:`run_ranks` calls the rank function once per rank, the first in the
  task's own thread and the others in threads of their own, and raises the
  root cause of a failure first (an error that is not the
  :class:`~hpcgpu.errors.CommAborted` another rank's abort caused);
- :func:`aborting_on_failure` guards one rank: any error but the
  :class:`~hpcgpu.errors.CommAborted` of an abort already under way (a
  rank's own error, a wait past its timeout) aborts the session before it
  propagates, so that no other rank waits for this one until its timeout;
- :func:`abort_session_here` aborts the session's ranks on this worker
  from the client (``client.run``), which has no rank to abort from, and
  the transports' own state of the session (:func:`on_session_abort`:
  NCCL's communicators, through ``ncclCommAbort``).

Examples
--------
>>> from hpcgpu.partition.worker_ranks import run_ranks
>>> run_ranks([4, 7], lambda k: f"rank at index {k}")
['rank at index 0', 'rank at index 1']
"""

import contextlib
import threading

from hpcgpu.errors import CommAborted

__all__ = ["abort_session_here", "aborting_on_failure", "on_session_abort", "raise_root_cause", "run_ranks"]

_session_aborters = []


def run_ranks(ranks, run_one, name="hpcgpu-rank"):
    """``[run_one(0), run_one(1), ...]``, one call per rank of ``ranks``, each rank in a thread of its own.

    The first rank runs in the calling thread (a task's: a single rank
    starts no thread). Every rank finishes before the result or the error
    comes back; the error is the root cause (:func:`raise_root_cause`).

    Parameters
    ----------
    ranks : sequence of int
        The ranks this worker runs (names the threads).
    run_one : callable
        ``run_one(k)`` runs the rank at index ``k`` of ``ranks``; its result
        goes to index ``k`` of the list returned.
    name : str
        Prefix of the threads' names (``"{name}-{rank}"``), seen in stack dumps.

    Returns
    -------
    list
        The results in the order of ``ranks``.

    Examples
    --------
    >>> run_ranks([0, 1, 2], lambda k: k * k)
    [0, 1, 4]
    """
    if len(ranks) == 1:
        return [run_one(0)]
    results, errors = [None] * len(ranks), [None] * len(ranks)

    def one(k):
        try:
            results[k] = run_one(k)
        except BaseException as error:  # noqa: BLE001 - re-raised below, the root cause first
            errors[k] = error

    threads = [threading.Thread(target=one, args=(k,), name=f"{name}-{rank}") for k, rank in enumerate(ranks)]
    for thread in threads[1:]:
        thread.start()
    one(0)
    for thread in threads[1:]:
        thread.join()
    raise_root_cause([e for e in errors if e is not None])
    return results


def raise_root_cause(errors):
    """Raise the first error that is not a consequence of another rank's abort (if any error at all).

    Examples
    --------
    >>> from hpcgpu.errors import CommAborted
    >>> raise_root_cause([CommAborted("rank 0: the run was aborted"), ValueError("rank 1: bad input")])
    Traceback (most recent call last):
    ...
    ValueError: rank 1: bad input
    """
    if not errors:
        return
    for error in errors:
        if not isinstance(error, CommAborted):
            raise error
    raise errors[0]


@contextlib.contextmanager
def aborting_on_failure(session, rank, worker=None, current_comm=lambda: None):
    """Abort ``session`` from ``rank`` when the block raises anything but CommAborted, then re-raise.

    The abort goes through the rank's communicator (``current_comm()``, read
    when the error comes: the block may fail before it made one) or, without
    one, through :func:`hpcgpu.partition.dask_communicator.abort_session`. A
    :class:`~hpcgpu.errors.CommAborted` is an abort the session knows
    already; every other error, a :class:`~hpcgpu.errors.CommTimeout`
    included (the peer it waited for may hang, and the others wait for this
    rank), aborts. ``session=None`` (one process, no peers) aborts nothing.

    Examples
    --------
    >>> with aborting_on_failure(None, 0):   # no session: the error passes unchanged
    ...     raise ValueError("the block failed")
    Traceback (most recent call last):
    ...
    ValueError: the block failed
    """
    try:
        yield
    except BaseException as error:
        if not isinstance(error, CommAborted):
            reason = f"{type(error).__name__}: {error}"
            comm = current_comm()
            if comm is not None:
                comm.abort(reason)
            elif session is not None:
                from hpcgpu.partition.dask_communicator import abort_session

                abort_session(session, rank, reason, worker)
        raise


def abort_session_here(session_id, reason, dask_worker=None):
    """Abort ``session_id``'s ranks on this worker (run by ``client.run``: the client has no rank to abort from).

    Their waits end at once with :class:`~hpcgpu.errors.CommAborted`; the
    client runs it on every worker of the session, so nothing is sent on.
    """
    from hpcgpu.partition.comm_extension import worker_extension

    worker_extension(dask_worker).mailbox(session_id).abort(reason)
    for abort in list(_session_aborters):
        abort(session_id, reason)


def on_session_abort(abort):
    """Have ``abort(session_id, reason)`` called on a worker when the client aborts a session there.

    For transports with state of their own beside the mailbox (NCCL's
    communicators, :mod:`hpcgpu.partition.nccl_sessions`): a rank stuck in
    one of their operations never looks at the mailbox. Registering one
    function twice registers it once.
    """
    if abort not in _session_aborters:
        _session_aborters.append(abort)
