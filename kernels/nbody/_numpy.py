"""Direct-summation N-body kernels in plain vectorised NumPy: the reference.

Written on whole ``(targets, sources)`` blocks of pair arrays, as directly
from the formulas of :mod:`.physics` as possible; every other backend is
tested against it. Targets are taken in chunks so that the temporaries stay
near :data:`CHUNK_BYTES` whatever the number of bodies. The code is
array-module generic, so it also runs on CuPy arrays (the GPU tests use that
as a second cross-check).
"""

import numpy as np

CHUNK_BYTES = 32 * 2**20
"""Budget for the pair temporaries of one chunk of targets."""

_PAIR_TEMPORARIES = 8
"""Pair arrays (targets x sources) alive at once in :func:`direct`."""


def _xp(array):
    if type(array).__module__.split(".")[0] == "cupy":
        import cupy
        return cupy
    return np


def chunk_size(n_sources, itemsize):
    """Targets per chunk: pair temporaries of about :data:`CHUNK_BYTES` (at least 1, also with no sources)."""
    # No sources means no targets (they are a range of the sources): any chunk will do, and 0 would divide by 0.
    return max(1, CHUNK_BYTES // (_PAIR_TEMPORARIES * max(n_sources, 1) * itemsize))


def direct(target_positions, source_positions, source_masses, eps2, G, self_offset, acc_out, pot_out):
    """Softened accelerations (and potentials) on the targets from all sources.

    ``acc_out`` (3, M) receives ``G sum_j m_j d_ij / (|d_ij|^2 + eps2)^(3/2)``
    and ``pot_out`` (M,), unless None, ``-G sum_{j != i} m_j / (|d_ij|^2 +
    eps2)^(1/2)``; target ``i`` is source ``i + self_offset`` when
    ``self_offset >= 0``. A pair at zero separation with ``eps2 == 0``
    contributes nothing. Returns ``acc_out``.
    """
    xp = _xp(source_positions)
    dtype = source_positions.dtype
    t = dtype.type
    eps2, G = t(eps2), t(G)
    n_targets = target_positions.shape[1]
    n_sources = source_positions.shape[1]
    sx, sy, sz = (source_positions[k][None, :] for k in range(3))
    masses = source_masses[None, :]
    step = chunk_size(n_sources, dtype.itemsize)
    for start in range(0, n_targets, step):
        stop = min(start + step, n_targets)
        dx = sx - target_positions[0, start:stop, None]
        dy = sy - target_positions[1, start:stop, None]
        dz = sz - target_positions[2, start:stop, None]
        r2 = eps2 + dx * dx + dy * dy + dz * dz
        separated = r2 != 0
        # 1/sqrt only where r2 != 0: no division warnings, the pairs at zero
        # separation become exact zeros, and NaN stays NaN.
        inv_r = xp.where(separated, 1 / xp.sqrt(xp.where(separated, r2, t(1))), t(0))
        if pot_out is not None and self_offset >= 0:
            rows = xp.arange(stop - start)
            inv_r[rows, rows + (start + self_offset)] = 0
        m_inv_r = masses * inv_r
        weight = m_inv_r * inv_r * inv_r
        acc_out[0, start:stop] = G * (weight * dx).sum(axis=1)
        acc_out[1, start:stop] = G * (weight * dy).sum(axis=1)
        acc_out[2, start:stop] = G * (weight * dz).sum(axis=1)
        if pot_out is not None:
            pot_out[start:stop] = -G * m_inv_r.sum(axis=1)
    return acc_out
