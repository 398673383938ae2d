"""Cluster acceptance: measure every worker, every pair, every workload; judge against thresholds.

:func:`run_acceptance` drives the probes of :mod:`hpcgpu.bench.probes` on
each worker of an attached dask cluster, measures worker-to-worker
transfers for every ordered pair along both paths data takes (dask tasks,
through the scheduler; and the partitioned engine's communicator, rank to
rank, with :mod:`hpcgpu.bench.comm`) and the communicator's allreduce and
barrier latency over all workers, runs strong and weak scaling over 1..N
workers through the partitioned engine of every registered workload that
declares a ``"scaling"`` benchmark case (:class:`hpcgpu.registry.BenchmarkCase`;
hpcgpu's own: the N-body, molecular-dynamics and weather models), each weak
line beside what copies of the one-worker run reach side by side with no
engine (the hardware's own limit), and checks the results against
:class:`Thresholds`.
Every result is one JSON-able dict (``"suite": "acceptance"``, ``"kind"``
says what it is); :mod:`hpcgpu.bench.report` turns them into HTML.

Workers on the same host share memory bandwidth and cores, so their
single-worker measurements run one host-mate at a time; workers on
different hosts are measured at once. A worker whose kernel rate, or a
pair whose transfer bandwidth, falls below its peers is measured once more
and judged by its faster run (:mod:`hpcgpu.bench.second_look`): a slow
worker is slow twice, a slow spell of a shared host is not.

Examples
--------
>>> from hpcgpu.cluster import start_cluster  # doctest: +SKIP
>>> records = run_acceptance(start_cluster(workers=2), quick=True)  # doctest: +SKIP
>>> [r for r in records if r["kind"] == "verdict"][0]["passed"]  # doctest: +SKIP
True
"""

import json
import math
import statistics
import sys
import time
import uuid

import numpy as np

from hpcgpu.bench import comm, probes, second_look
from hpcgpu.bench.comm import task_round_trips
from hpcgpu.bench.report import Thresholds
from hpcgpu.cluster import worker_info

__all__ = ["run_acceptance", "estimate_seconds", "measure_transfers", "task_round_trips", "scaled_workloads",
           "WORKLOADS"]


def scaled_workloads():
    """The names (``hpcgpu plan``'s where there is one) of the workloads that declare a ``"scaling"`` case."""
    from hpcgpu import registry

    return tuple(w.plan_name or w.name for w in registry.benchmarked("scaling").values())


WORKLOADS = scaled_workloads()
"""The workloads acceptance scales by default, read from the registry when this module is imported."""
# Rough seconds per worker for the single-worker probes, and per scaling run (quick, full).
_PROBE_S = {True: 8.0, False: 40.0}
_SCALING_RUN_S = {True: 4.0, False: 12.0}


def estimate_seconds(workers, quick, hosts=1, workloads=WORKLOADS):
    """A rough run time of :func:`run_acceptance` (s), printed before it starts."""
    rounds = math.ceil(workers / max(1, hosts))
    pairs = workers * (workers - 1)
    counts = len(_worker_counts(workers))
    transfers = pairs * ((0.5 + 2.0) if quick else (2.0 + 3.0))  # tasks, then the communicator
    scaling = 2 * counts * len(workloads) * (_SCALING_RUN_S[quick] + (SCALING_ROUNDS - 1) * SCALING_SECONDS[quick])
    # the weak runs' copies side by side: set up, then alone and together each round
    scaling += (counts - 1) * len(workloads) * (_SCALING_RUN_S[quick] + 2 * SCALING_ROUNDS * SCALING_SECONDS[quick])
    return rounds * _PROBE_S[quick] + transfers + scaling


def _worker_counts(workers):
    counts = sorted({1, workers, *(2**k for k in range(int(math.log2(max(workers, 1))) + 1))})
    return [c for c in counts if c <= workers]


def _emit(records, record, stream):
    record = {"suite": "acceptance", **record}
    records.append(record)
    if stream is not None:
        # strict JSON: a failed kernel's error of inf, or a transfer's inf bandwidth, would print as
        # Infinity, which JSON readers other than Python's refuse; the record itself keeps the value
        print(json.dumps(_finite(record), default=_plain, allow_nan=False), file=stream, flush=True)
    return record


def _finite(value):
    """``value`` with every non-finite float (also inside dicts and lists) replaced by None."""
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    if isinstance(value, (np.integer, np.floating)):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _plain(value):
    if isinstance(value, (np.integer, np.floating)):
        return value.item()
    return str(value)


def _on_each(client, workers, hosts, function, *args, key):
    """``{worker: function(*args)}`` run on every worker, one worker per host at a time."""
    by_host = {}
    for w in workers:
        by_host.setdefault(hosts[w], []).append(w)
    results = {}
    for round_index in range(max(len(ws) for ws in by_host.values())):
        batch = [ws[round_index] for ws in by_host.values() if round_index < len(ws)]
        futures = {w: client.submit(function, *args, key=f"{key}-{uuid.uuid4().hex[:8]}", workers=[w],
                                    allow_other_workers=False, pure=False) for w in batch}
        for w, f in futures.items():
            try:
                results[w] = f.result()
            except Exception as exc:  # noqa: BLE001 - a worker that cannot run a probe is a finding
                results[w] = {"error": f"{type(exc).__name__}: {exc}"}
    return results


def _payload(nbytes):
    return np.ones(max(1, nbytes // 8))


def _touch(array):
    return int(array.nbytes)


def _kernel_checks(client, workers, hosts, ceilings, quick, fraction):
    """``{worker: kernel-check records}``; a worker below ``fraction`` of its peers in a family is
    measured once more and judged by its faster run (:mod:`.second_look`)."""
    def measure(w):
        return _on_each(client, [w], hosts, probes.kernel_checks, ceilings[w], "auto", quick,
                        key="acceptance-kernels")[w]

    def measure_again(slow):
        for w in slow:
            again = measure(w)
            if isinstance(again, list):
                runs[w] = second_look.keep_faster(runs[w], again)

    runs = {w: measure(w) for w in workers}
    second_look.look_again(lambda: second_look.below_peers(runs, fraction), measure_again)
    return runs


def _bandwidth(nbytes, small, large):
    # a large transfer measured no slower than the tiny one (timer noise against a quick copy between
    # local workers): its whole time bounds the bandwidth from below, where a difference would be inf
    return nbytes / (large - small) if large > small else nbytes / large


def _transfers(client, workers, nbytes, fraction):
    """``{(source, destination): (latency s, [bandwidths measured])}``: a pair below ``fraction`` of
    the other pairs' median is measured once more (:mod:`.second_look`)."""
    def measure_again(slow):
        for pair, (small, large) in measure_transfers(client, workers, nbytes, pairs=slow).items():
            latency, bandwidths = out[pair]
            out[pair] = (min(latency, small), bandwidths + [_bandwidth(nbytes, small, large)])

    out = {pair: (small, [_bandwidth(nbytes, small, large)])
           for pair, (small, large) in measure_transfers(client, workers, nbytes).items()}
    second_look.look_again(lambda: second_look.pairs_below_peers(
        {pair: max(bandwidths) for pair, (_, bandwidths) in out.items()}, fraction), measure_again)
    return out


def measure_transfers(client, workers, nbytes, repeats=3, pairs=None):
    """``{(source, destination): (seconds small, seconds large)}`` for every ordered pair.

    Each is the median wall time of a task on the destination that needs an
    array made on the source: a tiny one (latency, including the scheduler
    round trip a dask program pays) and one of ``nbytes`` (bandwidth from
    the difference). Every repeat moves a freshly made array, never a
    replica the destination already holds. ``pairs`` limits it to those pairs.
    """
    from distributed import wait

    out = {}
    for source in workers:
        for destination in workers:
            if destination == source or (pairs is not None and (source, destination) not in pairs):
                continue
            timings = {}
            for size in (8, nbytes):
                durations = []
                for _ in range(repeats):
                    made = client.submit(_payload, size, workers=[source], allow_other_workers=False, pure=False,
                                         key=f"acceptance-payload-{uuid.uuid4().hex[:8]}")
                    wait(made)
                    start = time.perf_counter()
                    client.submit(_touch, made, workers=[destination], allow_other_workers=False, pure=False,
                                  key=f"acceptance-transfer-{uuid.uuid4().hex[:8]}").result()
                    durations.append(time.perf_counter() - start)
                    del made
                timings[size] = float(np.median(durations))
            out[(source, destination)] = (timings[8], timings[nbytes])
    return out


def _communicator(client, workers, hosts, nbytes, quick, stream, records):
    """The communicator's records: per ordered pair its round trip and bandwidth, then its collectives."""
    small = comm.DEFAULT_SIZES[0]
    protocol = comm.protocol_of(client.scheduler.address)
    try:
        measured = comm.measure(client, workers, sorted({small, nbytes}), repeats=50 if quick else 200,
                                traffic_bytes=2**28 if quick else 2**31)
    except Exception as exc:  # noqa: BLE001 - a communicator that cannot run is a finding
        _emit(records, {"kind": "comm", "error": f"{type(exc).__name__}: {exc}", "protocol": protocol}, stream)
        return
    transport = measured["transport"]
    for (source, destination), by_size in measured["pairs"].items():
        round_trips, large = by_size[small], by_size[nbytes]
        _emit(records, {"kind": "comm", "source": source, "destination": destination, "transport": transport,
                        "protocol": protocol, "small_bytes": small,
                        "round_trip_s": float(np.median(round_trips)),
                        "round_trip_p90_s": float(np.percentile(round_trips, 90)), "bytes": nbytes,
                        "bandwidth_bytes_per_s": 2 * nbytes / float(np.median(large)),
                        "same_host": hosts[source] == hosts[destination]}, stream)
    for op in ("allreduce", "barrier"):
        durations = measured[op]
        _emit(records, {"kind": "collective", "op": op, "workers": len(workers), "transport": transport,
                        "protocol": protocol, "latency_s": float(np.median(durations)),
                        "p90_s": float(np.percentile(durations, 90)), "repeats": len(durations)}, stream)


SCALING_SECONDS = {True: 1.0, False: 4.0}
"""Timed seconds of each scaling run (quick, full): long enough that the per-run
costs (the first epoch's round trips, ~20-50 ms here) are small against the steps."""

SCALING_ROUNDS = 3
"""Timed runs of each worker count, taken in turn (1, 2, ..., 1, 2, ...): a
slow spell of a shared machine then falls on both sides of an efficiency,
and the median of each count's runs is what it is judged by."""


def _scaling(client, workload, workers, quick, stream, records):
    """Strong and weak scaling of one workload over 1..N workers (seconds per step, efficiency).

    For each mode, one simulation per worker count is set up and kept: it
    compiles and places its partitions (K steps), and measures its speed on
    a short run, which sets its timed run to as many steps as fill
    :data:`SCALING_SECONDS` (whole supersteps of K), the steady state a long
    run sees. Then :data:`SCALING_ROUNDS` rounds time every count in turn;
    each count's seconds per step is the median of its runs.
    """
    from hpcgpu.simulation import Simulation

    counts = _worker_counts(len(workers))
    results = {}
    for mode in ("strong", "weak"):
        runs, sims = {}, {}
        try:
            for count in counts:
                model, state, dt, steps, k, size = _scaling_case(workload, mode, count, counts[-1], quick)
                # no diagnostics or checks inside the timed steps
                sim = sims[count] = Simulation(model, state, dt=dt, progress=False, client=client,
                                               partitions=count, steps_per_task=k, diagnostics=10**9,
                                               check=10**9)
                sim.run(steps=k)  # compile and place the partitions
                start = time.perf_counter()
                sim.run(steps=steps)
                probe = (time.perf_counter() - start) / steps
                timed = max(steps, k * math.ceil(SCALING_SECONDS[quick] / max(probe, 1e-9) / k))
                runs[count] = {"k": k, "size": size, "steps": timed, "seconds": []}
            for _ in range(SCALING_ROUNDS):
                for count in counts:
                    start = time.perf_counter()
                    sims[count].run(steps=runs[count]["steps"])
                    runs[count]["seconds"].append((time.perf_counter() - start) / runs[count]["steps"])
        finally:
            for sim in sims.values():
                sim.close()
        base = float(np.median(runs[counts[0]]["seconds"]))
        for count in counts:
            run = runs[count]
            seconds = float(np.median(run["seconds"]))
            efficiency = base / (count * seconds) if mode == "strong" else base / seconds
            results[(mode, count)] = seconds
            extra = {}
            if mode == "weak" and count > 1:
                try:
                    extra["side_by_side_efficiency"] = _side_by_side(client, workload, workers[:count],
                                                                     counts[-1], quick, runs[counts[0]]["steps"])
                except Exception as exc:  # noqa: BLE001 - the line stands without its ceiling; say why
                    extra["side_by_side_error"] = f"{type(exc).__name__}: {exc}"
            _emit(records, {"kind": "scaling", "workload": workload, "mode": mode, "workers": count,
                            "seconds_per_step": seconds, "efficiency": efficiency, "size": run["size"],
                            "steps_per_task": run["k"], "steps": run["steps"],
                            "runs_s_per_step": run["seconds"], **extra}, stream)
    return results


_COPIES = {}  # on a worker: (workload, largest, quick) -> its warm one-process copy of the one-worker weak run


def _copy_seconds_per_step(workload, largest, quick, steps):
    """Seconds per step of this worker's own copy of the one-worker weak run: in its process, no engine."""
    from hpcgpu.simulation import Simulation

    key = (workload, largest, quick)
    sim = _COPIES.get(key)
    if sim is None:
        model, state, dt, _, k, _ = _scaling_case(workload, "weak", 1, largest, quick)
        sim = _COPIES[key] = Simulation(model, state, dt=dt, progress=False, diagnostics=10**9, check=10**9)
        sim.run(steps=k)  # compile
    start = time.perf_counter()
    sim.run(steps=steps)
    return (time.perf_counter() - start) / steps


def _drop_copies():
    _COPIES.clear()


def _side_by_side(client, workload, workers, largest, quick, steps):
    """What weak scaling over ``workers`` can reach on this hardware, with no engine at all.

    Each worker steps its own copy of the one-worker run in its process:
    one worker alone, then all of them at once, :data:`SCALING_ROUNDS`
    times in turn. Copies on one host share its cores, caches and memory
    bandwidth (and, on a VM, the host's scheduler); a coupled run goes at
    the pace of its slowest rank, so the ceiling is the median time alone
    over the median of the slowest copy's time side by side. A weak-scaling
    efficiency near it is the hardware's limit, not the engine's.
    """
    def on(worker):
        return client.submit(_copy_seconds_per_step, workload, largest, quick, steps, workers=[worker],
                             allow_other_workers=False, pure=False, key=f"acceptance-copy-{uuid.uuid4().hex}")

    try:
        for worker in workers:  # compile and set up each copy, one at a time
            on(worker).result()
        alone, together = [], []
        for _ in range(SCALING_ROUNDS):
            alone.append(on(workers[0]).result())
            together.append(max(f.result() for f in [on(w) for w in workers]))
    finally:
        client.run(_drop_copies, workers=list(workers))
    return float(np.median(alone) / np.median(together))


def _scaling_case(workload, mode, count, largest, quick):
    """``(model, state, dt, steps, steps_per_task, size)`` of a scaling run on ``count`` workers.

    The model is the workload's ``"scaling"`` benchmark case, ``count``
    times one worker's share (weak) or ``largest`` times (strong); K is the
    engine's own default; ``steps`` (whole supersteps, at least 20) time the
    run's speed before its timed runs are sized.
    """
    from hpcgpu import registry
    from hpcgpu.partition.decompositions import decomposition_for

    _, case = registry.benchmark_case("scaling", workload)
    size = case.default_size(quick)
    model = case.model(size, backend="auto", scale=count if mode == "weak" else largest)
    state = model.initial_state()
    dt = case.dt(model, state)
    # the engine's own default: the K of the layout it builds for count ranks when given none
    k = decomposition_for(model).build(model, dt, count, None, None, False).steps_per_task
    steps = k * max(4, math.ceil(20 / k))
    return model, state, dt, steps, k, case.recorded_size(model, size)


def run_acceptance(client, *, quick=False, thresholds=None, workloads=WORKLOADS, stream=None,
                   transfer_bytes=None):
    """Measure the attached cluster and judge it; returns the list of records.

    Parameters
    ----------
    client : distributed.Client
    quick : bool
        Small sizes (minutes on a laptop).
    thresholds : Thresholds, optional
        Pass/fail limits (default :class:`Thresholds` ()).
    workloads : sequence of str
        Which of :data:`WORKLOADS` to scale.
    stream : file, optional
        Where to print each record as a JSON line as it is made.
    transfer_bytes : int, optional
        Payload of the bandwidth measurements, through tasks and through the
        communicator (default 16 MiB quick, 256 MiB full).
    """
    thresholds = thresholds or Thresholds()
    info = worker_info(client)
    workers = sorted(info)
    if not workers:
        from hpcgpu.errors import ClusterError

        raise ClusterError("the dask cluster has no workers")
    records = []
    started = time.perf_counter()
    inventories = _on_each(client, workers, {w: w for w in workers}, probes.inventory, key="acceptance-inventory")
    hosts = {w: inventories[w].get("host", w) for w in workers}
    for w in workers:
        _emit(records, {"kind": "inventory", "worker": w, **inventories[w]}, stream)
    ceilings = _on_each(client, workers, hosts, probes.ceilings, "auto", quick, key="acceptance-ceilings")
    for w in workers:
        _emit(records, {"kind": "ceiling", "worker": w, **ceilings[w]}, stream)
    kernels = _kernel_checks(client, [w for w in workers if "error" not in ceilings[w]], hosts, ceilings, quick,
                             thresholds.peer_fraction)
    for w, checks in kernels.items():
        for check in (checks if isinstance(checks, list) else [checks]):
            _emit(records, {"kind": "kernel", "worker": w, **check}, stream)
    energy = _on_each(client, workers, hosts, probes.energy_per_step, "auto", quick, key="acceptance-energy")
    for w in workers:
        _emit(records, {"kind": "energy", "worker": w, **energy[w]}, stream)
    nbytes = transfer_bytes or (16 if quick else 256) * 2**20
    for (source, destination), (latency, bandwidths) in _transfers(client, workers, nbytes,
                                                                   thresholds.transfer_fraction).items():
        _emit(records, {"kind": "transfer", "source": source, "destination": destination, "bytes": nbytes,
                        "latency_s": latency, "bandwidth_bytes_per_s": max(bandwidths),
                        "bandwidths_measured": bandwidths, "same_host": hosts[source] == hosts[destination]},
              stream)
    if len(workers) > 1:
        _communicator(client, workers, hosts, nbytes, quick, stream, records)
    for workload in workloads:
        _scaling(client, workload, workers, quick, stream, records)
    for record in judge(records, thresholds, workers):
        _emit(records, record, stream)
    _emit(records, {"kind": "run", "seconds": time.perf_counter() - started, "quick": quick,
                    "workers": len(workers), "hosts": len(set(hosts.values()))}, stream)
    return records


def _median_of_peers(values, worker):
    peers = [v for w, v in values.items() if w != worker and v is not None and math.isfinite(v)]
    return statistics.median(peers) if peers else None


def judge(records, thresholds, workers):
    """Verdict records: per worker, per pair, per scaling series, then one overall."""
    verdicts = []

    def verdict(subject, check, passed, detail):
        verdicts.append({"kind": "verdict", "subject": subject, "check": check, "passed": bool(passed),
                         "detail": detail})

    rates = {}  # (metric) -> {worker: value}
    for r in records:
        if r["kind"] == "ceiling" and "error" not in r:
            rates.setdefault("copy bandwidth", {})[r["worker"]] = r["copy_bytes_per_s"]
            rates.setdefault("GEMM rate", {})[r["worker"]] = r["gemm_flops_per_s"]
        elif r["kind"] == "kernel" and "family" not in r:
            # the worker's kernel checks did not run at all (the probe task failed): a finding, not a crash
            verdict(r["worker"], "kernel checks ran", False, r.get("error", "no kernel checks"))
        elif r["kind"] == "kernel":
            rates.setdefault(f"{r['family']} rate", {})[r["worker"]] = r["rate"]
            verdict(r["worker"], f"{r['family']} correct", r["passed"] or not thresholds.correctness,
                    f"max relative error {r['max_relative_error']:.2e} (tolerance {r['tolerance']:.0e})")
            if r.get("ratio_to_plain") is not None:
                verdict(r["worker"], f"{r['family']} vs plain Numba", r["ratio_to_plain"] >= thresholds.plain_ratio,
                        f"{r['ratio_to_plain']:.2f}x a plain Numba kernel of the same job, timed in turns "
                        f"(threshold {thresholds.plain_ratio:.2f}x)")
        elif r["kind"] == "ceiling":
            verdict(r["worker"], "probes ran", False, r["error"])
    for metric, values in rates.items():
        for w, value in values.items():
            median = _median_of_peers(values, w)
            if median:
                ratio = value / median
                verdict(w, f"{metric} vs peers", ratio >= thresholds.peer_fraction,
                        f"{ratio:.0%} of the median of its peers (threshold {thresholds.peer_fraction:.0%})")
    # transfer_fraction judges each path on its own: pairs through tasks, pairs through the communicator
    for kind, check in (("transfer", "transfer bandwidth vs peers"), ("comm", "communicator bandwidth vs peers")):
        transfers = {(r["source"], r["destination"]): r["bandwidth_bytes_per_s"] for r in records
                     if r["kind"] == kind and "error" not in r}
        for pair, value in transfers.items():
            others = [v for p, v in transfers.items() if p != pair and math.isfinite(v)]
            if others and math.isfinite(value):
                ratio = value / statistics.median(others)
                verdict(f"{pair[0]} -> {pair[1]}", check, ratio >= thresholds.transfer_fraction,
                        f"{ratio:.0%} of the median pair (threshold {thresholds.transfer_fraction:.0%})")
    for r in records:
        if r["kind"] == "comm" and "error" in r:
            verdict("cluster", "communicator ran", False, r["error"])
    for r in records:
        if r["kind"] == "scaling" and r["workers"] > 1:
            limit = thresholds.strong_efficiency if r["mode"] == "strong" else thresholds.weak_efficiency
            ceiling = r.get("side_by_side_efficiency")
            beside = "" if ceiling is None else f"; {r['workers']} copies side by side, no engine: {ceiling:.0%}"
            verdict(f"{r['workload']} on {r['workers']} workers", f"{r['mode']} scaling efficiency",
                    r["efficiency"] >= limit, f"{r['efficiency']:.0%} (threshold {limit:.0%}{beside})")
    devices = {r["worker"]: r.get("device") for r in records if r["kind"] == "inventory"}
    reference = rates.get("stencil/diffusion rate", {})
    fastest = max(reference.values()) if reference else None
    verdicts.append({"kind": "balance", "mixed": len(set(devices.values())) > 1, "devices": devices,
                     "relative_speed": {w: v / fastest for w, v in reference.items()} if fastest else {},
                     "partition_weights": _weights(reference)})
    failed = [v for v in verdicts if v["kind"] == "verdict" and not v["passed"]]
    verdicts.append({"kind": "summary", "passed": not failed, "checks": sum(v["kind"] == "verdict" for v in verdicts),
                     "failed": [f"{v['subject']}: {v['check']} ({v['detail']})" for v in failed]})
    return verdicts


def _weights(rates):
    """The partition weights the engine would give each worker (proportional to its rate)."""
    total = sum(rates.values())
    return {w: v / total for w, v in rates.items()} if total else {}


def print_summary(records, stream=sys.stderr):
    summary = [r for r in records if r["kind"] == "summary"][-1]
    print(f"hpcgpu bench: {'PASSED' if summary['passed'] else 'FAILED'} ({summary['checks']} checks, "
          f"{len(summary['failed'])} failed)", file=stream)
    for line in summary["failed"]:
        print(f"  FAIL {line}", file=stream)
