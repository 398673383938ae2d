"""Stencil kernels for the CPU with ``numba.njit(parallel=True)``.

The shallow-water stage is one fused pass: each thread sweeps a block of rows
and keeps the intermediate rows it needs (potential vorticity, mass fluxes,
Bernoulli potential, Arakawa-Lamb coefficients) in small ring buffers that
stay in cache, so memory traffic is one read of each input and one write of
each output. Rows are copied into padded buffers with ghost columns so that
the inner loops have no boundary branches and vectorise.
"""

import numba
import numpy as np
from numba import njit, prange

from hpcgpu.kernels.stencil import _physics
from hpcgpu.kernels.stencil._boundary import PERIODIC, WALL

# contract: allow fused multiply-add; no other fast-math (NaN checks must work).
# Inner loops are written ``for i in range(n): k = i + offset``: with Numba
# 0.6x, ``range(start, stop)`` with start > 1 kept LLVM from vectorising
# (measured 8x slower on the same loop body).
_OPTS = dict(cache=True, fastmath={"contract"}, error_model="numpy")
GHOST = 2

potential_vorticity = njit(**_OPTS)(_physics.potential_vorticity)
al_alpha = njit(**_OPTS)(_physics.al_alpha)
al_beta = njit(**_OPTS)(_physics.al_beta)
al_epsilon = njit(**_OPTS)(_physics.al_epsilon)
al_phi = njit(**_OPTS)(_physics.al_phi)
mass_flux = njit(**_OPTS)(_physics.mass_flux)
bernoulli = njit(**_OPTS)(_physics.bernoulli)
u_vortex_force = njit(**_OPTS)(_physics.u_vortex_force)
v_vortex_force = njit(**_OPTS)(_physics.v_vortex_force)
laplacian_5pt = njit(**_OPTS)(_physics.laplacian_5pt)
diffusion_update = njit(**_OPTS)(_physics.diffusion_update)


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
def _load_row(src, r, buf, bc_x, bc_s, bc_n, normal_x, normal_y):
    """Copy logical row ``r`` of ``src`` into ``buf`` with GHOST columns each side."""
    ny, nx = src.shape
    rr = _source_row(r, ny, bc_s, bc_n)
    if rr < 0:
        if normal_y:
            buf[:] = 0
            return
        rr = _neighbour_row(r, ny, bc_s, bc_n)
    for i in range(nx):
        buf[i + GHOST] = src[rr, i]
    for k in range(GHOST):
        if bc_x == PERIODIC:
            buf[k] = src[rr, nx - GHOST + k]
            buf[nx + GHOST + k] = src[rr, k]
        elif normal_x and bc_x == WALL:
            buf[k] = 0
            buf[nx + GHOST + k] = 0
        else:
            buf[k] = src[rr, 0]
            buf[nx + GHOST + k] = src[rr, nx - 1]


@njit(**_OPTS)
def _coriolis_row(f_corner, r, bc_s):
    ny = f_corner.shape[0] - 1
    if bc_s == PERIODIC:
        return f_corner[r % ny]
    return f_corner[min(max(r, 0), ny)]


@njit(parallel=True, **_OPTS)
def _stage_kernel(u0, v0, h0, u, v, h, u_out, v_out, h_out, f_corner,
                  g, rdx, rdy, nu, a, b, c, bc_x, bc_s, bc_n,
                  half, quarter, c24, c_eps, c_phi, n_chunks):
    ny, nx = h.shape
    width = nx + 2 * GHOST
    rdx2 = rdx * rdx
    rdy2 = rdy * rdy
    use_base = a != 0
    use_viscosity = nu != 0
    for chunk in prange(n_chunks):
        j0 = chunk * ny // n_chunks
        j1 = (chunk + 1) * ny // n_chunks
        h_ring = np.zeros((4, width), h.dtype)
        u_ring = np.zeros((4, width), h.dtype)
        v_ring = np.zeros((4, width), h.dtype)
        q_ring = np.zeros((3, width), h.dtype)
        vf_ring = np.zeros((3, width), h.dtype)
        uf_ring = np.zeros((2, width), h.dtype)
        bern_ring = np.zeros((2, width), h.dtype)
        alpha_ring = np.zeros((2, width), h.dtype)
        beta_ring = np.zeros((2, width), h.dtype)
        phi_ring = np.zeros((2, width), h.dtype)
        eps_row = np.zeros(width, h.dtype)
        du = np.zeros(width, h.dtype)
        dv = np.zeros(width, h.dtype)
        dh = np.zeros(width, h.dtype)
        for r in range(j0 - 2, j1 + 1):
            h_r = h_ring[r % 4]
            u_r = u_ring[r % 4]
            v_r = v_ring[r % 4]
            _load_row(h, r, h_r, bc_x, bc_s, bc_n, False, False)
            _load_row(u, r, u_r, bc_x, bc_s, bc_n, True, False)
            _load_row(v, r, v_r, bc_x, bc_s, bc_n, False, True)
            h_m = h_ring[(r - 1) % 4]
            u_m = u_ring[(r - 1) % 4]
            v_m = v_ring[(r - 1) % 4]

            # Corner row r: potential vorticity; face row r: meridional flux.
            q_r = q_ring[r % 3]
            f_r = _coriolis_row(f_corner, r, bc_s)
            for i in range(width - 1):
                k = i + 1
                q_r[k] = potential_vorticity(f_r, h_m[k - 1], h_m[k], h_r[k - 1], h_r[k],
                                             u_m[k], u_r[k], v_r[k - 1], v_r[k], rdx, rdy, quarter)
            vf_r = vf_ring[r % 3]
            for k in range(width):
                vf_r[k] = mass_flux(h_m[k], h_r[k], v_r[k], half)

            # Cell row r-1: zonal flux, Bernoulli potential, AL coefficients.
            uf_m = uf_ring[(r - 1) % 2]
            for i in range(width - 1):
                k = i + 1
                uf_m[k] = mass_flux(h_m[k - 1], h_m[k], u_m[k], half)
            bern_m = bern_ring[(r - 1) % 2]
            for k in range(width - 1):
                bern_m[k] = bernoulli(g, h_m[k], u_m[k], u_m[k + 1], v_m[k], v_r[k], quarter)
            q_m = q_ring[(r - 1) % 3]
            alpha_m = alpha_ring[(r - 1) % 2]
            beta_m = beta_ring[(r - 1) % 2]
            phi_m = phi_ring[(r - 1) % 2]
            for i in range(width - 2):
                k = i + 1
                alpha_m[k] = al_alpha(q_m[k], q_m[k + 1], q_r[k], q_r[k + 1], c24)
                beta_m[k] = al_beta(q_m[k], q_m[k + 1], q_r[k], q_r[k + 1], c24)
                phi_m[k] = al_phi(q_m[k], q_m[k + 1], q_r[k], q_r[k + 1], c_phi)
                eps_row[k] = al_epsilon(q_m[k], q_m[k + 1], q_r[k], q_r[k + 1], c_eps)

            jo = r - 1
            if jo < j0:
                continue
            # Output row jo = r - 1 from rows jo-1 (suffix s), jo (m) and jo+1 (r).
            vf_s = vf_ring[(r - 2) % 3]
            vf_m = vf_ring[(r - 1) % 3]
            uf_s = uf_ring[(r - 2) % 2]
            bern_s = bern_ring[(r - 2) % 2]
            alpha_s = alpha_ring[(r - 2) % 2]
            beta_s = beta_ring[(r - 2) % 2]
            phi_s = phi_ring[(r - 2) % 2]
            u_s = u_ring[(r - 2) % 4]
            v_s = v_ring[(r - 2) % 4]
            for i in range(nx):
                k = i + GHOST
                du[k] = (u_vortex_force(alpha_m[k], beta_m[k - 1], alpha_m[k - 1], beta_m[k],
                                        eps_row[k], eps_row[k - 1],
                                        vf_r[k], vf_r[k - 1], vf_m[k - 1], vf_m[k],
                                        uf_m[k + 1], uf_m[k - 1])
                         - (bern_m[k] - bern_m[k - 1]) * rdx)
                dv[k] = (v_vortex_force(alpha_s[k], beta_s[k], alpha_m[k], beta_m[k],
                                        phi_m[k], phi_s[k],
                                        uf_s[k], uf_s[k + 1], uf_m[k + 1], uf_m[k],
                                        vf_r[k], vf_s[k])
                         - (bern_m[k] - bern_s[k]) * rdy)
                dh[k] = -((uf_m[k + 1] - uf_m[k]) * rdx + (vf_r[k] - vf_m[k]) * rdy)
            if use_viscosity:
                for i in range(nx):
                    k = i + GHOST
                    du[k] += nu * laplacian_5pt(u_m[k], u_m[k - 1], u_m[k + 1], u_s[k], u_r[k], rdx2, rdy2)
                    dv[k] += nu * laplacian_5pt(v_m[k], v_m[k - 1], v_m[k + 1], v_s[k], v_r[k], rdx2, rdy2)
            if bc_x == WALL:
                du[GHOST] = 0
            if bc_s == WALL and jo == 0:
                dv[:] = 0
            if use_base:
                for i in range(nx):
                    # x0 + b (x - x0), not a x0 + b x: a + b rounds to 1 + 3e-8 in
                    # float32 for RK3's 1/3, 2/3, which would drift the mass.
                    u_out[jo, i] = u0[jo, i] + b * (u[jo, i] - u0[jo, i]) + c * du[i + GHOST]
                    v_out[jo, i] = v0[jo, i] + b * (v[jo, i] - v0[jo, i]) + c * dv[i + GHOST]
                    h_out[jo, i] = h0[jo, i] + b * (h[jo, i] - h0[jo, i]) + c * dh[i + GHOST]
            else:
                for i in range(nx):
                    u_out[jo, i] = b * u[jo, i] + c * du[i + GHOST]
                    v_out[jo, i] = b * v[jo, i] + c * dv[i + GHOST]
                    h_out[jo, i] = b * h[jo, i] + c * dh[i + GHOST]


def _chunks(rows):
    """Row blocks per call: a few per thread for balance, each >= 8 rows so
    the two rows of pipeline start-up stay a small overhead."""
    return max(1, min(rows // 8, 4 * numba.get_num_threads()))


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
def _column_neighbours(i, nx, bc_x):
    if bc_x == PERIODIC:
        return (i - 1) % nx, (i + 1) % nx
    return max(i - 1, 0), min(i + 1, nx - 1)


@njit(parallel=True, **_OPTS)
def _diffuse_kernel(src, dst, cx, cy, bc_x, bc_s, bc_n):
    ny, nx = src.shape
    for j in prange(ny):
        js = _neighbour_row(j - 1, ny, bc_s, bc_n)
        jn = _neighbour_row(j + 1, ny, bc_s, bc_n)
        row, south, north, out = src[j], src[js], src[jn], dst[j]
        for m in range(nx - 2):
            i = m + 1
            out[i] = diffusion_update(row[i], row[i - 1], row[i + 1], south[i], north[i], cx, cy)
        for i in (0, nx - 1):
            w, e = _column_neighbours(i, nx, bc_x)
            out[i] = diffusion_update(row[i], row[w], row[e], south[i], north[i], cx, cy)


def diffuse(field, work, cx, cy, steps, bc_x, bc_s, bc_n):
    """``steps`` explicit diffusion steps; returns the buffer holding the result."""
    t = field.dtype.type
    src, dst = field, work
    for _ in range(steps):
        _diffuse_kernel(src, dst, t(cx), t(cy), bc_x, bc_s, bc_n)
        src, dst = dst, src
    return src


@njit(parallel=True, **_OPTS)
def _laplacian_kernel(field, out, rdx2, rdy2, bc_x, bc_s, bc_n):
    ny, nx = field.shape
    for j in prange(ny):
        js = _neighbour_row(j - 1, ny, bc_s, bc_n)
        jn = _neighbour_row(j + 1, ny, bc_s, bc_n)
        row, south, north, dst = field[j], field[js], field[jn], out[j]
        for m in range(nx - 2):
            i = m + 1
            dst[i] = laplacian_5pt(row[i], row[i - 1], row[i + 1], south[i], north[i], rdx2, rdy2)
        for i in (0, nx - 1):
            w, e = _column_neighbours(i, nx, bc_x)
            dst[i] = laplacian_5pt(row[i], row[w], row[e], south[i], north[i], rdx2, rdy2)


def laplacian(field, out, rdx2, rdy2, bc_x, bc_s, bc_n):
    """Five-point Laplacian into ``out``; see ``_numpy.laplacian``."""
    t = field.dtype.type
    _laplacian_kernel(field, out, t(rdx2), t(rdy2), bc_x, bc_s, bc_n)
    return out
