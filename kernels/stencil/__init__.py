"""Stencil kernels on 2D grids: diffusion, Laplacian, shallow-water dynamics.

Public functions check their input once and dispatch to the backend files
(``_numpy``, ``_numba``, ``_cuda``, ``_cupy``), which share one signature on
raw arrays. Grids are ``(ny, nx)`` arrays, x along the last axis. The
shallow-water fields live on an Arakawa C-grid: ``h`` at cell centres, ``u``
on west faces, ``v`` on south faces (see :mod:`.boundary`).

Boundaries are ``"periodic"`` or ``"wall"`` for both axes, a pair
``(x, y)``, or a triple ``(x, south, north)`` where south and north may also
be ``"open"`` (the edge of a partition with a halo; results within the
stencil reach of an open edge are not valid). The scalar kernels
(:func:`laplacian`, :func:`diffuse`) also take ``"dirichlet"`` on any edge:
the points just beyond it hold ``boundary_value`` (default 0), the textbook
heat-equation setup (see :mod:`.boundary`).

Examples
--------
>>> import numpy as np
>>> from hpcgpu.kernels import stencil
>>> field = np.zeros((8, 8)); field[4, 4] = 1.0
>>> lap = stencil.laplacian(field, dx=1.0, dy=1.0, backend="numpy")
>>> float(lap[4, 4]), float(lap.sum())
(-4.0, 0.0)

Heat flowing out through cold (zero) edges:

>>> hot = np.ones((6, 6))
>>> cooled = stencil.diffuse(hot, diffusivity=0.25, dt=1.0, boundary="dirichlet", backend="numpy")
>>> float(cooled[0, 0]), float(cooled[0, 2]), float(cooled[2, 2])  # corner, edge, interior
(0.5, 0.75, 1.0)
"""

import numpy as np

from hpcgpu.backends import get_backend
from hpcgpu.errors import ConfigError
from hpcgpu.kernels.stencil.boundary import CODES, DIRICHLET, NAMES, OPEN, PERIODIC, WALL
from hpcgpu.kernels.stencil.prepared import FAST_PATHS, PreparedShallowWater, boundary_names
from hpcgpu.validation import check_float, check_int

__all__ = [
    "MIN_POINTS",
    "PERIODIC",
    "WALL",
    "OPEN",
    "DIRICHLET",
    "CODES",
    "NAMES",
    "normalize_boundary",
    "pad",
    "laplacian",
    "diffuse",
    "shallow_water_tendency",
    "shallow_water_stage",
    "arakawa_jacobian",
    "prepare_shallow_water",
    "PreparedShallowWater",
    "FAST_PATHS",
    "SSP_RK3_STAGES",
    "raw_kernels",
]

MIN_POINTS = 4
"""Smallest number of points along each axis that every kernel accepts."""


SSP_RK3_STAGES = ((0.0, 1.0, 1.0), (0.75, 0.25, 0.25), (1.0 / 3.0, 2.0 / 3.0, 2.0 / 3.0))
"""Shu-Osher SSP-RK3 as ``(a, b, c)`` per stage: ``out = a y0 + b y + c dt L(y)``, with ``a + b = 1``
(the ``a, b`` and ``c / dt`` of :func:`shallow_water_stage`; the weather and vorticity steppers use it)."""

def normalize_boundary(boundary, *, allow_dirichlet=False):
    """Return boundary codes ``(x, south, north)`` for a boundary spec.

    Parameters
    ----------
    boundary : str or tuple
        ``"periodic"``, ``"wall"``, a pair ``(x, y)`` or a triple
        ``(x, south, north)``; ``"open"`` is allowed for south and north.
    allow_dirichlet : bool
        Accept ``"dirichlet"`` on any edge: only callers that apply a fixed
        value (the scalar kernels :func:`laplacian` and :func:`diffuse`) set
        it, so the shallow-water kernels and the Poisson operator refuse it.

    Raises
    ------
    ConfigError
        Unknown kind, a half-periodic axis, ``"open"`` along x, or
        ``"dirichlet"`` where it is not allowed.

    Examples
    --------
    >>> normalize_boundary(("periodic", "wall"))
    (0, 1, 1)
    >>> normalize_boundary(("wall", "dirichlet", "wall"), allow_dirichlet=True)
    (1, 3, 1)
    """
    if isinstance(boundary, str):
        parts = (boundary, boundary, boundary)
    elif isinstance(boundary, (tuple, list)) and len(boundary) == 2:
        parts = (boundary[0], boundary[1], boundary[1])
    elif isinstance(boundary, (tuple, list)) and len(boundary) == 3:
        parts = tuple(boundary)
    else:
        raise ConfigError(
            "boundary must be 'periodic', 'wall'" + (", 'dirichlet'" if allow_dirichlet else "")
            + f", a pair (x, y) or a triple (x, south, north); got {boundary!r}")
    kinds = [name for name, code in CODES.items() if allow_dirichlet or code != DIRICHLET]
    for label, part in zip(("x", "south", "north"), parts):
        if part == "dirichlet" and not allow_dirichlet:
            raise ConfigError(
                f"boundary ({label}) 'dirichlet' is only for the scalar kernels (laplacian, "
                f"diffuse); here it must be one of {', '.join(map(repr, kinds))}")
        if part not in kinds:
            raise ConfigError(
                f"boundary ({label}) must be one of {', '.join(map(repr, kinds))}; got {part!r}")
    x, south, north = (CODES[p] for p in parts)
    if x == OPEN:
        raise ConfigError("boundary along x must be " + ("'periodic', 'wall' or 'dirichlet'" if allow_dirichlet
                                                         else "'periodic' or 'wall'")
                          + "; 'open' is only for the south/north edges of a partition")
    if (south == PERIODIC) != (north == PERIODIC):
        raise ConfigError(
            f"boundary in y is periodic on one edge only ({NAMES[south]!r} south, "
            f"{NAMES[north]!r} north); periodic must hold on both edges")
    return x, south, north


def _fields(backend, names, arrays, dtype=None):
    """Move arrays to the backend and check they are matching 2D float grids."""
    out = []
    shape = None
    for name, array in zip(names, arrays):
        if array is None:
            raise ConfigError(f"{name} must be a 2D array, got None")
        array = backend.asarray(array)
        if array.ndim != 2:
            raise ConfigError(f"{name} must be a 2D array (ny, nx); got shape {array.shape}")
        if array.dtype.name not in ("float32", "float64"):
            raise ConfigError(f"{name} must have dtype float32 or float64; got {array.dtype}")
        if dtype is None:
            dtype = array.dtype
        elif array.dtype != dtype:
            raise ConfigError(f"{name} has dtype {array.dtype} but {names[0]} has {dtype}; "
                              "all fields of one call must share a dtype")
        if shape is None:
            shape = array.shape
            if min(shape) < MIN_POINTS:
                raise ConfigError(f"{name} must be at least {MIN_POINTS}x{MIN_POINTS} points; "
                                  f"got shape {shape}")
        elif array.shape != shape:
            raise ConfigError(f"{name} has shape {array.shape} but {names[0]} has {shape}")
        out.append(array)
    return out


def _spacing(dx, dy):
    return (check_float("dx", dx, minimum=0.0, strict_min=True),
            check_float("dy", dy, minimum=0.0, strict_min=True))


def _boundary_value(value, dtype):
    """``boundary_value`` checked: finite, and within the range of the field's dtype."""
    value = check_float("boundary_value", value)
    limit = float(np.finfo(dtype).max)
    if abs(value) > limit:
        raise ConfigError(f"boundary_value={value!r} does not fit the field's dtype {dtype} "
                          f"(|boundary_value| <= {limit:.4g})")
    return value


def laplacian(field, *, dx=1.0, dy=1.0, boundary="periodic", boundary_value=0.0, backend="auto"):
    """Five-point Laplacian of a cell-centred field.

    Parameters
    ----------
    field : array (ny, nx)
        float32 or float64; NumPy, or CuPy for GPU backends.
    dx, dy : float
        Grid spacing (> 0), in the units of the domain (e.g. m).
    boundary : str or tuple
        See :func:`normalize_boundary`; walls are no-flux. ``"dirichlet"``
        is allowed on any edge: the points just beyond it (a spacing away
        from the edge points) hold ``boundary_value``.
    boundary_value : float
        The value beyond every Dirichlet edge (finite; default 0), in the
        units of ``field``. Ignored without a Dirichlet edge.
    backend : str or Backend

    Returns
    -------
    array (ny, nx)
        On the backend's device, same dtype, units of field / length**2.

    Raises
    ------
    ConfigError
        Bad parameters (each message names the parameter).

    Examples
    --------
    >>> import numpy as np
    >>> laplacian(np.ones((6, 6)), backend="numpy").max()
    np.float64(0.0)
    >>> lap = laplacian(np.ones((6, 6)), boundary=("periodic", "dirichlet"), boundary_value=3.0,
    ...                 backend="numpy")
    >>> lap[:, 0].tolist()  # rows 0 and 5 border the fixed value 3
    [2.0, 0.0, 0.0, 0.0, 0.0, 2.0]
    """
    backend = get_backend(backend)
    (field,) = _fields(backend, ("field",), (field,))
    dx, dy = _spacing(dx, dy)
    bc = normalize_boundary(boundary, allow_dirichlet=True)
    value = _boundary_value(boundary_value, field.dtype)
    out = backend.empty(field.shape, field.dtype)
    return backend.kernels("stencil").laplacian(field, out, 1.0 / dx**2, 1.0 / dy**2, *bc, value)


def diffuse(field, *, diffusivity, dt, steps=1, dx=1.0, dy=1.0, boundary="periodic", boundary_value=0.0,
            backend="auto"):
    """Advance ``steps`` explicit (forward Euler) steps of the diffusion equation.

    ``f <- f + cx*(f[W] + f[E] - 2f) + cy*(f[S] + f[N] - 2f)`` with
    ``cx = diffusivity*dt/dx**2`` and ``cy = diffusivity*dt/dy**2`` (the
    five-point Laplacian, evaluated in that form by every backend: it keeps
    the total of a periodic or walled field to rounding, with no drift).
    The input is not modified.

    Parameters
    ----------
    field : array (ny, nx)
    diffusivity : float
        Diffusion coefficient (>= 0), e.g. m**2/s.
    dt : float
        Time step (> 0), e.g. s. Stability needs
        ``diffusivity * dt * (1/dx**2 + 1/dy**2) <= 1/2``.
    steps : int
        Number of steps (>= 1).
    dx, dy, boundary, boundary_value, backend
        As for :func:`laplacian`. With ``"dirichlet"`` edges the array holds
        the interior nodes of a node-centred grid whose boundary nodes (a
        spacing beyond the edge rows and columns) stay at ``boundary_value``:
        on ``(ny, nx)`` points with zero edges, the mode
        ``sin(pi (j+1)/(ny+1)) sin(pi (i+1)/(nx+1))`` decays by
        ``1 - 4 cx sin(pi/(2(nx+1)))**2 - 4 cy sin(pi/(2(ny+1)))**2`` per step.

    Raises
    ------
    ConfigError
        Bad parameters, or a time step above the stability limit.

    Examples
    --------
    >>> import numpy as np
    >>> f = np.zeros((8, 8)); f[4, 4] = 1.0
    >>> g = diffuse(f, diffusivity=0.1, dt=1.0, steps=10, backend="numpy")
    >>> round(float(g.sum()), 12)
    1.0

    A plate at 20 between edges held at 100 warms from its edges:

    >>> plate = np.full((5, 5), 20.0)
    >>> warm = diffuse(plate, diffusivity=0.25, dt=1.0, steps=1, boundary="dirichlet",
    ...                boundary_value=100.0, backend="numpy")
    >>> float(warm[2, 2]), float(warm[2, 0]), float(warm[0, 0])
    (20.0, 40.0, 60.0)
    """
    backend = get_backend(backend)
    (field,) = _fields(backend, ("field",), (field,))
    diffusivity = check_float("diffusivity", diffusivity, minimum=0.0)
    dt = check_float("dt", dt, minimum=0.0, strict_min=True)
    steps = check_int("steps", steps, minimum=1)
    dx, dy = _spacing(dx, dy)
    cx, cy = diffusivity * dt / dx**2, diffusivity * dt / dy**2
    if cx + cy > 0.5:
        limit = 0.5 / (diffusivity / dx**2 + diffusivity / dy**2)
        raise ConfigError(f"dt={dt} is above the explicit diffusion stability limit "
                          f"{limit:.6g} (diffusivity*dt*(1/dx**2+1/dy**2) must be <= 1/2)")
    bc = normalize_boundary(boundary, allow_dirichlet=True)
    value = _boundary_value(boundary_value, field.dtype)
    work = backend.xp.array(field, copy=True)
    other = backend.empty(field.shape, field.dtype)
    return backend.kernels("stencil").diffuse(work, other, cx, cy, steps, *bc, value)


def _coriolis(backend, f_corner, ny, dtype):
    if np.isscalar(f_corner):
        f_value = check_float("f_corner", f_corner)
        return backend.xp.full(ny + 1, f_value, dtype=dtype)
    f_corner = backend.asarray(f_corner, dtype=dtype)
    if f_corner.shape != (ny + 1,):
        raise ConfigError(f"f_corner must be a scalar or have shape ({ny + 1},) (one value per "
                          f"corner row); got shape {f_corner.shape}")
    return f_corner


def _sw_parameters(g, dx, dy, viscosity):
    g = check_float("g", g, minimum=0.0, strict_min=True)
    dx, dy = _spacing(dx, dy)
    viscosity = check_float("viscosity", viscosity, minimum=0.0)
    return g, 1.0 / dx, 1.0 / dy, viscosity


def shallow_water_tendency(u, v, h, *, f_corner, g, dx, dy, viscosity=0.0,
                           boundary="periodic", backend="auto"):
    """Tendencies of the rotating shallow-water equations on a C-grid.

    Vector-invariant form with the energy- and potential-enstrophy-conserving
    vorticity flux of Arakawa and Lamb (1981), extended to rectangular cells,
    plus optional Laplacian viscosity on the velocities.

    Parameters
    ----------
    u, v, h : arrays (ny, nx)
        Velocities on west / south faces (m/s) and layer depth at centres (m).
    f_corner : float or array (ny + 1,)
        Coriolis parameter on corner rows 0..ny (1/s).
    g : float
        Gravity (m/s**2), > 0.
    dx, dy : float
        Grid spacing (m), > 0.
    viscosity : float
        Laplacian viscosity (m**2/s), >= 0.
    boundary, backend
        See :func:`normalize_boundary`.

    Returns
    -------
    du, dv, dh : arrays (ny, nx)
        Time derivatives (m/s**2, m/s**2, m/s).

    Examples
    --------
    >>> import numpy as np
    >>> h = np.ones((8, 8)); u = np.zeros((8, 8)); v = np.zeros((8, 8))
    >>> du, dv, dh = shallow_water_tendency(u, v, h, f_corner=1e-4, g=9.81,
    ...                                     dx=1e3, dy=1e3, backend="numpy")
    >>> float(abs(du).max() + abs(dv).max() + abs(dh).max())
    0.0
    """
    backend = get_backend(backend)
    u, v, h = _fields(backend, ("u", "v", "h"), (u, v, h))
    g, rdx, rdy, nu = _sw_parameters(g, dx, dy, viscosity)
    bc = normalize_boundary(boundary)
    f_corner = _coriolis(backend, f_corner, h.shape[0], h.dtype)
    return backend.kernels("stencil").shallow_water_tendency(u, v, h, f_corner, g, rdx, rdy, nu, *bc)


def shallow_water_stage(state0, state, out, *, a, b, c, f_corner, g, dx, dy, viscosity=0.0,
                        boundary="periodic", backend="auto"):
    """One fused Runge-Kutta stage: ``out = a*state0 + b*state + c*tendency(state)``.

    The whole stage is one pass over memory on the compiled backends; the
    explicit time steppers of :mod:`hpcgpu.workloads.weather` are built from
    it (``c`` carries the time step).

    Parameters
    ----------
    state0, state, out : tuples ``(u, v, h)`` of arrays (ny, nx)
        ``state0`` is not read when ``a == 0``. ``out`` must not share
        memory with ``state`` or ``state0``.
    a, b, c : float
        Stage coefficients; ``a`` is 0 or ``1 - b`` (evaluated as
        ``state0 + b*(state - state0)``, which keeps float32 mass exact).
    f_corner, g, dx, dy, viscosity, boundary, backend
        As for :func:`shallow_water_tendency`.

    Returns
    -------
    out
    """
    backend = get_backend(backend)
    names = ("u0", "v0", "h0", "u", "v", "h", "u_out", "v_out", "h_out")
    arrays = _fields(backend, names, (*state0, *state, *out))
    for o_name, o in zip(names[6:], arrays[6:]):
        for i_name, i in zip(names[:6], arrays[:6]):
            if backend.xp.may_share_memory(o, i):
                raise ConfigError(f"{o_name} shares memory with {i_name}; stage outputs must be "
                                  "separate arrays")
    a, b, c = (check_float(name, value) for name, value in (("a", a), ("b", b), ("c", c)))
    if a != 0 and abs(a + b - 1) > 1e-12:
        raise ConfigError(f"a must be 0 or 1 - b (a convex combination); got a={a}, b={b}")
    g, rdx, rdy, nu = _sw_parameters(g, dx, dy, viscosity)
    bc = normalize_boundary(boundary)
    f_corner = _coriolis(backend, f_corner, arrays[5].shape[0], arrays[5].dtype)
    backend.kernels("stencil").shallow_water_stage(*arrays, f_corner, g, rdx, rdy, nu, a, b, c, *bc)
    return tuple(arrays[6:])


def pad(field, boundary, *, normal=None, width=1):
    """``field`` with ``width`` ghost points on each side, by the boundary rules of the kernels.

    Periodic edges wrap; wall and open edges copy the edge value; beyond a
    wall the normal velocity is zero. Array-module generic (NumPy or CuPy
    arrays, the result on the same device).

    Parameters
    ----------
    field : array (ny, nx)
    boundary : str, tuple of names, or kernel codes ``(x, south, north)``
        See :func:`normalize_boundary` (``"dirichlet"`` is not a padding rule here).
    normal : {None, "x", "y"}
        The axis along which ``field`` is the normal velocity (``u``: ``"x"``, ``v``: ``"y"``).
    width : int
        Ghost points per side, >= 1.

    Examples
    --------
    >>> import numpy as np
    >>> pad(np.arange(4.0).reshape(1, 4).repeat(4, 0), ("periodic", "wall"))[0].tolist()
    [3.0, 0.0, 1.0, 2.0, 3.0, 0.0]
    """
    from hpcgpu.kernels.stencil import _numpy

    bc = normalize_boundary(boundary_names(boundary))
    if normal not in (None, "x", "y"):
        raise ConfigError(f"normal must be None, 'x' or 'y'; got {normal!r}")
    width = check_int("width", width, minimum=1)
    if getattr(field, "ndim", None) != 2:
        raise ConfigError(f"field must be a 2D array (ny, nx); got {type(field).__name__}")
    return _numpy.pad(field, *bc, normal=normal, width=width)


def prepare_shallow_water(nx, dtype, *, f_corner, g, dx, dy, viscosity=0.0, boundary="periodic",
                          backend="auto"):
    """Shallow-water stages and SSP-RK3 steps on fields ``(rows, nx)`` of ``dtype``, checked once.

    For a stepper's hot loop: the parameters are checked here, once; each
    call of the returned :class:`PreparedShallowWater` checks only the
    arrays' dtype and width. Its ``stage`` is :func:`shallow_water_stage`
    on raw arrays; its ``rk3_step`` is the backend's fused step where it has
    one (:data:`FAST_PATHS`), bitwise the same as three stages.

    Parameters
    ----------
    nx : int
        Points along x (>= :data:`MIN_POINTS`).
    dtype : str or dtype
        float32 or float64.
    f_corner : array (rows + 1,)
        Coriolis parameter on the corner rows (1/s), on the backend's device, in ``dtype``.
    g, dx, dy, viscosity
        As for :func:`shallow_water_tendency`.
    boundary : str, tuple of names, or kernel codes ``(x, south, north)``
        ``"open"`` south or north for the edge of a partition.
    backend : str or Backend

    Examples
    --------
    >>> import numpy as np
    >>> prepared = prepare_shallow_water(8, "float64", f_corner=np.full(9, 1e-4), g=9.81, dx=1e3, dy=1e3,
    ...                                  backend="numpy")
    >>> y0 = (np.zeros((8, 8)), np.zeros((8, 8)), np.ones((8, 8)))
    >>> out = tuple(np.empty((8, 8)) for _ in range(3))
    >>> prepared.stage(y0, y0, out, a=0.0, b=1.0, c=10.0, rows=(0, 8))
    >>> float(out[2].max()), prepared.fused
    (1.0, False)
    """
    backend = get_backend(backend)
    nx = check_int("nx", nx, minimum=MIN_POINTS)
    dtype = np.dtype(dtype)
    if dtype.name not in ("float32", "float64"):
        raise ConfigError(f"dtype must be float32 or float64; got {dtype}")
    g, rdx, rdy, nu = _sw_parameters(g, dx, dy, viscosity)
    bc = normalize_boundary(boundary_names(boundary))
    if getattr(f_corner, "ndim", None) != 1 or f_corner.dtype != dtype or not isinstance(
            f_corner, type(backend.empty((1,), dtype))):
        raise ConfigError(f"f_corner must be a 1D {dtype} array on the {backend.name} backend's device; "
                          f"got {type(f_corner).__name__}")
    return PreparedShallowWater(backend, nx, dtype, f_corner, (g, rdx, rdy, nu), bc)


def arakawa_jacobian(psi, zeta, *, dx, dy, boundary="periodic", scale=1.0, backend="auto"):
    """Arakawa's (1966) Jacobian ``J(psi, zeta) = dpsi/dx dzeta/dy - dpsi/dy dzeta/dx`` of cell-centred fields.

    The average of three second-order forms (``J++``, ``J+x``, ``Jx+``, eq. 46
    of Arakawa 1966 with rectangular cells): it conserves the domain sums of
    ``zeta``, ``zeta**2`` and the energy, so advection by it has no
    nonlinear instability. Array-module generic: the same expressions on
    every backend (NumPy arrays for ``numpy`` and ``numba``, CuPy for ``cuda``
    and ``cupy``).

    Parameters
    ----------
    psi, zeta : arrays (ny, nx)
        The streamfunction (m**2/s) and the advected field (e.g. vorticity, 1/s).
    dx, dy : float
        Grid spacing (m), > 0.
    boundary : str or pair
        ``"periodic"`` or ``"dirichlet"`` per axis (see :func:`normalize_boundary`):
        beyond a Dirichlet edge both fields are zero (a channel wall where
        ``psi = 0``).
    scale : float
        Factor applied in the same pass (``-1`` gives ``-J``, the advection term).
    backend : str or Backend

    Returns
    -------
    array (ny, nx)
        ``scale * J`` (units of psi times zeta per m**2).

    Examples
    --------
    >>> import numpy as np
    >>> x = np.arange(8.0)
    >>> psi, zeta = np.tile(x, (8, 1)), np.tile(x[:, None], (1, 8))  # psi = x, zeta = y
    >>> float(arakawa_jacobian(psi, zeta, dx=1.0, dy=1.0, backend="numpy")[3, 3])  # dpsi/dx dzeta/dy
    1.0
    """
    from hpcgpu.kernels.stencil import arakawa

    backend = get_backend(backend)
    psi, zeta = _fields(backend, ("psi", "zeta"), (psi, zeta))
    dx, dy = _spacing(dx, dy)
    scale = check_float("scale", scale)
    bc_x, bc_s, bc_n = normalize_boundary(boundary, allow_dirichlet=True)
    for label, code in (("x", bc_x), ("south", bc_s), ("north", bc_n)):
        if code not in (PERIODIC, DIRICHLET):
            raise ConfigError(f"boundary ({label}) of the Arakawa Jacobian must be 'periodic' or 'dirichlet' "
                              f"(zero beyond the edge); got {NAMES[code]!r}")
    if bc_s != bc_n:
        raise ConfigError(f"boundary in y must be the same on both edges; got {NAMES[bc_s]!r} south and "
                          f"{NAMES[bc_n]!r} north")
    return arakawa.jacobian(backend.xp, psi, zeta, scale / (12.0 * dx * dy), bc_x, bc_s)[0]


def raw_kernels(backend="auto"):
    """The backend file of the stencil family for ``backend``: its kernels with no input checks.

    For benchmarks and tuning that time the kernels themselves (``hpcgpu
    bench stencil``). Every backend file has ``laplacian``, ``diffuse``,
    ``shallow_water_tendency`` and ``shallow_water_stage`` with the
    signatures of ``_numpy`` (boundary codes, not names; ``1/dx`` and
    ``1/dy``, not the spacing), and the fused kernels that :data:`FAST_PATHS`
    lists for it; the GPU files also carry their launch tables (``LAUNCH``,
    ``VARIANTS``). The arguments must be what the public functions would
    hand them: arrays of one float dtype on the backend's device, outputs
    apart from inputs; anything else is undefined.

    Parameters
    ----------
    backend : str or Backend

    Returns
    -------
    module

    Examples
    --------
    >>> import numpy as np
    >>> field = np.zeros((4, 4)); field[1, 1] = 1.0
    >>> periodic = (CODES["periodic"],) * 3  # x, south, north
    >>> out = raw_kernels("numpy").laplacian(field, np.empty_like(field), 1.0, 1.0, *periodic)
    >>> float(out[1, 1])
    -4.0
    """
    return get_backend(backend).kernels("stencil")
