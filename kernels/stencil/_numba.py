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

The row functions live in :mod:`.rows_numba`, below this file and the
kernels that pipeline several stages or steps per sweep
(:mod:`.fused_rk3_numba`, :mod:`.diffusion_numba`), whose entry points this
file exports.
"""

import numba
import numpy as np
from numba import njit, prange

from hpcgpu.kernels.fpenv import flush_subnormals, restore_fp_mode
from hpcgpu.kernels.threads import adaptive_threads
from hpcgpu.kernels.stencil.boundary import WALL
from hpcgpu.kernels.stencil.diffusion_numba import diffuse_steps, tuned_steps_per_sweep
from hpcgpu.kernels.stencil.fused_rk3_numba import shallow_water_rk3_step as _fused_rk3_step
from hpcgpu.kernels.stencil.rows_numba import (
    _OPTS,
    GHOST,
    _edge_neighbours,
    _emit_row,
    _load_rows,
    _row_or_fixed,
    _sweep_row,
    diffuse_row,
    laplacian_5pt,
    scalar_row,
    stage_rings,
)


@njit(parallel=True, **_OPTS)
def _stage_kernel(u0, v0, h0, u, v, h, u_out, v_out, h_out, f_corner,
                  g, rdx, rdy, nu, a, b, c, bc_x, bc_s, bc_n,
                  half, quarter, c24, c_eps, c_phi, n_chunks, col0, col1):
    # only columns col0:col1 are read and written, as if they were the whole grid
    ny = h.shape[0]
    nx = col1 - col0
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
            _load_rows(r, h, u, v, h_ring[r % 4], u_ring[r % 4], v_ring[r % 4], bc_x, bc_s, bc_n, zero_row,
                       col0, col1)
            _sweep_row(r, h_ring, u_ring, v_ring, q_ring, vf_ring, uf_ring, bern_ring, f_corner, g, rdx, rdy,
                       half, quarter, bc_s)
            jo = r - 1
            if jo < j0:
                continue
            if use_base:
                u0_r, v0_r, h0_r = u0[jo, col0:col1], v0[jo, col0:col1], h0[jo, col0:col1]
            else:
                u0_r = v0_r = h0_r = zero_row
            _emit_row(r, u_ring, v_ring, h_ring, q_ring, vf_ring, uf_ring, bern_ring,
                      u0_r, v0_r, h0_r, u_out[jo, col0:col1], v_out[jo, col0:col1], h_out[jo, col0:col1],
                      rdx, rdy, rdx2, rdy2, nu, b, c, c24, c_eps, c_phi, bc_x, bc_s == WALL and jo == 0)
        restore_fp_mode(fp_mode)


def _chunks(rows):
    """Row blocks per call: a few per thread for balance, each >= 8 rows so
    the two rows of pipeline start-up stay a small overhead."""
    return max(1, min(rows // 8, 4 * numba.get_num_threads()))


def _window_shape(field, cols):
    """The ``(rows, columns)`` a call steps: its work size for :func:`adaptive_threads`."""
    return field.shape[0], field.shape[1] if cols is None else cols[1] - cols[0]


@adaptive_threads(key=lambda *args, cols=None: _window_shape(args[5], cols))
def shallow_water_stage(u0, v0, h0, u, v, h, u_out, v_out, h_out,
                        f_corner, g, rdx, rdy, nu, a, b, c, bc_x, bc_s, bc_n, cols=None):
    """Fused RK stage ``out = a*state0 + b*state + c*tendency(state)``; see ``_numpy``.

    ``cols = (lo, hi)`` steps only those columns, as if they were the whole
    grid (``bc_x`` at their edges); the others are neither read nor written.
    """
    t = h.dtype.type
    col0, col1 = (0, h.shape[1]) if cols is None else cols
    _stage_kernel(u0, v0, h0, u, v, h, u_out, v_out, h_out, f_corner,
                  t(g), t(rdx), t(rdy), t(nu), t(a), t(b), t(c), bc_x, bc_s, bc_n,
                  t(0.5), t(0.25), t(1.0 / 24.0), t(rdx / (24.0 * rdy)), t(rdy / (24.0 * rdx)),
                  _chunks(h.shape[0]), int(col0), int(col1))


def shallow_water_tendency(u, v, h, f_corner, g, rdx, rdy, nu, bc_x, bc_s, bc_n):
    """Tendencies ``(du, dv, dh)``; see ``_numpy.shallow_water_tendency``."""
    du, dv, dh = (np.empty_like(x) for x in (u, v, h))
    shallow_water_stage(u, v, h, u, v, h, du, dv, dh, f_corner, g, rdx, rdy, nu,
                        0.0, 0.0, 1.0, bc_x, bc_s, bc_n)
    return du, dv, dh




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
    t = field.dtype.type
    src, dst = field, work
    per_sweep = tuned_steps_per_sweep(field.shape[1], field.dtype.itemsize)
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


@adaptive_threads(key=lambda *args, cols=None: _window_shape(args[0], cols))
def shallow_water_rk3_step(*args, cols=None):
    """One whole SSP-RK3 step in one sweep; see ``fused_rk3_numba.shallow_water_rk3_step``."""
    return _fused_rk3_step(*args, cols=cols)
