"""Stencil kernels in plain vectorised NumPy: the reference implementation.

Written on whole arrays with ghost-cell padding, as directly from the
equations as possible; every other backend is tested against it. The code is
array-module generic, so it also runs on CuPy arrays (the GPU tests use that
as a second cross-check).

All functions take raw arrays and pre-checked scalars; the public wrappers in
``hpcgpu.kernels.stencil`` validate input. See ``boundary`` for the grid and
boundary conventions.
"""

import numpy as np

from hpcgpu.kernels.stencil.boundary import DIRICHLET, PERIODIC, WALL

GHOST = 2


def _xp(array):
    if type(array).__module__.split(".")[0] == "cupy":
        import cupy
        return cupy
    return np


def pad(field, bc_x, bc_s, bc_n, normal=None, width=GHOST):
    """Return ``field`` with ``width`` ghost cells on each side.

    Periodic edges wrap; wall and open edges copy the edge value. ``normal``
    names the axis (``"x"`` or ``"y"``) along which ``field`` is the normal
    velocity: beyond a wall that velocity is zero.
    """
    xp = _xp(field)
    mode_x = "wrap" if bc_x == PERIODIC else "edge"
    mode_y = "wrap" if bc_s == PERIODIC else "edge"
    padded = xp.pad(field, ((0, 0), (width, width)), mode=mode_x)
    padded = xp.pad(padded, ((width, width), (0, 0)), mode=mode_y)
    ny, nx = field.shape
    if normal == "x" and bc_x == WALL:
        padded[:, :width] = 0
        padded[:, width + nx:] = 0
    if normal == "y":
        if bc_s == WALL:
            padded[:width, :] = 0
        if bc_n == WALL:
            padded[width + ny:, :] = 0
    return padded


def _window(padded, j0, j1, i0, i1, width=GHOST):
    """Rows ``j0:j1``, columns ``i0:i1`` in logical (unpadded) indices."""
    return padded[j0 + width:j1 + width, i0 + width:i1 + width]


def _fill_padded(padded, field, bc_x, bc_s, bc_n, value):
    """Copy ``field`` into ``padded`` (one ghost cell each side) and set the ghosts.

    Periodic edges wrap, wall and open edges copy the edge value, Dirichlet
    edges hold ``value``. In place, so repeated diffusion steps allocate
    nothing: this is what keeps the NumPy baseline honest in benchmarks.
    The corners are left as they are: the five-point stencil never reads them.
    """
    padded[1:-1, 1:-1] = field
    for ghost, bc, wrapped, edge in ((padded[0, 1:-1], bc_s, field[-1], field[0]),
                                     (padded[-1, 1:-1], bc_n, field[0], field[-1])):
        if bc == PERIODIC:
            ghost[...] = wrapped
        elif bc == DIRICHLET:
            ghost[...] = value
        else:
            ghost[...] = edge
    if bc_x == PERIODIC:
        padded[1:-1, 0] = field[:, -1]
        padded[1:-1, -1] = field[:, 0]
    elif bc_x == DIRICHLET:
        padded[1:-1, 0] = value
        padded[1:-1, -1] = value
    else:
        padded[1:-1, 0] = field[:, 0]
        padded[1:-1, -1] = field[:, -1]


def laplacian(field, out, rdx2, rdy2, bc_x, bc_s, bc_n, value=0.0):
    """Five-point Laplacian of a cell-centred field into ``out``.

    ``rdx2`` and ``rdy2`` are ``1/dx**2`` and ``1/dy**2``. Walls are no-flux;
    beyond a Dirichlet edge the field is ``value``.
    """
    xp = _xp(field)
    ny, nx = field.shape
    p = xp.empty((ny + 2, nx + 2), field.dtype)
    _fill_padded(p, field, bc_x, bc_s, bc_n, value)
    out[...] = ((p[1:-1, :-2] + p[1:-1, 2:] - 2 * field) * rdx2
                + (p[:-2, 1:-1] + p[2:, 1:-1] - 2 * field) * rdy2)
    return out


def diffuse(field, work, cx, cy, steps, bc_x, bc_s, bc_n, value=0.0):
    """Advance ``steps`` explicit diffusion steps, ping-ponging two buffers.

    Each step is ``f + cx*(f[W] + f[E] - f - f) + cy*(f[S] + f[N] - f - f)``
    (``cx = nu*dt/dx**2``; beyond a Dirichlet edge ``f`` is ``value``),
    evaluated operation by operation as ``physics.diffusion_update`` writes
    it, which the compiled backends run. Returns whichever of ``field`` and
    ``work`` holds the result; both are overwritten.
    """
    xp = _xp(field)
    ny, nx = field.shape
    padded = xp.empty((ny + 2, nx + 2), field.dtype)
    tmp = xp.empty_like(field)
    t = field.dtype.type
    # Not f*(1 - 2cx - 2cy) + cx*(W + E) + cy*(S + N): its coefficients,
    # rounded one by one, do not sum to 1 (float32 with cx = cy = 0.2:
    # 1 + 1.5e-8), so every step would scale the total by that much. Here
    # each term is a difference of neighbours, which sums to zero over a
    # periodic grid: only unbiased rounding is left.
    cx, cy, value = t(cx), t(cy), t(value)
    west, east = padded[1:-1, :-2], padded[1:-1, 2:]
    south, north = padded[:-2, 1:-1], padded[2:, 1:-1]
    src, dst = field, work
    for _ in range(steps):
        _fill_padded(padded, src, bc_x, bc_s, bc_n, value)
        xp.add(west, east, out=tmp)
        tmp -= src
        tmp -= src
        tmp *= cx
        xp.add(src, tmp, out=dst)
        xp.add(south, north, out=tmp)
        tmp -= src
        tmp -= src
        tmp *= cy
        dst += tmp
        src, dst = dst, src
    return src


def _extend_f(f_corner, bc_s, width=GHOST):
    """Coriolis parameter on corner rows -width .. ny+width."""
    xp = _xp(f_corner)
    ny = f_corner.shape[0] - 1
    rows = np.arange(-width, ny + 1 + width)
    if bc_s == PERIODIC:
        rows = rows % ny
    else:
        rows = np.clip(rows, 0, ny)
    return f_corner[xp.asarray(rows)]


def shallow_water_tendency(u, v, h, f_corner, g, rdx, rdy, nu, bc_x, bc_s, bc_n):
    """Tendencies ``(du, dv, dh)`` of the rotating shallow-water equations.

    Vector-invariant form on the Arakawa C-grid with the energy- and
    potential-enstrophy-conserving vorticity flux of Arakawa and Lamb (1981)::

        du/dt =  (q hv)-flux - d/dx (g h + K) + nu lap(u)
        dv/dt = -(q hu)-flux - d/dy (g h + K) + nu lap(v)
        dh/dt = -d/dx (h u) - d/dy (h v)

    with potential vorticity ``q = (f + dv/dx - du/dy) / h`` at corners and
    kinetic energy ``K = (u**2 averaged in x + v**2 averaged in y) / 2`` at
    cell centres.
    """
    ny, nx = h.shape
    H = pad(h, bc_x, bc_s, bc_n)
    U = pad(u, bc_x, bc_s, bc_n, normal="x")
    V = pad(v, bc_x, bc_s, bc_n, normal="y")
    f = _extend_f(f_corner, bc_s)[:, None]  # corner rows -2 .. ny+2

    # Potential vorticity on corners rows -1..ny, columns -1..nx (offset 1).
    zeta = ((_window(V, -1, ny + 1, -1, nx + 1) - _window(V, -1, ny + 1, -2, nx)) * rdx
            - (_window(U, -1, ny + 1, -1, nx + 1) - _window(U, -2, ny, -1, nx + 1)) * rdy)
    h_corner = 0.25 * (_window(H, -2, ny, -2, nx) + _window(H, -2, ny, -1, nx + 1)
                       + _window(H, -1, ny + 1, -2, nx) + _window(H, -1, ny + 1, -1, nx + 1))
    q = (f[1:ny + 3] + zeta) / h_corner

    # Arakawa-Lamb coefficients on cells rows -1..ny-1, columns -1..nx-1 (offset 1).
    q_sw, q_se = q[:-1, :-1], q[:-1, 1:]
    q_nw, q_ne = q[1:, :-1], q[1:, 1:]
    alpha = (2 * (q_ne + q_sw) + (q_nw + q_se)) / 24
    beta = ((q_ne + q_sw) + 2 * (q_nw + q_se)) / 24
    # On rectangular cells the u-u and v-v couplings carry the aspect ratio;
    # without it potential enstrophy is conserved only when dx == dy.
    eps = (q_ne + q_nw - q_sw - q_se) * (rdx / (24 * rdy))
    phi = (q_nw + q_sw - q_ne - q_se) * (rdy / (24 * rdx))

    # Mass fluxes on rows -1..ny, columns -1..nx (offset 1).
    UF = 0.5 * (_window(H, -1, ny + 1, -2, nx) + _window(H, -1, ny + 1, -1, nx + 1)) \
        * _window(U, -1, ny + 1, -1, nx + 1)
    VF = 0.5 * (_window(H, -2, ny, -1, nx + 1) + _window(H, -1, ny + 1, -1, nx + 1)) \
        * _window(V, -1, ny + 1, -1, nx + 1)

    # Bernoulli potential on rows -1..ny-1, columns -1..nx-1 (offset 1).
    kinetic = 0.25 * (_window(U, -1, ny, -1, nx) ** 2 + _window(U, -1, ny, 0, nx + 1) ** 2
                      + _window(V, -1, ny, -1, nx) ** 2 + _window(V, 0, ny + 1, -1, nx) ** 2)
    bernoulli = g * _window(H, -1, ny, -1, nx) + kinetic

    def at(a, dj, di):
        """Interior window of an offset-1 array shifted by (dj, di)."""
        return a[1 + dj:1 + dj + ny, 1 + di:1 + di + nx]

    du = (at(alpha, 0, 0) * at(VF, 1, 0) + at(beta, 0, -1) * at(VF, 1, -1)
          + at(alpha, 0, -1) * at(VF, 0, -1) + at(beta, 0, 0) * at(VF, 0, 0)
          - at(eps, 0, 0) * at(UF, 0, 1) + at(eps, 0, -1) * at(UF, 0, -1)
          - (at(bernoulli, 0, 0) - at(bernoulli, 0, -1)) * rdx)
    dv = (-at(alpha, -1, 0) * at(UF, -1, 0) - at(beta, -1, 0) * at(UF, -1, 1)
          - at(alpha, 0, 0) * at(UF, 0, 1) - at(beta, 0, 0) * at(UF, 0, 0)
          - at(phi, 0, 0) * at(VF, 1, 0) + at(phi, -1, 0) * at(VF, -1, 0)
          - (at(bernoulli, 0, 0) - at(bernoulli, -1, 0)) * rdy)
    dh = -((at(UF, 0, 1) - at(UF, 0, 0)) * rdx + (at(VF, 1, 0) - at(VF, 0, 0)) * rdy)

    if nu != 0:
        viscous_u, viscous_v = _viscous(U, V, u, v, nu, rdx, rdy)
        du = du + viscous_u
        dv = dv + viscous_v
    if bc_x == WALL:
        du[:, 0] = 0
    if bc_s == WALL:
        dv[0, :] = 0
    return du, dv, dh


def _viscous(U, V, u, v, nu, rdx, rdy):
    """The viscous tendencies ``nu lap(u)``, ``nu lap(v)`` from the padded velocities (five points)."""
    ny, nx = u.shape
    rdx2, rdy2 = rdx * rdx, rdy * rdy
    viscous_u = nu * ((_window(U, 0, ny, -1, nx - 1) + _window(U, 0, ny, 1, nx + 1) - 2 * u) * rdx2
                      + (_window(U, -1, ny - 1, 0, nx) + _window(U, 1, ny + 1, 0, nx) - 2 * u) * rdy2)
    viscous_v = nu * ((_window(V, 0, ny, -1, nx - 1) + _window(V, 0, ny, 1, nx + 1) - 2 * v) * rdx2
                      + (_window(V, -1, ny - 1, 0, nx) + _window(V, 1, ny + 1, 0, nx) - 2 * v) * rdy2)
    return viscous_u, viscous_v


def viscous_energy_tendency(u, v, h, nu, rdx, rdy, bc_x, bc_s, bc_n):
    """Per cell, the rate at which the viscous terms change the discrete energy (float64, (ny, nx)).

    ``h_u u nu lap(u) + h_v v nu lap(v)`` at the cell's west and south
    faces: the derivatives of the energy the diagnostics sum,
    ``(h_u u^2 + h_v v^2) / 2`` with ``h_u``, ``h_v`` the mean depths of
    the cells beside each face (the mass fluxes' depths), times the viscous
    tendencies of :func:`shallow_water_tendency` (its operator and its
    boundary rules, a wall's normal velocity held at zero). Summed over the
    cells and times the cell area, it is ``dE/dt`` of the viscous term
    (m**5/s**3); the other terms of the scheme leave the energy unchanged
    (Arakawa and Lamb 1981). Computed in float64 from the fields.
    """
    xp = _xp(h)
    u, v, h = (xp.asarray(a, dtype=np.float64) for a in (u, v, h))
    ny, nx = h.shape
    U = pad(u, bc_x, bc_s, bc_n, normal="x")
    V = pad(v, bc_x, bc_s, bc_n, normal="y")
    H = pad(h, bc_x, bc_s, bc_n)
    viscous_u, viscous_v = _viscous(U, V, u, v, nu, rdx, rdy)
    if bc_x == WALL:
        viscous_u[:, 0] = 0
    if bc_s == WALL:
        viscous_v[0, :] = 0
    h_u = 0.5 * (_window(H, 0, ny, -1, nx - 1) + h)
    h_v = 0.5 * (_window(H, -1, ny - 1, 0, nx) + h)
    return h_u * u * viscous_u + h_v * v * viscous_v


def shallow_water_stage(u0, v0, h0, u, v, h, u_out, v_out, h_out,
                        f_corner, g, rdx, rdy, nu, a, b, c, bc_x, bc_s, bc_n, cols=None):
    """One fused Runge-Kutta stage: ``out = a*state0 + b*state + c*tendency(state)``.

    ``a`` is 0 or ``1 - b`` (a convex combination, as in every SSP Runge-Kutta
    method), and the combination is evaluated as ``state0 + b*(state -
    state0)``: written as ``a*x0 + b*x``, float32 rounds RK3's ``1/3 + 2/3``
    to ``1 + 3e-8`` and the mass drifts by that much per step. With
    ``a == 0`` the ``*0`` arrays are not read. ``c`` carries the time step.
    ``cols = (lo, hi)`` (the column window) steps only those columns, as if
    they were the whole grid (``bc_x`` at their edges: ``OPEN`` where a
    partition's frame continues beyond them); the other columns are neither
    read nor written. Every backend takes the same window.
    """
    if cols is not None:
        window = (slice(None), slice(*cols))
        u0, v0, h0, u, v, h, u_out, v_out, h_out = (
            x[window] for x in (u0, v0, h0, u, v, h, u_out, v_out, h_out))
    du, dv, dh = shallow_water_tendency(u, v, h, f_corner, g, rdx, rdy, nu, bc_x, bc_s, bc_n)
    for out, x0, x, dx in ((u_out, u0, u, du), (v_out, v0, v, dv), (h_out, h0, h, dh)):
        if a == 0:
            out[...] = b * x + c * dx
        else:
            out[...] = x0 + b * (x - x0) + c * dx
