"""Barotropic vorticity: the model of the first numerical weather forecast.

Relative vorticity ``zeta`` is advected by the non-divergent flow of the
streamfunction ``psi`` on a beta plane (Charney, Fjortoft and von Neumann
1950)::

    d zeta/dt + J(psi, zeta) + beta d psi/dx = nu lap zeta,    lap psi = zeta,

with ``u = -d psi/dy``, ``v = d psi/dx``. Space: the Arakawa (1966) Jacobian,
which conserves the energy, the enstrophy and (doubly periodic) the circulation in
space, centred differences for the beta term and the five-point Laplacian.
Time: SSP-RK3 (Shu and Osher 1988), with a Poisson solve for ``psi`` after
every stage, by FFT (``solver="fft"``: line transforms along x and y,
:mod:`hpcgpu.workloads.vorticity.blocks`) or by Jacobi-preconditioned
conjugate gradient (``solver="cg"``, :func:`hpcgpu.kernels.matrix.conjugate_gradient`
on the matrix-free :class:`~hpcgpu.kernels.matrix.PoissonOperator`); both
invert the same discrete Laplacian and agree to the CG tolerance.

Partitioned (``Simulation(model, client=..., partitions=P)``), the model
runs on blocks of whole rows with a slab-FFT solve per stage
(:mod:`hpcgpu.partition.spectral`), bitwise the one-process run, fields and
diagnostics; the CG solver runs in one process only.

Domains are doubly periodic (``psi`` has zero mean: the gauge of the
singular problem) or a zonal channel, ``("periodic", "wall")``, with
``psi = zeta = 0`` on the walls (row 0 is the south wall; the north wall
lies one spacing beyond the last row): the walls are free-slip, the
channel being the odd reflection of a doubly periodic domain twice as
tall, so energy and enstrophy stay invariants. Fields live on the grid's points
``x = i dx``, ``y = j dy``. The array work is plain array-module code, so it
runs on NumPy (``numpy``, ``numba``) and CuPy (``cupy``, ``cuda``); the
periodic CG uses the stencil family's compiled Laplacian.

Examples
--------
>>> from hpcgpu.workloads.vorticity import BarotropicVorticity
>>> model = BarotropicVorticity("rossby_wave", nx=16, ny=16, backend="numpy")
>>> state = model.initial_state()
>>> later = model.step(state, dt=model.suggested_dt(state, cfl=0.2), steps=3)
>>> before, after = model.diagnostics(state), model.diagnostics(later)
>>> round(after["enstrophy"] / before["enstrophy"], 6)  # RK3's damping only
1.0
"""

from dataclasses import dataclass, fields

from hpcgpu.backends import get_backend
from hpcgpu.errors import ConfigError
from hpcgpu.kernels.matrix import PoissonOperator, conjugate_gradient
from hpcgpu.partition.block_region import whole_grid
from hpcgpu.validation import check_choice, check_dtype, check_finite_array, check_float, check_int
from hpcgpu.workloads.vorticity import blocks, cases
from hpcgpu.workloads.weather.cases import check_case_parameters
from hpcgpu.workloads.weather.grid import Grid

__all__ = ["BarotropicVorticity", "VorticityState", "VorticityParams", "CASES", "SOLVERS",
           "RK3_CFL_LIMIT", "rossby_wave_frequency"]

CASES = cases.CASES
SOLVERS = ("fft", "cg")
BOUNDARIES = (("periodic", "periodic"), ("periodic", "wall"))

RK3_CFL_LIMIT = blocks.RK3_CFL_LIMIT


@dataclass(frozen=True)
class VorticityState:
    """The fields of a barotropic vorticity model.

    Attributes
    ----------
    zeta : array (ny, nx)
        Relative vorticity (1/s), prognostic.
    psi : array (ny, nx)
        Streamfunction (m**2/s), ``lap_h psi = zeta`` (to the solver's tolerance).
    """

    zeta: object
    psi: object

    def arrays(self):
        return (self.zeta, self.psi)

    def _repr_html_(self):
        """HTML summary for Jupyter: shape, dtype, device and range of ``zeta`` and ``psi``."""
        from hpcgpu.io import html_views

        ny, nx = self.zeta.shape
        return html_views.state_html(self, facts=[("grid (nx x ny)", f"{nx} x {ny}")])


@dataclass(frozen=True)
class VorticityParams:
    """Physical parameters (SI units).

    Attributes
    ----------
    beta : float
        Northward gradient of the Coriolis parameter (1/(m s)).
    viscosity : float
        Laplacian viscosity on the vorticity (m**2/s), >= 0.
    """

    beta: float = 1.6e-11
    viscosity: float = 0.0

    def __post_init__(self):
        check_float("beta", self.beta)
        check_float("viscosity", self.viscosity, minimum=0.0)


def rossby_wave_frequency(model, discrete=False):
    """Angular frequency (rad/s) of ``model``'s ``rossby_wave`` case.

    ``discrete=False``: the continuous equation's ``-beta k / (k**2 + l**2)``;
    ``discrete=True``: the semi-discrete scheme's (see
    :func:`hpcgpu.workloads.vorticity.cases.rossby_wave_frequency`).

    Examples
    --------
    >>> model = BarotropicVorticity("rossby_wave", backend="numpy")
    >>> k = 2 * 3.141592653589793 * model.case_parameters["wavenumber_x"] / model.grid.Lx
    >>> round(rossby_wave_frequency(model) / k, 3)  # zonal phase speed, m/s (westward)
    -2.918
    """
    if model.case != "rossby_wave":
        raise ConfigError(f"rossby_wave_frequency needs the 'rossby_wave' case; got {model.case!r}")
    return cases.rossby_wave_frequency(model.params, model.case_parameters, model.grid, discrete)


class BarotropicVorticity:
    """Barotropic vorticity model: a named case on a grid, a backend and a Poisson solver.

    Equations (beta plane, Charney, Fjortoft and von Neumann 1950)::

        d zeta/dt = -J(psi, zeta) - beta d psi/dx + nu lap zeta,    lap psi = zeta

    with ``u = -d psi/dy``, ``v = d psi/dx``, advanced by SSP-RK3 with a
    Poisson solve after every stage. Their statement is in this class:
    :meth:`tendency` (Arakawa's Jacobian, whose NumPy reference is
    :func:`hpcgpu.kernels.stencil.arakawa_jacobian` on ``backend="numpy"``),
    :meth:`streamfunction` (the Poisson solve) and
    :class:`VorticityStepper` (the RK3 stages), on blocks of rows in
    :mod:`hpcgpu.workloads.vorticity.blocks`. Partitioned as ``"spectral"``
    (:class:`~hpcgpu.partition.protocols.SpectralModel`).

    Parameters
    ----------
    case : str
        One of ``CASES``: ``"rossby_wave"`` (a single Rossby wave with a known
        phase speed), ``"turbulence"`` (decaying beta-plane turbulence).
    nx, ny : int, optional
        Grid points along x and y (>= 4); defaults come from the case.
    dtype : str
        ``"float32"`` or ``"float64"``.
    backend : str or Backend
        ``"auto"``, ``"numpy"``, ``"numba"``, ``"cuda"`` or ``"cupy"``.
    Lx, Ly : float, optional
        Domain size (m); defaults from the case.
    boundary : str or tuple, optional
        ``"periodic"`` or ``("periodic", "wall")`` (a zonal channel).
    solver : {"fft", "cg"}
        Poisson solver for ``psi``.
    solver_tol : float
        Relative residual tolerance of the CG solver, in (0, 1).
    **params
        Overrides of :class:`VorticityParams` fields and of the case's own
        parameters (e.g. ``velocity``, ``wavenumber_x``, ``seed``).

    Examples
    --------
    >>> model = BarotropicVorticity("turbulence", nx=32, ny=32, solver="cg", backend="numpy")
    >>> model.grid.boundary, model.solver
    (('periodic', 'periodic'), 'cg')
    """

    name = "vorticity"
    state_type = VorticityState  # the class of its states
    decomposition = "spectral"  # row blocks with a slab-FFT Poisson solve per stage (hpcgpu.partition.spectral)
    field_names = ("zeta", "psi")
    spectral_fields = ("zeta", "psi")  # the field a stage updates, the field solved from it
    stages = len(blocks.SSP_RK3_STAGES)
    cfl_limit = RK3_CFL_LIMIT
    # units of the time axis and of the diagnostics, for the files they are written to (ZarrWriter)
    diagnostic_units = {"time": "s", "energy": "m4 s-2", "enstrophy": "m2 s-2", "circulation": "m2 s-1",
                        "max_cfl": "1"}

    def __init__(self, case="rossby_wave", *, nx=None, ny=None, dtype="float64", backend="auto",
                 Lx=None, Ly=None, boundary=None, solver="fft", solver_tol=1e-10, **params):
        spec = CASES.get(case) if isinstance(case, str) else None
        if spec is None:
            check_choice("case", case, tuple(CASES))
        model_keys = {f.name for f in fields(VorticityParams)}
        unknown = set(params) - model_keys - set(spec.parameters)
        if unknown:
            raise ConfigError(f"unknown parameter(s) {sorted(unknown)} for case {case!r}; valid: "
                              f"{sorted(model_keys | set(spec.parameters))}")
        self.case = case
        self.case_parameters = {**spec.parameters, **{k: v for k, v in params.items() if k in spec.parameters}}
        check_case_parameters(spec.limits, self.case_parameters)
        if spec.name == "rossby_wave" and not (self.case_parameters["wavenumber_x"] or
                                               self.case_parameters["wavenumber_y"]):
            raise ConfigError("wavenumber_x and wavenumber_y must not both be 0 (that is no wave)")
        self.params = VorticityParams(**{**spec.physics, **{k: v for k, v in params.items() if k in model_keys}})
        self.grid = Grid(nx=spec.nx if nx is None else nx, ny=spec.ny if ny is None else ny,
                         Lx=spec.Lx if Lx is None else Lx, Ly=spec.Ly if Ly is None else Ly,
                         boundary=spec.boundary if boundary is None else boundary)
        if self.grid.boundary not in BOUNDARIES:
            raise ConfigError(f"boundary must be 'periodic' or ('periodic', 'wall') (a zonal channel); "
                              f"got {boundary!r}")
        self.solver = check_choice("solver", solver, SOLVERS)
        self.solver_tol = check_float("solver_tol", solver_tol, minimum=0.0, strict_min=True, maximum=0.5)
        self.dtype = check_dtype("dtype", dtype)
        self.backend = get_backend(backend)
        self.backend_request = backend if isinstance(backend, str) else self.backend.name
        self._spec = spec
        self._operator = None
        self._inverse = None

    # -- set-up ------------------------------------------------------------------
    @property
    def poisson(self):
        """The :class:`~hpcgpu.kernels.matrix.PoissonOperator` (``-lap_h``) of this grid."""
        if self._operator is None:
            g = self.grid
            self._operator = PoissonOperator(g.shape, dx=g.dx, dy=g.dy, boundary=g.boundary,
                                             dtype=self.dtype, backend=self.backend)
        return self._operator

    @property
    def shape(self):
        """The grid's ``(ny, nx)`` points."""
        return self.grid.shape

    @property
    def periodic(self):
        """``(x, y)``: whether each axis wraps (y does not in a channel)."""
        return (True, not self.grid.wall_y)

    def initial_state(self):
        """The case's initial condition: ``zeta = lap_h psi`` of the case's streamfunction."""
        psi = self.backend.asarray(self._spec.streamfunction(self.grid, self.params, self.case_parameters),
                                   dtype=self.dtype)
        psi = self.poisson.project(psi)
        return VorticityState(self.poisson.laplacian(psi), psi)

    def state_from_arrays(self, zeta):
        """A state from a vorticity field (host or device, shape ``(ny, nx)``), solving for ``psi``.

        The mean of ``zeta`` is removed on a doubly periodic domain (its
        circulation is zero) and wall rows are set to zero in a channel.

        Raises
        ------
        ConfigError
            Wrong shape or non-finite values.
        """
        zeta = self.backend.asarray(zeta, dtype=self.dtype)
        if zeta.shape != self.grid.shape:
            raise ConfigError(f"zeta must have shape {self.grid.shape} (ny, nx); got {zeta.shape}")
        check_finite_array("zeta", zeta)
        zeta = self.poisson.project(zeta)
        return VorticityState(zeta, self.streamfunction(zeta))

    def streamfunction(self, zeta, guess=None):
        """``psi`` with ``lap_h psi = zeta`` by this model's solver (``guess`` starts CG).

        Raises
        ------
        ConvergenceError
            CG did not reach ``solver_tol`` (see :func:`~hpcgpu.kernels.matrix.conjugate_gradient`).
        """
        if self.solver == "fft":
            where = whole_grid(self.shape, self.periodic)
            columns = self.forward_lines(self._field("zeta", zeta), where)
            return self.inverse_lines(self.solve_columns(columns, 0, columns.shape[1]), where)
        return conjugate_gradient(self.poisson, -zeta, x0=guess, tol=self.solver_tol).x

    # -- on blocks of rows: what one process and each rank of a partitioned run compute -------------------
    def reach(self, steps):
        """``(x, y)``: a stage reads one row beyond a block (rows are whole: none beyond in x)."""
        return (0, steps)

    def check_partitions(self, partitions):
        """ConfigError unless this model can run on ``partitions`` ranks: the CG solver runs in one process."""
        if self.solver != "fft":
            raise ConfigError(f"solver={self.solver!r} runs in one process only; a partitioned run (partitions="
                              f"{partitions}) solves by FFT: use solver='fft'")

    def stage_block(self, state, start, stage, dt, where):
        """Vorticity on the owned rows after SSP-RK3 stage ``stage`` (:func:`~.blocks.stage_block`)."""
        return blocks.stage_block(self, state, start, stage, dt, where)

    def forward_lines(self, rows, where):
        """``rfft`` along x of owned rows of ``zeta`` (:func:`~.blocks.forward_lines`)."""
        return blocks.forward_lines(self, rows, where)

    def solve_columns(self, columns, first, stop):
        """Columns ``first:stop`` of the x transform solved along y (:func:`~.blocks.solve_columns`)."""
        if self._inverse is None:
            self._inverse = self.backend.asarray(blocks.inverse_symbol(self))
        return blocks.solve_columns(self, columns, first, stop, self._inverse)

    def inverse_lines(self, spectra, where):
        """``psi`` on the owned rows from their x transform (:func:`~.blocks.inverse_lines`)."""
        return blocks.inverse_lines(self, spectra, where)

    def block_sums(self, state, where):
        """Exact partial sums of the diagnostics over a block's owned rows (:func:`~.blocks.block_sums`)."""
        return blocks.block_sums(self, state, where)

    def combine_sums(self, parts):
        """Energy, enstrophy and circulation from every block's partial sums (:func:`~.blocks.combine_sums`)."""
        return blocks.combine_sums(self, parts)

    def block_health(self, state, where=None):
        """A block's non-finite fields and largest velocities (``where=None``: the whole grid)."""
        return blocks.block_health(self, state, whole_grid(self.shape, self.periodic) if where is None else where)

    def combine_health(self, parts, dt):
        """``(bad_fields, cfl)`` from every block's :meth:`block_health`."""
        return blocks.combine_health(self, parts, dt)

    def _field(self, name, array):
        """``array`` on this backend, or a ConfigError unless it is a grid field of the model's dtype."""
        if not hasattr(array, "dtype") or array.dtype != self.dtype or array.shape != self.shape:
            raise ConfigError(f"{name} must be an array of shape {self.shape} and dtype {self.dtype} (the model's); "
                              f"got {getattr(array, 'shape', None)}, {getattr(array, 'dtype', type(array).__name__)}")
        return self.backend.asarray(array)

    # -- time stepping ---------------------------------------------------------------
    def tendency(self, zeta, psi):
        """``d zeta/dt = -J(psi, zeta) - beta d psi/dx + nu lap zeta`` (1/s**2), Arakawa's Jacobian.

        ``J = (J++ + J+x + Jx+) / 3`` (Arakawa 1966, eq. 46 with rectangular
        cells; :func:`hpcgpu.kernels.stencil.arakawa_jacobian`, zero beyond
        the walls of a channel); the tendency is zero on the south wall.
        """
        return blocks.tendency_block(self, VorticityState(zeta, psi), whole_grid(self.shape, self.periodic))

    def _pad(self, field):
        """One ghost point each side: wrapped, or zero beyond a wall."""
        xp = self.backend.xp
        padded = xp.pad(field, ((0, 0), (1, 1)), mode="wrap")
        return xp.pad(padded, ((1, 1), (0, 0)), mode="constant" if self.grid.wall_y else "wrap")

    def suggested_dt(self, state, cfl=0.5):
        """Largest dt (s) whose CFL number (see :meth:`cfl`) is ``cfl``."""
        cfl = check_float("cfl", cfl, minimum=0.0, strict_min=True)
        rate = self.cfl(state, 1.0)
        if not rate > 0:
            raise ConfigError("the state is at rest with beta = viscosity = 0: pass dt explicitly")
        return cfl / rate

    def step(self, state, dt, steps=1):
        """Advance ``steps`` SSP-RK3 steps of size ``dt`` (s); returns a new state."""
        return self.stepper(dt).advance(state, steps)

    def stepper(self, dt):
        """A :class:`VorticityStepper` advancing states by ``dt`` (s)."""
        return VorticityStepper(self, check_float("dt", dt, minimum=0.0, strict_min=True))

    def warm_up(self):
        """Compile the kernels this backend uses, on a tiny grid."""
        tiny = BarotropicVorticity(self.case, nx=8, ny=8, dtype=self.dtype, backend=self.backend,
                                   Lx=self.grid.Lx, Ly=self.grid.Ly, boundary=self.grid.boundary,
                                   solver=self.solver, solver_tol=max(self.solver_tol, 1e-6),
                                   **self.case_parameters)
        tiny.step(tiny.initial_state(), 1.0, 1)
        self.backend.synchronize()

    # -- diagnostics -------------------------------------------------------------------
    def velocities(self, state):
        """``(u, v)`` = ``(-d psi/dy, d psi/dx)`` by centred differences (m/s), device arrays."""
        P = self._pad(state.psi)
        u = (P[:-2, 1:-1] - P[2:, 1:-1]) * (0.5 / self.grid.dy)
        v = (P[1:-1, 2:] - P[1:-1, :-2]) * (0.5 / self.grid.dx)
        return u, v

    def cfl(self, state, dt):
        """CFL number of a step ``dt``: advection, Rossby waves and viscosity.

        ``dt * (max|u|/dx + max|v|/dy + max omega_beta) + dt * 4 nu (1/dx**2 + 1/dy**2) * sqrt(3)/2.51``,
        where ``omega_beta`` is the fastest discrete Rossby-wave frequency;
        the scheme is stable below :data:`RK3_CFL_LIMIT`. NaN for a non-finite state.
        """
        return self.combine_health([self.block_health(state)], dt)[1]

    def bad_fields(self, state):
        """Names of the fields holding NaN/inf."""
        xp = self.backend.xp
        return [name for name, array in zip(self.field_names, state.arrays())
                if not bool(xp.isfinite(array).all())]

    def diagnostics(self, state, dt=None):
        """Global diagnostics as a dict of floats (host), integrals over the domain.

        ``energy`` ``1/2 sum |grad psi|**2 dA`` with one-sided differences
        (equal to ``-1/2 sum psi zeta dA``; m**4/s**2), ``enstrophy``
        ``1/2 sum zeta**2 dA`` (m**2/s**2), ``circulation`` ``sum zeta dA``
        (m**2/s), and ``max_cfl`` if ``dt`` is given. Energy and enstrophy are
        invariants of the inviscid semi-discrete scheme on both domains; the
        circulation is one on the doubly periodic domain (where it is zero),
        not in a channel, whose free-slip walls (``zeta = 0`` there, the odd
        reflection) exchange vorticity with the flow near them. The sums are
        exact (correctly rounded), so a partitioned run reports the same numbers.
        """
        out = self.combine_sums([self.block_sums(state, whole_grid(self.shape, self.periodic))])
        if dt is not None:
            out["max_cfl"] = self.cfl(state, dt)
        return out

    # -- output --------------------------------------------------------------------------
    def to_dataset(self, state, time=None):
        """The state as an ``xarray.Dataset`` with coordinates and units."""
        import xarray as xr

        g = self.grid
        coords = {"x": ("x", g.x_face(), {"units": "m", "long_name": "x of grid points"}),
                  "y": ("y", g.y_face(), {"units": "m", "long_name": "y of grid points"})}
        data = {"zeta": (("y", "x"), self.backend.to_host(state.zeta),
                         {"units": "s-1", "long_name": "relative vorticity"}),
                "psi": (("y", "x"), self.backend.to_host(state.psi),
                        {"units": "m2 s-1", "long_name": "streamfunction"})}
        ds = xr.Dataset(data, coords=coords, attrs=self.attributes())
        if time is not None:
            ds = ds.expand_dims(time=[float(time)])
            ds["time"].attrs.update(units="s", long_name="model time")
        return ds

    def attributes(self):
        """Model description as flat attributes (for files and reports)."""
        g = self.grid
        attrs = {"model": "barotropic_vorticity", "case": self.case, "nx": g.nx, "ny": g.ny, "Lx": g.Lx,
                 "Ly": g.Ly, "boundary": "/".join(g.boundary), "dtype": self.dtype.name,
                 "backend": self.backend.name, "solver": self.solver, "solver_tol": self.solver_tol,
                 "scheme": "Arakawa (1966) Jacobian, SSP-RK3"}
        attrs.update({f.name: getattr(self.params, f.name) for f in fields(VorticityParams)})
        attrs.update(self.case_parameters)
        return attrs

    def to_host(self, state):
        """The state with NumPy arrays (what a checkpoint saves)."""
        return VorticityState(*(self.backend.to_host(a) for a in state.arrays()))

    def restore_state(self, host_state):
        """A checkpointed host state on this backend, ``psi`` as saved.

        Not :meth:`state_from_arrays`: solving for ``psi`` again would
        change it within the solver's tolerance, and CG starts every solve
        from the last ``psi``, so a resumed run would not continue exactly.
        """
        return VorticityState(*(self.backend.asarray(a, dtype=self.dtype) for a in host_state.arrays()))

    def with_backend(self, backend):
        """The same model on another backend (a shallow copy)."""
        other = object.__new__(BarotropicVorticity)
        other.__dict__.update(self.__dict__)
        other.backend = get_backend(backend)
        other._operator = other._inverse = None
        return other

    def __getstate__(self):
        state = self.__dict__.copy()
        state["_operator"] = state["_inverse"] = None  # FFT symbols stay on their device
        return state

    def _repr_html_(self):
        """HTML summary for Jupyter: case, grid, domain, solver, physics, backend (all parameters collapsed)."""
        from hpcgpu.io import html_views

        g, p = self.grid, self.params
        solver = "FFT" if self.solver == "fft" else f"CG (Jacobi, tol {self.solver_tol:g})"
        return html_views.model_html(self, [
            ("case", self.case), ("grid (nx x ny)", f"{g.nx} x {g.ny} points"),
            ("domain", f"{g.Lx / 1e3:g} km x {g.Ly / 1e3:g} km"), ("boundary (x, y)", ", ".join(g.boundary)),
            ("Poisson solver", solver), ("beta", f"{p.beta:g} 1/(m s)"), ("viscosity", f"{p.viscosity:g} m2/s"),
            ("backend", self.backend.name), ("dtype", self.dtype.name),
            ("scheme", "Arakawa (1966) Jacobian, SSP-RK3")])

    def __repr__(self):
        return (f"BarotropicVorticity(case={self.case!r}, nx={self.grid.nx}, ny={self.grid.ny}, "
                f"dtype={self.dtype.name!r}, backend={self.backend.name!r}, solver={self.solver!r})")


class VorticityStepper:
    """SSP-RK3 time stepping with a Poisson solve after every stage.

    CG starts each solve from the previous stage's ``psi``, which saves
    about a tenth of its iterations (242 -> 219 at 128^2, tol 1e-8: a warm
    start removes the smooth part of the error, CG's cheap part).
    ``advance`` never modifies its input state.

    Parameters
    ----------
    model : BarotropicVorticity
    dt : float
        Time step (s).
    """

    def __init__(self, model, dt):
        self.model = model
        self.dt = dt

    def advance(self, state, steps=1):
        """Return the state ``steps`` time steps later."""
        steps = check_int("steps", steps, minimum=0)
        model, dt = self.model, self.dt
        where = whole_grid(model.shape, model.periodic)
        for _ in range(steps):
            start = state
            for stage in range(model.stages):
                zeta = model.stage_block(state, start, stage, dt, where)
                state = VorticityState(zeta, model.streamfunction(zeta, guess=state.psi))
        return state
