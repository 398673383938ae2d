"""The neighbour-list build of the Lennard-Jones kernels for the CPU (Numba).

:func:`build_neighbors`, from cell lists:

1. every atom's cell (float64 arithmetic, :mod:`.cells`), in parallel;
2. a counting sort of the atoms by cell (serial, O(N)): ``order`` lists the
   atoms cell by cell, in increasing index within a cell, and ``start``
   where each cell begins; the positions are gathered in that order into
   contiguous rows;
3. in parallel over atoms, taken in cell order (neighbouring atoms scan the
   same cells, which stay in cache): for every y/z row of cells around the
   atom, the run of up to three cells in x is a contiguous range of the
   sorted positions (rows, and end cells of a run, that lie farther than the
   radius are skipped). The range is taken 8 candidates at a time: their
   squared distances are compared with the radius in a vector register and
   the indices of the hits packed with one AVX-512 compress instruction and
   appended to a scratch row (:func:`_append_block`). Without AVX-512 (or
   with an LLVM older than 19) one vectorised loop writes a 0/1 flag per
   candidate and a branch-free loop appends them (always written, advanced
   by the flag). The row is then copied into the list, cut at its capacity.
   Most of the build is this scan: about 420 candidates per atom for 78
   neighbours in the LJ liquid (radius 2.8, density 0.8442). With the other
   changes here (unsigned compaction, whole blocks, closed-form run ends),
   the compress halved the build: 21.5 -> 10.7 ms (32,000 atoms, one thread).

A row's order is that of the scan (z rows, y rows, x runs, then index in
the cell): deterministic, independent of the threads. If the caller keeps
atoms sorted by cell (x fastest) the rows come out in increasing index
except where the scan wraps around the box.

The options, the pair helpers and the block size here are shared with the
forces of :mod:`._numba` (the backend file), which re-exports the builds.

Subnormals are flushed inside the parallel loops (:mod:`hpcgpu.kernels.fpenv`).
"""

import numba
import numpy as np
from llvmlite import binding, ir
from numba import njit, prange, types
from numba.core import cgutils, config
from numba.extending import intrinsic

from hpcgpu.kernels.fpenv import flush_subnormals, restore_fp_mode
from hpcgpu.kernels.threads import adaptive_threads
from hpcgpu.kernels.md import cells, physics

FASTMATH = frozenset({"contract", "arcp", "afn", "reassoc"})
"""LLVM fast-math flags of the kernels: no ``nnan``/``ninf`` (an overlap's
inf and NaN must come out, where the public API reports them)."""

_OPTS = dict(cache=True, nogil=True, fastmath=set(FASTMATH), error_model="numpy")
_PAIR_OPTS = dict(_OPTS, fastmath=set(FASTMATH - {"reassoc"}))

lennard_jones = njit(**_PAIR_OPTS)(physics.lennard_jones)
minimum_image = njit(**_PAIR_OPTS)(physics.minimum_image)
within = njit(**_PAIR_OPTS)(physics.within)


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


@njit(parallel=True, nogil=True, cache=True)
def _assign_cells(x, y, z, lx, ly, lz, nx, ny, nz, cell_out):
    """Cell of every atom, x fastest; float64 arithmetic whatever the dtype."""
    for i in prange(x.shape[0]):
        cx = _axis_cell(np.float64(x[i]), lx, nx)
        cy = _axis_cell(np.float64(y[i]), ly, ny)
        cz = _axis_cell(np.float64(z[i]), lz, nz)
        cell_out[i] = cx + nx * (cy + ny * cz)


@njit(cache=True, nogil=True)
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


@njit(parallel=True, nogil=True, cache=True)
def _gather(x, y, z, order, xs, ys, zs):
    for k in prange(order.shape[0]):
        i = order[k]
        xs[k] = x[i]
        ys[k] = y[i]
        zs[k] = z[i]


# ---- neighbour build ----------------------------------------------------------------------

BLOCK = 8
"""Candidates are taken in whole blocks of this many (the sorted positions
and the order are padded by a block): one vector compress per block
(:func:`_append_block`), or, in the flag loops, a vectorised loop (4 float64
or 8 float32 lanes) that never runs its scalar remainder, which cost more
than the wasted lanes: ranges are short (a few dozen atoms)."""


@njit(inline="always")
def _whole_blocks(m):
    """``m`` rounded up to whole blocks, unsigned."""
    return (np.uint64(m) + np.uint64(BLOCK - 1)) & ~np.uint64(BLOCK - 1)


def _vector_compress_available():
    """Whether Numba compiles for AVX-512VL (a one-instruction 256-bit compress,
    ``vpcompressd``) with an LLVM that has the generic ``vector.compress`` (>= 19)."""
    if binding.llvm_version_info < (19,):
        return False
    features = config.CPU_FEATURES
    if features is None:
        features = binding.get_host_cpu_features().flatten()
    return "+avx512vl" in features.split(",")


VECTOR_COMPRESS = _vector_compress_available()
"""The build appends each block of candidates with one vector compress
(:func:`_append_block`) instead of the scalar flag loop of
:func:`_append_within`: the build took a third less time (32,000 atoms, one
thread: 17.5 -> 11.3 ms in float64). Elsewhere the flag loop serves."""


def _splat(builder, value, width):
    vector = ir.VectorType(value.type, width)
    one = builder.insert_element(ir.Constant(vector, ir.Undefined), value, ir.Constant(ir.IntType(32), 0))
    return builder.shuffle_vector(one, one, ir.Constant(ir.VectorType(ir.IntType(32), width), [0] * width))


@intrinsic
def _append_block(typingctx, xs, ys, zs, order, k, j1, self_k, xi, yi, zi, radius2, out, end):
    """Append ``order[k + lane]`` at ``out[end:]`` for the lanes (``BLOCK`` of them)
    with ``k + lane < j1``, ``k + lane != self_k`` and a squared distance from
    (xi, yi, zi) below ``radius2``; returns the new end (uint64).

    One vector load per array, the comparison in a vector register, the
    indices of the hits packed by ``llvm.experimental.vector.compress``
    (``vpcompressd`` in a register) and stored whole: ``out`` needs ``BLOCK``
    spare entries past the last hit, and ``xs``, ``ys``, ``zs`` and
    ``order`` ``BLOCK`` readable entries past ``j1``. The distance is computed
    in the positions' dtype, as by :func:`_scan_shifted_flags`.
    """
    if not all(isinstance(a, types.Array) and a.ndim == 1 and a.layout == "C" for a in (xs, ys, zs, order, out)):
        return None  # contiguous 1-d arrays only: the blocks are loaded and stored as vectors
    signature = types.uint64(xs, ys, zs, order, k, j1, self_k, xi, yi, zi, radius2, out, end)

    def codegen(context, builder, sig, args):
        at = sig.args
        i64 = ir.IntType(64)
        k, j1, self_k, end = (context.cast(builder, args[q], at[q], types.int64) for q in (4, 5, 6, 12))
        dtype = at[0].dtype
        centre = [_splat(builder, context.cast(builder, args[q], at[q], dtype), BLOCK) for q in (7, 8, 9, 10)]

        def load_block(q):
            data = context.make_array(at[q])(context, builder, args[q]).data
            pointer = builder.bitcast(builder.gep(data, [k]), ir.VectorType(data.type.pointee, BLOCK).as_pointer())
            return builder.load(pointer, align=1)

        r2 = None
        for q in range(3):
            d = builder.fsub(load_block(q), centre[q], flags=("contract",))
            square = builder.fmul(d, d, flags=("contract",))
            r2 = square if r2 is None else builder.fadd(r2, square, flags=("contract",))
        lanes = builder.add(_splat(builder, k, BLOCK), ir.Constant(ir.VectorType(i64, BLOCK), list(range(BLOCK))))
        hits = builder.and_(builder.fcmp_ordered("<", r2, centre[3]),
                            builder.and_(builder.icmp_signed("<", lanes, _splat(builder, j1, BLOCK)),
                                         builder.icmp_signed("!=", lanes, _splat(builder, self_k, BLOCK))))
        indices = load_block(3)
        compress = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(indices.type, [indices.type, hits.type, indices.type]),
            f"llvm.experimental.vector.compress.v{BLOCK}i32")
        packed = builder.call(compress, [indices, hits, ir.Constant(indices.type, ir.Undefined)])
        out = context.make_array(at[11])(context, builder, args[11]).data
        builder.store(packed, builder.bitcast(builder.gep(out, [end]), indices.type.as_pointer()), align=1)
        popcount = cgutils.get_or_insert_function(builder.module, ir.FunctionType(i64, [i64]), "llvm.ctpop.i64")
        hits_count = builder.call(popcount, [builder.zext(builder.bitcast(hits, ir.IntType(BLOCK)), i64)])
        return builder.add(end, hits_count)

    return signature, codegen


@njit(**_OPTS)
def _append_within(order, j0, j1, self_k, flags, row_scratch, count):
    """Append ``order[j0 + q]`` for every ``flags[q]`` (1 inside the radius, else
    0); sorted atom ``self_k`` (if in range) is the atom itself, never its own
    neighbour."""
    if j0 <= self_k < j1:
        flags[self_k - j0] = 0
    base = np.uint64(j0)
    # Branch-free compaction: always store, advance by the flag (unsigned:
    # no negative-index wraparound code in the loop).
    end = np.uint64(count)
    for q in range(np.uint64(j1 - j0)):
        row_scratch[end] = order[base + q]
        end += flags[q]
    return np.intp(end)


@njit(**_OPTS)
def _scan_shifted_flags(xs, ys, zs, j0, j1, self_k, xi, yi, zi, radius2, order, flags, row_scratch, count):
    """Append the atoms of sorted range ``j0:j1`` within ``radius`` of the
    point (xi, yi, zi), an image of the atom already shifted to the range's
    cells (no minimum image: the loop is loads and multiply-adds)."""
    # Unsigned indices: a signed offset index (j0 + q) that LLVM cannot
    # prove non-negative keeps Numba's wraparound test, which turns the
    # loads into gathers.
    base = np.uint64(j0)
    for q in range(_whole_blocks(j1 - j0)):
        dx = xs[base + q] - xi
        dy = ys[base + q] - yi
        dz = zs[base + q] - zi
        flags[q] = np.uint64(within(dx * dx + dy * dy + dz * dz, radius2))
    return _append_within(order, j0, j1, self_k, flags, row_scratch, count)


@njit(**_OPTS)
def _scan_shifted_compress(xs, ys, zs, j0, j1, self_k, xi, yi, zi, radius2, order, flags, row_scratch,
                           count):
    """:func:`_scan_shifted_flags` a block at a time with :func:`_append_block` (``flags`` unused)."""
    end = np.uint64(count)
    for k in range(j0, j1, BLOCK):
        end = _append_block(xs, ys, zs, order, k, j1, self_k, xi, yi, zi, radius2, row_scratch, end)
    return np.intp(end)


_scan_shifted = _scan_shifted_compress if VECTOR_COMPRESS else _scan_shifted_flags


@njit(**_OPTS)
def _scan_images(xs, ys, zs, j0, j1, self_k, xi, yi, zi, lx, ly, lz, ilx, ily, ilz, radius2,
                 order, flags, row_scratch, count):
    """:func:`_scan_shifted` with the minimum image of every pair (small boxes)."""
    base = np.uint64(j0)
    for q in range(_whole_blocks(j1 - j0)):
        dx = _separation(xs[base + q], xi, lx, ilx)
        dy = _separation(ys[base + q], yi, ly, ily)
        dz = _separation(zs[base + q], zi, lz, ilz)
        flags[q] = np.uint64(within(dx * dx + dy * dy + dz * dz, radius2))
    return _append_within(order, j0, j1, self_k, flags, row_scratch, count)


@njit(inline="always")
def _gap(offset, coordinate, cell, side):
    """Distance (float64) from a coordinate in ``cell`` to the cell ``offset`` cells away."""
    if offset > 0:
        return (offset - 1) * side + ((cell + 1) * side - coordinate)
    if offset < 0:
        return (-offset - 1) * side + (coordinate - cell * side)
    return 0.0


@njit(inline="always")
def _x_run(coordinate, cell, side, reach, room2):
    """First and last x cells within ``reach`` of ``cell`` that come closer than
    ``sqrt(room2)`` to the coordinate (closed form: no search loop)."""
    room = np.sqrt(room2)
    left = coordinate - cell * side
    right = (cell + 1) * side - coordinate
    a = cell
    b = cell
    if room > left:
        a = cell - min(reach, np.intp(np.ceil((room - left) / side)))
    if room > right:
        b = cell + min(reach, np.intp(np.ceil((room - right) / side)))
    return a, b


@njit(**_OPTS)
def _atom_shifted(k, xs, ys, zs, order, start, cx, cy, cz, nx, ny, nz, reach, sx, sy, sz, lx, ly, lz,
                  radius2, prune2, flags, row_scratch):
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
            a, b = _x_run(np.float64(xi), cx, sx, reach, prune2 - gyz2)
            if a < 0:
                count = _scan_shifted(xs, ys, zs, start[row + a + nx], start[row + nx], k, xi + lx,
                                      ys_image, zs_image, radius2, order, flags, row_scratch, count)
                a = 0
            top = b
            if b >= nx:
                top = nx - 1
            count = _scan_shifted(xs, ys, zs, start[row + a], start[row + top + 1], k, xi, ys_image,
                                  zs_image, radius2, order, flags, row_scratch, count)
            if b >= nx:
                count = _scan_shifted(xs, ys, zs, start[row], start[row + b - nx + 1], k, xi - lx,
                                      ys_image, zs_image, radius2, order, flags, row_scratch, count)
    return count


@njit(**_OPTS)
def _atom_images(k, xs, ys, zs, order, start, cx, cy, cz, nx, ny, nz, reach, lx, ly, lz, ilx, ily, ilz,
                 radius2, flags, row_scratch):
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
                                     ilx, ily, ilz, radius2, order, flags, row_scratch, count)
                continue
            a = cx - reach
            b = cx + reach
            if a < 0:
                count = _scan_images(xs, ys, zs, start[row + a + nx], start[row + nx], k, xi, yi, zi,
                                     lx, ly, lz, ilx, ily, ilz, radius2, order, flags, row_scratch,
                                     count)
                a = 0
            top = b if b < nx else nx - 1
            count = _scan_images(xs, ys, zs, start[row + a], start[row + top + 1], k, xi, yi, zi,
                                 lx, ly, lz, ilx, ily, ilz, radius2, order, flags, row_scratch, count)
            if b >= nx:
                count = _scan_images(xs, ys, zs, start[row], start[row + b - nx + 1], k, xi, yi, zi,
                                     lx, ly, lz, ilx, ily, ilz, radius2, order, flags, row_scratch,
                                     count)
    return count


@njit(parallel=True, **_OPTS)
def _build_kernel(xs, ys, zs, order, start, sorted_cell, nx, ny, nz, reach, sx, sy, sz, lx, ly, lz,
                  ilx, ily, ilz, radius2, prune2, shifted, neighbors_out, counts_out, n_chunks, rows):
    n = counts_out.shape[0]
    capacity = neighbors_out.shape[1]
    largest = np.zeros(n_chunks, np.int64)
    for chunk in prange(n_chunks):
        fp_mode = flush_subnormals()
        flags = np.empty(n + BLOCK, np.uint64)
        row_scratch = np.empty(n + BLOCK + 1, np.int32)
        k0 = chunk * n // n_chunks
        k1 = (chunk + 1) * n // n_chunks
        most = 0
        for k in range(k0, k1):
            if order[k] >= rows:  # a ghost's row: nobody sums it
                counts_out[order[k]] = 0
                continue
            c = sorted_cell[k]
            cx = c % nx
            cy = (c // nx) % ny
            cz = c // (nx * ny)
            if shifted:
                count = _atom_shifted(k, xs, ys, zs, order, start, cx, cy, cz, nx, ny, nz, reach,
                                      sx, sy, sz, lx, ly, lz, radius2, prune2, flags, row_scratch)
            else:
                count = _atom_images(k, xs, ys, zs, order, start, cx, cy, cz, nx, ny, nz, reach,
                                     lx, ly, lz, ilx, ily, ilz, radius2, flags, row_scratch)
            i = order[k]
            counts_out[i] = count
            for q in range(min(count, capacity)):
                neighbors_out[i, q] = row_scratch[q]
            most = max(most, count)
        largest[chunk] = most
        restore_fp_mode(fp_mode)
    return largest.max()


@njit(parallel=True, nogil=True, cache=True)
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
cells each way. With 2 the scanned cells hug the sphere of the radius more
tightly (fewer candidates), but the runs are shorter and the rows more:
measured at 32,000 atoms (radius 2.8, 2 threads), a build took 10.8 ms with
1, 17.0 ms with 2 and 26.9 ms with 3 (2 in x only, 1 in y and z: 6 % slower
than 1)."""


def build_neighbors(positions, box, radius, neighbors_out, counts_out):
    """Full neighbour list from cell lists; see ``_numpy.build_neighbors``."""
    return build_neighbors_rows(positions, box, radius, neighbors_out, counts_out, positions.shape[1])


@adaptive_threads(key=lambda positions, *rest: positions.shape[1])
def build_neighbors_rows(positions, box, radius, neighbors_out, counts_out, rows):
    """:func:`build_neighbors` for the rows of the first ``rows`` atoms (the others empty)."""
    dtype = positions.dtype
    t = dtype.type
    n = positions.shape[1]
    nx, ny, nz = cells.grid(box, radius, n, reach=REACH)
    lx, ly, lz = (float(v) for v in box)
    cell = np.empty(n, np.int32)
    _assign_cells(positions[0], positions[1], positions[2], lx, ly, lz, nx, ny, nz, cell)
    start = np.empty(nx * ny * nz + 1, np.int64)
    padded_order = np.zeros(n + BLOCK, np.int32)  # a block of padding: see BLOCK
    order = padded_order[:n]
    _sort_by_cell(cell, start, order)
    sorted_positions = np.zeros((3, n + BLOCK), dtype)  # a block of padding: see BLOCK
    xs, ys, zs = sorted_positions
    # With every stencil cell a distinct image, each range has one image
    # shift: positions are wrapped into the box and shifted per range.
    shifted = min(nx, ny, nz) >= 2 * REACH + 1
    if shifted:
        _gather_wrapped(positions[0], positions[1], positions[2], order, lx, ly, lz, xs, ys, zs)
    else:
        _gather(positions[0], positions[1], positions[2], order, xs, ys, zs)
    # Rows are skipped only when their gap exceeds the radius by the cells' margin.
    prune2 = (radius * (1.0 + cells.MARGIN)) ** 2
    largest = _build_kernel(xs, ys, zs, padded_order, start, cell[order], nx, ny, nz, REACH,
                            lx / nx, ly / ny, lz / nz, t(lx), t(ly), t(lz),
                            t(1.0 / lx), t(1.0 / ly), t(1.0 / lz), t(radius * radius), prune2, shifted,
                            neighbors_out, counts_out, _chunks(n), rows)
    return int(largest)
