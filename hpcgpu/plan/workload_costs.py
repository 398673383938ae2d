"""What ``hpcgpu plan`` computes a workload's cost from: bytes, flops, messages and memory per step.

Each workload declares its own cost model (``plan=`` of its
:class:`hpcgpu.registry.Workload`, e.g. :mod:`hpcgpu.workloads.weather.cost`);
this module holds the terms they share and :func:`make_workload`. Each
model describes one time step of the slowest partition when the problem is
split over P devices the way hpcgpu's SPMD engine splits it
(:mod:`hpcgpu.partition`: row blocks with halos, slabs with ghost atoms,
blocks of bodies with all-gathered positions), and returns a
:class:`StepCost` of three terms:

``compute``
    the kernels' rooflines, the halo copies, the redundant halo work and the
    kernel launches;
``exchange``
    the messages a rank sends per step through the communicator, counted
    from the decomposition (halo rows every K steps; every block's positions;
    ghost atoms, the rebuild flag's allreduce and, on rebuild steps, the
    migrants): ``messages x latency + bytes / bandwidth``. A rank's messages
    are counted one after another (the communicator sends from the rank's
    thread; a ring collective's steps follow each other too);
``scheduler``
    the engine pays dask's scheduler once per epoch (one pinned task per
    worker and one records task), spread over the steps of the epoch
    (:class:`hpcgpu.plan.SchedulerModel`).

The counts are read off the kernels and the decompositions; where a number
is an estimate, the comment says so.
"""

from collections.abc import Mapping
from dataclasses import dataclass

from hpcgpu.errors import ConfigError

__all__ = ["StepCost", "WORKLOADS", "make_workload", "kernel_time", "exchange_time", "step_cost", "infeasible_step"]


@dataclass(frozen=True)
class StepCost:
    """Seconds per time step by term, bytes of memory, and the exchange's counts, for the slowest partition.

    ``messages`` and ``exchange_bytes`` are what the rank sends per step
    (averaged over K steps and over rebuild periods); ``steps_per_epoch``
    is the number of steps the scheduler term is spread over.
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

    @property
    def seconds_per_step(self):
        return self.compute_s + self.exchange_s + self.scheduler_s if self.feasible else float("nan")


def infeasible_step(note):
    """The StepCost of a split that cannot run (``note`` says why): every term NaN."""
    nan = float("nan")
    return StepCost(nan, nan, nan, nan, "-", 0, False, note, nan, nan, 0)


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


def exchange_time(link, messages, nbytes):
    """Seconds for a rank to send ``messages`` messages of ``nbytes`` bytes in all over ``link``.

    Each message pays the link's latency, one after another, and the bytes
    share its bandwidth: ``messages * latency + nbytes / bandwidth``.

    Examples
    --------
    >>> from hpcgpu.plan.profiles import LinkProfile
    >>> link = LinkProfile("example", bandwidth=1e9, latency_s=1e-4)
    >>> round(exchange_time(link, 2, 1e6) * 1e3, 3)
    1.2
    """
    return messages * link.latency_s + nbytes / link.bandwidth


def step_cost(scheduler, partitions, compute_s, messages, nbytes, link, memory, bound, steps_per_task=1):
    """The StepCost of a feasible step: the exchange at the link's figures, the epoch's cost spread over its steps."""
    exchange_s = exchange_time(link, messages, nbytes)
    steps = scheduler.steps_in_epoch(compute_s + exchange_s, steps_per_task)
    return StepCost(compute_s, exchange_s, scheduler.epoch_s(partitions) / steps, memory, bound, steps_per_task,
                    messages=messages, exchange_bytes=nbytes, steps_per_epoch=steps)


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
