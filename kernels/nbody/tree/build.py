"""The octree over the key-sorted bodies (depth-first preorder with skip pointers) and its multipole moments."""

import numpy as np
from numba import njit, prange

from hpcgpu.kernels.nbody.tree.keys import _common_level, _digit, _key, _quantize
from hpcgpu.kernels.nbody.tree.options import _DEPTH, _OPTS, _QMAX


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
