"""What the NCCL transport keeps on a worker per session: each rank's NCCL state, and the session's choice.

A session's NCCL communicators are made in its first epoch
(:func:`hpcgpu.partition.nccl_communicator.attach`) and kept here, in a
:class:`RankState` per rank, for the epochs that follow, until
:func:`release` ends them: :mod:`hpcgpu.partition.dask_session` calls it on
every worker as the session closes there (registered below with
:func:`~hpcgpu.partition.dask_session.on_session_close`), and
:func:`sweep` catches sessions that closed while a worker missed it.

Examples
--------
>>> from hpcgpu.partition import nccl_sessions
>>> nccl_sessions.release("no-such-session")  # nothing kept: nothing to end
>>> nccl_sessions.bootstraps["no-such-session"]
0
"""

import collections
import threading

from hpcgpu.partition.dask_session import on_session_close
from hpcgpu.partition.worker_ranks import on_session_abort

__all__ = ["RankState", "abort", "bootstraps", "decisions", "rank_states", "registry_lock", "release", "sweep"]


class RankState:
    """What outlives an epoch: the device layer, sequence numbers, receives posted and not yet taken."""

    def __init__(self, device, rank, size):
        self.device = device
        self.rank, self.size = rank, size
        self.sent = collections.Counter()      # dest -> next sequence number
        self.posted = collections.Counter()    # source -> next sequence number to post
        self.inbound = {}                      # (source, seq) -> (array, event)
        self.pending = []                      # (events, buffers) of sends still on the wire
        self.dead = None                       # why the NCCL transport is gone
        self.lock = threading.Lock()

    def kill(self, reason):
        """End the transport for this rank: abort its NCCL communicators, drop what they held (first reason kept)."""
        with self.lock:
            if self.dead is not None:
                return
            self.dead = reason
        self.device.abort()
        self.inbound.clear()
        self.pending.clear()


rank_states = {}
"""``(session id, rank) -> RankState`` of the ranks on this worker."""
decisions = {}
"""``(session id, rank) -> bool``: whether the session's ranks chose NCCL (its first epoch decides)."""
registry_lock = threading.Lock()
"""Guards :data:`rank_states`, :data:`decisions` and :data:`bootstraps` (ranks are threads of one worker)."""
bootstraps = collections.Counter()
"""Bootstraps this worker ran, by session id (the tests check that epochs reuse one)."""


def release(session_id):
    """End this worker's NCCL communicators of ``session_id`` (ncclCommAbort; nothing waits for peers)."""
    with registry_lock:
        states = [rank_states.pop(k) for k in [k for k in rank_states if k[0] == session_id]]
        for key in [k for k in decisions if k[0] == session_id]:
            del decisions[key]
    for state in states:
        state.kill(f"session {session_id} was released")


def abort(session_id, reason):
    """ncclCommAbort this worker's NCCL communicators of ``session_id`` (the client aborted the session).

    A rank inside an NCCL operation or a device synchronisation waits for
    its peers without looking at its mailbox; the abort stops its kernels.
    The states stay registered, dead: the rank's next call raises
    :class:`~hpcgpu.errors.CommAborted`.
    """
    with registry_lock:
        states = [state for key, state in rank_states.items() if key[0] == session_id]
    for state in states:
        state.kill(f"the session was aborted: {reason}")


def sweep(base):
    """Release the states of sessions this worker has forgotten (closed by ``close_session``)."""
    try:
        alive = set(base.extension.sessions())
    except AttributeError:
        return
    with registry_lock:
        gone = {k[0] for k in list(rank_states) + list(decisions) if k[0] not in alive}
    for session_id in gone:
        release(session_id)


on_session_close(release)
on_session_abort(abort)
