"""Stencil kernels for the CPU with ``numba.njit(parallel=True)``.

The shallow-water stage is one fused sweep: each thread takes a block of rows
and keeps the intermediate rows it needs (input rows, potential vorticity,
mass fluxes, Bernoulli potential) in small ring buffers that stay in cache, so
memory traffic is one read of each input and one write of each output. Rows
are copied into padded buffers with ghost columns so that the inner loops have
no boundary branches and vectorise. After loading input row ``r``, two column
passes:

1. potential vorticity on corner row ``r``, meridional mass flux on face row
   ``r``, zonal mass flux and Bernoulli potential on cell row ``r - 1``;
2. ``_output_row``, cell row ``r - 1``: Arakawa-Lamb coefficients, tendencies,
   viscosity and the Runge-Kutta combination, written straight into the
   outputs.

On the CPU the stage is bound by arithmetic and cache traffic at least as much
as by memory, so there are few passes and rings: the Arakawa-Lamb coefficients,
for one, cost less recomputed where they are used than written to rings by a
pass of their own and read back.
"""

import numba
import numpy as np
from numba import njit, prange

from hpcgpu.kernels.fpenv import flush_subnormals, restore_fp_mode
from hpcgpu.kernels.threads import adaptive_threads
from hpcgpu.kernels.stencil import physics
from hpcgpu.kernels.stencil.boundary import DIRICHLET, PERIODIC, WALL

# contract: allow fused multiply-add; no other fast-math (NaN checks must work).
# Inner loops are written ``for i in range(n): k = i + offset``: with Numba
# 0.6x, ``range(start, stop)`` with start > 1 kept LLVM from vectorising
# (measured 8x slower on the same loop body).
_OPTS = dict(cache=True, fastmath={"contract"}, error_model="numpy")
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
def _row_source(src, r, bc_s, bc_n, normal_y, zero_row):
    """The stored row of ``src`` that logical row ``r`` reads: ``zero_row``
    for the normal velocity beyond a wall."""
    ny = src.shape[0]
    rr = _source_row(r, ny, bc_s, bc_n)
    if rr < 0:
        if normal_y:
            return zero_row
        rr = _neighbour_row(r, ny, bc_s, bc_n)
    return src[rr]


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
def _load_rows(r, h, u, v, h_buf, u_buf, v_buf, bc_x, bc_s, bc_n, zero_row):
    """Logical row ``r`` of the 2-D fields h, u and v into padded rows."""
    _load_padded(_row_source(h, r, bc_s, bc_n, False, zero_row), _row_source(u, r, bc_s, bc_n, False, zero_row),
                 _row_source(v, r, bc_s, bc_n, True, zero_row), h_buf, u_buf, v_buf, bc_x)


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


@njit(parallel=True, **_OPTS)
def _stage_kernel(u0, v0, h0, u, v, h, u_out, v_out, h_out, f_corner,
                  g, rdx, rdy, nu, a, b, c, bc_x, bc_s, bc_n,
                  half, quarter, c24, c_eps, c_phi, n_chunks):
    ny, nx = h.shape
    width = nx + 2 * GHOST
    rdx2 = rdx * rdx
    rdy2 = rdy * rdy
    use_base = a != 0
    for chunk in prange(n_chunks):
        fp_mode = flush_subnormals()  # subnormal float32 slows x86 many times over
        j0 = chunk * ny // n_chunks
        j1 = (chunk + 1) * ny // n_chunks
        h_ring, u_ring, v_ring, q_ring, vf_ring, uf_ring, bern_ring = stage_rings(width, h)
        # Zeros: the normal velocity beyond a wall, and x0 when a == 0
        # (x0 + b (x - x0) is then b x, and the *0 arrays are not read).
        zero_row = np.zeros(nx, h.dtype)
        for r in range(j0 - 2, j1 + 1):
            _load_rows(r, h, u, v, h_ring[r % 4], u_ring[r % 4], v_ring[r % 4], bc_x, bc_s, bc_n, zero_row)
            _sweep_row(r, h_ring, u_ring, v_ring, q_ring, vf_ring, uf_ring, bern_ring, f_corner, g, rdx, rdy,
                       half, quarter, bc_s)
            jo = r - 1
            if jo < j0:
                continue
            if use_base:
                u0_r, v0_r, h0_r = u0[jo], v0[jo], h0[jo]
            else:
                u0_r = v0_r = h0_r = zero_row
            _emit_row(r, u_ring, v_ring, h_ring, q_ring, vf_ring, uf_ring, bern_ring,
                      u0_r, v0_r, h0_r, u_out[jo], v_out[jo], h_out[jo], rdx, rdy, rdx2, rdy2, nu, b, c,
                      c24, c_eps, c_phi, bc_x, bc_s == WALL and jo == 0)
        restore_fp_mode(fp_mode)


def _chunks(rows):
    """Row blocks per call: a few per thread for balance, each >= 8 rows so
    the two rows of pipeline start-up stay a small overhead."""
    return max(1, min(rows // 8, 4 * numba.get_num_threads()))


@adaptive_threads(key=lambda *args: args[5].shape)
def shallow_water_stage(u0, v0, h0, u, v, h, u_out, v_out, h_out,
                        f_corner, g, rdx, rdy, nu, a, b, c, bc_x, bc_s, bc_n):
    """Fused RK stage ``out = a*state0 + b*state + c*tendency(state)``; see ``_numpy``."""
    t = h.dtype.type
    _stage_kernel(u0, v0, h0, u, v, h, u_out, v_out, h_out, f_corner,
                  t(g), t(rdx), t(rdy), t(nu), t(a), t(b), t(c), bc_x, bc_s, bc_n,
                  t(0.5), t(0.25), t(1.0 / 24.0), t(rdx / (24.0 * rdy)), t(rdy / (24.0 * rdx)),
                  _chunks(h.shape[0]))


def shallow_water_tendency(u, v, h, f_corner, g, rdx, rdy, nu, bc_x, bc_s, bc_n):
    """Tendencies ``(du, dv, dh)``; see ``_numpy.shallow_water_tendency``."""
    du, dv, dh = (np.empty_like(x) for x in (u, v, h))
    shallow_water_stage(u, v, h, u, v, h, du, dv, dh, f_corner, g, rdx, rdy, nu,
                        0.0, 0.0, 1.0, bc_x, bc_s, bc_n)
    return du, dv, dh


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


@njit(parallel=True, **_OPTS)
def _diffuse_kernel(src, dst, cx, cy, bc_x, bc_s, bc_n, value):
    ny, nx = src.shape
    fixed = np.full(nx, value, src.dtype)  # the row beyond a Dirichlet edge
    for j in prange(ny):
        fp_mode = flush_subnormals()
        south = _row_or_fixed(src, scalar_row(j - 1, ny, bc_s, bc_n), fixed)
        north = _row_or_fixed(src, scalar_row(j + 1, ny, bc_s, bc_n), fixed)
        diffuse_row(src[j], south, north, dst[j], cx, cy, bc_x, value)
        restore_fp_mode(fp_mode)


@adaptive_threads(key=lambda field, work, cx, cy, steps, *rest: (field.shape, steps))
def diffuse(field, work, cx, cy, steps, bc_x, bc_s, bc_n, value=0.0):
    """``steps`` explicit diffusion steps; returns the buffer holding the result.

    Several steps go in one sweep over memory (pipelined through
    cache-resident rows; bitwise the step-by-step result): see
    ``diffusion_numba``. Beyond a Dirichlet edge the field is ``value``.
    """
    # imported here: diffusion_numba builds on this module's diffuse_row
    from hpcgpu.kernels.stencil.diffusion_numba import diffuse_steps, steps_per_sweep

    t = field.dtype.type
    src, dst = field, work
    per_sweep = steps_per_sweep(field.shape[1], field.dtype.itemsize)
    done = 0
    while done < steps:
        chunk = min(per_sweep, steps - done)
        if chunk == 1:
            _diffuse_kernel(src, dst, t(cx), t(cy), bc_x, bc_s, bc_n, t(value))
        else:
            diffuse_steps(src, dst, t(cx), t(cy), chunk, bc_x, bc_s, bc_n, t(value))
        src, dst = dst, src
        done += chunk
    return src


@njit(parallel=True, **_OPTS)
def _laplacian_kernel(field, out, rdx2, rdy2, bc_x, bc_s, bc_n, value):
    ny, nx = field.shape
    fixed = np.full(nx, value, field.dtype)  # the row beyond a Dirichlet edge
    for j in prange(ny):
        fp_mode = flush_subnormals()
        row, dst = field[j], out[j]
        south = _row_or_fixed(field, scalar_row(j - 1, ny, bc_s, bc_n), fixed)
        north = _row_or_fixed(field, scalar_row(j + 1, ny, bc_s, bc_n), fixed)
        for m in range(nx - 2):
            i = m + 1
            dst[i] = laplacian_5pt(row[i], row[i - 1], row[i + 1], south[i], north[i], rdx2, rdy2)
        west, east = _edge_neighbours(row, bc_x, value)
        last = nx - 1
        dst[0] = laplacian_5pt(row[0], west, row[1], south[0], north[0], rdx2, rdy2)
        dst[last] = laplacian_5pt(row[last], row[last - 1], east, south[last], north[last], rdx2, rdy2)
        restore_fp_mode(fp_mode)


@adaptive_threads(key=lambda field, *rest: field.shape)
def laplacian(field, out, rdx2, rdy2, bc_x, bc_s, bc_n, value=0.0):
    """Five-point Laplacian into ``out``; see ``_numpy.laplacian``."""
    t = field.dtype.type
    _laplacian_kernel(field, out, t(rdx2), t(rdy2), bc_x, bc_s, bc_n, t(value))
    return out


@adaptive_threads(key=lambda *args: args[0].shape)
def shallow_water_rk3_step(*args):
    """One whole SSP-RK3 step in one sweep; see ``fused_rk3_numba.shallow_water_rk3_step``.

    (Imported on first use: ``fused_rk3_numba`` builds on this module's row functions.)
    """
    from hpcgpu.kernels.stencil.fused_rk3_numba import shallow_water_rk3_step as fused

    return fused(*args)
