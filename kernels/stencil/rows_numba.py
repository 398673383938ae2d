"""The row functions the Numba stencil kernels are built from (``njit``, CPU).

Shared by the backend file :mod:`._numba` (one stage or one diffusion step
per sweep) and by the kernels that pipeline several through cache-resident
rows (:mod:`.fused_rk3_numba`, :mod:`.diffusion_numba`), which therefore
build on this module, not on the backend file. The shallow-water part
loads input rows into padded ring buffers (ghost columns, so the inner
loops have no boundary branches and vectorise) and computes one output row
from them (see :mod:`._numba` for the two column passes); the diffusion
part is one step of one row.
"""

import numpy as np
from numba import njit

from hpcgpu.kernels.stencil import physics
from hpcgpu.kernels.stencil.boundary import DIRICHLET, PERIODIC, WALL

# contract: allow fused multiply-add; no other fast-math (NaN checks must work).
# Inner loops are written ``for i in range(n): k = i + offset``: with Numba
# 0.6x, ``range(start, stop)`` with start > 1 kept LLVM from vectorising
# (measured 8x slower on the same loop body).
_OPTS = dict(cache=True, nogil=True, fastmath={"contract"}, error_model="numpy")
GHOST = 2

potential_vorticity = njit(**_OPTS)(physics.potential_vorticity)
al_alpha = njit(**_OPTS)(physics.al_alpha)
al_beta = njit(**_OPTS)(physics.al_beta)
al_epsilon = njit(**_OPTS)(physics.al_epsilon)
al_phi = njit(**_OPTS)(physics.al_phi)
mass_flux = njit(**_OPTS)(physics.mass_flux)
bernoulli = njit(**_OPTS)(physics.bernoulli)
u_vortex_force = njit(**_OPTS)(physics.u_vortex_force)
v_vortex_force = njit(**_OPTS)(physics.v_vortex_force)
laplacian_5pt = njit(**_OPTS)(physics.laplacian_5pt)
diffusion_update = njit(**_OPTS)(physics.diffusion_update)


@njit(**_OPTS)
def _source_row(r, ny, bc_s, bc_n):
    """Stored row that logical row ``r`` reads; -1 if it lies beyond a wall."""
    if 0 <= r < ny:
        return r
    if bc_s == PERIODIC:
        return r % ny
    if (r < 0 and bc_s == WALL) or (r >= ny and bc_n == WALL):
        return -1
    return min(max(r, 0), ny - 1)


@njit(**_OPTS)
def _neighbour_row(r, ny, bc_s, bc_n):
    """Row index for a scalar neighbour: wrap if periodic, else clamp."""
    if 0 <= r < ny:
        return r
    if bc_s == PERIODIC:
        return r % ny
    return min(max(r, 0), ny - 1)


@njit(**_OPTS)
def _row_source(src, r, bc_s, bc_n, normal_y, zero_row, col0, col1):
    """Columns ``col0:col1`` of the stored row of ``src`` that logical row ``r``
    reads: ``zero_row`` for the normal velocity beyond a wall."""
    ny = src.shape[0]
    rr = _source_row(r, ny, bc_s, bc_n)
    if rr < 0:
        if normal_y:
            return zero_row
        rr = _neighbour_row(r, ny, bc_s, bc_n)
    return src[rr, col0:col1]


@njit(**_OPTS)
def _fill_ghosts(buf, bc_x, normal_x):
    """Set the GHOST columns on each side of a padded row from its interior."""
    nx = buf.shape[0] - 2 * GHOST
    for k in range(GHOST):
        if bc_x == PERIODIC:
            buf[k] = buf[nx + k]
            buf[nx + GHOST + k] = buf[GHOST + k]
        elif normal_x and bc_x == WALL:
            buf[k] = 0
            buf[nx + GHOST + k] = 0
        else:
            buf[k] = buf[GHOST]
            buf[nx + GHOST + k] = buf[nx + GHOST - 1]


@njit(**_OPTS)
def _load_padded(h_src, u_src, v_src, h_buf, u_buf, v_buf, bc_x):
    """Copy one row of h, u and v into padded rows with GHOST columns each
    side. One loop for the three keeps three reads from memory in flight: a
    row at a time made the stage 5-10% slower."""
    for i in range(h_src.shape[0]):
        k = i + GHOST
        h_buf[k] = h_src[i]
        u_buf[k] = u_src[i]
        v_buf[k] = v_src[i]
    _fill_ghosts(h_buf, bc_x, False)
    _fill_ghosts(u_buf, bc_x, True)
    _fill_ghosts(v_buf, bc_x, False)


@njit(**_OPTS)
def _load_rows(r, h, u, v, h_buf, u_buf, v_buf, bc_x, bc_s, bc_n, zero_row, col0, col1):
    """Columns ``col0:col1`` (the column window) of logical row ``r`` of the 2-D
    fields h, u and v into padded rows; the ghost columns follow ``bc_x`` at
    the window's edges."""
    _load_padded(_row_source(h, r, bc_s, bc_n, False, zero_row, col0, col1),
                 _row_source(u, r, bc_s, bc_n, False, zero_row, col0, col1),
                 _row_source(v, r, bc_s, bc_n, True, zero_row, col0, col1), h_buf, u_buf, v_buf, bc_x)


@njit(**_OPTS)
def _coriolis_row(f_corner, r, bc_s):
    ny = f_corner.shape[0] - 1
    if bc_s == PERIODIC:
        return f_corner[r % ny]
    return f_corner[min(max(r, 0), ny)]


@njit(**_OPTS)
def _output_row(r, u_ring, v_ring, h_ring, q_ring, vf_ring, uf_ring, bern_ring,
                u0_r, v0_r, h0_r, u_o, v_o, h_o,
                rdx, rdy, rdx2, rdy2, nu, b, c, c24, c_eps, c_phi, viscous):
    """Cell row r-1 of ``out = x0 + b (x - x0) + c tendency`` from the rings,
    which hold rows up to r.

    ``viscous`` comes as a literal ``True`` or ``False``, so Numba compiles one
    loop with and one without viscosity: a run-time flag left a branch and
    masked loads in the vectorised loop.
    """
    u_s, u_m, u_r = u_ring[(r - 2) % 4], u_ring[(r - 1) % 4], u_ring[r % 4]
    v_s, v_m, v_r = v_ring[(r - 2) % 4], v_ring[(r - 1) % 4], v_ring[r % 4]
    h_m = h_ring[(r - 1) % 4]
    q_s, q_m, q_r = q_ring[(r - 2) % 3], q_ring[(r - 1) % 3], q_ring[r % 3]
    vf_s, vf_m, vf_r = vf_ring[(r - 2) % 3], vf_ring[(r - 1) % 3], vf_ring[r % 3]
    uf_s, uf_m = uf_ring[(r - 2) % 2], uf_ring[(r - 1) % 2]
    bern_s, bern_m = bern_ring[(r - 2) % 2], bern_ring[(r - 1) % 2]
    # The west neighbour's coefficients are the previous column's: carried in
    # registers rather than recomputed.
    kw = GHOST - 1
    alpha_w = al_alpha(q_m[kw], q_m[kw + 1], q_r[kw], q_r[kw + 1], c24)
    beta_w = al_beta(q_m[kw], q_m[kw + 1], q_r[kw], q_r[kw + 1], c24)
    eps_w = al_epsilon(q_m[kw], q_m[kw + 1], q_r[kw], q_r[kw + 1], c_eps)
    for i in range(u_o.shape[0]):
        k = i + GHOST
        # Coefficients of this cell and of its south neighbour from the corner
        # values: recomputing them costs less than a pass that stores them in
        # rings and the extra streams this loop would then read.
        alpha = al_alpha(q_m[k], q_m[k + 1], q_r[k], q_r[k + 1], c24)
        beta = al_beta(q_m[k], q_m[k + 1], q_r[k], q_r[k + 1], c24)
        eps = al_epsilon(q_m[k], q_m[k + 1], q_r[k], q_r[k + 1], c_eps)
        phi = al_phi(q_m[k], q_m[k + 1], q_r[k], q_r[k + 1], c_phi)
        alpha_s = al_alpha(q_s[k], q_s[k + 1], q_m[k], q_m[k + 1], c24)
        beta_s = al_beta(q_s[k], q_s[k + 1], q_m[k], q_m[k + 1], c24)
        phi_s = al_phi(q_s[k], q_s[k + 1], q_m[k], q_m[k + 1], c_phi)
        du = (u_vortex_force(alpha, beta_w, alpha_w, beta, eps, eps_w,
                             vf_r[k], vf_r[k - 1], vf_m[k - 1], vf_m[k],
                             uf_m[k + 1], uf_m[k - 1])
              - (bern_m[k] - bern_m[k - 1]) * rdx)
        dv = (v_vortex_force(alpha_s, beta_s, alpha, beta, phi, phi_s,
                             uf_s[k], uf_s[k + 1], uf_m[k + 1], uf_m[k],
                             vf_r[k], vf_s[k])
              - (bern_m[k] - bern_s[k]) * rdy)
        dh = -((uf_m[k + 1] - uf_m[k]) * rdx + (vf_r[k] - vf_m[k]) * rdy)
        if viscous:
            du += nu * laplacian_5pt(u_m[k], u_m[k - 1], u_m[k + 1], u_s[k], u_r[k], rdx2, rdy2)
            dv += nu * laplacian_5pt(v_m[k], v_m[k - 1], v_m[k + 1], v_s[k], v_r[k], rdx2, rdy2)
        # x0 + b (x - x0), not a x0 + b x: a + b rounds to 1 + 3e-8 in
        # float32 for RK3's 1/3, 2/3, which would drift the mass.
        u_o[i] = u0_r[i] + b * (u_m[k] - u0_r[i]) + c * du
        v_o[i] = v0_r[i] + b * (v_m[k] - v0_r[i]) + c * dv
        h_o[i] = h0_r[i] + b * (h_m[k] - h0_r[i]) + c * dh
        alpha_w, beta_w, eps_w = alpha, beta, eps


@njit(**_OPTS)
def _sweep_row(r, h_ring, u_ring, v_ring, q_ring, vf_ring, uf_ring, bern_ring, f_corner, g, rdx, rdy,
               half, quarter, bc_s):
    """With padded input row ``r`` in the rings: potential vorticity on corner
    row r, meridional flux on face row r, zonal flux and Bernoulli potential
    on cell row r-1. One loop, and only columns 1..nx+2, which are all that
    the output rows read."""
    h_r, u_r, v_r = h_ring[r % 4], u_ring[r % 4], v_ring[r % 4]
    h_m, u_m, v_m = h_ring[(r - 1) % 4], u_ring[(r - 1) % 4], v_ring[(r - 1) % 4]
    q_r = q_ring[r % 3]
    vf_r = vf_ring[r % 3]
    uf_m = uf_ring[(r - 1) % 2]
    bern_m = bern_ring[(r - 1) % 2]
    f_r = _coriolis_row(f_corner, r, bc_s)
    for i in range(h_r.shape[0] - 2 * GHOST + 2):
        k = i + 1
        q_r[k] = potential_vorticity(f_r, h_m[k - 1], h_m[k], h_r[k - 1], h_r[k],
                                     u_m[k], u_r[k], v_r[k - 1], v_r[k], rdx, rdy, quarter)
        vf_r[k] = mass_flux(h_m[k], h_r[k], v_r[k], half)
        uf_m[k] = mass_flux(h_m[k - 1], h_m[k], u_m[k], half)
        bern_m[k] = bernoulli(g, h_m[k], u_m[k], u_m[k + 1], v_m[k], v_r[k], quarter)


@njit(**_OPTS)
def _emit_row(r, u_ring, v_ring, h_ring, q_ring, vf_ring, uf_ring, bern_ring,
              u0_r, v0_r, h0_r, u_o, v_o, h_o, rdx, rdy, rdx2, rdy2, nu, b, c, c24, c_eps, c_phi,
              bc_x, south_wall_row):
    """Output cell row r-1 (see ``_output_row``), then the wall rules: no
    tendency of the normal velocity at a wall."""
    if nu != 0:
        _output_row(r, u_ring, v_ring, h_ring, q_ring, vf_ring, uf_ring, bern_ring,
                    u0_r, v0_r, h0_r, u_o, v_o, h_o,
                    rdx, rdy, rdx2, rdy2, nu, b, c, c24, c_eps, c_phi, True)
    else:
        _output_row(r, u_ring, v_ring, h_ring, q_ring, vf_ring, uf_ring, bern_ring,
                    u0_r, v0_r, h0_r, u_o, v_o, h_o,
                    rdx, rdy, rdx2, rdy2, nu, b, c, c24, c_eps, c_phi, False)
    u_m, v_m = u_ring[(r - 1) % 4], v_ring[(r - 1) % 4]
    if bc_x == WALL:
        u_o[0] = u0_r[0] + b * (u_m[GHOST] - u0_r[0])
    if south_wall_row:
        for i in range(v_o.shape[0]):
            v_o[i] = v0_r[i] + b * (v_m[i + GHOST] - v0_r[i])


@njit(**_OPTS)
def stage_rings(width, dtype_like):
    """The rings one stage sweep keeps: h, u, v (4 padded rows), q, vf (3), uf, bern (2)."""
    dtype = dtype_like.dtype
    return (np.zeros((4, width), dtype), np.zeros((4, width), dtype), np.zeros((4, width), dtype),
            np.zeros((3, width), dtype), np.zeros((3, width), dtype), np.zeros((2, width), dtype),
            np.zeros((2, width), dtype))

@njit(**_OPTS)
def scalar_row(r, ny, bc_s, bc_n):
    """Stored row that logical row ``r`` of a scalar field reads: wrap if
    periodic, -1 beyond a Dirichlet edge (the fixed value), else clamp."""
    if 0 <= r < ny:
        return r
    if bc_s == PERIODIC:
        return r % ny
    if (r < 0 and bc_s == DIRICHLET) or (r >= ny and bc_n == DIRICHLET):
        return -1
    return min(max(r, 0), ny - 1)


@njit(inline="always", **_OPTS)  # in Numba's IR: as a call, choosing an array costs a reference count
def _row_or_fixed(field, r, fixed):
    """Row ``r`` of ``field``, or the row of boundary values ``fixed`` when ``r`` is -1."""
    if r < 0:
        return fixed
    return field[r]


@njit(**_OPTS)
def _edge_neighbours(row, bc_x, value):
    """The west neighbour of column 0 and the east neighbour of column nx-1."""
    nx = row.shape[0]
    if bc_x == PERIODIC:
        return row[nx - 1], row[0]
    if bc_x == DIRICHLET:
        return value, value
    return row[0], row[nx - 1]


@njit(**_OPTS)
def diffuse_row(row, south, north, out, cx, cy, bc_x, value):
    """One diffusion step of a row from its own and its two neighbour rows.

    The inner loop has no boundary branch (it vectorises); the two edge
    columns take their outer neighbour from ``_edge_neighbours``.
    """
    nx = row.shape[0]
    for m in range(nx - 2):
        i = m + 1
        out[i] = diffusion_update(row[i], row[i - 1], row[i + 1], south[i], north[i], cx, cy)
    west, east = _edge_neighbours(row, bc_x, value)
    last = nx - 1
    out[0] = diffusion_update(row[0], west, row[1], south[0], north[0], cx, cy)
    out[last] = diffusion_update(row[last], row[last - 1], east, south[last], north[last], cx, cy)
