"""Lennard-Jones kernels for the CPU with ``numba.njit(parallel=True)``.

Neighbour build (:func:`build_neighbors`), from cell lists:

1. every atom's cell (float64 arithmetic, :mod:`._cells`), in parallel;
2. a counting sort of the atoms by cell (serial, O(N)): ``order`` lists the
   atoms cell by cell, in increasing index within a cell, and ``start``
   where each cell begins; the positions are gathered in that order into
   contiguous rows;
3. in parallel over atoms, taken in cell order (neighbouring atoms scan the
   same cells, which stay in cache): for every y/z row of cells around the
   atom, the run of up to three cells in x is a contiguous range of the
   sorted positions. Squared minimum-image distances over the range are
   computed in one vectorised loop, then a branch-free loop appends the
   atoms inside ``radius`` to a scratch row (always written, advanced by the
   comparison), and the row is copied into the list, cut at its capacity.

A row's order is that of the scan (z rows, y rows, x runs, then index in
the cell): deterministic, independent of the threads. If the caller keeps
atoms sorted by cell (x fastest) the rows come out in increasing index
except where the scan wraps around the box.

Forces (:func:`forces`): in parallel over atoms, each atom runs over its
own row (a full list: no atomics, no scatter). The loop gathers the
neighbours' coordinates, applies the minimum image (``rint``: one rounding
instruction), evaluates :func:`._physics.lennard_jones` for every listed
neighbour and selects the pairs inside the cutoff; LLVM vectorises it with
gather instructions, the sums kept in vector lanes (``reassoc``). The pair
physics is compiled without ``reassoc``, so only the sums are reordered.

Subnormals are flushed inside the parallel loops (:mod:`hpcgpu.kernels._fpenv`).
"""

import numba
import numpy as np
from numba import njit, prange

from hpcgpu.kernels._fpenv import flush_subnormals, restore_fp_mode
from hpcgpu.kernels.md import _cells, _physics

FASTMATH = frozenset({"contract", "arcp", "afn", "reassoc"})
"""LLVM fast-math flags of the kernels: no ``nnan``/``ninf`` (an overlap's
inf and NaN must come out, where the public API reports them)."""

_OPTS = dict(cache=True, fastmath=set(FASTMATH), error_model="numpy")
_PAIR_OPTS = dict(_OPTS, fastmath=set(FASTMATH - {"reassoc"}))

lennard_jones = njit(**_PAIR_OPTS)(_physics.lennard_jones)
minimum_image = njit(**_PAIR_OPTS)(_physics.minimum_image)
within = njit(**_PAIR_OPTS)(_physics.within)


@njit(**_PAIR_OPTS)
def _separation(xj, xi, length, inverse_length):
    d = xj - xi
    return minimum_image(d, length, inverse_length, np.rint(d * inverse_length))


def _chunks(n):
    """Blocks of atoms per call: several per thread, so uneven thread speeds balance."""
    return max(1, min(n, 8 * numba.get_num_threads()))


# ---- cells ----------------------------------------------------------------------------

@njit(inline="always")
def _axis_cell(x, length, cells):
    s = x / length
    s = s - np.floor(s)
    c = np.int32(s * cells)
    return c if c < cells else np.int32(cells - 1)


@njit(parallel=True, cache=True)
def _assign_cells(x, y, z, lx, ly, lz, nx, ny, nz, cell_out):
    """Cell of every atom, x fastest; float64 arithmetic whatever the dtype."""
    for i in prange(x.shape[0]):
        cx = _axis_cell(np.float64(x[i]), lx, nx)
        cy = _axis_cell(np.float64(y[i]), ly, ny)
        cz = _axis_cell(np.float64(z[i]), lz, nz)
        cell_out[i] = cx + nx * (cy + ny * cz)


@njit(cache=True)
def _sort_by_cell(cell, start_out, order_out):
    """Counting sort: ``order_out`` lists atoms cell by cell (increasing index
    within a cell), cell ``c`` holds ``order_out[start_out[c]:start_out[c + 1]]``."""
    n_cells = start_out.shape[0] - 1
    start_out[:] = 0
    for i in range(cell.shape[0]):
        start_out[cell[i] + 1] += 1
    for c in range(n_cells):
        start_out[c + 1] += start_out[c]
    fill = start_out[:n_cells].copy()
    for i in range(cell.shape[0]):
        c = cell[i]
        order_out[fill[c]] = i
        fill[c] += 1


@njit(parallel=True, cache=True)
def _gather(x, y, z, order, xs, ys, zs):
    for k in prange(order.shape[0]):
        i = order[k]
        xs[k] = x[i]
        ys[k] = y[i]
        zs[k] = z[i]


# ---- neighbour build ----------------------------------------------------------------------

@njit(**_OPTS)
def _append_within(order, j0, j1, self_k, r2_scratch, radius2, row_scratch, count):
    """Append ``order[j0 + q]`` for every ``r2_scratch[q] < radius2``; sorted
    atom ``self_k`` (if in range) is the atom itself, never its own neighbour."""
    if j0 <= self_k < j1:
        r2_scratch[self_k - j0] = radius2
    base = np.uint64(j0)
    # Branch-free compaction: always store, advance by the comparison.
    for q in range(np.uint64(j1 - j0)):
        row_scratch[count] = order[base + q]
        count += np.intp(within(r2_scratch[q], radius2))
    return count


@njit(**_OPTS)
def _scan_shifted(xs, ys, zs, j0, j1, self_k, xi, yi, zi, radius2, order, r2_scratch, row_scratch,
                  count):
    """Append the atoms of sorted range ``j0:j1`` within ``radius`` of the
    point (xi, yi, zi), an image of the atom already shifted to the range's
    cells (no minimum image: the loop is loads and multiply-adds)."""
    # Unsigned indices: a signed offset index (j0 + q) that LLVM cannot
    # prove non-negative keeps Numba's wraparound test, which turns the
    # loads into gathers.
    base = np.uint64(j0)
    m = np.uint64(j1 - j0)
    for q in range(m):
        dx = xs[base + q] - xi
        dy = ys[base + q] - yi
        dz = zs[base + q] - zi
        r2_scratch[q] = dx * dx + dy * dy + dz * dz
    return _append_within(order, j0, j1, self_k, r2_scratch, radius2, row_scratch, count)


@njit(**_OPTS)
def _scan_images(xs, ys, zs, j0, j1, self_k, xi, yi, zi, lx, ly, lz, ilx, ily, ilz, radius2,
                 order, r2_scratch, row_scratch, count):
    """:func:`_scan_shifted` with the minimum image of every pair (small boxes)."""
    base = np.uint64(j0)
    m = np.uint64(j1 - j0)
    for q in range(m):
        dx = _separation(xs[base + q], xi, lx, ilx)
        dy = _separation(ys[base + q], yi, ly, ily)
        dz = _separation(zs[base + q], zi, lz, ilz)
        r2_scratch[q] = dx * dx + dy * dy + dz * dz
    return _append_within(order, j0, j1, self_k, r2_scratch, radius2, row_scratch, count)


@njit(inline="always")
def _gap(offset, coordinate, cell, side):
    """Distance (float64) from a coordinate in ``cell`` to the cell ``offset`` cells away."""
    if offset > 0:
        return (offset - 1) * side + ((cell + 1) * side - coordinate)
    if offset < 0:
        return (-offset - 1) * side + (coordinate - cell * side)
    return 0.0


@njit(**_OPTS)
def _atom_shifted(k, xs, ys, zs, order, start, cx, cy, cz, nx, ny, nz, reach, sx, sy, sz, lx, ly, lz,
                  radius2, prune2, r2_scratch, row_scratch):
    """Neighbours of sorted atom ``k`` in a box of at least ``2 reach + 1``
    cells per axis (every cell of the stencil a distinct image): rows and
    end cells of x runs that lie farther than the radius from the atom are
    skipped, and each range is scanned with the image shift of its cells."""
    xi = xs[k]
    yi = ys[k]
    zi = zs[k]
    count = 0
    for oz in range(-reach, reach + 1):
        gz = _gap(oz, np.float64(zi), cz, sz)
        gz2 = gz * gz
        if gz2 >= prune2:
            continue
        z_row = cz + oz
        zs_image = zi
        if z_row < 0:
            z_row += nz
            zs_image = zi + lz
        elif z_row >= nz:
            z_row -= nz
            zs_image = zi - lz
        for oy in range(-reach, reach + 1):
            gy = _gap(oy, np.float64(yi), cy, sy)
            gyz2 = gy * gy + gz2
            if gyz2 >= prune2:
                continue
            y_row = cy + oy
            ys_image = yi
            if y_row < 0:
                y_row += ny
                ys_image = yi + ly
            elif y_row >= ny:
                y_row -= ny
                ys_image = yi - ly
            row = nx * (y_row + ny * z_row)
            a = cx - reach
            while a < cx:
                gx = _gap(a - cx, np.float64(xi), cx, sx)
                if gx * gx + gyz2 < prune2:
                    break
                a += 1
            b = cx + reach
            while b > cx:
                gx = _gap(b - cx, np.float64(xi), cx, sx)
                if gx * gx + gyz2 < prune2:
                    break
                b -= 1
            if a < 0:
                count = _scan_shifted(xs, ys, zs, start[row + a + nx], start[row + nx], k, xi + lx,
                                      ys_image, zs_image, radius2, order, r2_scratch, row_scratch, count)
                a = 0
            top = b
            if b >= nx:
                top = nx - 1
            count = _scan_shifted(xs, ys, zs, start[row + a], start[row + top + 1], k, xi, ys_image,
                                  zs_image, radius2, order, r2_scratch, row_scratch, count)
            if b >= nx:
                count = _scan_shifted(xs, ys, zs, start[row], start[row + b - nx + 1], k, xi - lx,
                                      ys_image, zs_image, radius2, order, r2_scratch, row_scratch, count)
    return count


@njit(**_OPTS)
def _atom_images(k, xs, ys, zs, order, start, cx, cy, cz, nx, ny, nz, reach, lx, ly, lz, ilx, ily, ilz,
                 radius2, r2_scratch, row_scratch):
    """Neighbours of sorted atom ``k`` in a small box: the distinct cells
    within ``reach`` (along an axis of fewer than ``2 reach + 1`` cells,
    all of them), minimum image for every pair."""
    xi = xs[k]
    yi = ys[k]
    zi = zs[k]
    count = 0
    width = 2 * reach + 1
    for tz in range(min(nz, width)):
        z_row = (cz - reach + tz + nz * reach) % nz if nz >= width else tz
        for ty in range(min(ny, width)):
            y_row = (cy - reach + ty + ny * reach) % ny if ny >= width else ty
            row = nx * (y_row + ny * z_row)
            if nx < width:
                count = _scan_images(xs, ys, zs, start[row], start[row + nx], k, xi, yi, zi, lx, ly, lz,
                                     ilx, ily, ilz, radius2, order, r2_scratch, row_scratch, count)
                continue
            a = cx - reach
            b = cx + reach
            if a < 0:
                count = _scan_images(xs, ys, zs, start[row + a + nx], start[row + nx], k, xi, yi, zi,
                                     lx, ly, lz, ilx, ily, ilz, radius2, order, r2_scratch, row_scratch,
                                     count)
                a = 0
            top = b if b < nx else nx - 1
            count = _scan_images(xs, ys, zs, start[row + a], start[row + top + 1], k, xi, yi, zi,
                                 lx, ly, lz, ilx, ily, ilz, radius2, order, r2_scratch, row_scratch, count)
            if b >= nx:
                count = _scan_images(xs, ys, zs, start[row], start[row + b - nx + 1], k, xi, yi, zi,
                                     lx, ly, lz, ilx, ily, ilz, radius2, order, r2_scratch, row_scratch,
                                     count)
    return count


@njit(parallel=True, **_OPTS)
def _build_kernel(xs, ys, zs, order, start, sorted_cell, nx, ny, nz, reach, sx, sy, sz, lx, ly, lz,
                  ilx, ily, ilz, radius2, prune2, shifted, neighbors_out, counts_out, n_chunks):
    n = xs.shape[0]
    capacity = neighbors_out.shape[1]
    largest = np.zeros(n_chunks, np.int64)
    for chunk in prange(n_chunks):
        fp_mode = flush_subnormals()
        r2_scratch = np.empty(n, xs.dtype)
        row_scratch = np.empty(n + 1, np.int32)
        k0 = chunk * n // n_chunks
        k1 = (chunk + 1) * n // n_chunks
        most = 0
        for k in range(k0, k1):
            c = sorted_cell[k]
            cx = c % nx
            cy = (c // nx) % ny
            cz = c // (nx * ny)
            if shifted:
                count = _atom_shifted(k, xs, ys, zs, order, start, cx, cy, cz, nx, ny, nz, reach,
                                      sx, sy, sz, lx, ly, lz, radius2, prune2, r2_scratch, row_scratch)
            else:
                count = _atom_images(k, xs, ys, zs, order, start, cx, cy, cz, nx, ny, nz, reach,
                                     lx, ly, lz, ilx, ily, ilz, radius2, r2_scratch, row_scratch)
            i = order[k]
            counts_out[i] = count
            for q in range(min(count, capacity)):
                neighbors_out[i, q] = row_scratch[q]
            most = max(most, count)
        largest[chunk] = most
        restore_fp_mode(fp_mode)
    return largest.max()


@njit(parallel=True, cache=True)
def _gather_wrapped(x, y, z, order, lx, ly, lz, xs, ys, zs):
    """Positions in cell order, wrapped into the box (float64 arithmetic)."""
    for k in prange(order.shape[0]):
        i = order[k]
        s = np.float64(x[i])
        xs[k] = s - lx * np.floor(s / lx)
        s = np.float64(y[i])
        ys[k] = s - ly * np.floor(s / ly)
        s = np.float64(z[i])
        zs[k] = s - lz * np.floor(s / lz)


REACH = 1
"""Cells are at least ``radius / REACH`` wide and the stencil spans ``REACH``
cells each way: with 2, the scanned cells hug the sphere of the radius
more tightly (and rows and end cells that lie wholly outside it are
skipped), about half the candidates of cells one radius wide."""


def build_neighbors(positions, box, radius, neighbors_out, counts_out):
    """Full neighbour list from cell lists; see ``_numpy.build_neighbors``."""
    dtype = positions.dtype
    t = dtype.type
    n = positions.shape[1]
    nx, ny, nz = _cells.grid(box, radius, n, reach=REACH)
    lx, ly, lz = (float(v) for v in box)
    cell = np.empty(n, np.int32)
    _assign_cells(positions[0], positions[1], positions[2], lx, ly, lz, nx, ny, nz, cell)
    start = np.empty(nx * ny * nz + 1, np.int64)
    order = np.empty(n, np.int32)
    _sort_by_cell(cell, start, order)
    sorted_positions = np.empty((3, n), dtype)
    xs, ys, zs = sorted_positions
    # With every stencil cell a distinct image, each range has one image
    # shift: positions are wrapped into the box and shifted per range.
    shifted = min(nx, ny, nz) >= 2 * REACH + 1
    if shifted:
        _gather_wrapped(positions[0], positions[1], positions[2], order, lx, ly, lz, xs, ys, zs)
    else:
        _gather(positions[0], positions[1], positions[2], order, xs, ys, zs)
    # Rows are skipped only when their gap exceeds the radius by the cells' margin.
    prune2 = (radius * (1.0 + _cells.MARGIN)) ** 2
    largest = _build_kernel(xs, ys, zs, order, start, cell[order], nx, ny, nz, REACH,
                            lx / nx, ly / ny, lz / nz, t(lx), t(ly), t(lz),
                            t(1.0 / lx), t(1.0 / ly), t(1.0 / lz), t(radius * radius), prune2, shifted,
                            neighbors_out, counts_out, _chunks(n))
    return int(largest)


# ---- forces -----------------------------------------------------------------------------------

@njit(**_OPTS)
def _atom_sums(x, y, z, row, count, xi, yi, zi, lx, ly, lz, ilx, ily, ilz, cutoff2, sigma2, c4, c24,
               shift, zero, one, two):
    """Sums over the listed neighbours of one atom: (sum w dx, sum w dy, sum w dz, energy, virial)."""
    fx = zero
    fy = zero
    fz = zero
    energy = zero
    virial = zero
    for k in range(count):
        # Unsigned: no negative-index wraparound, which would block the gathers.
        j = np.uint32(row[k])
        dx = _separation(x[j], xi, lx, ilx)
        dy = _separation(y[j], yi, ly, ily)
        dz = _separation(z[j], zi, lz, ilz)
        r2 = dx * dx + dy * dy + dz * dz
        weight, e, w = lennard_jones(r2, sigma2, c4, c24, shift, one, two)
        if not within(r2, cutoff2):
            weight = zero
            e = zero
            w = zero
        fx += weight * dx
        fy += weight * dy
        fz += weight * dz
        energy += e
        virial += w
    return fx, fy, fz, energy, virial


@njit(parallel=True, **_OPTS)
def _forces_kernel(x, y, z, neighbors, counts, lx, ly, lz, ilx, ily, ilz, cutoff2, sigma2, c4, c24,
                   shift, forces_out, energy_out, virial_out, n_chunks, zero, one, two, half):
    n = x.shape[0]
    capacity = neighbors.shape[1]
    for chunk in prange(n_chunks):
        fp_mode = flush_subnormals()
        i0 = chunk * n // n_chunks
        i1 = (chunk + 1) * n // n_chunks
        for i in range(i0, i1):
            fx, fy, fz, energy, virial = _atom_sums(
                x, y, z, neighbors[i], min(counts[i], capacity), x[i], y[i], z[i], lx, ly, lz,
                ilx, ily, ilz, cutoff2, sigma2, c4, c24, shift, zero, one, two)
            forces_out[0, i] = -fx
            forces_out[1, i] = -fy
            forces_out[2, i] = -fz
            energy_out[i] = half * energy
            virial_out[i] = half * virial
        restore_fp_mode(fp_mode)


def forces(positions, box, neighbors, counts, cutoff2, epsilon, sigma, energy_shift,
           forces_out, energy_out, virial_out):
    """Lennard-Jones forces from a full neighbour list; see ``_numpy.forces``."""
    t = positions.dtype.type
    lx, ly, lz = (float(v) for v in box)
    _forces_kernel(positions[0], positions[1], positions[2], neighbors, counts, t(lx), t(ly), t(lz),
                   t(1.0 / lx), t(1.0 / ly), t(1.0 / lz), t(cutoff2), t(sigma * sigma), t(4.0 * epsilon),
                   t(24.0 * epsilon), t(energy_shift), forces_out, energy_out, virial_out,
                   _chunks(positions.shape[1]), t(0), t(1), t(2), t(0.5))
    return forces_out
