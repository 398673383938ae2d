"""Stencil kernels for the GPU as CuPy ``RawModule`` CUDA C++ kernels.

One thread per grid point, in 2D blocks of 32 x 8 threads, so that the 32
threads of a warp read 32 neighbouring points of one row (coalesced). The
shallow-water stage is a single fused pass: each thread reads the
neighbourhood it needs (a 4 x 4 patch of ``h``, ``u`` and ``v``) straight
from global memory, recomputes the potential vorticity, mass fluxes,
Bernoulli potential and Arakawa-Lamb coefficients around its point, and
writes its three outputs. Neighbouring threads re-read the same values, but
those reads hit L1/L2, so memory traffic stays close to one read of each
input and one write of each output.

The per-point physics mirrors ``_physics`` as ``__device__`` functions and
the ghost rules mirror ``_numba``: periodic edges wrap, wall and open edges
clamp, and the normal velocity beyond a wall is zero.

The CUDA source is the string :data:`KERNEL_SOURCE` (templates on the float
type, no headers, no shared memory, no ``__syncthreads``), compiled by NVRTC
on first use through a cached :class:`cupy.RawModule`. Importing this module
does not import CuPy or touch the GPU. The tests compile the same text on
the CPU with g++ (``tests/kernels/test_stencil_cupy_source.py``).
"""

import functools

import numpy as np

from hpcgpu.errors import ConfigError
from hpcgpu.kernels.stencil._boundary import PERIODIC, WALL

BLOCK = (32, 8, 1)
"""Threads per block (x, y, z): a warp covers 32 points of one row."""

OPTIONS = ("--std=c++17",)
"""NVRTC options of the module."""

CTYPES = {"float32": "float", "float64": "double"}
"""C++ type of each supported NumPy dtype (the template argument)."""

KERNELS = ("laplacian_kernel", "diffuse_kernel", "sw_stage_kernel")
"""The ``__global__`` templates of :data:`KERNEL_SOURCE`."""

NAME_EXPRESSIONS = tuple(f"{kernel}<{ctype}>" for kernel in KERNELS for ctype in CTYPES.values())
"""Template instances that NVRTC compiles, as passed to ``get_function``."""

_BOUNDARY_CODES = f"""
constexpr int BC_PERIODIC = {PERIODIC};
constexpr int BC_WALL = {WALL};
"""

_KERNEL_BODY = r"""
// ---- grid indexing -------------------------------------------------------
// Logical indices may lie up to two points beyond the grid; these map them
// to the stored point they read (the ghost rules of ``_boundary``).

__device__ __forceinline__ int hg_wrap(int r, int n)
{
    r %= n;
    return r < 0 ? r + n : r;
}

__device__ __forceinline__ int hg_clamp(int r, int lo, int hi)
{
    return r < lo ? lo : (r > hi ? hi : r);
}

// Row of a scalar or a tangential velocity: wrap if periodic, else clamp.
__device__ __forceinline__ int neighbour_row(int r, int ny, int bc_s)
{
    if (r >= 0 && r < ny) return r;
    return bc_s == BC_PERIODIC ? hg_wrap(r, ny) : hg_clamp(r, 0, ny - 1);
}

// Column of a scalar or a tangential velocity: wrap if periodic, else clamp.
__device__ __forceinline__ int neighbour_col(int i, int nx, int bc_x)
{
    if (i >= 0 && i < nx) return i;
    return bc_x == BC_PERIODIC ? hg_wrap(i, nx) : hg_clamp(i, 0, nx - 1);
}

// Row of v (normal in y); -1 beyond a wall, where v is zero.
__device__ __forceinline__ int normal_row(int r, int ny, int bc_s, int bc_n)
{
    if (r >= 0 && r < ny) return r;
    if (bc_s == BC_PERIODIC) return hg_wrap(r, ny);
    if ((r < 0 && bc_s == BC_WALL) || (r >= ny && bc_n == BC_WALL)) return -1;
    return hg_clamp(r, 0, ny - 1);
}

// Column of u (normal in x); -1 beyond a wall, where u is zero.
__device__ __forceinline__ int normal_col(int i, int nx, int bc_x)
{
    if (i >= 0 && i < nx) return i;
    if (bc_x == BC_PERIODIC) return hg_wrap(i, nx);
    if (bc_x == BC_WALL) return -1;
    return hg_clamp(i, 0, nx - 1);
}

// Coriolis parameter on corner row r (f_corner has ny + 1 rows).
template<typename T>
__device__ __forceinline__ T coriolis_row(const T* __restrict__ f_corner, int r, int ny, int bc_s)
{
    return bc_s == BC_PERIODIC ? f_corner[hg_wrap(r, ny)] : f_corner[hg_clamp(r, 0, ny)];
}

// ---- per-point physics (mirrors _physics.py) ----------------------------

template<typename T>
__device__ __forceinline__ T potential_vorticity(T f, T h_sw, T h_se, T h_nw, T h_ne,
                                                 T u_s, T u_n, T v_w, T v_e,
                                                 T rdx, T rdy, T quarter)
{
    return (f + (v_e - v_w) * rdx - (u_n - u_s) * rdy) / ((h_sw + h_se + h_nw + h_ne) * quarter);
}

template<typename T>
__device__ __forceinline__ T al_alpha(T q_sw, T q_se, T q_nw, T q_ne, T c24)
{
    T s_diag = q_ne + q_sw;
    return (s_diag + s_diag + q_nw + q_se) * c24;
}

template<typename T>
__device__ __forceinline__ T al_beta(T q_sw, T q_se, T q_nw, T q_ne, T c24)
{
    T s_anti = q_nw + q_se;
    return (q_ne + q_sw + s_anti + s_anti) * c24;
}

template<typename T>
__device__ __forceinline__ T al_epsilon(T q_sw, T q_se, T q_nw, T q_ne, T c_eps)
{
    return (q_ne + q_nw - q_sw - q_se) * c_eps;
}

template<typename T>
__device__ __forceinline__ T al_phi(T q_sw, T q_se, T q_nw, T q_ne, T c_phi)
{
    return (q_nw + q_sw - q_ne - q_se) * c_phi;
}

template<typename T>
__device__ __forceinline__ T mass_flux(T h_a, T h_b, T velocity, T half)
{
    return (h_a + h_b) * half * velocity;
}

template<typename T>
__device__ __forceinline__ T bernoulli(T g, T h, T u_w, T u_e, T v_s, T v_n, T quarter)
{
    return g * h + (u_w * u_w + u_e * u_e + v_s * v_s + v_n * v_n) * quarter;
}

template<typename T>
__device__ __forceinline__ T u_vortex_force(T alpha_e, T beta_w, T alpha_w, T beta_e, T eps_e, T eps_w,
                                            T vf_ne, T vf_nw, T vf_sw, T vf_se, T uf_e, T uf_w)
{
    return (alpha_e * vf_ne + beta_w * vf_nw + alpha_w * vf_sw + beta_e * vf_se
            - eps_e * uf_e + eps_w * uf_w);
}

template<typename T>
__device__ __forceinline__ T v_vortex_force(T alpha_s, T beta_s, T alpha_n, T beta_n, T phi_n, T phi_s,
                                            T uf_sw, T uf_se, T uf_ne, T uf_nw, T vf_n, T vf_s)
{
    return -(alpha_s * uf_sw + beta_s * uf_se + alpha_n * uf_ne + beta_n * uf_nw
             + phi_n * vf_n - phi_s * vf_s);
}

template<typename T>
__device__ __forceinline__ T laplacian_5pt(T centre, T west, T east, T south, T north, T rdx2, T rdy2)
{
    return (west + east - centre - centre) * rdx2 + (south + north - centre - centre) * rdy2;
}

template<typename T>
__device__ __forceinline__ T diffusion_update(T centre, T west, T east, T south, T north, T cx, T cy)
{
    return centre + cx * (west + east - centre - centre) + cy * (south + north - centre - centre);
}

// ---- kernels: one thread per point (i, j), x along threadIdx.x ----------
// Scalar fields read no normal velocity, so bc_n never matters to them
// (wall and open edges both clamp).

template<typename T>
__global__ void laplacian_kernel(const T* __restrict__ field, T* __restrict__ out,
                                 int ny, int nx, T rdx2, T rdy2, int bc_x, int bc_s)
{
    const int i = (int)(blockIdx.x * blockDim.x + threadIdx.x);
    const int j = (int)(blockIdx.y * blockDim.y + threadIdx.y);
    if (i >= nx || j >= ny) return;
    const long long row = (long long)j * nx;
    const long long south = (long long)neighbour_row(j - 1, ny, bc_s) * nx;
    const long long north = (long long)neighbour_row(j + 1, ny, bc_s) * nx;
    const int w = neighbour_col(i - 1, nx, bc_x);
    const int e = neighbour_col(i + 1, nx, bc_x);
    out[row + i] = laplacian_5pt(field[row + i], field[row + w], field[row + e],
                                 field[south + i], field[north + i], rdx2, rdy2);
}

template<typename T>
__global__ void diffuse_kernel(const T* __restrict__ src, T* __restrict__ dst,
                               int ny, int nx, T cx, T cy, int bc_x, int bc_s)
{
    const int i = (int)(blockIdx.x * blockDim.x + threadIdx.x);
    const int j = (int)(blockIdx.y * blockDim.y + threadIdx.y);
    if (i >= nx || j >= ny) return;
    const long long row = (long long)j * nx;
    const long long south = (long long)neighbour_row(j - 1, ny, bc_s) * nx;
    const long long north = (long long)neighbour_row(j + 1, ny, bc_s) * nx;
    const int w = neighbour_col(i - 1, nx, bc_x);
    const int e = neighbour_col(i + 1, nx, bc_x);
    dst[row + i] = diffusion_update(src[row + i], src[row + w], src[row + e],
                                    src[south + i], src[north + i], cx, cy);
}

// One Runge-Kutta stage out = a*state0 + b*state + c*tendency(state) at
// (i, j). state0 is not read when a == 0. Patch index [p][q] holds the
// logical point (j - 2 + p, i - 2 + q); corner index [p][q] of Q holds the
// potential vorticity at corner (j - 1 + p, i - 1 + q), the south-west
// corner of cell (j - 1 + p, i - 1 + q).
template<typename T>
__global__ void sw_stage_kernel(const T* __restrict__ u0, const T* __restrict__ v0,
                                const T* __restrict__ h0,
                                const T* __restrict__ u, const T* __restrict__ v,
                                const T* __restrict__ h,
                                T* __restrict__ u_out, T* __restrict__ v_out, T* __restrict__ h_out,
                                const T* __restrict__ f_corner,
                                int ny, int nx, T g, T rdx, T rdy, T nu, T a, T b, T c,
                                T c_eps, T c_phi, int bc_x, int bc_s, int bc_n)
{
    const int i = (int)(blockIdx.x * blockDim.x + threadIdx.x);
    const int j = (int)(blockIdx.y * blockDim.y + threadIdx.y);
    if (i >= nx || j >= ny) return;
    const T half = T(0.5);
    const T quarter = T(0.25);
    const T c24 = T(1.0 / 24.0);

    int rows[4], vrows[4], cols[4], ucols[4];
#pragma unroll
    for (int p = 0; p < 4; ++p) {
        rows[p] = neighbour_row(j - 2 + p, ny, bc_s);
        vrows[p] = normal_row(j - 2 + p, ny, bc_s, bc_n);
        cols[p] = neighbour_col(i - 2 + p, nx, bc_x);
        ucols[p] = normal_col(i - 2 + p, nx, bc_x);
    }
    T H[4][4], U[4][4], V[4][4];
#pragma unroll
    for (int p = 0; p < 4; ++p) {
        const long long row = (long long)rows[p] * nx;
        const long long vrow = (long long)vrows[p] * nx;
#pragma unroll
        for (int q = 0; q < 4; ++q) {
            H[p][q] = h[row + cols[q]];
            U[p][q] = ucols[q] < 0 ? T(0) : u[row + ucols[q]];
            V[p][q] = vrows[p] < 0 ? T(0) : v[vrow + cols[q]];
        }
    }

    T Q[3][3];
#pragma unroll
    for (int p = 0; p < 3; ++p) {
        const T f = coriolis_row(f_corner, j - 1 + p, ny, bc_s);
#pragma unroll
        for (int q = 0; q < 3; ++q) {
            Q[p][q] = potential_vorticity(f, H[p][q], H[p][q + 1], H[p + 1][q], H[p + 1][q + 1],
                                          U[p][q + 1], U[p + 1][q + 1], V[p + 1][q], V[p + 1][q + 1],
                                          rdx, rdy, quarter);
        }
    }

    // Arakawa-Lamb coefficients of this cell (j, i), its west neighbour
    // (j, i-1) and its south neighbour (j-1, i).
    const T alpha_c = al_alpha(Q[1][1], Q[1][2], Q[2][1], Q[2][2], c24);
    const T beta_c = al_beta(Q[1][1], Q[1][2], Q[2][1], Q[2][2], c24);
    const T eps_c = al_epsilon(Q[1][1], Q[1][2], Q[2][1], Q[2][2], c_eps);
    const T phi_c = al_phi(Q[1][1], Q[1][2], Q[2][1], Q[2][2], c_phi);
    const T alpha_w = al_alpha(Q[1][0], Q[1][1], Q[2][0], Q[2][1], c24);
    const T beta_w = al_beta(Q[1][0], Q[1][1], Q[2][0], Q[2][1], c24);
    const T eps_w = al_epsilon(Q[1][0], Q[1][1], Q[2][0], Q[2][1], c_eps);
    const T alpha_s = al_alpha(Q[0][1], Q[0][2], Q[1][1], Q[1][2], c24);
    const T beta_s = al_beta(Q[0][1], Q[0][2], Q[1][1], Q[1][2], c24);
    const T phi_s = al_phi(Q[0][1], Q[0][2], Q[1][1], Q[1][2], c_phi);

    // Zonal mass flux UF(j', i') on west faces, meridional VF(j', i') on south faces.
    const T uf_c = mass_flux(H[2][1], H[2][2], U[2][2], half);    // (j,   i)
    const T uf_e = mass_flux(H[2][2], H[2][3], U[2][3], half);    // (j,   i+1)
    const T uf_w = mass_flux(H[2][0], H[2][1], U[2][1], half);    // (j,   i-1)
    const T uf_s = mass_flux(H[1][1], H[1][2], U[1][2], half);    // (j-1, i)
    const T uf_se = mass_flux(H[1][2], H[1][3], U[1][3], half);   // (j-1, i+1)
    const T vf_c = mass_flux(H[1][2], H[2][2], V[2][2], half);    // (j,   i)
    const T vf_n = mass_flux(H[2][2], H[3][2], V[3][2], half);    // (j+1, i)
    const T vf_w = mass_flux(H[1][1], H[2][1], V[2][1], half);    // (j,   i-1)
    const T vf_nw = mass_flux(H[2][1], H[3][1], V[3][1], half);   // (j+1, i-1)
    const T vf_s = mass_flux(H[0][2], H[1][2], V[1][2], half);    // (j-1, i)

    const T bern_c = bernoulli(g, H[2][2], U[2][2], U[2][3], V[2][2], V[3][2], quarter);  // (j, i)
    const T bern_w = bernoulli(g, H[2][1], U[2][1], U[2][2], V[2][1], V[3][1], quarter);  // (j, i-1)
    const T bern_s = bernoulli(g, H[1][2], U[1][2], U[1][3], V[1][2], V[2][2], quarter);  // (j-1, i)

    T du = u_vortex_force(alpha_c, beta_w, alpha_w, beta_c, eps_c, eps_w,
                          vf_n, vf_nw, vf_w, vf_c, uf_e, uf_w)
           - (bern_c - bern_w) * rdx;
    T dv = v_vortex_force(alpha_s, beta_s, alpha_c, beta_c, phi_c, phi_s,
                          uf_s, uf_se, uf_e, uf_c, vf_n, vf_s)
           - (bern_c - bern_s) * rdy;
    const T dh = -((uf_e - uf_c) * rdx + (vf_n - vf_c) * rdy);
    if (nu != T(0)) {
        const T rdx2 = rdx * rdx;
        const T rdy2 = rdy * rdy;
        du += nu * laplacian_5pt(U[2][2], U[2][1], U[2][3], U[1][2], U[3][2], rdx2, rdy2);
        dv += nu * laplacian_5pt(V[2][2], V[2][1], V[2][3], V[1][2], V[3][2], rdx2, rdy2);
    }
    // The west wall u[:, 0] and the south wall v[0, :] stay zero.
    if (bc_x == BC_WALL && i == 0) du = T(0);
    if (bc_s == BC_WALL && j == 0) dv = T(0);

    const long long k = (long long)j * nx + i;
    if (a != T(0)) {
        // x0 + b (x - x0) rather than a x0 + b x: a + b rounds to 1 + 3e-8
        // in float for RK3's 1/3, 2/3, which would drift the mass.
        const T u_base = u0[k], v_base = v0[k], h_base = h0[k];
        u_out[k] = u_base + b * (U[2][2] - u_base) + c * du;
        v_out[k] = v_base + b * (V[2][2] - v_base) + c * dv;
        h_out[k] = h_base + b * (H[2][2] - h_base) + c * dh;
    } else {
        u_out[k] = b * U[2][2] + c * du;
        v_out[k] = b * V[2][2] + c * dv;
        h_out[k] = b * H[2][2] + c * dh;
    }
}
"""

KERNEL_SOURCE = _BOUNDARY_CODES + _KERNEL_BODY
"""CUDA C++ source of the module: device functions and ``__global__`` templates."""


def _xp(array):
    if type(array).__module__.split(".")[0] == "cupy":
        import cupy
        return cupy
    return np


@functools.cache
def _module():
    import cupy
    return cupy.RawModule(code=KERNEL_SOURCE, options=OPTIONS, name_expressions=NAME_EXPRESSIONS)


@functools.cache
def _kernel(name, dtype_name):
    """The compiled ``name<T>`` for a dtype name (a RawKernel, compiled per device on use)."""
    return _module().get_function(f"{name}<{CTYPES[dtype_name]}>")


MAX_GRID_Y = 65535
"""CUDA's limit on blocks along y: one thread per point caps ny at 65535 * 8."""


def _grid(ny, nx):
    """Blocks (x, y, z) covering an (ny, nx) grid with :data:`BLOCK`."""
    grid = (-(-nx // BLOCK[0]), -(-ny // BLOCK[1]), 1)
    if grid[1] > MAX_GRID_Y:
        raise ConfigError(f"the cupy stencil kernels take at most {MAX_GRID_Y * BLOCK[1]} rows per "
                          f"array; got ny={ny}. Split the grid into partitions along y")
    return grid


def _launch(name, shape, dtype, args):
    _kernel(name, dtype.name)(_grid(*shape), BLOCK, args)


def _float_type(array):
    """The NumPy scalar type that kernel scalars are passed with."""
    if array.dtype.name not in CTYPES:
        raise ConfigError(f"stencil kernels take float32 or float64 arrays; got dtype {array.dtype}")
    return array.dtype.type


def _input(array, like):
    """``array`` as a C-contiguous array on ``like``'s device with its dtype.

    Copies only when needed (host arrays, other dtypes, strided views): the
    kernels index raw row-major memory.
    """
    xp = _xp(like)
    return xp.ascontiguousarray(xp.asarray(array, dtype=like.dtype))


def _target(out, dtype):
    """Where a kernel writes ``out``: itself, or a scratch array to copy back."""
    if out.dtype == dtype and out.flags.c_contiguous:
        return out
    return _xp(out).empty(out.shape, dtype)


def laplacian(field, out, rdx2, rdy2, bc_x, bc_s, bc_n):
    """Five-point Laplacian into ``out``; see ``_numpy.laplacian``."""
    t = _float_type(field)
    field = _input(field, field)
    target = _target(out, field.dtype)
    ny, nx = field.shape
    _launch("laplacian_kernel", field.shape, field.dtype,
            (field, target, np.int32(ny), np.int32(nx), t(rdx2), t(rdy2),
             np.int32(bc_x), np.int32(bc_s)))
    if target is not out:
        out[...] = target
    return out


def diffuse(field, work, cx, cy, steps, bc_x, bc_s, bc_n):
    """``steps`` explicit diffusion steps; returns the buffer holding the result."""
    t = _float_type(field)
    dtype = field.dtype
    src, dst = _target(field, dtype), _target(work, dtype)
    if src is not field:
        src[...] = field
    ny, nx = field.shape
    for _ in range(int(steps)):
        _launch("diffuse_kernel", field.shape, dtype,
                (src, dst, np.int32(ny), np.int32(nx), t(cx), t(cy), np.int32(bc_x), np.int32(bc_s)))
        src, dst = dst, src
    if src is field or src is work:
        return src
    field[...] = src
    return field


def shallow_water_stage(u0, v0, h0, u, v, h, u_out, v_out, h_out,
                        f_corner, g, rdx, rdy, nu, a, b, c, bc_x, bc_s, bc_n):
    """Fused RK stage ``out = a*state0 + b*state + c*tendency(state)``; see ``_numpy``."""
    t = _float_type(h)
    dtype = h.dtype
    u, v, h = (_input(x, h) for x in (u, v, h))
    if a == 0:
        u0, v0, h0 = u, v, h  # valid pointers; the kernel does not read them
    else:
        u0, v0, h0 = (_input(x, h) for x in (u0, v0, h0))
    f_corner = _input(f_corner, h)
    outs = (u_out, v_out, h_out)
    targets = tuple(_target(o, dtype) for o in outs)
    ny, nx = h.shape
    _launch("sw_stage_kernel", h.shape, dtype,
            (u0, v0, h0, u, v, h, *targets, f_corner,
             np.int32(ny), np.int32(nx), t(g), t(rdx), t(rdy), t(nu), t(a), t(b), t(c),
             t(rdx / (24.0 * rdy)), t(rdy / (24.0 * rdx)),
             np.int32(bc_x), np.int32(bc_s), np.int32(bc_n)))
    for out, target in zip(outs, targets):
        if target is not out:
            out[...] = target


def shallow_water_tendency(u, v, h, f_corner, g, rdx, rdy, nu, bc_x, bc_s, bc_n):
    """Tendencies ``(du, dv, dh)``; see ``_numpy.shallow_water_tendency``."""
    xp = _xp(h)
    du, dv, dh = (xp.empty(h.shape, h.dtype) for _ in range(3))
    shallow_water_stage(u, v, h, u, v, h, du, dv, dh, f_corner, g, rdx, rdy, nu,
                        0.0, 0.0, 1.0, bc_x, bc_s, bc_n)
    return du, dv, dh
