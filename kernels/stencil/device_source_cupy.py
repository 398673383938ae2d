"""The device functions of the CuPy stencil kernels, as CUDA C++ source.

The first part of :data:`hpcgpu.kernels.stencil.kernel_source_cupy.KERNEL_SOURCE`:
the boundary codes (the values of :mod:`.boundary`), the index arithmetic of
ghost cells (periodic edges wrap, wall and open edges clamp, the normal
velocity beyond a wall is zero: the rules of ``_numba``), the per-point
physics (mirroring :mod:`.physics` line for line) and the vector loads and
stores. Plain text: importing this module imports neither CuPy nor anything
on the GPU.
"""

from hpcgpu.kernels.stencil.boundary import DIRICHLET, PERIODIC, WALL

__all__ = ["DEVICE_SOURCE"]

_BOUNDARY_CODES = f"""
constexpr int BC_PERIODIC = {PERIODIC};
constexpr int BC_WALL = {WALL};
constexpr int BC_DIRICHLET = {DIRICHLET};
"""

_DEVICE_FUNCTIONS = r"""
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
"""

DEVICE_SOURCE = _BOUNDARY_CODES + _DEVICE_FUNCTIONS
"""CUDA C++ source of the boundary codes and the ``__device__`` functions the kernels call."""
