"""What ``hpcgpu plan`` computes a workload's cost from: bytes, flops, messages and memory per step.

Each workload declares its own cost model (``plan=`` of its
:class:`hpcgpu.registry.Workload`, e.g. :mod:`hpcgpu.workloads.weather.cost`);
this module holds the terms they share and :func:`make_workload`. Each
model describes one time step of the slowest partition when the problem is
split over P devices the way hpcgpu's SPMD engine splits it
(:mod:`hpcgpu.partition`: ``px x py`` blocks of a grid with halos,
``px x py x pz`` bricks of atoms with ghosts, blocks of bodies with
all-gathered positions; the process grid from
:func:`hpcgpu.partition.process_grid.choose_process_grid`), and returns a
:class:`StepCost` of three terms:

``compute``
    the kernels' rooflines, the halo copies, the redundant halo work and the
    time the device waits for kernel launches (:func:`launch_wait_s`: on a
    GPU a launch is asynchronous and costs time only after a
    synchronisation or behind a kernel shorter than itself);
``exchange``
    the messages a rank sends per step through the communicator, counted
    from the decomposition (a frame of halo points every K steps; every
    block's positions; ghost atoms and, on rebuild steps, the migrants):
    ``rounds x latency + bytes / bandwidth``. A round is what a rank waits
    for before it can go on: one stage of a staged exchange (x, then y,
    then z: the two messages of a stage, to the lower and the upper
    neighbour, travel together) or one step of a collective (recursive
    doubling: ``ceil(log2 P)`` rounds, :func:`collective_rounds`). The
    bytes of all messages share the link's bandwidth;
``scheduler``
    what dask's scheduler adds per epoch (one pinned task per worker and one
    records task): the hand-over between epochs, and the submission only
    where it outlasts an epoch's work, spread over the steps of the epoch
    (:class:`hpcgpu.plan.SchedulerModel`).

The counts are read off the kernels and the decompositions; where a number
is an estimate, the comment says so.
"""

import math
from collections.abc import Mapping
from dataclasses import dataclass

from hpcgpu.errors import ConfigError

__all__ = ["StepCost", "WORKLOADS", "make_workload", "kernel_time", "exchange_time", "step_cost", "infeasible_step",
           "collective_rounds", "format_grid", "launch_wait_s"]


@dataclass(frozen=True)
class StepCost:
    """Seconds per time step by term, bytes of memory, and the exchange's counts, for the slowest partition.

    ``messages`` and ``exchange_bytes`` are what the rank sends per step
    and ``rounds`` the latencies it waits for (averaged over K steps and
    over rebuild periods); ``steps_per_epoch`` is the number of steps the
    scheduler term is spread over; ``grid`` the process grid, ranks along
    each axis of the decomposition.
    """

    compute_s: float
    exchange_s: float
    scheduler_s: float
    memory_bytes: float
    bound: str
    steps_per_task: int = 1
    feasible: bool = True
    note: str = ""
    messages: float = 0.0
    exchange_bytes: float = 0.0
    steps_per_epoch: int = 0
    rounds: float = 0.0
    grid: tuple = ()

    @property
    def seconds_per_step(self):
        return self.compute_s + self.exchange_s + self.scheduler_s if self.feasible else float("nan")


def infeasible_step(note, grid=()):
    """The StepCost of a split that cannot run (``note`` says why): every term NaN."""
    nan = float("nan")
    return StepCost(nan, nan, nan, nan, "-", 0, False, note, nan, nan, 0, nan, tuple(grid))


def collective_rounds(partitions):
    """Rounds of a collective on ``partitions`` ranks by recursive doubling: ``ceil(log2 P)``.

    An allreduce or allgather exchanges with the partner ``rank ^ 2**i`` in
    round ``i``; a rank count that is not a power of two folds its extra
    ranks into the others, which the ceiling counts.

    Examples
    --------
    >>> [collective_rounds(p) for p in (1, 2, 3, 8, 1000)]
    [0, 1, 2, 3, 10]
    """
    return math.ceil(math.log2(partitions)) if partitions > 1 else 0


def format_grid(grid):
    """A process grid as the table prints it: ``"16x8"``, ``"8x4x4"``, ``"64"``; ``"-"`` for none.

    Examples
    --------
    >>> format_grid((16, 8)), format_grid((8, 4, 4)), format_grid((64,)), format_grid(())
    ('16x8', '8x4x4', '64', '-')
    """
    return "x".join(str(p) for p in grid) if grid else "-"


def kernel_time(nbytes, flops, device, family, dtype):
    """Roofline time (s) of a kernel: ``max(bytes / copy bandwidth, flops / peak) / fraction``.

    Returns ``(seconds, bound)`` with bound ``"bandwidth"`` or ``"compute"``.

    Examples
    --------
    >>> from hpcgpu.plan.profiles import DEVICES
    >>> seconds, bound = kernel_time(1e9, 1e6, DEVICES["h100"], "copy", "float32")
    >>> bound, round(seconds * 1e6)
    ('bandwidth', 351)
    """
    memory_s = nbytes / device.copy_bandwidth
    compute_s = flops / device.peak(dtype)
    bound = "bandwidth" if memory_s >= compute_s else "compute"
    return max(memory_s, compute_s) / device.fraction(family, dtype), bound


def exchange_time(link, rounds, nbytes):
    """Seconds for a rank to exchange ``nbytes`` bytes in all in ``rounds`` rounds over ``link``.

    Each round (a stage of a staged exchange, a step of a collective) pays
    the link's latency, one after another, and the bytes share its
    bandwidth: ``rounds * latency + nbytes / bandwidth``.

    Examples
    --------
    >>> from hpcgpu.plan.profiles import LinkProfile
    >>> link = LinkProfile("example", bandwidth=1e9, latency_s=1e-4)
    >>> round(exchange_time(link, 2, 1e6) * 1e3, 3)
    1.2
    """
    return rounds * link.latency_s + nbytes / link.bandwidth


def launch_wait_s(device, stretches):
    """Seconds ``device`` waits for kernel launches in ``stretches`` of kernels, each after a synchronisation.

    On a GPU a launch is asynchronous: the host enqueues kernel ``j`` of a
    stretch ``launch_s`` after kernel ``j - 1`` and goes on, so a kernel
    starts at ``max(its launch, the end of the one before)``. After a
    synchronisation (the host waited for the stream: a halo exchange, a
    scalar read) the queue is empty and the device waits for the first
    launch; after that a kernel waits only while the host is behind, which
    happens after kernels shorter than a launch. This computes that queue
    exactly; what it returns is the stretches' time beyond their kernels'.
    On a CPU (``device.kind == "cpu"``) a kernel is a parallel region the
    host runs itself: every launch is paid in full.

    Parameters
    ----------
    device : DeviceProfile
    stretches : iterable of sequences of float
        The kernels' seconds in launch order, one sequence per stretch
        between two synchronisations.

    Examples
    --------
    >>> from hpcgpu.plan.profiles import DEVICES
    >>> h100 = DEVICES["h100"]  # 20 us per launch
    >>> round(launch_wait_s(h100, [[1e-3, 1e-6, 1e-6]]) * 1e6)  # the first launch; the rest queue behind 1 ms
    20
    >>> round(launch_wait_s(h100, [[1e-6, 1e-6, 1e-6]]) * 1e6)  # short kernels: the host sets the pace
    58
    >>> round(launch_wait_s(DEVICES["cpu"], [[1e-3, 1e-6, 1e-6]]) * 1e6)  # 5 us per region, all paid
    15
    """
    launch = device.launch_s
    if device.kind == "cpu":
        return sum(launch * len(kernels) for kernels in stretches)
    waited = 0.0
    for kernels in stretches:
        issued = end = 0.0
        for seconds in kernels:
            issued += launch
            end = max(issued, end) + seconds
        waited += end - sum(kernels)
    return waited


def step_cost(scheduler, partitions, compute_s, messages, nbytes, link, memory, bound, steps_per_task=1, *,
              rounds=None, grid=(), exchange_s=None):
    """The StepCost of a feasible step: the exchange at the link's figures, the epoch's exposed scheduler cost
    spread over its steps (:meth:`hpcgpu.plan.profiles.SchedulerModel.per_step_s`).

    ``rounds`` (default: one per message) are the latencies the exchange waits for per step;
    ``exchange_s`` the exchange's exposed seconds where the model computed them (an exchange that
    overlaps compute), else :func:`exchange_time` of the rounds and bytes.
    """
    rounds = messages if rounds is None else rounds
    exchange_s = exchange_time(link, rounds, nbytes) if exchange_s is None else exchange_s
    step_s = compute_s + exchange_s
    steps = scheduler.steps_in_epoch(step_s, steps_per_task)
    return StepCost(compute_s, exchange_s, scheduler.per_step_s(partitions, step_s, steps_per_task), memory, bound,
                    steps_per_task,
                    messages=messages, exchange_bytes=nbytes, steps_per_epoch=steps, rounds=rounds,
                    grid=tuple(grid))


class _PlanWorkloads(Mapping):
    """``{plan name: cost-model class}`` of the registered workloads, read from the registry when asked."""

    def __getitem__(self, name):
        from hpcgpu import registry

        planned = registry.plan_workloads()
        if name not in planned:
            raise KeyError(name)
        return planned[name].cost_model()

    def __iter__(self):
        from hpcgpu import registry

        return iter(registry.plan_workloads())

    def __len__(self):
        from hpcgpu import registry

        return len(registry.plan_workloads())

    def __repr__(self):
        return f"WORKLOADS({', '.join(self)})"


WORKLOADS = _PlanWorkloads()
"""The ``hpcgpu plan`` cost models by name: each workload declares its own (:mod:`hpcgpu.registry`)."""

# The cost models moved to their workloads (hpcgpu.workloads.*_cost); the old names still import from here.
_MOVED = {"WeatherCost": "weather", "MolecularDynamicsCost": "md", "NBodyCost": "nbody"}


def __getattr__(name):
    if name in _MOVED:
        return WORKLOADS[_MOVED[name]]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def make_workload(name, **parameters):
    """The cost model of workload ``name`` with its parameters.

    Raises
    ------
    ConfigError
        Unknown workload or parameter (the message lists the valid ones), a
        missing size, or a size <= 0.

    Examples
    --------
    >>> make_workload("md", atoms=10**7, steps=10**6).pairs_per_atom > 77
    True
    """
    from hpcgpu import registry

    declared = registry.get_plan(name)
    cls = declared.cost_model()
    valid = [f for f in cls.__dataclass_fields__]
    unknown = sorted(set(parameters) - set(valid))
    if unknown:
        raise ConfigError(f"unknown parameter(s) {unknown} for workload {name!r}; valid: {valid}")
    missing = [k for k in (*declared.plan_sizes, "steps") if parameters.get(k) is None]
    if missing:
        raise ConfigError(f"workload {name!r} needs {', '.join(missing)} (sizes > 0); got none")
    return cls(**{k: v for k, v in parameters.items() if v is not None})
