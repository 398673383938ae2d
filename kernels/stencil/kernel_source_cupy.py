"""The ``__global__`` kernels of the CuPy stencil backend, as CUDA C++ source.

:data:`KERNEL_SOURCE` is what :mod:`._cupy` compiles with NVRTC (and the
tests compile on the CPU with g++): the device functions of
:mod:`.device_source_cupy`, then the templates here, on the float type, the
vector width and (five-point kernels) the strip height:

- ``laplacian_kernel`` and ``diffuse_kernel``: a thread loads its whole
  strip of rows first, then computes and stores it;
- ``sw_stage_kernel``: one fused Runge-Kutta stage that pipelines rows,
  carrying what later rows need in registers, with its register caps per
  instance (``sw_stage_tuning``).

See :mod:`._cupy` for the launch shapes and why the kernels look as they
do. Plain text: importing this module imports neither CuPy nor anything on
the GPU.
"""

from hpcgpu.kernels.stencil.device_source_cupy import DEVICE_SOURCE

__all__ = ["KERNEL_SOURCE"]

_GLOBAL_KERNELS = r"""
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
// field), and where that row is stored (rows lie `pitch` elements apart).
// These are the loads that go to DRAM: the kernel issues them one row ahead.
template<typename T, int VEC>
struct sw_own {
    hg_vec<T, VEC> h, u, v;
    long long row;  // offset of the stored row
    bool v_zero;    // row r lies beyond a wall: v is zero there
};

template<typename T, int VEC>
__device__ __forceinline__ void sw_load_own(sw_own<T, VEC>& x, const T* __restrict__ u,
                                            const T* __restrict__ v, const T* __restrict__ h,
                                            int r, int ny, int pitch, int i0, int bc_s, int bc_n)
{
    x.row = (long long)neighbour_row(r, ny, bc_s) * pitch;
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
                                int ny, int nx, int pitch, int col0, int rows,
                                T g, T rdx, T rdy, T nu, T a, T b, T c,
                                T c_eps, T c_phi, int bc_x, int bc_s, int bc_n)
{
    // The window of columns col0 .. col0+nx-1 of arrays whose rows lie pitch
    // elements apart, stepped as if it were the whole grid (bc_x at its edges).
    u0 += col0; v0 += col0; h0 += col0; u += col0; v += col0; h += col0;
    u_out += col0; v_out += col0; h_out += col0;
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
    sw_load_own<T, VEC>(ahead, u, v, h, j0 - 2, ny, pitch, i0, bc_s, bc_n);
    sw_fill_row<T, VEC>(prev, ahead, u, v, h, w2, w, e, u_west_zero, u_east_zero);
    sw_load_own<T, VEC>(ahead, u, v, h, j0 - 1, ny, pitch, i0, bc_s, bc_n);
    T q_o[W] = {}, vf_o[W] = {}, vf_s[W] = {}, uf_s[W] = {};
    T alpha_s[W] = {}, beta_s[W] = {}, phi_s[W] = {}, bern_s[W] = {}, u_s[W] = {}, v_s[W] = {};

    // Unrolled by two where registers are not capped, so that the rows
    // carried north swap registers instead of being copied.
#pragma unroll (sw_stage_tuning<T, VEC>::unroll)
    for (int r = j0 - 1; r <= j1; ++r) {
        sw_fill_row<T, VEC>(cur, ahead, u, v, h, w2, w, e, u_west_zero, u_east_zero);
        sw_load_own<T, VEC>(ahead, u, v, h, r + 1, ny, pitch, i0, bc_s, bc_n);
        const int jo = r - 1;
        const bool write = jo >= j0;
        const long long k_out = (long long)jo * pitch + i0;

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

KERNEL_SOURCE = DEVICE_SOURCE + _GLOBAL_KERNELS
"""CUDA C++ source of the module: device functions and ``__global__`` templates."""
