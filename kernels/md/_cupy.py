"""Lennard-Jones kernels for the GPU as a CuPy ``RawModule`` (CUDA C++).

The same algorithm as ``_cuda``: ``assign_cells`` (one thread per atom,
float64 cell arithmetic), a stable sort of the atoms by cell in CuPy
(:func:`.cells.sort_by_cell`), ``build_kernel`` (one thread per atom in
cell order, scanning the distinct cells around its own with the minimum
image, appending to its row while there is room and counting anyway) and
``forces_kernel`` (one thread per atom, in index order, over its own row).
The list is built column-major (:data:`NEIGHBOR_ORDER`; see
``_cuda``'s docstring for why); both kernels take the list's two strides
and so read or write either layout. The pair
interaction mirrors ``physics`` as ``__device__`` functions; the minimum
image rounds with ``rintf`` / ``rint``. The module is compiled without
fast-math options (no approximate division, no flush-to-zero): an overlap's
inf and NaN must survive to the public API's check.

The CUDA source is the string :data:`KERNEL_SOURCE` (templates on the float
type, no headers), compiled by NVRTC on first use through a cached
:class:`cupy.RawModule`. Importing this module does not import CuPy or touch
the GPU. The tests compile the same text on the CPU with g++ and run it
block by block (``tests/kernels/test_md_cupy_source.py``), through this
module's own launch code.
"""


import numpy as np

from hpcgpu.errors import ConfigError
from hpcgpu.kernels import launch_limits
from hpcgpu.kernels.cupy_templates import TemplateKernels, array_module
from hpcgpu.kernels.md import cells

OPTIONS = ("--std=c++17",)
"""NVRTC options of the module."""

CTYPES = {"float32": "float", "float64": "double"}
"""C++ type of each supported NumPy dtype (the template argument)."""

KERNELS = ("assign_cells", "build_kernel", "forces_kernel")

THREADS = 128
"""Threads per block of every kernel."""

NEIGHBOR_ORDER = "F"
"""Layout of the lists this backend builds: column-major (see :mod:`hpcgpu.kernels.md`).
The kernels read lists of any layout."""

NAME_EXPRESSIONS = tuple(f"{kernel}<{ctype}>" for ctype in CTYPES.values() for kernel in KERNELS)
"""Template instances, as passed to ``get_function``."""

KERNEL_SOURCE = r"""
// ---- pair interaction and minimum image (mirror physics.py) -----------------

template<typename T>
__device__ __forceinline__ T md_rint(T x);

template<>
__device__ __forceinline__ float md_rint<float>(float x) { return rintf(x); }

template<>
__device__ __forceinline__ double md_rint<double>(double x) { return rint(x); }

// The image of d nearest to zero along a side of `length` (any d).
template<typename T>
__device__ __forceinline__ T minimum_image(T d, T length, T inverse_length)
{
    return d - length * md_rint(d * inverse_length);
}

// Weight (F_i = -weight * d), shifted energy and virial r . F of one pair;
// r2 == 0 gives inf and NaN, which the host reports as an overlap.
template<typename T>
__device__ __forceinline__ void lennard_jones(T r2, T sigma2, T four_epsilon, T twenty_four_epsilon,
                                              T energy_shift, T& weight, T& energy, T& virial)
{
    const T inv_r2 = T(1) / r2;
    const T s = sigma2 * inv_r2;
    const T s3 = s * s * s;
    const T s6 = s3 * s3;
    energy = four_epsilon * (s6 - s3) - energy_shift;
    virial = twenty_four_epsilon * (T(2) * s6 - s3);
    weight = virial * inv_r2;
}

// ---- cells (mirror cells.py) ---------------------------------------------------

__device__ __forceinline__ int md_axis_cell(double x, double length, int cells)
{
    double s = x / length;
    s -= floor(s);
    const int c = (int)(s * cells);
    return c < cells ? c : cells - 1;
}

// The t-th distinct cell around c along an axis (3 of them, or all cells).
__device__ __forceinline__ int md_neighbor_cell(int c, int t, int cells)
{
    return cells >= 3 ? (c + cells - 1 + t) % cells : t;
}

__device__ __forceinline__ int md_distinct(int cells) { return cells >= 3 ? 3 : cells; }

// positions: (3, n), C-contiguous. cell_out[i] = cx + nx * (cy + ny * cz).
template<typename T>
__global__ void assign_cells(const T* __restrict__ positions, int n, double lx, double ly, double lz,
                             int nx, int ny, int nz, int* __restrict__ cell_out)
{
    const int i = (int)(blockIdx.x * blockDim.x + threadIdx.x);
    if (i >= n) return;
    const int cx = md_axis_cell((double)positions[i], lx, nx);
    const int cy = md_axis_cell((double)positions[(long long)n + i], ly, ny);
    const int cz = md_axis_cell((double)positions[2LL * n + i], lz, nz);
    cell_out[i] = cx + nx * (cy + ny * cz);
}

// The list: entry k of atom i's row at neighbors[i * atom_stride + k * slot_stride]
// (column-major, as built here: atom_stride 1, slot_stride n; row-major: capacity, 1).

// One thread per atom in cell order (k); sorted: (3, n) positions in cell
// order; order[k] is the atom; cell c holds sorted atoms start[c]..start[c+1].
template<typename T>
__global__ void build_kernel(const T* __restrict__ sorted, const int* __restrict__ order,
                             const int* __restrict__ start, const int* __restrict__ sorted_cell, int n,
                             int nx, int ny, int nz, T lx, T ly, T lz, T ilx, T ily, T ilz, T radius2,
                             int capacity, int atom_stride, int slot_stride,
                             int* __restrict__ neighbors_out, int* __restrict__ counts_out)
{
    const int k = (int)(blockIdx.x * blockDim.x + threadIdx.x);
    if (k >= n) return;
    const T* xs = sorted;
    const T* ys = sorted + n;
    const T* zs = sorted + 2LL * n;
    const int c = sorted_cell[k];
    const int cx = c % nx;
    const int cy = (c / nx) % ny;
    const int cz = c / (nx * ny);
    const T xi = xs[k], yi = ys[k], zi = zs[k];
    const int i = order[k];
    int* next = neighbors_out + (long long)i * atom_stride;  // where the row's next entry goes
    int count = 0;
    for (int tz = 0; tz < md_distinct(nz); ++tz) {
        const int z_cell = md_neighbor_cell(cz, tz, nz);
        for (int ty = 0; ty < md_distinct(ny); ++ty) {
            const int y_cell = md_neighbor_cell(cy, ty, ny);
            for (int tx = 0; tx < md_distinct(nx); ++tx) {
                const int cell = md_neighbor_cell(cx, tx, nx) + nx * (y_cell + ny * z_cell);
                for (int j = start[cell]; j < start[cell + 1]; ++j) {
                    const T dx = minimum_image(xs[j] - xi, lx, ilx);
                    const T dy = minimum_image(ys[j] - yi, ly, ily);
                    const T dz = minimum_image(zs[j] - zi, lz, ilz);
                    if (j != k && dx * dx + dy * dy + dz * dz < radius2) {
                        if (count < capacity) {
                            *next = order[j];
                            next += slot_stride;
                        }
                        ++count;
                    }
                }
            }
        }
    }
    counts_out[i] = count;
}

// One thread per atom, in index order, over its row of the (n, capacity) full list:
// with a column-major list a warp reads the k-th neighbours of 32 consecutive atoms
// at once (128 contiguous bytes).
template<typename T>
__global__ void forces_kernel(const T* __restrict__ positions, int n, const int* __restrict__ neighbors,
                              const int* __restrict__ counts, int capacity, int atom_stride,
                              int slot_stride, T lx, T ly, T lz,
                              T ilx, T ily, T ilz, T cutoff2, T sigma2, T four_epsilon,
                              T twenty_four_epsilon, T energy_shift, T* __restrict__ forces_out,
                              T* __restrict__ energy_out, T* __restrict__ virial_out,
                              int* __restrict__ pair_counts_out)
{
    const int i = (int)(blockIdx.x * blockDim.x + threadIdx.x);
    if (i >= n) return;
    const T* x = positions;
    const T* y = positions + n;
    const T* z = positions + 2LL * n;
    const T xi = x[i], yi = y[i], zi = z[i];
    const int m = counts[i] < capacity ? counts[i] : capacity;
    const int* row = neighbors + (long long)i * atom_stride;
    T fx = T(0), fy = T(0), fz = T(0), energy = T(0), virial = T(0);
    int pairs = 0;
    for (int k = 0; k < m; ++k) {
        const int j = row[(long long)k * slot_stride];
        const T dx = minimum_image(x[j] - xi, lx, ilx);
        const T dy = minimum_image(y[j] - yi, ly, ily);
        const T dz = minimum_image(z[j] - zi, lz, ilz);
        const T r2 = dx * dx + dy * dy + dz * dz;
        if (r2 < cutoff2) {
            T weight, e, w;
            lennard_jones(r2, sigma2, four_epsilon, twenty_four_epsilon, energy_shift, weight, e, w);
            fx += weight * dx;
            fy += weight * dy;
            fz += weight * dz;
            energy += e;
            virial += w;
            ++pairs;
        }
    }
    forces_out[i] = -fx;
    forces_out[(long long)n + i] = -fy;
    forces_out[2LL * n + i] = -fz;
    energy_out[i] = T(0.5) * energy;
    virial_out[i] = T(0.5) * virial;
    pair_counts_out[i] = pairs;
}
"""


_TEMPLATES = TemplateKernels(KERNEL_SOURCE, OPTIONS, NAME_EXPRESSIONS)
_kernel = _TEMPLATES.kernel
"""The compiled template instance of an expression (the emulation tests replace it)."""

_xp = array_module


def _ctype(dtype):
    dtype = np.dtype(dtype)
    if dtype.name not in CTYPES:
        raise ConfigError(f"md kernels take float32 or float64 arrays; got dtype {dtype}")
    return CTYPES[dtype.name]


def _target(out):
    """Where a kernel writes ``out``: itself, or a contiguous scratch array to copy back."""
    return out if out.flags.c_contiguous else _xp(out).empty(out.shape, out.dtype)


def _list_memory(neighbors):
    """``(memory, atom_stride, slot_stride)`` of an (N, capacity) list, or None if it is
    neither row- nor column-major: ``memory`` is C-contiguous (the list itself, or for a
    column-major list its (capacity, N) transpose) and entry ``[i, k]`` lies at
    ``i * atom_stride + k * slot_stride`` in it."""
    n, capacity = neighbors.shape
    if neighbors.flags.c_contiguous:
        return neighbors, capacity, 1
    if neighbors.flags.f_contiguous:
        return neighbors.T, 1, n
    return None


def _blocks(n, threads):
    # No shared memory in any of the three kernels.
    launch_limits.check("md cupy kernels", threads, threads)
    return (max(1, -(-n // threads)), 1, 1)


def _box_values(box, t):
    lx, ly, lz = (float(v) for v in box)
    return (t(lx), t(ly), t(lz), t(1.0 / lx), t(1.0 / ly), t(1.0 / lz))


def _build(positions, box, radius, neighbors_out, counts_out, threads):
    ctype = _ctype(positions.dtype)
    xp = _xp(positions)
    positions = xp.ascontiguousarray(positions)
    t = positions.dtype.type
    n = positions.shape[1]
    nx, ny, nz = cells.grid(box, radius, n)
    lx, ly, lz = (float(v) for v in box)
    cell = xp.empty(n, np.int32)
    _kernel(f"assign_cells<{ctype}>")(
        _blocks(n, threads), (threads, 1, 1),
        (positions, np.int32(n), np.float64(lx), np.float64(ly), np.float64(lz),
         np.int32(nx), np.int32(ny), np.int32(nz), cell))
    order, start = cells.sort_by_cell(xp, cell, nx * ny * nz)
    sorted_positions = xp.ascontiguousarray(positions[:, order])
    sorted_cell = xp.ascontiguousarray(cell[order])
    layout = _list_memory(neighbors_out)
    neighbors = neighbors_out if layout is not None else xp.empty(neighbors_out.shape, np.int32)
    memory, atom_stride, slot_stride = layout or _list_memory(neighbors)
    counts = _target(counts_out)
    _kernel(f"build_kernel<{ctype}>")(
        _blocks(n, threads), (threads, 1, 1),
        (sorted_positions, order, start, sorted_cell, np.int32(n), np.int32(nx), np.int32(ny),
         np.int32(nz), *_box_values(box, t), t(radius * radius), np.int32(neighbors.shape[1]),
         np.int32(atom_stride), np.int32(slot_stride), memory, counts))
    if neighbors is not neighbors_out:
        neighbors_out[...] = neighbors
    if counts is not counts_out:
        counts_out[...] = counts
    return int(counts.max())


def _forces(positions, box, neighbors, counts, cutoff2, epsilon, sigma, energy_shift,
            forces_out, energy_out, virial_out, pair_counts_out, threads):
    ctype = _ctype(positions.dtype)
    xp = _xp(positions)
    positions = xp.ascontiguousarray(positions)
    neighbors = neighbors if neighbors.dtype == np.int32 else neighbors.astype(np.int32)
    layout = _list_memory(neighbors)
    if layout is None:
        neighbors = xp.ascontiguousarray(neighbors)
        layout = _list_memory(neighbors)
    memory, atom_stride, slot_stride = layout
    counts = xp.ascontiguousarray(counts, dtype=np.int32)
    t = positions.dtype.type
    n = positions.shape[1]
    destinations = (forces_out, energy_out, virial_out, pair_counts_out)
    outputs = [_target(a) for a in destinations]
    _kernel(f"forces_kernel<{ctype}>")(
        _blocks(n, threads), (threads, 1, 1),
        (positions, np.int32(n), memory, counts, np.int32(neighbors.shape[1]), np.int32(atom_stride),
         np.int32(slot_stride), *_box_values(box, t),
         t(cutoff2), t(sigma * sigma), t(4.0 * epsilon), t(24.0 * epsilon), t(energy_shift), *outputs))
    for result, out in zip(outputs, destinations):
        if result is not out:
            out[...] = result
    return forces_out


def build_neighbors(positions, box, radius, neighbors_out, counts_out):
    """Full neighbour list from cell lists on the GPU; see ``_numpy.build_neighbors``."""
    return _build(positions, box, radius, neighbors_out, counts_out, THREADS)


def forces(positions, box, neighbors, counts, cutoff2, epsilon, sigma, energy_shift,
           forces_out, energy_out, virial_out, pair_counts_out):
    """Lennard-Jones forces from a full neighbour list; see ``_numpy.forces``."""
    return _forces(positions, box, neighbors, counts, cutoff2, epsilon, sigma, energy_shift,
                   forces_out, energy_out, virial_out, pair_counts_out, THREADS)
