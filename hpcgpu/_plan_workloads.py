"""Cost models of the workloads for ``hpcgpu plan``: bytes, flops, messages, tasks and memory per step.

Each model describes one time step of the slowest partition when the problem
is split over P devices the way hpcgpu's engine splits it (row blocks with
halos, slabs with ghost atoms, blocks of bodies with all-gathered
positions), and returns a :class:`StepCost`. The counts are read off the
kernels and executors; where a number is an estimate, the comment says so.
"""

import math
from dataclasses import dataclass

from hpcgpu.errors import ConfigError
from hpcgpu.validation import check_choice, check_dtype, check_float, check_int

__all__ = ["StepCost", "Weather", "MolecularDynamics", "NBody", "WORKLOADS", "make_workload", "kernel_time"]

# How many worker-to-worker transfers one level of a step waits for, one
# after the other, is what costs latency; bytes add up on the receiver.


@dataclass(frozen=True)
class StepCost:
    """Seconds per time step by component, and bytes of memory, for the slowest partition."""

    compute_s: float
    transfer_s: float
    scheduler_s: float
    memory_bytes: float
    bound: str
    steps_per_task: int = 1
    feasible: bool = True
    note: str = ""

    @property
    def seconds_per_step(self):
        return self.compute_s + self.transfer_s + self.scheduler_s if self.feasible else float("nan")


def _infeasible(note):
    nan = float("nan")
    return StepCost(nan, nan, nan, nan, "-", 0, False, note)


def kernel_time(nbytes, flops, device, family, dtype):
    """Roofline time (s) of a kernel: ``max(bytes / copy bandwidth, flops / peak) / fraction``.

    Returns ``(seconds, bound)`` with bound ``"bandwidth"`` or ``"compute"``.

    Examples
    --------
    >>> from hpcgpu._profiles import DEVICES
    >>> seconds, bound = kernel_time(1e9, 1e6, DEVICES["h100"], "copy", "float32")
    >>> bound, round(seconds * 1e6)
    ('bandwidth', 351)
    """
    memory_s = nbytes / device.copy_bandwidth
    compute_s = flops / device.peak(dtype)
    bound = "bandwidth" if memory_s >= compute_s else "compute"
    return max(memory_s, compute_s) / device.fraction(family, dtype), bound


def _transfer_time(link, scheduler, levels, nbytes):
    """``levels`` transfers one after another on the critical path, then ``nbytes`` through the link.

    Each costs the link's latency plus dask's own cost of a worker-to-worker
    transfer (asking the peer, serialising, a TCP or UCX round trip); the
    transfers of one level run concurrently and share the bandwidth.
    """
    return levels * (link.latency_s + scheduler.transfer_overhead_s) + nbytes / link.bandwidth


@dataclass(frozen=True)
class Weather:
    """The shallow-water model (SSP-RK3, Arakawa C-grid) on an ``nx x ny`` grid, split into row blocks.

    On a GPU a step is three fused stages reading and writing 6 + 9 + 9
    fields per point (the traffic ``hpcgpu bench stencil`` counts); on a CPU
    the Numba backend pipelines the three stages in one sweep, which reads
    the state once and writes it once (6). Each stage costs about 130 flops
    per point (counted in ``kernels/stencil/_physics.py`` and
    ``_numba._output_row``: potential vorticity, fluxes and Bernoulli ~27,
    the Arakawa-Lamb coefficients recomputed where used, tendencies,
    viscosity and the Runge-Kutta update ~104). A task advances its block
    and the halo rows ``ShallowWater.halo_rows(K)`` for K steps; the rows it
    steps shrink stage by stage towards an open edge, so the redundant work
    is half the halo on average. The halos are written into spare rows the
    resident block keeps (the task path copies halos only).
    """

    nx: int
    ny: int
    steps: int
    dtype: str = "float32"
    steps_per_task: int = 16
    periodic: bool = False

    name = "weather"
    field_passes_per_step = {"gpu": 24, "cpu": 6}
    flops_per_point_step = 390
    state_fields = 3
    launches_per_step = 3  # one fused kernel per Runge-Kutta stage

    def __post_init__(self):
        check_int("nx", self.nx, minimum=4)
        check_int("ny", self.ny, minimum=4)
        check_int("steps", self.steps, minimum=1)
        check_int("steps_per_task", self.steps_per_task, minimum=1)
        object.__setattr__(self, "dtype", check_dtype("dtype", self.dtype).name)

    def size(self):
        return {"nx": self.nx, "ny": self.ny}

    def describe(self):
        return f"weather {self.nx} x {self.ny} ({self.dtype}), {self.steps} steps, K <= {self.steps_per_task}"

    @staticmethod
    def halo_rows(steps):
        """Rows ``(south, north)`` that ``steps`` steps read beyond a block (the model's own answer)."""
        from hpcgpu.workloads.weather import ShallowWater

        return ShallowWater.halo_rows(None, steps)

    def cost(self, partitions, device, link, scheduler):
        item = 4 if self.dtype == "float32" else 8
        rows = math.ceil(self.ny / partitions)
        k = self.steps_per_task
        if partitions > 1:
            # hpcgpu.distributed.split_rows: a block must hold the widest halo it gives away.
            while k > 0 and max(self.halo_rows(k)) > self.ny // partitions:
                k -= 1
            if k == 0:
                return _infeasible(f"blocks of {self.ny // partitions} rows are thinner than the "
                                   f"{max(self.halo_rows(1))}-row halo of one step")
        south, north = self.halo_rows(k)
        if partitions == 1:
            sides, halo = 0, 0
        elif partitions == 2 and not self.periodic:
            sides, halo = 1, max(south, north)
        else:
            sides, halo = 2, south + north
        extended = (rows + halo) * self.nx
        computed = (rows + halo / 2) * self.nx  # the stepped rows shrink towards open edges
        passes = self.field_passes_per_step["cpu" if device.kind == "cpu" else "gpu"]
        kernel_s, bound = kernel_time(passes * item * computed, self.flops_per_point_step * computed, device,
                                      "stencil", self.dtype)
        kernel_s += self.launches_per_step * device.launch_s
        # cutting the halos and writing them into the block's spare rows
        copy_bytes = 2 * 2 * self.state_fields * item * halo * self.nx
        copy_s, _ = kernel_time(copy_bytes, 0, device, "copy", self.dtype)
        halo_bytes = self.state_fields * item * halo * self.nx
        tasks = 1 if partitions == 1 else partitions + (2 * partitions if self.periodic else 2 * (partitions - 1))
        levels = 1 if partitions == 1 else 2
        # two generations of the block with spare rows, and the stepper's nine work fields
        memory = item * (2 * self.state_fields * extended + 3 * self.state_fields * extended)
        transfer = 0.0 if sides == 0 else _transfer_time(link, scheduler, 1, halo_bytes) / k
        return StepCost(kernel_s + copy_s / k, transfer,
                        scheduler.superstep_s(tasks, levels) / k, memory, bound, k)


@dataclass(frozen=True)
class MolecularDynamics:
    """Lennard-Jones atoms at ``density`` with full Verlet lists of radius ``cutoff + skin``, in z slabs.

    A full list holds ``4/3 pi (cutoff + skin)^3 density`` neighbours per
    atom (77.6 at the standard 0.8442, 2.5, 0.3); a pair costs about 40
    flops (minimum image, distance, one division, the force, energy and
    virial: ``kernels/md/_physics.py``) and moves its int32 index and the
    neighbour's position (counted in full, though caches catch some). Lists
    are rebuilt every ``rebuild_every`` steps from 27 cells of side
    ``cutoff + skin``. Each step a slab receives the positions of the atoms
    within ``cutoff + skin`` of its two faces; the step is ``4P`` tasks
    (``2P`` with two slabs, ``3P`` with three) in 2 dependent levels (:mod:`hpcgpu.domains`).
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
            return _infeasible(f"slabs of {side / partitions:.3g} sigma are thinner than cutoff + 2 skin = "
                               f"{thinnest:g} (box side {side:.4g})")
        owned = math.ceil(self.atoms / partitions)
        neighbours = min(2, partitions - 1)
        ghosts = 0 if partitions == 1 else min(self.atoms - owned, 2 * side * side * radius * self.density)
        pairs = self.pairs_per_atom
        force_bytes = owned * (pairs * (4 + 3 * item) + self.stream_values_per_atom * item + 48)
        force_s, bound = kernel_time(force_bytes, owned * pairs * self.flops_per_pair, device, "md", self.dtype)
        candidates = min(self.atoms, 27 * self.density * radius ** 3)
        capacity = math.ceil(1.3 * pairs) + 16
        build_bytes = owned * (candidates * 3 * item + capacity * 4) + (owned + ghosts) * 8 * item
        build_s, _ = kernel_time(build_bytes, owned * candidates * self.flops_per_candidate, device,
                                 "neighbor_build", self.dtype)
        ghost_bytes = ghosts * 3 * item
        # critical path: exchange (both answers, twice the ghosts) -> kick (ghosts and flags fetched)
        transfer = 0.0 if partitions == 1 else _transfer_time(link, scheduler, 1, 2 * ghost_bytes)
        # an exchange per neighbour and the kick; rebuild-flag tasks only beyond three slabs
        tasks = partitions + partitions * neighbours + (partitions if partitions > 3 else 0)
        levels = 2
        per_atom = self.state_values_per_atom * item + 32  # + int64 images and ids
        memory = (3 * owned * per_atom + owned * (capacity + 1) * 4 + owned * 3 * item
                  + 2 * ghosts * 3 * item + (owned + ghosts) * 16)
        force_s += self.launches_per_step * device.launch_s
        return StepCost(force_s + build_s / self.rebuild_every, transfer, scheduler.superstep_s(tasks, levels),
                        memory, bound, 1)


@dataclass(frozen=True)
class NBody:
    """Direct all-pairs gravity on ``bodies`` bodies, split into blocks; positions all-gathered each step.

    About 20 flops per interaction (the convention of ``hpcgpu bench nbody``);
    each step every block publishes its ``(4, M)`` positions and masses and
    takes everyone's (:class:`hpcgpu.bodies.BodyExecutor`): ``2P`` tasks
    in 2 dependent levels.
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

    def cost(self, partitions, device, link, scheduler):
        item = 4 if self.dtype == "float32" else 8
        n, owned = self.bodies, math.ceil(self.bodies / partitions)
        force_bytes = item * (4 * n + 2 * self.state_values_per_body * owned)
        force_s, bound = kernel_time(force_bytes, self.flops_per_interaction * owned * n, device, "nbody",
                                     self.dtype)
        # drift's block copy, the positions cut, and concatenating everyone's positions
        copy_bytes = 2 * item * (2 * self.state_values_per_body * owned + 4 * owned + 4 * n)
        copy_s, _ = kernel_time(copy_bytes, 0, device, "copy", self.dtype)
        gathered = 4 * item * (n - owned)
        # a dask worker fetches from at most 10 peers at once (distributed.worker.connections.outgoing)
        rounds = math.ceil((partitions - 1) / 10)
        transfer = 0.0 if partitions == 1 else _transfer_time(link, scheduler, rounds, gathered)
        memory = item * (3 * self.state_values_per_body * owned + 8 * n + 4 * owned)
        force_s += self.launches_per_step * device.launch_s
        return StepCost(force_s + copy_s, transfer, scheduler.superstep_s(2 * partitions, 2), memory, bound, 1)


WORKLOADS = {"weather": Weather, "md": MolecularDynamics, "nbody": NBody}
_SIZE_KEYS = {"weather": ("nx", "ny"), "md": ("atoms",), "nbody": ("bodies",)}


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
    check_choice("workload", name, tuple(WORKLOADS))
    cls = WORKLOADS[name]
    valid = [f for f in cls.__dataclass_fields__]
    unknown = sorted(set(parameters) - set(valid))
    if unknown:
        raise ConfigError(f"unknown parameter(s) {unknown} for workload {name!r}; valid: {valid}")
    missing = [k for k in (*_SIZE_KEYS[name], "steps") if parameters.get(k) is None]
    if missing:
        raise ConfigError(f"workload {name!r} needs {', '.join(missing)} (sizes > 0); got none")
    return cls(**{k: v for k, v in parameters.items() if v is not None})
