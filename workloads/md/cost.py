"""The cost model of the Lennard-Jones (md) model for ``hpcgpu plan``: bytes, flops, messages and memory per step.

Declared to the registry by :mod:`hpcgpu.workloads.md.workload` (``plan=``); the
terms and helpers it builds on live in :mod:`hpcgpu.plan.workload_costs`.

Examples
--------
>>> md = MolecularDynamicsCost(10 ** 8, steps=1000)
>>> md.process_grid(256), md.process_grid(1024)
((8, 8, 4), (16, 8, 8))
"""

import math
from dataclasses import dataclass

from hpcgpu.errors import ConfigError
from hpcgpu.partition.bricks import SPECULATE_BELOW
from hpcgpu.partition.process_grid import check_grid, choose_process_grid
from hpcgpu.partition.rebuild_flags import LATE_REBUILD_MARGIN, rebuild_delay
from hpcgpu.plan.workload_costs import exchange_time, infeasible_step, kernel_time, launch_wait_s, step_cost
from hpcgpu.validation import check_dtype, check_float, check_int

__all__ = ["MolecularDynamicsCost"]


@dataclass(frozen=True)
class MolecularDynamicsCost:
    """Lennard-Jones atoms at ``density`` with full Verlet lists of radius ``cutoff + skin``, in 3-D bricks.

    A full list holds ``4/3 pi (cutoff + skin)^3 density`` neighbours per
    atom (77.6 at the standard 0.8442, 2.5, 0.3); a pair costs about 40
    flops (minimum image, distance, one division, the force, energy and
    virial: ``kernels/md/physics.py``) and moves its int32 index and the
    neighbour's position (counted in full, though caches catch some). Lists
    are rebuilt every ``rebuild_every`` steps from 27 cells of side
    ``cutoff + skin``.

    The periodic box is split into ``px x py x pz`` bricks
    (:meth:`process_grid`; 1-D slabs are the ``1 x 1 x P`` case). Each step
    a brick receives the positions of the ghost atoms within ``cutoff +
    skin`` of it, by a staged exchange along x, then y, then z (each stage
    carries the ghosts of the earlier ones, so edges and corners ride
    along): 2 messages per split axis, 6 for a brick split along all three,
    and one latency per stage (a stage's two messages travel together). The
    ghosts fill the shell of thickness ``cutoff + skin`` around the brick on
    its split axes (an axis of one brick is its own periodic image). The
    rebuild decision rides inside that exchange, so no collective runs per
    step; past 3 layers on an axis it comes :func:`rebuild_delay
    <hpcgpu.partition.rebuild_flags.rebuild_delay>` steps after the flag,
    which is raised on a bound that leaves room for those steps: the lists
    are rebuilt more often (:meth:`rebuild_period`). On a rebuild step a second staged exchange sends the ghosts'
    positions again with the atoms that moved into a neighbour's brick
    (whole atoms, an estimate of ``density x face area x skin / 4`` per
    split face: about the atoms within ``skin / 2`` of the face, half of
    them moving towards it). Packing the ghosts to send and unpacking
    those received is counted as copies.
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
    reach_launches = 1         # the late rebuild's bound replaces the rebuild test: one kernel and a memset
    reach_values_per_atom = 6  # which reads velocities and forces too (kernels/md/_cuda.py)

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

    @property
    def ghost_radius(self):
        """Thickness of the ghost shell, ``cutoff + skin``."""
        return self.cutoff + self.skin

    @property
    def thinnest_brick(self):
        """The thinnest brick along a split axis, ``cutoff + 2 skin``: as the engine requires
        (:mod:`hpcgpu.partition.bricks`: atoms move up to ``skin / 2`` between rebuilds, so ghosts and
        migrants must come from the next layer only)."""
        return self.cutoff + 2 * self.skin

    def process_grid(self, partitions):
        """The ``(px, py, pz)`` bricks of ``partitions`` ranks: least ghost surface, at least ``cutoff + 2 skin`` thick.

        Raises
        ------
        ConfigError
            No grid of that many ranks has bricks that thick.
        """
        radius = self.ghost_radius
        return choose_process_grid(partitions, (self.box_side,) * 3, halo=(radius,) * 3,
                                   minimum=(self.thinnest_brick,) * 3, tie="first")

    def rebuild_period(self, grid):
        """Steps between rebuilds on ``grid``: ``rebuild_every``, less what a rebuild decided late costs.

        A flag raised on the bound ``|d| + margin x (the D steps' motion)``
        and a rebuild ``D`` steps later land ``(margin - 1) D`` steps early
        for an atom that moves at a steady speed (an estimate). Below
        ``D + 1`` steps the rebuild would come after the list failed: the
        engine refuses such a step (a dangerous build), the plan the grid.

        Examples
        --------
        >>> md = MolecularDynamicsCost(10 ** 8, steps=1)
        >>> md.rebuild_period((3, 3, 2)), md.rebuild_period((4, 4, 2)), md.rebuild_period((8, 8, 4))
        (15, 14.5, 13.5)
        """
        delay = rebuild_delay(grid)
        if not delay:
            return self.rebuild_every
        return self.rebuild_every - (LATE_REBUILD_MARGIN - 1) * delay

    def launch_stretches(self, step_s, pair_share, copy_s, stages, copies_launch=True, reach=False):
        """The kernels of one step (seconds, launch order) between its synchronisations.

        As the engine's domains run a step
        (:meth:`hpcgpu.partition.bricks.BrickDecomposition.advance`): each
        stage of the ghost exchange cuts the ghosts for both its neighbours
        (one ``take``, from what the rank holds) and sends them; after its
        wait the received ghosts are joined to what the rank holds (one
        copy) before the next stage's cut; the last join is what the
        forces read, and the kick, the drift, the rebuild test (with
        ``reach``, the late rebuild's :attr:`reach_launches` kernels) and
        the reductions queue behind the forces until the host reads the
        rebuild progress (a synchronisation). The neighbour build of a
        rebuild step is not counted. Without ``copies_launch`` (a CPU) only
        the :attr:`launches_per_step` kernels count.

        Parameters
        ----------
        step_s : float
            Seconds of the step's force and streaming kernels.
        pair_share : float
            The forces' share of ``step_s`` (the rest: five streaming kernels).
        copy_s : float
            Seconds of the ghosts' cuts and joining.
        stages : int
            Split axes: stages of the exchange.

        Examples
        --------
        >>> stretches = MolecularDynamicsCost(10 ** 6, steps=1).launch_stretches(1e-3, 0.9, 4e-6, 2)
        >>> [len(s) for s in stretches], [round(t * 1e6) for t in stretches[2][:3]]
        ([1, 2, 7], [1, 900, 20])
        """
        streaming = [step_s * (1 - pair_share) / (self.launches_per_step - 1)] * (self.launches_per_step - 1)
        streaming += [0.0] * (self.reach_launches if reach else 0)  # their bytes are in step_s
        if not copies_launch:
            return [[step_s * pair_share] + streaming]
        copy = copy_s / (2 * stages) if stages else 0.0
        cuts = [[copy] * (1 + bool(stage)) for stage in range(stages)]  # the join of the stage before, the cut
        return cuts + [[copy] * bool(stages) + [step_s * pair_share] + streaming]

    def cost(self, partitions, device, link, scheduler, grid=None):
        """The StepCost of the fullest brick on ``partitions`` ranks (``grid``: default :meth:`process_grid`)."""
        item = 4 if self.dtype == "float32" else 8
        radius = self.ghost_radius
        side = self.box_side
        if grid is None:
            try:
                grid = self.process_grid(partitions)
            except ConfigError:
                thinnest = self.thinnest_brick
                most = max(1, int(side // thinnest))
                return infeasible_step(f"bricks would be thinner than cutoff + 2 skin = {thinnest:g} "
                                       f"(box side {side:.4g}: at most {most}^3 = {most ** 3} bricks)")
        grid = check_grid(grid, 3, partitions)
        brick = [side / p for p in grid]
        if any(p > 1 and b < self.thinnest_brick for p, b in zip(grid, brick)):
            return infeasible_step(f"bricks of {' x '.join(f'{b:.3g}' for b in brick)} sigma are thinner than "
                                   f"cutoff + 2 skin = {self.thinnest_brick:g} (box side {side:.4g})", grid)
        split = [p > 1 for p in grid]
        owned = math.ceil(self.atoms / partitions)
        # the shell of thickness cutoff + skin around the brick, on its split axes only
        shell = math.prod(b + 2 * radius * s for b, s in zip(brick, split)) - math.prod(brick)
        ghosts = min(self.atoms - owned, shell * self.density)
        faces = sum(2 * math.prod(brick[:a] + brick[a + 1:]) for a, s in enumerate(split) if s)
        pairs = self.pairs_per_atom
        pair_bytes = owned * pairs * (4 + 3 * item)
        delay = rebuild_delay(grid)
        streamed = self.stream_values_per_atom + (self.reach_values_per_atom if delay else 0)
        force_bytes = pair_bytes + owned * (streamed * item + 48)
        force_s, bound = kernel_time(force_bytes, owned * pairs * self.flops_per_pair, device, "md", self.dtype)
        candidates = min(self.atoms, 27 * self.density * radius ** 3)
        capacity = math.ceil(1.3 * pairs) + 16
        build_bytes = owned * (candidates * 3 * item + capacity * 4) + (owned + ghosts) * 8 * item
        build_s, _ = kernel_time(build_bytes, owned * candidates * self.flops_per_candidate, device,
                                 "neighbor_build", self.dtype)
        stages = sum(split)
        # cutting the ghosts to send and joining the received ones to what the rank holds, stage by stage
        held = owned + ghosts / 2  # the joins copy the rank's atoms and the earlier ghosts again (an estimate)
        copy_s, _ = kernel_time(2 * (ghosts + stages * held) * 3 * item, 0, device, "copy", self.dtype)
        per_atom = self.state_values_per_atom * item + 32  # + int64 images and ids
        # every step: the ghosts' positions, 2 messages per split axis; rebuild steps: again, with the migrants
        migrants = min(owned, faces * self.density * self.skin / 4)
        period = self.rebuild_period(grid)
        if period < delay + 1:
            return infeasible_step(f"a rebuild decided {delay} steps late on {'x'.join(map(str, grid))} bricks "
                                   f"needs lists that last {delay + 1} steps or more; at rebuild_every="
                                   f"{self.rebuild_every} they last {period:g}", grid)
        messages = 2 * stages * (1 + 1 / period)
        rounds = stages * (1 + 1 / period)  # the rebuild flags ride with the ghosts: no collective
        nbytes = ghosts * 3 * item + (ghosts * 3 * item + migrants * per_atom) / period
        memory = (3 * owned * per_atom + owned * (capacity + 1) * 4 + owned * 3 * item
                  + 2 * ghosts * 3 * item + (owned + ghosts) * 16)
        stretches = self.launch_stretches(force_s, pair_bytes / force_bytes, copy_s, stages, device.kind != "cpu",
                                          reach=bool(delay))
        waited = launch_wait_s(device, stretches)
        exchange_s = exchange_time(link, rounds, nbytes)
        if device.kind != "cpu" and stages:
            inner = math.prod(max(0.0, (b - 2 * radius) / b) for b, s in zip(brick, split) if s)
            ghost_s = exchange_time(link, stages, ghosts * 3 * item)
            waited, exchange_s = self.overlapped(device, stretches, inner, ghost_s, waited, exchange_s, period)
        return step_cost(scheduler, partitions, force_s + waited + build_s / period + copy_s, messages, nbytes,
                         link, memory, bound, rounds=rounds, grid=grid, exchange_s=exchange_s)

    def overlapped(self, device, stretches, inner, ghost_s, waited, exchange_s, period):
        """The launch waits and the exposed exchange of a GPU step, averaged with the steps that speculate.

        A rank whose atoms are well inside the rebuild bound (under
        :data:`~hpcgpu.partition.bricks.SPECULATE_BELOW` of it: about that
        share of the steps between rebuilds, the displacement growing about
        linearly) queues its inner atoms' forces (``inner``: their share of
        the pairs) and runs the exchange on a second stream beside them: the
        stages' cuts and joins with their launch waits, and the ghost
        messages (``ghost_s``), are exposed only beyond the inner forces;
        the edge atoms' forces and the streaming kernels follow. The
        exchange of rebuild steps is not hidden.

        Parameters
        ----------
        device : DeviceProfile
        stretches : list of lists of float
            :meth:`launch_stretches` of the step that does not speculate.
        inner : float
            The inner atoms' share of the atoms.
        ghost_s : float
            Seconds of a step's ghost messages (rounds and bytes).
        waited, exchange_s : float
            Launch waits and exchange seconds of the step that does not speculate.
        period : float
            Steps between rebuilds.

        Returns
        -------
        (float, float)
            Launch waits and exposed exchange seconds per step.
        """
        *stages, last = stretches
        join, pairs, *streaming = last
        side_s = launch_wait_s(device, [*stages, [join]]) + sum(map(sum, stages)) + join + ghost_s
        inner_s = inner * pairs
        late = side_s > inner_s  # the edge forces are launched after the exchange: a launch after the wait
        main = [[inner_s, pairs - inner_s, *streaming]]
        exposed = max(0.0, side_s - inner_s)  # the messages' share of it first, the rest the cuts' launches
        spec_waited = launch_wait_s(device, main) + device.launch_s * late + max(0.0, exposed - ghost_s)
        spec_exchange = min(exposed, ghost_s) + (exchange_s - ghost_s)
        share = SPECULATE_BELOW * (1 - 1 / period)
        return share * spec_waited + (1 - share) * waited, share * spec_exchange + (1 - share) * exchange_s
