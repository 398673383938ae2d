"""Molecular dynamics: a Lennard-Jones fluid in a periodic box, in reduced units.

Units are reduced Lennard-Jones units: ``epsilon = sigma = mass = k_B = 1``,
so lengths are in sigma, energies in epsilon, time in
``sigma sqrt(mass / epsilon)``, temperature in ``epsilon / k_B`` and pressure
in ``epsilon / sigma**3``. Atoms interact by the pair potential
``u(r) = 4 ((1/r)^12 - (1/r)^6)`` truncated at ``cutoff`` and, with
``shift=True`` (the default), shifted by ``u(cutoff)`` so that the energy is
continuous (the forces are the same either way; molecular dynamics with
either samples the shifted potential's ensemble).

Integration (one force evaluation per step, forces carried in the state):

* NVE, ``thermostat="none"``: velocity Verlet, i.e. half kick, drift, forces,
  half kick (symplectic, time reversible; total momentum conserved).
* NVT, ``thermostat="langevin"``: Langevin dynamics with friction ``gamma``
  by the BAOAB splitting of Leimkuhler and Matthews (Appl. Math. Res. Express
  2013, 34): half kick (B), half drift (A), the exact Ornstein-Uhlenbeck
  step ``v <- c1 v + sqrt((1 - c1^2) T) R`` with ``c1 = exp(-gamma dt)``
  (O), half drift (A), forces, half kick (B). Configurational averages
  (potential energy, virial, g(r)) carry a small O(dt^2) error, O(dt^4) at
  high friction; the kinetic temperature at whole steps is low by about
  ``(omega_E dt)^2 / 4`` (omega_E the Einstein frequency: 0.35 % for the
  liquid at T = 0.85, rho = 0.86, dt = 0.005).

Each step is split into :meth:`LennardJones.drift_block` (the part before
the forces: every atom on its own) and :meth:`LennardJones.kick_block`
(neighbour list, forces, the last half kick), with the block methods a
partitioned run needs, in :mod:`hpcgpu.workloads.md.local_steps`. The Gaussian numbers R of the
O step are a pure function of ``(seed, step, atom id)`` (see
:mod:`hpcgpu.workloads.md.setup`), so that a partitioned run gives every
atom the noise the single-partition run gives it.

Forces come from :mod:`hpcgpu.kernels.md` with a full Verlet neighbour list
of radius ``cutoff + skin``, rebuilt only when some atom has moved more than
``skin / 2`` since the last build (builds are counted). Positions are kept wrapped into ``[0, L)`` with integer image counts, so
unwrapped trajectories (mean-squared displacement) stay exact.

Diagnostics (:meth:`LennardJones.diagnostics`): energies, temperature with
3N - 3 degrees of freedom, virial pressure, momentum, mean-squared
displacement, neighbour-list builds, the standard long-range tail
corrections (:func:`tail_corrections`) and the full potential's energy
estimated from them and the shift (``potential_energy_full``); g(r) is
:meth:`LennardJones.rdf`.

Examples
--------
>>> from hpcgpu.workloads.md import LennardJones
>>> model = LennardJones(n_cells=4, temperature=1.44, backend="numpy")
>>> state = model.initial_state()
>>> round(model.diagnostics(state)["temperature"], 12), state.size
(1.44, 256)
>>> later = model.step(state, dt=0.005, steps=100)
>>> abs(model.diagnostics(later)["energy"] / model.diagnostics(state)["energy"] - 1) < 1e-4
True
"""

import math

import numpy as np

from hpcgpu.backends import get_backend
from hpcgpu.errors import ConfigError
from hpcgpu.kernels import md as md_kernels
from hpcgpu.validation import check_choice, check_dtype, check_finite_array, check_float, check_int
from hpcgpu.workloads.md import output
from hpcgpu.workloads.md import pairs
from hpcgpu.workloads.md import setup
from hpcgpu.workloads.md.diagnostics import Thermodynamics
from hpcgpu.workloads.md.local_steps import LocalSteps
from hpcgpu.workloads.md.output import XYZWriter
from hpcgpu.workloads.md.state import MDState

__all__ = ["LennardJones", "MDState", "Integrator", "XYZWriter", "THERMOSTATS", "MIN_DISTANCE",
           "tail_corrections"]

THERMOSTATS = ("none", "langevin")
DEFAULT_DENSITY = 0.8442  # the classic liquid state point near the triple point
MIN_DISTANCE = 0.5
"""Closest approach (sigma) of a configuration given as arrays: a pair at 0.5
sigma holds 16 000 epsilon, which no thermal state reaches."""
tail_corrections = setup.tail_corrections


GPU_SORT_EVERY = 50
"""Neighbour-list builds between re-sorts of the atoms into cell order on GPU backends (about
1000 steps of a liquid at skin 0.3; LAMMPS sorts every 1000 steps, HOOMD-blue every 300)."""


class LennardJones(LocalSteps):
    """Lennard-Jones fluid: atoms in a periodic orthorhombic box on a backend.

    Equations (reduced units, minimum-image periodic box)::

        dx_i/dt = v_i
        dv_i/dt = f_i = -sum_{j != i, r_ij < cutoff} u'(r_ij) (x_i - x_j) / r_ij
        u(r)    = 4 (r**-12 - r**-6) - u(cutoff) [shift]

    advanced by velocity Verlet (NVE) or BAOAB Langevin dynamics (NVT).
    The forces' statement, the reference every backend is tested against,
    is the NumPy pair loop :func:`hpcgpu.kernels.md._numpy.forces`; the
    step is in this class: :meth:`drift_block` (kick, drift, thermostat)
    and :meth:`kick_block` (forces, last half kick).

    Its half steps, forces with ghosts and block methods come from
    :class:`~hpcgpu.workloads.md.local_steps.LocalSteps`; it holds
    ``thermo``, a :class:`~hpcgpu.workloads.md.diagnostics.Thermodynamics`
    (the diagnostics), and delegates to it.

    Parameters
    ----------
    n_cells : int or tuple of 3 int
        Face-centred cubic unit cells per side of the initial lattice
        (``N = 4 nx ny nz`` atoms).
    density : float, optional
        Number density (sigma^-3, > 0) that sets the box from ``n_cells``;
        default 0.8442. Give this or ``box``, not both.
    box : tuple of 3 float, optional
        Box sides (sigma); the lattice is stretched to fill it.
    temperature : float
        Temperature of the initial velocities and of the thermostat (>= 0).
    cutoff : float
        Interaction cutoff (sigma), at most half the shortest box side.
    skin : float
        Verlet skin (sigma, > 0).
    shift : bool
        Shift the pair energy to zero at the cutoff (continuous energy; use
        it for NVE energy conservation).
    thermostat : str
        ``"none"`` (NVE, velocity Verlet) or ``"langevin"`` (NVT, BAOAB).
    friction : float
        Langevin friction gamma (1/time, > 0).
    dtype, backend
        As for every hpcgpu model.
    seed : int
        Seed of the initial velocities and of the thermostat's noise.
    sort_every : int or "auto"
        Re-sort the atoms into cell order (:func:`hpcgpu.kernels.md.cell_order`)
        at every ``sort_every``-th neighbour-list build (>= 0; 0 never).
        Atoms diffuse out of their lattice order, and then each gather of a
        neighbour's position misses the caches (a GPU SM's L1, a core's
        L2); LAMMPS and HOOMD-blue re-sort as well. Every per-atom array
        moves together and the atoms keep their ids, by which outputs are
        ordered; forces are summed in another order (equal to rounding),
        and the state's arrays are no longer in id order. ``"auto"`` (the
        default): every 50 builds (about 1000 steps of a liquid) on GPU
        backends, never on CPU ones, where no gain has been measured and a
        state keeps the order it was given.

    Raises
    ------
    ConfigError
        A parameter out of range, naming it.

    Examples
    --------
    >>> model = LennardJones(n_cells=5, density=0.8442, backend="numpy")
    >>> model.n, round(model.box[0], 4)
    (500, 8.398)
    """

    name = "md"
    state_type = MDState  # the class of its states
    decomposition = "domains"  # bricks of space with ghost atoms: hpcgpu.partition.bricks
    field_names = ("positions", "velocities")
    cfl_limit = 1.0
    # units of the time axis and of the diagnostics (reduced Lennard-Jones units: sigma, epsilon, mass 1)
    diagnostic_units = {"time": "tau (LJ units)", "max_cfl": "1", "temperature": "epsilon/k_B",
                        "pressure": "epsilon/sigma3", "pressure_tail": "epsilon/sigma3", "msd": "sigma2",
                        "density": "sigma-3", "neighbor_rebuilds": "1", "potential_energy_per_atom": "epsilon",
                        "potential_energy_full_per_atom": "epsilon", "interacting_pairs": "1",
                        **{k: "epsilon" for k in ("energy", "kinetic_energy", "potential_energy", "energy_tail",
                                                  "potential_energy_full")},
                        **{f"momentum_{a}": "mass sigma/tau (LJ units)" for a in "xyz"}}

    def __init__(self, n_cells=5, *, density=None, box=None, temperature=1.0, cutoff=2.5, skin=0.3,
                 shift=True, thermostat="none", friction=1.0, dtype="float64", backend="auto", seed=0,
                 sort_every="auto"):
        if density is None and box is None:
            density = DEFAULT_DENSITY
        self.cells, self.box = setup.geometry(n_cells, density, box)
        self.n = 4 * self.cells[0] * self.cells[1] * self.cells[2]
        self.volume = self.box[0] * self.box[1] * self.box[2]
        self.density = self.n / self.volume
        self.temperature = check_float("temperature", temperature, minimum=0.0)
        # Below MIN_DISTANCE the cutoff would drop the repulsive core that keeps atoms apart.
        self.cutoff = check_float("cutoff", cutoff, minimum=MIN_DISTANCE)
        if self.cutoff > min(self.box) / 2:
            raise ConfigError(
                f"cutoff={self.cutoff:g} must be <= half the shortest box side ({min(self.box) / 2:.4g} "
                f"for box {tuple(round(b, 4) for b in self.box)}): the minimum image would miss pairs; "
                f"use more cells (n_cells) or a smaller cutoff")
        self.skin = check_float("skin", skin, minimum=0.0, strict_min=True)
        if not isinstance(shift, (bool, np.bool_)):
            raise ConfigError(f"shift must be True or False; got {shift!r}")
        self.shift = bool(shift)
        self.thermostat = check_choice("thermostat", thermostat, THERMOSTATS)
        self.friction = check_float("friction", friction, minimum=0.0, strict_min=True)
        self.seed = check_int("seed", seed, minimum=0)
        self.dtype = check_dtype("dtype", dtype)
        self.backend = get_backend(backend)
        self.backend_request = backend if isinstance(backend, str) else self.backend.name
        self.sort_every_request = sort_every
        self.sort_every = self._sort_every(sort_every)
        self.energy_shift = md_kernels.energy_shift(self.cutoff) if self.shift else 0.0
        self._hold_parts()

    def _sort_every(self, sort_every):
        if sort_every == "auto":
            return GPU_SORT_EVERY if self.backend.on_gpu else 0
        return check_int("sort_every", sort_every, minimum=0)

    def _hold_parts(self):
        self.thermo = Thermodynamics(self)

    def memory_estimate(self):
        """``(what, bytes)``: per atom, the state arrays (about 24 numbers) and a full neighbour list.

        The list holds ``1.3 * 4/3 pi (cutoff + skin)^3 density`` int32 entries per atom.
        """
        listed = min(self.n, 1.3 * 4.0 / 3.0 * math.pi * (self.cutoff + self.skin) ** 3 * self.density)
        per_atom = 24 * self.dtype.itemsize + 16 + 4 * listed
        return f"n_cells={self.cells} ({self.n} atoms)", int(self.n * per_atom)

    @property
    def case(self):
        """``"nve"`` or ``"langevin"``: names runs and outputs."""
        return "nve" if self.thermostat == "none" else "langevin"

    # -- set-up -----------------------------------------------------------------------
    def initial_state(self):
        """Atoms on an fcc lattice with Maxwell-Boltzmann velocities at ``temperature``."""
        return self.state_from_arrays(setup.fcc_lattice(self.cells, self.box))

    def initial_block(self, candidate_cells):
        """The lattice sites of the unit cells ``candidate_cells`` (per axis): ``(ids, positions)`` on the host.

        What a rank of a brick run builds its atoms and their ghosts from
        (:meth:`BrickDecomposition.build_block
        <hpcgpu.partition.bricks.BrickDecomposition.build_block>`): a site's
        id and position are a pure function of its unit cell, as in
        :meth:`initial_state`.

        Examples
        --------
        >>> model = LennardJones(n_cells=4, backend="numpy")
        >>> ids, positions = model.initial_block(([0], [0, 1], [3]))
        >>> ids.tolist()[:4], positions.shape
        ([12, 13, 14, 15], (3, 8))
        """
        return setup.fcc_sites(self.cells, self.box, candidate_cells)

    def lattice_atoms(self, ids, listed):
        """A block of atoms ``ids`` at the start (host arrays), its forces from ``listed``, and its raw velocities.

        ``listed`` ``(3, M)`` holds the atoms' lattice positions then their
        ghosts': the forces come from a neighbour list built on them (rows
        of the block's atoms only). The velocities are the raw deviates of
        :func:`~hpcgpu.workloads.md.setup.raw_velocities`: every rank's
        :func:`~hpcgpu.workloads.md.setup.velocity_sums` together give the
        normalisation that makes them the one-process run's velocities.
        """
        b, xp = self.backend, self.backend.xp
        n = len(ids)
        joined = b.asarray(listed, dtype=self.dtype)
        neighbors = self.neighbor_list(joined, rows=n)
        forces, energies, virials, pair_counts = (b.to_host(a) for a in self.forces(joined, neighbors))
        positions = np.ascontiguousarray(np.asarray(listed[:, :n], dtype=self.dtype))
        ids = np.asarray(ids, dtype=np.int64)
        velocities = setup.raw_velocities(np, ids, self.seed)
        return MDState(positions, velocities, np.ascontiguousarray(forces[:, :n]), np.zeros((3, n), dtype=np.int64),
                       positions.copy(), ids, np.ascontiguousarray(energies[:n]), np.ascontiguousarray(virials[:n]),
                       np.ascontiguousarray(pair_counts[:n]), step=0, rebuilds=1)

    def start_velocity_sums(self, state):
        """The exact sums of a block's raw initial velocities (see :func:`~hpcgpu.workloads.md.setup.velocity_sums`)."""
        return setup.velocity_sums(state.velocities)

    def start_normalisation(self, sums):
        """``(mean, scale)`` of the initial velocities from every block's :meth:`start_velocity_sums`."""
        return setup.velocity_normalisation(sums, self.temperature)

    def state_from_arrays(self, positions, velocities=None, ids=None, *, step=0):
        """A state from positions ``(3, N)``, optional velocities ``(3, N)`` and ids ``(N,)``.

        Positions may lie outside the box (they are wrapped; the images are
        kept, so they are the origins of the mean-squared displacement).
        Without velocities, Maxwell-Boltzmann velocities at ``temperature``
        with zero total momentum are drawn; ids default to ``0..N-1``.
        ``step`` is the number of steps taken so far: it keys the
        thermostat's noise, so a run restarted from saved arrays continues
        with the noise it would have had.

        Raises
        ------
        ConfigError
            Wrong shapes, fewer than 2 atoms, NaN/inf, ids that are not
            unique non-negative integers, or overlapping atoms (closer than
            :data:`MIN_DISTANCE`).
        """
        b, xp = self.backend, self.backend.xp
        positions = b.asarray(positions, dtype=self.dtype)
        if positions.ndim != 2 or positions.shape[0] != 3 or positions.shape[1] < 2:
            raise ConfigError(f"positions must have shape (3, N) (rows x, y, z) with N >= 2; got {positions.shape}")
        check_finite_array("positions", positions)
        n = positions.shape[1]
        ids = setup.atom_ids(self.backend, ids, n)
        if velocities is None:
            velocities = setup.maxwell_boltzmann(xp, ids, self.temperature, self.seed)
        velocities = b.asarray(velocities, dtype=self.dtype)
        if velocities.shape != (3, n):
            raise ConfigError(f"velocities must have shape (3, {n}) (rows x, y, z); got {velocities.shape}")
        check_finite_array("velocities", velocities)
        origins = positions.copy()
        positions, images = md_kernels.wrap_into_box(xp, self.box, positions.copy(), xp.zeros((3, n), dtype=np.int64))
        neighbors = self.neighbor_list(positions)
        pairs.check_overlaps(self.backend, self.box, positions, neighbors, ids, MIN_DISTANCE)
        forces, energies, virials, pair_counts = self.forces(positions, neighbors)
        return MDState(positions, velocities, forces, images, origins, ids, energies, virials, pair_counts,
                       step=check_int("step", step, minimum=0), rebuilds=1, neighbors=neighbors)

    # -- neighbour pairs ------------------------------------------------------------------
    def neighbor_list(self, positions, previous=None, rows=None):
        """A fresh neighbour list (radius ``cutoff + skin``) for ``positions`` (rows: see ``build_neighbor_list``)."""
        if previous is not None:
            capacity = previous.capacity
        else:
            # from the model's density, not the block's atoms over the whole box: a slab holds a
            # fraction of the atoms at full density, and an estimate that low built every list twice
            expected = self.density * 4.0 / 3.0 * math.pi * (self.cutoff + self.skin) ** 3
            capacity = min(max(1, positions.shape[1] - 1), math.ceil(1.3 * expected) + 16)
        return md_kernels.build_neighbor_list(positions, self.box, cutoff=self.cutoff, skin=self.skin,
                                              capacity=capacity, rows=rows, backend=self.backend)

    def rdf(self, state, bins=100, r_max=None):
        """Radial distribution function g(r) of one state.

        Counts every pair (minimum image) closer than ``r_max`` and
        normalises by the ideal-gas count ``N (N - 1) / V`` times the shell
        volume. Up to the cutoff the state's own neighbour list serves (no
        extra memory); beyond it a list of radius ``r_max`` is built.

        Parameters
        ----------
        state : MDState
        bins : int
            Number of shells of equal width (>= 1).
        r_max : float, optional
            Largest distance (sigma), at most half the shortest box side;
            default the cutoff.

        Returns
        -------
        r, g : numpy arrays (bins,)
            Shell centres (sigma) and g(r).

        Examples
        --------
        >>> model = LennardJones(4, backend="numpy")
        >>> r, g = model.rdf(model.initial_state(), bins=250)
        >>> nearest = model.box[0] / 4 / 2**0.5  # the fcc lattice's nearest neighbours: a / sqrt 2
        >>> bool(abs(r[g.argmax()] - nearest) < 0.01)
        True
        """
        bins, r_max = self.rdf_range(bins, r_max)
        return pairs.rdf_from_counts(self.rdf_counts(state, bins, r_max), state.size, self.box, r_max)

    def rdf_range(self, bins=100, r_max=None):
        """``(bins, r_max)`` checked, ``r_max`` defaulting to the cutoff (see :meth:`rdf`)."""
        bins = check_int("bins", bins, minimum=1)
        r_max = self.cutoff if r_max is None else check_float("r_max", r_max, minimum=0.0, strict_min=True,
                                                              maximum=min(self.box) / 2)
        return bins, r_max

    def rdf_counts(self, state, bins, r_max):
        """Pairs of ``state`` per shell up to ``r_max`` (every pair twice; float64 on the host): g(r) unnormalised."""
        neighbors = state.neighbors
        if (neighbors is None or r_max > neighbors.cutoff
                or md_kernels.needs_rebuild(neighbors, state.positions, self.backend)):
            neighbors = md_kernels.build_neighbor_list(state.positions, self.box, cutoff=max(r_max, self.cutoff),
                                                       skin=self.skin, backend=self.backend)
        return pairs.pair_distance_counts(self.backend, self.box, state.positions, neighbors, bins, r_max)

    # -- forces and time stepping -------------------------------------------------------------
    def forces(self, positions, neighbors):
        """Forces ``(3, N)``, per-atom energies and virials ``(N,)`` and pair counts (int32 ``(N,)``:
        neighbours inside the cutoff) from a neighbour list."""
        lj = self.__dict__.get("_lj_forces")
        if lj is None or lj.backend.name != self.backend.name:
            lj = self._lj_forces = md_kernels.prepare_lj_forces(self.box, cutoff=self.cutoff, shift=self.shift,
                                                                backend=self.backend)
        return lj(positions, neighbors)

    def step(self, state, dt, steps=1):
        """Advance ``steps`` steps of size ``dt``; returns a new state."""
        return self.stepper(dt).advance(state, steps)

    def stepper(self, dt):
        """An :class:`Integrator` that advances states by ``dt`` (> 0)."""
        return Integrator(self, check_float("dt", dt, minimum=0.0, strict_min=True))

    def suggested_dt(self, state, cfl=0.15):
        """The step whose time-step number (see :meth:`cfl`) is ``cfl``, at most the customary 0.005."""
        return self.suggested_dt_for_rate(self.cfl(state, 1.0), cfl)

    def suggested_dt_for_rate(self, per_dt, cfl=0.15):
        """:meth:`suggested_dt` from the time-step number per unit ``dt`` (what the ranks of a run report)."""
        cfl = check_float("cfl", cfl, minimum=0.0, strict_min=True)
        return min(0.005, cfl / per_dt) if per_dt > 0 else 0.005

    def warm_up(self):
        """Compile this backend's kernels on 108 atoms."""
        tiny = LennardJones(3, cutoff=2.0, thermostat=self.thermostat, dtype=self.dtype, backend=self.backend)
        tiny.step(tiny.initial_state(), 0.005, 2)
        self.backend.synchronize()

    # -- diagnostics, held in self.thermo ------------------------------------------------------
    def diagnostics(self, state, dt=None):
        """Energies, temperature, pressure, momentum, MSD (dict of floats): see :meth:`Thermodynamics.diagnostics
        <hpcgpu.workloads.md.diagnostics.Thermodynamics.diagnostics>`."""
        return self.thermo.diagnostics(state, dt)

    def cfl(self, state, dt):
        return self.thermo.cfl(state, dt)

    def bad_fields(self, state):
        return self.thermo.bad_fields(state)

    def block_health(self, state):
        return self.thermo.block_health(state)

    def combine_health(self, parts, dt):
        return self.thermo.combine_health(parts, dt)

    def block_sums(self, state, start, extra=None):
        return self.thermo.block_sums(state, start, extra)

    def combine_sums(self, parts):
        return self.thermo.combine_sums(parts)

    # -- output -------------------------------------------------------------------------------
    def to_dataset(self, state, time=None):
        """The atoms as an ``xarray.Dataset`` (dimensions ``axis``, ``atom``; see :func:`hpcgpu.workloads.md.output.dataset`)."""
        return output.dataset(self, state, time)

    def attributes(self):
        return {"model": "lennard_jones", "units": "reduced LJ (epsilon = sigma = mass = k_B = 1)",
                "n_cells": str(self.cells), "density": self.density, "box_x": self.box[0], "box_y": self.box[1],
                "box_z": self.box[2], "temperature": self.temperature, "cutoff": self.cutoff, "skin": self.skin,
                "shift": int(self.shift), "thermostat": self.thermostat, "friction": self.friction,
                "dtype": self.dtype.name, "backend": self.backend.name, "seed": self.seed,
                "sort_every": self.sort_every,
                "integrator": "velocity Verlet" if self.thermostat == "none" else "Langevin BAOAB"}

    def with_backend(self, backend):
        other = object.__new__(LennardJones)
        other.__dict__.update(self.__dict__)
        other.backend = get_backend(backend)
        other.sort_every = other._sort_every(self.sort_every_request)
        other._hold_parts()
        return other

    def __getstate__(self):
        # the parts point back at the model: rebuilt on unpickling rather than pickled
        return {k: v for k, v in self.__dict__.items() if k != "thermo"}

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._hold_parts()

    def _repr_html_(self):
        """HTML summary for Jupyter: atoms, box, state point, potential, integrator (all parameters collapsed)."""
        from hpcgpu.io import html_views

        thermostat = "none (NVE, velocity Verlet)" if self.thermostat == "none" else \
            f"Langevin BAOAB (NVT, friction {self.friction:g})"
        return html_views.model_html(self, [
            ("atoms", self.n), ("fcc cells", " x ".join(str(c) for c in self.cells)),
            ("box (sigma)", " x ".join(f"{b:.4g}" for b in self.box)), ("density", self.density),
            ("temperature", self.temperature),
            ("potential", f"LJ cut at {self.cutoff:g}" + (", shifted" if self.shift else ", truncated")),
            ("skin", self.skin), ("thermostat", thermostat), ("backend", self.backend.name),
            ("dtype", self.dtype.name), ("seed", self.seed)])

    def __repr__(self):
        return (f"LennardJones(n={self.n}, density={self.density:.4g}, temperature={self.temperature:g}, "
                f"cutoff={self.cutoff:g}, thermostat={self.thermostat!r}, dtype={self.dtype.name!r}, "
                f"backend={self.backend.name!r})")


class Integrator:
    """Velocity Verlet (NVE) or Langevin BAOAB (NVT): one force evaluation per step.

    A step is :meth:`LennardJones.drift_block` then
    :meth:`LennardJones.kick_block`; the state carries the forces at its
    positions and the neighbour list.
    """

    def __init__(self, model, dt):
        self.model = model
        self.dt = dt

    def advance(self, state, steps=1):
        steps = check_int("steps", steps, minimum=0)
        model = self.model
        for _ in range(steps):
            state = model.kick_block(model.drift_block(state, self.dt), self.dt)
        return state
