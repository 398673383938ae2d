"""Morton (Z-order) keys of the bodies: two 63-bit words of 21 levels each, sorted stably."""

import numpy as np
from numba import njit

from hpcgpu.kernels.nbody.tree.options import _DEPTH, _OPTS, _QMAX, _WORD_BITS, _WORD_MASK


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
