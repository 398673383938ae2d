"""Lennard-Jones kernels in plain vectorised NumPy: the reference.

Written on whole blocks of pairs with the very functions of
:mod:`.physics`; every other backend is tested against it. Neighbour lists
are built by brute force over all pairs (minimum image), with each row in
ascending order of the neighbour's index; forces come either from such a
list (:func:`forces`) or from all pairs (:func:`forces_all_pairs`). Rows of
atoms are taken in chunks so that the pair temporaries stay near
:data:`CHUNK_BYTES` whatever the number of atoms. The code is array-module
generic, so it also runs on CuPy arrays (the public
``lj_forces_all_pairs`` uses that on GPU backends).

``box`` is a tuple of three Python floats in every function; a pair at zero
separation gives infinities and NaN in its atoms' sums (no warnings), which
the public API turns into an error naming the atoms.
"""

import contextlib

import numpy as np

from hpcgpu.kernels.md import physics

CHUNK_BYTES = 32 * 2**20
"""Budget for the pair temporaries of one chunk of atoms."""

_PAIR_TEMPORARIES = 12
"""Pair arrays (atoms x neighbours) alive at once, roughly."""


def _xp(array):
    if type(array).__module__.split(".")[0] == "cupy":
        import cupy
        return cupy
    return np


def _quiet(xp):
    """NumPy warns on 1/0 and inf - inf; the NaN and inf are the answer here."""
    if xp is np:
        return np.errstate(all="ignore")
    return contextlib.nullcontext()


def chunk_size(n_columns, itemsize):
    """Rows per chunk: pair temporaries of about :data:`CHUNK_BYTES`."""
    return max(1, CHUNK_BYTES // (_PAIR_TEMPORARIES * max(n_columns, 1) * itemsize))


def _separations(xp, positions, rows, columns, box):
    """Minimum-image ``x_j - x_i`` for atoms ``rows`` (i, a column vector of
    indices or a slice) and ``columns`` (j, broadcastable), and ``|d|^2``."""
    t = positions.dtype.type
    d = []
    for axis in range(3):
        length = t(box[axis])
        inverse = t(1.0 / box[axis])
        x = positions[axis]
        delta = x[columns] - x[rows]
        d.append(physics.minimum_image(delta, length, inverse, xp.rint(delta * inverse)))
    return d, d[0] * d[0] + d[1] * d[1] + d[2] * d[2]


def build_neighbors(positions, box, radius, neighbors_out, counts_out):
    """Full neighbour list of every atom: all ``j != i`` with minimum-image
    distance below ``radius``, in ascending order of ``j``.

    Fills ``counts_out[i]`` with the number of neighbours of atom ``i`` and
    ``neighbors_out[i, :counts_out[i]]`` with their indices (at most the
    list's capacity of them); entries past the count are left as they were.
    Returns the largest count: above the capacity, rows were cut and the
    caller must retry with more room.
    """
    xp = _xp(positions)
    n = positions.shape[1]
    capacity = neighbors_out.shape[1]
    radius2 = positions.dtype.type(radius * radius)
    columns = xp.arange(n)
    largest = 0
    step = chunk_size(n, positions.dtype.itemsize)
    for start in range(0, n, step):
        stop = min(start + step, n)
        rows = xp.arange(start, stop)[:, None]
        _, r2 = _separations(xp, positions, rows, columns[None, :], box)
        close = physics.within(r2, radius2) & (columns[None, :] != rows)
        counts = close.sum(axis=1)
        counts_out[start:stop] = counts
        if stop > start:
            largest = max(largest, int(counts.max()))
        rank = xp.cumsum(close, axis=1) - 1
        keep = close & (rank < capacity)
        i, j = xp.nonzero(keep)
        neighbors_out[start + i, rank[i, j]] = j
    return largest


def _pair_terms(xp, r2, interacting, cutoff2, epsilon, sigma, energy_shift, t):
    weight, energy, virial = physics.lennard_jones(
        r2, t(sigma * sigma), t(4.0 * epsilon), t(24.0 * epsilon), t(energy_shift), t(1), t(2))
    zero = t(0)
    return (xp.where(interacting, weight, zero), xp.where(interacting, energy, zero),
            xp.where(interacting, virial, zero))


def _store(start, stop, d, weight, energy, virial, interacting, forces_out, energy_out, virial_out,
           pair_counts_out, t):
    for axis in range(3):
        forces_out[axis, start:stop] = -(weight * d[axis]).sum(axis=1)
    half = t(0.5)
    energy_out[start:stop] = half * energy.sum(axis=1)
    virial_out[start:stop] = half * virial.sum(axis=1)
    pair_counts_out[start:stop] = interacting.sum(axis=1)


def forces(positions, box, neighbors, counts, cutoff2, epsilon, sigma, energy_shift,
           forces_out, energy_out, virial_out, pair_counts_out):
    """Lennard-Jones forces from a full neighbour list.

    ``forces_out`` (3, N) receives each atom's total force; ``energy_out``
    and ``virial_out`` (N,) half of each of its pairs' energy and ``r . F``
    (see :mod:`.physics`), so that their sums are the totals;
    ``pair_counts_out`` (N,) int32 how many of its neighbours lie inside
    the cutoff (each pair in both rows: the sum is twice the pairs). Only the
    first ``counts[i]`` entries of row ``i`` are read; neighbours at
    ``r^2 >= cutoff2`` contribute nothing.
    """
    xp = _xp(positions)
    t = positions.dtype.type
    n = positions.shape[1]
    cutoff2 = t(cutoff2)
    with _quiet(xp):
        step = chunk_size(neighbors.shape[1], positions.dtype.itemsize)
        for start in range(0, n, step):
            stop = min(start + step, n)
            count = counts[start:stop]
            width = min(int(count.max()), neighbors.shape[1]) if stop > start else 0
            listed = xp.arange(width)[None, :] < count[:, None]
            rows = xp.arange(start, stop)[:, None]
            # Unused slots point at the atom itself (r2 = 0) and are masked out.
            columns = xp.where(listed, neighbors[start:stop, :width], rows)
            d, r2 = _separations(xp, positions, rows, columns, box)
            interacting = listed & physics.within(r2, cutoff2)
            weight, energy, virial = _pair_terms(xp, r2, interacting, cutoff2, epsilon, sigma,
                                                 energy_shift, t)
            _store(start, stop, d, weight, energy, virial, interacting, forces_out, energy_out, virial_out,
                   pair_counts_out, t)
    return forces_out


def forces_all_pairs(positions, box, cutoff2, epsilon, sigma, energy_shift,
                     forces_out, energy_out, virial_out, pair_counts_out):
    """:func:`forces` over all pairs, without a list: O(N^2), the reference."""
    xp = _xp(positions)
    t = positions.dtype.type
    n = positions.shape[1]
    cutoff2 = t(cutoff2)
    columns = xp.arange(n)[None, :]
    with _quiet(xp):
        step = chunk_size(n, positions.dtype.itemsize)
        for start in range(0, n, step):
            stop = min(start + step, n)
            rows = xp.arange(start, stop)[:, None]
            d, r2 = _separations(xp, positions, rows, columns, box)
            interacting = (columns != rows) & physics.within(r2, cutoff2)
            weight, energy, virial = _pair_terms(xp, r2, interacting, cutoff2, epsilon, sigma,
                                                 energy_shift, t)
            _store(start, stop, d, weight, energy, virial, interacting, forces_out, energy_out, virial_out,
                   pair_counts_out, t)
    return forces_out
