"""Lennard-Jones kernels for NVIDIA GPUs with Numba-CUDA.

Neighbour build, all on the GPU:

1. ``_assign_cells_kernel``, one thread per atom: its cell (float64
   arithmetic, :mod:`.cells`; cells at least ``radius`` wide);
2. a stable sort of the atoms by cell and the start of every cell
   (:func:`.cells.sort_by_cell`: CuPy's radix sort and binary search), and
   the positions gathered in that order;
3. ``build kernel``, one thread per atom in cell order (neighbouring
   threads scan the same cells, which stay in cache): the distinct cells
   around the atom's (27, fewer along an axis of under 3 cells), every atom
   in them tested with the minimum image, hits appended to the atom's row
   while it has room and counted anyway. The row order is the scan's,
   deterministic (no atomics anywhere).

Forces: one thread per atom over its own row (a full list: no atomics),
pair physics from :mod:`.physics` as device functions, the minimum image
with libdevice's ``rint`` (``rintf`` in float32). The kernels are compiled
without ``fastmath``: its no-NaN/no-inf assumptions could hide an overlap,
and these kernels are bound by the gathers, not by arithmetic.

The list is column-major (:data:`NEIGHBOR_ORDER`): at step k of its loop a
warp of the forces kernel reads the k-th neighbours of 32 consecutive atoms,
128 contiguous bytes, where a row-major list of capacity C puts them 4 C
bytes apart (32 transactions). The forces kernel walks atoms in index order
so that this stays true; the build walks them in cell order, where its
reads are shared, and its scattered writes happen once per rebuild.

Arrays stay CuPy arrays (one memory pool with CuPy); each call wraps them
for Numba without a host sync (wrappers cached: :mod:`..cuda_interop`) and
launches on CuPy's current stream, after the CuPy sort it depends on. Under
the CUDA simulator the arrays are NumPy arrays and pass through.
"""

import functools
import math

import numpy as np

from hpcgpu import _gpu_probe
from hpcgpu._compat import numpy_aliases_for_numba_cuda

numpy_aliases_for_numba_cuda()

from numba import cuda  # noqa: E402

from hpcgpu.kernels import launch_limits  # noqa: E402
from hpcgpu.kernels.cuda_interop import array_module as _xp  # noqa: E402
from hpcgpu.kernels.cuda_interop import on_device as _on_device  # noqa: E402
from hpcgpu.kernels.cuda_interop import stream_of as _stream  # noqa: E402

from hpcgpu.kernels.md import cells, physics  # noqa: E402

THREADS = 128
"""Threads per block of every kernel."""

NEIGHBOR_ORDER = "F"
"""Layout of the lists this backend builds: column-major (see :mod:`hpcgpu.kernels.md`).
The kernels read lists of any layout."""

_index = np.uint64
"""Cast of an index known to be >= 0: Numba checks signed indices for wraparound."""

_device_function = cuda.jit(device=True)
lennard_jones = _device_function(physics.lennard_jones)
minimum_image = _device_function(physics.minimum_image)
within = _device_function(physics.within)

if _gpu_probe.simulator_enabled():
    @cuda.jit(device=True)
    def _simulated_rint(x):
        return np.rint(x)

    _RINT = {"float32": _simulated_rint, "float64": _simulated_rint}
else:
    from numba.cuda import libdevice

    @cuda.jit(device=True)
    def _rint_float32(x):
        return libdevice.rintf(x)

    @cuda.jit(device=True)
    def _rint_float64(x):
        return libdevice.rint(x)

    _RINT = {"float32": _rint_float32, "float64": _rint_float64}


@cuda.jit(device=True)
def _clamp_below(c, cells):
    # Not min(): Numba 0.68's built-in CUDA target fails on its generic overload.
    if c < cells:
        return c
    return cells - 1


@cuda.jit(device=True)
def _axis_cell(x, length, cells):
    s = x / length
    s = s - math.floor(s)
    return _clamp_below(int(s * cells), cells)


@cuda.jit
def _assign_cells_kernel(x, y, z, lx, ly, lz, nx, ny, nz, cell_out):
    i = cuda.grid(1)
    if i < x.shape[0]:
        cx = _axis_cell(float(x[i]), lx, nx)
        cy = _axis_cell(float(y[i]), ly, ny)
        cz = _axis_cell(float(z[i]), lz, nz)
        cell_out[i] = cx + nx * (cy + ny * cz)


@cuda.jit(device=True)
def _distinct(cells):
    """Distinct cells within one cell along an axis: 3, or all of them."""
    if cells >= 3:
        return 3
    return cells


@cuda.jit(device=True)
def _neighbor_cell(c, t, cells):
    """The ``t``-th distinct cell around ``c``."""
    if cells >= 3:
        return (c + cells - 1 + t) % cells
    return t


@functools.cache
def _kernels(dtype_name):
    """(build, forces) kernels for one dtype (the rounding function differs)."""
    rint = _RINT[dtype_name]

    @cuda.jit(device=True)
    def separation(xj, xi, length, inverse_length):
        d = xj - xi
        return minimum_image(d, length, inverse_length, rint(d * inverse_length))

    @cuda.jit
    def build(xs, ys, zs, order, start, sorted_cell, nx, ny, nz, lx, ly, lz, ilx, ily, ilz, radius2,
              neighbors_out, counts_out):
        # Indices are cast to unsigned where they index (never negative): a
        # signed index costs Numba's negative-index wraparound on every access.
        k = cuda.grid(1)
        if k >= xs.shape[0]:
            return
        capacity = neighbors_out.shape[1]
        c = sorted_cell[k]
        cx = c % nx
        cy = (c // nx) % ny
        cz = c // (nx * ny)
        xi = xs[k]
        yi = ys[k]
        zi = zs[k]
        i = _index(order[k])
        count = 0
        for tz in range(_distinct(nz)):
            z_cell = _neighbor_cell(cz, tz, nz)
            for ty in range(_distinct(ny)):
                y_cell = _neighbor_cell(cy, ty, ny)
                for tx in range(_distinct(nx)):
                    cell = _neighbor_cell(cx, tx, nx) + nx * (y_cell + ny * z_cell)
                    for j in range(start[_index(cell)], start[_index(cell + 1)]):
                        dx = separation(xs[_index(j)], xi, lx, ilx)
                        dy = separation(ys[_index(j)], yi, ly, ily)
                        dz = separation(zs[_index(j)], zi, lz, ilz)
                        if j != k and within(dx * dx + dy * dy + dz * dz, radius2):
                            if count < capacity:
                                # Column-major: column count holds the count-th neighbour of every atom.
                                neighbors_out[i, _index(count)] = order[_index(j)]
                            count += 1
        counts_out[i] = count

    @cuda.jit
    def forces(x, y, z, neighbors, counts, lx, ly, lz, ilx, ily, ilz, cutoff2, sigma2, c4, c24, shift,
               forces_out, energy_out, virial_out, pair_counts_out, zero, one, two, half):
        i = cuda.grid(1)
        if i >= x.shape[0]:
            return
        m = counts[i]
        if m > neighbors.shape[1]:
            m = neighbors.shape[1]
        xi = x[i]
        yi = y[i]
        zi = z[i]
        fx = zero
        fy = zero
        fz = zero
        energy = zero
        virial = zero
        pairs = 0
        for k in range(m):
            # Column-major: the threads of a warp read neighbour k of consecutive atoms, coalesced.
            j = _index(neighbors[i, _index(k)])
            dx = separation(x[j], xi, lx, ilx)
            dy = separation(y[j], yi, ly, ily)
            dz = separation(z[j], zi, lz, ilz)
            r2 = dx * dx + dy * dy + dz * dz
            if within(r2, cutoff2):
                weight, e, w = lennard_jones(r2, sigma2, c4, c24, shift, one, two)
                fx += weight * dx
                fy += weight * dy
                fz += weight * dz
                energy += e
                virial += w
                pairs += 1
        forces_out[0, i] = -fx
        forces_out[1, i] = -fy
        forces_out[2, i] = -fz
        energy_out[i] = half * energy
        virial_out[i] = half * virial
        pair_counts_out[i] = pairs

    return build, forces


def _blocks(n):
    # No shared memory in any of the three kernels.
    launch_limits.check("md cuda kernels", THREADS, THREADS)
    return max(1, -(-n // THREADS))


def build_neighbors(positions, box, radius, neighbors_out, counts_out):
    """Full neighbour list from cell lists on the GPU; see ``_numpy.build_neighbors``."""
    xp = _xp(positions)
    dtype = np.dtype(positions.dtype)
    t = dtype.type
    n = positions.shape[1]
    nx, ny, nz = cells.grid(box, radius, n)
    lx, ly, lz = (float(v) for v in box)
    stream = _stream(positions)
    cell = xp.empty(n, np.int32)
    _assign_cells_kernel[_blocks(n), THREADS, stream](
        *(_on_device(positions[k]) for k in range(3)), lx, ly, lz, nx, ny, nz, _on_device(cell))
    order, start = cells.sort_by_cell(xp, cell, nx * ny * nz)
    sorted_positions = xp.ascontiguousarray(positions[:, order])
    sorted_cell = cell[order]
    build, _ = _kernels(dtype.name)
    build[_blocks(n), THREADS, stream](
        *(_on_device(sorted_positions[k]) for k in range(3)), _on_device(order), _on_device(start),
        _on_device(sorted_cell), nx, ny, nz, t(lx), t(ly), t(lz), t(1.0 / lx), t(1.0 / ly), t(1.0 / lz),
        t(radius * radius), _on_device(neighbors_out), _on_device(counts_out))
    return int(counts_out.max())


def forces(positions, box, neighbors, counts, cutoff2, epsilon, sigma, energy_shift,
           forces_out, energy_out, virial_out, pair_counts_out):
    """Lennard-Jones forces from a full neighbour list; see ``_numpy.forces``."""
    dtype = np.dtype(positions.dtype)
    t = dtype.type
    n = positions.shape[1]
    lx, ly, lz = (float(v) for v in box)
    _, kernel = _kernels(dtype.name)
    kernel[_blocks(n), THREADS, _stream(positions)](
        *(_on_device(positions[k]) for k in range(3)), _on_device(neighbors), _on_device(counts),
        t(lx), t(ly), t(lz), t(1.0 / lx), t(1.0 / ly), t(1.0 / lz), t(cutoff2), t(sigma * sigma),
        t(4.0 * epsilon), t(24.0 * epsilon), t(energy_shift), _on_device(forces_out),
        _on_device(energy_out), _on_device(virial_out), _on_device(pair_counts_out), t(0), t(1), t(2), t(0.5))
    return forces_out


@functools.cache
def _reach_kernel(dtype_name):
    """The late rebuild's bound (:func:`hpcgpu.kernels.md.largest_reach_squared`): one thread per atom, the
    largest values by atomic max into ``out`` (two values: one launch a step beside a memset)."""
    rint = _RINT[dtype_name]

    @cuda.jit
    def reach(x, y, z, rx, ry, rz, vx, vy, vz, fx, fy, fz, lx, ly, lz, ahead_v, ahead_f, out):
        i = cuda.grid(1)
        if i >= x.shape[0]:
            return
        d = x[i] - rx[i]
        d -= lx * rint(d / lx)
        moved = d * d
        d = y[i] - ry[i]
        d -= ly * rint(d / ly)
        moved += d * d
        d = z[i] - rz[i]
        d -= lz * rint(d / lz)
        moved += d * d
        speed = math.sqrt(vx[i] * vx[i] + vy[i] * vy[i] + vz[i] * vz[i])
        pull = math.sqrt(fx[i] * fx[i] + fy[i] * fy[i] + fz[i] * fz[i])
        furthest = math.sqrt(moved) + ahead_v * speed + ahead_f * pull
        cuda.atomic.max(out, 0, moved)
        cuda.atomic.max(out, 1, furthest * furthest)

    return reach


def largest_reach_squared(positions, reference, velocities, forces, box, ahead_v, ahead_f):
    """Largest squared displacement and largest squared ``|d| + ahead_v |v| + ahead_f |f|`` (one kernel)."""
    xp = _xp(positions)
    dtype = np.dtype(positions.dtype)
    t = dtype.type
    n = positions.shape[1]
    out = xp.zeros(2, dtype=dtype)
    reference = reference[:, :n]
    lx, ly, lz = (t(v) for v in box)
    _reach_kernel(dtype.name)[_blocks(n), THREADS, _stream(positions)](
        *(_on_device(a[k]) for a in (positions, reference, velocities, forces) for k in range(3)),
        lx, ly, lz, t(ahead_v), t(ahead_f), _on_device(out))
    host = out.get() if hasattr(out, "get") else out
    return float(host[0]), float(host[1])
