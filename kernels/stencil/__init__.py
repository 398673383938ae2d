"""Stencil kernels on 2D grids: diffusion, Laplacian, shallow-water dynamics.

Public functions check their input once and dispatch to the backend files
(``_numpy``, ``_numba``, ``_cuda``, ``_cupy``), which share one signature on
raw arrays. Grids are ``(ny, nx)`` arrays, x along the last axis. The
shallow-water fields live on an Arakawa C-grid: ``h`` at cell centres, ``u``
on west faces, ``v`` on south faces (see :mod:`.boundary`). The checks
every entry point shares are in :mod:`.fields`, the shallow-water entry
points in :mod:`.shallow_water`; this module re-exports them.

Boundaries are ``"periodic"`` or ``"wall"`` for both axes, a pair
``(x, y)``, or a triple ``(x, south, north)`` where any may also be
``"open"`` (the edge of a partition with a halo; results within the
stencil reach of an open edge are not valid; ``"open"`` x means both the
west and the east edge). The shallow-water stage and step also take a
column window ``cols=(lo, hi)``: they step those columns as if they were
the whole grid, as a row window steps rows. The scalar kernels
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
from hpcgpu.kernels.stencil.fields import MIN_POINTS, _boundary_value, _fields, _spacing, normalize_boundary
from hpcgpu.kernels.stencil.prepared import FAST_PATHS, PreparedShallowWater, boundary_names
from hpcgpu.kernels.stencil.shallow_water import (prepare_shallow_water, shallow_water_stage, shallow_water_tendency,
                                                  viscous_energy_tendency)
from hpcgpu.validation import check_count, check_float

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
    "viscous_energy_tendency",
    "arakawa_jacobian",
    "prepare_shallow_water",
    "PreparedShallowWater",
    "FAST_PATHS",
    "SSP_RK3_STAGES",
    "raw_kernels",
    "diffusion_sweep_depth",
]

SSP_RK3_STAGES = ((0.0, 1.0, 1.0), (0.75, 0.25, 0.25), (1.0 / 3.0, 2.0 / 3.0, 2.0 / 3.0))
"""Shu-Osher SSP-RK3 as ``(a, b, c)`` per stage: ``out = a y0 + b y + c dt L(y)``, with ``a + b = 1``
(the ``a, b`` and ``c / dt`` of :func:`shallow_water_stage`; the weather and vorticity steppers use it)."""

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
    # the kernels multiply by 1/dx**2 in the field's dtype: beyond float32's range it is inf
    limit = float(np.finfo(field.dtype).max)
    for name, spacing in (("dx", dx), ("dy", dy)):
        if 1.0 / spacing**2 > limit:
            raise ConfigError(f"{name}={spacing!r} is too small for a {field.dtype} field: 1/{name}**2 must be "
                              f"<= {limit:.4g} ({name} >= {limit ** -0.5:.4g})")
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
        Number of steps, ``1 <= steps <= 2**63 - 1`` (the kernels' int64).
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
    # The compiled kernels count steps in int64; a count beyond it was accepted and never finished.
    steps = check_count("steps", steps)
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
        Ghost points per side, ``1 <= width <= 2**63 - 1`` (the int64 that ``pad`` takes).

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
    width = check_count("width", width)
    if getattr(field, "ndim", None) != 2:
        raise ConfigError(f"field must be a 2D array (ny, nx); got {type(field).__name__}")
    return _numpy.pad(field, *bc, normal=normal, width=width)


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


def diffusion_sweep_depth(nx, dtype):
    """Steps one multi-step diffusion sweep of the ``numba`` backend takes on rows of ``nx`` cells here.

    The depth follows the ring budget :mod:`hpcgpu.autotune` measured
    fastest on this machine (``stencil.diffusion.ring_bytes.float32`` /
    ``float64``; ``HPCGPU_AUTOTUNE=0``: 1 MiB); the result is bitwise the
    same whatever the depth.

    Examples
    --------
    >>> 2 <= diffusion_sweep_depth(4096, "float32") <= 16
    True
    """
    from hpcgpu.kernels.stencil.diffusion_numba import tuned_steps_per_sweep

    return tuned_steps_per_sweep(int(nx), np.dtype(dtype).itemsize)
