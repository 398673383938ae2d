"""The prediction of ``hpcgpu plan``: :func:`plan` and the :class:`Plan` it returns.

:func:`plan` asks the workload's cost model (:mod:`hpcgpu.plan.workload_costs`)
for one step on 1, 2, 4, ... GPUs of a device over an interconnect, with
what dask's scheduler adds per epoch (:mod:`hpcgpu.plan.profiles`), and
turns the costs into times to solution, memory per GPU, parallel
efficiencies and the warnings a user should read first. How the three terms
of a step are modelled is told in :mod:`hpcgpu.plan`.

Examples
--------
>>> result = plan("nbody", bodies=10_000, steps=10, device="h100", max_gpus=2)
>>> [row.gpus for row in result.rows], result.min_gpus_to_fit
([1, 2], 1)
"""

import json
import math
from dataclasses import asdict, dataclass, field

from hpcgpu.plan.devices import device_profile
from hpcgpu.plan.profiles import LINKS, SchedulerModel, link_profile
from hpcgpu.plan.workload_costs import format_grid, make_workload
from hpcgpu.validation import check_float, check_int

__all__ = ["plan", "Plan", "PlanRow", "EFFICIENCY_THRESHOLD", "USABLE_MEMORY_FRACTION"]

EFFICIENCY_THRESHOLD = 0.5
"""Below this parallel efficiency a GPU count is reported as not worth it."""

USABLE_MEMORY_FRACTION = 0.9
"""Share of device memory a run may fill (the CUDA context, memory-pool slack
and library work space take the rest)."""


@dataclass(frozen=True)
class PlanRow:
    """The prediction for one GPU count (times in s, memory in B, exchange per step and rank).

    ``bound`` names what the step's time goes to: the kernels' roofline
    bound (``"bandwidth"`` or ``"compute"``) while the compute term is the
    largest, else ``"exchange"`` or ``"scheduler"``. ``grid`` is the
    process grid the engine would use (ranks along x, y[, z]; ``(P,)`` for
    all-pairs bodies) and ``rounds_per_step`` the latencies a rank's
    exchange waits for per step.
    """

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
    grid: tuple = ()
    rounds_per_step: float = 0.0


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
                f"per task per epoch of ~{s.epoch_seconds:g} s (a task's work {s.handover_share:g} at the hand-over, "
                f"the rest while earlier epochs run)")

    def table(self):
        """A human-readable table, the header and the warnings."""
        lines = [self.header(),
                 f"{'GPUs':>5} {'grid':>8} {'time to solution':>17} {'s/step':>10} {'compute':>9} {'exchange':>9} "
                 f"{'scheduler':>9} {'mem/GPU':>9} {'efficiency':>10}  bound / note"]
        for r in self.rows:
            grid = format_grid(r.grid)
            if not r.feasible:
                lines.append(f"{r.gpus:>5} {grid:>8} {'-':>17} {'-':>10} {'-':>9} {'-':>9} {'-':>9} {'-':>9} "
                             f"{'-':>10}  {r.note}")
                continue
            note = r.bound + ("" if r.fits else ", does not fit") + (f", {r.note}" if r.note else "")
            lines.append(f"{r.gpus:>5} {grid:>8} {_duration(r.time_to_solution_s):>17} {r.seconds_per_step:>10.3g} "
                         f"{r.compute_s:>9.3g} {r.exchange_s:>9.3g} {r.scheduler_s:>9.3g} "
                         f"{_gigabytes(r.memory_per_gpu_bytes):>9} {_efficiency(r.parallel_efficiency):>10}  {note}")
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
                    "handover_share": self.scheduler.handover_share,
                    "epoch_seconds": self.scheduler.epoch_seconds,
                    "scheduler_basis": self.scheduler.basis, "scheduler_source": self.scheduler.source,
                    "assumed": self.assumptions()})
        return [{k: _jsonable(v) for k, v in record.items()} for record in out]

    def json_lines(self):
        return "\n".join(json.dumps(record) for record in self.records())


def _jsonable(value):
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, tuple):
        return list(value)
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
        machine, measured); see :data:`hpcgpu.plan.profiles.LINKS`.
    max_gpus : int
        Largest GPU count (powers of two up to it are planned).
    scheduler : SchedulerModel, optional
        The scheduler's cost per epoch (default: 2 ms + 0.2 ms per task, over
        epochs of about 0.5 s of work; the hand-over's share of it shows, the
        submission only where it outlasts an epoch's work).
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
    ('compute', [1.0, 0.98, 0.95, 0.87])
    >>> [plan("md", atoms=10**8, steps=10, device="h200", max_gpus=256).row(p).grid for p in (64, 256)]
    [(4, 4, 4), (8, 8, 4)]
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
                            efficiency, _bound(c), c.steps_per_task, c.steps_per_epoch, c.messages,
                            c.exchange_bytes, c.note, tuple(c.grid), c.rounds))
    warnings = _warnings(workload, device, link, rows, min_fit, usable, threshold, max_gpus)
    return Plan(workload, device, link, scheduler, rows, warnings, min_fit)


def _efficiency(value):
    """The table's efficiency cell: ``-`` where there is none (a GPU count below the smallest that fits)."""
    return "-" if math.isnan(value) else f"{value:.2f}"


def _bound(cost):
    """What a step's time goes to: the kernels' roofline bound unless messages or the scheduler take more.

    (The kernels' bound alone said "bandwidth" for MD on 64 GPUs whose steps
    were 98% messages.)
    """
    if not cost.feasible or cost.compute_s >= max(cost.exchange_s, cost.scheduler_s):
        return cost.bound
    return "exchange" if cost.exchange_s >= cost.scheduler_s else "scheduler"


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
