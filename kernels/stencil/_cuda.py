"""Stencil kernels for NVIDIA GPUs with Numba-CUDA.

Arrays stay CuPy arrays, so CuPy and Numba share one memory pool; each call
wraps them for Numba without a host sync (wrappers cached per address, shape
and dtype: :mod:`..cuda_interop`) and launches on CuPy's current stream.
Numba's default import of a CuPy array synchronises the host with that
stream on every launch, which would serialise a loop of small kernels. Under
the CUDA simulator the arrays are NumPy arrays and pass through.

Every kernel gives each thread one column and a strip of ``rows`` rows, in
blocks of ``threads`` threads along x (a warp reads 32 neighbouring points
of a row, coalesced), and the thread walks its strip northwards:

- ``laplacian`` and ``diffuse`` load the whole strip first (``rows + 2``
  values of the thread's column, and the west and east neighbour of each row,
  which are L1 hits on lines the neighbouring threads load) into a local
  array that lives in registers, then compute and store it. Many loads in
  flight per thread is what lets a memory-bound kernel reach copy bandwidth;
  each point is read from DRAM once, plus two halo rows per strip.
- ``shallow_water_stage`` is one fused pass per Runge-Kutta stage that
  pipelines rows as ``_numba._stage_kernel`` does: at row ``r`` it computes
  the potential vorticity of corner row ``r`` (for corners ``i-1, i, i+1``),
  the mass fluxes, and the Bernoulli potential and Arakawa-Lamb coefficients
  of cell row ``r-1`` (cells ``i-1, i``), then writes output row ``r-1``;
  what later rows need is carried in scalar variables (registers). The
  thread's own column of row ``r+1`` is loaded one step ahead so that those
  DRAM loads are in flight during the compute; the neighbour columns are L1
  hits on lines the neighbouring threads loaded a step earlier. The RK base
  state ``u0, v0, h0`` is loaded just before the row's store: live through
  the row's compute it took the registers that now give float64 a block
  more per SM (121 registers on sm_90, 25 % occupancy, from 140 and 19 %;
  float32: 68, 44 %). Same operations, same fused multiply-adds: the same bits.

Ghost cells are index arithmetic (wrap or clamp) as in ``boundary``;
beyond a Dirichlet edge the five-point kernels use the boundary value
instead of a load. The per-point physics is ``physics``, compiled as
device functions in :mod:`.device_cuda` (with the wrap-or-clamp index
arithmetic), which this file and :mod:`.diffusion_cuda` share.
Numeric constants come in as arguments of the field's dtype: a float literal
would promote float32 arithmetic to float64. The launch shapes are
:data:`LAUNCH`, with alternatives in :data:`VARIANTS` that
``scripts/gpu_kernel_variants.py`` times against them.
"""

import functools
from typing import NamedTuple

import numba
import numpy as np

from hpcgpu._compat import numpy_aliases_for_numba_cuda

numpy_aliases_for_numba_cuda()

from numba import cuda  # noqa: E402

from hpcgpu.kernels import launch_limits  # noqa: E402
from hpcgpu.kernels.cuda_interop import array_module as _xp  # noqa: E402
from hpcgpu.kernels.cuda_interop import flat_on_device as _flat_on_device  # noqa: E402
from hpcgpu.kernels.cuda_interop import on_device as _on_device  # noqa: E402
from hpcgpu.kernels.cuda_interop import stream_of as _stream  # noqa: E402

from hpcgpu.kernels.stencil import diffusion_cuda  # noqa: E402
from hpcgpu.kernels.stencil.device_cuda import (  # noqa: E402
    _coriolis_index,
    _wrap_or_clamp,
    al_alpha,
    al_beta,
    al_epsilon,
    al_phi,
    bernoulli,
    diffusion_update,
    laplacian_5pt,
    mass_flux,
    potential_vorticity,
    u_vortex_force,
    v_vortex_force,
)
from hpcgpu.kernels.stencil.boundary import DIRICHLET, PERIODIC, WALL  # noqa: E402


class StencilCudaLaunch(NamedTuple):
    """How a kernel family is launched."""

    rows: int
    """Rows per thread: the height of the strip a thread walks."""
    threads: int
    """Threads per block, all along x."""


LAUNCH = {
    ("five_point", "float32"): StencilCudaLaunch(rows=8, threads=128),
    ("five_point", "float64"): StencilCudaLaunch(rows=8, threads=128),
    ("stage", "float32"): StencilCudaLaunch(rows=16, threads=128),
    ("stage", "float64"): StencilCudaLaunch(rows=16, threads=128),
}
"""The launch of each kernel family per dtype."""

VARIANTS = {
    ("five_point", "float32"): (StencilCudaLaunch(4, 128), StencilCudaLaunch(16, 128), StencilCudaLaunch(8, 256),
                                StencilCudaLaunch(8, 64)),
    ("five_point", "float64"): (StencilCudaLaunch(4, 128), StencilCudaLaunch(16, 128), StencilCudaLaunch(8, 256),
                                StencilCudaLaunch(8, 64)),
    ("stage", "float32"): (StencilCudaLaunch(8, 128), StencilCudaLaunch(32, 128), StencilCudaLaunch(16, 64),
                           StencilCudaLaunch(16, 256)),
    ("stage", "float64"): (StencilCudaLaunch(8, 128), StencilCudaLaunch(32, 128), StencilCudaLaunch(16, 64),
                           StencilCudaLaunch(16, 256)),
}
"""Alternative launches, timed by ``scripts/gpu_kernel_variants.py``."""

MAX_GRID_Y = 65535
"""CUDA's limit on blocks along y: caps ny at 65535 * rows."""

def _grid(shape, launch):
    # No shared memory: the strips live in registers (local arrays of constant size).
    launch_limits.check("the cuda stencil kernels", launch, launch.threads)
    ny, nx = shape
    blocks_y = (ny + launch.rows - 1) // launch.rows
    if blocks_y > MAX_GRID_Y:
        from hpcgpu.errors import ConfigError
        raise ConfigError(f"the cuda stencil kernels take at most {MAX_GRID_Y * launch.rows} rows "
                          f"per array; got ny={ny}. Split the grid into partitions along y")
    return (nx + launch.threads - 1) // launch.threads, blocks_y


def _target(out):
    """Where a kernel writes ``out``: itself, or a contiguous scratch array to copy back."""
    return out if out.flags.c_contiguous else _xp(out).empty(out.shape, out.dtype)


@functools.cache
def _five_point_kernel(dtype_name, rows, diffuse):
    """The strip kernel of ``rows`` rows for one dtype (local arrays need both
    at compile time); ``diffuse`` picks the diffusion update over the Laplacian."""
    value_type = numba.from_dtype(np.dtype(dtype_name))
    centre_rows = rows + 2
    update = diffusion_update if diffuse else laplacian_5pt

    @cuda.jit
    def kernel(src, dst, ny, nx, c_x, c_y, bc_x, bc_s, bc_n, value):
        # src, dst: flat views of (ny, nx) grids. Offsets are cast to unsigned
        # where they index: they are never negative, and a signed index costs
        # a wraparound check per access.
        i = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
        if i >= nx:
            return
        j0 = cuda.blockIdx.y * rows
        # Entry k holds logical row j0 - 1 + k (west/east: row j0 + k). Every
        # load comes before the first store so that they are all in flight at
        # once; loops of constant trip count unroll and the arrays become
        # registers. The simulator keys local arrays by source line: one per line.
        centre = cuda.local.array(centre_rows, value_type)
        west = cuda.local.array(rows, value_type)
        east = cuda.local.array(rows, value_type)
        if j0 >= 1 and j0 + rows < ny and i >= 1 and i < nx - 1:
            # Away from every edge (almost all threads): no ghosts, and the
            # neighbours sit at constant offsets that fold into the loads.
            first = (j0 - 1) * nx + i
            for k in range(centre_rows):
                centre[k] = src[np.uint64(first + k * nx)]
            for k in range(rows):
                here = first + (k + 1) * nx
                west[k] = src[np.uint64(here - 1)]
                east[k] = src[np.uint64(here + 1)]
        else:
            periodic_y = bc_s == PERIODIC
            w = _wrap_or_clamp(i - 1, nx, bc_x == PERIODIC)
            e = _wrap_or_clamp(i + 1, nx, bc_x == PERIODIC)
            # Beyond a Dirichlet edge the neighbour is the boundary value, not a load.
            fixed_w = bc_x == DIRICHLET and i == 0
            fixed_e = bc_x == DIRICHLET and i == nx - 1
            for k in range(centre_rows):
                r = j0 - 1 + k
                if (r < 0 and bc_s == DIRICHLET) or (r >= ny and bc_n == DIRICHLET):
                    centre[k] = value
                else:
                    centre[k] = src[np.uint64(_wrap_or_clamp(r, ny, periodic_y) * nx + i)]
            for k in range(rows):
                offset = _wrap_or_clamp(j0 + k, ny, periodic_y) * nx
                west[k] = value if fixed_w else src[np.uint64(offset + w)]
                east[k] = value if fixed_e else src[np.uint64(offset + e)]
        for k in range(rows):
            j = j0 + k
            if j < ny:
                dst[np.uint64(j * nx + i)] = update(centre[k + 1], west[k], east[k], centre[k],
                                                    centre[k + 2], c_x, c_y)

    return kernel


def _five_point(src, dst, c_x, c_y, bc_x, bc_s, bc_n, diffuse, launch=None, value=0.0):
    """One five-point pass from ``src`` into ``dst`` (C-contiguous, same dtype);
    ``value`` beyond Dirichlet edges."""
    dtype = np.dtype(src.dtype)
    launch = launch or LAUNCH[("five_point", dtype.name)]
    kernel = _five_point_kernel(dtype.name, launch.rows, diffuse)
    t = dtype.type
    ny, nx = src.shape
    kernel[_grid(src.shape, launch), (launch.threads, 1), _stream(src)](
        _flat_on_device(src), _flat_on_device(dst), ny, nx, t(c_x), t(c_y), bc_x, bc_s, bc_n, t(value))


def laplacian(field, out, rdx2, rdy2, bc_x, bc_s, bc_n, value=0.0):
    """Five-point Laplacian into ``out``; see ``_numpy.laplacian``."""
    field = _xp(field).ascontiguousarray(field)
    target = _target(out)
    _five_point(field, target, rdx2, rdy2, bc_x, bc_s, bc_n, diffuse=False, value=value)
    if target is not out:
        out[...] = target
    return out


def diffuse(field, work, cx, cy, steps, bc_x, bc_s, bc_n, value=0.0, multi_step=None):
    """``steps`` explicit diffusion steps; returns the buffer holding the result.

    Beyond a Dirichlet edge the field is ``value``.

    ``multi_step`` (a ``diffusion_cuda.PassLaunch``; default its ``PASS``
    for the dtype) advances T steps per pass over memory where it fits the
    grid; the remaining steps go one per launch.
    """
    dtype = np.dtype(field.dtype)
    launch = LAUNCH[("five_point", dtype.name)]
    t = dtype.type
    src, dst = _target(field), _target(work)
    if src is not field:
        src[...] = field
    ny, nx = field.shape
    multi_step = multi_step or diffusion_cuda.PASS[dtype.name]
    if multi_step is not None and diffusion_cuda.launch_problems(multi_step, dtype):
        # Not a grid too small for it (those fall back to one step per launch): no grid fits.
        from hpcgpu.errors import ConfigError
        raise ConfigError(f"multi_step={multi_step!r} cannot run in {dtype.name}: "
                          f"{'; '.join(diffusion_cuda.launch_problems(multi_step, dtype))}")
    if multi_step is not None and diffusion_cuda.fits(field.shape, multi_step, dtype):
        while steps >= multi_step.steps:
            diffusion_cuda.multi_step_pass(src, dst, cx, cy, bc_x, bc_s, bc_n, value, multi_step)
            src, dst = dst, src
            steps -= multi_step.steps
    configured = _five_point_kernel(dtype.name, launch.rows, True)[
        _grid(field.shape, launch), (launch.threads, 1), _stream(field)]
    # Views made once: per-step host work would show at a fraction of a ms per step.
    flat_src, flat_dst = _flat_on_device(src), _flat_on_device(dst)
    for _ in range(steps):
        configured(flat_src, flat_dst, ny, nx, t(cx), t(cy), bc_x, bc_s, bc_n, t(value))
        flat_src, flat_dst = flat_dst, flat_src
        src, dst = dst, src
    if src is field or src is work:
        return src
    field[...] = src
    return field


@cuda.jit(device=True)
def _v_is_zero(r, ny, bc_s, bc_n):
    """Logical row ``r`` lies beyond a wall, where the normal velocity v is zero."""
    return (r < 0 and bc_s == WALL) or (r >= ny and bc_n == WALL)


@cuda.jit(device=True)
def _neighbours(h, u, v, offset, w2, w, e, u_west_zero, u_east_zero, v_zero, zero):
    """Columns i-2, i-1 and i+1 (stored w2, w, e) of the stored row at flat
    ``offset`` of h, u, v with the ghost rules: u is zero beyond a wall in x,
    v beyond a wall in y."""
    k_w2 = np.uint64(offset + w2)
    k_w = np.uint64(offset + w)
    k_e = np.uint64(offset + e)
    h_w2 = h[k_w2]
    h_w = h[k_w]
    h_e = h[k_e]
    u_w = zero if u_west_zero else u[k_w]
    u_e = zero if u_east_zero else u[k_e]
    if v_zero:
        v_w2 = zero
        v_w = zero
        v_e = zero
    else:
        v_w2 = v[k_w2]
        v_w = v[k_w]
        v_e = v[k_e]
    return h_w2, h_w, h_e, u_w, u_e, v_w2, v_w, v_e


@cuda.jit
def _stage_kernel(u0, v0, h0, u, v, h, u_out, v_out, h_out, f_corner, ny, nx, pitch,
                  g, rdx, rdy, nu, a, b, c, bc_x, bc_s, bc_n, rows,
                  zero, half, quarter, c24, c_eps, c_phi):
    # The nine fields are flat views of (ny, nx) windows whose rows lie
    # ``pitch`` elements apart (a column window of wider arrays: pitch > nx),
    # indexed with unsigned offsets (never negative; a signed index costs a
    # wraparound check).
    i = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
    if i >= nx:
        return
    j0 = cuda.blockIdx.y * rows
    j1 = j0 + rows  # output rows j0 .. j1-1
    if j1 > ny:
        j1 = ny
    periodic_x = bc_x == PERIODIC
    periodic_y = bc_s == PERIODIC
    w2 = _wrap_or_clamp(i - 2, nx, periodic_x)
    w = _wrap_or_clamp(i - 1, nx, periodic_x)
    e = _wrap_or_clamp(i + 1, nx, periodic_x)
    u_west_zero = bc_x == WALL and i == 0
    u_east_zero = bc_x == WALL and i == nx - 1
    use_base = a != zero
    viscous = nu != zero
    rdx2 = rdx * rdx
    rdy2 = rdy * rdy

    # Names: field_row[_column]. Rows (at step r): _o = r-1 (the output row),
    # _n = r (north of it), _s = r-2 (south of it); columns: _w2, _w, (none),
    # _e = i-2, i-1, i, i+1. Corner row r holds the north corners of cell row
    # r-1, so q_o / q_n are corner rows r-1 / r.
    r = j0 - 2
    offset = _wrap_or_clamp(r, ny, periodic_y) * pitch
    v_zero = _v_is_zero(r, ny, bc_s, bc_n)
    k = np.uint64(offset + i)
    h_o = h[k]
    u_o = u[k]
    v_o = zero if v_zero else v[k]
    h_o_w2, h_o_w, h_o_e, u_o_w, u_o_e, v_o_w2, v_o_w, v_o_e = _neighbours(
        h, u, v, offset, w2, w, e, u_west_zero, u_east_zero, v_zero, zero)
    # The own column of the next row, loaded a step ahead.
    r = j0 - 1
    ahead_offset = _wrap_or_clamp(r, ny, periodic_y) * pitch
    ahead_v_zero = _v_is_zero(r, ny, bc_s, bc_n)
    k = np.uint64(ahead_offset + i)
    ahead_h = h[k]
    ahead_u = u[k]
    ahead_v = zero if ahead_v_zero else v[k]

    q_o_w = q_o = q_o_e = zero
    vf_o_w = vf_o = vf_s = zero
    uf_s = uf_s_e = zero
    alpha_s = beta_s = phi_s = bern_s = zero
    u_s = v_s = zero
    for r in range(j0 - 1, j1 + 1):
        offset = ahead_offset
        v_zero = ahead_v_zero
        h_n = ahead_h
        u_n = ahead_u
        v_n = ahead_v
        h_n_w2, h_n_w, h_n_e, u_n_w, u_n_e, v_n_w2, v_n_w, v_n_e = _neighbours(
            h, u, v, offset, w2, w, e, u_west_zero, u_east_zero, v_zero, zero)
        ahead_offset = _wrap_or_clamp(r + 1, ny, periodic_y) * pitch
        ahead_v_zero = _v_is_zero(r + 1, ny, bc_s, bc_n)
        k = np.uint64(ahead_offset + i)
        ahead_h = h[k]
        ahead_u = u[k]
        ahead_v = zero if ahead_v_zero else v[k]
        jo = r - 1
        write = jo >= j0
        k_out = np.uint64(0)
        if write:
            k_out = np.uint64(jo * pitch + i)
        # Corner row r at corners i-1, i, i+1; meridional flux on faces i-1, i.
        f = f_corner[_coriolis_index(r, ny, periodic_y)]
        q_n_w = potential_vorticity(f, h_o_w2, h_o_w, h_n_w2, h_n_w, u_o_w, u_n_w, v_n_w2, v_n_w,
                                    rdx, rdy, quarter)
        q_n = potential_vorticity(f, h_o_w, h_o, h_n_w, h_n, u_o, u_n, v_n_w, v_n, rdx, rdy, quarter)
        q_n_e = potential_vorticity(f, h_o, h_o_e, h_n, h_n_e, u_o_e, u_n_e, v_n, v_n_e, rdx, rdy, quarter)
        vf_n_w = mass_flux(h_o_w, h_n_w, v_n_w, half)
        vf_n = mass_flux(h_o, h_n, v_n, half)

        # Cell row r-1: zonal flux on faces i-1, i, i+1; cells i-1, i.
        uf_o_w = mass_flux(h_o_w2, h_o_w, u_o_w, half)
        uf_o = mass_flux(h_o_w, h_o, u_o, half)
        uf_o_e = mass_flux(h_o, h_o_e, u_o_e, half)
        bern_o_w = bernoulli(g, h_o_w, u_o_w, u_o, v_o_w, v_n_w, quarter)
        bern_o = bernoulli(g, h_o, u_o, u_o_e, v_o, v_n, quarter)
        alpha_o_w = al_alpha(q_o_w, q_o, q_n_w, q_n, c24)
        beta_o_w = al_beta(q_o_w, q_o, q_n_w, q_n, c24)
        eps_o_w = al_epsilon(q_o_w, q_o, q_n_w, q_n, c_eps)
        alpha_o = al_alpha(q_o, q_o_e, q_n, q_n_e, c24)
        beta_o = al_beta(q_o, q_o_e, q_n, q_n_e, c24)
        eps_o = al_epsilon(q_o, q_o_e, q_n, q_n_e, c_eps)
        phi_o = al_phi(q_o, q_o_e, q_n, q_n_e, c_phi)

        if write:
            du = (u_vortex_force(alpha_o, beta_o_w, alpha_o_w, beta_o, eps_o, eps_o_w,
                                 vf_n, vf_n_w, vf_o_w, vf_o, uf_o_e, uf_o_w)
                  - (bern_o - bern_o_w) * rdx)
            dv = (v_vortex_force(alpha_s, beta_s, alpha_o, beta_o, phi_o, phi_s,
                                 uf_s, uf_s_e, uf_o_e, uf_o, vf_n, vf_s)
                  - (bern_o - bern_s) * rdy)
            dh = -((uf_o_e - uf_o) * rdx + (vf_n - vf_o) * rdy)
            if viscous:
                du += nu * laplacian_5pt(u_o, u_o_w, u_o_e, u_s, u_n, rdx2, rdy2)
                dv += nu * laplacian_5pt(v_o, v_o_w, v_o_e, v_s, v_n, rdx2, rdy2)
            if bc_x == WALL and i == 0:
                du = zero
            if bc_s == WALL and jo == 0:
                dv = zero
            if use_base:
                # Loaded here, not at the top of the row: live through the row's
                # compute they cost registers (float64: 140 -> 128, a block more an SM).
                base_u = u0[k_out]
                base_v = v0[k_out]
                base_h = h0[k_out]
                # x0 + b (x - x0), not a x0 + b x: a + b rounds to 1 + 3e-8 in
                # float32 for RK3's 1/3, 2/3, which would drift the mass.
                u_out[k_out] = base_u + b * (u_o - base_u) + c * du
                v_out[k_out] = base_v + b * (v_o - base_v) + c * dv
                h_out[k_out] = base_h + b * (h_o - base_h) + c * dh
            else:
                u_out[k_out] = b * u_o + c * du
                v_out[k_out] = b * v_o + c * dv
                h_out[k_out] = b * h_o + c * dh

        # Move north by one row.
        u_s = u_o
        v_s = v_o
        vf_s = vf_o
        vf_o_w = vf_n_w
        vf_o = vf_n
        uf_s = uf_o
        uf_s_e = uf_o_e
        alpha_s = alpha_o
        beta_s = beta_o
        phi_s = phi_o
        bern_s = bern_o
        q_o_w = q_n_w
        q_o = q_n
        q_o_e = q_n_e
        h_o_w2 = h_n_w2
        h_o_w = h_n_w
        h_o = h_n
        h_o_e = h_n_e
        u_o_w = u_n_w
        u_o = u_n
        u_o_e = u_n_e
        v_o_w = v_n_w
        v_o = v_n
        v_o_e = v_n_e


def _stage(u0, v0, h0, u, v, h, u_out, v_out, h_out, f_corner, g, rdx, rdy, nu, a, b, c,
           bc_x, bc_s, bc_n, launch=None, cols=None):
    """The stage kernel with ``launch`` (default :data:`LAUNCH`) on C-contiguous fields, columns ``cols``."""
    dtype = np.dtype(h.dtype)
    launch = launch or LAUNCH[("stage", dtype.name)]
    t = dtype.type
    ny, pitch = h.shape
    c0, c1 = (0, pitch) if cols is None else cols
    fields = (u0, v0, h0, u, v, h, u_out, v_out, h_out)
    _stage_kernel[_grid((ny, c1 - c0), launch), (launch.threads, 1), _stream(h)](
        *(_flat_on_device(x, c0) for x in fields), _on_device(f_corner), ny, c1 - c0, pitch,
        t(g), t(rdx), t(rdy), t(nu), t(a), t(b), t(c), bc_x, bc_s, bc_n, launch.rows,
        t(0.0), t(0.5), t(0.25), t(1.0 / 24.0), t(rdx / (24.0 * rdy)), t(rdy / (24.0 * rdx)))


def shallow_water_stage(u0, v0, h0, u, v, h, u_out, v_out, h_out,
                        f_corner, g, rdx, rdy, nu, a, b, c, bc_x, bc_s, bc_n, cols=None):
    """Fused RK stage ``out = a*state0 + b*state + c*tendency(state)``; see ``_numpy``.

    ``cols = (lo, hi)`` steps only those columns, as if they were the whole
    grid; the kernel indexes them with the arrays' own row stride.
    """
    xp = _xp(h)
    u, v, h = (xp.ascontiguousarray(x) for x in (u, v, h))
    if a == 0:
        u0, v0, h0 = u, v, h  # valid arrays; the kernel does not read them
    else:
        u0, v0, h0 = (xp.ascontiguousarray(x) for x in (u0, v0, h0))
    outs = (u_out, v_out, h_out)
    targets = tuple(_target(o) for o in outs)
    _stage(u0, v0, h0, u, v, h, *targets, f_corner, g, rdx, rdy, nu, a, b, c, bc_x, bc_s, bc_n, cols=cols)
    window = (slice(None), slice(None) if cols is None else slice(*cols))
    for out, target in zip(outs, targets):
        if target is not out:
            out[window] = target[window]


def shallow_water_tendency(u, v, h, f_corner, g, rdx, rdy, nu, bc_x, bc_s, bc_n):
    """Tendencies ``(du, dv, dh)``; see ``_numpy.shallow_water_tendency``."""
    xp = _xp(h)
    du, dv, dh = (xp.empty_like(x) for x in (u, v, h))
    shallow_water_stage(u, v, h, u, v, h, du, dv, dh, f_corner, g, rdx, rdy, nu,
                        0.0, 0.0, 1.0, bc_x, bc_s, bc_n)
    return du, dv, dh
