"""The walk: one interaction list per group of targets, evaluated in vector lanes."""

import numpy as np
from numba import njit, prange

from hpcgpu.kernels.fpenv import flush_subnormals, restore_fp_mode
from hpcgpu.kernels.nbody.tree.options import _DIRECT_COUNT, _OPTS


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
