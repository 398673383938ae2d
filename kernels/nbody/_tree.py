"""Barnes-Hut octree gravity on the CPU (Numba): N log N softened forces.

``tree(...)`` computes what the ``direct`` kernels compute (see
:mod:`hpcgpu.kernels.nbody`): accelerations on the targets from all sources
and, if asked, the potential without the self term, with Plummer softening;
a pair at zero separation with zero softening contributes nothing.

Algorithm
---------
Build (float64 whatever the input dtype):

1. A cube around the sources; each body's Morton (Z-order) key of 42 levels,
   kept as two 63-bit words (21 levels each), so that a single far-away body
   still leaves 2**42 cells across the cube; sort by key (stable).
2. The octree over the sorted bodies, nodes in depth-first preorder with a
   skip pointer ``next`` (the node after the subtree): the walk descends
   with ``k + 1`` and skips with ``next[k]``, with no stack. A node is the
   smallest octree cell holding its bodies (chains of one-child cells are
   skipped; fewer than 2 N nodes). Leaves hold up to ``leaf_size`` bodies,
   more only where the keys cannot split them: coincident bodies, or bodies
   closer than 2**-42 of the cube, which then share a leaf summed directly.
3. Per node, from its bodies (N x depth work, parallel over nodes): mass,
   centre of mass, the traceless quadrupole ``Q = sum m (3 y y^T - |y|^2 1)``
   and the trace of the second moment ``tr I = sum m |y|^2`` (``y`` the
   offset from the centre of mass). Massless nodes take their cell centre.

Walk (parallel over groups of targets, ``prange``): targets are grouped by
the tree itself (Barnes 1990): a group is a node of at most ``group_size``
bodies, its box the bounding box of those bodies (targets that are not
sources: the node's cell, or the target alone outside the tree). One
interaction list per group serves all its targets:

- opening criterion: a node is accepted when its centre of mass lies farther
  than ``s / theta + delta`` from every point of the group's box, with ``s``
  the node's cell side and ``delta`` the distance of its centre of mass from
  the cell centre (Barnes 1994: lopsided cells open earlier). Every target
  of the group then meets ``(s + theta delta) / d < theta`` at its own
  distance ``d`` to the centre of mass: stricter than the classic
  ``s / d < theta``. Nodes holding the group are always opened, so a target
  never meets a multipole of a node that contains it;
- accepted nodes: the softened monopole + quadrupole expansion, with
  ``d`` from the centre of mass to the target and ``s2 = |d|^2 + eps^2``::

      phi = -G [M / s + (d.Q.d - eps^2 tr I) / (2 s^5)]
      a   =  G [-M d / s^3 + Q d / s^5 - 5/2 (d.Q.d - eps^2 tr I) d / s^7]

  (the exact second-order Taylor expansion of the Plummer potential; the
  ``eps^2 tr I`` terms come from its non-zero Laplacian). Accepted nodes of
  at most 2 bodies, opened leaves and the group's own leaves are summed
  body by body;
- the sums run over the list for 16 targets at a time, one per vector lane.

Deterministic: a target's list depends on its group only, and a source that
is a target always takes the same lane of the same block (spare lanes
compute bodies whose results are dropped), so forces on the sources
``a:b`` are bitwise the rows ``a:b`` of a call for all of them, and repeated
calls agree. Targets that are not sources take lanes in call order; every
lane runs the same vector instructions, so there too the result does not
depend on the other targets (tested, not guaranteed by construction).

float32 inputs are summed in float32 (twice the vector lanes; float32
rounding, ~1e-7, is far below the tree's truncation error), float64 in
float64. Subnormals are flushed inside the parallel loops
(:mod:`hpcgpu.kernels._fpenv`).

Accuracy
--------
Plummer sphere, N = 20000, Henon units (G = M = 1, virial radius 1), eps =
0.01, all 20000 bodies against a float64 direct sum; relative errors
``|a_tree - a_direct| / |a_direct|`` and ``|phi_tree - phi_direct| /
|phi_direct|`` (float32 input gives the same table to two digits):

=====  ============  =========  ========  ==========  =========
theta  force median  force p99  force max  pot median  pot p99
=====  ============  =========  ========  ==========  =========
0.3    2.0e-05       8.9e-05    3.7e-04    1.8e-06     1.1e-05
0.5    1.1e-04       5.2e-04    3.5e-03    1.1e-05     5.4e-05
0.7    3.9e-04       2.3e-03    1.2e-02    2.8e-05     1.6e-04
1.0    9.0e-04       5.7e-03    4.9e-02    1.0e-04     4.2e-04
=====  ============  =========  ========  ==========  =========

Momentum: ``|sum m a| / sum m |a|`` is ~5e-6 at theta = 0.5 (not exactly
zero: the tree breaks the pairwise symmetry of the direct sum).

Cost
----
Build O(N log N): the sort, and moments summed over every node's bodies.
Walk O(N log N): per target ~1100-2600 multipoles and ~1500-2200 bodies at
theta = 0.5 (N = 2e4 to 1e6). Measured on the 2-core development machine
(Xeon, AVX-512 hardware, LLVM using 256-bit vectors), Plummer sphere, eps =
0.01, forces and potentials on all bodies, CPU seconds on one core (two
threads take a little over half of it; the machine was shared, so those
wall times were noisy):

=======  =====  ===================  ===================  =====================
N        build  tree theta=0.5       tree theta=0.7       direct (``_numba``)
                float32 / float64    float32 / float64    float32 / float64
=======  =====  ===================  ===================  =====================
1e4      0.001  0.031 / 0.049        0.020 / 0.033        0.028 / 0.085
1e5      0.018  0.45 / 0.72          0.27 / 0.43          ~2.8 / ~8.5 (N^2)
1e6      0.37   6.1 / 10.7           3.4 / 5.6            ~280 / ~850 (N^2)
=======  =====  ===================  ===================  =====================

(direct: forces only; two threads measured 1e6 at theta = 0.5 in 4.0 s
float32, 8.5 s float64.) The tree overtakes the direct sum near N = 1.2e4 in
float32 and 4e3 in float64 at theta = 0.5 (7e3 in float32 when the direct
sum also computes potentials); at N = 1e5 it is 6x (float32) to 12x
(float64) faster.

Why the CPU
-----------
The walk is branchy and irregular, which Numba-CUDA would run with heavy
divergence; a GPU tree (a Karras radix tree built from the same Morton keys,
warp-wide group walks) is future work. Until then the GPU backends move
positions and masses to the host for this method and the accelerations back
(:func:`hpcgpu.kernels.nbody.accelerations`).

Distributed runs
----------------
Each worker holds all positions after the all-gather that the direct method
needs too, builds the tree of all bodies (cheap: a few % of the walk) and
walks only its own targets, ``tree(pos[:, a:b], pos, m, ..., self_offset=a,
...)``. By the determinism above, the assembled forces equal a single-process
call bit for bit, for any partition.
"""

import numba
import numpy as np
from numba import njit, prange

from hpcgpu.errors import ConfigError
from hpcgpu.kernels._fpenv import flush_subnormals, restore_fp_mode

__all__ = ["tree", "LEAF_SIZE", "GROUP_SIZE"]

# contract: allow fused multiply-add; no other fast-math. Every target's sums
# run in one fixed order through the same vector code (see _walk), so the
# result of a target does not depend on the other targets of the call.
_OPTS = dict(cache=True, fastmath={"contract"}, error_model="numpy")

LEAF_SIZE = 16
"""Most bodies in a leaf (more only where the keys cannot split them)."""
GROUP_SIZE = 128
"""Most targets that share one interaction list (a node of the tree)."""

_WORD_BITS = 21                 # bits per axis in each of the two 63-bit key words
_DEPTH = 2 * _WORD_BITS         # deepest level the keys resolve
_WORD_MASK = (1 << _WORD_BITS) - 1
_QMAX = float(1 << _DEPTH)      # quantised coordinates are in [0, 2**42)
_LANES = 16                     # targets evaluated together, one per vector lane
_DIRECT_COUNT = 2               # accepted nodes this small are summed body by body


# ---------------------------------------------------------------- keys

@njit(**_OPTS)
def _spread(v):
    """Bits 0..20 of ``v`` moved to bits 0, 3, 6, ..., 60."""
    v &= 0x1FFFFF
    v = (v | (v << 32)) & 0x1F00000000FFFF
    v = (v | (v << 16)) & 0x1F0000FF0000FF
    v = (v | (v << 8)) & 0x100F00F00F00F00F
    v = (v | (v << 4)) & 0x10C30C30C30C30C3
    v = (v | (v << 2)) & 0x1249249249249249
    return v


@njit(**_OPTS)
def _quantize(v, origin, scale):
    """Integer cell of coordinate ``v`` at the finest level, clamped to the
    root cube, and whether ``v`` lies inside the root cube."""
    t = (v - origin) * scale
    inside = (t >= 0.0) & (t < _QMAX)
    t = min(max(t, 0.0), _QMAX - 1.0)
    return np.int64(t), inside


@njit(**_OPTS)
def _key(x, y, z, origin, scale):
    """Morton key of a point as two 63-bit words (21 levels each), and
    whether the point lies inside the root cube."""
    qx, ix = _quantize(x, origin[0], scale)
    qy, iy = _quantize(y, origin[1], scale)
    qz, iz = _quantize(z, origin[2], scale)
    hi = ((_spread(qx >> _WORD_BITS) << 2) | (_spread(qy >> _WORD_BITS) << 1)
          | _spread(qz >> _WORD_BITS))
    lo = ((_spread(qx & _WORD_MASK) << 2) | (_spread(qy & _WORD_MASK) << 1)
          | _spread(qz & _WORD_MASK))
    return hi, lo, ix & iy & iz


@njit(**_OPTS)
def _digit(hi, lo, level):
    """Octant (0..7) of a key at ``level``: which child of its level-``level``
    cell the key lies in."""
    if level < _WORD_BITS:
        return (hi >> (3 * (_WORD_BITS - 1 - level))) & 7
    return (lo >> (3 * (_DEPTH - 1 - level))) & 7


@njit(**_OPTS)
def _common_level(ah, al, bh, bl):
    """Deepest level at which two keys lie in the same cell (0..42)."""
    x = ah ^ bh
    base = 0
    if x == 0:
        x = al ^ bl
        base = _WORD_BITS
        if x == 0:
            return _DEPTH
    k = 0
    while (x >> (3 * (_WORD_BITS - 1 - k))) == 0:
        k += 1
    return base + k


# ---------------------------------------------------------------- build

@njit(parallel=True, **_OPTS)
def _body_keys(pos, origin, scale):
    n = pos.shape[1]
    hi = np.empty(n, np.int64)
    lo = np.empty(n, np.int64)
    for i in prange(n):
        hi[i], lo[i], _ = _key(pos[0, i], pos[1, i], pos[2, i], origin, scale)
    return hi, lo


@njit(**_OPTS)
def _sort_keys(hi, lo):
    """Order of the bodies by key; ties keep the input order."""
    n = hi.shape[0]
    order = np.argsort(hi, kind="mergesort")
    # Runs of equal high words (bodies closer than 2**-21 of the root cube,
    # as around a far-away body) are sorted by the low word.
    i = 0
    while i < n:
        h = hi[order[i]]
        j = i + 1
        while j < n and hi[order[j]] == h:
            j += 1
        if j - i > 1:
            run = order[i:j].copy()
            sub = np.argsort(lo[run], kind="mergesort")
            for k in range(j - i):
                order[i + k] = run[sub[k]]
        i = j
    return order


@njit(parallel=True, **_OPTS)
def _gather(pos, mass, hi, lo, order):
    n = order.shape[0]
    x = np.empty(n)
    y = np.empty(n)
    z = np.empty(n)
    m = np.empty(n)
    shi = np.empty(n, np.int64)
    slo = np.empty(n, np.int64)
    for k in prange(n):
        i = order[k]
        x[k] = pos[0, i]
        y[k] = pos[1, i]
        z[k] = pos[2, i]
        m[k] = mass[i]
        shi[k] = hi[i]
        slo[k] = lo[i]
    return x, y, z, m, shi, slo


@njit(**_OPTS)
def _first_with_digit(hi, lo, a, b, level, d):
    """First index in [a, b) whose digit at ``level`` is >= d (sorted keys)."""
    while a < b:
        c = (a + b) >> 1
        if _digit(hi[c], lo[c], level) < d:
            a = c + 1
        else:
            b = c
    return a


@njit(**_OPTS)
def _build_nodes(hi, lo, leaf_size):
    """Octree over sorted keys, nodes in depth-first preorder.

    Each node is the smallest octree cell that holds its bodies (chains of
    one-child cells are skipped), so every internal node has 2..8 children
    and there are fewer than 2 N nodes. ``next[k]`` is the node after the
    subtree of ``k``: a walk goes to ``k + 1`` to open a node and to
    ``next[k]`` to skip it, with no stack.
    """
    n = hi.shape[0]
    cap = 2 * n + 1
    first = np.empty(cap, np.int64)
    last = np.empty(cap, np.int64)
    level = np.empty(cap, np.int64)
    parent = np.empty(cap, np.int64)
    leaf = np.zeros(cap, np.bool_)
    stack = np.empty((8 * (_DEPTH + 2), 3), np.int64)
    stack[0, 0], stack[0, 1], stack[0, 2] = 0, n, -1
    top = 1
    count = 0
    while top > 0:
        top -= 1
        a, b, p = stack[top, 0], stack[top, 1], stack[top, 2]
        k = count
        count += 1
        lev = _common_level(hi[a], lo[a], hi[b - 1], lo[b - 1])
        first[k], last[k], level[k], parent[k] = a, b, lev, p
        if b - a <= leaf_size or lev == _DEPTH:
            leaf[k] = True
            continue
        # Children pushed last-first so that the first is built next.
        end = b
        for d in range(7, -1, -1):
            start = _first_with_digit(hi, lo, a, end, lev, d)
            if start < end:
                stack[top, 0], stack[top, 1], stack[top, 2] = start, end, k
                top += 1
            end = start
    size = np.ones(count, np.int64)
    for k in range(count - 1, 0, -1):
        size[parent[k]] += size[k]
    nxt = np.arange(count) + size
    return first[:count].copy(), last[:count].copy(), level[:count].copy(), \
        leaf[:count].copy(), nxt


@njit(parallel=True, **_OPTS)
def _moments(x, y, z, m, first, last, level, origin, size, scale, inv_theta):
    """Per node: centre of mass and opening radius squared (``walk``, for
    the walk); centre of mass, mass, traceless quadrupole and trace of the
    second moment (``pole``, for the sums); the node's cell, low corner and
    side (``cell``), and the bounding box of its bodies (``bbox``).

    Moments are summed from the node's bodies (about the centre of mass, in
    two passes): N log N work in all, and better rounding than shifting the
    children's moments.
    """
    count = first.shape[0]
    walk = np.empty((count, 4))
    pole = np.zeros((count, 12))
    cell = np.empty((count, 4))
    bbox = np.empty((count, 6))
    fine = size / _QMAX
    for k in prange(count):
        a, b = first[k], last[k]
        shift = _DEPTH - level[k]
        side = size * 2.0 ** (-level[k])
        # the cell's corner from its first body's integer coordinates
        q0, _ = _quantize(x[a], origin[0], scale)
        q1, _ = _quantize(y[a], origin[1], scale)
        q2, _ = _quantize(z[a], origin[2], scale)
        c0 = origin[0] + np.float64((q0 >> shift) << shift) * fine
        c1 = origin[1] + np.float64((q1 >> shift) << shift) * fine
        c2 = origin[2] + np.float64((q2 >> shift) << shift) * fine
        mt = 0.0
        sx = 0.0
        sy = 0.0
        sz = 0.0
        lx, ly, lz = x[a], y[a], z[a]
        ux, uy, uz = x[a], y[a], z[a]
        for j in range(a, b):
            lx, ly, lz = min(lx, x[j]), min(ly, y[j]), min(lz, z[j])
            ux, uy, uz = max(ux, x[j]), max(uy, y[j]), max(uz, z[j])
            mt += m[j]
            sx += m[j] * x[j]
            sy += m[j] * y[j]
            sz += m[j] * z[j]
        if mt > 0.0:
            gx, gy, gz = sx / mt, sy / mt, sz / mt
        else:  # massless bodies only: any point will do
            gx, gy, gz = c0 + 0.5 * side, c1 + 0.5 * side, c2 + 0.5 * side
        ixx = 0.0
        iyy = 0.0
        izz = 0.0
        ixy = 0.0
        ixz = 0.0
        iyz = 0.0
        for j in range(a, b):
            dx = x[j] - gx
            dy = y[j] - gy
            dz = z[j] - gz
            ixx += m[j] * dx * dx
            iyy += m[j] * dy * dy
            izz += m[j] * dz * dz
            ixy += m[j] * dx * dy
            ixz += m[j] * dx * dz
            iyz += m[j] * dy * dz
        trace = ixx + iyy + izz
        # Barnes (1994): open within side/theta plus the centre of mass's
        # offset from the cell centre, so a lopsided cell is opened earlier.
        offset = np.sqrt((gx - c0 - 0.5 * side) ** 2 + (gy - c1 - 0.5 * side) ** 2
                         + (gz - c2 - 0.5 * side) ** 2)
        r_open = side * inv_theta + offset
        walk[k, 0], walk[k, 1], walk[k, 2], walk[k, 3] = gx, gy, gz, r_open * r_open
        pole[k, 0], pole[k, 1], pole[k, 2], pole[k, 3] = gx, gy, gz, mt
        pole[k, 4] = 3.0 * ixx - trace
        pole[k, 5] = 3.0 * iyy - trace
        pole[k, 6] = 3.0 * izz - trace
        pole[k, 7] = 3.0 * ixy
        pole[k, 8] = 3.0 * ixz
        pole[k, 9] = 3.0 * iyz
        pole[k, 10] = trace
        cell[k, 0], cell[k, 1], cell[k, 2], cell[k, 3] = c0, c1, c2, side
        bbox[k, 0], bbox[k, 1], bbox[k, 2] = lx, ly, lz
        bbox[k, 3], bbox[k, 4], bbox[k, 5] = ux, uy, uz
    return walk, pole, cell, bbox


# ---------------------------------------------------------------- targets

@njit(**_OPTS)
def _groups(first, last, leaf, nxt, group_size):
    """Group nodes in preorder: the largest nodes with at most ``group_size``
    bodies (or leaves). They tile the sorted bodies."""
    out = np.empty(first.shape[0], np.int64)
    n = 0
    k = 0
    while k < first.shape[0]:
        if leaf[k] or last[k] - first[k] <= group_size:
            out[n] = k
            n += 1
            k = nxt[k]
        else:
            k += 1
    return out[:n].copy()


@njit(**_OPTS)
def _source_slots(groups, first, last, x, y, z, order, offset, n_targets, bbox, lanes):
    """Work for targets that are sources: one segment per group holding a
    target, one block of ``lanes`` slots per run of ``lanes`` bodies of the
    group holding a target.

    A body always takes the same lane of the same block, whichever targets
    the call asks for, so its sums are bitwise the same in every call (spare
    lanes compute bodies whose results are dropped: ``out`` -1).
    """
    n = x.shape[0]
    cap = n + lanes * groups.shape[0]
    seg_box = np.empty((groups.shape[0], 6))
    seg_holder = np.empty(groups.shape[0], np.int64)
    seg_start = np.empty(groups.shape[0] + 1, np.int64)
    sx = np.empty(cap, x.dtype)
    sy = np.empty(cap, x.dtype)
    sz = np.empty(cap, x.dtype)
    sself = np.empty(cap, np.int64)
    sout = np.empty(cap, np.int64)
    n_seg = 0
    used = 0
    for g in groups:
        start = used
        for base in range(first[g], last[g], lanes):
            end = min(base + lanes, last[g])
            wanted = False
            for r in range(base, end):
                wanted |= 0 <= order[r] - offset < n_targets
            if not wanted:
                continue
            for t in range(lanes):
                r = min(base + t, end - 1)
                sx[used], sy[used], sz[used] = x[r], y[r], z[r]
                sself[used] = r
                i = order[r] - offset
                sout[used] = i if (base + t < end and 0 <= i < n_targets) else -1
                used += 1
        if used > start:
            # every target of the group lies in the bodies' bounding box
            seg_box[n_seg] = bbox[g]
            seg_holder[n_seg] = g
            seg_start[n_seg] = start
            n_seg += 1
    seg_start[n_seg] = used
    return (seg_box[:n_seg].copy(), seg_holder[:n_seg].copy(), seg_start[:n_seg + 1].copy(),
            sx[:used].copy(), sy[:used].copy(), sz[:used].copy(), sself[:used].copy(),
            sout[:used].copy())


@njit(parallel=True, **_OPTS)
def _locate(tpos, origin, scale, hi, lo, first, last, level, leaf, nxt, group_size):
    """Per target that is not a source: its group node (-1: none, the target
    walks alone) and the deepest node whose cell holds it (-1: none). Found
    from the target's key, so independent of the other targets."""
    n = tpos.shape[1]
    group = np.empty(n, np.int64)
    holder = np.empty(n, np.int64)
    for i in prange(n):
        th, tl, inside = _key(tpos[0, i], tpos[1, i], tpos[2, i], origin, scale)
        g = -1
        h = -1
        if inside and _common_level(th, tl, hi[0], lo[0]) >= level[0]:
            k = 0
            while True:
                h = k
                if leaf[k] or last[k] - first[k] <= group_size:
                    g = k
                    break
                c = k + 1
                found = -1
                while c < nxt[k]:
                    if _common_level(th, tl, hi[first[c]], lo[first[c]]) >= level[c]:
                        found = c
                        break
                    c = nxt[c]
                if found < 0:  # in an empty octant of k
                    break
                k = found
        group[i] = g
        holder[i] = h
    return group, holder


@njit(**_OPTS)
def _point_slots(tpos, group, holder, cell, n_nodes, lanes):
    """Work for targets that are not sources: one segment per group node
    (box: the node's cell, which holds its targets), one per target without
    a group (box: the target itself); slots padded to whole blocks."""
    n = tpos.shape[1]
    sort_key = np.empty(n, np.int64)
    for i in range(n):
        sort_key[i] = group[i] if group[i] >= 0 else n_nodes + i
    order = np.argsort(sort_key, kind="mergesort")
    runs = np.empty(n + 1, np.int64)
    n_seg = 0
    n_slots = 0
    for k in range(n + 1):
        if k == n or k == 0 or sort_key[order[k]] != sort_key[order[k - 1]]:
            if k > 0:
                n_slots += (k - runs[n_seg - 1] + lanes - 1) // lanes * lanes
            runs[n_seg] = k
            n_seg += 1
    n_seg -= 1
    seg_box = np.empty((n_seg, 6))
    seg_holder = np.empty(n_seg, np.int64)
    seg_start = np.empty(n_seg + 1, np.int64)
    sx = np.empty(n_slots, tpos.dtype)
    sy = np.empty(n_slots, tpos.dtype)
    sz = np.empty(n_slots, tpos.dtype)
    sself = np.full(n_slots, -1, np.int64)
    sout = np.empty(n_slots, np.int64)
    used = 0
    for s in range(n_seg):
        a, b = runs[s], runs[s + 1]
        i0 = order[a]
        g = group[i0]
        for d in range(3):
            if g >= 0:
                seg_box[s, d] = cell[g, d]
                seg_box[s, 3 + d] = cell[g, d] + cell[g, 3]
            else:
                seg_box[s, d] = tpos[d, i0]
                seg_box[s, 3 + d] = tpos[d, i0]
        seg_holder[s] = holder[i0]
        seg_start[s] = used
        for t in range((b - a + lanes - 1) // lanes * lanes):
            i = order[min(a + t, b - 1)]  # spare slots repeat the last target
            sx[used], sy[used], sz[used] = tpos[0, i], tpos[1, i], tpos[2, i]
            sout[used] = i if a + t < b else -1
            used += 1
    seg_start[n_seg] = used
    return seg_box, seg_holder, seg_start, sx, sy, sz, sself, sout


# ---------------------------------------------------------------- walk

@njit(**_OPTS)
def _interaction_list(box, holder, walk, first, last, leaf, nxt, nodes, ranges):
    """Nodes to take as multipoles and body ranges to sum directly for every
    point in ``box`` (low x, y, z, high x, y, z), which lies in the cell of
    node ``holder``.

    A node is accepted when its centre of mass is farther than its opening
    radius from every point of the box; the nodes holding the box are always
    opened. Returns the numbers of nodes and of ranges, or -1, -1 when a
    buffer is full (the caller grows the buffers and asks again: replacing an
    array inside this loop made it six times slower).
    """
    lo_x, lo_y, lo_z, hi_x, hi_y, hi_z = box[0], box[1], box[2], box[3], box[4], box[5]
    n_nodes = 0
    n_ranges = 0
    k = 0
    count = first.shape[0]
    node_cap = nodes.shape[0]
    range_cap = ranges.shape[0] // 2
    while k < count:
        direct = False
        if k <= holder < nxt[k]:
            if not leaf[k]:
                k += 1
                continue
            direct = True
        else:
            gx, gy, gz = walk[k, 0], walk[k, 1], walk[k, 2]
            dx = max(lo_x - gx, 0.0, gx - hi_x)
            dy = max(lo_y - gy, 0.0, gy - hi_y)
            dz = max(lo_z - gz, 0.0, gz - hi_z)
            if dx * dx + dy * dy + dz * dz > walk[k, 3]:
                if last[k] - first[k] <= _DIRECT_COUNT:
                    direct = True
                else:
                    if n_nodes == node_cap:
                        return -1, -1
                    nodes[n_nodes] = k
                    n_nodes += 1
            elif leaf[k]:
                direct = True
            else:
                k += 1
                continue
        if direct:
            a, b = first[k], last[k]
            if n_ranges > 0 and ranges[2 * n_ranges - 1] == a:
                ranges[2 * n_ranges - 1] = b  # leaves in preorder are contiguous
            else:
                if n_ranges == range_cap:
                    return -1, -1
                ranges[2 * n_ranges] = a
                ranges[2 * n_ranges + 1] = b
                n_ranges += 1
        k = nxt[k]
    return n_nodes, n_ranges


@njit(**_OPTS)
def _evaluate(tx, ty, tz, tself, lanes, x, y, z, m, pole, nodes, n_nodes, ranges, n_ranges,
              eps2, zero, one, half, five_halves, ax, ay, az, phi):
    """Sums for one block of targets, one per lane, in the dtype of ``x``
    (constants come typed, so that float32 stays float32).

    ``lanes`` arrives as a run-time value: with a constant trip count LLVM
    unrolls the lane loops and then fails to vectorise them. Every lane runs
    the same vector code whatever the other lanes hold.
    """
    for t in range(lanes):
        ax[t] = zero
        ay[t] = zero
        az[t] = zero
        phi[t] = zero
    for r in range(n_ranges):
        for j in range(ranges[2 * r], ranges[2 * r + 1]):
            xj, yj, zj, mj = x[j], y[j], z[j], m[j]
            for t in range(lanes):
                dx = xj - tx[t]
                dy = yj - ty[t]
                dz = zj - tz[t]
                r2 = dx * dx + dy * dy + dz * dz + eps2
                # zero for the target itself and for coincident unsoftened
                # pairs, without a branch (masked lanes take 1 / sqrt(1))
                keep = one if (r2 > zero) & (j != tself[t]) else zero
                inv = keep / np.sqrt(r2 + (one - keep))
                minv = mj * inv
                minv3 = minv * inv * inv
                ax[t] += dx * minv3
                ay[t] += dy * minv3
                az[t] += dz * minv3
                phi[t] -= minv
    for s in range(n_nodes):
        k = nodes[s]
        gx, gy, gz, mt = pole[k, 0], pole[k, 1], pole[k, 2], pole[k, 3]
        qxx, qyy, qzz = pole[k, 4], pole[k, 5], pole[k, 6]
        qxy, qxz, qyz = pole[k, 7], pole[k, 8], pole[k, 9]
        soft = pole[k, 10] * eps2
        for t in range(lanes):
            # d from the centre of mass to the target, s2 = d^2 + eps^2:
            #   a   = -M d/s^3 + Q d/s^5 - 5/2 (d.Q.d - tr(I) eps^2) d/s^7
            #   phi = -M/s - 1/2 (d.Q.d - tr(I) eps^2)/s^5
            # with the quadrupole terms scaled by 1/s^2 first, so that no
            # power above s^-3 is formed (r^-7 overflows float32 at r < 3e-6).
            dx = tx[t] - gx
            dy = ty[t] - gy
            dz = tz[t] - gz
            s2 = dx * dx + dy * dy + dz * dz + eps2
            inv = one / np.sqrt(s2)
            inv2 = inv * inv
            inv3 = inv * inv2
            qx = (qxx * dx + qxy * dy + qxz * dz) * inv2
            qy = (qxy * dx + qyy * dy + qyz * dz) * inv2
            qz = (qxz * dx + qyz * dy + qzz * dz) * inv2
            quad = (dx * qx + dy * qy + dz * qz - soft * inv2) * inv2
            radial = (-five_halves * quad - mt) * inv3
            ax[t] += radial * dx + qx * inv3
            ay[t] += radial * dy + qy * inv3
            az[t] += radial * dz + qz * inv3
            phi[t] -= (mt + half * quad) * inv


@njit(parallel=True, **_OPTS)
def _walk(seg_box, seg_holder, seg_start, sx, sy, sz, sself, sout,
          x, y, z, m, walk, pole, first, last, leaf, nxt, eps2, lanes, n_chunks, acc, pot):
    """Forces on every slot's target: segments dealt to chunks in turn, one
    interaction list per segment, the sums in the dtype of ``x``."""
    zero = x.dtype.type(0.0)
    one = x.dtype.type(1.0)
    half = x.dtype.type(0.5)
    five_halves = x.dtype.type(2.5)
    eps2_c = x.dtype.type(eps2)
    n_seg = seg_holder.shape[0]
    for chunk in prange(n_chunks):
        fp_mode = flush_subnormals()
        nodes = np.empty(1024, np.int64)
        ranges = np.empty(2048, np.int64)
        ax = np.empty(lanes, x.dtype)
        ay = np.empty(lanes, x.dtype)
        az = np.empty(lanes, x.dtype)
        phi = np.empty(lanes, x.dtype)
        # Segments dealt out in turn: neighbours cost alike, so every chunk
        # gets a fair share of dense and sparse regions.
        for s in range(chunk, n_seg, n_chunks):
            while True:
                n_nodes, n_ranges = _interaction_list(seg_box[s], seg_holder[s], walk, first,
                                                      last, leaf, nxt, nodes, ranges)
                if n_nodes >= 0:
                    break
                nodes = np.empty(2 * nodes.shape[0], np.int64)
                ranges = np.empty(2 * ranges.shape[0], np.int64)
            for base in range(seg_start[s], seg_start[s + 1], lanes):
                end = base + lanes
                _evaluate(sx[base:end], sy[base:end], sz[base:end], sself[base:end], lanes,
                          x, y, z, m, pole, nodes, n_nodes, ranges, n_ranges, eps2_c,
                          zero, one, half, five_halves, ax, ay, az, phi)
                for t in range(lanes):
                    i = sout[base + t]
                    if i >= 0:
                        acc[0, i] = ax[t]
                        acc[1, i] = ay[t]
                        acc[2, i] = az[t]
                        pot[i] = phi[t]
        restore_fp_mode(fp_mode)


# ---------------------------------------------------------------- entry

def _check(target_positions, source_positions, source_masses, eps2, G, self_offset,
           theta, acc_out, pot_out, leaf_size, group_size):
    def bad(name, value, valid):
        raise ConfigError(f"tree: {name} must be {valid}; got {value!r}")

    if not (np.isscalar(theta) and np.isfinite(theta) and theta > 0):
        bad("theta", theta, "a finite number > 0 (typical: 0.3 .. 0.8)")
    if not (np.isscalar(eps2) and np.isfinite(eps2) and eps2 >= 0):
        bad("eps2", eps2, "a finite number >= 0 (the softening length squared)")
    if not (np.isscalar(G) and np.isfinite(G)):
        bad("G", G, "a finite number")
    for name, value in (("leaf_size", leaf_size), ("group_size", group_size)):
        if not (isinstance(value, (int, np.integer)) and 1 <= value <= 4096):
            bad(name, value, "an integer in 1..4096")
    tp, sp, sm = target_positions, source_positions, source_masses
    if tp.ndim != 2 or tp.shape[0] != 3:
        bad("target_positions.shape", tp.shape, "(3, n_targets)")
    if sp.ndim != 2 or sp.shape[0] != 3:
        bad("source_positions.shape", sp.shape, "(3, n_sources)")
    if sm.shape != (sp.shape[1],):
        bad("source_masses.shape", sm.shape, f"({sp.shape[1]},), one per source")
    n_t, n_s = tp.shape[1], sp.shape[1]
    if acc_out.shape != (3, n_t):
        bad("acc_out.shape", acc_out.shape, f"(3, {n_t})")
    if pot_out is not None and pot_out.shape != (n_t,):
        bad("pot_out.shape", pot_out.shape, f"({n_t},)")
    if not (isinstance(self_offset, (int, np.integer))
            and (self_offset == -1 or 0 <= self_offset <= n_s - n_t)):
        bad("self_offset", self_offset, f"-1 or in 0..{n_s - n_t} (targets are sources "
            f"self_offset .. self_offset + {n_t})")
    # A NaN would scramble the keys and an infinity the bounding cube.
    if not np.isfinite(sp).all():
        bad("source_positions", "non-finite values", "finite")
    if not np.isfinite(tp).all():
        bad("target_positions", "non-finite values", "finite")
    if not (np.isfinite(sm).all() and (sm >= 0).all()):
        bad("source_masses", "negative or non-finite values",
            "finite and >= 0 (expansions about the centre of mass need them)")


def tree(target_positions, source_positions, source_masses, eps2, G, self_offset,
         theta, acc_out, pot_out, *, leaf_size=LEAF_SIZE, group_size=GROUP_SIZE):
    """Softened gravitational accelerations (and potentials) by Barnes-Hut.

    Same meaning as the ``direct`` kernels (module docstring of
    :mod:`hpcgpu.kernels.nbody`), approximated by an octree with monopole +
    quadrupole moments; the tree is built from all sources on every call.

    Parameters
    ----------
    target_positions : ndarray (3, n)
        Where the accelerations are wanted (length); float32 or float64.
        With ``self_offset >= 0`` these are the sources ``self_offset ..
        self_offset + n`` (the sums then read the sources' sorted copies).
    source_positions : ndarray (3, N)
        Positions of the bodies (length), same dtype.
    source_masses : ndarray (N,)
        Masses (mass), finite and >= 0.
    eps2 : float
        Plummer softening length squared (length**2), >= 0.
    G : float
        Gravitational constant in the units of the inputs.
    self_offset : int
        Index in the sources of target 0 (targets are sources
        ``self_offset .. self_offset + n``, left out of their own potential),
        or -1 when the targets are not sources.
    theta : float
        Opening angle, > 0: smaller is more accurate and slower (0.5: median
        force error ~1e-4 on a Plummer sphere; see the module docstring).
    acc_out : ndarray (3, n)
        Receives the accelerations (length / time**2).
    pot_out : ndarray (n,) or None
        Receives the potentials (energy / mass), if not None.
    leaf_size : int, keyword-only
        Most bodies in a leaf (1..4096; default :data:`LEAF_SIZE`).
    group_size : int, keyword-only
        Most bodies in a group of targets sharing an interaction list
        (1..4096; default :data:`GROUP_SIZE`).

    Returns
    -------
    None
        Results are written into ``acc_out`` and ``pot_out``.

    Raises
    ------
    ConfigError
        (a ``ValueError``) for ``theta`` not finite and > 0, ``eps2`` < 0 or
        not finite, a non-finite ``G``, bad ``leaf_size`` / ``group_size``,
        mismatched shapes, ``self_offset`` out of range, non-finite
        positions, or negative or non-finite masses.

    Examples
    --------
    >>> import numpy as np
    >>> x = np.array([[0.0, 2.0], [0.0, 0.0], [0.0, 0.0]])
    >>> acc, pot = np.empty((3, 2)), np.empty(2)
    >>> tree(x, x, np.array([1.0, 3.0]), 0.0, 1.0, 0, 0.5, acc, pot)
    >>> acc[0].tolist(), pot.tolist()
    ([0.75, -0.25], [-1.5, -0.5])
    """
    _check(target_positions, source_positions, source_masses, eps2, G, self_offset,
           theta, acc_out, pot_out, leaf_size, group_size)
    n_t, n_s = target_positions.shape[1], source_positions.shape[1]
    if n_t == 0:
        return
    if n_s == 0:
        acc_out[...] = 0
        if pot_out is not None:
            pot_out[...] = 0
        return
    spos = np.ascontiguousarray(source_positions, dtype=np.float64)
    smass = np.ascontiguousarray(source_masses, dtype=np.float64)
    tpos = np.ascontiguousarray(target_positions, dtype=np.float64)
    lower = spos.min(axis=1)
    upper = spos.max(axis=1)
    size = float((upper - lower).max())
    # A cube a little larger than the bodies' extent, so that rounding in
    # the quantisation never puts a body on the far face.
    size = size * (1.0 + 2.0 ** -20) if size > 0 else 1.0
    origin = 0.5 * (lower + upper) - 0.5 * size
    scale = _QMAX / size

    hi, lo = _body_keys(spos, origin, scale)
    order = _sort_keys(hi, lo)
    x, y, z, m, hi, lo = _gather(spos, smass, hi, lo, order)
    first, last, level, leaf, nxt = _build_nodes(hi, lo, int(leaf_size))
    walk, pole, cell, bbox = _moments(x, y, z, m, first, last, level, origin, size, scale,
                                      1.0 / theta)
    # float32 inputs are summed in float32 (twice the vector lanes; the
    # tree's truncation error is far above float32 rounding), float64 in
    # float64. The tree itself is built in float64 either way.
    compute = np.float32 if all(a.dtype == np.float32 for a in (
        target_positions, source_positions, source_masses)) else np.float64
    xc, yc, zc, mc = (a.astype(compute, copy=False) for a in (x, y, z, m))
    if self_offset >= 0:
        groups = _groups(first, last, leaf, nxt, int(group_size))
        work = _source_slots(groups, first, last, xc, yc, zc, order, int(self_offset), n_t,
                             bbox, _LANES)
    else:
        group, holder = _locate(tpos, origin, scale, hi, lo, first, last, level, leaf, nxt,
                                int(group_size))
        work = _point_slots(tpos.astype(compute, copy=False), group, holder, cell,
                            first.shape[0], _LANES)
    n_chunks = max(1, min(work[1].shape[0], 16 * numba.get_num_threads()))
    direct_out = acc_out.dtype == compute and acc_out.flags.c_contiguous
    acc = acc_out if direct_out else np.empty((3, n_t), compute)
    pot = np.empty(n_t, compute)
    _walk(*work, xc, yc, zc, mc, walk, pole.astype(compute, copy=False), first, last, leaf,
          nxt, float(eps2), _LANES, n_chunks, acc, pot)
    if G != 1.0:
        acc *= compute(G)
        pot *= compute(G)
    if not direct_out:
        acc_out[...] = acc
    if pot_out is not None:
        pot_out[...] = pot
