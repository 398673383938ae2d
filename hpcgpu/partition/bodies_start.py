"""An all-pairs rank's initial bodies, built on its own worker by body id: no state on the client.

A model whose initial bodies are a pure function of ``(seed, body id)``
(:meth:`~hpcgpu.workloads.astro.NBody.initial_block`: counter-based random
streams, :mod:`hpcgpu.random_streams`) lets every rank of an
:class:`~hpcgpu.partition.all_pairs.AllPairsDecomposition` build its own
block of bodies. Bodies come in *groups*, contiguous ranges of ids (one
Plummer sphere, or each galaxy of a collision), each placed about its
centre of mass and at rest there, then moved by the group's offsets:
``x <- (x - centre) + offset`` (:func:`shifted`, elementwise).

The centres are mass-weighted means from exact sums
(:func:`group_moments`, :class:`~hpcgpu.exact_sums.ExactPartial`), so any
split of the bodies gives the same floats (:func:`group_means`):

- positions: every rank needs every position for its bodies' first forces
  (as every step's allgather gives it), so each rank computes all
  positions from their ids and centres them itself: the same floats as
  one process, without a message;
- velocities: a rank draws those of its own bodies only and reports their
  sums (``initial_report``); the client adds the ranks' sums and the
  decomposition carries the normalisation, which every rank applies to
  its own bodies (``model_state``).

Examples
--------
>>> import numpy as np
>>> values, masses = np.array([[1.0, 3.0, 10.0, 20.0]] * 3), np.ones(4)
>>> groups = ((0, 2), (2, 4))
>>> parts = [group_moments(values[:, :1], masses[:1], 0, groups), group_moments(values[:, 1:], masses[1:], 1, groups)]
>>> group_means(parts)
((2.0, 2.0, 2.0), (15.0, 15.0, 15.0))
>>> shifted(values, 0, normalisation(groups, group_means(parts), None))[0].tolist()
[-1.0, 1.0, -5.0, 5.0]
"""

import numpy as np

from hpcgpu.exact_sums import exact_partial

__all__ = ["group_means", "group_moments", "normalisation", "shifted"]


def _overlap(first, size, lo, hi):
    """The slice of a block of ids ``first .. first + size`` that falls in ``lo .. hi`` (maybe empty)."""
    a, b = max(lo, first), min(hi, first + size)
    return slice(a - first, max(a, b) - first)


def group_moments(values, masses, first, groups):
    """Exact sums of each group's masses and mass moments over a block of bodies ``first ..``.

    ``values`` ``(3, M)`` and ``masses`` ``(M,)`` are float64 host arrays of
    bodies ``first .. first + M``; ``groups`` holds ``(lo, hi)`` id ranges.
    Returns per group ``{"mass": partial, "moment": [3 partials]}``: small,
    and the pieces of any split add up exactly.
    """
    out = []
    for lo, hi in groups:
        part = _overlap(first, masses.shape[0], lo, hi)
        m = masses[part]
        out.append({"mass": exact_partial(m), "moment": [exact_partial(m * values[axis, part]) for axis in range(3)]})
    return out


def group_means(parts):
    """Each group's mass-weighted mean ``(3 floats)`` from every block's :func:`group_moments` (any split)."""
    means = []
    for g in range(len(parts[0])):
        mass = float(sum((p[g]["mass"] for p in parts[1:]), parts[0][g]["mass"]))
        moments = [float(sum((p[g]["moment"][a] for p in parts[1:]), parts[0][g]["moment"][a])) for a in range(3)]
        means.append(tuple(m / mass if mass > 0 else 0.0 for m in moments))
    return tuple(means)


def normalisation(groups, means, offsets):
    """What :func:`shifted` applies: ``((lo, hi, mean, offset), ...)``, one per group (plain floats, small).

    ``offsets`` holds a 3-vector per group (None: zeros).
    """
    offsets = [(0.0, 0.0, 0.0)] * len(groups) if offsets is None else offsets
    return tuple((int(lo), int(hi), tuple(float(c) for c in mean), tuple(float(o) for o in offset))
                 for (lo, hi), mean, offset in zip(groups, means, offsets))


def shifted(values, first, shifts):
    """``values`` ``(3, M)`` of bodies ``first ..`` with each group's ``(v - mean) + offset`` (float64, new array).

    Elementwise, so a body gets the same floats in any block that holds it.
    """
    out = np.array(values, dtype=np.float64)
    for lo, hi, mean, offset in shifts:
        part = _overlap(first, out.shape[1], lo, hi)
        out[:, part] = (out[:, part] - np.asarray(mean)[:, None]) + np.asarray(offset)[:, None]
    return out
