"""Direct-summation N-body kernel for the GPU as a CuPy ``RawModule`` (CUDA C++).

The same algorithm as ``_cuda`` (see :mod:`.tiling`): ``direct_kernel``
gives each thread one target and each block a tile of ``THREADS`` sources
at a time in shared memory, packed as one 16-byte ``{x, y, z, m}`` struct
per body in float (one shared-memory load per source), over one slice of
the sources per block row; ``finalize_kernel`` adds a target's partial sums
in slice order and applies ``G``. ``1/sqrt`` is ``rsqrtf`` in float (the
hardware reciprocal square root, within 2 ulp) and ``rsqrt`` in double. The
pair interaction mirrors ``physics`` as ``__device__`` functions.

The CUDA source is the string :data:`KERNEL_SOURCE` (templates on the float
type, block size and whether the potential is summed; no headers),
compiled by NVRTC on first use through a cached :class:`cupy.RawModule`.
Importing this module does not import CuPy or touch the GPU. The tests
compile the same text on the CPU with g++ and run each block's threads
phase by phase between barriers (``tests/kernels/test_nbody_cupy_source.py``).

The launch code hands the kernels C-contiguous arrays only: target
positions, which are usually a slice of the sources, are copied (3 values
per target, against ``N`` pair interactions per target).
"""


import numpy as np

from hpcgpu.errors import ConfigError
from hpcgpu.kernels.cupy_templates import TemplateKernels, array_module
from hpcgpu.kernels.nbody.tiling import FINALIZE_THREADS, LAUNCH, VARIANTS, blocks, check, slices

OPTIONS = ("--std=c++17",)
"""NVRTC options of the module."""

CTYPES = {"float32": "float", "float64": "double"}
"""C++ type of each supported NumPy dtype (the template argument)."""

KERNELS = ("direct_kernel", "finalize_kernel")


def _direct_expression(dtype_name, threads, potential):
    return f"direct_kernel<{CTYPES[dtype_name]}, {threads}, {str(potential).lower()}>"


def _finalize_expression(dtype_name, potential):
    return f"finalize_kernel<{CTYPES[dtype_name]}, {str(potential).lower()}>"


def _instances(launches):
    """Template instances that ``launches`` ({dtype: [DirectSumLaunch]}) run."""
    out = []
    for dtype_name, options in launches.items():
        for launch in options:
            for potential in (False, True):
                for expression in (_direct_expression(dtype_name, launch.threads, potential),
                                   _finalize_expression(dtype_name, potential)):
                    if expression not in out:
                        out.append(expression)
    return tuple(out)


NAME_EXPRESSIONS = _instances({name: (launch,) for name, launch in LAUNCH.items()})
"""Template instances of the default launches, as passed to ``get_function``."""

VARIANT_EXPRESSIONS = tuple(e for e in _instances(VARIANTS) if e not in NAME_EXPRESSIONS)
"""Further instances that only :data:`VARIANTS` use (a second module, compiled on demand)."""

KERNEL_SOURCE = r"""
// ---- pair interaction (mirrors physics.py) --------------------------------

template<typename T>
__device__ __forceinline__ T nb_inverse_sqrt(T r2);

template<>
__device__ __forceinline__ float nb_inverse_sqrt<float>(float r2) { return rsqrtf(r2); }

template<>
__device__ __forceinline__ double nb_inverse_sqrt<double>(double r2) { return rsqrt(r2); }

template<typename T>
__device__ __forceinline__ T distance_squared(T dx, T dy, T dz, T eps2)
{
    return eps2 + dx * dx + dy * dy + dz * dz;  // three fused multiply-adds
}

// 1/r, or 0 for a pair at zero separation without softening (a NaN r2
// keeps its NaN).
template<typename T>
__device__ __forceinline__ T exclude_coincident(T inv_r, T r2)
{
    return r2 == T(0) ? T(0) : inv_r;
}

// m/r^3 (acceleration weight) and m/r (potential term); m/r first, so a
// massless source gives exact zeros.
template<typename T>
__device__ __forceinline__ void pair_weights(T mass, T inv_r, T& weight, T& m_inv_r)
{
    m_inv_r = mass * inv_r;
    weight = m_inv_r * inv_r * inv_r;
}

// ---- tiled direct sum -------------------------------------------------------

template<typename T>
struct alignas(4 * sizeof(T)) nb_body {
    T x, y, z, m;
};

// Sums `count` bodies of a shared tile for the target at (x, y, z); body
// `self_k` of the tile is the target itself (left out of the potential).
template<typename T, bool POTENTIAL>
__device__ __forceinline__ void sum_tile(const nb_body<T>* tile, int count, T x, T y, T z,
                                         T eps2, int self_k, T& ax, T& ay, T& az, T& phi)
{
#pragma unroll 8
    for (int k = 0; k < count; ++k) {
        const nb_body<T> b = tile[k];  // the same address in every thread: a broadcast
        const T dx = b.x - x;
        const T dy = b.y - y;
        const T dz = b.z - z;
        const T r2 = distance_squared(dx, dy, dz, eps2);
        T inv_r = exclude_coincident(nb_inverse_sqrt(r2), r2);
        if (POTENTIAL && k == self_k) inv_r = T(0);
        T weight, m_inv_r;
        pair_weights(b.m, inv_r, weight, m_inv_r);
        ax += weight * dx;
        ay += weight * dy;
        az += weight * dz;
        if (POTENTIAL) phi += m_inv_r;
    }
}

// Grid (target blocks, source slices). targets: (3, n_targets) and sources:
// (3, n_sources) positions, C-contiguous; partial: (slices, 3 or 4,
// n_targets). Target i is source i + self_offset when self_offset >= 0.
// Every thread, with or without a target, loads its share of each tile and
// meets every barrier; only the store at the end is skipped.
template<typename T, int THREADS, bool POTENTIAL>
__global__ void direct_kernel(const T* __restrict__ targets, int n_targets,
                              const T* __restrict__ sources, const T* __restrict__ masses,
                              int n_sources, T eps2, int self_offset, int slice_length,
                              T* __restrict__ partial)
{
    __shared__ nb_body<T> tile[THREADS];
    const int t = (int)threadIdx.x;
    const int i = (int)blockIdx.x * THREADS + t;
    const int s = (int)blockIdx.y;
    const bool has_target = i < n_targets;
    const T x = has_target ? targets[i] : T(0);
    const T y = has_target ? targets[(long long)n_targets + i] : T(0);
    const T z = has_target ? targets[2LL * n_targets + i] : T(0);
    // This target's index among the sources, or -1.
    const long long me = self_offset >= 0 ? (long long)i + self_offset : -1;
    const int j0 = s * slice_length;
    const int j1 = n_sources - j0 < slice_length ? n_sources : j0 + slice_length;
    T ax = T(0), ay = T(0), az = T(0), phi = T(0);
    for (int start = j0; start < j1; start += THREADS) {
        const int j = start + t;
        if (j < j1) {
            tile[t] = nb_body<T>{sources[j], sources[(long long)n_sources + j],
                                 sources[2LL * n_sources + j], masses[j]};
        }
        __syncthreads();
        const int count = j1 - start;
        const long long self_k = me - start;
        const int k_self = (self_k >= 0 && self_k < THREADS) ? (int)self_k : -1;
        // A full tile has a constant trip count, which unrolls.
        if (count >= THREADS) {
            sum_tile<T, POTENTIAL>(tile, THREADS, x, y, z, eps2, k_self, ax, ay, az, phi);
        } else {
            sum_tile<T, POTENTIAL>(tile, count, x, y, z, eps2, k_self, ax, ay, az, phi);
        }
        __syncthreads();
    }
    if (has_target) {
        constexpr int C = POTENTIAL ? 4 : 3;
        T* out = partial + (long long)s * C * n_targets + i;
        out[0] = ax;
        out[(long long)n_targets] = ay;
        out[2LL * n_targets] = az;
        if (POTENTIAL) out[3LL * n_targets] = phi;
    }
}

// acc (3, n_targets) = G * (sum over slices, in order); pot = -G * (sum).
template<typename T, bool POTENTIAL>
__global__ void finalize_kernel(const T* __restrict__ partial, int n_slices, int n_targets, T G,
                                T* __restrict__ acc, T* __restrict__ pot)
{
    const int i = (int)(blockIdx.x * blockDim.x + threadIdx.x);
    if (i >= n_targets) return;
    constexpr int C = POTENTIAL ? 4 : 3;
    for (int c = 0; c < C; ++c) {
        T total = partial[(long long)c * n_targets + i];
        for (int s = 1; s < n_slices; ++s) {
            total += partial[((long long)s * C + c) * n_targets + i];
        }
        if (c < 3) {
            acc[(long long)c * n_targets + i] = G * total;
        } else {
            pot[i] = -(G * total);
        }
    }
}
"""


_TEMPLATES = TemplateKernels(KERNEL_SOURCE, OPTIONS, NAME_EXPRESSIONS, VARIANT_EXPRESSIONS,
                             hint="add its launch to LAUNCH or VARIANTS")
_kernel = _TEMPLATES.kernel
"""The compiled template instance of an expression (the emulation tests replace it)."""


_xp = array_module


def _contiguous(array, dtype):
    return _xp(array).ascontiguousarray(array, dtype=dtype)


def _target(out):
    """Where a kernel writes ``out``: itself, or a contiguous scratch array to copy back."""
    return out if out.flags.c_contiguous else _xp(out).empty(out.shape, out.dtype)


def _direct(target_positions, source_positions, source_masses, eps2, G, self_offset,
            acc_out, pot_out, launch):
    dtype = np.dtype(source_positions.dtype)
    if dtype.name not in CTYPES:
        raise ConfigError(f"nbody kernels take float32 or float64 arrays; got dtype {dtype}")
    t = dtype.type
    xp = _xp(source_positions)
    targets = _contiguous(target_positions, dtype)
    sources = _contiguous(source_positions, dtype)
    masses = _contiguous(source_masses, dtype)
    n_targets, n_sources = targets.shape[1], sources.shape[1]
    check(launch, dtype)
    slice_length, n_slices = slices(n_sources, launch)
    potential = pot_out is not None
    partial = xp.empty((n_slices, 4 if potential else 3, n_targets), dtype)
    _kernel(_direct_expression(dtype.name, launch.threads, potential))(
        (blocks(n_targets, launch.threads), n_slices, 1), (launch.threads, 1, 1),
        (targets, np.int32(n_targets), sources, masses, np.int32(n_sources), t(eps2),
         np.int32(self_offset), np.int32(slice_length), partial))
    acc = _target(acc_out)
    # Without the potential the kernel does not write pot: any valid pointer will do.
    pot = _target(pot_out) if potential else xp.empty(1, dtype)
    _kernel(_finalize_expression(dtype.name, potential))(
        (blocks(n_targets, FINALIZE_THREADS), 1, 1), (FINALIZE_THREADS, 1, 1),
        (partial, np.int32(n_slices), np.int32(n_targets), t(G), acc, pot))
    if acc is not acc_out:
        acc_out[...] = acc
    if potential and pot is not pot_out:
        pot_out[...] = pot
    return acc_out


def direct(target_positions, source_positions, source_masses, eps2, G, self_offset, acc_out, pot_out):
    """Softened accelerations (and potentials) on the targets; see ``_numpy.direct``."""
    dtype = np.dtype(source_positions.dtype)
    if dtype.name not in CTYPES:
        raise ConfigError(f"nbody kernels take float32 or float64 arrays; got dtype {dtype}")
    return _direct(target_positions, source_positions, source_masses, eps2, G, self_offset,
                   acc_out, pot_out, LAUNCH[dtype.name])
