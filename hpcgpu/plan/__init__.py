"""``hpcgpu plan``: predict time to solution, memory per GPU and parallel efficiency for 1..N GPUs.

The model, per time step and for the slowest partition, of hpcgpu's SPMD
engine (:mod:`hpcgpu.partition.engine`: one pinned task per worker runs an
epoch of many steps; ranks exchange through a communicator):

``compute``
    the roofline of each kernel, ``max(bytes / copy bandwidth, flops / peak)``
    over the fraction of that bound its kernel family reaches on the device
    (measured fractions where the project has them, see
    :mod:`hpcgpu.plan.profiles`), plus the halo copies, the redundant work in
    the halos and the time the device waits for kernel launches (on a GPU a
    launch is asynchronous: it costs time after a synchronisation and behind
    a kernel shorter than itself, :func:`~hpcgpu.plan.workload_costs.launch_wait_s`);
``exchange``
    the bytes a rank sends per step, as its decomposition makes them (a
    frame of halo points around a ``px x py`` block every K steps; every
    block's positions; the ghost atoms of a ``px x py x pz`` brick and, on
    rebuild steps, migrants): ``rounds x latency + bytes / bandwidth`` at
    the interconnect's figures (:class:`LinkProfile`), one round per stage
    of a staged exchange and ``ceil(log2 P)`` per collective;
``scheduler``
    dask's scheduler, once per epoch, over the steps of an epoch (about
    :data:`EPOCH_SECONDS` of work): of its ``epoch_overhead_s + (P + 1) x
    task_overhead_s`` the hand-over between epochs shows, and the
    submission of the next epochs (done while one runs) only where it
    outlasts an epoch's work (:class:`SchedulerModel`).

They add up: the exchange is not assumed to overlap the kernels (so the
model leans pessimistic there); the scheduler and the launches overlap the
work as far as the engine and CUDA streams let them.
Each row names the process grid it prices, as the engine chooses it
(:func:`hpcgpu.partition.process_grid.choose_process_grid`).
Parallel efficiency is ``P0 t(P0) / (P t(P))`` against the smallest GPU
count ``P0`` whose memory holds the problem. One GPU means the engine with
one dask worker. Start-up (cluster, JIT compilation, scattering the initial
state), diagnostics and output are not modelled.

The modules, each depending only on those above it:

:mod:`~hpcgpu.plan.workload_costs`
    the cost model of each workload: one step's bytes, flops, messages and memory;
:mod:`~hpcgpu.plan.profiles`
    devices, interconnects and the scheduler: the figures, and where each comes from;
:mod:`~hpcgpu.plan.prediction`
    :func:`plan`, which adds the terms up for 1..N GPUs, and the :class:`Plan` it returns;
:mod:`~hpcgpu.plan.check`
    ``hpcgpu plan --check``: the model against a run on this machine;
:mod:`~hpcgpu.plan.cli`
    the options and output of ``hpcgpu plan``.

Examples
--------
>>> result = plan("weather", nx=4096, ny=4096, steps=1000, device="h100", interconnect="ndr", max_gpus=4)
>>> [row.gpus for row in result.rows]
[1, 2, 4]
>>> result.rows[0].bound
'bandwidth'
"""

from hpcgpu.partition.engine import EPOCH_SECONDS
from hpcgpu.plan.cli import add_arguments, run_command
from hpcgpu.plan.devices import device_profile, measured_device
from hpcgpu.plan.prediction import EFFICIENCY_THRESHOLD, USABLE_MEMORY_FRACTION, Plan, PlanRow, plan
from hpcgpu.plan.profiles import (DEVICES, EPOCH_OVERHEAD_S, LINKS, TASK_OVERHEAD_S, DeviceProfile, LinkProfile,
                                  SchedulerModel, link_profile)
from hpcgpu.plan.workload_costs import WORKLOADS, StepCost, make_workload

__all__ = ["plan", "run_command", "add_arguments", "Plan", "PlanRow", "SchedulerModel", "StepCost", "LinkProfile",
           "DeviceProfile", "make_workload", "device_profile", "link_profile", "measured_device", "WORKLOADS",
           "DEVICES", "LINKS", "EPOCH_OVERHEAD_S", "TASK_OVERHEAD_S", "EPOCH_SECONDS", "EFFICIENCY_THRESHOLD",
           "USABLE_MEMORY_FRACTION"]
