"""Weather: the rotating shallow-water equations on an f- or beta-plane.

The model advances layer depth ``h`` and velocities ``u``, ``v`` on an
Arakawa C-grid with the energy- and potential-enstrophy-conserving scheme of
Arakawa and Lamb (1981) (mass is conserved exactly, energy and potential
enstrophy to time-truncation error), and a strong-stability-preserving
third-order Runge-Kutta time stepper (SSP-RK3, Shu and Osher 1988). The
stencil kernels do the work; this module holds the model: its physics set-up,
its step and its diagnostics (summed in :mod:`hpcgpu.workloads.weather.diagnostics`);
what the distributed grid needs of its blocks is :mod:`hpcgpu.workloads.weather.grid_blocks`.

Examples
--------
>>> from hpcgpu.workloads.weather import ShallowWater
>>> model = ShallowWater("gravity_wave", nx=16, ny=16, backend="numpy")
>>> state = model.initial_state()
>>> state = model.step(state, dt=model.suggested_dt(state), steps=3)
>>> round(model.diagnostics(state)["mass"] / model.diagnostics(model.initial_state())["mass"], 12)
1.0
"""

import math
from dataclasses import dataclass, fields

import numpy as np

from hpcgpu.backends import get_backend
from hpcgpu.errors import ConfigError
from hpcgpu.kernels import stencil
from hpcgpu.validation import check_choice, check_dtype, check_finite_array, check_float
from hpcgpu.workloads.weather import cases, diagnostics
from hpcgpu.partition.block_region import whole_grid
from hpcgpu.workloads.weather.grid_blocks import GridBlocks
from hpcgpu.workloads.weather.stepper import ShallowWaterStepper
from hpcgpu.workloads.weather.grid import Grid

__all__ = ["ShallowWater", "ShallowWaterState", "ShallowWaterBudgetState", "ShallowWaterParams", "CASES",
           "RK3_CFL_LIMIT"]

CASES = cases.CASES

# SSP-RK3 is stable for purely imaginary eigenvalues up to |lambda dt| = sqrt(3);
# C-grid gravity waves reach |lambda| = 2 c sqrt(1/dx^2 + 1/dy^2), so the
# gravity-wave CFL number c dt sqrt(1/dx^2 + 1/dy^2) must stay below sqrt(3)/2.
RK3_CFL_LIMIT = math.sqrt(3.0) / 2.0

@dataclass(frozen=True)
class ShallowWaterState:
    """The prognostic fields of one (partition of a) shallow-water model.

    Attributes
    ----------
    u : array (ny, nx)
        Eastward velocity on west cell faces (m/s).
    v : array (ny, nx)
        Northward velocity on south cell faces (m/s).
    h : array (ny, nx)
        Layer depth at cell centres (m).
    """

    u: object
    v: object
    h: object

    def arrays(self):
        return (self.u, self.v, self.h)

    def _repr_html_(self):
        """HTML summary for Jupyter: shape, dtype, device and range of ``u``, ``v``, ``h``."""
        from hpcgpu.io import html_views

        ny, nx = self.h.shape
        return html_views.state_html(self, facts=[("grid (nx x ny)", f"{nx} x {ny}")])


@dataclass(frozen=True)
class ShallowWaterBudgetState(ShallowWaterState):
    """A :class:`ShallowWaterState` that also carries the viscous energy budget (``energy_budget=True``).

    Attributes
    ----------
    viscous_energy : float64 array (ny, nx)
        Per cell, the energy the viscous terms have added since the budget
        started (m**3/s**2 per unit area and density; negative: viscosity
        removes energy): the time integral of
        :func:`hpcgpu.kernels.stencil.viscous_energy_tendency`, accumulated
        every step with the SSP-RK3 weights on its three stages.
    """

    viscous_energy: object

    def arrays(self):
        return (self.u, self.v, self.h, self.viscous_energy)


@dataclass(frozen=True)
class ShallowWaterParams:
    """Physical parameters (SI units).

    Attributes
    ----------
    g : float
        Gravitational acceleration (m/s**2).
    f0 : float
        Coriolis parameter at the middle of the domain (1/s).
    beta : float
        Northward gradient of the Coriolis parameter (1/(m s)).
    mean_depth : float
        Depth of the layer at rest (m).
    viscosity : float
        Laplacian viscosity on the velocities (m**2/s).
    """

    g: float = 9.81
    f0: float = 1e-4
    beta: float = 0.0
    mean_depth: float = 1000.0
    viscosity: float = 0.0

    def __post_init__(self):
        check_float("g", self.g, minimum=0.0, strict_min=True)
        check_float("f0", self.f0)
        check_float("beta", self.beta)
        check_float("mean_depth", self.mean_depth, minimum=0.0, strict_min=True)
        check_float("viscosity", self.viscosity, minimum=0.0)


class ShallowWater(GridBlocks):
    """Rotating shallow-water model: a named case on a grid and a backend.

    Equations (vector-invariant form, Arakawa C-grid, Arakawa and Lamb 1981)::

        du/dt =  q (h v) - d/dx (g h + K) + nu lap u
        dv/dt = -q (h u) - d/dy (g h + K) + nu lap v
        dh/dt = -d/dx (h u) - d/dy (h v)

    with potential vorticity ``q = (f + dv/dx - du/dy) / h`` and kinetic
    energy ``K = (u**2 + v**2) / 2``, advanced by SSP-RK3. Their statement,
    the reference every backend is tested against, is the NumPy tendency
    :func:`hpcgpu.kernels.stencil._numpy.shallow_water_tendency` (one RK3
    stage: :func:`hpcgpu.kernels.stencil._numpy.shallow_water_stage`); the
    step is :meth:`step` through :class:`~hpcgpu.workloads.weather.stepper.ShallowWaterStepper`.

    Parameters
    ----------
    case : str
        One of ``CASES``: ``"unstable_jet"`` (a barotropically unstable jet in
        a channel that rolls up into vortices), ``"gravity_wave"`` (a standing
        gravity / Poincare wave with a known frequency), ``"rest"`` (a lake at
        rest).
    nx, ny : int, optional
        Grid cells along x and y (>= 4); defaults come from the case.
    dtype : str
        ``"float32"`` or ``"float64"``.
    backend : str or Backend
        ``"auto"``, ``"numpy"``, ``"numba"``, ``"cuda"`` or ``"cupy"``.
    Lx, Ly : float, optional
        Domain size (m); defaults from the case.
    boundary : str or tuple, optional
        Grid boundary (see :class:`hpcgpu.workloads.weather.grid.Grid`); default from the case.
    energy_budget : bool
        Keep the energy budget (default False): states are
        :class:`ShallowWaterBudgetState`, which accumulate the viscous
        terms' energy change every step, and the diagnostics add
        ``energy_dissipated``. Every step then runs the three stage calls
        (not a backend's fused step: the same numbers) and three evaluations
        of :func:`~hpcgpu.kernels.stencil.viscous_energy_tendency`.
    **params
        Overrides of :class:`ShallowWaterParams` fields and of the case's own
        parameters (e.g. ``jet_speed``, ``amplitude``, ``wavenumber``).

    Examples
    --------
    >>> model = ShallowWater("unstable_jet", nx=32, ny=16, backend="numpy")
    >>> model.grid.boundary
    ('periodic', 'wall')
    """

    name = "weather"
    state_type = ShallowWaterState  # the class of its states
    decomposition = "grid"  # how hpcgpu.partition splits it (hpcgpu.partition.grid)
    field_names = ("u", "v", "h")
    cfl_limit = RK3_CFL_LIMIT
    # units of the time axis and of the diagnostics, for the files they are written to (ZarrWriter)
    diagnostic_units = {"time": "s", "mass": "m3", "energy": "m5 s-2", "enstrophy": "m s-2", "max_cfl": "1"}
    stencil_radius = 2  # rows a tendency evaluation reads on each side
    energy_budget = False  # models pickled before the option existed keep none

    def __init__(self, case="unstable_jet", *, nx=None, ny=None, dtype="float64", backend="auto",
                 Lx=None, Ly=None, boundary=None, energy_budget=False, **params):
        spec = CASES.get(case) if isinstance(case, str) else None
        if spec is None:
            check_choice("case", case, tuple(CASES))
        model_keys = {f.name for f in fields(ShallowWaterParams)}
        unknown = set(params) - model_keys - set(spec.parameters)
        if unknown:
            raise ConfigError(
                f"unknown parameter(s) {sorted(unknown)} for case {case!r}; valid: "
                f"{sorted(model_keys | set(spec.parameters))}")
        self.case = case
        self.case_parameters = {**spec.parameters, **{k: v for k, v in params.items() if k in spec.parameters}}
        cases.check_case_parameters(spec.limits, self.case_parameters)
        self.params = ShallowWaterParams(**{**spec.physics, **{k: v for k, v in params.items() if k in model_keys}})
        self.grid = Grid(nx=spec.nx if nx is None else nx, ny=spec.ny if ny is None else ny,
                         Lx=spec.Lx if Lx is None else Lx, Ly=spec.Ly if Ly is None else Ly,
                         boundary=spec.boundary if boundary is None else boundary)
        self.dtype = check_dtype("dtype", dtype)
        self.backend = get_backend(backend)
        # What was asked for: workers of a cluster resolve "auto" on their own hardware.
        self.backend_request = backend if isinstance(backend, str) else self.backend.name
        if not isinstance(energy_budget, (bool, np.bool_)):
            raise ConfigError(f"energy_budget must be True or False; got {energy_budget!r}")
        self.energy_budget = bool(energy_budget)
        if self.energy_budget:
            self.state_type = ShallowWaterBudgetState
            self.diagnostic_units = {**type(self).diagnostic_units, "energy_dissipated": "m5 s-2"}
        self._spec = spec
        self._f_corner = None

    def memory_estimate(self):
        """``(what, bytes)``: the sizes that set the memory and the bytes a run needs.

        Three fields, the SSP-RK3 stage buffers and the fused kernels' work
        arrays: about twelve grid arrays; an energy budget adds two float64
        ones (the state's and the stepper's) and the rates of three stages.
        """
        budget = 5 * 8 if self.energy_budget else 0
        return (f"nx={self.grid.nx}, ny={self.grid.ny} ({self.dtype.name})",
                (12 * self.dtype.itemsize + budget) * self.grid.nx * self.grid.ny)

    # -- set-up ------------------------------------------------------------
    def coriolis_corners(self):
        """Coriolis parameter on corner rows 0..ny (host, float64), 1/s."""
        y = self.grid.y_corner_rows()
        return self.params.f0 + self.params.beta * (y - 0.5 * self.grid.Ly)

    def _f_device(self):
        if self._f_corner is None:
            self._f_corner = self.backend.asarray(self.coriolis_corners(), dtype=self.dtype)
        return self._f_corner

    def initial_state(self):
        """The case's initial condition as a state on this model's backend."""
        return self.state_from_arrays(*self.case_fields(range(self.grid.ny), range(self.grid.nx)))

    def case_fields(self, rows, cols):
        """The case's initial ``(u, v, h)`` on global ``rows`` and ``cols`` (ranges): host float64 arrays.

        The cells of a block are bitwise those of the whole grid's fields
        (see :mod:`hpcgpu.workloads.weather.cases`).
        """
        u, v, h = self._spec.initial_condition(self.grid, self.params, self.case_parameters, rows, cols)
        if self.grid.wall_x and cols.start == 0:  # no flow through the west wall (its face is column 0)
            u[:, 0] = 0.0
        if self.grid.wall_y and rows.start == 0:
            v[0, :] = 0.0
        return u, v, h

    def state_from_arrays(self, u, v, h, viscous_energy=None, *, shape=None):
        """A state on this backend from host or device arrays of the grid's shape (or of ``shape``: a block's).

        With ``energy_budget``, ``viscous_energy`` (the budget so far, see
        :class:`ShallowWaterBudgetState`) defaults to zeros: the budget starts here.

        Raises
        ------
        ConfigError
            Wrong shape, non-finite values or non-positive depth.
        """
        shape = self.grid.shape if shape is None else tuple(shape)
        out = []
        for name, array in zip(self.field_names, (u, v, h)):
            array = self.backend.asarray(array, dtype=self.dtype)
            if array.shape != shape:
                raise ConfigError(f"{name} must have shape {shape} (ny, nx); got {array.shape}")
            check_finite_array(name, array)
            out.append(array)
        if float(out[2].min()) <= 0:
            raise ConfigError("h (layer depth) must be > 0 everywhere; got a minimum of "
                              f"{float(out[2].min())}")
        if not self.energy_budget:
            return ShallowWaterState(*out)
        if viscous_energy is None:
            return ShallowWaterBudgetState(*out, self.backend.xp.zeros(shape, np.float64))
        viscous_energy = self.backend.asarray(viscous_energy, dtype=np.float64)
        if viscous_energy.shape != shape:
            raise ConfigError(f"viscous_energy must have shape {shape} (ny, nx); got {viscous_energy.shape}")
        return ShallowWaterBudgetState(*out, viscous_energy)

    # -- time stepping -----------------------------------------------------
    def suggested_dt(self, state, cfl=0.5):
        """Largest dt (s) whose CFL number (see :meth:`cfl`) is ``cfl``."""
        cfl = check_float("cfl", cfl, minimum=0.0, strict_min=True)
        return cfl / self.cfl(state, 1.0)

    def step(self, state, dt, steps=1):
        """Advance ``steps`` SSP-RK3 steps of size ``dt``; returns a new state.

        The input state is not modified. For repeated calls without
        allocation use :meth:`stepper`.
        """
        return self.stepper(dt).advance(state, steps)

    def stepper(self, dt, *, boundary=None, f_corner=None, open_cols=(False, False)):
        """A :class:`ShallowWaterStepper` that advances states by ``dt`` reusing buffers.

        ``boundary`` (kernel codes ``(x, south, north)``) and ``f_corner``
        (Coriolis on the state's corner rows) override the grid's, for
        partitions of the domain with open edges; ``open_cols`` says which
        of the west and east sides is a partition's frame.
        """
        dt = check_float("dt", dt, minimum=0.0, strict_min=True)
        return ShallowWaterStepper(self, dt, self.grid.codes if boundary is None else boundary, f_corner,
                                   open_cols)

    def warm_up(self):
        """Compile the kernels of this backend and dtype on a tiny grid."""
        tiny = ShallowWater(self.case, nx=8, ny=8, dtype=self.dtype, backend=self.backend,
                            Lx=self.grid.Lx, Ly=self.grid.Ly, boundary=self.grid.boundary,
                            **{f.name: getattr(self.params, f.name) for f in fields(ShallowWaterParams)},
                            energy_budget=self.energy_budget, **self.case_parameters)
        state = tiny.initial_state()
        tiny.step(state, tiny.suggested_dt(state, 0.1), 1)
        self.backend.synchronize()

    # -- diagnostics -------------------------------------------------------
    def cfl(self, state, dt):
        """CFL number of a step ``dt``: advective plus gravity-wave part.

        ``dt * (max|u|/dx + max|v|/dy + max sqrt(g h) * sqrt(1/dx**2 + 1/dy**2))``;
        the scheme is stable below :data:`RK3_CFL_LIMIT`. NaN when a field
        holds NaN or the depth is negative.
        """
        xp = self.backend.xp
        g = self.grid
        u_max = float(xp.abs(state.u).max())
        v_max = float(xp.abs(state.v).max())
        h_min = float(state.h.min())
        h_max = float(state.h.max())
        if not (h_min > 0) or not math.isfinite(h_max):
            return math.nan
        wave = math.sqrt(self.params.g * h_max) * math.sqrt(1 / g.dx**2 + 1 / g.dy**2)
        return dt * (u_max / g.dx + v_max / g.dy + wave)

    def bad_fields(self, state):
        """Names of the fields holding NaN/inf (or a non-positive depth h)."""
        xp = self.backend.xp
        bad = [name for name, array in zip(self.field_names, state.arrays())
               if not bool(xp.isfinite(array).all())]
        if "h" not in bad and float(state.h.min()) <= 0:
            bad.append("h")
        return bad

    def diagnostics(self, state, dt=None):
        """Global diagnostics as a dict of floats (host).

        ``mass`` (m**3, per unit density), ``energy`` (kinetic plus available
        potential energy, m**5/s**2), ``enstrophy`` (potential enstrophy,
        m/s**2), ``max_cfl`` (if ``dt`` is given). With ``energy_budget``
        also ``energy_dissipated`` (m**5/s**2): the energy the viscous terms
        have removed since the budget started, integrated every step.
        Only mass is conserved with viscosity or walls' friction: the
        energy budget is ``energy(t) - energy(0) = -(energy_dissipated(t) -
        energy_dissipated(0)) + the time scheme's error`` (the spatial
        scheme conserves energy; SSP-RK3's error shrinks as ``dt**3``).
        """
        out = self.combine_sums([self.block_sums(state, whole_grid(self.shape, self.periodic))])
        if dt is not None:
            out["max_cfl"] = self.cfl(state, dt)
        return out

    def block_sums(self, state, where):
        """Partial sums for the diagnostics over the owned cells of a (framed) block.

        ``where`` (a :class:`~hpcgpu.partition.block_region.BlockRegion`)
        says which cells are owned and what lies beyond each side; a side
        that holds a neighbour's cells needs one of them in its frame.
        Corners on a wall count half (trapezoidal rule along y). Partial
        sums of blocks add up exactly to the global ones, so a partitioned
        model reduces diagnostics where its partitions live.
        """
        return diagnostics.block_sums(self, state, where)

    def combine_sums(self, parts):
        """Diagnostics (see :meth:`diagnostics`) from :meth:`block_sums` of all rows."""
        return diagnostics.combine_sums(self, parts)

    def coriolis_rows(self, first, last):
        """Coriolis parameter on global corner rows ``first..last`` (host, float64).

        Rows outside 0..ny wrap on a periodic grid and are clamped otherwise,
        as the kernels' ghost rules do.
        """
        rows = np.arange(first, last + 1)
        rows = rows % self.grid.ny if not self.grid.wall_y else np.clip(rows, 0, self.grid.ny)
        return self.coriolis_corners()[rows]

    def vorticity(self, state):
        """Relative vorticity dv/dx - du/dy on corners (1/s), host array (ny, nx)."""
        xp = self.backend.xp
        bc_x, bc_s, bc_n = self.grid.codes
        U = stencil.pad(state.u, (bc_x, bc_s, bc_n), normal="x", width=1)
        V = stencil.pad(state.v, (bc_x, bc_s, bc_n), normal="y", width=1)
        ny, nx = self.grid.shape
        zeta = ((V[1:ny + 1, 1:nx + 1] - V[1:ny + 1, 0:nx]) / self.grid.dx
                - (U[1:ny + 1, 1:nx + 1] - U[0:ny, 1:nx + 1]) / self.grid.dy)
        return self.backend.to_host(xp.asarray(zeta))

    # -- output --------------------------------------------------------------
    def to_dataset(self, state, time=None):
        """The state as an ``xarray.Dataset`` with staggered coordinates and units."""
        import xarray as xr

        host = dict(zip(self.field_names, (self.backend.to_host(a) for a in state.arrays())))
        host["vorticity"] = self.vorticity(state).astype(self.dtype)
        data = {name: (dims, host[name], attrs) for name, (dims, _, attrs) in self.output_variables().items()}
        ds = xr.Dataset(data, coords=self.output_coords(), attrs=self.attributes())
        if time is not None:
            ds = ds.expand_dims(time=[float(time)])
            ds["time"].attrs.update(units="s", long_name="model time")
        return ds

    # -- output written by the ranks (hpcgpu.io.rank_zarr) ------------------------------------
    def output_coords(self):
        """The coordinates of :meth:`to_dataset` (1-D, small): ``{name: (dim, values, attrs)}``."""
        g = self.grid
        return {
            "x": ("x", g.x_centre(), {"units": "m", "long_name": "x of cell centres"}),
            "y": ("y", g.y_centre(), {"units": "m", "long_name": "y of cell centres"}),
            "x_face": ("x_face", g.x_face(), {"units": "m", "long_name": "x of west faces and corners"}),
            "y_face": ("y_face", g.y_face(), {"units": "m", "long_name": "y of south faces and corners"}),
        }

    def output_variables(self):
        """The variables of :meth:`to_dataset`, in order: ``{name: (dims, dtype, attrs)}``."""
        return {
            "u": (("y", "x_face"), self.dtype, {"units": "m s-1", "long_name": "eastward velocity"}),
            "v": (("y_face", "x"), self.dtype, {"units": "m s-1", "long_name": "northward velocity"}),
            "h": (("y", "x"), self.dtype, {"units": "m", "long_name": "layer depth"}),
            "vorticity": (("y_face", "x_face"), self.dtype, {"units": "s-1", "long_name": "relative vorticity"}),
        }

    def derived_output_block(self, read, rows, cols):
        """The output variables that are no state field, on the global cells ``rows`` x ``cols`` (ranges).

        ``read(field, row_indices, col_indices)`` gives any cells of a state
        field (host arrays); the relative vorticity reads one column west
        and one row south of the block: wrapped on a periodic axis, the
        edge's value at a wall (as :func:`~hpcgpu.kernels.stencil.pad`).
        Bitwise equal to the same cells of :meth:`vorticity`.
        """
        (ny, nx), (periodic_x, periodic_y) = self.shape, self.periodic
        row_index, col_index = np.arange(rows.start, rows.stop), np.arange(cols.start, cols.stop)
        west = [(cols.start - 1) % nx if periodic_x or cols.start else 0]
        south = [(rows.start - 1) % ny if periodic_y or rows.start else 0]
        # the block and the one column (row) beyond it read apart: no block-sized join of the two
        V, V_west = read("v", row_index, col_index), read("v", row_index, west)
        U, U_south = read("u", row_index, col_index), read("u", south, col_index)
        # (V[:, 1:] - V[:, :-1]) / dx - (U[1:] - U[:-1]) / dy with the neighbour's cells in front, the
        # same operations written into two block-sized arrays (a snapshot computes it while the run steps)
        zeta = np.empty(V.shape, dtype=np.result_type(V, V_west))
        np.subtract(V[:, 1:], V[:, :-1], out=zeta[:, 1:])
        np.subtract(V[:, :1], V_west, out=zeta[:, :1])
        zeta /= self.grid.dx
        du_dy = np.empty(U.shape, dtype=np.result_type(U, U_south))
        np.subtract(U[1:, :], U[:-1, :], out=du_dy[1:, :])
        np.subtract(U[:1, :], U_south, out=du_dy[:1, :])
        du_dy /= self.grid.dy
        zeta -= du_dy
        return {"vorticity": zeta.astype(self.dtype, copy=False)}

    def attributes(self):
        """Model description as flat attributes (for files and reports)."""
        attrs = {"model": "shallow_water", "case": self.case, "nx": self.grid.nx, "ny": self.grid.ny,
                 "Lx": self.grid.Lx, "Ly": self.grid.Ly, "boundary": "/".join(self.grid.boundary),
                 "dtype": self.dtype.name, "backend": self.backend.name,
                 "scheme": "Arakawa-Lamb (1981) C-grid, SSP-RK3"}
        attrs.update({f.name: getattr(self.params, f.name) for f in fields(ShallowWaterParams)})
        attrs.update(self.case_parameters)
        return attrs

    def with_backend(self, backend):
        """The same model on another backend (a shallow copy)."""
        other = object.__new__(ShallowWater)
        other.__dict__.update(self.__dict__)
        other.backend = get_backend(backend)
        other._f_corner = None
        return other

    def __getstate__(self):
        state = self.__dict__.copy()
        state["_f_corner"] = None  # device arrays stay on their device
        return state

    def __repr__(self):
        budget = ", energy_budget=True" if self.energy_budget else ""
        return (f"ShallowWater(case={self.case!r}, nx={self.grid.nx}, ny={self.grid.ny}, "
                f"dtype={self.dtype.name!r}, backend={self.backend.name!r}{budget})")

    def _repr_html_(self):
        """HTML summary for Jupyter: case, grid, domain, physics, backend (all parameters collapsed)."""
        from hpcgpu.io import html_views

        g, p = self.grid, self.params
        return html_views.model_html(self, [
            ("case", self.case), ("grid (nx x ny)", f"{g.nx} x {g.ny} cells"),
            ("domain", f"{g.Lx / 1e3:g} km x {g.Ly / 1e3:g} km"),
            ("spacing dx, dy", f"{g.dx / 1e3:.4g} km, {g.dy / 1e3:.4g} km"),
            ("boundary (x, y)", ", ".join(g.boundary)), ("backend", self.backend.name), ("dtype", self.dtype.name),
            ("f0, beta", f"{p.f0:g} 1/s, {p.beta:g} 1/(m s)"), ("mean depth", f"{p.mean_depth:g} m"),
            ("viscosity", f"{p.viscosity:g} m2/s"), ("scheme", "Arakawa-Lamb (1981) C-grid, SSP-RK3")])
