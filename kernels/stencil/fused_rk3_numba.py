"""A whole SSP-RK3 shallow-water step in one sweep over the grid (Numba, CPU).

Three stage calls read the state and write a stage three times over: per
point and step, 27 array streams to memory (each stage reads the step's
start state and its input, and writes its output, three fields each). Here
the three stages run as a pipeline down the rows instead. Each stage is the
same row sweep as :func:`._numba._stage_kernel` (padded input rows, potential
vorticity, fluxes, output row ``r - 1``), and its output rows go into a ring
of a few rows that the next stage reads while they are still in cache. Per
point and step, memory then sees the start state read once and the result
written once (6 streams), so two processes or threads sharing the memory bus
slow each other far less, and the step is bound by arithmetic.

Every output point is computed by exactly the operations of three
``shallow_water_stage`` calls, so results are bitwise the same:

- rows beyond a wall or an open edge are taken from the stage output the
  unfused kernel would read there (the nearest row, or zero for the normal
  velocity beyond a wall);
- on a periodic axis a stage computes rows beyond the grid from wrapped
  inputs, which are the rows it would have computed at the other side;
- at an open edge each stage only computes the rows its output is valid on
  (2 fewer rows south and 1 fewer north per stage), as the stage-wise
  stepper does; output rows within 6 south / 3 north of an open edge are
  not valid (and partly not written);
- a column window (``cols``) is stepped as if it were the whole grid, by
  all three stages: the caller shrinks it between steps (by 6 columns west
  and 3 east at open sides), a few columns more work than shrinking it
  stage by stage as the rows do, for rings of one width.

Threads take blocks of output rows; each block recomputes the few stage-1
and stage-2 rows it shares with its neighbours (9 rows per block).
"""

import numba
import numpy as np
from numba import njit, prange

from hpcgpu.kernels.fpenv import flush_subnormals, restore_fp_mode
from hpcgpu.kernels.stencil.boundary import OPEN, PERIODIC, WALL
from hpcgpu.kernels.stencil.rows_numba import (
    _OPTS,
    GHOST,
    _emit_row,
    _load_padded,
    _load_rows,
    _neighbour_row,
    _source_row,
    _sweep_row,
    stage_rings,
)

__all__ = ["shallow_water_rk3_step"]

RING = 4
"""Stage output rows kept per field (a stage reads at most 2 rows behind)."""


@njit(**_OPTS)
def _ring_source(ring, r, ny, bc_s, bc_n, normal_y, zero_row):
    """The ring row holding the stage output that logical row ``r`` reads."""
    if bc_s == PERIODIC:
        return ring[r % RING]
    rr = _source_row(r, ny, bc_s, bc_n)
    if rr < 0:
        if normal_y:
            return zero_row
        rr = _neighbour_row(r, ny, bc_s, bc_n)
    return ring[rr % RING]


@njit(**_OPTS)
def _load_ring_rows(r, src_h, src_u, src_v, ny, h_ring, u_ring, v_ring, bc_x, bc_s, bc_n, zero_row):
    """Logical row ``r`` of the previous stage's output rings into this stage's padded input ring."""
    _load_padded(_ring_source(src_h, r, ny, bc_s, bc_n, False, zero_row),
                 _ring_source(src_u, r, ny, bc_s, bc_n, False, zero_row),
                 _ring_source(src_v, r, ny, bc_s, bc_n, True, zero_row),
                 h_ring[r % 4], u_ring[r % 4], v_ring[r % 4], bc_x)


@njit(**_OPTS)
def _needed_row(r, ny, periodic):
    """The stage output row that loading logical row ``r`` waits for."""
    if periodic:
        return r
    return min(max(r, 0), ny - 1)


@njit(**_OPTS)
def _stage_bounds(k, ny, bc_s, bc_n):
    """Rows ``[lo, hi)`` that stage ``k`` (0, 1, 2) outputs: all rows, less
    the rows an open edge has made invalid for the stages before it."""
    lo = 2 * k if bc_s == OPEN else 0
    hi = ny - k if bc_n == OPEN else ny
    return lo, hi


@njit(parallel=True, **_OPTS)
def _rk3_kernel(u0, v0, h0, u_out, v_out, h_out, f_corner, g, rdx, rdy, nu,
                b1, c1, b2, c2, b3, c3, bc_x, bc_s, bc_n, half, quarter, c24, c_eps, c_phi,
                n_chunks, failed, col0, col1):
    # only columns col0:col1 are read and written, as if they were the whole grid
    ny = h0.shape[0]
    nx = col1 - col0
    width = nx + 2 * GHOST
    rdx2 = rdx * rdx
    rdy2 = rdy * rdy
    periodic = bc_s == PERIODIC
    lo0, hi0 = _stage_bounds(0, ny, bc_s, bc_n)
    lo1, hi1 = _stage_bounds(1, ny, bc_s, bc_n)
    lo2, hi2 = _stage_bounds(2, ny, bc_s, bc_n)
    for chunk in prange(n_chunks):
        fp_mode = flush_subnormals()
        # stage 3 rows of this block, and the stage 2 and 1 rows they need
        a3 = lo2 + chunk * (hi2 - lo2) // n_chunks
        e3 = lo2 + (chunk + 1) * (hi2 - lo2) // n_chunks
        a2, e2 = a3 - 2, e3 + 1
        if not periodic:
            a2, e2 = max(a2, lo1), min(e2, hi1)
        a1, e1 = a2 - 2, e2 + 1
        if not periodic:
            a1, e1 = max(a1, lo0), min(e1, hi0)
        h1, u1, v1, q1, vf1, uf1, bern1 = stage_rings(width, h0)
        h2, u2, v2, q2, vf2, uf2, bern2 = stage_rings(width, h0)
        h3, u3, v3, q3, vf3, uf3, bern3 = stage_rings(width, h0)
        out1_u = np.zeros((RING, nx), h0.dtype)
        out1_v = np.zeros((RING, nx), h0.dtype)
        out1_h = np.zeros((RING, nx), h0.dtype)
        out2_u = np.zeros((RING, nx), h0.dtype)
        out2_v = np.zeros((RING, nx), h0.dtype)
        out2_h = np.zeros((RING, nx), h0.dtype)
        zero_row = np.zeros(nx, h0.dtype)
        # next row each stage loads; last output row of stages 1 and 2
        r1, r2, r3 = a1 - 2, a2 - 2, a3 - 2
        done1, done2 = a1 - 1, a2 - 1
        while r3 <= e3:
            # The latest stage that can go goes: stage outputs are read from
            # their rings before they are overwritten.
            if _needed_row(r3, ny, periodic) <= done2:
                _load_ring_rows(r3, out2_h, out2_u, out2_v, ny, h3, u3, v3, bc_x, bc_s, bc_n, zero_row)
                _sweep_row(r3, h3, u3, v3, q3, vf3, uf3, bern3, f_corner, g, rdx, rdy, half, quarter, bc_s)
                jo = r3 - 1
                if jo >= a3:
                    window = slice(col0, col1)
                    _emit_row(r3, u3, v3, h3, q3, vf3, uf3, bern3, u0[jo, window], v0[jo, window], h0[jo, window],
                              u_out[jo, window], v_out[jo, window], h_out[jo, window],
                              rdx, rdy, rdx2, rdy2, nu, b3, c3, c24, c_eps, c_phi, bc_x, bc_s == WALL and jo == 0)
                r3 += 1
            elif r2 <= e2 and _needed_row(r2, ny, periodic) <= done1:
                _load_ring_rows(r2, out1_h, out1_u, out1_v, ny, h2, u2, v2, bc_x, bc_s, bc_n, zero_row)
                _sweep_row(r2, h2, u2, v2, q2, vf2, uf2, bern2, f_corner, g, rdx, rdy, half, quarter, bc_s)
                jo = r2 - 1
                if jo >= a2:
                    j0 = jo % ny
                    slot = jo % RING
                    window = slice(col0, col1)
                    _emit_row(r2, u2, v2, h2, q2, vf2, uf2, bern2, u0[j0, window], v0[j0, window], h0[j0, window],
                              out2_u[slot], out2_v[slot], out2_h[slot], rdx, rdy, rdx2, rdy2, nu, b2, c2,
                              c24, c_eps, c_phi, bc_x, bc_s == WALL and jo == 0)
                    done2 = jo
                r2 += 1
            elif r1 <= e1:
                _load_rows(r1, h0, u0, v0, h1[r1 % 4], u1[r1 % 4], v1[r1 % 4], bc_x, bc_s, bc_n, zero_row,
                           col0, col1)
                _sweep_row(r1, h1, u1, v1, q1, vf1, uf1, bern1, f_corner, g, rdx, rdy, half, quarter, bc_s)
                jo = r1 - 1
                if jo >= a1:
                    slot = jo % RING
                    # stage 1 has no base state (a = 0): zeros, as in the stage kernel
                    _emit_row(r1, u1, v1, h1, q1, vf1, uf1, bern1, zero_row, zero_row, zero_row,
                              out1_u[slot], out1_v[slot], out1_h[slot], rdx, rdy, rdx2, rdy2, nu, b1, c1,
                              c24, c_eps, c_phi, bc_x, bc_s == WALL and jo == 0)
                    done1 = jo
                r1 += 1
            else:  # pragma: no cover - the row bounds above make this unreachable
                failed[chunk] = 1
                break
        restore_fp_mode(fp_mode)


def _chunks(rows):
    """Row blocks per call: one or two per thread, each >= 16 rows, so the
    9 recomputed rows per block stay a small overhead."""
    return max(1, min(rows // 16, 2 * numba.get_num_threads()))


def shallow_water_rk3_step(u0, v0, h0, u_out, v_out, h_out, f_corner, g, rdx, rdy, nu, dt, stages,
                           bc_x, bc_s, bc_n, cols=None):
    """One SSP-RK3 step from ``(u0, v0, h0)`` into ``(u_out, v_out, h_out)``.

    ``stages`` are the ``(a, b, c)`` of :data:`hpcgpu.kernels.stencil.SSP_RK3_STAGES`
    (the first must have ``a = 0``, the others ``a = 1 - b``). The outputs
    must not overlap the inputs. Bitwise equal to three
    ``shallow_water_stage`` calls; see the module docstring. ``cols = (lo,
    hi)`` steps only those columns, all three stages of them, as if they
    were the whole grid (``bc_x`` at their edges); the others are neither
    read nor written.
    """
    t = h0.dtype.type
    (a1, b1, c1), (_, b2, c2), (_, b3, c3) = stages
    if a1 != 0:
        raise ValueError(f"the first stage of the fused step must have a = 0; got {a1}")
    ny = h0.shape[0]
    col0, col1 = (0, h0.shape[1]) if cols is None else cols
    lo, hi = _stage_bounds(2, ny, bc_s, bc_n)
    if hi <= lo:
        return
    failed = np.zeros(_chunks(hi - lo), np.int64)
    _rk3_kernel(u0, v0, h0, u_out, v_out, h_out, f_corner, t(g), t(rdx), t(rdy), t(nu),
                t(b1), t(c1 * dt), t(b2), t(c2 * dt), t(b3), t(c3 * dt), bc_x, bc_s, bc_n,
                t(0.5), t(0.25), t(1.0 / 24.0), t(rdx / (24.0 * rdy)), t(rdy / (24.0 * rdx)),
                len(failed), failed, int(col0), int(col1))
    if failed.any():
        raise RuntimeError("internal error: the fused RK3 pipeline stalled; please report this grid shape")
