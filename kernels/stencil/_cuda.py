"""Stencil kernels for NVIDIA GPUs with Numba-CUDA.

Arrays stay CuPy arrays, so CuPy and Numba share one memory pool; each call
wraps them with ``cuda.as_cuda_array(..., sync=False)`` and launches on CuPy's
current stream. Numba's default import of a CuPy array synchronises the host
with that stream on every launch, which would serialise a loop of small
kernels. Under the CUDA simulator the arrays are NumPy arrays and pass through.

``laplacian`` and ``diffuse`` use one thread per point in ``32 x 8`` blocks
(coalesced along x), a single pass that reads each point once from DRAM; the
neighbours come from L1/L2. Ghost cells are index arithmetic (wrap or clamp),
taken only by threads on the grid's edge.

``shallow_water_stage`` is one fused kernel per ``32 x 8`` tile. A block loads
its tile of ``u, v, h`` with the halo the scheme reaches (2 rows/columns
south/west, 1 north/east) into shared memory, applying the ghost rules of
``_boundary``; then computes, with a barrier between phases, potential
vorticity and mass fluxes on the faces and corners around the tile, then the
Bernoulli potential and the Arakawa-Lamb coefficients per cell, and finally
each thread writes its point of ``u_out, v_out, h_out``. The per-point
physics is ``_physics``, compiled here as device functions; shared arrays
need a compile-time dtype, so the stage kernel is built once per dtype.
Numeric constants come in as arguments of the field's dtype: a float literal
would promote float32 arithmetic to float64.
"""

import functools

import numba
import numpy as np

from hpcgpu._compat import numpy_aliases_for_numba_cuda

numpy_aliases_for_numba_cuda()

from numba import cuda  # noqa: E402

from hpcgpu.kernels.stencil import _physics  # noqa: E402
from hpcgpu.kernels.stencil._boundary import PERIODIC, WALL  # noqa: E402

TX, TY = 32, 8
"""Threads per block along x and y, for every kernel here."""
_THREADS = TX * TY
# Shared-array shapes of the stage kernel, (rows, columns) with the tile's
# first point at local (2, 2) for the loaded fields and (1, 1) for the rest.
_LOAD = (TY + 3, TX + 3)  # u, v, h: logical rows j0-2 .. j0+TY, columns i0-2 .. i0+TX
_EDGE = (TY + 2, TX + 2)  # q at corners, mass fluxes at faces: from j0-1, i0-1
_CELL = (TY + 1, TX + 1)  # Bernoulli potential, AL coefficients: from j0-1, i0-1

_device_function = cuda.jit(device=True)
potential_vorticity = _device_function(_physics.potential_vorticity)
al_alpha = _device_function(_physics.al_alpha)
al_beta = _device_function(_physics.al_beta)
al_epsilon = _device_function(_physics.al_epsilon)
al_phi = _device_function(_physics.al_phi)
mass_flux = _device_function(_physics.mass_flux)
bernoulli = _device_function(_physics.bernoulli)
u_vortex_force = _device_function(_physics.u_vortex_force)
v_vortex_force = _device_function(_physics.v_vortex_force)
laplacian_5pt = _device_function(_physics.laplacian_5pt)
diffusion_update = _device_function(_physics.diffusion_update)


@cuda.jit(device=True)
def _clamp(k, last):
    # Not min/max: with Numba 0.68's built-in CUDA target their generic
    # overloads fail to compile (signature mismatch).
    if k < 0:
        return 0
    if k > last:
        return last
    return k


@cuda.jit(device=True)
def _wrap_or_clamp(k, n, periodic):
    """Stored index for logical index ``k`` on an axis of ``n`` points.

    One period of wrap covers every index a valid output reads (at most two
    beyond an edge, and ``n >= 4``); the final clamp only keeps the padding
    threads of a partial tile inside the array.
    """
    if periodic:
        if k < 0:
            k += n
        elif k >= n:
            k -= n
    return _clamp(k, n - 1)


@cuda.jit(device=True)
def _coriolis_index(r, ny, periodic):
    """Entry of ``f_corner`` (corner rows 0..ny) for logical corner row ``r``."""
    if periodic:
        if r < 0:
            r += ny
        elif r >= ny:
            r -= ny
    return _clamp(r, ny)


def _grid(shape):
    ny, nx = shape
    return (nx + TX - 1) // TX, (ny + TY - 1) // TY


def _on_device(array):
    """A Numba view of a CuPy array without a host sync; NumPy arrays (simulator) pass through."""
    if isinstance(array, np.ndarray):
        return array
    return cuda.as_cuda_array(array, sync=False)


def _stream(array):
    """CuPy's current stream as a Numba stream, so kernels queue behind CuPy's work."""
    if isinstance(array, np.ndarray):
        return 0
    import cupy
    ptr = cupy.cuda.get_current_stream().ptr
    return cuda.external_stream(ptr) if ptr else 0


def _xp(array):
    if isinstance(array, np.ndarray):
        return np
    import cupy
    return cupy


@cuda.jit
def _laplacian_kernel(field, out, rdx2, rdy2, bc_x, bc_s, bc_n):
    i, j = cuda.grid(2)
    ny, nx = field.shape
    if i < nx and j < ny:
        w, e, s, n = i - 1, i + 1, j - 1, j + 1
        if i == 0 or i == nx - 1:
            w = _wrap_or_clamp(w, nx, bc_x == PERIODIC)
            e = _wrap_or_clamp(e, nx, bc_x == PERIODIC)
        if j == 0 or j == ny - 1:
            s = _wrap_or_clamp(s, ny, bc_s == PERIODIC)
            n = _wrap_or_clamp(n, ny, bc_s == PERIODIC)
        out[j, i] = laplacian_5pt(field[j, i], field[j, w], field[j, e], field[s, i], field[n, i],
                                  rdx2, rdy2)


@cuda.jit
def _diffuse_kernel(src, dst, cx, cy, bc_x, bc_s, bc_n):
    i, j = cuda.grid(2)
    ny, nx = src.shape
    if i < nx and j < ny:
        w, e, s, n = i - 1, i + 1, j - 1, j + 1
        if i == 0 or i == nx - 1:
            w = _wrap_or_clamp(w, nx, bc_x == PERIODIC)
            e = _wrap_or_clamp(e, nx, bc_x == PERIODIC)
        if j == 0 or j == ny - 1:
            s = _wrap_or_clamp(s, ny, bc_s == PERIODIC)
            n = _wrap_or_clamp(n, ny, bc_s == PERIODIC)
        dst[j, i] = diffusion_update(src[j, i], src[j, w], src[j, e], src[s, i], src[n, i], cx, cy)


def laplacian(field, out, rdx2, rdy2, bc_x, bc_s, bc_n):
    """Five-point Laplacian into ``out``; see ``_numpy.laplacian``."""
    t = field.dtype.type
    _laplacian_kernel[_grid(field.shape), (TX, TY), _stream(field)](
        _on_device(field), _on_device(out), t(rdx2), t(rdy2), bc_x, bc_s, bc_n)
    return out


def diffuse(field, work, cx, cy, steps, bc_x, bc_s, bc_n):
    """``steps`` explicit diffusion steps; returns the buffer holding the result."""
    t = field.dtype.type
    launch = _diffuse_kernel[_grid(field.shape), (TX, TY), _stream(field)]
    src, dst = _on_device(field), _on_device(work)
    for _ in range(steps):
        launch(src, dst, t(cx), t(cy), bc_x, bc_s, bc_n)
        src, dst = dst, src
    return field if steps % 2 == 0 else work


@functools.cache
def _stage_kernel(dtype_name):
    """The fused stage kernel with shared arrays of ``dtype_name``."""
    shared_type = numba.from_dtype(np.dtype(dtype_name))

    @cuda.jit
    def kernel(u0, v0, h0, u, v, h, u_out, v_out, h_out, f_corner,
               g, rdx, rdy, nu, a, b, c, bc_x, bc_s, bc_n,
               zero, half, quarter, c24, c_eps, c_phi):
        # The simulator keys shared arrays by source line: one per line.
        sh = cuda.shared.array(_LOAD, shared_type)
        su = cuda.shared.array(_LOAD, shared_type)
        sv = cuda.shared.array(_LOAD, shared_type)
        sq = cuda.shared.array(_EDGE, shared_type)
        suf = cuda.shared.array(_EDGE, shared_type)
        svf = cuda.shared.array(_EDGE, shared_type)
        sbern = cuda.shared.array(_CELL, shared_type)
        salpha = cuda.shared.array(_CELL, shared_type)
        sbeta = cuda.shared.array(_CELL, shared_type)
        seps = cuda.shared.array(_CELL, shared_type)
        sphi = cuda.shared.array(_CELL, shared_type)

        ny, nx = h.shape
        tx = cuda.threadIdx.x
        ty = cuda.threadIdx.y
        tid = ty * TX + tx
        i0 = cuda.blockIdx.x * TX
        j0 = cuda.blockIdx.y * TY
        periodic_x = bc_x == PERIODIC
        periodic_y = bc_s == PERIODIC

        # Phase 1: u, v, h with ghost values, as _numba._load_row builds them.
        for k in range(tid, _LOAD[0] * _LOAD[1], _THREADS):
            lj = k // _LOAD[1]
            li = k - lj * _LOAD[1]
            r = j0 - 2 + lj
            col = i0 - 2 + li
            rr = _wrap_or_clamp(r, ny, periodic_y)
            cc = _wrap_or_clamp(col, nx, periodic_x)
            sh[lj, li] = h[rr, cc]
            if bc_x == WALL and (col < 0 or col >= nx):
                su[lj, li] = zero
            else:
                su[lj, li] = u[rr, cc]
            if (r < 0 and bc_s == WALL) or (r >= ny and bc_n == WALL):
                sv[lj, li] = zero
            else:
                sv[lj, li] = v[rr, cc]
        cuda.syncthreads()

        # Phase 2: corners and faces at logical (j0-1+lj, i0-1+li).
        for k in range(tid, _EDGE[0] * _EDGE[1], _THREADS):
            lj = k // _EDGE[1]
            li = k - lj * _EDGE[1]
            f = f_corner[_coriolis_index(j0 - 1 + lj, ny, periodic_y)]
            sq[lj, li] = potential_vorticity(
                f, sh[lj, li], sh[lj, li + 1], sh[lj + 1, li], sh[lj + 1, li + 1],
                su[lj, li + 1], su[lj + 1, li + 1], sv[lj + 1, li], sv[lj + 1, li + 1],
                rdx, rdy, quarter)
            suf[lj, li] = mass_flux(sh[lj + 1, li], sh[lj + 1, li + 1], su[lj + 1, li + 1], half)
            svf[lj, li] = mass_flux(sh[lj, li + 1], sh[lj + 1, li + 1], sv[lj + 1, li + 1], half)
        cuda.syncthreads()

        # Phase 3: cells at logical (j0-1+lj, i0-1+li).
        for k in range(tid, _CELL[0] * _CELL[1], _THREADS):
            lj = k // _CELL[1]
            li = k - lj * _CELL[1]
            sbern[lj, li] = bernoulli(g, sh[lj + 1, li + 1], su[lj + 1, li + 1], su[lj + 1, li + 2],
                                      sv[lj + 1, li + 1], sv[lj + 2, li + 1], quarter)
            q_sw = sq[lj, li]
            q_se = sq[lj, li + 1]
            q_nw = sq[lj + 1, li]
            q_ne = sq[lj + 1, li + 1]
            salpha[lj, li] = al_alpha(q_sw, q_se, q_nw, q_ne, c24)
            sbeta[lj, li] = al_beta(q_sw, q_se, q_nw, q_ne, c24)
            seps[lj, li] = al_epsilon(q_sw, q_se, q_nw, q_ne, c_eps)
            sphi[lj, li] = al_phi(q_sw, q_se, q_nw, q_ne, c_phi)
        cuda.syncthreads()

        # Phase 4: this thread's point; (m, n) indexes phase 2/3 arrays, (p, s) phase 1.
        i = i0 + tx
        j = j0 + ty
        if i < nx and j < ny:
            m = ty + 1
            n = tx + 1
            p = ty + 2
            s = tx + 2
            u_c = su[p, s]
            v_c = sv[p, s]
            du = (u_vortex_force(salpha[m, n], sbeta[m, n - 1], salpha[m, n - 1], sbeta[m, n],
                                 seps[m, n], seps[m, n - 1],
                                 svf[m + 1, n], svf[m + 1, n - 1], svf[m, n - 1], svf[m, n],
                                 suf[m, n + 1], suf[m, n - 1])
                  - (sbern[m, n] - sbern[m, n - 1]) * rdx)
            dv = (v_vortex_force(salpha[m - 1, n], sbeta[m - 1, n], salpha[m, n], sbeta[m, n],
                                 sphi[m, n], sphi[m - 1, n],
                                 suf[m - 1, n], suf[m - 1, n + 1], suf[m, n + 1], suf[m, n],
                                 svf[m + 1, n], svf[m - 1, n])
                  - (sbern[m, n] - sbern[m - 1, n]) * rdy)
            dh = -((suf[m, n + 1] - suf[m, n]) * rdx + (svf[m + 1, n] - svf[m, n]) * rdy)
            if nu != zero:
                du += nu * laplacian_5pt(u_c, su[p, s - 1], su[p, s + 1], su[p - 1, s], su[p + 1, s],
                                         rdx * rdx, rdy * rdy)
                dv += nu * laplacian_5pt(v_c, sv[p, s - 1], sv[p, s + 1], sv[p - 1, s], sv[p + 1, s],
                                         rdx * rdx, rdy * rdy)
            if bc_x == WALL and i == 0:
                du = zero
            if bc_s == WALL and j == 0:
                dv = zero
            if a != zero:
                # x0 + b (x - x0), not a x0 + b x: a + b rounds to 1 + 3e-8 in
                # float32 for RK3's 1/3, 2/3, which would drift the mass.
                base = u0[j, i]
                u_out[j, i] = base + b * (u_c - base) + c * du
                base = v0[j, i]
                v_out[j, i] = base + b * (v_c - base) + c * dv
                base = h0[j, i]
                h_out[j, i] = base + b * (sh[p, s] - base) + c * dh
            else:
                u_out[j, i] = b * u_c + c * du
                v_out[j, i] = b * v_c + c * dv
                h_out[j, i] = b * sh[p, s] + c * dh

    return kernel


def shallow_water_stage(u0, v0, h0, u, v, h, u_out, v_out, h_out,
                        f_corner, g, rdx, rdy, nu, a, b, c, bc_x, bc_s, bc_n):
    """Fused RK stage ``out = a*state0 + b*state + c*tendency(state)``; see ``_numpy``."""
    t = h.dtype.type
    kernel = _stage_kernel(h.dtype.name)
    arrays = (u0, v0, h0, u, v, h, u_out, v_out, h_out, f_corner)
    kernel[_grid(h.shape), (TX, TY), _stream(h)](
        *(_on_device(x) for x in arrays),
        t(g), t(rdx), t(rdy), t(nu), t(a), t(b), t(c), bc_x, bc_s, bc_n,
        t(0.0), t(0.5), t(0.25), t(1.0 / 24.0), t(rdx / (24.0 * rdy)), t(rdy / (24.0 * rdx)))


def shallow_water_tendency(u, v, h, f_corner, g, rdx, rdy, nu, bc_x, bc_s, bc_n):
    """Tendencies ``(du, dv, dh)``; see ``_numpy.shallow_water_tendency``."""
    xp = _xp(h)
    du, dv, dh = (xp.empty_like(x) for x in (u, v, h))
    shallow_water_stage(u, v, h, u, v, h, du, dv, dh, f_corner, g, rdx, rdy, nu,
                        0.0, 0.0, 1.0, bc_x, bc_s, bc_n)
    return du, dv, dh
