"""The Numba CPU kernels release the GIL while they run.

A worker's heartbeat thread (:mod:`hpcgpu.partition.heartbeats`) and its
event loop are Python threads: a kernel that held the GIL for longer than
the silence limit (5 s) would make its worker look lost to its peers and
the scheduler. Each kernel here runs one long call in a thread while the
test's thread ticks; with the GIL released the ticks go on during the call.
"""

import threading
import time

import numpy as np
import pytest

pytest.importorskip("numba")

from hpcgpu.kernels import nbody  # noqa: E402


def _longest_pause_during(call):
    """``(seconds the call took, longest gap between this thread's ticks while it ran)``."""
    done = threading.Event()
    took = []

    def run():
        start = time.perf_counter()
        call()
        took.append(time.perf_counter() - start)
        done.set()

    worker = threading.Thread(target=run)
    last = time.perf_counter()
    longest = 0.0
    worker.start()
    while not done.is_set():
        time.sleep(0.001)  # needs the GIL to wake up
        now = time.perf_counter()
        longest = max(longest, now - last)
        last = now
    worker.join()
    return took[0], longest


def _long_enough(make_call, seconds=0.4):
    """A call of at least ``seconds`` (its size doubled until it is), compiled first."""
    size = 1
    while True:
        call = make_call(size)
        call()  # compiles (and warms) outside the measured run
        start = time.perf_counter()
        call()
        if time.perf_counter() - start >= seconds or size >= 64:
            return call
        size *= 2


def test_nbody_all_pairs_releases_the_gil():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((3, 4096))
    m = rng.random(4096)

    def make(repeats):
        xs = np.tile(x, (1, repeats))
        ms = np.tile(m, repeats)
        return lambda: nbody.accelerations(xs, ms, softening=0.01, backend="numba")

    took, pause = _longest_pause_during(_long_enough(make))
    assert pause < 0.5 * took, f"the test thread stopped {pause:.3f} s during a {took:.3f} s kernel call"


def test_matmul_releases_the_gil():
    from hpcgpu.kernels import matrix

    rng = np.random.default_rng(2)

    def make(scale):
        n = 192 * scale
        a, b = rng.random((n, n)), rng.random((n, n))
        return lambda: matrix.matmul(a, b, backend="numba")

    took, pause = _longest_pause_during(_long_enough(make))
    assert pause < 0.5 * took, f"the test thread stopped {pause:.3f} s during a {took:.3f} s matmul"
