"""The benchmark harness every ``hpcgpu bench`` suite shares.

Each result is one JSON object on its own line (stdout) with at least
``suite``, ``case``, ``backend``, ``dtype``, ``size``, ``metric``, ``value``,
``unit``, ``median_s``, ``repeats`` and ``ratio_to_numpy`` (the same case on
the ``numpy`` backend in the same run, or null). Timings are medians over
repeats after a warm-up call, with the device synchronised inside the timed
region. Speed is reported, never asserted: machines are shared and noisy.
"""

import json
import math
import sys
import time

import numpy as np

__all__ = ["measure", "Recorder", "copy_bandwidth"]


def measure(function, *, synchronize, repeats=None, warmup=1, budget_s=20.0, min_repeats=3, max_repeats=20):
    """Time ``function()`` and return the list of durations (s).

    ``synchronize()`` runs inside the timed region (GPU work is asynchronous).
    Without ``repeats``, repeats go on while another one of the mean
    duration so far still fits ``budget_s``, between ``min_repeats`` and
    ``max_repeats``. (Not sized from the warm-up: it includes the JIT
    compilation, seconds with a cold kernel cache, which left 2 repeats of
    a budget of 20.)
    """
    for _ in range(max(warmup, 1)):
        function()
        synchronize()
    durations = []
    while True:
        if repeats is not None:
            if len(durations) >= repeats:
                break
        elif len(durations) >= max_repeats or (
                len(durations) >= max(1, min_repeats)
                and sum(durations) + sum(durations) / len(durations) > budget_s):
            break
        start = time.perf_counter()
        function()
        synchronize()
        durations.append(time.perf_counter() - start)
    return durations


class Recorder:
    """Collect results, fill in ``ratio_to_numpy`` and print JSON lines.

    Parameters
    ----------
    suite : str
    stream : file, optional
        Where JSON lines go (default stdout).
    """

    def __init__(self, suite, stream=None):
        self.suite = suite
        self.stream = stream or sys.stdout
        self.results = []
        self.errors = []

    def add(self, *, case, backend, dtype, size, metric, value, unit, durations, **extra):
        """Record one result and print it as a JSON line; returns the dict."""
        result = {
            "suite": self.suite, "case": case, "backend": backend, "dtype": str(dtype),
            "size": size, "metric": metric, "value": float(value), "unit": unit,
            "median_s": float(np.median(durations)), "repeats": len(durations),
            "ratio_to_numpy": None,
        }
        for other in self.results:
            if (other["backend"] == "numpy" and other["case"] == case and other["dtype"] == result["dtype"]
                    and other["size"] == size and other["metric"] == metric and other["value"] > 0):
                result["ratio_to_numpy"] = result["value"] / other["value"]
        if backend == "numpy":
            result["ratio_to_numpy"] = 1.0
        result.update({k: _jsonable(v) for k, v in extra.items()})
        self.results.append(result)
        print(json.dumps(result), file=self.stream, flush=True)
        return result


    def error(self, *, case, backend, dtype, size, error):
        """Record a case that failed on a backend, print it, and carry on."""
        result = {"suite": self.suite, "case": case, "backend": backend, "dtype": str(dtype), "size": size,
                  "metric": None, "value": None, "unit": None, "median_s": None, "repeats": 0,
                  "ratio_to_numpy": None, "error": f"{type(error).__name__}: {error}"}
        self.errors.append(result)
        print(json.dumps(result), file=self.stream, flush=True)
        return result


def _jsonable(value):
    if isinstance(value, (np.floating, np.integer)):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def measure_partitioned(backend, workers, model, state, dt, steps, *, name, budget_s, min_repeats=2,
                        max_repeats=5):
    """Durations of ``steps`` steps of ``model`` in ``workers`` partitions on a new local cluster.

    One core (or one GPU) per worker. The partitions are set up once from
    ``state`` (:class:`hpcgpu.partition.engine.PartitionedExecutor`) and
    warmed up by one untimed call (compiling the kernels on every worker);
    each timed call then advances ``steps`` more steps and waits for them,
    as a long run does. The cluster is closed afterwards.
    """
    from hpcgpu.cluster import start_cluster
    from hpcgpu.partition.engine import PartitionedExecutor

    gpus = backend.on_gpu and not backend.simulated
    client = start_cluster(workers=workers, threads_per_worker=None if gpus else 1, gpus=gpus,
                           dashboard_address="127.0.0.1:0", quiet=True)
    executor = None
    try:
        client.wait_for_workers(workers)
        executor = PartitionedExecutor(client, model, state, dt, partitions=workers, name=name)

        def call():
            executor.advance(steps)
            executor.synchronize()

        return measure(call, synchronize=lambda: None, budget_s=budget_s, min_repeats=min_repeats,
                       max_repeats=max_repeats)
    finally:
        if executor is not None:
            executor.close()
        local = client.cluster
        client.close()
        local.close()


def one_process_rate(recorder, case, backend, dtype, size):
    """The ``value`` of ``case`` for this backend, dtype and size in this run (None if absent)."""
    return next((r["value"] for r in recorder.results if r["case"] == case and r["backend"] == backend.name
                 and r["dtype"] == np.dtype(dtype).name and r["size"] == size), None)


def copy_bandwidth(backend, nbytes, repeats=5):
    """Measured device-memory copy bandwidth (bytes read + written per second).

    Copies an array of ``nbytes / 2`` bytes into another, with the backend's
    natural copy: one NumPy thread for ``numpy``, a parallel Numba loop on
    all threads for ``numba``, a device-to-device copy for GPU backends.
    Size it like the working set of the kernel it is compared with, so that
    both see the same level of the memory hierarchy.
    """
    elements = max(1, int(nbytes // 2 // 4))
    xp = backend.xp
    src = xp.ones(elements, dtype=np.float32)
    dst = xp.empty_like(src)
    if backend.name == "numba":
        from hpcgpu.bench._copy import parallel_copy as copy
    elif backend.on_gpu:
        def copy(a, b):
            b[...] = a
    else:
        def copy(a, b):
            np.copyto(b, a)
    durations = measure(lambda: copy(src, dst), synchronize=backend.synchronize, repeats=repeats, warmup=2)
    return 2 * src.nbytes / float(np.median(durations))
