"""Background writes on the workers: one thread per store, fed by a bounded queue, at a lower priority.

The ranks of a partitioned run hand their snapshot writes (host copies of
their cells, already off the device) to a thread of their worker and go
on stepping (:mod:`hpcgpu.io.rank_zarr`, :mod:`hpcgpu.io.particle_zarr`).
Each store has its own thread per worker process; its queue holds
:data:`QUEUE_DEPTH` jobs, so a rank that snapshots faster than the disk
takes them waits instead of piling up copies. The thread runs at a lower
scheduling priority than the stepping (:data:`WRITER_NICENESS`): on a
node whose cores all step, the writes take the cores' idle moments first.
A failed job is kept and raised by :meth:`BackgroundWrites.wait` or
:meth:`BackgroundWrites.check` on the rank's side, or by the worker tasks
:func:`finish_writes` and :func:`wait_writes` that the client runs.

Examples
--------
>>> writes = BackgroundWrites()
>>> done = []
>>> writes.submit(lambda: done.append("written"))
>>> writes.wait(); done
['written']
>>> writes.stop()
"""

import os
import queue
import threading

from hpcgpu.env_settings import env_number

__all__ = ["NICENESS_ENV", "QUEUE_DEPTH", "WRITER_NICENESS", "BackgroundWrites", "background_writes",
           "drop_writes", "finish_writes", "wait_writes", "writer_niceness"]

QUEUE_DEPTH = 2
"""Snapshots a worker may hold queued for writing (host copies of its ranks' cells) before the next one waits."""

_WRITERS = {}  # per worker process: store path -> BackgroundWrites
_WRITERS_LOCK = threading.Lock()


class BackgroundWrites:
    """A thread that runs queued write jobs in order; the first failure is kept for :meth:`wait`.

    Examples
    --------
    >>> writes = BackgroundWrites()
    >>> out = []
    >>> writes.submit(lambda: out.append(1))
    >>> writes.wait(); out
    [1]
    >>> writes.stop()
    """

    def __init__(self, depth=QUEUE_DEPTH):
        self._queue = queue.Queue(maxsize=depth)
        self._errors = []
        self.timings = []  # what the jobs report: e.g. each rank's bytes and seconds of a snapshot
        self.held = {}  # rank -> (time index, host state): its last snapshot's cells, for that one's derived variables
        self._thread = threading.Thread(target=self._loop, name="hpcgpu-rank-writes", daemon=True)
        self._thread.start()

    def submit(self, job):
        """Queue ``job`` (a callable); blocks while the queue is full."""
        self._queue.put(job)

    def wait(self):
        """Block until every queued job ran; raise the first error since the last wait."""
        self._queue.join()
        errors, self._errors = self._errors, []
        if errors:
            raise errors[0]

    def check(self):
        """Raise the first error of the jobs run since the last wait or check, without waiting for the others."""
        if self._errors:
            errors, self._errors = self._errors, []
            raise errors[0]

    def stop(self):
        """End the thread once the queued jobs ran."""
        self._queue.put(None)
        self._thread.join()

    def _loop(self):
        _lower_priority()
        while True:
            job = self._queue.get()
            try:
                if job is None:
                    return
                job()
            except BaseException as error:  # noqa: BLE001 - kept, and raised by wait() on the caller's side
                self._errors.append(error)
            finally:
                self._queue.task_done()


WRITER_NICENESS = 10
"""How much lower than the stepping threads the writer threads run (Linux ``nice`` increment; 0 leaves them equal)."""
NICENESS_ENV = "HPCGPU_WRITER_NICENESS"
"""The environment variable (of the workers) that sets another increment, 0 to 19."""


def writer_niceness():
    """The ``nice`` increment of the writer threads: :data:`NICENESS_ENV` if set, else :data:`WRITER_NICENESS`.

    Examples
    --------
    >>> writer_niceness() == WRITER_NICENESS or NICENESS_ENV in os.environ
    True
    """
    return env_number(NICENESS_ENV, WRITER_NICENESS, int, lambda v: 0 <= v <= 19,
                      "an int from 0 (writes as urgent as the stepping) to 19")


def _lower_priority():
    """Lower this thread's scheduling priority (Linux: per thread), so that stepping gets a busy core first.

    The writes then take the cores' idle time (a rank waiting for a
    message, a GPU step) before the stepping's. Threads this one starts
    (zarr's I/O loop and codec pool, when a write starts them) inherit it.
    Elsewhere, or without permission, nothing changes.
    """
    increment = writer_niceness()
    if increment <= 0 or not hasattr(os, "setpriority"):
        return
    try:
        thread = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, thread, min(19, os.getpriority(os.PRIO_PROCESS, thread) + increment))
    except OSError:  # not permitted here: the writes run at the stepping's priority
        pass


def background_writes(path):
    with _WRITERS_LOCK:
        if path not in _WRITERS:
            _WRITERS[path] = BackgroundWrites()
        return _WRITERS[path]


def wait_writes(spec, ranks, results, path):
    """Wait for this worker's queued writes to ``path``; raise the first that failed (a worker task)."""
    background_writes(path).wait()


def finish_writes(spec, ranks, results, path):
    """Wait for this worker's queued writes to ``path`` and end its thread; raise the first failure (a worker task).

    Returns the ranks' snapshot timings (``[{"rank", "bytes", "seconds"}]``).
    """
    with _WRITERS_LOCK:
        writes = _WRITERS.get(path)
    if writes is None:
        return []
    try:
        writes.wait()
    finally:
        with _WRITERS_LOCK:
            _WRITERS.pop(path, None)
        writes.stop()
    return writes.timings


def drop_writes(spec, ranks, results, path):
    """Wait for this worker's queued writes to ``path`` and end its thread, dropping their errors (a worker task).

    For a run restarted after a lost worker: the writes queued before the
    loss belong to snapshots the run writes again.
    """
    with _WRITERS_LOCK:
        writes = _WRITERS.pop(path, None)
    if writes is None:
        return
    try:
        writes.wait()
    except Exception:  # noqa: BLE001 - a snapshot that is written again
        pass
    writes.stop()
