"""Device, interconnect and scheduler profiles for ``hpcgpu plan``: data sheets, measurements, assumptions.

A :class:`DeviceProfile` holds the ceilings of one device (one dask worker:
a GPU, or a CPU core) and the fraction of its roofline that each kernel
family reaches; a :class:`LinkProfile` holds what the communicator achieves
between two workers (latency per message, bandwidth); a
:class:`SchedulerModel` what dask's scheduler costs the SPMD engine per
epoch. Named device profiles come from vendor data sheets (cited beside
each); the fractions come from measurements in ``docs/journal.md``
where the project has them and are marked as assumptions where it does
not; the links and the scheduler say the same of themselves (``basis``).
:mod:`hpcgpu.plan.devices` picks a named device profile or builds one
from the JSON lines of ``hpcgpu bench``.
"""

import math
from dataclasses import dataclass, field, replace

from hpcgpu.errors import ConfigError
from hpcgpu.partition.engine import EPOCH_SECONDS

__all__ = ["DeviceProfile", "LinkProfile", "SchedulerModel", "DEVICES", "LINKS", "EPOCH_OVERHEAD_S",
           "TASK_OVERHEAD_S", "HANDOVER_SHARE", "basis_of", "link_profile"]


@dataclass(frozen=True)
class DeviceProfile:
    """Ceilings of one device and the fraction of its roofline each kernel family reaches.

    Attributes
    ----------
    name : str
    kind : str
        ``"gpu"`` or ``"cpu"``.
    memory_bytes : float
        Device memory (B); for a CPU core, its share of the host memory.
    bandwidth : float
        Peak memory bandwidth (B/s), from the data sheet or measured.
    copy_fraction : float
        Achievable copy bandwidth over ``bandwidth`` (1 for a measured copy).
    peak_flops : dict
        ``{"float32": flop/s, "float64": flop/s}`` without tensor cores.
    fractions : dict
        ``{family: {dtype: fraction}}``: the fraction of the roofline bound
        (copy bandwidth or peak) a kernel family reaches.
    sources : dict
        ``{family: text}``: where each fraction comes from.
    source : str
        Where the ceilings come from.
    launch_s : float
        Cost of starting one kernel from Python (s): what bounds a step on
        a tiny grid however fast the device is.
    """

    name: str
    kind: str
    memory_bytes: float
    bandwidth: float
    copy_fraction: float
    peak_flops: dict
    fractions: dict
    sources: dict = field(default_factory=dict)
    source: str = ""
    launch_s: float = 0.0

    @property
    def copy_bandwidth(self):
        """Achievable copy bandwidth (B/s): what the stencil fractions are measured against."""
        return self.bandwidth * self.copy_fraction

    def fraction(self, family, dtype):
        """Fraction of the roofline that kernel ``family`` reaches in ``dtype``."""
        by_dtype = self.fractions[family]
        return by_dtype.get(str(dtype), by_dtype.get("float32"))

    def peak(self, dtype):
        """Peak flop/s in ``dtype`` (non-tensor)."""
        return self.peak_flops[str(dtype)]


def basis_of(source):
    """``"measured"`` or ``"given"`` when ``source`` starts with that word, else ``"assumed"``.

    Examples
    --------
    >>> basis_of("measured: hpcgpu bench comm"), basis_of("NVLink 4 data sheet")
    ('measured', 'assumed')
    """
    for word in ("measured", "given"):
        if source.startswith(word):
            return word
    return "assumed"


@dataclass(frozen=True)
class LinkProfile:
    """What hpcgpu's communicator achieves between two workers over one link.

    A message of ``n`` bytes takes ``latency_s + n / bandwidth``: the latency
    is that of a small message one way, software included (pickling, the
    rank's thread, NCCL's kernel launch), the bandwidth that of a large one
    in one direction.

    Attributes
    ----------
    name : str
    bandwidth : float
        Bytes per second, one direction.
    latency_s : float
        Seconds per message, one way.
    source : str
        Where the figures come from; it starts with ``"measured"`` (by
        ``hpcgpu bench comm`` or ``hpcgpu plan --check``), ``"assumed"``
        (public figures of the hardware or library, not yet measured with
        hpcgpu) or ``"given"`` (set by the user).

    Examples
    --------
    >>> link = LinkProfile("example", bandwidth=1e9, latency_s=1e-4, source="assumed: an example")
    >>> round(link.message_s(1e6) * 1e3, 3), link.basis
    (1.1, 'assumed')
    """

    name: str
    bandwidth: float
    latency_s: float
    source: str = ""

    @property
    def basis(self):
        """``"measured"``, ``"assumed"`` or ``"given"``: the first word of :attr:`source`."""
        return basis_of(self.source)

    def message_s(self, nbytes):
        """Seconds for one message of ``nbytes`` bytes."""
        return self.latency_s + nbytes / self.bandwidth


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

HANDOVER_SHARE = 0.2
"""The share of :data:`TASK_OVERHEAD_S` the scheduler spends when a task's
predecessor finishes (the hand-over: the finished task to memory, the next
one to processing and its message to the worker, the older result
released); the rest is spent when the client submits the task
(``update_graph``). Measured with cProfile on this machine (dask 2026.8,
the engine's pattern: chains of pinned tasks on 16 and 32 in-process
workers, two epochs ahead): 0.20 and 0.18 of the scheduler's time."""


@dataclass(frozen=True)
class SchedulerModel:
    """dask's scheduler in the SPMD engine: what an epoch exposes of it, spread over the epoch's steps.

    The engine (:mod:`hpcgpu.partition.engine`) submits an epoch as one
    task per worker and a records task, and keeps up to
    :data:`~hpcgpu.partition.engine.MAX_AHEAD` epochs in flight (the next
    submitted behind the one running), so the scheduler's work splits in two:

    - the *submission* of an epoch's ``P + 1`` tasks (``(1 - handover_share)
      x task_overhead_s`` each) is done while earlier epochs step: it
      costs the run time only where it exceeds an epoch's work, ``max(0,
      submission - epoch work)`` (the scheduler, one thread, then sets the
      pace);
    - the *hand-over* is not hidden: a worker's next epoch task takes the
      last one's result as its argument, so it starts only once the
      scheduler has heard that the last one finished and has sent it on
      (:attr:`epoch_overhead_s`, a round trip), and the ``P`` workers of an
      epoch finish together, so the scheduler hands them over one after
      another (``handover_share x task_overhead_s`` each): the last worker
      waits for all, and the other ranks wait for it at their first
      exchange.

    So an epoch of ``W`` seconds of work exposes ``handover_s(P) + max(0,
    submission_s(P) - W)`` (:meth:`exposed_epoch_s`). An epoch holds
    ``steps_per_epoch`` steps, or (when None) as many as fill
    ``epoch_seconds`` of work, rounded up to whole supersteps of K steps,
    as the engine gathers them.

    Attributes
    ----------
    epoch_overhead_s, task_overhead_s : float
        Seconds of round trips per epoch, and of the scheduler's work per task of an epoch.
    epoch_seconds : float
        Work per epoch (:data:`hpcgpu.partition.engine.EPOCH_SECONDS`).
    steps_per_epoch : int, optional
        A fixed number of steps per epoch (``hpcgpu plan --check`` times
        epochs of a known length).
    source : str
        Where the figures come from (``"assumed..."``, ``"measured..."`` or
        ``"given..."``, like :attr:`LinkProfile.source`).
    handover_share : float
        Share of a task's work done at the hand-over (:data:`HANDOVER_SHARE`).

    Examples
    --------
    >>> model = SchedulerModel(epoch_overhead_s=2e-3, task_overhead_s=1e-4)
    >>> model.epoch_s(partitions=4), model.steps_in_epoch(step_s=0.01, steps_per_task=4)
    (0.0025, 52)
    >>> round(model.handover_s(4), 6), round(model.exposed_epoch_s(4, epoch_work_s=0.5), 6)
    (0.0021, 0.0021)
    >>> round(model.exposed_epoch_s(1023, epoch_work_s=0.05), 4)  # submission 82 ms > 50 ms of work
    0.0544
    """

    epoch_overhead_s: float = EPOCH_OVERHEAD_S
    task_overhead_s: float = TASK_OVERHEAD_S
    epoch_seconds: float = EPOCH_SECONDS
    steps_per_epoch: int = None
    source: str = "assumed: ~2 ms of scheduler round trips per epoch and ~0.2 ms of its work per task"
    handover_share: float = HANDOVER_SHARE

    @property
    def basis(self):
        """``"measured"``, ``"assumed"`` or ``"given"``: the first word of :attr:`source`."""
        return basis_of(self.source)

    def epoch_s(self, partitions):
        """All the seconds the scheduler spends on one epoch on ``partitions`` workers (hidden or not)."""
        return self.epoch_overhead_s + (partitions + 1) * self.task_overhead_s

    def handover_s(self, partitions):
        """Seconds between the end of an epoch and the start of the next on its last worker (never hidden)."""
        return self.epoch_overhead_s + self.handover_share * (partitions + 1) * self.task_overhead_s

    def submission_s(self, partitions):
        """The scheduler's seconds taking in one epoch's tasks (done while earlier epochs step)."""
        return (1.0 - self.handover_share) * (partitions + 1) * self.task_overhead_s

    def exposed_epoch_s(self, partitions, epoch_work_s):
        """Seconds an epoch of ``epoch_work_s`` seconds of work adds: ``handover + max(0, submission - work)``."""
        return self.handover_s(partitions) + max(0.0, self.submission_s(partitions) - epoch_work_s)

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
        """The scheduler's exposed seconds per step: an epoch's exposed cost over its steps."""
        steps = self.steps_in_epoch(step_s, steps_per_task)
        work = steps * step_s if math.isfinite(step_s) else 0.0
        return self.exposed_epoch_s(partitions, work) / steps


# Fractions of the roofline per kernel family (families: "stencil" = the
# fused SSP-RK3 shallow-water step, "md" = Lennard-Jones forces on a full
# neighbour list, "neighbor_build" = the cell-list build, "nbody" = direct
# all-pairs gravity, "copy" = the task path's block copies).
_GPU_FRACTIONS = {
    # docs/journal.md, H200 session 2026-11-30 at 8192^2: best backend per
    # dtype (cupy float32 0.26, cuda float64 0.34), first-generation kernels.
    "stencil": {"float32": 0.26, "float64": 0.34},
    "md": {"float32": 0.4, "float64": 0.4},
    "neighbor_build": {"float32": 0.3, "float64": 0.3},
    "nbody": {"float32": 0.5, "float64": 0.5},
    "copy": {"float32": 1.0, "float64": 1.0},
}
_GPU_SOURCES = {
    "stencil": "measured: docs/journal.md, H200 2026-11-30 (shallow_water fraction_of_copy)",
    "md": "assumed (not yet measured on a GPU): 0.4 of copy bandwidth, neighbour gathers counted in full",
    "neighbor_build": "assumed (not measured): 0.3 of copy bandwidth",
    "nbody": "assumed (not yet measured on a GPU): 0.5 of FP peak at 20 flops per interaction, "
             "as tiled all-pairs kernels reach (Nyland, Harris, Prins, GPU Gems 3, ch. 31)",
    "copy": "a copy runs at the copy bandwidth",
}
# Starting a Numba-CUDA or CuPy kernel from Python costs some 5-50 us (an
# assumption: launch latency plus argument handling); on the CPU a parallel
# Numba region costs a few us.
_GPU_LAUNCH_S = 20e-6
_CPU_LAUNCH_S = 5e-6
# docs/bench-h200-2026-11-30.jsonl: CuPy device-to-device copies at 3.9-4.2 TB/s
# of the H200's 4.8 TB/s; taken as typical of HBM for the other GPUs.
_HBM_COPY_FRACTION = 0.85

DEVICES = {
    # NVIDIA H100 Tensor Core GPU data sheet (SXM5): 80 GB HBM3 at 3.35 TB/s,
    # FP32 67 TFLOP/s, FP64 34 TFLOP/s (non-tensor).
    "h100": DeviceProfile("h100", "gpu", 80e9, 3.35e12, _HBM_COPY_FRACTION,
                          {"float32": 67e12, "float64": 34e12}, _GPU_FRACTIONS, _GPU_SOURCES,
                          "NVIDIA H100 SXM data sheet", _GPU_LAUNCH_S),
    # NVIDIA H200 Tensor Core GPU data sheet (SXM): 141 GB HBM3e at 4.8 TB/s,
    # the same FP32/FP64 rates as the H100 SXM.
    "h200": DeviceProfile("h200", "gpu", 141e9, 4.8e12, _HBM_COPY_FRACTION,
                          {"float32": 67e12, "float64": 34e12}, _GPU_FRACTIONS, _GPU_SOURCES,
                          "NVIDIA H200 SXM data sheet", _GPU_LAUNCH_S),
    # NVIDIA A100 Tensor Core GPU data sheet (80GB SXM): 2,039 GB/s HBM2e,
    # FP32 19.5 TFLOP/s, FP64 9.7 TFLOP/s (non-tensor).
    "a100": DeviceProfile("a100", "gpu", 80e9, 2.039e12, _HBM_COPY_FRACTION,
                          {"float32": 19.5e12, "float64": 9.7e12}, _GPU_FRACTIONS, _GPU_SOURCES,
                          "NVIDIA A100 80GB SXM data sheet", _GPU_LAUNCH_S),
    # One core of this development machine (Xeon, AVX-512, 2.6 GHz, 23 GB for
    # 2 cores), one dask worker per core. Copy: docs/journal.md measured
    # 20-22 GB/s with 2 Numba threads; 11 GB/s per core. Peak: 2 FMA units x
    # 16 float32 lanes x 2 flops x 2.6 GHz = 166 GFLOP/s (83 in float64).
    # (On 2026-12-01 the machine was a 2-vCPU AMD EPYC without AVX-512, where
    # the fused step ran at 32-39 GFLOP/s on one core, and `hpcgpu plan
    # --check` predicted its compute 18-22% short: these figures await a new
    # `hpcgpu bench stencil` there.)
    "cpu": DeviceProfile(
        "cpu", "cpu", 11.5e9, 11e9, 1.0, {"float32": 166e9, "float64": 83e9},
        # the fused shallow-water step is bound by arithmetic on a CPU: 45.6 and
        # 22.3 GFLOP/s on one core at 2048^2 (390 flops per point and step)
        {"stencil": {"float32": 0.27, "float64": 0.27},
         # 139 and 44 GFLOP/s on 2 cores (docs/journal.md) over 333 and 166
         "nbody": {"float32": 0.42, "float64": 0.26},
         "md": {"float32": 0.3, "float64": 0.3},
         "neighbor_build": {"float32": 0.3, "float64": 0.3},
         "copy": {"float32": 1.0, "float64": 1.0}},
        {"stencil": "measured: docs/journal.md, numba fused shallow-water step 0.27 of the float32 and "
                    "float64 peaks (2048^2, one core)",
         "nbody": "measured: docs/journal.md, numba direct sum 139 (float32) and 44 (float64) GFLOP/s",
         "md": "assumed (not measured): 0.3 of copy bandwidth",
         "neighbor_build": "assumed (not measured): 0.3 of copy bandwidth",
         "copy": "a copy runs at the copy bandwidth"},
        "this development machine, one worker per core (docs/journal.md)", _CPU_LAUNCH_S),
}

# Interconnects: what a rank's messages cost through hpcgpu's communicator.
# Only tcp-local has been measured with hpcgpu; the GPU figures are public
# numbers of NCCL and UCX, assumptions until `hpcgpu bench comm` runs on such
# a cluster (the JSON summary of `hpcgpu plan` says which is which).
LINKS = {
    # NCCL over NVLink 4 inside one HGX H100/H200 node (the communicator's GPU
    # path; NVLink joins at most 8 GPUs). Bandwidth: nccl-tests all_reduce_perf
    # on 8 x H100 SXM reaches a bus bandwidth of 460-480 GB/s with NVLink SHARP
    # and ~370 GB/s with rings, against 450 GB/s per direction on the data sheet
    # (nccl-tests doc/PERFORMANCE.md says what busbw measures). Latency: NCCL's
    # protocols cost ~1 us (LL) to ~6 us (Simple) per hop (Hu et al.,
    # "Demystifying NCCL", arXiv 2507.04786), plus a kernel launch: ~10 us.
    "nvlink": LinkProfile("nvlink", 370e9, 10e-6,
                          "assumed: NCCL over NVLink 4 (nccl-tests busbw on 8 x H100 SXM; NCCL protocol latencies, "
                          "arXiv 2507.04786); not yet measured with hpcgpu"),
    # NCCL over InfiniBand NDR, one 400 Gb/s ConnectX-7 per GPU: 50 GB/s line
    # rate, of which nccl-tests reaches ~90% per NIC; a small message crosses
    # the network (~2 us) and NCCL's proxy thread on both sides: ~20 us.
    "ndr": LinkProfile("ndr", 45e9, 20e-6,
                       "assumed: NCCL over InfiniBand NDR 400 Gb/s, one NIC per GPU (nccl-tests busbw ~90% of "
                       "line rate); not yet measured with hpcgpu"),
    # The communicator's dask path over ucx:// (what GPU workers use today):
    # UCX moves a small message in 1-2 us and a large one near line rate
    # (ucx_perftest tag_lat / tag_bw), but dask's comm layer costs ~0.35 ms of
    # CPU per message on a worker's event loop (measured on this machine,
    # hpcgpu/partition/direct_comm.py), which dominates the latency.
    "ucx-ndr": LinkProfile("ucx-ndr", 40e9, 0.35e-3,
                           "assumed: hpcgpu's dask comm path over UCX on InfiniBand NDR (ucx_perftest figures plus "
                           "~0.35 ms per message of dask's comm layer); not yet measured with hpcgpu"),
    "ucx-nvlink": LinkProfile("ucx-nvlink", 300e9, 0.35e-3,
                              "assumed: hpcgpu's dask comm path over UCX cuda_ipc on NVLink 4 (~0.35 ms per message "
                              "of dask's comm layer); not yet measured with hpcgpu"),
    # 100 Gb/s Ethernet through the communicator's direct socket path: one TCP
    # stream per peer (~40 Gb/s untuned), and per message the software cost
    # measured here on loopback (~0.18 ms) plus ~20 us of network.
    "100gbe": LinkProfile("100gbe", 5e9, 0.2e-3,
                          "assumed: one TCP stream over 100 Gb/s Ethernet through the direct socket path; not yet "
                          "measured with hpcgpu"),
    # This machine: 2 single-threaded LocalCluster workers over loopback TCP,
    # the direct socket path. `hpcgpu bench comm --workers 2`, six runs on
    # 2026-12-01 (three of them beside other jobs on the 2 cores): median round
    # trip 0.35 ms at 4 KiB and 0.87 ms at 1 MiB over both pairs, so 0.175 ms
    # one way and 4.1 GB/s between them (the three quiet runs alone: 0.33 and
    # 0.72 ms, 0.16 ms and 5.4 GB/s); a scalar allreduce 0.19-0.44 ms. 64 MiB
    # messages moved at only 0.6-0.9 GB/s (fresh receive buffers on 2 shared
    # cores): plan transfers that large here with --link-gbs 0.8.
    "tcp-local": LinkProfile("tcp-local", 4.1e9, 0.175e-3,
                             "measured: hpcgpu bench comm --workers 2 on this machine (2026-12-01), 4 KiB and "
                             "1 MiB round trips"),
}


def link_profile(name, *, bandwidth_gbs=None, latency_us=None):
    """The interconnect named ``name``, optionally with bandwidth (GB/s) or latency (us) overridden.

    An overridden figure makes the profile's :attr:`LinkProfile.basis` ``"given"``.

    Raises
    ------
    ConfigError
        An unknown name (the message lists the valid ones), a bandwidth <= 0
        or a negative latency.

    Examples
    --------
    >>> link_profile("ndr").bandwidth, link_profile("ndr").basis
    (45000000000.0, 'assumed')
    >>> link_profile("ndr", bandwidth_gbs=25).basis
    'given'
    """
    if isinstance(name, LinkProfile):
        link = name
    elif str(name).lower() in LINKS:
        link = LINKS[str(name).lower()]
    else:
        raise ConfigError(f"interconnect must be one of {sorted(LINKS)}; got {name!r}")
    given = []
    if bandwidth_gbs is not None:
        link = replace(link, bandwidth=_positive("link_bandwidth_gbs", bandwidth_gbs) * 1e9)
        given.append(f"bandwidth {link.bandwidth / 1e9:g} GB/s")
    if latency_us is not None:
        try:
            latency = float(latency_us)
        except (TypeError, ValueError):
            latency = float("nan")
        if not (math.isfinite(latency) and latency >= 0):
            raise ConfigError(f"link_latency_us must be a finite number >= 0; got {latency_us!r}")
        link = replace(link, latency_s=latency / 1e6)
        given.append(f"latency {latency:g} us")
    if given:
        link = replace(link, source=f"given: {', '.join(given)} (the rest from {link.name}: {link.source})")
    return link


def _positive(name, value):
    try:
        number = float(value)
    except (TypeError, ValueError):
        number = float("nan")
    if not (math.isfinite(number) and number > 0):
        raise ConfigError(f"{name} must be a positive number; got {value!r}")
    return number
