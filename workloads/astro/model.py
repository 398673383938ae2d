"""Astrophysics: collisionless stellar dynamics with softened gravity.

N bodies under their mutual softened gravity, advanced by a leapfrog
(second order, symplectic, time-reversible; kick-drift-kick or
drift-kick-drift, one force evaluation per step), with forces by direct
summation on any backend or by a Barnes-Hut tree. Units are N-body units
(G = 1 by default); the Plummer cases use Henon units (M = 1, E = -1/4,
virial radius 1). :mod:`hpcgpu.workloads.astro.kepler` gives the
analytic two-body orbit of the ``kepler`` case, to check an integrator
against.

Examples
--------
>>> from hpcgpu.workloads.astro import NBody, kepler_orbit, kepler_period
>>> model = NBody("kepler", backend="numpy")
>>> state = model.initial_state()
>>> later = model.step(state, dt=1e-3, steps=10)
>>> round(model.diagnostics(later)["energy"] / model.diagnostics(state)["energy"], 8)
1.0
>>> period = kepler_period(model)
>>> orbit = model.step(state, dt=period / 1000, steps=1000)
>>> float(abs(orbit.positions - kepler_orbit(model, period)[0]).max()) < 1e-3
True
"""

import math
import numpy as np

from hpcgpu.backends import get_backend
from hpcgpu.errors import ConfigError
from hpcgpu.kernels.nbody import prepare_gravity
from hpcgpu.validation import check_choice, check_dtype, check_finite_array, check_float, check_int
from hpcgpu.workloads.astro import cases, diagnostics, start
from hpcgpu.workloads.astro.state import NBodyState

__all__ = ["NBody", "NBodyState", "Leapfrog", "CASES", "METHODS", "INTEGRATORS"]

CASES = cases.CASES
METHODS = ("direct", "tree")
INTEGRATORS = ("kdk", "dkd")
"""Leapfrog forms: kick-drift-kick and drift-kick-drift (REBOUND's ``leapfrog``)."""
_SCHEMES = {"kdk": "kick-drift-kick leapfrog", "dkd": "drift-kick-drift leapfrog"}


class NBody:
    """Gravitational N-body model: a named case on a backend.

    Equations (softened Newtonian gravity, softening ``eps``)::

        dx_i/dt = v_i
        dv_i/dt = -G sum_{j != i} m_j (x_i - x_j) / (|x_i - x_j|**2 + eps**2)**(3/2)
        phi_i   = -G sum_{j != i} m_j / (|x_i - x_j|**2 + eps**2)**(1/2)

    advanced by a leapfrog. The accelerations' statement, the reference
    every backend is tested against, is the NumPy direct sum
    :func:`hpcgpu.kernels.nbody._numpy.direct`; the step is in this class:
    :meth:`drift_block`, the forces, then :meth:`_finish_step`
    (:class:`Leapfrog` runs them in order).

    Parameters
    ----------
    case : str
        ``"kepler"`` (two bodies, analytic period), ``"plummer"`` (a Plummer
        sphere in virial equilibrium), ``"galaxy_collision"`` (two Plummer
        galaxies on a parabolic orbit).
    n : int, optional
        Number of bodies (>= 2; the Kepler case has 2).
    softening : float, optional
        Plummer softening length (>= 0); default from the case.
    G : float
        Gravitational constant (> 0).
    method : str
        ``"direct"`` (all pairs) or ``"tree"`` (Barnes-Hut, CPU).
    theta : float
        Opening angle of the tree (> 0).
    integrator : str
        ``"kdk"`` (kick-drift-kick, the default) or ``"dkd"`` (drift-kick-drift,
        REBOUND's ``leapfrog``). Both are second order and symplectic with one
        force evaluation per step, and both end each step with positions and
        velocities at the same time. KDK carries the accelerations at the
        state's positions; DKD evaluates them at mid-step positions, so its
        :meth:`diagnostics` need one more force evaluation for the potential
        energy.
    dtype, backend
        As for every hpcgpu model.
    seed : int
        Random seed of the initial conditions: body i is a pure function of
        ``(seed, i)`` (counter-based streams), so the ranks of a partitioned
        run build their own bodies, bitwise those of one process.
    **parameters
        The case's own parameters (e.g. ``eccentricity``, ``pericentre``).

    Examples
    --------
    >>> NBody("plummer", n=64, backend="numpy").initial_state().size
    64
    >>> NBody("kepler", integrator="dkd", backend="numpy")
    NBody(case='kepler', n=2, method='direct', integrator='dkd', dtype='float64', backend='numpy')
    """

    name = "astro"
    state_type = NBodyState  # the class of its states
    decomposition = "bodies"  # all pairs: hpcgpu.partition.all_pairs
    field_names = ("positions", "velocities")
    cfl_limit = 1.0
    # units of the time axis and of the diagnostics, for the files they are written to (ZarrWriter)
    diagnostic_units = {"time": "time (N-body units)", "max_cfl": "1", "virial_ratio": "1",
                        **{k: "energy (N-body units)" for k in ("energy", "kinetic_energy", "potential_energy")},
                        **{f"momentum_{a}": "mass length/time (N-body units)" for a in "xyz"},
                        **{f"angular_momentum_{a}": "mass length2/time (N-body units)" for a in "xyz"},
                        **{f"centre_of_mass_{a}": "length (N-body units)" for a in "xyz"},
                        **{f"lagrangian_radius_{p}": "length (N-body units)" for p in (10, 50, 90)}}

    def __init__(self, case="plummer", *, n=None, softening=None, G=1.0, method="direct", theta=0.5,
                 integrator="kdk", dtype="float64", backend="auto", seed=0, **parameters):
        spec = CASES.get(case) if isinstance(case, str) else None
        if spec is None:
            check_choice("case", case, tuple(CASES))
        unknown = set(parameters) - set(spec.parameters)
        if unknown:
            raise ConfigError(f"unknown parameter(s) {sorted(unknown)} for case {case!r}; valid: "
                              f"{sorted(spec.parameters)}")
        self.case = case
        self.case_parameters = {**spec.parameters, **parameters}
        for key, value in self.case_parameters.items():
            check_float(key, value)
        if spec.check is not None:
            spec.check(self.case_parameters)
        self.n = check_int("n", spec.n if n is None else n, minimum=2)
        if case == "kepler" and self.n != 2:
            raise ConfigError(f"n must be 2 for the kepler case; got {self.n}")
        self.softening = check_float("softening", spec.softening if softening is None else softening, minimum=0.0)
        self.G = check_float("G", G, minimum=0.0, strict_min=True)
        self.method = check_choice("method", method, METHODS)
        self.theta = check_float("theta", theta, minimum=0.0, strict_min=True)
        self.integrator = check_choice("integrator", integrator, INTEGRATORS)
        self.seed = check_int("seed", seed, minimum=0)
        self.dtype = check_dtype("dtype", dtype)
        self.backend = get_backend(backend)
        # softening**2 must be a normal number of the dtype (the kernels' own check, named for this model)
        self._gravity = self._prepared_gravity()
        self.backend_request = backend if isinstance(backend, str) else self.backend.name
        self._spec = spec

    def memory_estimate(self):
        """``(what, bytes)``: positions, velocities, accelerations, masses, potentials and work copies."""
        return f"n={self.n} ({self.dtype.name})", 24 * self.n * self.dtype.itemsize

    # -- set-up -----------------------------------------------------------------
    @property
    def case_definition(self):
        """The :class:`~hpcgpu.workloads.astro.cases.AstroCase` this model runs (its bodies by id, defaults)."""
        return self._spec

    @property
    def case_dt(self):
        """The case's recommended time step."""
        return self._spec.dt

    @property
    def stop_time(self):
        """The case's recommended run length (model time)."""
        return self._spec.stop_time

    def initial_state(self):
        """The case's bodies on this model's backend, with their forces.

        Body i is a pure function of ``(seed, i)`` (:mod:`~hpcgpu.workloads.astro.cases`);
        each group of bodies is at its centre of mass, at rest, before the
        case moves it (:func:`~hpcgpu.workloads.astro.start.whole_bodies`).
        """
        return self.state_from_arrays(*start.whole_bodies(self))

    def initial_block(self, first, stop):
        """Bodies ``first:stop`` of :meth:`initial_state`, built alone: host arrays, velocities still raw.

        What a rank of a partitioned run builds
        (:meth:`AllPairsDecomposition.build_block
        <hpcgpu.partition.all_pairs.AllPairsDecomposition.build_block>`):
        positions, masses and forces as in :meth:`initial_state`; the
        velocities (float64) become its velocities with the
        :meth:`start_normalisation` of every block's :meth:`start_velocity_sums`.

        Examples
        --------
        >>> import numpy as np
        >>> model = NBody("plummer", n=50, backend="numpy", seed=4)
        >>> block = model.initial_block(10, 30)
        >>> bool((block.positions == model.initial_state().positions[:, 10:30]).all())
        True
        """
        return start.rank_block(self, first, stop)

    def start_velocity_sums(self, block, first):
        """The exact sums of a block's (bodies ``first ..``) raw initial velocities, per group of bodies."""
        return start.velocity_sums(self, block.velocities, first)

    def start_normalisation(self, sums):
        """What makes raw initial velocities the run's (see :func:`~hpcgpu.partition.bodies_start.shifted`)."""
        return start.velocity_normalisation(self, sums)

    def state_from_arrays(self, positions, velocities, masses):
        """A state from positions and velocities ``(3, N)`` and masses ``(N,)``.

        Raises
        ------
        ConfigError
            Wrong shapes, fewer than 2 bodies, NaN/inf, negative masses.
        """
        b = self.backend
        positions = b.asarray(positions, dtype=self.dtype)
        velocities = b.asarray(velocities, dtype=self.dtype)
        masses = b.asarray(masses, dtype=self.dtype)
        if masses.ndim != 1 or masses.shape[0] < 2:
            raise ConfigError(f"masses must have shape (N,) with N >= 2; got {masses.shape}")
        n = masses.shape[0]
        for name, array in (("positions", positions), ("velocities", velocities)):
            if array.shape != (3, n):
                raise ConfigError(f"{name} must have shape (3, {n}) (rows x, y, z); got {array.shape}")
            check_finite_array(name, array)
        check_finite_array("masses", masses)
        if float(masses.min()) < 0:
            raise ConfigError(f"masses must be >= 0; got a minimum of {float(masses.min())}")
        accelerations, potentials = self.forces(positions, masses)
        return NBodyState(positions, velocities, masses, accelerations, potentials)

    # -- forces and time stepping ----------------------------------------------------
    def forces(self, source_positions, source_masses, start=0, stop=None):
        """Accelerations ``(3, M)`` and potentials ``(M,)`` of bodies ``start:stop``.

        The targets are those sources (the potential excludes each body's
        own term); forces come from all sources.
        """
        gravity = self.__dict__.get("_gravity")
        if gravity is None or gravity.backend.name != self.backend.name:
            gravity = self._gravity = self._prepared_gravity()
        accelerations, potentials = gravity(source_positions, source_masses, start, stop)
        return accelerations, potentials

    def _prepared_gravity(self):
        return prepare_gravity(self.dtype, softening=self.softening, G=self.G, method=self.method, theta=self.theta,
                               backend=self.backend)

    def step(self, state, dt, steps=1):
        """Advance ``steps`` leapfrog steps (this model's integrator) of size ``dt``; returns a new state."""
        return self.stepper(dt).advance(state, steps)

    def stepper(self, dt):
        """A :class:`Leapfrog` that advances states by ``dt``."""
        return Leapfrog(self, check_float("dt", dt, minimum=0.0, strict_min=True))

    def suggested_dt(self, state, cfl=0.1):
        """The step whose time-step number (see :meth:`cfl`) is ``cfl``.

        The default 0.1 keeps the closest encounter at about 20 steps per
        orbit; 1 is where the leapfrog goes unstable.
        """
        return self.suggested_dt_for_rate(self.cfl(state, 1.0), cfl)

    def suggested_dt_for_rate(self, per_dt, cfl=0.1):
        """The step whose time-step number is ``cfl``, from the number per unit time (``cfl(state, 1.0)``)."""
        cfl = check_float("cfl", cfl, minimum=0.0, strict_min=True)
        return cfl / per_dt

    def warm_up(self):
        """Compile this backend's force kernel on a handful of bodies."""
        tiny = NBody("plummer", n=16, softening=max(self.softening, 0.01), G=self.G, method=self.method,
                     theta=self.theta, integrator=self.integrator, dtype=self.dtype, backend=self.backend)
        tiny.step(tiny.initial_state(), 1e-3, 1)
        self.backend.synchronize()

    # -- partitions of bodies (hpcgpu.partition.all_pairs) -----------------------------
    def decomposition_size(self):
        return self.n

    def take_block(self, state, start, stop):
        """Bodies ``start:stop`` of a state, as independent arrays."""
        return NBodyState(*(a[..., start:stop].copy() for a in state.arrays()))

    def concat_blocks(self, states):
        """Blocks joined in order, moved to this model's backend."""
        xp = self.backend.xp
        return NBodyState(*(
            xp.concatenate([self.backend.asarray(s.arrays()[k], dtype=self.dtype) for s in states], axis=-1)
            for k in range(5)))

    def to_host(self, state):
        return NBodyState(*(self.backend.to_host(a) for a in state.arrays()))

    # A step is drift_block (before the forces: every body on its own), the
    # forces at the drifted positions, and what follows them. Every engine
    # calls the same two block methods, whatever the integrator.
    def drift_block(self, state, dt):
        """The part of a step before the forces, which needs no other body.

        KDK: the first half kick and the drift; DKD: the first half drift.
        The returned state's positions are where the forces are evaluated.
        """
        if self.integrator == "dkd":
            positions = state.positions + state.velocities * (0.5 * dt)
            return NBodyState(positions, state.velocities, state.masses, state.accelerations, state.potentials)
        velocities = state.velocities + state.accelerations * (0.5 * dt)
        positions = state.positions + velocities * dt
        return NBodyState(positions, velocities, state.masses, state.accelerations, state.potentials)

    def block_positions(self, state):
        """Positions and masses as one ``(4, M)`` array: what other blocks need."""
        xp = self.backend.xp
        return xp.concatenate([state.positions, state.masses[None, :]])

    def kick_block(self, state, blocks, start, dt):
        """The part of a step from the forces on: forces, then the rest of the step.

        ``state`` is a block of bodies ``start:`` as :meth:`drift_block`
        left it and ``blocks`` the :meth:`block_positions` of every block
        (in order) at that point. KDK: forces and the second half kick;
        DKD: forces, the full kick and the second half drift.
        """
        accelerations, potentials = self._forces_from_blocks(blocks, start, start + state.size)
        return self._finish_step(state, accelerations, potentials, dt)

    def _forces_from_blocks(self, blocks, start, stop):
        xp = self.backend.xp
        everything = xp.concatenate([self.backend.asarray(b) for b in blocks], axis=1)
        return self.forces(xp.ascontiguousarray(everything[:3]), xp.ascontiguousarray(everything[3]), start, stop)

    def _finish_step(self, drifted, accelerations, potentials, dt):
        """What follows the forces at the drifted positions; the one copy both engines run."""
        if self.integrator == "dkd":
            velocities = drifted.velocities + accelerations * dt
            # the second half drift stays in this step (not merged with the next
            # step's first): positions and velocities end every step in sync
            positions = drifted.positions + velocities * (0.5 * dt)
            return NBodyState(positions, velocities, drifted.masses, accelerations, potentials)
        velocities = drifted.velocities + accelerations * (0.5 * dt)
        return NBodyState(drifted.positions, velocities, drifted.masses, accelerations, potentials)

    @property
    def sums_need_positions(self):
        """Whether :meth:`block_sums` needs every block's :meth:`block_positions` as ``extra``.

        True with DKD: its states carry the potentials at mid-step
        positions, so the potential energy is summed from a new evaluation
        at the state's positions, which needs all bodies.
        """
        return self.integrator == "dkd"

    # -- diagnostics --------------------------------------------------------------------
    def cfl(self, state, dt):
        """Time-step number ``dt * omega_max / 2``: 1 is the leapfrog's stability limit.

        ``omega_max`` is the highest orbital frequency the step must follow:
        ``sqrt(max|a| / eps)`` for a pair closer than the softening length
        (the softened potential's central frequency), or, without
        softening, ``max |a| / |v|`` (a circular orbit). The leapfrog is
        stable for ``omega dt < 2`` and accurate for ``omega dt`` well below
        1 (the case defaults keep it near 0.1). NaN for non-finite values.
        """
        return self.combine_health([self.block_health(state)], dt)[1]

    def bad_fields(self, state):
        """Names of the fields holding NaN/inf."""
        xp = self.backend.xp
        return [name for name, array in (("positions", state.positions), ("velocities", state.velocities))
                if not bool(xp.isfinite(array).all())]

    def block_health(self, state):
        xp = self.backend.xp
        a = xp.sqrt((state.accelerations.astype(np.float64) ** 2).sum(axis=0))
        v = xp.sqrt((state.velocities.astype(np.float64) ** 2).sum(axis=0))
        moving = a > 0
        ratio = float((v[moving] / a[moving]).min()) if bool(moving.any()) else math.inf
        return {"a_max": float(a.max()), "v_over_a_min": ratio, "bad": self.bad_fields(state)}

    def combine_health(self, parts, dt):
        bad = sorted({name for p in parts for name in p["bad"]}, key=self.field_names.index)
        a_max = max(p["a_max"] for p in parts)
        if bad or not math.isfinite(a_max):
            return bad or ["positions"], math.nan
        if a_max == 0:
            return [], 0.0
        if self.softening > 0:
            omega = math.sqrt(a_max / self.softening)
        else:
            ratio = min(p["v_over_a_min"] for p in parts)
            omega = 1 / ratio if ratio > 0 else math.inf
        return [], 0.5 * dt * omega

    def diagnostics(self, state, dt=None):
        """Energy, momenta, virial ratio and Lagrangian radii (dict of floats).

        ``energy`` = kinetic + potential, ``momentum_x/y/z``,
        ``angular_momentum_x/y/z`` (about the origin), ``virial_ratio``
        ``2K/|W|``, ``lagrangian_radius_10/50/90`` (radii about the origin
        holding 10, 50, 90% of the mass, from 2048 logarithmic bins; every
        case starts with its centre of mass at the origin, at rest), and
        ``centre_of_mass_x/y/z``.

        All at the state's time: with the ``"dkd"`` integrator the state
        carries the potentials at the last step's mid-step positions, so
        the potential energy comes from one more force evaluation at the
        state's positions (by this model's method: N^2 pairs for
        ``"direct"``, about the cost of one step). With ``"kdk"`` the
        carried potentials are already there and nothing is evaluated.
        """
        extra = [self.block_positions(state)] if self.sums_need_positions else None
        out = self.combine_sums([self.block_sums(state, 0, extra)])
        if dt is not None:
            out["max_cfl"] = self.cfl(state, dt)
        return out

    def block_sums(self, state, start, extra=None):
        """Sums over the block of bodies ``start:`` that add up to the global diagnostics.

        ``extra`` is needed when :attr:`sums_need_positions` (DKD): the
        :meth:`block_positions` of every block at the state's time, in
        order, from which the potentials of this block's bodies are
        evaluated (one force evaluation on the block; KDK ignores it).

        Raises
        ------
        ValueError
            ``extra`` is missing where it is needed.
        """
        potentials = state.potentials
        if self.sums_need_positions:
            if extra is None:
                raise ValueError("block_sums of an NBody with integrator='dkd' needs extra: every block's "
                                 "block_positions at the state's time (its potentials are at mid-step positions)")
            _, potentials = self._forces_from_blocks(extra, start, start + state.size)
        return diagnostics.block_sums(self.backend, state.positions, state.velocities, state.masses, potentials)

    def combine_sums(self, parts):
        return diagnostics.combine_sums(parts)

    # -- output -------------------------------------------------------------------------------
    def to_dataset(self, state, time=None):
        """The bodies as an ``xarray.Dataset`` (dimensions ``axis``, ``body``)."""
        import xarray as xr

        host = self.to_host(state)
        coords = {"axis": ("axis", np.arange(3), {"long_name": "0: x, 1: y, 2: z"}),
                  "body": ("body", np.arange(host.size))}
        data = {
            "positions": (("axis", "body"), host.positions, {"units": "length (N-body units)"}),
            "velocities": (("axis", "body"), host.velocities, {"units": "length/time (N-body units)"}),
            "masses": (("body",), host.masses, {"units": "mass (N-body units)"}),
            "potentials": (("body",), host.potentials, {
                "units": "energy/mass (N-body units)",
                "long_name": "gravitational potential at the positions of the last force evaluation"
                             + (" (mid-step positions: dkd)" if self.integrator == "dkd" else "")}),
        }
        ds = xr.Dataset(data, coords=coords, attrs=self.attributes())
        if time is not None:
            ds = ds.expand_dims(time=[float(time)])
            ds["time"].attrs.update(units="time (N-body units)", long_name="model time")
        return ds

    def attributes(self):
        attrs = {"model": "nbody", "case": self.case, "n": self.n, "softening": self.softening, "G": self.G,
                 "method": self.method, "theta": self.theta, "dtype": self.dtype.name,
                 "backend": self.backend.name, "seed": self.seed,
                 "integrator": self.integrator, "integrator_scheme": _SCHEMES[self.integrator]}
        attrs.update(self.case_parameters)
        return attrs

    def with_backend(self, backend):
        other = object.__new__(NBody)
        other.__dict__.update(self.__dict__)
        other.backend = get_backend(backend)
        return other

    def __setstate__(self, state):
        # checkpoints written before the integrator option hold KDK models
        self.__dict__.update({"integrator": "kdk", **state})

    def __repr__(self):
        return (f"NBody(case={self.case!r}, n={self.n}, method={self.method!r}, integrator={self.integrator!r}, "
                f"dtype={self.dtype.name!r}, backend={self.backend.name!r})")

    def _repr_html_(self):
        """HTML summary for Jupyter: case, bodies, force method, softening, backend (all parameters collapsed)."""
        from hpcgpu.io import html_views

        method = self.method if self.method == "direct" else f"{self.method} (theta = {self.theta:g})"
        return html_views.model_html(self, [
            ("case", self.case), ("bodies", self.n), ("forces", method), ("softening", self.softening),
            ("G", self.G), ("backend", self.backend.name), ("dtype", self.dtype.name), ("seed", self.seed),
            ("case dt, stop time", f"{self.case_dt:g}, {self.stop_time:g} (N-body units)"),
            ("integrator", f"{_SCHEMES[self.integrator]} ({self.integrator})")])


class Leapfrog:
    """The model's leapfrog (KDK or DKD): one force evaluation per step.

    A step is :meth:`NBody.drift_block`, the forces at the drifted
    positions, and the rest of :meth:`NBody.kick_block`: KDK is a half
    kick, a drift, the forces and a half kick (the state carries the
    accelerations at its positions); DKD is a half drift, the forces, a
    kick and a half drift.
    """

    def __init__(self, model, dt):
        self.model = model
        self.dt = dt

    def advance(self, state, steps=1):
        steps = check_int("steps", steps, minimum=0)
        model = self.model
        for _ in range(steps):
            drifted = model.drift_block(state, self.dt)
            accelerations, potentials = model.forces(drifted.positions, drifted.masses)
            state = model._finish_step(drifted, accelerations, potentials, self.dt)
        return state
