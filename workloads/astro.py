"""Astrophysics: collisionless stellar dynamics with softened gravity.

N bodies under their mutual softened gravity, advanced by the kick-drift-kick
leapfrog (second order, symplectic, time-reversible), with forces by direct
summation on any backend or by a Barnes-Hut tree. Units are N-body units
(G = 1 by default); the Plummer cases use Henon units (M = 1, E = -1/4,
virial radius 1).

Examples
--------
>>> from hpcgpu.workloads.astro import NBody
>>> model = NBody("kepler", backend="numpy")
>>> state = model.initial_state()
>>> later = model.step(state, dt=1e-3, steps=10)
>>> round(model.diagnostics(later)["energy"] / model.diagnostics(state)["energy"], 8)
1.0
"""

import math
from dataclasses import dataclass

import numpy as np

from hpcgpu.backends import get_backend
from hpcgpu.errors import ConfigError
from hpcgpu.kernels.nbody import _softening_squared
from hpcgpu.validation import check_choice, check_dtype, check_finite_array, check_float, check_int
from hpcgpu.workloads import _astro_cases as cases

__all__ = ["NBody", "NBodyState", "CASES"]

CASES = cases.CASES
METHODS = ("direct", "tree")
# Lagrangian radii come from mass-weighted histograms of radius about the
# origin, so that partitions can reduce them as sums.
_RADIUS_BINS = np.geomspace(1e-4, 1e4, 2049)
LAGRANGIAN_FRACTIONS = (0.1, 0.5, 0.9)


@dataclass(frozen=True)
class NBodyState:
    """Bodies of one (partition of an) N-body model.

    Attributes
    ----------
    positions, velocities, accelerations : arrays (3, N)
        Rows x, y, z (length, length/time, length/time**2).
    masses : array (N,)
    potentials : array (N,)
        Gravitational potential at each body from all others.
    """

    positions: object
    velocities: object
    masses: object
    accelerations: object
    potentials: object

    def arrays(self):
        return (self.positions, self.velocities, self.masses, self.accelerations, self.potentials)

    @property
    def size(self):
        return self.masses.shape[0]

    def _repr_html_(self):
        """HTML summary for Jupyter: the number of bodies and each array's shape, dtype, device and range."""
        from hpcgpu import display

        return display.state_html(self, facts=[("bodies", self.size)])


class NBody:
    """Gravitational N-body model: a named case on a backend.

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
    dtype, backend
        As for every hpcgpu model.
    seed : int
        Random seed of the initial conditions.
    **parameters
        The case's own parameters (e.g. ``eccentricity``, ``pericentre``).

    Examples
    --------
    >>> NBody("plummer", n=64, backend="numpy").initial_state().size
    64
    """

    name = "astro"
    decomposition = "bodies"  # how hpcgpu.distributed partitions it
    field_names = ("positions", "velocities")
    cfl_limit = 1.0

    def __init__(self, case="plummer", *, n=None, softening=None, G=1.0, method="direct", theta=0.5,
                 dtype="float64", backend="auto", seed=0, **parameters):
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
        self.n = check_int("n", spec.n if n is None else n, minimum=2)
        if case == "kepler" and self.n != 2:
            raise ConfigError(f"n must be 2 for the kepler case; got {self.n}")
        self.softening = check_float("softening", spec.softening if softening is None else softening, minimum=0.0)
        self.G = check_float("G", G, minimum=0.0, strict_min=True)
        self.method = check_choice("method", method, METHODS)
        self.theta = check_float("theta", theta, minimum=0.0, strict_min=True)
        self.seed = check_int("seed", seed, minimum=0)
        self.dtype = check_dtype("dtype", dtype)
        # softening**2 must be a normal number of the dtype (the kernels' own check, named for this model)
        self._eps2 = _softening_squared(self.softening, self.dtype)
        self.backend = get_backend(backend)
        self.backend_request = backend if isinstance(backend, str) else self.backend.name
        self._spec = spec

    def memory_estimate(self):
        """``(what, bytes)``: positions, velocities, accelerations, masses, potentials and work copies."""
        return f"n={self.n} ({self.dtype.name})", 24 * self.n * self.dtype.itemsize

    # -- set-up -----------------------------------------------------------------
    @property
    def case_dt(self):
        """The case's recommended time step."""
        return self._spec.dt

    @property
    def stop_time(self):
        """The case's recommended run length (model time)."""
        return self._spec.stop_time

    def initial_state(self):
        """The case's bodies on this model's backend, with their forces."""
        rng = np.random.default_rng(self.seed)
        positions, velocities, masses = self._spec.generate(self.n, rng, self.case_parameters, self.G)
        return self.state_from_arrays(positions, velocities, masses)

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
        xp = self.backend.xp
        stop = source_masses.shape[0] if stop is None else stop
        targets = source_positions[:, start:stop]
        accelerations = xp.empty((3, stop - start), dtype=self.dtype)
        potentials = xp.empty(stop - start, dtype=self.dtype)
        eps2 = self._eps2
        if self.method == "direct":
            self.backend.kernels("nbody").direct(xp.ascontiguousarray(targets), source_positions, source_masses,
                                                 eps2, self.G, start, accelerations, potentials)
        else:
            import importlib

            _tree = importlib.import_module("hpcgpu.kernels.nbody._tree")
            host = self.backend.to_host
            acc, pot = np.empty((3, stop - start), self.dtype), np.empty(stop - start, self.dtype)
            _tree.tree(np.ascontiguousarray(host(targets)), np.ascontiguousarray(host(source_positions)),
                       host(source_masses), eps2, self.G, start, self.theta, acc, pot)
            accelerations, potentials = self.backend.asarray(acc), self.backend.asarray(pot)
        return accelerations, potentials

    def step(self, state, dt, steps=1):
        """Advance ``steps`` kick-drift-kick steps of size ``dt``; returns a new state."""
        return self.stepper(dt).advance(state, steps)

    def stepper(self, dt):
        """A :class:`Leapfrog` that advances states by ``dt``."""
        return Leapfrog(self, check_float("dt", dt, minimum=0.0, strict_min=True))

    def suggested_dt(self, state, cfl=0.1):
        """The step whose time-step number (see :meth:`cfl`) is ``cfl``.

        The default 0.1 keeps the closest encounter at about 20 steps per
        orbit; 1 is where the leapfrog goes unstable.
        """
        cfl = check_float("cfl", cfl, minimum=0.0, strict_min=True)
        return cfl / self.cfl(state, 1.0)

    def warm_up(self):
        """Compile this backend's force kernel on a handful of bodies."""
        tiny = NBody("plummer", n=16, softening=max(self.softening, 0.01), G=self.G, method=self.method,
                     theta=self.theta, dtype=self.dtype, backend=self.backend)
        tiny.step(tiny.initial_state(), 1e-3, 1)
        self.backend.synchronize()

    # -- partitions of bodies (used by hpcgpu.distributed) -----------------------------
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

    def drift_block(self, state, dt):
        """First half-kick and the drift: the part of a step that needs no other body."""
        velocities = state.velocities + state.accelerations * (0.5 * dt)
        positions = state.positions + velocities * dt
        return NBodyState(positions, velocities, state.masses, state.accelerations, state.potentials)

    def block_positions(self, state):
        """Positions and masses as one ``(4, M)`` array: what other blocks need."""
        xp = self.backend.xp
        return xp.concatenate([state.positions, state.masses[None, :]])

    def kick_block(self, state, blocks, start, dt):
        """Forces from all bodies (``blocks`` of ``block_positions``) and the second half-kick."""
        xp = self.backend.xp
        everything = xp.concatenate([self.backend.asarray(b) for b in blocks], axis=1)
        accelerations, potentials = self.forces(xp.ascontiguousarray(everything[:3]),
                                                xp.ascontiguousarray(everything[3]), start, start + state.size)
        velocities = state.velocities + accelerations * (0.5 * dt)
        return NBodyState(state.positions, velocities, state.masses, accelerations, potentials)

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
        2K/|W|, ``lagrangian_radius_10/50/90`` (radii about the origin
        holding 10, 50, 90% of the mass, from 2048 logarithmic bins; every
        case starts with its centre of mass at the origin, at rest), and
        ``centre_of_mass_x/y/z``.
        """
        out = self.combine_sums([self.block_sums(state, 0)])
        if dt is not None:
            out["max_cfl"] = self.cfl(state, dt)
        return out

    def block_sums(self, state, start, extra=None):
        """Sums over a block of bodies that add up to the global diagnostics."""
        xp = self.backend.xp
        x, v, m, phi = (xp.asarray(a).astype(np.float64) for a in
                        (state.positions, state.velocities, state.masses, state.potentials))
        momentum = (v * m).sum(axis=1)
        angular = (xp.cross(x.T, v.T) * m[:, None]).sum(axis=0)
        first_moment = (x * m).sum(axis=1)
        second_moment = float((m * (x * x).sum(axis=0)).sum())
        radius = xp.sqrt((x * x).sum(axis=0))
        histogram, _ = np.histogram(self.backend.to_host(radius), bins=_RADIUS_BINS,
                                    weights=self.backend.to_host(m))
        out = {"mass": float(m.sum()), "kinetic": 0.5 * float((m * (v * v).sum(axis=0)).sum()),
               "potential2": float((m * phi).sum()), "second_moment": second_moment,
               "histogram": histogram}
        for k, axis in enumerate("xyz"):
            out[f"momentum_{axis}"] = float(momentum[k])
            out[f"angular_momentum_{axis}"] = float(angular[k])
            out[f"first_moment_{axis}"] = float(first_moment[k])
        return out

    def combine_sums(self, parts):
        total = {key: sum(p[key] for p in parts) for key in parts[0]}
        kinetic, potential = total["kinetic"], 0.5 * total["potential2"]
        out = {"energy": kinetic + potential, "kinetic_energy": kinetic, "potential_energy": potential,
               "virial_ratio": 2 * kinetic / abs(potential) if potential else math.nan}
        for axis in "xyz":
            out[f"momentum_{axis}"] = total[f"momentum_{axis}"]
            out[f"angular_momentum_{axis}"] = total[f"angular_momentum_{axis}"]
            out[f"centre_of_mass_{axis}"] = total[f"first_moment_{axis}"] / total["mass"]
        cumulative = np.cumsum(total["histogram"]) / max(total["histogram"].sum(), 1e-300)
        for fraction in LAGRANGIAN_FRACTIONS:
            index = int(np.searchsorted(cumulative, fraction))
            low = cumulative[index - 1] if index > 0 else 0.0
            weight = (fraction - low) / max(cumulative[index] - low, 1e-300)
            # geometric interpolation inside the logarithmic bin
            radius = _RADIUS_BINS[index] * (_RADIUS_BINS[index + 1] / _RADIUS_BINS[index]) ** weight
            out[f"lagrangian_radius_{round(fraction * 100)}"] = float(radius)
        return out

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
            "potentials": (("body",), host.potentials, {"units": "energy/mass (N-body units)"}),
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
                 "integrator": "kick-drift-kick leapfrog"}
        attrs.update(self.case_parameters)
        return attrs

    def with_backend(self, backend):
        other = object.__new__(NBody)
        other.__dict__.update(self.__dict__)
        other.backend = get_backend(backend)
        return other

    def __repr__(self):
        return (f"NBody(case={self.case!r}, n={self.n}, method={self.method!r}, dtype={self.dtype.name!r}, "
                f"backend={self.backend.name!r})")

    def _repr_html_(self):
        """HTML summary for Jupyter: case, bodies, force method, softening, backend (all parameters collapsed)."""
        from hpcgpu import display

        method = self.method if self.method == "direct" else f"{self.method} (theta = {self.theta:g})"
        return display.model_html(self, [
            ("case", self.case), ("bodies", self.n), ("forces", method), ("softening", self.softening),
            ("G", self.G), ("backend", self.backend.name), ("dtype", self.dtype.name), ("seed", self.seed),
            ("case dt, stop time", f"{self.case_dt:g}, {self.stop_time:g} (N-body units)"),
            ("integrator", "kick-drift-kick leapfrog")])


class Leapfrog:
    """Kick-drift-kick leapfrog: one force evaluation per step.

    The state carries the accelerations at its positions, so a step is a
    half kick, a drift, the forces at the new positions and a half kick.
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
            velocities = drifted.velocities + accelerations * (0.5 * self.dt)
            state = NBodyState(drifted.positions, velocities, drifted.masses, accelerations, potentials)
        return state
