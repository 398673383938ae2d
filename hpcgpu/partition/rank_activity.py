"""What each rank on this worker is doing now: the words of a deadline's error.

A rank of a session (an epoch's, :mod:`hpcgpu.partition.epochs`, or the
distributed conjugate gradient's, :mod:`hpcgpu.linalg.cg_ranks`) records
its current operation here while it runs (:func:`recording`, then
:meth:`RankActivity.set` at each operation). Its communicator says which
message it waits for (``waiting_for``, set by every wait of
:class:`~hpcgpu.partition.communicator.Communicator`). When an epoch
passes its deadline the client asks every worker of the session
(``client.run(activity_here, session_id)``, answered by the worker's event
loop even while its task thread is stuck) and names in its
:class:`~hpcgpu.errors.EpochDeadline` the ranks not done and what each was
doing: "epoch 7, advancing steps 400 to 416: computing for 12.0 s", or
"...: waiting 11.9 s for a message from rank 1 tagged 'halo|3|south'".

Examples
--------
>>> with recording("session-a", 3) as activity:
...     activity.set("epoch 2, advancing steps 16 to 32")
...     sorted(activity_here("session-a"))
[3]
>>> activity_here("session-a")  # the rank returned: nothing is recorded
{}
"""

import contextlib
import threading
import time

__all__ = ["RankActivity", "activity_here", "operations_here", "recording"]

_activities = {}
"""``(session id, rank) -> RankActivity`` of the ranks running on this worker."""
_lock = threading.Lock()


class RankActivity:
    """One running rank's current operation, and its communicator (which says what it waits for)."""

    def __init__(self):
        self.doing = "starting"
        self.since = time.monotonic()
        self.comm = None
        self.operations = 0  # how many operations it began: the client sees progress in it

    def set(self, doing):
        """Record that the rank now does ``doing`` (plain words: they reach the user's error)."""
        self.doing, self.since = doing, time.monotonic()
        self.operations += 1

    def describe(self, now=None):
        """``doing`` and whether the rank computes or waits for a message, with for how long."""
        now = time.monotonic() if now is None else now
        waiting = getattr(self.comm, "waiting_for", None)
        if waiting is not None:
            what, since = waiting
            return f"{self.doing}: waiting {now - since:.1f} s for {what}"
        computing_since = max(self.since, getattr(self.comm, "waited_until", 0.0))
        return f"{self.doing}: computing for {now - computing_since:.1f} s"


@contextlib.contextmanager
def recording(session_id, rank):
    """Record ``rank``'s activity in ``session_id`` while the block runs; yields its :class:`RankActivity`."""
    activity = RankActivity()
    key = (session_id, rank)
    with _lock:
        _activities[key] = activity
    try:
        yield activity
    finally:
        with _lock:
            if _activities.get(key) is activity:
                del _activities[key]


def activity_here(session_id, dask_worker=None):
    """``{rank: what it is doing}`` of ``session_id``'s ranks running on this worker (run by ``client.run``)."""
    now = time.monotonic()
    with _lock:
        running = [(rank, activity) for (sid, rank), activity in _activities.items() if sid == session_id]
    return {rank: activity.describe(now) for rank, activity in sorted(running)}


def operations_here(session_id, dask_worker=None):
    """``{rank: operations begun}`` of ``session_id``'s ranks running on this worker: the client's sign of progress."""
    with _lock:
        return {rank: activity.operations for (sid, rank), activity in _activities.items() if sid == session_id}
