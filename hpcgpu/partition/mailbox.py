"""The mailbox a rank waits on: the messages of one session that reached its worker, and the session's abort.

The receiving side (a dask stream handler, or a direct listener's thread)
files each message with :meth:`Mailbox.put` by (destination rank, source
rank, tag); the rank takes it with :meth:`Mailbox.take`, polling for
:func:`poll_seconds` before it sleeps on the mailbox's condition. An abort
(:meth:`Mailbox.abort`) ends every wait with
:class:`~hpcgpu.errors.CommAborted`, or with :class:`~hpcgpu.errors.PeerLost`
when the abort came from a peer's silence. The mailbox also keeps when each
peer rank was last heard from (:meth:`Mailbox.hear`: every message, goodbye
and heartbeat), which :mod:`hpcgpu.partition.heartbeats` judges.
:class:`MailboxReceive` is the
:class:`~hpcgpu.partition.communicator.Request` of one such receive.

Examples
--------
>>> from hpcgpu.partition.mailbox import Mailbox
>>> box = Mailbox(poll=0.0)
>>> box.put(0, 1, "halo", [1.0, 2.0])
>>> box.ready(0, 1, "halo"), box.take(0, 1, "halo", timeout=1.0, describe="a halo")
(True, [1.0, 2.0])
"""

import collections
import os
import threading
import time

from hpcgpu.env_settings import env_number
from hpcgpu.errors import CommAborted, ConfigError, PeerLost
from hpcgpu.partition.communicator import Request, raise_timeout

__all__ = ["Mailbox", "MailboxReceive", "POLL_ENV", "POLL_SECONDS", "poll_seconds"]

POLL_SECONDS = 0.001
"""How long a rank polls for a message, yielding its core between looks, before it sleeps on the mailbox.

A rank that sleeps is woken by the receiving thread through the kernel
scheduler, and on a busy node that wake-up comes late (MPI libraries poll
for the same reason). A millisecond covers a typical wait of an MD step:
6,912 atoms a slab on 2 workers here, 6.77 against 7.49 ms a step, faster
in 8 of 8 alternated rounds (0.3 ms: 6 of 6; 3 ms: 3 of 6, a long poll
keeps a core from the other rank's helpers); weather at K = 16 and N-body
unchanged (docs/journal.md). The core is given up at every look
(``sched_yield``), so the thread that delivers the message, or any other
on that core, runs at once. See :data:`POLL_ENV`."""

POLL_ENV = "HPCGPU_COMM_POLL_S"
"""Environment variable (on the workers): seconds a rank polls before it sleeps (``0``: sleep at once, for
nodes with more ranks than cores)."""

_yield_core = getattr(os, "sched_yield", lambda: time.sleep(0))  # releases the GIL either way


def poll_seconds():
    """Seconds a waiting rank polls: :data:`POLL_ENV` if set, else :data:`POLL_SECONDS`.

    Raises
    ------
    ConfigError
        :data:`POLL_ENV` is not a number of seconds between 0 and 1.

    Examples
    --------
    >>> poll_seconds() == POLL_SECONDS or POLL_ENV in os.environ
    True
    """
    return env_number(POLL_ENV, POLL_SECONDS, float, lambda v: 0.0 <= v <= 1.0,
                      "a number of seconds between 0 and 1 (0: never poll)")


class Mailbox:
    """Messages of one session that reached this worker, by (destination rank, source rank, tag), and its abort state.

    Several ranks of a session may live on one worker (more partitions than
    workers): each takes only the messages addressed to it.
    """

    def __init__(self, poll=None):
        self.condition = threading.Condition()
        self.queues = collections.defaultdict(collections.deque)
        self.aborted = None   # the reason, once aborted
        self.lost = None      # the silent peer rank, when the abort came from its silence (PeerLost)
        self.finished = set()  # peers that said goodbye
        self.heard = {}       # peer rank -> time.monotonic() of the last frame from it (watched once heard)
        if poll is None:
            try:
                poll = poll_seconds()
            except ConfigError:  # the rank's communicator() reports it; a message's thread must not
                poll = POLL_SECONDS
        self.poll = poll

    def put(self, dest, source, key, obj):
        """File ``obj``, sent by rank ``source`` to rank ``dest`` tagged ``key``, and wake the waiting ranks."""
        with self.condition:
            self.queues[dest, source, key].append(obj)
            self.condition.notify_all()

    def abort(self, reason, lost=None):
        """Abort the session here (the first reason is kept): every wait raises CommAborted.

        ``lost`` is the peer rank whose silence caused it: the waits then
        raise :class:`~hpcgpu.errors.PeerLost` (a lost worker) instead.
        """
        with self.condition:
            if self.aborted is None:
                self.aborted = reason
                self.lost = lost
            self.condition.notify_all()

    def hear(self, source):
        """Note that rank ``source`` was heard from now (any frame: data, heartbeat, goodbye)."""
        self.heard[source] = time.monotonic()  # one dict store: atomic, no lock on the receive path

    def failure(self, rank, during=""):
        """The error a wait of ``rank`` raises once the session is aborted (PeerLost after a silence)."""
        kind = PeerLost if self.lost is not None else CommAborted
        return kind(f"rank {rank}: the run was aborted{during}: {self.aborted}", rank=rank)

    def ready(self, dest, source, key):
        """True when :meth:`take` would return (or raise) at once."""
        with self.condition:
            return bool(self.queues.get((dest, source, key))) or self.aborted is not None

    def take(self, dest, source, key, timeout, describe):
        """The oldest message to ``dest`` from ``source`` tagged ``key``, waiting at most ``timeout`` seconds.

        Raises CommAborted once the session is aborted and CommTimeout past
        the timeout; ``describe`` names what was awaited in either message.
        """
        deadline = time.monotonic() + timeout
        rank = dest
        if self.poll > 0:
            self._poll(dest, source, key, min(self.poll, timeout))
        with self.condition:
            while True:
                queue = self.queues.get((dest, source, key))
                if queue:
                    obj = queue.popleft()
                    if not queue:
                        del self.queues[dest, source, key]
                    return obj
                if self.aborted is not None:
                    raise self.failure(rank, f" while waiting for {describe}")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise_timeout(describe, timeout, rank)
                self.condition.wait(left)

    def _poll(self, dest, source, key, seconds):
        """Look for the message (or an abort) until it is there or ``seconds`` have passed, yielding the core."""
        end = time.perf_counter() + seconds
        queues = self.queues
        # unlocked looks: a dict lookup and a deque's length are atomic; take() checks again under the lock
        while not queues.get((dest, source, key)) and self.aborted is None and time.perf_counter() < end:
            _yield_core()


class MailboxReceive(Request):
    """A receive of the message from rank ``source`` tagged ``key`` into ``rank``'s mailbox."""

    def __init__(self, mailbox, source, key, rank):
        super().__init__(f"a message from rank {source} tagged {key!r}")
        self.mailbox, self.source, self.key, self.rank = mailbox, source, key, rank

    def done(self):
        return self.mailbox.ready(self.rank, self.source, self.key)

    def wait(self, timeout):
        return self.mailbox.take(self.rank, self.source, self.key, timeout, self.describe)
