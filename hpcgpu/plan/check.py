"""``hpcgpu plan --check``: the plan's model against a measured run on this machine.

On a local CPU cluster of 2 workers (one thread each) it measures, on the
spot, every figure the model takes from the machine:

- copy bandwidth per worker with :func:`hpcgpu.bench.harness.copy_bandwidth`
  on a working set far beyond the caches (256 MiB), the memory bandwidth
  that the documented kernel fraction is relative to, with P workers
  copying at once for the P-worker prediction (CPU workers share one
  memory system);
- the communicator's latency per message and bandwidth, from ping-pong
  round trips of 4 KiB and 1 MiB between the two workers (the halo
  messages of the default grid are ~0.9 MB), with
  :func:`hpcgpu.bench.comm.measure`, the measurement of ``hpcgpu bench
  comm``; and its scalar allreduce, for the record;
- the engine's cost per epoch on 1 and on 2 workers: epochs that only
  check the health of the smallest model of the case, submitted and waited
  for one at a time;

keeps the kernel's fraction of its roofline from ``docs/journal.md``
(the named ``cpu`` profile of the kernel family the workload's cost model
declares, ``Workload.plan_kernel``), predicts the seconds per step on 1
and 2 workers, then runs the model on the engine, one epoch of
``supersteps`` supersteps at a time as the prediction assumes, and reports
the relative error of each prediction.

The model is the ``"plan_check"`` benchmark case of the workload
(:class:`hpcgpu.registry.BenchmarkCase`; hpcgpu's own: the weather model),
built and timed with :mod:`hpcgpu.bench`'s public functions; the cost model
is given the parameters the workload reads off that model
(``Workload.plan_parameters``).
"""

import os
import time
from dataclasses import replace

import numpy as np

from hpcgpu.cluster import worker_info
from hpcgpu.errors import ConfigError
from hpcgpu.plan.profiles import DEVICES, LINKS, LinkProfile, SchedulerModel
from hpcgpu.plan.workload_costs import make_workload

__all__ = ["check_against_this_machine", "fit_link", "format_check"]

COPY_WORKING_SET = 256 * 2 ** 20
"""Bytes each worker copies to measure its memory bandwidth: beyond the caches."""

MESSAGE_SIZES = (4096, 2 ** 20)
"""Round-trip sizes (bytes) the link is fitted to: latency from the small, bandwidth between the two."""

_COMM_REPEATS = 50
_EPOCH_REPEATS = 9


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


def fit_link(round_trips, name="measured"):
    """A LinkProfile from ping-pong round trips ``{size in bytes: seconds}`` (two sizes or more).

    One way, a message of ``n`` bytes takes ``latency + n / bandwidth``: the
    bandwidth comes from the smallest and the largest size, the latency from
    the smallest. A noisy pair that makes the larger message no slower is
    credited with at most 64 GB/s.

    Examples
    --------
    >>> link = fit_link({4096: 0.36e-3, 2 ** 20: 0.92e-3})
    >>> round(link.bandwidth / 1e9, 2), round(link.latency_s * 1e6)
    (3.73, 179)
    """
    small, large = min(round_trips), max(round_trips)
    extra = (large - small) * 2  # both ways
    bandwidth = extra / max(round_trips[large] - round_trips[small], extra / 64e9)
    latency = max(0.0, round_trips[small] / 2 - small / bandwidth)
    return LinkProfile(name, bandwidth, latency,
                       f"measured: round trips of {small} and {large} bytes through the communicator")


def _measure_link(client, workers, repeats=_COMM_REPEATS):
    """The communicator between the two workers: a fitted LinkProfile and the raw medians."""
    from hpcgpu.bench.comm import measure

    measured = measure(client, workers[:2], MESSAGE_SIZES, repeats, collectives=True)
    round_trips = {size: float(np.median([np.median(by_size[size]) for by_size in measured["pairs"].values()]))
                   for size in MESSAGE_SIZES}
    link = fit_link(round_trips, "tcp-local (measured now)")
    link = replace(link, source=f"measured: hpcgpu plan --check ({link.source.split(': ', 1)[1]})")
    return link, {f"round_trip_{size}_s": seconds for size, seconds in round_trips.items()} | {
        "allreduce_s": float(np.median(measured["allreduce"]))}


def _epoch_overhead(client, case, partitions, dtype, repeats=_EPOCH_REPEATS):
    """Median seconds of an epoch that does almost nothing (a health check of the case's smallest model), waited
    for at once."""
    from hpcgpu.partition.engine import PartitionedExecutor

    model = case.model(case.min_size, dtype=dtype, backend="numba", scale=partitions)
    state = model.initial_state()
    executor = PartitionedExecutor(client, model, state, case.dt(model, state), partitions=partitions,
                                   steps_per_task=1, name="plan-check-epoch")
    try:
        executor.health()  # the first epoch loads the model on the workers
        samples = []
        for _ in range(repeats):
            start = time.perf_counter()
            executor.request_health(executor.step)
            executor.collect(block=True)
            samples.append(time.perf_counter() - start)
    finally:
        executor.close()
    return float(np.median(samples))


def _relative_error(predicted, measured):
    return (predicted - measured) / measured


def check_against_this_machine(workload=None, *, steps_per_task=8, dtype="float32", supersteps=12, repeats=3,
                               **sizes):
    """Predicted vs measured seconds per step of a workload on 1 and 2 local CPU workers.

    Parameters
    ----------
    workload : str, optional
        A workload with a cost model that declares a ``"plan_check"``
        benchmark case (its name or ``hpcgpu plan`` name); default the
        first registered one (hpcgpu's own: weather).
    steps_per_task : int
        K, steps per exchange, where the cost model takes one.
    dtype : str
    supersteps : int
        Supersteps per timed epoch.
    repeats : int
        Timed epochs per worker count (the median is reported).
    **sizes
        The workload's ``hpcgpu plan`` sizes (``Workload.plan_sizes``: the
        grid's two sides for weather): the whole problem (strong scaling
        from 1 to 2 workers); a size not given is the case's.

    Returns
    -------
    dict
        ``workload``, ``case``, ``size`` (the cost model's parameters of
        the run), ``profile`` (what was measured, and
        ``implied_kernel_fraction``: the kernel fraction that would have
        predicted the 1-worker run's compute), ``rows`` (one dict per worker
        count with the predicted and measured seconds per step, their parts
        and ``relative_error``), and the predicted and measured efficiency.

    Raises
    ------
    ConfigError
        A workload without a cost model or ``"plan_check"`` case, a size
        that is not one of its plan sizes or out of range (before any
        cluster starts).

    Examples
    --------
    >>> result = check_against_this_machine()  # doctest: +SKIP
    >>> abs(result["rows"][0]["relative_error"]) < 1  # doctest: +SKIP
    True
    """
    from hpcgpu import registry
    from hpcgpu.bench.scaling import median_run, time_engine
    from hpcgpu.cluster import start_cluster

    declared, case = registry.benchmark_case("plan_check", workload)
    if declared.plan is None or declared.plan_parameters is None:
        raise ConfigError(f"workload {declared.name!r} needs a cost model and Workload.plan_parameters for "
                          "hpcgpu plan --check")
    plan_name = declared.plan_name or declared.name
    model = case.model(_case_size(declared, case, sizes), dtype=dtype, backend="numba")
    parameters = declared.plan_parameters(model)
    cost_model = make_workload(plan_name, **parameters, steps=1, dtype=dtype,
                               **_if_taken(declared, steps_per_task=steps_per_task))
    family = declared.plan_kernel or "copy"
    load_before = os.getloadavg()[0]
    client = start_cluster(workers=2, threads_per_worker=1, gpus=False, dashboard_address="127.0.0.1:0", quiet=True)
    try:
        client.wait_for_workers(2)
        workers = sorted(worker_info(client))
        link, comm = _measure_link(client, workers)
        rows = []
        profile = {"link_latency_s": link.latency_s, "link_bytes_per_s": link.bandwidth, **comm,
                   "kernel_family": family, "kernel_fraction": DEVICES["cpu"].fraction(family, dtype),
                   "kernel_fraction_source": DEVICES["cpu"].sources.get(family, "")}
        for partitions in (1, 2):
            bandwidth = _copy_bandwidth(client, workers[:partitions], COPY_WORKING_SET)
            overhead = _epoch_overhead(client, case, partitions, dtype)
            profile[f"copy_bytes_per_s_{partitions}_workers"] = bandwidth
            profile[f"epoch_overhead_s_{partitions}_workers"] = overhead
            device = replace(DEVICES["cpu"], name="cpu (measured here)", bandwidth=bandwidth, copy_fraction=1.0)
            k = cost_model.steps_per_exchange(partitions) if hasattr(cost_model, "steps_per_exchange") else 1
            epoch = k * supersteps
            scheduler = SchedulerModel(overhead, 0.0, steps_per_epoch=epoch,
                                       source="measured: hpcgpu plan --check (an epoch waited for at once)")
            predicted = cost_model.cost(partitions, device, link, scheduler)
            named = cost_model.cost(partitions, DEVICES["cpu"], LINKS["tcp-local"],
                                    SchedulerModel(steps_per_epoch=epoch))
            median = median_run(time_engine(client, model, partitions, k, supersteps, repeats=repeats,
                                            time_step=case.dt))
            seconds, compute, wait, share = median.seconds_per_step, median.compute_s, median.halo_s, \
                median.scheduler_share
            rows.append({
                "workers": partitions, "steps_per_task": k, "steps_per_epoch": epoch,
                **({} if median.grid is None else {"grid": median.grid}),
                "predicted_s_per_step": predicted.seconds_per_step, "measured_s_per_step": seconds,
                "relative_error": _relative_error(predicted.seconds_per_step, seconds),
                "predicted_compute_s": predicted.compute_s, "measured_compute_s": float(compute) / k,
                "predicted_exchange_s": predicted.exchange_s, "measured_wait_s": float(wait) / k,
                "predicted_scheduler_s": predicted.scheduler_s, "measured_outside_s": float(share) * seconds,
                "named_profile_s_per_step": named.seconds_per_step,
                "named_profile_relative_error": _relative_error(named.seconds_per_step, seconds)})
    finally:
        local = client.cluster
        client.close()
        local.close()
    one, two = rows
    # what the 1-worker run says of the kernel: the fraction that would have predicted its compute
    profile["implied_kernel_fraction"] = (profile["kernel_fraction"] * one["predicted_compute_s"]
                                          / one["measured_compute_s"])
    return {"workload": plan_name, "case": case.name, "size": parameters, "dtype": dtype,
            "profile": profile, "rows": rows,
            "predicted_efficiency": one["predicted_s_per_step"] / (2 * two["predicted_s_per_step"]),
            "measured_efficiency": one["measured_s_per_step"] / (2 * two["measured_s_per_step"]),
            "load_average": [load_before, os.getloadavg()[0]], "cores": len(os.sched_getaffinity(0))}


def _case_size(declared, case, sizes):
    """The case's size from the plan sizes given (``Workload.plan_sizes``), the case's own where none is given."""
    unknown = sorted(set(sizes) - set(declared.plan_sizes))
    if unknown:
        raise ConfigError(f"unknown size(s) {unknown} for hpcgpu plan --check of {declared.name!r}; valid: "
                          f"{list(declared.plan_sizes)}")
    default = case.size if isinstance(case.size, (tuple, list)) else (case.size,) * len(declared.plan_sizes)
    size = tuple(sizes[name] if sizes.get(name) is not None else default[i]
                 for i, name in enumerate(declared.plan_sizes))
    for name, value in zip(declared.plan_sizes, size):
        case.check_size(value, parameter=name)
    return size if len(size) > 1 else size[0]


def _if_taken(declared, **options):
    """The ``options`` that the workload's cost model takes (K, say, only where there is an exchange to space)."""
    fields = declared.cost_model().__dataclass_fields__
    return {k: v for k, v in options.items() if k in fields}


def format_check(result):
    """The check as a human-readable table."""
    p = result["profile"]
    size = " ".join(f"{k}={v}" for k, v in result["size"].items())
    small, large = MESSAGE_SIZES
    lines = [f"hpcgpu plan --check: {result['workload']} ({result['case']}) {size} {result['dtype']}, strong scaling "
             f"on 1 and 2 local CPU workers ({result['cores']} cores, load average "
             f"{result['load_average'][0]:.2f} before, {result['load_average'][1]:.2f} after)",
             f"measured here: copy {p['copy_bytes_per_s_1_workers'] / 1e9:.3g} GB/s (1 worker), "
             f"{p['copy_bytes_per_s_2_workers'] / 1e9:.3g} GB/s each (2 at once); communicator round trip "
             f"{p[f'round_trip_{small}_s'] * 1e3:.3g} ms at {small // 1024} KiB, "
             f"{p[f'round_trip_{large}_s'] * 1e3:.3g} ms at {large // 2 ** 20} MiB: "
             f"{p['link_latency_s'] * 1e3:.3g} ms per message + {p['link_bytes_per_s'] / 1e9:.3g} GB/s "
             f"(allreduce {p['allreduce_s'] * 1e3:.3g} ms); an epoch waited for at once "
             f"{p['epoch_overhead_s_1_workers'] * 1e3:.3g} ms (1 worker), "
             f"{p['epoch_overhead_s_2_workers'] * 1e3:.3g} ms (2); "
             f"{p['kernel_family']} kernel at {p['kernel_fraction']:.2f} of its roofline (docs/journal.md; the "
             f"1-worker run's compute implies {p['implied_kernel_fraction']:.2f})",
             f"{'workers':>7} {'K':>3} {'epoch':>5} {'predicted s/step':>17} {'measured s/step':>16} {'error':>7}   "
             "predicted compute/exchange/scheduler | measured compute/wait/outside epochs (ms/step)"]
    for r in result["rows"]:
        lines.append(f"{r['workers']:>7} {r['steps_per_task']:>3} {r['steps_per_epoch']:>5} "
                     f"{r['predicted_s_per_step']:>17.4g} {r['measured_s_per_step']:>16.4g} "
                     f"{r['relative_error']:>+7.0%}   "
                     f"{r['predicted_compute_s'] * 1e3:.3g}/{r['predicted_exchange_s'] * 1e3:.3g}/"
                     f"{r['predicted_scheduler_s'] * 1e3:.3g} | {r['measured_compute_s'] * 1e3:.3g}/"
                     f"{r['measured_wait_s'] * 1e3:.3g}/{r['measured_outside_s'] * 1e3:.3g}")
    lines.append(f"parallel efficiency 1 -> 2 workers: predicted {result['predicted_efficiency']:.2f}, "
                 f"measured {result['measured_efficiency']:.2f}; with the documented profile instead of the one "
                 "measured here the error would be "
                 + ", ".join(f"{r['named_profile_relative_error']:+.0%}" for r in result["rows"]))
    return "\n".join(lines)
