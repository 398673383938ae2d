"""Diagnostics of the N-body model as sums over bodies: energy, momenta, virial ratio, Lagrangian radii.

Every quantity is a sum over a block of bodies (:func:`block_sums`),
combined afterwards (:func:`combine_sums`), so a partitioned run reduces on
its workers and only scalars and one histogram travel.
:meth:`hpcgpu.workloads.astro.NBody.diagnostics` is the entry point.
"""

import math

import numpy as np

__all__ = ["RADIUS_BINS", "LAGRANGIAN_FRACTIONS", "block_sums", "combine_sums"]

# Lagrangian radii come from mass-weighted histograms of radius about the
# origin, so that partitions can reduce them as sums.
RADIUS_BINS = np.geomspace(1e-4, 1e4, 2049)
"""Edges of the 2048 logarithmic radius bins of the Lagrangian radii (length)."""
LAGRANGIAN_FRACTIONS = (0.1, 0.5, 0.9)
"""Mass fractions whose radii the diagnostics report (``lagrangian_radius_10/50/90``)."""


def block_sums(backend, positions, velocities, masses, potentials):
    """Sums over one block of bodies (float64) that add up to the global diagnostics.

    ``positions``, ``velocities`` ``(3, M)``, ``masses`` and ``potentials``
    ``(M,)`` on ``backend``; the potentials at the positions given.
    """
    xp = backend.xp
    x, v, m, phi = (xp.asarray(a).astype(np.float64) for a in (positions, velocities, masses, potentials))
    momentum = (v * m).sum(axis=1)
    angular = (xp.cross(x.T, v.T) * m[:, None]).sum(axis=0)
    first_moment = (x * m).sum(axis=1)
    second_moment = float((m * (x * x).sum(axis=0)).sum())
    radius = xp.sqrt((x * x).sum(axis=0))
    histogram, _ = np.histogram(backend.to_host(radius), bins=RADIUS_BINS, weights=backend.to_host(m))
    out = {"mass": float(m.sum()), "kinetic": 0.5 * float((m * (v * v).sum(axis=0)).sum()),
           "potential2": float((m * phi).sum()), "second_moment": second_moment,
           "histogram": histogram}
    for k, axis in enumerate("xyz"):
        out[f"momentum_{axis}"] = float(momentum[k])
        out[f"angular_momentum_{axis}"] = float(angular[k])
        out[f"first_moment_{axis}"] = float(first_moment[k])
    return out


def combine_sums(parts):
    """The diagnostics (dict of floats) from the :func:`block_sums` of every block."""
    total = {key: sum(p[key] for p in parts) for key in parts[0]}
    kinetic, potential = total["kinetic"], 0.5 * total["potential2"]
    out = {"energy": kinetic + potential, "kinetic_energy": kinetic, "potential_energy": potential,
           "virial_ratio": 2 * kinetic / abs(potential) if potential else math.nan}
    for axis in "xyz":
        out[f"momentum_{axis}"] = total[f"momentum_{axis}"]
        out[f"angular_momentum_{axis}"] = total[f"angular_momentum_{axis}"]
        out[f"centre_of_mass_{axis}"] = total[f"first_moment_{axis}"] / total["mass"]
    cumulative = np.cumsum(total["histogram"]) / max(total["histogram"].sum(), 1e-300)
    for fraction in LAGRANGIAN_FRACTIONS:
        index = int(np.searchsorted(cumulative, fraction))
        low = cumulative[index - 1] if index > 0 else 0.0
        weight = (fraction - low) / max(cumulative[index] - low, 1e-300)
        # geometric interpolation inside the logarithmic bin
        radius = RADIUS_BINS[index] * (RADIUS_BINS[index + 1] / RADIUS_BINS[index]) ** weight
        out[f"lagrangian_radius_{round(fraction * 100)}"] = float(radius)
    return out
