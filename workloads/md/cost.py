"""The cost model of the Lennard-Jones (md) model for ``hpcgpu plan``: bytes, flops, messages and memory per step.

Declared to the registry by :mod:`hpcgpu.workloads.md.workload` (``plan=``); the
terms and helpers it builds on live in :mod:`hpcgpu.plan.workload_costs`.
"""

import math
from dataclasses import dataclass

from hpcgpu.plan.workload_costs import infeasible_step, kernel_time, step_cost
from hpcgpu.validation import check_dtype, check_float, check_int

__all__ = ["MolecularDynamicsCost"]


@dataclass(frozen=True)
class MolecularDynamicsCost:
    """Lennard-Jones atoms at ``density`` with full Verlet lists of radius ``cutoff + skin``, in z slabs.

    A full list holds ``4/3 pi (cutoff + skin)^3 density`` neighbours per
    atom (77.6 at the standard 0.8442, 2.5, 0.3); a pair costs about 40
    flops (minimum image, distance, one division, the force, energy and
    virial: ``kernels/md/physics.py``) and moves its int32 index and the
    neighbour's position (counted in full, though caches catch some). Lists
    are rebuilt every ``rebuild_every`` steps from 27 cells of side
    ``cutoff + skin``. The exchange (:mod:`hpcgpu.partition.slabs`): each
    step a slab sends each neighbouring slab the positions of its atoms
    within ``cutoff + skin`` of that slab (a layer of the face area), and
    every rank takes part in an allreduce of the rebuild flag (``P - 1``
    messages a rank: the communicator's allreduce is an allgather); on a
    rebuild step a second exchange sends each neighbour those positions
    again with the atoms that moved into its slab (whole atoms, an estimate
    of ``density x face area x skin / 4`` per face: about the atoms within
    ``skin / 2`` of the face, half of them moving towards it).
    """

    atoms: int
    steps: int
    dtype: str = "float64"
    density: float = 0.8442
    cutoff: float = 2.5
    skin: float = 0.3
    rebuild_every: int = 15

    name = "md"
    flops_per_pair = 40
    flops_per_candidate = 12
    stream_values_per_atom = 24  # drift, half kicks, forces, energies, virials: read + write
    state_values_per_atom = 14   # positions, velocities, forces, origins (3 each), energy, virial
    launches_per_step = 6  # drift, rebuild test, forces, kick, and their reductions (an estimate)
    flag_bytes = 8  # the rebuild flag, one message to every other rank

    def __post_init__(self):
        check_int("atoms", self.atoms, minimum=2)
        check_int("steps", self.steps, minimum=1)
        check_int("rebuild_every", self.rebuild_every, minimum=1)
        for name in ("density", "cutoff", "skin"):
            check_float(name, getattr(self, name), minimum=0.0, strict_min=True)
        object.__setattr__(self, "dtype", check_dtype("dtype", self.dtype).name)

    def size(self):
        return {"atoms": self.atoms}

    def describe(self):
        return (f"md {self.atoms:.3g} atoms ({self.dtype}, density {self.density:g}, cutoff {self.cutoff:g}, "
                f"skin {self.skin:g}, rebuild every {self.rebuild_every}), {self.steps} steps")

    @property
    def box_side(self):
        return (self.atoms / self.density) ** (1.0 / 3.0)

    @property
    def pairs_per_atom(self):
        """Neighbours per atom in a full list of radius ``cutoff + skin``."""
        radius = self.cutoff + self.skin
        return min(self.atoms - 1, 4.0 / 3.0 * math.pi * radius ** 3 * self.density)

    def cost(self, partitions, device, link, scheduler):
        item = 4 if self.dtype == "float32" else 8
        radius = self.cutoff + self.skin
        side = self.box_side
        thinnest = self.cutoff + 2 * self.skin
        if partitions > 1 and side / partitions < thinnest:
            return infeasible_step(f"slabs of {side / partitions:.3g} sigma are thinner than cutoff + 2 skin = "
                               f"{thinnest:g} (box side {side:.4g})")
        owned = math.ceil(self.atoms / partitions)
        neighbours = min(2, partitions - 1)  # with two slabs both faces border the same one
        face = side * side
        ghosts = 0 if partitions == 1 else min(self.atoms - owned, 2 * face * radius * self.density)
        pairs = self.pairs_per_atom
        force_bytes = owned * (pairs * (4 + 3 * item) + self.stream_values_per_atom * item + 48)
        force_s, bound = kernel_time(force_bytes, owned * pairs * self.flops_per_pair, device, "md", self.dtype)
        candidates = min(self.atoms, 27 * self.density * radius ** 3)
        capacity = math.ceil(1.3 * pairs) + 16
        build_bytes = owned * (candidates * 3 * item + capacity * 4) + (owned + ghosts) * 8 * item
        build_s, _ = kernel_time(build_bytes, owned * candidates * self.flops_per_candidate, device,
                                 "neighbor_build", self.dtype)
        per_atom = self.state_values_per_atom * item + 32  # + int64 images and ids
        if partitions == 1:
            messages = nbytes = 0.0
        else:
            # every step: the ghosts' positions to each neighbour, the flag to every other rank
            messages = neighbours + (partitions - 1)
            nbytes = ghosts * 3 * item + (partitions - 1) * self.flag_bytes
            # rebuild steps: the ghosts' positions again and the migrants, one message per neighbour
            migrants = min(owned, 2 * face * self.density * self.skin / 4)
            messages += neighbours / self.rebuild_every
            nbytes += (ghosts * 3 * item + migrants * per_atom) / self.rebuild_every
        memory = (3 * owned * per_atom + owned * (capacity + 1) * 4 + owned * 3 * item
                  + 2 * ghosts * 3 * item + (owned + ghosts) * 16)
        force_s += self.launches_per_step * device.launch_s
        return step_cost(scheduler, partitions, force_s + build_s / self.rebuild_every, messages, nbytes, link,
                          memory, bound)
