"""The shallow-water entry points of the stencil family: one tendency, one SSP-RK3 stage, a prepared step.

:func:`shallow_water_tendency` and :func:`shallow_water_stage` check their
inputs once and dispatch to the backend's kernels; :func:`prepare_shallow_water`
checks a grid's parameters once and returns a
:class:`~hpcgpu.kernels.stencil.prepared.PreparedShallowWater` whose calls
skip the checks (what a time stepper calls every stage). The equations are
the NumPy reference's (:mod:`hpcgpu.kernels.stencil._numpy`). The public
names are re-exported by :mod:`hpcgpu.kernels.stencil`.

Examples
--------
>>> import numpy as np
>>> from hpcgpu.kernels.stencil import shallow_water_tendency
>>> u, v, h = np.zeros((8, 8)), np.zeros((8, 8)), np.full((8, 8), 10.0)
>>> du, dv, dh = shallow_water_tendency(u, v, h, f_corner=1e-4, g=9.81, dx=1e3, dy=1e3, backend="numpy")
>>> float(abs(du).max()), float(abs(dh).max())  # a lake at rest stays at rest
(0.0, 0.0)
"""

import numpy as np

from hpcgpu.backends import get_backend
from hpcgpu.errors import ConfigError
from hpcgpu.kernels.stencil.fields import MIN_POINTS, _fields, _spacing, normalize_boundary
from hpcgpu.kernels.stencil.prepared import PreparedShallowWater, boundary_names
from hpcgpu.validation import check_dtype, check_finite_array, check_float, check_int

__all__ = ["prepare_shallow_water", "shallow_water_stage", "shallow_water_tendency", "viscous_energy_tendency"]


def _coriolis(backend, f_corner, ny, dtype):
    if np.isscalar(f_corner):
        f_value = check_float("f_corner", f_corner)
        return backend.xp.full(ny + 1, f_value, dtype=dtype)
    f_corner = backend.asarray(f_corner)
    if f_corner.shape != (ny + 1,):
        raise ConfigError(f"f_corner must be a scalar or have shape ({ny + 1},) (one value per "
                          f"corner row); got shape {f_corner.shape}")
    # checked before the cast to the fields' dtype, which would drop an imaginary part silently
    if f_corner.dtype.kind not in "iuf":
        raise ConfigError(f"f_corner must hold real numbers; got dtype {f_corner.dtype}")
    f_corner = f_corner.astype(dtype, copy=False)
    check_finite_array("f_corner", f_corner)  # as for a scalar f_corner: NaN would spread everywhere
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


def viscous_energy_tendency(u, v, h, *, dx, dy, viscosity, boundary="periodic", backend="auto"):
    """Per cell, the rate at which the Laplacian viscosity changes the discrete energy (m**3/s**3).

    ``h_u u nu lap(u) + h_v v nu lap(v)`` at each cell's west and south
    faces, with the viscous operator and boundary rules of
    :func:`shallow_water_tendency` and ``h_u``, ``h_v`` the mean depths
    beside each face: the energy's derivative along the viscous tendency.
    Its sum times the cell area is the viscous term's ``dE/dt`` (m**5/s**3,
    per unit density; <= 0 away from boundaries' round-off); the other
    terms of the scheme conserve the energy, so the energy changes by its
    time integral up to the time scheme's error. Array-module generic: the
    same expressions on every backend's arrays, in float64.

    Parameters
    ----------
    u, v, h : arrays (ny, nx)
        Velocities on west / south faces (m/s) and layer depth at centres (m).
    dx, dy : float
        Grid spacing (m), > 0.
    viscosity : float
        Laplacian viscosity (m**2/s), >= 0.
    boundary, backend
        See :func:`normalize_boundary`.

    Returns
    -------
    array (ny, nx), float64

    Examples
    --------
    >>> import numpy as np
    >>> u = np.zeros((8, 8)); u[4, :] = 1.0  # a jet one row wide: viscosity spreads it, losing energy
    >>> rate = viscous_energy_tendency(u, np.zeros((8, 8)), np.full((8, 8), 10.0), dx=1.0, dy=1.0,
    ...                                viscosity=0.1, backend="numpy")
    >>> float(rate.sum())  # 8 faces x h 10 x u 1 x nu 0.1 x lap(u) -2
    -16.0
    """
    from hpcgpu.kernels.stencil import _numpy

    backend = get_backend(backend)
    u, v, h = _fields(backend, ("u", "v", "h"), (u, v, h))
    dx, dy = _spacing(dx, dy)
    viscosity = check_float("viscosity", viscosity, minimum=0.0)
    return _numpy.viscous_energy_tendency(u, v, h, viscosity, 1.0 / dx, 1.0 / dy, *normalize_boundary(boundary))


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
    # each a triple, or the flattened arrays below would take the wrong roles
    for name, fields in (("state0", state0), ("state", state), ("out", out)):
        if not isinstance(fields, (tuple, list)) or len(fields) != 3:
            raise ConfigError(f"{name} must be a tuple (u, v, h) of three arrays; got "
                              f"{type(fields).__name__}" + (f" of length {len(fields)}"
                                                            if isinstance(fields, (tuple, list)) else ""))
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


def prepare_shallow_water(nx, dtype, *, f_corner, g, dx, dy, viscosity=0.0, boundary="periodic",
                          backend="auto"):
    """Shallow-water stages and SSP-RK3 steps on fields ``(rows, nx)`` of ``dtype``, checked once.

    For a stepper's hot loop: the parameters are checked here, once; each
    call of the returned :class:`PreparedShallowWater` checks only the
    arrays' dtype and width. Its ``stage`` is :func:`shallow_water_stage`
    on raw arrays; its ``rk3_step`` is the backend's fused step where it has
    one (:data:`FAST_PATHS`), bitwise the same as three stages. Both step a
    window of rows (``rows``) and, optionally, of columns (``cols``), as if
    it were the whole grid: a partition's stepper shrinks them towards its
    open edges.

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
    dtype = check_dtype("dtype", dtype)
    g, rdx, rdy, nu = _sw_parameters(g, dx, dy, viscosity)
    bc = normalize_boundary(boundary_names(boundary))
    if getattr(f_corner, "ndim", None) != 1 or f_corner.dtype != dtype or not isinstance(
            f_corner, type(backend.empty((1,), dtype))):
        raise ConfigError(f"f_corner must be a 1D {dtype} array on the {backend.name} backend's device; "
                          f"got {type(f_corner).__name__}")
    check_finite_array("f_corner", f_corner)  # once here: the prepared calls do not look at it
    return PreparedShallowWater(backend, nx, dtype, f_corner, (g, rdx, rdy, nu), bc)
