"""Cost models of the workloads for ``hpcgpu plan``: bytes, flops, messages and memory per step.

Each model describes one time step of the slowest partition when the problem
is split over P devices the way hpcgpu's SPMD engine splits it
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

import math
from dataclasses import dataclass

from hpcgpu.errors import ConfigError
from hpcgpu.validation import check_choice, check_dtype, check_float, check_int

__all__ = ["StepCost", "WeatherCost", "MolecularDynamicsCost", "NBodyCost", "WORKLOADS", "make_workload", "kernel_time",
           "exchange_time"]


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


def _infeasible(note):
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


def _step_cost(scheduler, partitions, compute_s, messages, nbytes, link, memory, bound, steps_per_task=1):
    """The StepCost of a feasible step: the exchange at the link's figures, the epoch's cost spread over its steps."""
    exchange_s = exchange_time(link, messages, nbytes)
    steps = scheduler.steps_in_epoch(compute_s + exchange_s, steps_per_task)
    return StepCost(compute_s, exchange_s, scheduler.epoch_s(partitions) / steps, memory, bound, steps_per_task,
                    messages=messages, exchange_bytes=nbytes, steps_per_epoch=steps)


@dataclass(frozen=True)
class WeatherCost:
    """The shallow-water model (SSP-RK3, Arakawa C-grid) on an ``nx x ny`` grid, split into row blocks.

    On a GPU a step is three fused stages reading and writing 6 + 9 + 9
    fields per point (the traffic ``hpcgpu bench stencil`` counts); on a CPU
    the Numba backend pipelines the three stages in one sweep, which reads
    the state once and writes it once (6). Each stage costs about 130 flops
    per point (counted in ``kernels/stencil/_physics.py`` and
    ``_numba._output_row``: potential vorticity, fluxes and Bernoulli ~27,
    the Arakawa-Lamb coefficients recomputed where used, tendencies,
    viscosity and the Runge-Kutta update ~104). Every K steps a rank sends
    its neighbours their halo rows (``ShallowWater.halo_rows(K)``: 3 fields
    each, one message per neighbour; :mod:`hpcgpu.partition.rows`), writes
    the halos it receives into the spare rows around its block, and
    advances its block and halos K steps; the rows it steps shrink stage by
    stage towards an open edge, so the redundant work is half the halo on
    average. K is the engine's default
    (:func:`hpcgpu.partition.rows.auto_steps_per_task`) unless
    ``steps_per_task`` is given.
    """

    nx: int
    ny: int
    steps: int
    dtype: str = "float32"
    steps_per_task: int = None
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
        if self.steps_per_task is not None:
            check_int("steps_per_task", self.steps_per_task, minimum=1)
        object.__setattr__(self, "dtype", check_dtype("dtype", self.dtype).name)

    def size(self):
        return {"nx": self.nx, "ny": self.ny}

    def describe(self):
        k = "K auto" if self.steps_per_task is None else f"K <= {self.steps_per_task}"
        return f"weather {self.nx} x {self.ny} ({self.dtype}), {self.steps} steps, {k}"

    @staticmethod
    def halo_rows(steps):
        """Rows ``(south, north)`` that ``steps`` steps read beyond a block (the model's own answer)."""
        from hpcgpu.workloads.weather import ShallowWater

        return ShallowWater.halo_rows(None, steps)

    def steps_per_exchange(self, partitions):
        """K on ``partitions`` blocks: the engine's default, or the given K lowered until a block holds its halo.

        Returns 0 when even one step's halo is wider than a block.
        """
        rows = self.ny // partitions
        if partitions == 1:
            return self.steps_per_task or 16
        if self.steps_per_task is None:
            from hpcgpu.partition.rows import auto_steps_per_task

            k = auto_steps_per_task(_RowShape(self.ny, self.halo_rows), partitions)
        else:
            k = self.steps_per_task
        # hpcgpu.partition.layout.split_rows: a block must hold the widest halo it gives away
        while k > 0 and max(self.halo_rows(k)) > rows:
            k -= 1
        return k

    def cost(self, partitions, device, link, scheduler):
        item = 4 if self.dtype == "float32" else 8
        rows = math.ceil(self.ny / partitions)
        k = self.steps_per_exchange(partitions)
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
        # cutting the halos to send and writing the received ones into the block's spare rows
        copy_bytes = 2 * 2 * self.state_fields * item * halo * self.nx
        copy_s, _ = kernel_time(copy_bytes, 0, device, "copy", self.dtype)
        # the rows a rank sends its neighbours every K steps, one message each
        halo_bytes = self.state_fields * item * halo * self.nx
        # two generations of the block with spare rows, and the stepper's nine work fields
        memory = item * (2 * self.state_fields * extended + 3 * self.state_fields * extended)
        return _step_cost(scheduler, partitions, kernel_s + copy_s / k, sides / k, halo_bytes / k, link, memory,
                          bound, k)


@dataclass(frozen=True)
class _RowShape:
    """What :func:`hpcgpu.partition.rows.auto_steps_per_task` reads of a row model."""

    rows: int
    halo: object
    decomposition = "rows"

    def decomposition_size(self):
        return self.rows

    def halo_rows(self, steps):
        return self.halo(steps)


@dataclass(frozen=True)
class MolecularDynamicsCost:
    """Lennard-Jones atoms at ``density`` with full Verlet lists of radius ``cutoff + skin``, in z slabs.

    A full list holds ``4/3 pi (cutoff + skin)^3 density`` neighbours per
    atom (77.6 at the standard 0.8442, 2.5, 0.3); a pair costs about 40
    flops (minimum image, distance, one division, the force, energy and
    virial: ``kernels/md/_physics.py``) and moves its int32 index and the
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
            return _infeasible(f"slabs of {side / partitions:.3g} sigma are thinner than cutoff + 2 skin = "
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
        return _step_cost(scheduler, partitions, force_s + build_s / self.rebuild_every, messages, nbytes, link,
                          memory, bound)


@dataclass(frozen=True)
class NBodyCost:
    """Direct all-pairs gravity on ``bodies`` bodies, split into blocks; positions all-gathered each step.

    About 20 flops per interaction (the convention of ``hpcgpu bench nbody``);
    each step every rank sends its ``(4, M)`` positions and masses to each
    of the ``P - 1`` others (one allgather, :mod:`hpcgpu.partition.all_pairs`;
    NCCL's ring allgather takes the same ``P - 1`` steps of one block each).
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
        messages = partitions - 1
        nbytes = messages * 4 * item * owned
        memory = item * (3 * self.state_values_per_body * owned + 8 * n + 4 * owned)
        force_s += self.launches_per_step * device.launch_s
        return _step_cost(scheduler, partitions, force_s + copy_s, messages, nbytes, link, memory, bound)


WORKLOADS = {"weather": WeatherCost, "md": MolecularDynamicsCost, "nbody": NBodyCost}
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
