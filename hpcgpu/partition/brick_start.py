"""A brick rank's initial atoms, built on its own worker from the model's lattice: no state on the client.

A model whose initial atoms are a pure function of their ids (the
Lennard-Jones fcc lattice: :meth:`~hpcgpu.workloads.md.LennardJones.initial_block`
gives the ids and positions of the sites in given unit cells) lets every
rank of a :class:`~hpcgpu.partition.bricks.BrickDecomposition` build its
own block (:func:`rank_start`): the sites in the ghost halo of its brick
are listed from the unit cells that can hold them, the rank keeps those in
its brick (the brick of their position, as the client's split decides) and
plays the staged ghost exchange of :meth:`BrickDecomposition.split
<hpcgpu.partition.bricks.BrickDecomposition.split>` on the sites of its
halo alone. Every atom a rank ever holds lies in its halo, and the
exchange's cuts keep each neighbour's order, so the send lists and the
ghosts come out as the client's split of the whole state would make them:
the run rebuilds its lists at the steps one process would.

The velocities are the model's raw deviates of ``(seed, atom id)``; the
rank reports their exact sums (:func:`start_report`), the client adds the
ranks' sums and the decomposition carries the normalisation (zero total
momentum, the exact temperature) that every rank applies to its own atoms
(:func:`normalised`): the same floats as the one-process run's.

Examples
--------
>>> from hpcgpu.partition.brick_geometry import Bricks
>>> bricks = Bricks.weighted((2, 1, 1), (10.0, 10.0, 10.0))
>>> candidate_cells(bricks, 0, 0, 1.0, 10).tolist()
[0, 1, 2, 3, 4, 5, 6, 7, 8, 9]
>>> candidate_cells(Bricks.weighted((4, 1, 1), (40.0, 10.0, 10.0)), 0, 0, 1.0, 40).tolist()
[0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 38, 39]
"""

import math
from dataclasses import dataclass, replace

import numpy as np

from hpcgpu.partition.brick_geometry import Bricks
from hpcgpu.particle_checkpoints import periodic_overlap

__all__ = ["BrickHalo", "candidate_cells", "halo_plan", "normalised", "pieces_start", "rank_start", "start_report"]


def candidate_cells(bricks, rank, axis, radius, cells):
    """The unit cells along ``axis`` (of ``cells``) that may hold a site within ``radius`` of ``rank``'s layer.

    Generous by a cell on each side (sites sit a quarter cell from the
    cell's faces); the exact test on the sites' positions follows.
    """
    if axis not in bricks.split_axes:
        return np.arange(cells)
    layer = bricks.coords(rank)[axis]
    lo, hi = bricks.edges[axis][layer], bricks.edges[axis][layer + 1]
    side = bricks.box[axis] / cells
    first, last = math.floor((lo - radius) / side) - 1, math.ceil((hi + radius) / side) + 1
    if last - first >= cells:
        return np.arange(cells)
    return np.unique(np.arange(first, last + 1) % cells)


def rank_start(bricks, model, rank, keep_lists):
    """Rank ``rank``'s initial atoms: ``(state, sends, listed)`` as the client's split would give them.

    ``state`` holds the atoms of the brick (host arrays, raw velocities, the
    forces from the atoms and their ghosts); with ``keep_lists`` the send
    lists of each stage and ``listed`` (the atoms' then the ghosts'
    positions, which the rank's first list is built on), else None for
    both (every rank builds its lists on its first step).
    """
    radius = model.ghost_radius()
    coords = bricks.coords(rank)
    ids, where = model.initial_block([candidate_cells(bricks, rank, axis, radius, model.cells[axis])
                                      for axis in range(3)])
    # the positions the one-process run holds (its dtype), so that every rank places the sites as it does
    where = np.asarray(where, dtype=model.dtype)
    halo = np.ones(ids.shape[0], dtype=bool)
    for axis in bricks.split_axes:
        halo &= bricks.near(np, where[axis], axis, coords[axis], radius)
    ids, where = ids[halo], np.ascontiguousarray(where[:, halo])
    own, sends, listed = halo_plan(bricks, rank, where, radius, keep_lists)
    state = model.lattice_atoms(ids[own], listed)
    if not keep_lists:
        return state, None, None
    return state, sends, listed


def halo_plan(bricks, rank, where, radius, keep_lists):
    """``(own, sends, listed)`` of ``rank`` from ``where`` ``(3, M)``: the positions of every site of its halo.

    ``own`` indexes the sites in its brick (in their order), ``listed`` is
    the positions it holds once the staged exchange is done (its own, then
    the ghosts of each stage), ``sends`` the send lists of each stage
    (None without ``keep_lists``), as :meth:`BrickDecomposition.split
    <hpcgpu.partition.bricks.BrickDecomposition.split>` would make them.
    """
    layer = [bricks.index(np, where[axis], axis) for axis in range(3)]
    rank_of = layer[0] + bricks.grid[0] * (layer[1] + bricks.grid[1] * layer[2])
    held = _held_lists(bricks, where, rank_of, radius)
    stages = bricks.split_axes
    listed = np.take(where, held(rank, len(stages)), axis=1)
    if not keep_lists:
        return held(rank, 0), None, listed
    sends = tuple((axis, tuple((q, np.nonzero(bricks.near(np, where[axis, held(rank, number)], axis,
                                                          bricks.coords(q)[axis], radius))[0])
                               for q in bricks.neighbours(rank, axis)))
                  for number, axis in enumerate(stages))
    return held(rank, 0), sends, listed


@dataclass(frozen=True)
class BrickHalo:
    """A selection of a checkpoint's particles (:class:`~hpcgpu.particle_checkpoints.ParticlePieces`):
    the atoms a brick rank needs to start from it.

    With ``listed`` the atoms within ``radius`` of the brick by where their
    lists were built (the rank's atoms and every ghost it will hold); else
    the atoms whose position is in the brick.
    """

    bricks: Bricks
    rank: int
    radius: float
    listed: bool

    def wants(self, entry):
        """Whether a piece (its manifest entry) may hold such atoms (by its bounding box)."""
        bounds = entry.get("listed_bounds" if self.listed else "bounds")
        if bounds is None:
            return entry.get("particles", 1) > 0
        coords, bricks = self.bricks.coords(self.rank), self.bricks
        return all(periodic_overlap(*bounds[axis], bricks.edges[axis][coords[axis]],
                                    bricks.edges[axis][coords[axis] + 1], self.radius, bricks.box[axis])
                   for axis in bricks.split_axes)

    def keep(self, state, extra):
        """The indices of those atoms, in the pieces' order."""
        bricks, coords = self.bricks, self.bricks.coords(self.rank)
        if self.listed:
            where = extra["listed"]
            halo = np.ones(where.shape[1], dtype=bool)
            for axis in bricks.split_axes:
                halo &= bricks.near(np, where[axis], axis, coords[axis], self.radius)
            return np.nonzero(halo)[0]
        layer = [bricks.index(np, state.positions[axis], axis) for axis in range(3)]
        return np.nonzero(layer[0] + bricks.grid[0] * (layer[1] + bricks.grid[1] * layer[2]) == self.rank)[0]


def pieces_start(bricks, model, rank, source, keep_lists):
    """Rank ``rank``'s atoms from a checkpoint's pieces: ``(state, sends, listed)`` (host arrays).

    When every piece says where its atoms' lists were built (``listed``)
    and ``keep_lists``, the rank takes the atoms whose listed position is
    in its brick and plays the staged exchange on the listed positions of
    its halo (:func:`halo_plan`): its first list is the one those atoms had,
    so the run rebuilds at the steps the uninterrupted one would (on the
    same bricks, the same atoms in the same order: bitwise). Else it takes
    the atoms in its brick and builds its lists on its first step.
    """
    from hpcgpu.particle_checkpoints import take_particles

    radius = model.ghost_radius()
    if not (keep_lists and source.has_extra("listed")):
        state, _ = source.owned_block(model, BrickHalo(bricks, rank, radius, False))
        return state, None, None
    halo, extra = source.owned_block(model, BrickHalo(bricks, rank, radius, True))
    where = np.ascontiguousarray(extra["listed"])
    own, sends, listed = halo_plan(bricks, rank, where, radius, True)
    return take_particles(halo, own), sends, listed


def _held_lists(bricks, where, rank_of, radius):
    """``held(r, stage)``: the sites (indices into ``where``) rank r holds before ``stage``, in the exchange's order.

    Only the sites of one rank's halo are known; every site that reaches
    that rank lies in it, and each cut keeps its sender's order, so the
    lists restricted to the halo are exact for that rank.
    """
    stages = bricks.split_axes
    known = {}

    def held(r, stage):
        if (r, stage) not in known:
            if stage == 0:
                known[r, stage] = np.nonzero(rank_of == r)[0]
            else:
                axis = stages[stage - 1]
                parts = []
                for q in bricks.neighbours(r, axis):
                    theirs = held(q, stage - 1)
                    parts.append(theirs[bricks.near(np, where[axis, theirs], axis, bricks.coords(r)[axis], radius)])
                known[r, stage] = np.concatenate([held(r, stage - 1), *parts])
        return known[r, stage]

    return held


def start_report(model, state):
    """What a rank reports of its initial atoms beyond their health: the exact sums of its raw velocities."""
    return {"velocity_sums": model.start_velocity_sums(state)}


def normalised(state, normalisation):
    """``state`` with its raw velocities made the run's: ``(v - mean) * scale``, on the host block as built.

    The expression of :func:`hpcgpu.workloads.md.setup.normalised_velocities`
    (elementwise, so each atom's velocity is bitwise the one-process run's).
    """
    mean, scale = normalisation
    velocities = (state.velocities - np.asarray(mean, dtype=np.float64)[:, None]) * scale
    return replace(state, velocities=velocities.astype(state.positions.dtype))
