"""How many of Numba's threads a CPU kernel call uses: measured, not guessed, and measured again.

Numba's OpenMP threads divide a kernel's work and wait for the slowest of
them. On a quiet machine two threads make a 256 x 128 shallow-water step
1.86x faster; with one other busy process on the two cores the same step
takes 2.7 ms on two threads and 0.99 ms on one (the thread that shares a
core with the other process finishes last, and the others spin waiting for
it), and even a 1024 x 512 step is faster on one. No size threshold is
right both ways, so each repeated call site times both:

:func:`adaptive_threads` wraps a backend function. For each call site and
work size (``key``), the first calls alternate between one thread and all
of them (:data:`TRIALS` each, more for short calls: :data:`TRIAL_SECONDS`);
the setting faster on average is then used until
:data:`RECHECK_S` seconds of calls have passed, when it measures again (and
then after twice as long each time the choice holds, up to
:data:`MAX_RECHECK_S`), so a run follows the load as it comes and goes. The kernels wrapped compute
every output point the same way whatever the thread count, so results are
bitwise the same either way (tested); a process with one Numba thread
(every worker of a local cluster) skips all of it.

Examples
--------
>>> import numpy as np
>>> calls = []
>>> @adaptive_threads(key=lambda a: a.size)
... def kernel(a):
...     calls.append(a.size)
...     return a.sum()
>>> float(kernel(np.ones(10)))
10.0
"""

import functools
import os
import threading
import time

import numba

__all__ = ["ADAPTIVE_ENV", "MAX_RECHECK_S", "MAX_TRIALS", "RECHECK_S", "TRIALS", "TRIAL_SECONDS", "adaptive_threads",
           "choices"]

ADAPTIVE_ENV = "HPCGPU_ADAPTIVE_THREADS"
"""Environment variable: ``0`` runs every kernel call on all of Numba's threads (timings that must not adapt)."""

TRIALS = 3
"""Timed calls per setting before choosing, at least (see :data:`TRIAL_SECONDS`); the mean decides."""
TRIAL_SECONDS = 0.005
"""Seconds of calls per setting before choosing, at least (short calls are timed more often, up to
:data:`MAX_TRIALS`): on a busy machine a call on all threads now and then waits a whole time slice
for a thread that lost its core, which a few short trials miss and the mean must include."""
MAX_TRIALS = 64
"""Timed calls per setting at most."""
RECHECK_S = 2.0
"""Seconds of calls before a call site is measured again; doubled each time the
measurement confirms the choice, up to :data:`MAX_RECHECK_S`."""
MAX_RECHECK_S = 32.0

_local = threading.local()  # per calling thread: Numba's thread count is a per-thread setting


class _Site:
    """One call site and work size: its timings and its choice."""

    __slots__ = ("times", "choice", "since", "cost", "interval", "last")

    def __init__(self):
        self.times = {}
        self.choice = None
        self.since = 0.0
        self.cost = 0.0
        self.interval = RECHECK_S
        self.last = None

    def next_threads(self, most):
        # long calls are measured again less often: the trials of the slower setting stay ~1% of the time
        if self.choice is not None and time.perf_counter() - self.since < max(self.interval, 300 * self.cost):
            return self.choice
        if self.choice is not None:  # time to measure again
            self.last, self.choice, self.times = self.choice, None, {}
        # alternate between the settings still short of enough calls (see _measured)
        counts = {n: len(self.times.get(n, ())) for n in (1, most) if not _measured(self.times.get(n, ()))}
        return min(counts, key=lambda n: (counts[n], n != 1))

    def record(self, threads, seconds, most):
        if self.choice is not None:
            return
        self.times.setdefault(threads, []).append(seconds)
        if all(_measured(self.times.get(n, ())) for n in (1, most)):
            # the mean, not the median: a rare stall of the threaded call is part of its cost
            means = {n: sum(t) / len(t) for n, t in self.times.items()}
            self.choice = min(means, key=means.get)
            self.cost = means[self.choice]
            self.since = time.perf_counter()
            # a confirmed choice is checked less and less often; a changed one soon again
            self.interval = min(2 * self.interval, MAX_RECHECK_S) if self.choice == self.last else RECHECK_S


def _measured(times):
    """Whether one setting's timed calls are enough to choose."""
    return len(times) >= MAX_TRIALS or (len(times) >= TRIALS and sum(times) >= TRIAL_SECONDS)


def choices():
    """``{(function, key): threads}`` chosen so far in this thread (diagnostics and tests)."""
    sites = getattr(_local, "sites", {})
    return {site_key: site.choice for site_key, site in sites.items() if site.choice is not None}


def adaptive_threads(key):
    """Decorate a CPU kernel call so that it runs on one thread or all, whichever measures faster.

    Parameters
    ----------
    key : callable
        ``key(*args, **kwargs)`` -> a hashable work size: calls with the
        same key are timed together (the shape and step count, say).
    """

    def decorate(function):
        name = f"{function.__module__}.{function.__qualname__}"

        @functools.wraps(function)
        def wrapper(*args, **kwargs):
            most = numba.config.NUMBA_NUM_THREADS
            current = numba.get_num_threads()
            # one thread only, the caller chose a count itself, or adapting is off
            if most <= 1 or current < most or os.environ.get(ADAPTIVE_ENV, "1") == "0":
                return function(*args, **kwargs)
            sites = getattr(_local, "sites", None)
            if sites is None:
                sites = _local.sites = {}
            site = sites.setdefault((name, key(*args, **kwargs)), _Site())
            threads = site.next_threads(most)
            if threads == most:
                started = time.perf_counter()
                result = function(*args, **kwargs)
            else:
                numba.set_num_threads(threads)
                try:
                    started = time.perf_counter()
                    result = function(*args, **kwargs)
                finally:
                    numba.set_num_threads(current)
            site.record(threads, time.perf_counter() - started, most)
            return result

        return wrapper

    return decorate
