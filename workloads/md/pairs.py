"""Pair distances from a neighbour list: overlaps, the closest pair, the radial distribution function.

Both walk the listed pairs in chunks of rows, on the arrays' own device
(NumPy or CuPy), so that the pair temporaries stay near
:data:`CHUNK_ELEMENTS` numbers however many atoms there are. The list is a
full list (every pair twice), built by :func:`hpcgpu.kernels.md.build_neighbor_list`.
"""

import math

import numpy as np

from hpcgpu.errors import ConfigError
from hpcgpu.workloads.md.setup import lj_pair_energy

__all__ = ["pair_chunks", "closest_pair", "check_overlaps", "pair_distance_counts", "radial_distribution",
           "rdf_from_counts"]

CHUNK_ELEMENTS = 2**20
"""Pairs per chunk (rows times the list's capacity)."""


def pair_chunks(xp, box, positions, neighbors):
    """Yield ``(first row, r2, others)`` for chunks of rows of a neighbour list.

    ``r2`` is ``(rows, capacity)``: the squared minimum-image distance
    (float64) of each listed pair, ``inf`` past the row's count; ``others``
    holds the neighbour indices (0 past the count).
    """
    capacity = neighbors.capacity
    rows = max(1, CHUNK_ELEMENTS // capacity)
    columns = xp.arange(capacity)[None, :]
    x = positions.astype(np.float64)
    for start in range(0, neighbors.size, rows):
        stop = min(start + rows, neighbors.size)
        listed = columns < neighbors.counts[start:stop, None]
        others = xp.where(listed, neighbors.neighbors[start:stop], 0)
        r2 = 0.0
        for axis, length in enumerate(box):
            d = x[axis][others] - x[axis, start:stop, None]
            d -= length * xp.rint(d * (1.0 / length))
            r2 = r2 + d * d
        yield start, xp.where(listed, r2, np.inf), others


def closest_pair(xp, box, positions, neighbors):
    """``(distance, i, j)`` of the closest listed pair (``inf`` when nothing is listed)."""
    best = (math.inf, 0, 0)
    for start, r2, others in pair_chunks(xp, box, positions, neighbors):
        k = int(r2.argmin())
        row, column = divmod(k, r2.shape[1])
        value = float(r2[row, column])
        if value < best[0]:
            best = (value, start + row, int(others[row, column]))
    return math.sqrt(best[0]), best[1], best[2]


def check_overlaps(backend, box, positions, neighbors, ids, min_distance):
    """Raise ConfigError naming the closest pair (by id) if it is closer than ``min_distance``."""
    distance, i, j = closest_pair(backend.xp, box, positions, neighbors)
    if distance < min_distance:
        host = backend.to_host(ids)
        with np.errstate(all="ignore"):
            energy = float(lj_pair_energy(np.float64(distance)))
        raise ConfigError(
            f"positions: atoms {int(host[i])} and {int(host[j])} overlap (distance {distance:.3g} sigma, "
            f"pair energy {energy:.3g} epsilon); atoms must be at least {min_distance} sigma apart")


def radial_distribution(backend, box, positions, neighbors, bins, r_max):
    """Shell centres and g(r) from every listed pair closer than ``r_max``.

    Normalised by the ideal-gas count of the other N - 1 atoms in each
    shell, ``N (N - 1) / V * 4 pi (r2^3 - r1^3) / 3`` (the full list counts
    every pair twice, as that does). The list must hold every pair within
    ``r_max``.
    """
    counts = pair_distance_counts(backend, box, positions, neighbors, bins, r_max)
    return rdf_from_counts(counts, positions.shape[1], box, r_max)


def pair_distance_counts(backend, box, positions, neighbors, bins, r_max):
    """Listed pairs per shell of ``bins`` equal shells up to ``r_max`` (float64 on the host, integer values).

    Each row counts its own listed neighbours, so a list whose rows are a
    rank's atoms (and whose columns also reach its ghosts) counts that
    rank's share: the shares of all ranks add up to the one-process counts.
    """
    xp = backend.xp
    device_edges = xp.asarray(np.linspace(0.0, r_max, bins + 1))
    counts = np.zeros(bins)
    for _, r2, _ in pair_chunks(xp, box, positions, neighbors):
        r = xp.sqrt(r2[r2 < r_max * r_max])
        counts += backend.to_host(xp.histogram(r, bins=device_edges)[0])
    return counts


def rdf_from_counts(counts, n, box, r_max):
    """Shell centres and g(r) of ``n`` atoms from :func:`pair_distance_counts` (every pair counted twice).

    Examples
    --------
    >>> r, g = rdf_from_counts(np.array([0.0, 2.0]), 2, (2.0, 2.0, 2.0), 1.0)
    >>> r.tolist(), round(float(g[1]), 6)
    ([0.25, 0.75], 2.182696)
    """
    edges = np.linspace(0.0, r_max, len(counts) + 1)
    volume = box[0] * box[1] * box[2]
    shells = 4.0 / 3.0 * math.pi * (edges[1:] ** 3 - edges[:-1] ** 3)
    return 0.5 * (edges[1:] + edges[:-1]), counts / (n * (n - 1) / volume * shells)
