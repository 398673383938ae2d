"""The machine's own ceiling for weak scaling: one rank's kernels in N plain processes at once.

Weak scaling compares one worker stepping its grid with N workers stepping
N such grids. On cores that share memory bandwidth, a last-level cache and,
on a VM, the host's scheduler, N copies of the same kernels run slower side
by side than one alone, with no communication and no dask at all. What the
engine can reach is therefore not 1 but this ceiling, and the engine's own
loss is the measured weak-scaling efficiency over it.

:func:`contention_efficiency` measures the ceiling: ``processes`` fresh
processes (spawned, one Numba thread each, as a local worker has), each
stepping the shallow-water model's fused RK3 kernel on its own
``per_worker`` x ``per_worker`` grid for ``seconds``, all started behind one
barrier; the efficiency is the slowest one's rate over the rate of one
such process alone, measured just before: ranks coupled by their halos step
at the pace of the slowest, so that is what the engine can reach (the
acceptance suite's copies side by side are judged the same way). The
median's ratio is kept beside it. ``hpcgpu bench scaling weather``
reports it beside the weak-scaling efficiency.

Examples
--------
>>> result = contention_efficiency(processes=2, per_worker=16, seconds=0.1, backend="numpy")
>>> len(result["side_by_side_steps_per_s"]), 0.0 < result["efficiency"] < 2.0
(2, True)
"""

import multiprocessing
import os
import statistics
import time

from hpcgpu.errors import ConfigError
from hpcgpu.validation import check_float, check_int

__all__ = ["contention_efficiency"]

SETTLE_S = 0.2
"""Seconds each process steps after the barrier before it starts counting (the
others' first steps, page faults, the host's frequency settling)."""


def contention_efficiency(processes=2, *, per_worker=2048, dtype="float64", backend="numba", seconds=3.0):
    """Rate of ``processes`` copies of one rank's kernels side by side, over one copy alone.

    Parameters
    ----------
    processes : int
        Processes side by side (>= 2; the workers of the weak-scaling run).
    per_worker : int
        Grid side of each process (>= 16): the weak-scaling grid per worker.
    dtype : {"float32", "float64"}
    backend : {"numba", "numpy"}
        A CPU backend (on GPUs each rank has its own device: no shared ceiling to measure here).
    seconds : float
        Counting time of each measurement (> 0).

    Returns
    -------
    dict
        ``efficiency`` (the slowest side-by-side rate over the rate alone),
        ``median_efficiency`` (their median rate over the rate alone),
        ``alone_steps_per_s``, ``side_by_side_steps_per_s`` (one per process).

    Raises
    ------
    ConfigError
        Parameters out of range, a GPU backend.
    """
    processes = check_int("processes", processes, minimum=2)
    per_worker = check_int("per_worker", per_worker, minimum=16)
    seconds = check_float("seconds", seconds, minimum=0.0, strict_min=True)
    if str(dtype) not in ("float32", "float64"):
        raise ConfigError(f"dtype must be 'float32' or 'float64'; got {dtype!r}")
    if backend not in ("numba", "numpy"):
        raise ConfigError(f"backend must be a CPU backend, 'numba' or 'numpy'; got {backend!r} (on GPUs "
                          "each rank has its own device, so there is no shared ceiling to measure)")
    job = (per_worker, str(dtype), backend, seconds)
    alone = _side_by_side(1, job)
    together = _side_by_side(processes, job)
    # coupled ranks wait for the slowest each step: its rate, not the median's, bounds the engine
    return {"efficiency": min(together) / alone[0], "median_efficiency": statistics.median(together) / alone[0],
            "alone_steps_per_s": alone[0], "side_by_side_steps_per_s": together}


def _side_by_side(processes, job):
    """Steps per second of each of ``processes`` spawned processes started behind one barrier."""
    context = multiprocessing.get_context("spawn")  # fresh interpreters: no Numba threads inherited
    barrier, results = context.Barrier(processes), context.Queue()
    children = [context.Process(target=_count_steps, args=(job, barrier, results), daemon=True)
                for _ in range(processes)]
    for child in children:
        child.start()
    try:
        rates = [results.get(timeout=300 + 4 * job[3]) for _ in children]
    finally:
        for child in children:
            child.join(timeout=30)
            if child.is_alive():
                child.kill()
    failures = [r for r in rates if isinstance(r, str)]
    if failures:
        raise RuntimeError(f"a contention probe process failed: {failures[0]}")
    return rates


def _count_steps(job, barrier, results):
    """In a spawned process: compile, wait for the others, step for ``seconds``, report the rate."""
    os.environ["NUMBA_NUM_THREADS"] = "1"  # one core each, as a local worker (before Numba starts)
    try:
        step = _shallow_water_step(*job[:3])
        step()  # compile
        barrier.wait(timeout=300)
        settle = time.perf_counter() + SETTLE_S
        while time.perf_counter() < settle:
            step()
        steps, start = 0, time.perf_counter()
        while time.perf_counter() - start < job[3]:
            step()
            steps += 1
        results.put(steps / (time.perf_counter() - start))
    except BaseException as error:  # noqa: BLE001 - reported to the parent, which raises it
        results.put(f"{type(error).__name__}: {error}")


def _shallow_water_step(per_worker, dtype, backend):
    """A callable doing one shallow-water SSP-RK3 step on a ``per_worker`` square grid (fused where it can)."""
    import numpy as np

    from hpcgpu.kernels import stencil

    from hpcgpu.backends import get_backend

    backend = get_backend(backend)
    n = per_worker
    f_corner = backend.asarray(np.full(n + 1, 1e-4, dtype=dtype))
    prepared = stencil.prepare_shallow_water(n, dtype, f_corner=f_corner, g=9.81, dx=1e4, dy=1e4,
                                             backend=backend)
    rng = np.random.default_rng(0)
    fields = [backend.asarray((rng.standard_normal((n, n)) * scale + mean).astype(dtype))
              for scale, mean in ((0.1, 0.0), (0.1, 0.0), (1.0, 1e3))]
    out = [backend.empty((n, n), dtype) for _ in range(3)]
    middle = [backend.empty((n, n), dtype) for _ in range(3)]
    dt = 1.0
    if prepared.fused:
        stages = stencil.SSP_RK3_STAGES

        def step():
            prepared.rk3_step(fields, out, dt, stages, rows=(0, n))
    else:
        def step():
            prepared.stage(fields, fields, middle, a=0.0, b=1.0, c=dt, rows=(0, n))
            prepared.stage(fields, middle, out, a=0.75, b=0.25, c=0.25 * dt, rows=(0, n))
            prepared.stage(fields, out, middle, a=1 / 3, b=2 / 3, c=2 / 3 * dt, rows=(0, n))
    return step
