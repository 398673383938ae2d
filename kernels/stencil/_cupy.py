"""Stencil kernels for the GPU as CuPy ``RawModule`` CUDA C++ kernels.

Every kernel gives each thread ``vec`` adjacent columns and a strip of
``rows`` rows, and runs blocks of ``threads`` threads along x (so a warp
reads 32 * ``vec`` neighbouring points of a row, coalesced, in one vector load
of 16 bytes per thread when ``vec`` is 4 in float or 2 in double). A thread
walks its strip northwards and keeps the rows it still needs in registers:

- ``laplacian`` and ``diffuse`` load the whole strip first (``rows + 2``
  vector loads and two scalar neighbour loads per row), so many bytes are in
  flight per thread, then compute and store it: one DRAM read and one write
  per point, plus the two halo rows per strip.
- ``shallow_water_stage`` is one fused pass per Runge-Kutta stage that
  pipelines rows as ``_numba._stage_kernel`` does: per row it computes the
  potential vorticity of one new corner row, the mass fluxes, the Bernoulli
  potential and the Arakawa-Lamb coefficients of one new cell row, for its
  columns and the one or two neighbours the stencil reaches, and carries the
  rows behind it in registers.

Vector kernels need every array aligned to the vector and ``nx`` a multiple
of ``vec``; other arrays run the ``vec = 1`` instance of the same template.
The launch shapes are :data:`LAUNCH` (per kernel family and dtype), with
alternatives in :data:`VARIANTS` that ``scripts/gpu_kernel_variants.py``
times against them.

The per-point physics mirrors ``physics`` as ``__device__`` functions and
the ghost rules mirror ``_numba``: periodic edges wrap, wall and open edges
clamp, the normal velocity beyond a wall is zero, and beyond a Dirichlet
edge (scalar kernels only) the five-point kernels use the boundary value.

The stage kernel's registers are capped per instance (``sw_stage_tuning``
in the source, ``__maxnreg__``: CUDA >= 12.4) at the fewest that compile
without spilling at the next occupancy step: 64 / 96 / 168 for float with
vec 1 / 2 / 4, 128 for double with vec 1 (50, 31, 19 and 25 % occupancy,
from 31, 25, 12.5 and 19 %), at the cost of loading ``u0, v0, h0`` just
before the row's store and not unrolling the row loop by two. ptxas then
fuses one more multiply-add per row into an FMA than the unrolled loop did
(which alternated between even and odd rows), so these instances differ
from the previous ones by rounding (within the float32 / float64 tolerances
against NumPy), not bit for bit.

The CUDA source is the string :data:`KERNEL_SOURCE` (templates on the float
type, vector width and strip height; no headers, no shared memory, no
``__syncthreads``, no warp shuffles), compiled by NVRTC on first use through
a cached :class:`cupy.RawModule`. Importing this module does not import CuPy
or touch the GPU. The tests compile the same text on the CPU with g++ and run
it thread by thread (``tests/kernels/test_stencil_cupy_source.py``).
"""

import functools
from typing import NamedTuple

import numpy as np

from hpcgpu.errors import ConfigError
from hpcgpu.kernels import launch_limits
from hpcgpu.kernels.stencil.boundary import DIRICHLET, PERIODIC, WALL


class StencilCupyLaunch(NamedTuple):
    """How a kernel family is launched for one dtype."""

    vec: int
    """Adjacent columns per thread (values per vector load)."""
    rows: int
    """Rows per thread: the height of the strip a thread walks."""
    threads: int
    """Threads per block, all along x."""


OPTIONS = ("--std=c++17",)
"""NVRTC options of the module."""

CTYPES = {"float32": "float", "float64": "double"}
"""C++ type of each supported NumPy dtype (the template argument)."""

FAMILIES = {"five_point": ("laplacian_kernel", "diffuse_kernel"), "stage": ("sw_stage_kernel",)}
"""The ``__global__`` templates of :data:`KERNEL_SOURCE`, by launch family."""

KERNELS = tuple(name for names in FAMILIES.values() for name in names)

LAUNCH = {
    ("five_point", "float32"): StencilCupyLaunch(vec=4, rows=8, threads=128),
    ("five_point", "float64"): StencilCupyLaunch(vec=2, rows=8, threads=128),
    ("stage", "float32"): StencilCupyLaunch(vec=2, rows=16, threads=128),
    ("stage", "float64"): StencilCupyLaunch(vec=1, rows=16, threads=128),
}
"""The launch of each kernel family per dtype (vec falls back to 1 when unaligned)."""

VARIANTS = {
    ("five_point", "float32"): (StencilCupyLaunch(1, 8, 128), StencilCupyLaunch(2, 8, 128),
                                StencilCupyLaunch(4, 4, 128), StencilCupyLaunch(4, 16, 128),
                                StencilCupyLaunch(4, 8, 256), StencilCupyLaunch(4, 8, 64)),
    ("five_point", "float64"): (StencilCupyLaunch(1, 8, 128), StencilCupyLaunch(2, 4, 128),
                                StencilCupyLaunch(2, 16, 128), StencilCupyLaunch(2, 8, 256),
                                StencilCupyLaunch(2, 8, 64)),
    ("stage", "float32"): (StencilCupyLaunch(1, 16, 128), StencilCupyLaunch(4, 16, 128), StencilCupyLaunch(2, 8, 128),
                           StencilCupyLaunch(2, 32, 128), StencilCupyLaunch(2, 16, 64),
                           StencilCupyLaunch(2, 16, 256)),
    ("stage", "float64"): (StencilCupyLaunch(2, 16, 128), StencilCupyLaunch(1, 8, 128), StencilCupyLaunch(1, 32, 128),
                           StencilCupyLaunch(1, 16, 64), StencilCupyLaunch(1, 16, 256)),
}
"""Alternative launches, timed by ``scripts/gpu_kernel_variants.py``."""


def _expression(name, dtype_name, vec, rows):
    """The template instance of kernel ``name``: ``rows`` is a template argument
    of the five-point kernels only (the stage kernel takes it at run time)."""
    ctype = CTYPES[dtype_name]
    if name in FAMILIES["stage"]:
        return f"{name}<{ctype}, {vec}>"
    return f"{name}<{ctype}, {vec}, {rows}>"


def _instances(launches):
    """Template instances that ``launches`` (a {(family, dtype): [StencilCupyLaunch]} map) run,
    the ``vec = 1`` fallback of each included."""
    out = []
    for (family, dtype_name), options in launches.items():
        for launch in options:
            for vec in sorted({1, launch.vec}):
                for name in FAMILIES[family]:
                    expression = _expression(name, dtype_name, vec, launch.rows)
                    if expression not in out:
                        out.append(expression)
    return tuple(out)


NAME_EXPRESSIONS = _instances({key: (launch,) for key, launch in LAUNCH.items()})
"""Template instances of the default launches, as passed to ``get_function``."""

VARIANT_EXPRESSIONS = tuple(e for e in _instances(VARIANTS) if e not in NAME_EXPRESSIONS)
"""Further instances that only :data:`VARIANTS` use (a second module, compiled on demand)."""

_BOUNDARY_CODES = f"""
constexpr int BC_PERIODIC = {PERIODIC};
constexpr int BC_WALL = {WALL};
constexpr int BC_DIRICHLET = {DIRICHLET};
"""

_KERNEL_BODY = r"""
// Per-kernel register caps (__maxnreg__) are CUDA >= 12.4, a macro of its
// headers (NVRTC's built-in ones too); an older NVRTC compiles without the
// caps, and so do the tests' CPU emulation.
#ifndef __maxnreg__
#define __maxnreg__(n)
#endif

// ---- grid indexing -------------------------------------------------------
// Logical indices may lie up to two points beyond the grid; these map them
// to the stored point they read (the ghost rules of ``boundary``).

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

// ---- per-point physics (mirrors physics.py) ----------------------------

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

// ---- vectors ---------------------------------------------------------------
// N adjacent values moved by one load or store instruction: 16 bytes for
// float x 4 and double x 2. The caller guarantees the alignment (the launch
// code checks every pointer and that nx is a multiple of N).

template<typename T, int N>
struct alignas(sizeof(T) * N) hg_vec {
    T v[N];
};

template<typename T, int N>
__device__ __forceinline__ hg_vec<T, N> load_vec(const T* __restrict__ p)
{
    return *reinterpret_cast<const hg_vec<T, N>*>(p);
}

template<typename T, int N>
__device__ __forceinline__ void store_vec(T* __restrict__ p, const hg_vec<T, N>& x)
{
    *reinterpret_cast<hg_vec<T, N>*>(p) = x;
}

// ---- five-point kernels ----------------------------------------------------
// Each thread owns VEC adjacent columns and a strip of ROWS rows; a block is a
// row of threads along x. The thread issues every load of its strip first:
// ROWS + 2 vector loads of its own columns (each value comes from DRAM once;
// the two halo rows are shared with the strips below and above, mostly
// through L2) and one scalar load of the west and the east neighbour per row
// (lines the neighbouring threads load, so L1 hits). With that many bytes in
// flight per thread the kernel streams at copy speed; then it computes and
// stores the strip. Scalar fields read no normal velocity, so wall and open
// edges both clamp; beyond a Dirichlet edge the neighbour is the boundary
// value instead of a load (a branch uniform across the strip's row).

template<typename T, int VEC, int ROWS, bool DIFFUSE>
__device__ __forceinline__ void five_point_strip(const T* __restrict__ src, T* __restrict__ dst,
                                                 int ny, int nx, T c_x, T c_y, int bc_x, int bc_s,
                                                 int bc_n, T value)
{
    const int i0 = (int)(blockIdx.x * blockDim.x + threadIdx.x) * VEC;
    if (i0 >= nx) return;
    const int j0 = (int)blockIdx.y * ROWS;
    const int w = neighbour_col(i0 - 1, nx, bc_x);
    const int e = neighbour_col(i0 + VEC, nx, bc_x);
    const bool fixed_w = bc_x == BC_DIRICHLET && i0 == 0;
    const bool fixed_e = bc_x == BC_DIRICHLET && i0 + VEC >= nx;
    hg_vec<T, VEC> fixed;
#pragma unroll
    for (int m = 0; m < VEC; ++m) fixed.v[m] = value;
    // Row k of the strip is logical row j0 - 1 + k; rows past the grid's end
    // (last strip) read a valid clamped or wrapped row and are not stored.
    hg_vec<T, VEC> centre[ROWS + 2];
    T west[ROWS], east[ROWS];
#pragma unroll
    for (int k = 0; k < ROWS + 2; ++k) {
        const int r = j0 - 1 + k;
        const long long row = (long long)neighbour_row(r, ny, bc_s) * nx;
        if ((r < 0 && bc_s == BC_DIRICHLET) || (r >= ny && bc_n == BC_DIRICHLET)) {
            centre[k] = fixed;
        } else {
            centre[k] = load_vec<T, VEC>(src + row + i0);
        }
        if (k >= 1 && k <= ROWS) {
            west[k - 1] = fixed_w ? value : src[row + w];
            east[k - 1] = fixed_e ? value : src[row + e];
        }
    }
#pragma unroll
    for (int k = 0; k < ROWS; ++k) {
        const int j = j0 + k;
        if (j >= ny) break;
        hg_vec<T, VEC> out;
#pragma unroll
        for (int m = 0; m < VEC; ++m) {
            const T c = centre[k + 1].v[m];
            const T wv = m == 0 ? west[k] : centre[k + 1].v[m == 0 ? 0 : m - 1];
            const T ev = m == VEC - 1 ? east[k] : centre[k + 1].v[m == VEC - 1 ? m : m + 1];
            out.v[m] = DIFFUSE ? diffusion_update(c, wv, ev, centre[k].v[m], centre[k + 2].v[m], c_x, c_y)
                               : laplacian_5pt(c, wv, ev, centre[k].v[m], centre[k + 2].v[m], c_x, c_y);
        }
        store_vec<T, VEC>(dst + (long long)j * nx + i0, out);
    }
}

template<typename T, int VEC, int ROWS>
__global__ void laplacian_kernel(const T* __restrict__ field, T* __restrict__ out,
                                 int ny, int nx, T rdx2, T rdy2, int bc_x, int bc_s, int bc_n, T value)
{
    five_point_strip<T, VEC, ROWS, false>(field, out, ny, nx, rdx2, rdy2, bc_x, bc_s, bc_n, value);
}

template<typename T, int VEC, int ROWS>
__global__ void diffuse_kernel(const T* __restrict__ src, T* __restrict__ dst,
                               int ny, int nx, T cx, T cy, int bc_x, int bc_s, int bc_n, T value)
{
    five_point_strip<T, VEC, ROWS, true>(src, dst, ny, nx, cx, cy, bc_x, bc_s, bc_n, value);
}

// ---- shallow-water stage ---------------------------------------------------
// One Runge-Kutta stage out = a*state0 + b*state + c*tendency(state). Each
// thread owns VEC adjacent columns i0 .. i0+VEC-1 and walks a strip of `rows`
// rows northwards, as _numba._stage_kernel walks its rows: at step r it loads
// row r of u, v, h, computes potential vorticity on corner row r and the
// meridional mass flux on face row r, then the zonal mass flux, Bernoulli
// potential and Arakawa-Lamb coefficients of cell row r-1, and writes output
// row r-1. Everything the next rows need is carried in registers, so each
// quantity is computed for the thread's columns plus one or two neighbours
// (potential vorticity VEC + 2 times per VEC points) instead of per use.
// Arrays of VEC + 3 entries hold columns i0-2 .. i0+VEC: entry k is column
// i0 - 2 + k; the thread's own columns are k = 2 .. VEC+1.

template<typename T, int VEC>
struct sw_row {
    T h[VEC + 3];
    T u[VEC + 3];  // u[0] is never read
    T v[VEC + 3];
};

// The thread's own columns of u, v, h on logical row r (one vector load per
// field), and where that row is stored. These are the loads that go to DRAM:
// the kernel issues them one row ahead.
template<typename T, int VEC>
struct sw_own {
    hg_vec<T, VEC> h, u, v;
    long long row;  // offset of the stored row
    bool v_zero;    // row r lies beyond a wall: v is zero there
};

template<typename T, int VEC>
__device__ __forceinline__ void sw_load_own(sw_own<T, VEC>& x, const T* __restrict__ u,
                                            const T* __restrict__ v, const T* __restrict__ h,
                                            int r, int ny, int nx, int i0, int bc_s, int bc_n)
{
    x.row = (long long)neighbour_row(r, ny, bc_s) * nx;
    x.v_zero = (r < 0 && bc_s == BC_WALL) || (r >= ny && bc_n == BC_WALL);
    x.h = load_vec<T, VEC>(h + x.row + i0);
    x.u = load_vec<T, VEC>(u + x.row + i0);
    x.v = hg_vec<T, VEC>{};
    if (!x.v_zero) x.v = load_vec<T, VEC>(v + x.row + i0);
}

// Row r complete: the own columns loaded a step earlier, plus the neighbour
// columns (stored indices w2, w, e) as scalar loads of lines the
// neighbouring threads loaded in that step (L1 hits).
template<typename T, int VEC>
__device__ __forceinline__ void sw_fill_row(sw_row<T, VEC>& x, const sw_own<T, VEC>& own,
                                            const T* __restrict__ u, const T* __restrict__ v,
                                            const T* __restrict__ h, int w2, int w, int e,
                                            bool u_west_zero, bool u_east_zero)
{
#pragma unroll
    for (int m = 0; m < VEC; ++m) {
        x.h[m + 2] = own.h.v[m];
        x.u[m + 2] = own.u.v[m];
        x.v[m + 2] = own.v.v[m];
    }
    const long long row = own.row;
    x.h[0] = h[row + w2];
    x.h[1] = h[row + w];
    x.h[VEC + 2] = h[row + e];
    x.u[0] = T(0);
    x.u[1] = u_west_zero ? T(0) : u[row + w];
    x.u[VEC + 2] = u_east_zero ? T(0) : u[row + e];
    x.v[0] = own.v_zero ? T(0) : v[row + w2];
    x.v[1] = own.v_zero ? T(0) : v[row + w];
    x.v[VEC + 2] = own.v_zero ? T(0) : v[row + e];
}

// Registers per thread and unrolling of the stage kernel, per instance: the
// fewest registers that compile without a spill on sm_90 (CUDA 13) at the
// next occupancy step, 128 threads a block. Capped instances do not unroll
// the row loop by two (the swapped rows keep more values live; unrolled, the
// copies north are register moves instead): float x 1 at 64 registers (50 %
// occupancy, from 31.25 % at 94), float x 2 at 96 (31.25 %, from 25 % at
// 128), float x 4 at 168 (18.75 %, from 12.5 % at 175), double x 1 at 128
// (25 %, from 18.75 % at 160). double x 2 spills below its 200-220 (12.5 %)
// and stays as it was. Same operations; ptxas fuses one more multiply-add a
// row without the unrolling (see the module docstring).
template<typename T, int VEC> struct sw_stage_tuning {
    static constexpr int registers = 255;
    static constexpr int unroll = 2;
};
template<> struct sw_stage_tuning<float, 1> {
    static constexpr int registers = 64;
    static constexpr int unroll = 1;
};
template<> struct sw_stage_tuning<float, 2> {
    static constexpr int registers = 96;
    static constexpr int unroll = 1;
};
template<> struct sw_stage_tuning<float, 4> {
    static constexpr int registers = 168;
    static constexpr int unroll = 1;
};
template<> struct sw_stage_tuning<double, 1> {
    static constexpr int registers = 128;
    static constexpr int unroll = 1;
};

template<typename T, int VEC>
__maxnreg__((sw_stage_tuning<T, VEC>::registers))
__global__ void sw_stage_kernel(const T* __restrict__ u0, const T* __restrict__ v0,
                                const T* __restrict__ h0,
                                const T* __restrict__ u, const T* __restrict__ v,
                                const T* __restrict__ h,
                                T* __restrict__ u_out, T* __restrict__ v_out, T* __restrict__ h_out,
                                const T* __restrict__ f_corner,
                                int ny, int nx, int rows, T g, T rdx, T rdy, T nu, T a, T b, T c,
                                T c_eps, T c_phi, int bc_x, int bc_s, int bc_n)
{
    constexpr int W = VEC + 3;
    const int i0 = (int)(blockIdx.x * blockDim.x + threadIdx.x) * VEC;
    if (i0 >= nx) return;
    const int j0 = (int)blockIdx.y * rows;
    const int j1 = j0 + rows < ny ? j0 + rows : ny;  // output rows j0 .. j1-1
    const T half = T(0.5);
    const T quarter = T(0.25);
    const T c24 = T(1.0 / 24.0);
    const T rdx2 = rdx * rdx;
    const T rdy2 = rdy * rdy;
    const bool use_base = a != T(0);
    const bool viscous = nu != T(0);
    const int w2 = neighbour_col(i0 - 2, nx, bc_x);
    const int w = neighbour_col(i0 - 1, nx, bc_x);
    const int e = neighbour_col(i0 + VEC, nx, bc_x);
    // u beyond a wall in x is zero (normal_col == -1).
    const bool u_west_zero = normal_col(i0 - 1, nx, bc_x) < 0;
    const bool u_east_zero = normal_col(i0 + VEC, nx, bc_x) < 0;

    // Suffix _s: row r-2 (south of the output row), _o: row r-1 (the output
    // row), _n: row r (north of it). Raw rows: prev = r-1, cur = r; the own
    // columns of row r+1 are loaded a step ahead (ahead: always a valid row,
    // clamped or wrapped, so the load needs no branch), which keeps them in
    // flight during the compute of row r.
    sw_own<T, VEC> ahead;
    sw_row<T, VEC> prev, cur;
    sw_load_own<T, VEC>(ahead, u, v, h, j0 - 2, ny, nx, i0, bc_s, bc_n);
    sw_fill_row<T, VEC>(prev, ahead, u, v, h, w2, w, e, u_west_zero, u_east_zero);
    sw_load_own<T, VEC>(ahead, u, v, h, j0 - 1, ny, nx, i0, bc_s, bc_n);
    T q_o[W] = {}, vf_o[W] = {}, vf_s[W] = {}, uf_s[W] = {};
    T alpha_s[W] = {}, beta_s[W] = {}, phi_s[W] = {}, bern_s[W] = {}, u_s[W] = {}, v_s[W] = {};

    // Unrolled by two where registers are not capped, so that the rows
    // carried north swap registers instead of being copied.
#pragma unroll (sw_stage_tuning<T, VEC>::unroll)
    for (int r = j0 - 1; r <= j1; ++r) {
        sw_fill_row<T, VEC>(cur, ahead, u, v, h, w2, w, e, u_west_zero, u_east_zero);
        sw_load_own<T, VEC>(ahead, u, v, h, r + 1, ny, nx, i0, bc_s, bc_n);
        const int jo = r - 1;
        const bool write = jo >= j0;
        const long long k_out = (long long)jo * nx + i0;

        // Corner row r (corners k = 1 .. VEC+2) and face row r (k = 1 .. VEC+1).
        const T f = coriolis_row(f_corner, r, ny, bc_s);
        T q_n[W] = {}, vf_n[W] = {};
#pragma unroll
        for (int k = 1; k <= VEC + 2; ++k) {
            q_n[k] = potential_vorticity(f, prev.h[k - 1], prev.h[k], cur.h[k - 1], cur.h[k],
                                         prev.u[k], cur.u[k], cur.v[k - 1], cur.v[k], rdx, rdy, quarter);
        }
#pragma unroll
        for (int k = 1; k <= VEC + 1; ++k) vf_n[k] = mass_flux(prev.h[k], cur.h[k], cur.v[k], half);

        // Cell row r-1: zonal flux on west faces k = 1 .. VEC+2, the rest on cells k = 1 .. VEC+1.
        T uf_o[W] = {}, bern_o[W] = {}, alpha_o[W] = {}, beta_o[W] = {}, eps_o[W] = {}, phi_o[W] = {};
#pragma unroll
        for (int k = 1; k <= VEC + 2; ++k) uf_o[k] = mass_flux(prev.h[k - 1], prev.h[k], prev.u[k], half);
#pragma unroll
        for (int k = 1; k <= VEC + 1; ++k) {
            bern_o[k] = bernoulli(g, prev.h[k], prev.u[k], prev.u[k + 1], prev.v[k], cur.v[k], quarter);
            alpha_o[k] = al_alpha(q_o[k], q_o[k + 1], q_n[k], q_n[k + 1], c24);
            beta_o[k] = al_beta(q_o[k], q_o[k + 1], q_n[k], q_n[k + 1], c24);
            eps_o[k] = al_epsilon(q_o[k], q_o[k + 1], q_n[k], q_n[k + 1], c_eps);
            phi_o[k] = al_phi(q_o[k], q_o[k + 1], q_n[k], q_n[k + 1], c_phi);
        }

        if (write) {
            // Loaded here, not with the row ahead: live through the whole row's
            // compute they took the registers that keep the cap spill-free.
            hg_vec<T, VEC> u_base = {}, v_base = {}, h_base = {};
            if (use_base) {
                u_base = load_vec<T, VEC>(u0 + k_out);
                v_base = load_vec<T, VEC>(v0 + k_out);
                h_base = load_vec<T, VEC>(h0 + k_out);
            }
            hg_vec<T, VEC> u_new, v_new, h_new;
#pragma unroll
            for (int m = 0; m < VEC; ++m) {
                const int k = m + 2;
                T du = u_vortex_force(alpha_o[k], beta_o[k - 1], alpha_o[k - 1], beta_o[k],
                                      eps_o[k], eps_o[k - 1],
                                      vf_n[k], vf_n[k - 1], vf_o[k - 1], vf_o[k],
                                      uf_o[k + 1], uf_o[k - 1])
                       - (bern_o[k] - bern_o[k - 1]) * rdx;
                T dv = v_vortex_force(alpha_s[k], beta_s[k], alpha_o[k], beta_o[k], phi_o[k], phi_s[k],
                                      uf_s[k], uf_s[k + 1], uf_o[k + 1], uf_o[k], vf_n[k], vf_s[k])
                       - (bern_o[k] - bern_s[k]) * rdy;
                const T dh = -((uf_o[k + 1] - uf_o[k]) * rdx + (vf_n[k] - vf_o[k]) * rdy);
                if (viscous) {
                    du += nu * laplacian_5pt(prev.u[k], prev.u[k - 1], prev.u[k + 1], u_s[k], cur.u[k],
                                             rdx2, rdy2);
                    dv += nu * laplacian_5pt(prev.v[k], prev.v[k - 1], prev.v[k + 1], v_s[k], cur.v[k],
                                             rdx2, rdy2);
                }
                // The west wall u[:, 0] and the south wall v[0, :] stay zero.
                if (bc_x == BC_WALL && i0 + m == 0) du = T(0);
                if (bc_s == BC_WALL && jo == 0) dv = T(0);
                if (use_base) {
                    // x0 + b (x - x0) rather than a x0 + b x: a + b rounds to 1 + 3e-8
                    // in float for RK3's 1/3, 2/3, which would drift the mass.
                    u_new.v[m] = u_base.v[m] + b * (prev.u[k] - u_base.v[m]) + c * du;
                    v_new.v[m] = v_base.v[m] + b * (prev.v[k] - v_base.v[m]) + c * dv;
                    h_new.v[m] = h_base.v[m] + b * (prev.h[k] - h_base.v[m]) + c * dh;
                } else {
                    u_new.v[m] = b * prev.u[k] + c * du;
                    v_new.v[m] = b * prev.v[k] + c * dv;
                    h_new.v[m] = b * prev.h[k] + c * dh;
                }
            }
            store_vec<T, VEC>(u_out + k_out, u_new);
            store_vec<T, VEC>(v_out + k_out, v_new);
            store_vec<T, VEC>(h_out + k_out, h_new);
        }

        // Move north by one row.
#pragma unroll
        for (int k = 2; k <= VEC + 1; ++k) {
            u_s[k] = prev.u[k];
            v_s[k] = prev.v[k];
            vf_s[k] = vf_o[k];
            alpha_s[k] = alpha_o[k];
            beta_s[k] = beta_o[k];
            phi_s[k] = phi_o[k];
            bern_s[k] = bern_o[k];
        }
#pragma unroll
        for (int k = 1; k <= VEC + 2; ++k) {
            uf_s[k] = uf_o[k];
            vf_o[k] = vf_n[k];
            q_o[k] = q_n[k];
        }
        prev = cur;
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
def _module(expressions):
    import cupy
    return cupy.RawModule(code=KERNEL_SOURCE, options=OPTIONS, name_expressions=expressions)


@functools.cache
def _kernel(expression):
    """The compiled template instance ``expression`` (a RawKernel, compiled per device on use).

    The default instances share one module; the variants' module is compiled
    only when a variant runs.
    """
    expressions = NAME_EXPRESSIONS if expression in NAME_EXPRESSIONS else VARIANT_EXPRESSIONS
    if expression not in expressions:
        raise ConfigError(f"no compiled instance {expression!r}; add its launch to LAUNCH or VARIANTS")
    return _module(expressions).get_function(expression)


MAX_GRID_Y = 65535
"""CUDA's limit on blocks along y: caps ny at 65535 * rows."""


def _grid(ny, nx, launch):
    """Blocks (x, y, z) covering an (ny, nx) grid with ``launch``."""
    # No shared memory (the source declares none): the strips live in registers.
    launch_limits.check("the cupy stencil kernels", launch, launch.threads)
    grid = (-(-nx // (launch.threads * launch.vec)), -(-ny // launch.rows), 1)
    if grid[1] > MAX_GRID_Y:
        raise ConfigError(f"the cupy stencil kernels take at most {MAX_GRID_Y * launch.rows} rows "
                          f"per array; got ny={ny}. Split the grid into partitions along y")
    return grid


def _address(array):
    if isinstance(array, np.ndarray):
        return array.ctypes.data
    return array.data.ptr


def _fitting(launch, nx, arrays):
    """``launch``, or its ``vec = 1`` form unless every array is aligned to the
    vector and rows hold whole vectors."""
    if launch.vec == 1:
        return launch
    width = launch.vec * arrays[0].dtype.itemsize
    if nx % launch.vec or any(_address(a) % width for a in arrays):
        return launch._replace(vec=1)
    return launch


def _launch(name, family, arrays, shape, args, launch=None):
    """Run kernel ``name`` of ``family`` over an (ny, nx) grid; ``arrays`` are
    the pointers it reads or writes with vector accesses."""
    dtype_name = arrays[0].dtype.name
    ny, nx = shape
    launch = _fitting(launch or LAUNCH[(family, dtype_name)], nx, arrays)
    kernel = _kernel(_expression(name, dtype_name, launch.vec, launch.rows))
    kernel(_grid(ny, nx, launch), (launch.threads, 1, 1), args)


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


def _five_point(name, src, dst, c_x, c_y, bc_x, bc_s, launch=None, *, bc_n=None, value=0.0):
    """One five-point kernel from ``src`` into ``dst`` (contiguous, same dtype).

    ``bc_n`` is the north edge's kind (default ``bc_s``'s: for a scalar field
    only a Dirichlet edge tells the two apart); ``value`` is the field beyond
    Dirichlet edges.
    """
    t = src.dtype.type
    ny, nx = src.shape
    bc_n = bc_s if bc_n is None else bc_n
    _launch(name, "five_point", (src, dst), src.shape,
            (src, dst, np.int32(ny), np.int32(nx), t(c_x), t(c_y), np.int32(bc_x), np.int32(bc_s),
             np.int32(bc_n), t(value)),
            launch)


def laplacian(field, out, rdx2, rdy2, bc_x, bc_s, bc_n, value=0.0):
    """Five-point Laplacian into ``out``; see ``_numpy.laplacian``."""
    _float_type(field)
    field = _input(field, field)
    target = _target(out, field.dtype)
    _five_point("laplacian_kernel", field, target, rdx2, rdy2, bc_x, bc_s, bc_n=bc_n, value=value)
    if target is not out:
        out[...] = target
    return out


def diffuse(field, work, cx, cy, steps, bc_x, bc_s, bc_n, value=0.0):
    """``steps`` explicit diffusion steps; returns the buffer holding the result.

    Beyond a Dirichlet edge the field is ``value``.
    """
    _float_type(field)
    dtype = field.dtype
    src, dst = _target(field, dtype), _target(work, dtype)
    if src is not field:
        src[...] = field
    for _ in range(int(steps)):
        _five_point("diffuse_kernel", src, dst, cx, cy, bc_x, bc_s, bc_n=bc_n, value=value)
        src, dst = dst, src
    if src is field or src is work:
        return src
    field[...] = src
    return field


def _stage(u0, v0, h0, u, v, h, u_out, v_out, h_out, f_corner, g, rdx, rdy, nu, a, b, c,
           bc_x, bc_s, bc_n, launch=None):
    """The stage kernel on contiguous arrays of one dtype (``*0`` unread when ``a == 0``)."""
    t = h.dtype.type
    ny, nx = h.shape
    vectors = (u, v, h, u_out, v_out, h_out) + ((u0, v0, h0) if a != 0 else ())
    launch = _fitting(launch or LAUNCH[("stage", h.dtype.name)], nx, vectors)
    _launch("sw_stage_kernel", "stage", vectors, h.shape,
            (u0, v0, h0, u, v, h, u_out, v_out, h_out, f_corner,
             np.int32(ny), np.int32(nx), np.int32(launch.rows), t(g), t(rdx), t(rdy), t(nu),
             t(a), t(b), t(c), t(rdx / (24.0 * rdy)), t(rdy / (24.0 * rdx)),
             np.int32(bc_x), np.int32(bc_s), np.int32(bc_n)),
            launch)


def shallow_water_stage(u0, v0, h0, u, v, h, u_out, v_out, h_out,
                        f_corner, g, rdx, rdy, nu, a, b, c, bc_x, bc_s, bc_n):
    """Fused RK stage ``out = a*state0 + b*state + c*tendency(state)``; see ``_numpy``."""
    _float_type(h)
    dtype = h.dtype
    u, v, h = (_input(x, h) for x in (u, v, h))
    if a == 0:
        u0, v0, h0 = u, v, h  # valid pointers; the kernel does not read them
    else:
        u0, v0, h0 = (_input(x, h) for x in (u0, v0, h0))
    f_corner = _input(f_corner, h)
    outs = (u_out, v_out, h_out)
    targets = tuple(_target(o, dtype) for o in outs)
    _stage(u0, v0, h0, u, v, h, *targets, f_corner, g, rdx, rdy, nu, a, b, c, bc_x, bc_s, bc_n)
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
