"""What a model provides to be driven by :class:`~hpcgpu.simulation.Simulation` and to be partitioned.

Written once, as :class:`typing.Protocol` classes: :class:`SteppedModel` is
what the driver needs of every model; :class:`Partitionable` what every
decomposition of items needs of a block of the state; :class:`AllPairsModel`
and :class:`SlabModel` what the all-pairs and brick decompositions need on
top (``model.decomposition`` names which: ``"bodies"`` or ``"domains"``);
:class:`SpectralModel` what the row blocks with a global spectral solve per
stage need (``"spectral"``). A model on the distributed structured grid
(``"grid"``) describes only its local physics (:class:`GridPhysics`, six
methods) and gets the rest from
:class:`~hpcgpu.partition.grid_model.GridModelBase`. The models of
:mod:`hpcgpu.workloads` implement them, and a user's own model plugs in
the same way; :func:`missing_methods` says what a model lacks.

Examples
--------
>>> from hpcgpu.workloads.weather import ShallowWater
>>> model = ShallowWater("gravity_wave", nx=8, ny=8, backend="numpy")
>>> missing_methods(model, GridModel)
[]
>>> isinstance(model, SteppedModel), isinstance(model, SlabModel)
(True, False)
"""

from typing import Any, Protocol, runtime_checkable

__all__ = ["AllPairsModel", "GridModel", "GridPhysics", "Partitionable", "PROTOCOLS", "SlabModel",
           "SpectralModel", "SteppedModel", "missing_methods"]


@runtime_checkable
class SteppedModel(Protocol):
    """What :class:`~hpcgpu.simulation.Simulation` needs of every model.

    ``backend`` says where it runs, ``cfl_limit`` its stable limit of
    :meth:`cfl`, ``name`` its short name.
    """

    backend: Any
    cfl_limit: float
    name: str

    def initial_state(self): """The state at time 0."""
    def suggested_dt(self, state, cfl=...): """A stable time step for ``state``."""
    def stepper(self, dt): """An object whose ``advance(state, steps)`` returns the state ``steps`` later."""
    def warm_up(self): """Compile the kernels on a tiny problem (timed apart from the run)."""
    def cfl(self, state, dt): """The stability number of ``state`` at ``dt`` (NaN for non-finite values)."""
    def bad_fields(self, state): """Names of the fields holding NaN/inf or non-physical values."""
    def diagnostics(self, state, dt=None): """Global diagnostics (dict of floats)."""
    def to_dataset(self, state, time=None): """The state as an ``xarray.Dataset`` (output)."""
    def attributes(self): """Model parameters as a flat dict (output metadata)."""


@runtime_checkable
class Partitionable(Protocol):
    """What every decomposition needs: blocks of the state, and diagnostics and health reduced from blocks.

    ``block_sums`` of every block, combined by ``combine_sums``, give
    :meth:`SteppedModel.diagnostics`; ``block_health`` / ``combine_health``
    give ``(bad_fields, cfl)``. Partial sums travel, never the state.
    """

    decomposition: str

    def decomposition_size(self): """Items (bodies, atoms) the state is split over."""
    def take_block(self, state, start, stop): """Items ``start:stop`` as independent arrays."""
    def concat_blocks(self, states): """Blocks joined in order, on this model's backend."""
    def to_host(self, state): """The state with NumPy arrays."""
    def block_sums(self, state, start, extra=None): """Partial sums of the diagnostics over a block."""
    def combine_sums(self, parts): """The diagnostics from the partial sums of all blocks."""
    def block_health(self, state): """A block's part of the health check."""
    def combine_health(self, parts, dt): """``(bad_fields, cfl)`` from every block's part."""
    def with_backend(self, backend): """The same model on another backend (``"auto"`` resolves on a worker)."""


@runtime_checkable
class AllPairsModel(Partitionable, Protocol):
    """Particles that need every position each step (:mod:`hpcgpu.partition.all_pairs`).

    A model whose ``sums_need_positions`` is true gets every block's
    positions as the ``extra`` of ``block_sums``. A model whose bodies are
    functions of their ids lets the ranks build them
    (:mod:`hpcgpu.partition.bodies_start`) with three more methods:
    ``initial_block(first, stop)`` (the bodies ``first:stop`` of
    ``initial_state``, velocities raw), ``start_velocity_sums(block, first)``
    (small) and ``start_normalisation(sums)`` (what
    :func:`~hpcgpu.partition.bodies_start.shifted` applies); else the client
    builds the state and splits it.
    """

    def drift_block(self, state, dt): """The part of a step before the forces (no other body needed)."""
    def block_positions(self, state): """What other blocks need of this one for the forces."""
    def kick_block(self, state, blocks, start, dt): """Forces from every block's positions, and the rest of the step."""


@runtime_checkable
class SlabModel(Partitionable, Protocol):
    """Short-range particles on bricks of a periodic box (:mod:`hpcgpu.partition.bricks`): local physics only.

    ``box`` holds the sides ``(Lx, Ly, Lz)``. A block's state carries the
    particle arrays as attributes: ``positions`` ``(3, N)`` wrapped into
    the box, ``ids`` ``(N,)`` (global, unique) and ``size`` (N); every
    per-particle array travels through :meth:`select_atoms` and
    ``concat_blocks``. Forces take the minimum image of the box, so ghosts
    need no shifts. Two optional pairs of methods make a run better:
    ``listed_positions(state)`` / ``relist(state, positions)`` (a split
    state keeps the neighbour list it has, so ranks rebuild at the steps
    one process would), and ``split_neighbors(state, edge_atoms)`` /
    ``inner_forces(state, split)`` (on GPUs, the forces of the atoms that
    need no ghost while the ghosts travel).
    """

    box: Any

    def ghost_radius(self): """Particles this close to a brick are its ghosts (cutoff + skin)."""
    def migration_margin(self): """How far a particle may stray from its brick before the lists are rebuilt."""
    def select_atoms(self, state, index): """The particles ``index`` of a block, every per-particle array."""
    def drift_block(self, state, dt): """The part of a step before the forces (each particle on its own)."""
    def rebuild_progress(self, state): """The largest squared move since the list build over the rebuild threshold's."""
    def kick_with_ghosts(self, state, ghost_positions, dt, rebuild, inner=None):
        """Forces on the block's particles from themselves and the ghosts, and the rest of the step."""


@runtime_checkable
class GridPhysics(Protocol):
    """The local physics of a model on a structured 2-D grid: all a user's grid model writes.

    ``shape`` is the grid's ``(ny, nx)`` cells and ``periodic`` says for
    ``(x, y)`` whether the axis wraps. A state is a dataclass of 2-D arrays
    (one per field, every field ``(ny, nx)``; staggered fields follow the
    C-grid convention of the weather model: ``u`` on west faces, ``v`` on
    south faces). A block comes with a
    :class:`~hpcgpu.partition.block_region.BlockRegion` that says which of
    its cells are owned and what lies beyond each side. Subclass
    :class:`hpcgpu.partition.grid_model.GridModelBase` for the rest of what
    :class:`SteppedModel` and the distributed grid need.
    """

    name: str
    shape: Any
    periodic: Any

    def reach(self, steps): """Cells a block's ``steps`` steps read beyond it: one int, ``(x, y)`` or 4 sides."""
    def initial_block(self, where):
        """The state of the owned cells of ``where`` at time 0 (global coordinates; on a cluster each rank calls
        it on its own worker, so the whole grid is never built in one place)."""
    def step_block(self, state, dt, steps, where):
        """The framed block ``steps`` steps later (cells within the reach of a frame's outer edge need not be valid)."""
    def block_sums(self, state, where): """Partial sums of the diagnostics over the owned cells (frames filled)."""
    def combine_sums(self, parts): """The diagnostics (dict of floats) from every block's partial sums."""
    def cfl(self, state, dt): """The stability number of a block at ``dt`` (NaN for non-finite values)."""


@runtime_checkable
class GridModel(GridPhysics, Protocol):
    """What the distributed grid (:mod:`hpcgpu.partition.grid`) needs: the physics and a block's health.

    :class:`hpcgpu.partition.grid_model.GridModelBase` supplies everything
    beyond :class:`GridPhysics`.
    """

    backend: Any

    def block_health(self, state): """A block's part of the health check."""
    def combine_health(self, parts, dt): """``(bad_fields, cfl)`` from every block's part."""
    def to_host(self, state): """The state with NumPy arrays."""
    def with_backend(self, backend): """The same model on another backend (``"auto"`` resolves on a worker)."""


@runtime_checkable
class SpectralModel(Protocol):
    """A grid model whose every stage ends in a global solve diagonal in Fourier modes (:mod:`hpcgpu.partition.spectral`).

    The barotropic vorticity model is one: each Runge-Kutta stage updates
    the vorticity locally, then inverts a Laplacian for the streamfunction.
    ``shape`` is ``(ny, nx)``, ``periodic`` ``(x, y)`` (x must wrap: rows
    are transformed whole), ``stages`` the stages of a step and
    ``spectral_fields`` the names of the field a stage updates and of the
    field solved from it. A block is whole rows, with the frames
    ``reach(1)`` asks for filled before every stage; ``where`` is its
    :class:`~hpcgpu.partition.block_region.BlockRegion`. An optional
    ``check_partitions(partitions)`` raises ConfigError for a split the
    model cannot take (the vorticity model's CG solver).
    """

    shape: Any
    periodic: Any
    stages: int
    spectral_fields: Any
    backend: Any

    def reach(self, steps): """``(x, y)`` cells a stage reads beyond a block (called with 1)."""
    def stage_block(self, state, start, stage, dt, where):
        """The updated field on the owned rows after stage ``stage`` (``start``: the owned rows at the step's start)."""
    def forward_lines(self, rows, where): """The x transform of the owned rows of the updated field."""
    def solve_columns(self, columns, first, stop): """The solve on whole columns ``first:stop`` of the x transform."""
    def inverse_lines(self, spectra, where): """The solved field on the owned rows, from their x transform."""
    def block_sums(self, state, where): """Partial sums of the diagnostics over the owned rows (frames filled)."""
    def combine_sums(self, parts): """The diagnostics (dict of floats) from every block's partial sums."""
    def block_health(self, state, where=None): """A block's part of the health check (frames filled)."""
    def combine_health(self, parts, dt): """``(bad_fields, cfl)`` from every block's part."""
    def to_host(self, state): """The state with NumPy arrays."""
    def with_backend(self, backend): """The same model on another backend (``"auto"`` resolves on a worker)."""


PROTOCOLS = {"grid": GridModel, "bodies": AllPairsModel, "domains": SlabModel, "spectral": SpectralModel}
"""The protocol of each ``model.decomposition``."""


def missing_methods(model, protocol):
    """Names ``protocol`` requires that ``model`` lacks (empty when it conforms)."""
    names = [name for name in dir(protocol) if not name.startswith("_")]
    required = set(getattr(protocol, "__protocol_attrs__", names))
    return sorted(name for name in required if not hasattr(model, name))
