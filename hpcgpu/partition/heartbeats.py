"""Heartbeats between the workers of a session: a peer that falls silent is found within seconds.

A worker that is stopped (SIGSTOP, a debugger), frozen, or cut off the
network does not close its connections: the kernel of a stopped process
still acknowledges what it receives, and a cut cable sends no FIN. Its
peers would wait for it until their communicator's timeout (300 s). So
each worker runs one :class:`Heartbeats` thread while it has a session
open, which every :data:`HEARTBEAT_S`:

- sends a heartbeat on each of its connections to its peers that is idle
  (the rank port's ``H`` frame of :mod:`hpcgpu.partition.direct_comm`, or a
  ``{"hb": True}`` message on dask's comm layer): a connection busy
  sending data needs none;
- looks at when each peer rank was last heard from (any frame, kept by the
  session's :class:`~hpcgpu.partition.mailbox.Mailbox`), and when one has
  been silent longer than :func:`silence_seconds` (:data:`SILENCE_S`
  unless :data:`SILENCE_ENV` says otherwise) has the worker abort the
  session: its waits raise :class:`~hpcgpu.errors.PeerLost` (a lost worker:
  the run restarts from its last checkpoint), its peers are told, and the
  scheduler is asked to remove the silent worker if it has stopped hearing
  from it too (:mod:`hpcgpu.partition.dask_session`).

A peer is watched from its first frame on until its goodbye. This worker's
own silence is no peer's fault: when the thread itself, or the worker's
event loop (which reads dask's streams), comes late by more than two
heartbeats (this process was stopped, or starved of its cores), every peer
gets a fresh :func:`silence_seconds` before it is judged again.

hpcgpu's Numba kernels release the GIL (``nogil=True``); a rank whose
kernel holds it longer than the limit in one call (a user's Numba kernel
without ``nogil``) silences its worker's heartbeats too: set
:data:`SILENCE_ENV` above that time on the workers, or ``0`` to turn the
detection off.

Examples
--------
>>> from types import SimpleNamespace
>>> from hpcgpu.partition.mailbox import Mailbox
>>> box = Mailbox(poll=0.0)
>>> box.heard[1] = 0.0  # rank 1 was heard at t = 0 s, then fell silent
>>> found, now = [], [0.0]
>>> extension = SimpleNamespace(live_mailboxes=lambda: [("s1", box)], send_heartbeats=lambda answer: answer(),
...                             peer_silent=lambda *args: found.append(args))
>>> beats = Heartbeats(extension, silence=5.0, clock=lambda: now[0])
>>> for now[0] in (1.0, 2.0, 3.0, 4.0, 5.0, 6.0):
...     beats.tick()
>>> found  # (session, silent rank, seconds silent, the limit)
[('s1', 1, 6.0, 5.0)]
"""

import logging
import os  # the doctests read os.environ
import threading
import time

from hpcgpu.env_settings import env_number
from hpcgpu.errors import ConfigError

__all__ = ["HEARTBEAT_S", "Heartbeats", "SILENCE_ENV", "SILENCE_S", "silence_seconds"]

logger = logging.getLogger(__name__)

HEARTBEAT_S = 1.0
"""Seconds between two heartbeats of a worker to each peer (and between two looks at its peers' silence)."""

SILENCE_S = 5.0
"""Seconds a peer may stay silent before it is taken for lost: five missed heartbeats, far below the
communicator's 300 s timeout, far above a loaded node's scheduling delays."""

SILENCE_ENV = "HPCGPU_COMM_SILENCE_S"
"""Environment variable (on the workers): the silence limit in seconds, ``0`` to never judge a peer by it."""

_LATE = 2.0
"""A tick (or the event loop's answer to one) later than this many heartbeats: this process itself was silent."""


def silence_seconds():
    """The silence limit in seconds: :data:`SILENCE_ENV` if set, else :data:`SILENCE_S`; 0 when turned off.

    Raises
    ------
    ConfigError
        :data:`SILENCE_ENV` is neither 0 nor a number of seconds from ``3 * HEARTBEAT_S`` to 3600.

    Examples
    --------
    >>> silence_seconds() == SILENCE_S or SILENCE_ENV in os.environ
    True
    """
    return env_number(SILENCE_ENV, SILENCE_S, float, lambda v: v == 0 or 3 * HEARTBEAT_S <= v <= 3600,
                      f"0 (off) or a number of seconds from {3 * HEARTBEAT_S:g} to 3600")


class Heartbeats:
    """One worker's heartbeat thread: beats to its peers, and judges their silence.

    Parameters
    ----------
    extension
        The worker's :class:`~hpcgpu.partition.comm_extension.CommExtension`
        (``send_heartbeats(on_loop)``, ``live_mailboxes()``,
        ``peer_silent(session_id, source, seconds, limit)``).
    interval : float
        Seconds between ticks.
    silence : float, optional
        The limit (default :func:`silence_seconds`); 0 sends heartbeats but judges nobody.
    clock : callable
        Seconds, monotonic (tests pass their own).
    """

    def __init__(self, extension, interval=HEARTBEAT_S, silence=None, clock=time.monotonic):
        self.extension = extension
        self.interval = float(interval)
        if silence is None:
            try:
                silence = silence_seconds()
            except ConfigError as error:  # a thread of the worker must not die of it: say so, keep the default
                logger.warning("hpcgpu comm: %s; using %g s", error, SILENCE_S)
                silence = SILENCE_S
        self.silence = float(silence)
        self.clock = clock
        self._lock = threading.Lock()
        self._stop = None  # the running thread's stop event
        self._last_tick = None
        self._loop_asked = None  # when the event loop was last asked to answer, and when it answered
        self._loop_answered = None
        self._fresh_from = clock()  # silences are counted from here at the earliest (see the module doc)

    def start(self):
        """Run the thread (again, after :meth:`stop`); does nothing while it runs."""
        with self._lock:
            if self._stop is not None:
                return
            self._stop = threading.Event()
            self._last_tick = None
            self._fresh_from = self.clock()
            threading.Thread(target=self._run, args=(self._stop,), name="hpcgpu-comm-heartbeats",
                             daemon=True).start()

    def stop(self):
        """End the thread (within one interval)."""
        with self._lock:
            if self._stop is not None:
                self._stop.set()
                self._stop = None

    @property
    def running(self):
        with self._lock:
            return self._stop is not None

    def _run(self, stop):
        while not stop.wait(self.interval):
            try:
                self.tick()
            except Exception:  # noqa: BLE001 - the thread outlives one bad tick; the log says what it was
                logger.exception("hpcgpu comm: heartbeat tick failed")

    def _loop_answer(self):
        self._loop_answered = self.clock()

    def tick(self):
        """Beat once and judge the peers (what the thread does every interval)."""
        now = self.clock()
        late = self._last_tick is not None and now - self._last_tick > _LATE * self.interval
        asked, answered = self._loop_asked, self._loop_answered
        pending = asked is not None and (answered is None or answered < asked)
        loop_late = pending and now - asked > _LATE * self.interval
        if late or loop_late:
            self._fresh_from = now
        self._last_tick = now
        if not pending:  # one question in flight at a time: the loop is asked again once it answered
            self._loop_asked = now
        self.extension.send_heartbeats(self._loop_answer)
        if self.silence > 0:
            for session_id, source, seconds in self.silent(now):
                self.extension.peer_silent(session_id, source, seconds, self.silence)

    def silent(self, now):
        """``(session id, source rank, seconds since heard)`` of every watched peer silent past the limit."""
        found = []
        for session_id, box in self.extension.live_mailboxes():
            if box.aborted is not None:
                continue
            for source, heard in list(box.heard.items()):
                if source not in box.finished and now - max(heard, self._fresh_from) > self.silence:
                    found.append((session_id, source, now - heard))
                    break  # one silent peer aborts the session
        return found
