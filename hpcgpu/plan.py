"""``hpcgpu plan``: predict time to solution, memory per GPU and parallel efficiency for 1..N GPUs.

The model, per time step and for the slowest partition, of hpcgpu's SPMD
engine (:mod:`hpcgpu.partition.engine`: one pinned task per worker runs an
epoch of many steps; ranks exchange through a communicator):

``compute``
    the roofline of each kernel, ``max(bytes / copy bandwidth, flops / peak)``
    over the fraction of that bound its kernel family reaches on the device
    (measured fractions where the project has them, see
    :mod:`hpcgpu._profiles`), plus the halo copies, the redundant work in
    the halos and the cost of starting each kernel;
``exchange``
    the messages a rank sends per step, as its decomposition makes them
    (halo rows every K steps; every block's positions; ghost atoms, the
    rebuild flag and, on rebuild steps, migrants): ``messages x latency +
    bytes / bandwidth`` at the interconnect's figures (:class:`LinkProfile`);
``scheduler``
    dask's scheduler, paid once per epoch, ``epoch_overhead_s + (P + 1) x
    task_overhead_s``, over the steps of an epoch (about
    :data:`EPOCH_SECONDS` of work).

They add up (nothing is assumed to overlap, so the model leans pessimistic).
Parallel efficiency is ``P0 t(P0) / (P t(P))`` against the smallest GPU
count ``P0`` whose memory holds the problem. One GPU means the engine with
one dask worker. Start-up (cluster, JIT compilation, scattering the initial
state), diagnostics and output are not modelled.

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
from hpcgpu._profiles import DEVICES, LINKS, LinkProfile, basis_of, device_profile, link_profile
from hpcgpu.errors import ConfigError
from hpcgpu.partition.engine import EPOCH_SECONDS
from hpcgpu.validation import check_float, check_int

__all__ = ["plan", "run_command", "add_arguments", "Plan", "PlanRow", "SchedulerModel", "StepCost", "LinkProfile",
           "make_workload", "WORKLOADS", "DEVICES", "LINKS", "EPOCH_OVERHEAD_S", "TASK_OVERHEAD_S", "EPOCH_SECONDS",
           "EFFICIENCY_THRESHOLD", "USABLE_MEMORY_FRACTION"]

EPOCH_OVERHEAD_S = 2e-3
"""Scheduler round trips per epoch on a cluster whose scheduler has a core of
its own (an assumption): a worker's next epoch task starts once the
scheduler has heard that its last one finished, and the records task
follows. Epochs are pipelined (two in flight), so the client's own round
trip is hidden. An epoch waited for at once (the client's round trip
included) cost 16-26 ms on this 2-core machine, where the scheduler, the
client and the workers share the cores (``hpcgpu plan --check``,
2026-12-01)."""

TASK_OVERHEAD_S = 2e-4
"""The scheduler's work per task of an epoch (P epoch tasks and a records
task), which it does one task after another: an assumption of ~5,000 tasks
per second (dask documents ~200 us of overhead per task for its local
scheduler, and ~1 ms of latency per task for the distributed one)."""

EFFICIENCY_THRESHOLD = 0.5
"""Below this parallel efficiency a GPU count is reported as not worth it."""

USABLE_MEMORY_FRACTION = 0.9
"""Share of device memory a run may fill (the CUDA context, memory-pool slack
and library work space take the rest)."""


@dataclass(frozen=True)
class SchedulerModel:
    """dask's scheduler in the SPMD engine: a cost per epoch, spread over the epoch's steps.

    An epoch on ``P`` workers costs ``epoch_overhead_s + (P + 1) *
    task_overhead_s`` and holds ``steps_per_epoch`` steps, or (when None) as
    many as fill ``epoch_seconds`` of work, rounded up to whole supersteps of
    K steps, as the engine gathers them.

    Attributes
    ----------
    epoch_overhead_s, task_overhead_s : float
        Seconds per epoch, and per task of an epoch.
    epoch_seconds : float
        Work per epoch (:data:`hpcgpu.partition.engine.EPOCH_SECONDS`).
    steps_per_epoch : int, optional
        A fixed number of steps per epoch (``hpcgpu plan --check`` times
        epochs of a known length).
    source : str
        Where the figures come from (``"assumed..."``, ``"measured..."`` or
        ``"given..."``, like :attr:`LinkProfile.source`).

    Examples
    --------
    >>> model = SchedulerModel(epoch_overhead_s=2e-3, task_overhead_s=1e-4)
    >>> model.epoch_s(partitions=4), model.steps_in_epoch(step_s=0.01, steps_per_task=4)
    (0.0025, 52)
    """

    epoch_overhead_s: float = EPOCH_OVERHEAD_S
    task_overhead_s: float = TASK_OVERHEAD_S
    epoch_seconds: float = EPOCH_SECONDS
    steps_per_epoch: int = None
    source: str = "assumed: ~2 ms of scheduler round trips per epoch and ~0.2 ms of its work per task"

    @property
    def basis(self):
        """``"measured"``, ``"assumed"`` or ``"given"``: the first word of :attr:`source`."""
        return basis_of(self.source)

    def epoch_s(self, partitions):
        """Seconds the scheduler costs one epoch on ``partitions`` workers."""
        return self.epoch_overhead_s + (partitions + 1) * self.task_overhead_s

    def steps_in_epoch(self, step_s, steps_per_task=1):
        """Steps in one epoch when a step takes ``step_s`` seconds (whole supersteps of ``steps_per_task``)."""
        if self.steps_per_epoch is not None:
            return self.steps_per_epoch
        k = max(1, int(steps_per_task))
        if not (math.isfinite(step_s) and step_s > 0):
            return k
        steps = max(1, math.ceil(self.epoch_seconds / step_s - 1e-9))
        return k * math.ceil(steps / k)

    def per_step_s(self, partitions, step_s, steps_per_task=1):
        """The scheduler's seconds per step: an epoch's cost over its steps."""
        return self.epoch_s(partitions) / self.steps_in_epoch(step_s, steps_per_task)


@dataclass(frozen=True)
class PlanRow:
    """The prediction for one GPU count (times in s, memory in B, exchange per step and rank)."""

    gpus: int
    feasible: bool
    fits: bool
    seconds_per_step: float
    time_to_solution_s: float
    compute_s: float
    exchange_s: float
    scheduler_s: float
    memory_per_gpu_bytes: float
    parallel_efficiency: float
    bound: str
    steps_per_task: int
    steps_per_epoch: int
    messages_per_step: float
    exchange_bytes_per_step: float
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
        w, d, link, s = self.workload, self.device, self.link, self.scheduler
        return (f"hpcgpu plan: {w.describe()} on {d.name} ({d.memory_bytes / 1e9:.0f} GB, "
                f"{d.copy_bandwidth / 1e12:.3g} TB/s copy, {d.peak(w.dtype) / 1e12:.3g} TFLOP/s {w.dtype}) "
                f"over {link.name} ({link.bandwidth / 1e9:.3g} GB/s, {link.latency_s * 1e6:.3g} us per message, "
                f"{link.basis}); scheduler {s.epoch_overhead_s * 1e3:.3g} ms + {s.task_overhead_s * 1e3:.3g} ms "
                f"per task per epoch of ~{s.epoch_seconds:g} s")

    def table(self):
        """A human-readable table, the header and the warnings."""
        lines = [self.header(),
                 f"{'GPUs':>5} {'time to solution':>17} {'s/step':>10} {'compute':>9} {'exchange':>9} "
                 f"{'scheduler':>9} {'mem/GPU':>9} {'efficiency':>10}  bound / note"]
        for r in self.rows:
            if not r.feasible:
                lines.append(f"{r.gpus:>5} {'-':>17} {'-':>10} {'-':>9} {'-':>9} {'-':>9} {'-':>9} {'-':>10}  "
                             f"{r.note}")
                continue
            note = r.bound + ("" if r.fits else ", does not fit") + (f", {r.note}" if r.note else "")
            lines.append(f"{r.gpus:>5} {_duration(r.time_to_solution_s):>17} {r.seconds_per_step:>10.3g} "
                         f"{r.compute_s:>9.3g} {r.exchange_s:>9.3g} {r.scheduler_s:>9.3g} "
                         f"{_gigabytes(r.memory_per_gpu_bytes):>9} {r.parallel_efficiency:>10.2f}  {note}")
        lines += [f"warning: {w}" for w in self.warnings]
        return "\n".join(lines)

    def assumptions(self):
        """The inputs whose figures are assumptions, not measurements (``interconnect``, ``fraction:md``, ...)."""
        out = [] if self.link.basis != "assumed" else ["interconnect"]
        out += [f"fraction:{family}" for family, text in sorted(self.device.sources.items())
                if text.startswith("assumed")]
        if self.scheduler.basis == "assumed":
            out.append("scheduler")
        return out

    def records(self):
        """One dict per GPU count, then a summary dict (what ``--json`` prints)."""
        common = {"workload": self.workload.name, "size": self.workload.size(), "dtype": self.workload.dtype,
                  "steps": self.workload.steps, "device": self.device.name, "interconnect": self.link.name}
        out = [{"kind": "plan", **common, **asdict(r)} for r in self.rows]
        out.append({"kind": "summary", **common, "min_gpus_to_fit": self.min_gpus_to_fit,
                    "warnings": list(self.warnings), "device_source": self.device.source,
                    "fraction_sources": dict(self.device.sources),
                    "interconnect_latency_s": self.link.latency_s,
                    "interconnect_bandwidth_bytes_per_s": self.link.bandwidth,
                    "interconnect_basis": self.link.basis, "interconnect_source": self.link.source,
                    "epoch_overhead_s": self.scheduler.epoch_overhead_s,
                    "task_overhead_s": self.scheduler.task_overhead_s,
                    "epoch_seconds": self.scheduler.epoch_seconds,
                    "scheduler_basis": self.scheduler.basis, "scheduler_source": self.scheduler.source,
                    "assumed": self.assumptions()})
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
        ``"nvlink"``, ``"ndr"`` (NCCL), ``"ucx-nvlink"``, ``"ucx-ndr"`` (the
        dask comm path over UCX), ``"100gbe"`` or ``"tcp-local"`` (this
        machine, measured); see :data:`hpcgpu._profiles.LINKS`.
    max_gpus : int
        Largest GPU count (powers of two up to it are planned).
    scheduler : SchedulerModel, optional
        The scheduler's cost per epoch (default: 2 ms + 0.2 ms per task, over
        epochs of about 0.5 s of work).
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
    >>> result = plan("nbody", bodies=100_000, steps=100, device="h100", max_gpus=8)
    >>> result.rows[0].bound, [round(row.parallel_efficiency, 2) for row in result.rows]
    ('compute', [1.0, 0.98, 0.92, 0.77])
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
                            step * workload.steps, c.compute_s, c.exchange_s, c.scheduler_s, c.memory_bytes,
                            efficiency, c.bound, c.steps_per_task, c.steps_per_epoch, c.messages,
                            c.exchange_bytes, c.note))
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
                                               or r.exchange_s + r.scheduler_s > r.compute_s)]
    if poor:
        worth = [r.gpus for r in good if r not in poor]
        fastest = min(good, key=lambda r: r.seconds_per_step)
        first = poor[0]
        reason = (f"efficiency {first.parallel_efficiency:.2f} < {threshold:g}"
                  if first.parallel_efficiency < threshold else
                  f"exchange + scheduler {first.exchange_s + first.scheduler_s:.3g} s/step exceed the "
                  f"compute {first.compute_s:.3g} s/step")
        limit = f"more than {max(worth)} GPU(s)" if worth else "more GPUs"
        warnings.append(f"too small to gain from {limit}: at {first.gpus} GPUs {reason}. Fastest: "
                        f"{fastest.gpus} GPU(s) at {fastest.seconds_per_step:.3g} s/step (efficiency "
                        f"{fastest.parallel_efficiency:.2f})")
    blocked = [r for r in rows if not r.feasible]
    if blocked:
        warnings.append(f"{blocked[0].gpus} GPUs and more cannot split this problem: {blocked[0].note}")
    if link.name in ("nvlink", "ucx-nvlink") and max_gpus > 8:
        other = "ndr" if link.name == "nvlink" else "ucx-ndr"
        warnings.append("NVLink joins at most 8 GPUs (one HGX node): beyond 8 the traffic crosses the node "
                        f"interconnect; plan those counts with --interconnect {other}")
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
    size.add_argument("--steps-per-task", type=int,
                      help="weather: steps per halo exchange K (default: the engine's, up to 16)")
    size.add_argument("--periodic", action="store_true", help="weather: periodic in y (default: walls)")
    for name, text in (("density", "0.8442"), ("cutoff", "2.5"), ("skin", "0.3")):
        size.add_argument(f"--{name}", type=float, help=f"md: {name} (default {text})")
    size.add_argument("--rebuild-every", type=int, help="md: steps between neighbour-list builds (default 15)")
    machine = parser.add_argument_group("machine")
    machine.add_argument("--device", default="h100",
                         help=f"one of {', '.join(DEVICES)}, or a .jsonl file of `hpcgpu bench` results "
                              "(default h100)")
    machine.add_argument("--memory-gb", type=float, help="device memory (GB), overriding the profile's")
    machine.add_argument("--interconnect", default="ndr",
                         help=f"one of {', '.join(LINKS)} (default ndr: NCCL over InfiniBand NDR)")
    machine.add_argument("--link-gbs", type=float,
                         help="interconnect bandwidth per direction (GB/s), overriding (e.g. from `hpcgpu bench comm`)")
    machine.add_argument("--link-latency-us", type=float,
                         help="latency per message, one way (us), overriding (e.g. from `hpcgpu bench comm`)")
    machine.add_argument("--max-gpus", type=int, default=64, help="largest GPU count (default 64)")
    machine.add_argument("--epoch-overhead-ms", type=float, default=EPOCH_OVERHEAD_S * 1e3,
                         help="scheduler round trips per epoch in ms (default 2)")
    machine.add_argument("--task-overhead-ms", type=float, default=TASK_OVERHEAD_S * 1e3,
                         help="scheduler work per task of an epoch (P + 1 tasks) in ms (default 0.2)")
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
    epoch = check_float("epoch_overhead_ms", args.epoch_overhead_ms, minimum=0.0)
    task = check_float("task_overhead_ms", args.task_overhead_ms, minimum=0.0)
    scheduler = SchedulerModel()
    if (epoch, task) != (EPOCH_OVERHEAD_S * 1e3, TASK_OVERHEAD_S * 1e3):
        scheduler = SchedulerModel(epoch * 1e-3, task * 1e-3,
                                   source=f"given: {epoch:g} ms per epoch, {task:g} ms per task")
    link = link_profile(args.interconnect, bandwidth_gbs=args.link_gbs, latency_us=args.link_latency_us)
    result = plan(args.workload, device=args.device, interconnect=link, max_gpus=args.max_gpus,
                  scheduler=scheduler,
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
