"""The emulated slow device of mixed-cluster benchmarks (:mod:`hpcgpu.partition.slowdown`)."""

import time

from hpcgpu.partition.slowdown import SLOWDOWN_ENV, emulate_slowdown


def test_an_emulated_slow_worker_sleeps_in_proportion(monkeypatch):
    monkeypatch.setenv(SLOWDOWN_ENV, "3")
    started = time.perf_counter()
    time.sleep(0.02)
    emulate_slowdown(started)
    assert time.perf_counter() - started >= 3 * 0.02
    monkeypatch.setenv(SLOWDOWN_ENV, "1")
    started = time.perf_counter()
    emulate_slowdown(started)
    assert time.perf_counter() - started < 0.01
