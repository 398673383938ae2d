"""Groups of targets that share one interaction list, and the slots of the walk's work."""

import numpy as np
from numba import njit, prange

from hpcgpu.kernels.nbody.tree.keys import _common_level, _key
from hpcgpu.kernels.nbody.tree.options import _OPTS


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
