"""``hpcgpu plan``: predict time to solution, memory per GPU and parallel efficiency for 1..N GPUs.

The model, per time step and for the slowest partition:

``compute``
    the roofline of each kernel, ``max(bytes / copy bandwidth, flops / peak)``
    over the fraction of that bound its kernel family reaches on the device
    (measured fractions where the project has them, see
    :mod:`hpcgpu._profiles`), plus the block copies of the task path, the
    redundant work in the halos and the cost of starting each kernel;
``transfer``
    halo rows, ghost atoms or the all-gathered positions: ``levels x
    (latency + dask's cost per transfer) + bytes / bandwidth``, where levels
    counts the transfers a step waits for one after another;
``scheduler``
    dask's overhead: ``max(tasks x task overhead, dependent levels x round
    trip)`` per superstep, over the K steps a superstep advances.

They add up (nothing is assumed to overlap, so the model leans pessimistic).
Parallel efficiency is ``P0 t(P0) / (P t(P))`` against the smallest GPU
count ``P0`` whose memory holds the problem. One GPU means the engine with
one dask worker (a run without a client has no scheduler term). Start-up
(cluster, JIT compilation, scattering the initial state), diagnostics and
output are not modelled.

Examples
--------
>>> result = plan("weather", nx=4096, ny=4096, steps=1000, device="h100", interconnect="ndr", max_gpus=4)
>>> [row.gpus for row in result.rows]
[1, 2, 4]
>>> result.rows[0].bound
'bandwidth'
"""

import json
import math
from dataclasses import asdict, dataclass, field

from hpcgpu._plan_workloads import WORKLOADS, StepCost, make_workload
from hpcgpu._profiles import DEVICES, LINKS, device_profile, link_profile
from hpcgpu.errors import ConfigError
from hpcgpu.validation import check_float, check_int

__all__ = ["plan", "run_command", "add_arguments", "Plan", "PlanRow", "SchedulerModel", "StepCost",
           "make_workload", "WORKLOADS", "DEVICES", "LINKS", "TASK_OVERHEAD_S", "ROUND_TRIP_S",
           "TRANSFER_OVERHEAD_S", "EFFICIENCY_THRESHOLD", "USABLE_MEMORY_FRACTION"]

TASK_OVERHEAD_S = 1e-3
"""Scheduler cost per task on a real cluster: "each task suffers about 1ms of
overhead" (distributed.dask.org). Measured here: about 3 ms per task on this
2-core machine, where the scheduler shares the cores with the workers."""

ROUND_TRIP_S = 2e-3
"""Time for the scheduler to start a task once its input is ready (one
dependent level of a superstep): an assumption for a cluster whose scheduler
has a core of its own; about 6 ms was measured on this 2-core machine."""

TRANSFER_OVERHEAD_S = 1e-3
"""dask's own cost of one worker-to-worker transfer beyond the link's latency
(the request, serialisation, a round trip in Python): an assumption of about
one task overhead; some 4 ms were measured on this 2-core machine."""

EFFICIENCY_THRESHOLD = 0.5
"""Below this parallel efficiency a GPU count is reported as not worth it."""

USABLE_MEMORY_FRACTION = 0.9
"""Share of device memory a run may fill (the CUDA context, memory-pool slack
and library work space take the rest)."""


@dataclass(frozen=True)
class SchedulerModel:
    """dask's costs: per superstep ``max(tasks * task_overhead_s, levels * round_trip_s)``, and per transfer.

    Examples
    --------
    >>> SchedulerModel(1e-3, 2e-3).superstep_s(tasks=6, levels=2)
    0.006
    """

    task_overhead_s: float = TASK_OVERHEAD_S
    round_trip_s: float = ROUND_TRIP_S
    transfer_overhead_s: float = TRANSFER_OVERHEAD_S

    def superstep_s(self, tasks, levels):
        return max(tasks * self.task_overhead_s, levels * self.round_trip_s)


@dataclass(frozen=True)
class PlanRow:
    """The prediction for one GPU count (times in s, memory in B)."""

    gpus: int
    feasible: bool
    fits: bool
    seconds_per_step: float
    time_to_solution_s: float
    compute_s: float
    transfer_s: float
    scheduler_s: float
    memory_per_gpu_bytes: float
    parallel_efficiency: float
    bound: str
    steps_per_task: int
    note: str = ""


@dataclass(frozen=True)
class Plan:
    """Predictions for 1..N GPUs, with the warnings a user should read first.

    Attributes
    ----------
    workload : object
        The workload cost model (:func:`make_workload`).
    device, link : DeviceProfile, LinkProfile
    scheduler : SchedulerModel
    rows : list of PlanRow
        One per GPU count (powers of two up to ``max_gpus``).
    warnings : list of str
    min_gpus_to_fit : int or None
        Fewest GPUs whose memory holds the problem (None: none up to 2**20).
    """

    workload: object
    device: object
    link: object
    scheduler: SchedulerModel
    rows: list
    warnings: list = field(default_factory=list)
    min_gpus_to_fit: int = 1

    def row(self, gpus):
        """The row for ``gpus`` GPUs."""
        return next(r for r in self.rows if r.gpus == gpus)

    def header(self):
        w, d, link = self.workload, self.device, self.link
        return (f"hpcgpu plan: {w.describe()} on {d.name} ({d.memory_bytes / 1e9:.0f} GB, "
                f"{d.copy_bandwidth / 1e12:.3g} TB/s copy, {d.peak(w.dtype) / 1e12:.3g} TFLOP/s {w.dtype}) "
                f"over {link.name} ({link.bandwidth / 1e9:.3g} GB/s, {link.latency_s * 1e6:.3g} us); "
                f"dask {self.scheduler.task_overhead_s * 1e3:.3g} ms per task, "
                f"{self.scheduler.transfer_overhead_s * 1e3:.3g} ms per transfer")

    def table(self):
        """A human-readable table, the header and the warnings."""
        lines = [self.header(),
                 f"{'GPUs':>5} {'time to solution':>17} {'s/step':>10} {'compute':>9} {'transfer':>9} "
                 f"{'dask':>9} {'mem/GPU':>9} {'efficiency':>10}  bound / note"]
        for r in self.rows:
            if not r.feasible:
                lines.append(f"{r.gpus:>5} {'-':>17} {'-':>10} {'-':>9} {'-':>9} {'-':>9} {'-':>9} {'-':>10}  "
                             f"{r.note}")
                continue
            note = r.bound + ("" if r.fits else ", does not fit") + (f", {r.note}" if r.note else "")
            lines.append(f"{r.gpus:>5} {_duration(r.time_to_solution_s):>17} {r.seconds_per_step:>10.3g} "
                         f"{r.compute_s:>9.3g} {r.transfer_s:>9.3g} {r.scheduler_s:>9.3g} "
                         f"{_gigabytes(r.memory_per_gpu_bytes):>9} {r.parallel_efficiency:>10.2f}  {note}")
        lines += [f"warning: {w}" for w in self.warnings]
        return "\n".join(lines)

    def records(self):
        """One dict per GPU count, then a summary dict (what ``--json`` prints)."""
        common = {"workload": self.workload.name, "size": self.workload.size(), "dtype": self.workload.dtype,
                  "steps": self.workload.steps, "device": self.device.name, "interconnect": self.link.name}
        out = [{"kind": "plan", **common, **asdict(r)} for r in self.rows]
        out.append({"kind": "summary", **common, "min_gpus_to_fit": self.min_gpus_to_fit,
                    "warnings": list(self.warnings), "device_source": self.device.source,
                    "fraction_sources": dict(self.device.sources), "interconnect_source": self.link.source,
                    "task_overhead_s": self.scheduler.task_overhead_s,
                    "round_trip_s": self.scheduler.round_trip_s,
                    "transfer_overhead_s": self.scheduler.transfer_overhead_s})
        return [{k: _jsonable(v) for k, v in record.items()} for record in out]

    def json_lines(self):
        return "\n".join(json.dumps(record) for record in self.records())


def _jsonable(value):
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _duration(seconds):
    if not math.isfinite(seconds):
        return "-"
    for unit, size in (("d", 86400.0), ("h", 3600.0), ("min", 60.0)):
        if seconds >= size:
            return f"{seconds / size:.3g} {unit}"
    return f"{seconds:.3g} s"


def _gigabytes(nbytes):
    return f"{nbytes / 1e9:.3g} GB"


def _gpu_counts(max_gpus):
    counts, p = [], 1
    while p <= max_gpus:
        counts.append(p)
        p *= 2
    return counts


def _fits(workload, device, gpus):
    cost = workload.cost(gpus, device, LINKS["ndr"], SchedulerModel())  # memory depends on neither
    return cost.feasible and cost.memory_bytes <= USABLE_MEMORY_FRACTION * device.memory_bytes


def _min_gpus_to_fit(workload, device, limit=2 ** 20):
    """Fewest GPUs whose memory holds ``workload`` (memory per GPU falls with the count)."""
    if _fits(workload, device, 1):
        return 1
    high = 2
    while not _fits(workload, device, high):
        if high >= limit:
            return None
        high *= 2
    low = high // 2
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (low, middle) if _fits(workload, device, middle) else (middle, high)
    return high


def plan(workload, *, device="h100", interconnect="ndr", max_gpus=8, scheduler=None,
         efficiency_threshold=EFFICIENCY_THRESHOLD, memory_gb=None, **size):
    """Predict time to solution, memory per GPU and efficiency on 1, 2, 4, ... ``max_gpus`` GPUs.

    Parameters
    ----------
    workload : str or workload object
        ``"weather"`` (``nx``, ``ny``, ``steps``, ``dtype``, ``steps_per_task``,
        ``periodic``), ``"md"`` (``atoms``, ``steps``, ``dtype``, ``density``,
        ``cutoff``, ``skin``, ``rebuild_every``) or ``"nbody"`` (``bodies``,
        ``steps``, ``dtype``); or a model from :func:`make_workload`.
    device : str or DeviceProfile
        A named profile (``"h100"``, ``"h200"``, ``"a100"``, ``"cpu"``) or the
        path of a ``.jsonl`` file written by ``hpcgpu bench``.
    interconnect : str or LinkProfile
        ``"nvlink"``, ``"ndr"``, ``"100gbe"`` or ``"tcp-local"``.
    max_gpus : int
        Largest GPU count (powers of two up to it are planned).
    scheduler : SchedulerModel, optional
        dask's overheads (default: 1 ms per task, 2 ms per dependent level, 1 ms
        per worker-to-worker transfer).
    efficiency_threshold : float
        Below this efficiency a GPU count is reported as too many.
    memory_gb : float, optional
        Device memory (GB) overriding the profile's.
    **size
        The workload's parameters (see above).

    Returns
    -------
    Plan

    Raises
    ------
    ConfigError
        Unknown workload, device or interconnect (the message lists the
        valid ones), or a size <= 0.

    Examples
    --------
    >>> result = plan("nbody", bodies=1_000_000, steps=100, device="h100", max_gpus=2)
    >>> result.rows[0].bound, round(result.rows[1].parallel_efficiency, 2)
    ('compute', 0.99)
    """
    workload = make_workload(workload, **size) if isinstance(workload, str) else workload
    device = device_profile(device, memory_gb=memory_gb)
    link = link_profile(interconnect)
    scheduler = scheduler or SchedulerModel()
    max_gpus = check_int("max_gpus", max_gpus, minimum=1)
    threshold = check_float("efficiency_threshold", efficiency_threshold, minimum=0.0, maximum=1.0)
    costs = {p: workload.cost(p, device, link, scheduler) for p in _gpu_counts(max_gpus)}
    min_fit = _min_gpus_to_fit(workload, device)
    usable = USABLE_MEMORY_FRACTION * device.memory_bytes
    baseline = next((p for p, c in costs.items() if c.feasible and c.memory_bytes <= usable), None)
    if baseline is None:
        baseline = next((p for p, c in costs.items() if c.feasible), 1)
    base_time = costs[baseline].seconds_per_step * baseline
    rows = []
    for p, c in costs.items():
        step = c.seconds_per_step
        efficiency = base_time / (p * step) if c.feasible and p >= baseline else float("nan")
        rows.append(PlanRow(p, c.feasible, c.feasible and c.memory_bytes <= usable, step,
                            step * workload.steps, c.compute_s, c.transfer_s, c.scheduler_s, c.memory_bytes,
                            efficiency, c.bound, c.steps_per_task, c.note))
    warnings = _warnings(workload, device, link, rows, min_fit, usable, threshold, max_gpus)
    return Plan(workload, device, link, scheduler, rows, warnings, min_fit)


def _warnings(workload, device, link, rows, min_fit, usable, threshold, max_gpus):
    warnings = []
    if min_fit is None or min_fit > 1:
        need = rows[0].memory_per_gpu_bytes
        where = "more than 2**20 GPUs" if min_fit is None else f"at least {min_fit} GPUs"
        warnings.append(f"does not fit: one {device.name} has {device.memory_bytes / 1e9:.0f} GB "
                        f"({usable / 1e9:.0f} GB usable) and the problem needs {need / 1e9:.3g} GB on one: "
                        f"use {where}")
    good = [r for r in rows if r.feasible and r.fits]
    poor = [r for r in good if r.gpus > 1 and (r.parallel_efficiency < threshold
                                               or r.transfer_s + r.scheduler_s > r.compute_s)]
    if poor:
        worth = [r.gpus for r in good if r not in poor]
        fastest = min(good, key=lambda r: r.seconds_per_step)
        first = poor[0]
        reason = (f"efficiency {first.parallel_efficiency:.2f} < {threshold:g}"
                  if first.parallel_efficiency < threshold else
                  f"transfer + dask overhead {first.transfer_s + first.scheduler_s:.3g} s/step exceed the "
                  f"compute {first.compute_s:.3g} s/step")
        limit = f"more than {max(worth)} GPU(s)" if worth else "more GPUs"
        warnings.append(f"too small to gain from {limit}: at {first.gpus} GPUs {reason}. Fastest: "
                        f"{fastest.gpus} GPU(s) at {fastest.seconds_per_step:.3g} s/step (efficiency "
                        f"{fastest.parallel_efficiency:.2f})")
    blocked = [r for r in rows if not r.feasible]
    if blocked:
        warnings.append(f"{blocked[0].gpus} GPUs and more cannot split this problem: {blocked[0].note}")
    if link.name == "nvlink" and max_gpus > 8:
        warnings.append("NVLink joins at most 8 GPUs (one HGX node): beyond 8 the traffic crosses the node "
                        "interconnect; plan those counts with --interconnect ndr")
    return warnings



# -- command line (``hpcgpu plan``) ------------------------------------------------------

_SIZE_OPTIONS = ("nx", "ny", "atoms", "bodies", "steps", "dtype", "steps_per_task", "periodic", "density",
                 "cutoff", "skin", "rebuild_every")


def add_arguments(parser):
    """Add the options of ``hpcgpu plan`` to an argparse parser."""
    parser.add_argument("workload", nargs="?", help=f"one of {', '.join(WORKLOADS)} (weather with --check)")
    size = parser.add_argument_group("problem")
    size.add_argument("--nx", type=int, help="weather: grid cells along x")
    size.add_argument("--ny", type=int, help="weather: grid cells along y (the axis split into row blocks)")
    size.add_argument("--atoms", type=float, help="md: number of atoms (1e7 is accepted)")
    size.add_argument("--bodies", type=float, help="nbody: number of bodies")
    size.add_argument("--steps", type=float, default=1000, help="time steps to solution (default 1000)")
    size.add_argument("--dtype", help="float32 or float64 (default: float32; md float64)")
    size.add_argument("--steps-per-task", type=int, help="weather: steps per task K (default 16)")
    size.add_argument("--periodic", action="store_true", help="weather: periodic in y (default: walls)")
    for name, text in (("density", "0.8442"), ("cutoff", "2.5"), ("skin", "0.3")):
        size.add_argument(f"--{name}", type=float, help=f"md: {name} (default {text})")
    size.add_argument("--rebuild-every", type=int, help="md: steps between neighbour-list builds (default 15)")
    machine = parser.add_argument_group("machine")
    machine.add_argument("--device", default="h100",
                         help=f"one of {', '.join(DEVICES)}, or a .jsonl file of `hpcgpu bench` results "
                              "(default h100)")
    machine.add_argument("--memory-gb", type=float, help="device memory (GB), overriding the profile's")
    machine.add_argument("--interconnect", default="ndr", help=f"one of {', '.join(LINKS)} (default ndr)")
    machine.add_argument("--link-gbs", type=float, help="interconnect bandwidth per direction (GB/s), overriding")
    machine.add_argument("--link-latency-us", type=float, help="interconnect latency (us), overriding")
    machine.add_argument("--max-gpus", type=int, default=64, help="largest GPU count (default 64)")
    machine.add_argument("--task-overhead-ms", type=float, default=TASK_OVERHEAD_S * 1e3,
                         help="dask cost per task and per transfer in ms, twice that per dependent level "
                              "(default 1; ~3 on a 2-core laptop)")
    machine.add_argument("--efficiency-threshold", type=float, default=EFFICIENCY_THRESHOLD,
                         help="warn below this parallel efficiency (default 0.5)")
    parser.add_argument("--check", action="store_true",
                        help="compare the model with a run on this machine (weather on 1 and 2 local workers)")
    parser.add_argument("--json", action="store_true", help="print JSON lines instead of a table")


def run_command(args):
    """Run ``hpcgpu plan`` from parsed arguments; returns the exit status."""
    if args.check:
        return _run_check(args)
    if args.workload is None:
        raise ConfigError(f"workload must be one of {', '.join(repr(w) for w in WORKLOADS)}; got none "
                          "(or give --check)")
    size = {k: getattr(args, k) for k in _SIZE_OPTIONS if getattr(args, k) is not None}
    if not size.get("periodic"):
        size.pop("periodic", None)  # the flag's absence is the model's default
    for key in ("atoms", "bodies", "steps"):
        if key in size and float(size[key]).is_integer():
            size[key] = int(size[key])
    overhead = check_float("task_overhead_ms", args.task_overhead_ms, minimum=0.0) * 1e-3
    link = link_profile(args.interconnect, bandwidth_gbs=args.link_gbs, latency_us=args.link_latency_us)
    result = plan(args.workload, device=args.device, interconnect=link, max_gpus=args.max_gpus,
                  scheduler=SchedulerModel(overhead, 2 * overhead, overhead),
                  efficiency_threshold=args.efficiency_threshold, memory_gb=args.memory_gb, **size)
    print(result.json_lines() if args.json else result.table())
    return 0


def _run_check(args):
    from hpcgpu._plan_check import check_against_this_machine, format_check

    if args.workload not in (None, "weather"):
        raise ConfigError(f"workload must be 'weather' with --check; got {args.workload!r}")
    options = {k: getattr(args, k) for k in ("nx", "ny", "steps_per_task", "dtype") if getattr(args, k)}
    result = check_against_this_machine(**options)
    if args.json:
        for row in result["rows"]:
            print(json.dumps({"kind": "check", **{k: v for k, v in result.items() if k != "rows"}, **row}))
    else:
        print(format_check(result))
    return 0
