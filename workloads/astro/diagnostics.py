"""Diagnostics of the N-body model as sums over bodies: energy, momenta, virial ratio, Lagrangian radii.

Every quantity is a sum over a block of bodies (:func:`block_sums`),
combined afterwards (:func:`combine_sums`), so a partitioned run reduces on
its workers and only a few numbers per quantity travel. A block's sums are
exact (:func:`exact_parts`: a handful of floats whose sum is exactly that
of the block's terms) and :func:`combine_sums` rounds once, with
:func:`~hpcgpu.workloads.sums.exact_total` (:func:`math.fsum`): the
diagnostics are then bitwise the same on any number of partitions, as the
bodies are, where one rounded total per block would differ with every split.
:meth:`hpcgpu.workloads.astro.NBody.diagnostics` is the entry point.
"""

import math

import numpy as np

from hpcgpu.workloads.sums import exact_total

__all__ = ["RADIUS_BINS", "LAGRANGIAN_FRACTIONS", "block_sums", "combine_sums", "exact_parts"]

# Lagrangian radii come from mass-weighted histograms of radius about the
# origin, so that partitions can reduce them as sums.
RADIUS_BINS = np.geomspace(1e-4, 1e4, 2049)
"""Edges of the 2048 logarithmic radius bins of the Lagrangian radii (length)."""
LAGRANGIAN_FRACTIONS = (0.1, 0.5, 0.9)
"""Mass fractions whose radii the diagnostics report (``lagrangian_radius_10/50/90``)."""


_PIECE_BITS = 18  # a 53-bit significand in three pieces below 2**18: 2**35 terms add exactly in float64


def exact_parts(xp, values, groups=None):
    """Floats whose exact sum is the exact sum of ``values``, per group, whatever the order of the terms.

    Every float64 term is ``significand * 2**(exponent - 53)`` with an integer
    significand below 2**53; its three 18-bit pieces are added per exponent
    with :func:`numpy.bincount` (``xp``'s), exactly, since the integer
    sums stay below 2**53 for up to 2**35 terms. Each sum times its power
    of two is then a float64 without rounding (below about 1e-300, where
    the parts would be subnormal, they lose bits: no diagnostic is there).

    Parameters
    ----------
    xp : module
        NumPy or CuPy, the module of ``values``.
    values : array
        The terms (any shape; converted to float64).
    groups : array of int, optional
        The group (>= 0) of each term, e.g. a histogram bin (default: one group).

    Returns
    -------
    groups, parts : numpy.ndarray
        Host arrays of equal length: :func:`math.fsum` of the parts of a
        group is its correctly rounded sum. With a NaN or inf among the
        terms, one part per group: their plain sum (NaN or inf).
    """
    values = xp.asarray(values, dtype=np.float64).ravel()
    groups = xp.zeros(values.shape, dtype=np.int64) if groups is None else xp.asarray(groups, np.int64).ravel()
    if values.size == 0:
        return np.zeros(0, np.int64), np.zeros(0)
    if not bool(xp.isfinite(values).all()):
        sums = np.asarray(_host(xp.bincount(groups, weights=values)))
        present = np.nonzero(np.asarray(_host(xp.bincount(groups))))[0]
        return present, sums[present]
    mantissa, exponent = xp.frexp(values)  # values = mantissa * 2**exponent, 0.5 <= |mantissa| < 1
    significand = xp.ldexp(mantissa, 53).astype(np.int64)  # exact: an integer below 2**53
    exponent = exponent.astype(np.int64)
    lowest = int(exponent.min())
    span = int(exponent.max()) - lowest + 1
    keys = groups * span + (exponent - lowest)  # one bin per group and exponent
    size = (int(groups.max()) + 1) * span
    mask = (1 << _PIECE_BITS) - 1
    pieces = ((significand >> (2 * _PIECE_BITS), 2 * _PIECE_BITS), ((significand >> _PIECE_BITS) & mask, _PIECE_BITS),
              (significand & mask, 0))
    bins = np.arange(size)
    out_groups, out_parts = [], []
    for piece, shift in pieces:
        sums = np.asarray(_host(xp.bincount(keys, weights=piece.astype(np.float64), minlength=size)))
        used = sums != 0
        out_groups.append(bins[used] // span)
        out_parts.append(np.ldexp(sums[used], bins[used] % span + lowest - 53 + shift))
    return np.concatenate(out_groups), np.concatenate(out_parts)


def _host(array):
    """A CuPy array's values on the host; NumPy arrays as they are."""
    return array.get() if hasattr(array, "get") else array


def block_sums(backend, positions, velocities, masses, potentials):
    """Exact sums over one block of bodies (float64) that add up to the global diagnostics.

    ``positions``, ``velocities`` ``(3, M)``, ``masses`` and ``potentials``
    ``(M,)`` on ``backend``; the potentials at the positions given. Every
    quantity is its :func:`exact_parts`: the terms are the bodies' own,
    computed alike in any block.
    """
    xp = backend.xp
    x, v, m, phi = (xp.asarray(a).astype(np.float64) for a in (positions, velocities, masses, potentials))
    angular = xp.cross(x.T, v.T).T * m
    out = {"mass": m, "kinetic2": m * (v * v).sum(axis=0), "potential2": m * phi,
           "second_moment": m * (x * x).sum(axis=0)}
    for k, axis in enumerate("xyz"):
        out[f"momentum_{axis}"] = v[k] * m
        out[f"angular_momentum_{axis}"] = angular[k]
        out[f"first_moment_{axis}"] = x[k] * m
    out = {key: exact_parts(xp, terms)[1] for key, terms in out.items()}
    # the mass-weighted histogram of radius, bin by bin exact (np.histogram's bins: the last is closed)
    radius = np.asarray(backend.to_host(xp.sqrt((x * x).sum(axis=0))))
    bins = np.searchsorted(RADIUS_BINS, radius, side="right") - 1
    bins[radius == RADIUS_BINS[-1]] = len(RADIUS_BINS) - 2
    inside = (bins >= 0) & (bins < len(RADIUS_BINS) - 1)
    out["histogram"] = exact_parts(np, np.asarray(backend.to_host(m))[inside], bins[inside])
    return out


def combine_sums(parts):
    """The diagnostics (dict of floats) from the :func:`block_sums` of every block."""
    total = {key: exact_total(np.concatenate([p[key] for p in parts])) for key in parts[0] if key != "histogram"}
    groups = np.concatenate([p["histogram"][0] for p in parts])
    values = np.concatenate([p["histogram"][1] for p in parts])
    histogram = np.zeros(len(RADIUS_BINS) - 1)
    for group in np.unique(groups):
        histogram[group] = exact_total(values[groups == group])
    kinetic, potential = 0.5 * total["kinetic2"], 0.5 * total["potential2"]
    out = {"energy": kinetic + potential, "kinetic_energy": kinetic, "potential_energy": potential,
           "virial_ratio": 2 * kinetic / abs(potential) if potential else math.nan}
    for axis in "xyz":
        out[f"momentum_{axis}"] = total[f"momentum_{axis}"]
        out[f"angular_momentum_{axis}"] = total[f"angular_momentum_{axis}"]
        out[f"centre_of_mass_{axis}"] = total[f"first_moment_{axis}"] / total["mass"]
    cumulative = np.cumsum(histogram) / max(histogram.sum(), 1e-300)
    for fraction in LAGRANGIAN_FRACTIONS:
        index = int(np.searchsorted(cumulative, fraction))
        low = cumulative[index - 1] if index > 0 else 0.0
        weight = (fraction - low) / max(cumulative[index] - low, 1e-300)
        # geometric interpolation inside the logarithmic bin
        radius = RADIUS_BINS[index] * (RADIUS_BINS[index + 1] / RADIUS_BINS[index]) ** weight
        out[f"lagrangian_radius_{round(fraction * 100)}"] = float(radius)
    return out
