"""The cost model of direct-sum gravity (the astro model, ``hpcgpu plan nbody``) for ``hpcgpu plan``: bytes, flops, messages and memory per step.

Declared to the registry by :mod:`hpcgpu.workloads.astro.workload` (``plan=``); the
terms and helpers it builds on live in :mod:`hpcgpu.plan.workload_costs`.
"""

import math
from dataclasses import dataclass

from hpcgpu.partition.process_grid import check_grid
from hpcgpu.plan.workload_costs import collective_rounds, kernel_time, launch_wait_s, step_cost
from hpcgpu.validation import check_dtype, check_int

__all__ = ["NBodyCost"]


@dataclass(frozen=True)
class NBodyCost:
    """Direct all-pairs gravity on ``bodies`` bodies, split into blocks; positions all-gathered each step.

    About 20 flops per interaction (the convention of ``hpcgpu bench nbody``);
    each step every rank gathers everyone's ``(4, M)`` positions and masses
    (one allgather, :mod:`hpcgpu.partition.all_pairs`) by recursive
    doubling: ``ceil(log2 P)`` rounds of one message, each twice the last,
    ``P - 1`` blocks in all. The process grid is the 1-D ``(P,)``.
    """

    bodies: int
    steps: int
    dtype: str = "float32"

    name = "nbody"
    flops_per_interaction = 20
    state_values_per_body = 11  # positions, velocities, accelerations (3 each), mass, potential
    launches_per_step = 3  # drift, forces, kick

    def __post_init__(self):
        check_int("bodies", self.bodies, minimum=2)
        check_int("steps", self.steps, minimum=1)
        object.__setattr__(self, "dtype", check_dtype("dtype", self.dtype).name)

    def size(self):
        return {"bodies": self.bodies}

    def describe(self):
        return f"nbody {self.bodies:.3g} bodies ({self.dtype}, direct sum), {self.steps} steps"

    def cost(self, partitions, device, link, scheduler, grid=None):
        """The StepCost of the largest block on ``partitions`` ranks (``grid``: None or ``(partitions,)``)."""
        item = 4 if self.dtype == "float32" else 8
        n, owned = self.bodies, math.ceil(self.bodies / partitions)
        force_bytes = item * (4 * n + 2 * self.state_values_per_body * owned)
        force_s, bound = kernel_time(force_bytes, self.flops_per_interaction * owned * n, device, "nbody",
                                     self.dtype)
        # drift's block copy, the positions cut, and concatenating everyone's positions
        copy_bytes = 2 * item * (2 * self.state_values_per_body * owned + 4 * owned + 4 * n)
        copy_s, _ = kernel_time(copy_bytes, 0, device, "copy", self.dtype)
        messages = collective_rounds(partitions)
        nbytes = (partitions - 1) * 4 * item * owned
        memory = item * (3 * self.state_values_per_body * owned + 8 * n + 4 * owned)
        # one stretch of launches per step, after the allgather: forces (the long one), kick, drift
        force_s += launch_wait_s(device, [[force_s, copy_s / 2, copy_s / 2]])
        return step_cost(scheduler, partitions, force_s + copy_s, messages, nbytes, link, memory, bound,
                         grid=(partitions,) if grid is None else check_grid(grid, 1, partitions))
