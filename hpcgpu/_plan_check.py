"""``hpcgpu plan --check``: the plan's model against a measured run on this machine.

On a local CPU cluster of 1 and 2 workers (one thread each) it measures the
device profile the model needs, on the spot:

- copy bandwidth per worker with :func:`hpcgpu.bench.harness.copy_bandwidth`
  on a working set far beyond the caches (256 MiB), the memory bandwidth
  that the documented kernel fraction is relative to (it was measured at
  4096^2, 805 MB), with P workers copying at once for the P-worker
  prediction (CPU workers share one memory system);
- dask's cost per task and per dependent level, by timing supersteps of
  empty tasks shaped like the engine's (P advances, 2P halo cuts);
- dask's cost of one worker-to-worker transfer and the bandwidth beyond it
  (a tiny and a 64 MiB array fetched by the other worker);

keeps the kernel's fraction of its roofline from ``docs/benchmarks.md``
(the named ``cpu`` profile: the fused step's share of the flop peak),
predicts the seconds per step of the weather
model, then runs that model on the engine (the ``hpcgpu bench scaling``
measurement) and reports the relative error of each prediction.
"""

import os
import time
from dataclasses import replace

import numpy as np

from hpcgpu._plan_workloads import Weather
from hpcgpu._profiles import DEVICES, LINKS
from hpcgpu.cluster import worker_info
from hpcgpu.plan import SchedulerModel

__all__ = ["check_against_this_machine", "format_check"]

COPY_WORKING_SET = 256 * 2 ** 20
"""Bytes each worker copies to measure its memory bandwidth: beyond the caches."""


def _noop(*inputs):
    return 0


def _payload(nbytes):
    return np.ones(nbytes, dtype=np.uint8)


def _nbytes(array):
    return int(array.nbytes)


def _copy_rate(nbytes, seconds):
    """Median copy bandwidth (B/s) of this worker over ``seconds`` of repeated measurements."""
    from hpcgpu.backends import get_backend
    from hpcgpu.bench.harness import copy_bandwidth

    backend = get_backend("numba")
    rates, start = [], time.perf_counter()
    while time.perf_counter() - start < seconds or len(rates) < 3:
        rates.append(copy_bandwidth(backend, nbytes, repeats=3))
    return float(np.median(rates))


def _copy_bandwidth(client, workers, nbytes, seconds=0.6):
    """Per-worker copy bandwidth with every worker of ``workers`` copying at once."""
    futures = [client.submit(_copy_rate, nbytes, seconds, workers=[w], pure=False) for w in workers]
    return float(np.mean(client.gather(futures)))


def _superstep_time(client, workers, partitions, supersteps=40):
    """Seconds per superstep of empty tasks shaped like RowExecutor's (P advances, 2P halo cuts)."""
    owner = [workers[p % len(workers)] for p in range(partitions)]
    blocks = [client.submit(_noop, p, workers=[owner[p]], pure=False) for p in range(partitions)]
    client.gather(blocks)
    start = time.perf_counter()
    for _ in range(supersteps):
        new = []
        for p in range(partitions):
            inputs = [blocks[p]]
            if partitions > 1:
                south, north = (p - 1) % partitions, (p + 1) % partitions
                inputs += [client.submit(_noop, blocks[q], workers=[owner[q]], pure=False) for q in (south, north)]
            new.append(client.submit(_noop, *inputs, workers=[owner[p]], pure=False))
        blocks = new
    client.gather(blocks)
    return (time.perf_counter() - start) / supersteps


def _fetch_time(client, source, worker, repeats):
    """Median seconds to run a task on ``worker`` that takes ``source`` as input."""
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        client.submit(_nbytes, source, workers=[worker], pure=False).result()
        samples.append(time.perf_counter() - start)
    return float(np.median(samples))


def _transfer_costs(client, workers, nbytes=64 * 2 ** 20, repeats=5):
    """dask's cost of one worker-to-worker transfer (s) and the bandwidth beyond it (B/s).

    A task that takes a tiny array from the other worker, against the same
    task on the worker that holds it, gives the cost per transfer; a 64 MiB
    array against the tiny one gives the bandwidth.
    """
    tiny = client.submit(_payload, 1024, workers=[workers[0]], pure=False)
    big = client.submit(_payload, nbytes, workers=[workers[0]], pure=False)
    client.gather([tiny, big])
    local = _fetch_time(client, tiny, workers[0], repeats)
    remote = [_fetch_time(client, tiny, workers[1], 1) for _ in range(repeats)]
    bulk = []
    for _ in range(repeats):
        # a fresh array each time: dask keeps a copy on the worker that fetched it
        big = client.submit(_payload, nbytes, workers=[workers[0]], pure=False)
        client.gather(big)
        bulk.append(_fetch_time(client, big, workers[1], 1))
        tiny = client.submit(_payload, 1024, workers=[workers[0]], pure=False)
        client.gather(tiny)
        remote.append(_fetch_time(client, tiny, workers[1], 1))
    remote = float(np.median(remote))
    # a noisy machine can make the difference tiny: never credit more than 1 ms per 64 MiB
    bandwidth = (nbytes - 1024) / max(float(np.median(bulk)) - remote, nbytes / 64e9)
    return max(0.0, remote - local), bandwidth


def _relative_error(predicted, measured):
    return (predicted - measured) / measured


def check_against_this_machine(*, nx=1024, ny=512, steps_per_task=8, dtype="float32", supersteps=6):
    """Predicted vs measured seconds per step of the weather model on 1 and 2 local CPU workers.

    Parameters
    ----------
    nx, ny : int
        Grid (the whole grid: strong scaling from 1 to 2 workers).
    steps_per_task : int
        K, steps per task.
    dtype : str
    supersteps : int
        Supersteps timed per worker count.

    Returns
    -------
    dict
        ``profile`` (what was measured), ``rows`` (one dict per worker count
        with the predicted and measured seconds per step, their parts and
        ``relative_error``), and the predicted and measured efficiency.

    Examples
    --------
    >>> result = check_against_this_machine(nx=256, ny=128)  # doctest: +SKIP
    >>> abs(result["rows"][0]["relative_error"]) < 1  # doctest: +SKIP
    True
    """
    from hpcgpu.bench.scaling import _model, _time_engine
    from hpcgpu.cluster import cluster

    model = _model(nx, ny, dtype, "numba")
    workload = Weather(nx, ny, steps=1, dtype=dtype, steps_per_task=steps_per_task, periodic=model.periodic_rows())
    load_before = os.getloadavg()[0]
    client = cluster(workers=2, threads_per_worker=1, gpus=False, dashboard_address="127.0.0.1:0", quiet=True)
    try:
        client.wait_for_workers(2)
        workers = sorted(worker_info(client))
        round_trip = _superstep_time(client, workers, 1)
        per_task = _superstep_time(client, workers, 2) / 6
        transfer_overhead, link_bandwidth = _transfer_costs(client, workers)
        scheduler = SchedulerModel(per_task, round_trip, transfer_overhead)
        link = replace(LINKS["tcp-local"], name="tcp-local (measured)", bandwidth=link_bandwidth, latency_s=0.0)
        rows, profile = [], {"task_overhead_s": per_task, "round_trip_s": round_trip,
                             "transfer_overhead_s": transfer_overhead, "link_bytes_per_s": link.bandwidth,
                             "stencil_fraction": DEVICES["cpu"].fraction("stencil", dtype),
                             "stencil_fraction_source": DEVICES["cpu"].sources["stencil"]}
        for partitions in (1, 2):
            bandwidth = _copy_bandwidth(client, workers[:partitions], COPY_WORKING_SET)
            profile[f"copy_bytes_per_s_{partitions}_workers"] = bandwidth
            device = replace(DEVICES["cpu"], name="cpu (measured here)", bandwidth=bandwidth, copy_fraction=1.0)
            predicted = workload.cost(partitions, device, link, scheduler)
            named = workload.cost(partitions, DEVICES["cpu"], LINKS["tcp-local"], SchedulerModel(3e-3, 6e-3, 4e-3))
            [(seconds, compute, halo, share)] = _time_engine(client, model, partitions,
                                                             predicted.steps_per_task, supersteps, repeats=1)
            k = predicted.steps_per_task
            rows.append({
                "workers": partitions, "steps_per_task": k,
                "predicted_s_per_step": predicted.seconds_per_step, "measured_s_per_step": seconds,
                "relative_error": _relative_error(predicted.seconds_per_step, seconds),
                "predicted_compute_s": predicted.compute_s, "measured_compute_s": float(compute) / k,
                "predicted_transfer_s": predicted.transfer_s, "measured_halo_s": float(halo) / k,
                "predicted_scheduler_s": predicted.scheduler_s, "measured_other_s": float(share) * seconds,
                "named_profile_s_per_step": named.seconds_per_step,
                "named_profile_relative_error": _relative_error(named.seconds_per_step, seconds)})
    finally:
        local = client.cluster
        client.close()
        local.close()
    one, two = rows
    return {"workload": "weather", "case": "turbulence", "grid": [nx, ny], "dtype": dtype,
            "profile": profile, "rows": rows,
            "predicted_efficiency": one["predicted_s_per_step"] / (2 * two["predicted_s_per_step"]),
            "measured_efficiency": one["measured_s_per_step"] / (2 * two["measured_s_per_step"]),
            "load_average": [load_before, os.getloadavg()[0]], "cores": len(os.sched_getaffinity(0))}


def format_check(result):
    """The check as a human-readable table."""
    p = result["profile"]
    nx, ny = result["grid"]
    lines = [f"hpcgpu plan --check: weather ({result['case']}) {nx} x {ny} {result['dtype']}, strong scaling "
             f"on 1 and 2 local CPU workers ({result['cores']} cores, load average "
             f"{result['load_average'][0]:.2f} before, {result['load_average'][1]:.2f} after)",
             f"measured here: copy {p['copy_bytes_per_s_1_workers'] / 1e9:.3g} GB/s (1 worker), "
             f"{p['copy_bytes_per_s_2_workers'] / 1e9:.3g} GB/s each (2 at once); dask "
             f"{p['task_overhead_s'] * 1e3:.3g} ms per task, {p['round_trip_s'] * 1e3:.3g} ms per dependent level, "
             f"{p['transfer_overhead_s'] * 1e3:.3g} ms + {p['link_bytes_per_s'] / 1e9:.3g} GB/s per transfer; "
             f"kernel at {p['stencil_fraction']:.2f} of its roofline (docs/benchmarks.md)",
             f"{'workers':>7} {'K':>3} {'predicted s/step':>17} {'measured s/step':>16} {'error':>7}   "
             "predicted compute/transfer/dask | measured compute/halo/other (ms/step)"]
    for r in result["rows"]:
        lines.append(f"{r['workers']:>7} {r['steps_per_task']:>3} {r['predicted_s_per_step']:>17.4g} "
                     f"{r['measured_s_per_step']:>16.4g} {r['relative_error']:>+7.0%}   "
                     f"{r['predicted_compute_s'] * 1e3:.3g}/{r['predicted_transfer_s'] * 1e3:.3g}/"
                     f"{r['predicted_scheduler_s'] * 1e3:.3g} | {r['measured_compute_s'] * 1e3:.3g}/"
                     f"{r['measured_halo_s'] * 1e3:.3g}/{r['measured_other_s'] * 1e3:.3g}")
    lines.append(f"parallel efficiency 1 -> 2 workers: predicted {result['predicted_efficiency']:.2f}, "
                 f"measured {result['measured_efficiency']:.2f}; with the documented profile instead of the one "
                 "measured here the error would be "
                 + ", ".join(f"{r['named_profile_relative_error']:+.0%}" for r in result["rows"]))
    return "\n".join(lines)
