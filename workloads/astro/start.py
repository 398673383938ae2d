"""The start of an N-body run from (seed, body id): the whole set in one process, or one rank's block.

One function over body ids builds both, so a partitioned run starts from
the one-process run's bodies bitwise (:mod:`hpcgpu.partition.bodies_start`
says how the ranks share the work):

- :func:`whole_bodies`: every body of the model's case, each group at its
  centre of mass and at rest, then moved by its offsets (float64 host
  arrays; :meth:`NBody.initial_state <hpcgpu.workloads.astro.NBody.initial_state>`);
- :func:`rank_block`: bodies ``start:stop`` as a rank builds them: the
  positions of all bodies (its forces need them), centred as above, its
  own velocities *raw* (float64, before the momentum is removed) and the
  forces on its bodies; :func:`velocity_sums` is what it reports and
  :func:`velocity_normalisation` what the client makes of every rank's
  report (applied with :func:`~hpcgpu.partition.bodies_start.shifted`).

Examples
--------
>>> import numpy as np
>>> from hpcgpu.workloads.astro import NBody
>>> model = NBody("galaxy_collision", n=40, backend="numpy", seed=2)
>>> positions, velocities, masses = whole_bodies(model)
>>> bool(np.allclose((positions * masses).sum(axis=1), 0, atol=1e-15))
True
"""

import numpy as np

from hpcgpu.partition.bodies_start import group_means, group_moments, normalisation, shifted
from hpcgpu.workloads.astro.state import NBodyState

__all__ = ["rank_block", "velocity_normalisation", "velocity_sums", "whole_bodies"]


def _sample(model, ids, velocities):
    spec = model.case_definition
    positions, moving = spec.sample(ids, model.n, model.seed, model.case_parameters, model.G, velocities)
    return positions, moving, spec.masses(ids, model.n, model.case_parameters)


def _offsets(model):
    """``(position offsets, velocity offsets)`` of each group, or ``(None, None)``."""
    offsets = model.case_definition.offsets
    return (None, None) if offsets is None else offsets(model.case_parameters, model.G)


def _groups(model):
    return model.case_definition.groups(model.n)


def _placed_positions(model, positions, masses):
    """All bodies' positions, each group at its centre of mass then moved by its offset (as one process)."""
    if not model.case_definition.centred:
        return positions
    groups = _groups(model)
    means = group_means([group_moments(positions, masses, 0, groups)])
    return shifted(positions, 0, normalisation(groups, means, _offsets(model)[0]))


def whole_bodies(model):
    """Every body of ``model``'s case: ``(positions, velocities, masses)`` float64 host arrays."""
    ids = np.arange(model.n, dtype=np.int64)
    positions, velocities, masses = _sample(model, ids, True)
    positions = _placed_positions(model, positions, masses)
    moving = shifted(velocities, 0, velocity_normalisation(model, [velocity_sums(model, velocities, 0)]))
    return positions, moving, masses


def velocity_sums(model, velocities, start):
    """Exact sums of the masses and momenta of bodies ``start ..`` with raw ``velocities`` ``(3, M)``, per group."""
    ids = np.arange(start, start + velocities.shape[1], dtype=np.int64)
    masses = model.case_definition.masses(ids, model.n, model.case_parameters)  # float64, as one process sums them
    return group_moments(np.asarray(velocities, dtype=np.float64), masses, start, _groups(model))


def velocity_normalisation(model, parts):
    """What makes raw velocities the run's, from every block's :func:`velocity_sums` (any split, same floats).

    Each group at rest then moved by its velocity offset; nothing for a
    case whose sample is at rest already (kepler).
    """
    if not model.case_definition.centred:
        return ()
    return normalisation(_groups(model), group_means(parts), _offsets(model)[1])


def rank_block(model, start, stop):
    """Bodies ``start:stop`` at the start, as a rank builds them: host arrays, raw float64 velocities.

    Every rank computes every body's position from its id (its first
    forces need them all, as each step's allgather gives them: O(N) work
    beside the O(N^2 / P) of those forces) and centres them as
    :func:`whole_bodies` does, then draws its own velocities and sums
    the forces on its own bodies from all of them, on the model's backend.
    """
    b = model.backend
    ids = np.arange(model.n, dtype=np.int64)
    positions, _, masses = _sample(model, ids, False)
    positions = _placed_positions(model, positions, masses)
    _, velocities, _ = _sample(model, ids[start:stop], True)
    sources, source_masses = b.asarray(positions, dtype=model.dtype), b.asarray(masses, dtype=model.dtype)
    accelerations, potentials = model.forces(sources, source_masses, start, stop)
    own = slice(start, stop)
    return NBodyState(np.ascontiguousarray(np.asarray(positions[:, own], dtype=model.dtype)), velocities,
                      np.asarray(masses[own], dtype=model.dtype), b.to_host(accelerations), b.to_host(potentials))
