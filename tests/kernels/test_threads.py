"""Kernels pick one thread or all by timing both, and give bitwise the same results either way."""

import numba
import numpy as np
import pytest

from hpcgpu.kernels import matrix, nbody, stencil, threads

needs_two = pytest.mark.skipif(numba.config.NUMBA_NUM_THREADS < 2, reason="one Numba thread: nothing to choose")


def _on_threads(count, function):
    previous = numba.get_num_threads()
    numba.set_num_threads(count)
    try:
        return function()
    finally:
        numba.set_num_threads(previous)


@needs_two
def test_every_adaptive_kernel_gives_the_same_bits_on_one_thread_and_all(rng):
    """The choice follows the machine's load, so it must never change a result."""
    most = numba.config.NUMBA_NUM_THREADS
    field = rng.random((96, 80))
    x, m = rng.standard_normal((3, 500)), rng.random(500)
    from hpcgpu.workloads.md import LennardJones
    from hpcgpu.workloads.weather import ShallowWater

    weather = ShallowWater("turbulence", nx=64, ny=96, backend="numba")
    liquid = LennardJones(4, temperature=1.5, backend="numba")
    from hpcgpu.bench.matrix import poisson_matrix

    poisson = poisson_matrix(np, 200, np.dtype("float64"))
    v, w = rng.standard_normal(200 * 200), rng.standard_normal(200 * 200)
    cases = {
        "diffuse": lambda: stencil.diffuse(field, diffusivity=0.2, dt=1.0, steps=7, backend="numba"),
        "laplacian": lambda: stencil.laplacian(field, backend="numba"),
        "rk3 step": lambda: weather.step(weather.initial_state(), 30.0, 3).h.copy(),
        "gravity": lambda: nbody.accelerations(x, m, softening=0.05, backend="numba"),
        "lennard-jones": lambda: liquid.step(liquid.initial_state(), 0.005, 20).forces.copy(),
        # above the matrix family's serial cut-off, so the threaded loops run
        "spmv": lambda: matrix.spmv(poisson, v, backend="numba"),
        "dot": lambda: np.array(matrix.dot(v, w, backend="numba")),
        "axpy": lambda: matrix.axpy(0.3, v, w, backend="numba"),
    }
    for name, case in cases.items():
        one, every = _on_threads(1, case), _on_threads(most, case)
        np.testing.assert_array_equal(one, every, err_msg=name)


def test_a_call_site_times_both_settings_then_keeps_the_faster(monkeypatch):
    monkeypatch.setattr(numba.config, "NUMBA_NUM_THREADS", max(2, numba.config.NUMBA_NUM_THREADS))
    most = numba.config.NUMBA_NUM_THREADS
    seen = []
    clock = [0.0]
    monkeypatch.setattr(threads.time, "perf_counter", lambda: clock[0])
    state = {"threads": most}

    def set_threads(n):
        state["threads"] = n

    monkeypatch.setattr(threads.numba, "set_num_threads", set_threads)
    monkeypatch.setattr(threads.numba, "get_num_threads", lambda: state["threads"])

    @threads.adaptive_threads(key=lambda size: size)
    def kernel(size):
        used = state["threads"]
        seen.append(used)
        clock[0] += 1.0 if used == 1 else 3.0  # all threads are slower here (a loaded machine)
        return used

    for _ in range(2 * threads.TRIALS):
        kernel(10)
    assert sorted(seen) == [1] * threads.TRIALS + [most] * threads.TRIALS
    assert {kernel(10) for _ in range(5)} == {1}  # the faster one, from now on
    assert state["threads"] == most  # the caller's own setting is restored after every call
    clock[0] += 1000.0  # past the recheck: measured again
    seen.clear()
    for _ in range(2 * threads.TRIALS):
        kernel(10)
    assert most in seen
    assert kernel(99) in (1, most) and len(threads.choices()) >= 1


def test_a_short_call_whose_threads_now_and_then_stall_runs_on_one_thread(monkeypatch):
    """The mean decides, over enough calls: on a busy machine a threaded call is usually the faster
    but now and then waits a whole time slice for a thread that lost its core."""
    monkeypatch.setattr(numba.config, "NUMBA_NUM_THREADS", max(2, numba.config.NUMBA_NUM_THREADS))
    most = numba.config.NUMBA_NUM_THREADS
    clock = [0.0]
    monkeypatch.setattr(threads.time, "perf_counter", lambda: clock[0])
    state = {"threads": most, "threaded_calls": 0}
    monkeypatch.setattr(threads.numba, "set_num_threads", lambda n: state.update(threads=n))
    monkeypatch.setattr(threads.numba, "get_num_threads", lambda: state["threads"])

    @threads.adaptive_threads(key=lambda: 0)
    def kernel():
        if state["threads"] == 1:
            clock[0] += 20e-6
        else:
            state["threaded_calls"] += 1
            clock[0] += 5e-3 if state["threaded_calls"] % 8 == 0 else 10e-6  # the median is 10 us
        return state["threads"]

    used = [kernel() for _ in range(threads.MAX_TRIALS + 8)]
    # threaded calls until the stall made them long enough (the 8th), 20 us calls up to the cap
    assert used.count(most) == 8 and used.count(1) == threads.MAX_TRIALS
    assert {kernel() for _ in range(5)} == {1}


def test_a_caller_that_set_its_own_thread_count_is_left_alone(monkeypatch):
    calls = []

    @threads.adaptive_threads(key=lambda: 0)
    def kernel():
        calls.append(numba.get_num_threads())

    _on_threads(1, kernel)
    assert calls == [1]
