"""Bricks of a periodic box: a px x py x pz process grid over ``(Lx, Ly, Lz)``, ranks numbered x fastest.

:class:`Bricks` is the geometry the distributed particle set of
:mod:`hpcgpu.partition.bricks` works on: which brick a coordinate falls
in, which ranks border a rank along an axis, whether a coordinate lies
within a radius of a brick (periodically), and which atoms lie deep
inside one. Brick ``(i, j, k)`` is rank ``i + px * (j + py * k)``; along
each axis the edges may be uneven (speed-weighted), cut once per axis so
that bricks of one layer line up (the *product form* of
:meth:`Bricks.weighted`).

Examples
--------
>>> import numpy as np
>>> bricks = Bricks.weighted((2, 1, 2), (10.0, 10.0, 10.0))
>>> bricks.grid, bricks.count, bricks.coords(3), bricks.rank((1, 0, 1))
((2, 1, 2), 4, (1, 0, 1), 3)
>>> bricks.index(np, np.array([0.0, 4.9, 5.0, 9.9]), 0).tolist()
[0, 0, 1, 1]
>>> bricks.neighbours(0, 0), bricks.neighbours(0, 1), bricks.split_axes
((1,), (), (0, 2))
"""

import math
from dataclasses import dataclass

import numpy as np

from hpcgpu.errors import ConfigError

__all__ = ["Bricks"]


@dataclass(frozen=True)
class Bricks:
    """A periodic box cut into bricks along each axis.

    Attributes
    ----------
    edges : tuple of 3 tuples of float
        ``edges[a]`` runs from 0 to ``box[a]`` in ``grid[a] + 1`` steps;
        layer ``i`` along axis ``a`` is ``[edges[a][i], edges[a][i + 1])``.
    box : tuple of 3 float
        The sides ``(Lx, Ly, Lz)`` (sigma).
    """

    edges: tuple
    box: tuple

    @classmethod
    def weighted(cls, grid, box, weights=None):
        """Bricks of ``grid`` over ``box``; layer thicknesses along each axis in proportion to the weights.

        ``weights`` (one per rank, x fastest; default equal) are summed over
        each layer of an axis: a layer as a whole is as large as its ranks'
        weights say. That is exact for a 1-D grid (slabs) and the product
        form of a weighting for a 3-D one: bricks of one layer line up, so
        each rank keeps two neighbours per axis.

        Examples
        --------
        >>> Bricks.weighted((1, 1, 2), (4.0, 4.0, 9.0), [1.0, 2.0]).edges[2]
        (0.0, 3.0, 9.0)
        """
        grid = tuple(int(g) for g in grid)
        count = math.prod(grid)
        weights = np.ones(count) if weights is None else np.asarray(weights, dtype=np.float64)
        # finite weights whose sum overflows stay usable
        weights = (weights / weights.max()).reshape(grid[2], grid[1], grid[0])  # [k, j, i]
        edges = []
        for axis, length in enumerate(box):
            others = tuple(a for a in range(3) if a != 2 - axis)
            layers = weights.sum(axis=others)
            cut = np.concatenate([[0.0], np.cumsum(layers) / layers.sum() * float(length)])
            cut[-1] = float(length)
            edges.append(tuple(float(e) for e in cut))
        return cls(tuple(edges), tuple(float(b) for b in box))

    @property
    def grid(self):
        """Ranks along ``(x, y, z)``."""
        return tuple(len(e) - 1 for e in self.edges)

    @property
    def count(self):
        """Ranks (bricks) in all."""
        return math.prod(self.grid)

    @property
    def split_axes(self):
        """The axes cut into two or more layers, in the order the staged exchanges go (x, y, z)."""
        return tuple(a for a, parts in enumerate(self.grid) if parts > 1)

    def thickness(self, axis):
        """The thinnest layer along ``axis`` (sigma)."""
        return float(np.diff(self.edges[axis]).min())

    def coords(self, rank):
        """``(i, j, k)`` of ``rank`` (x fastest)."""
        px, py, _ = self.grid
        return rank % px, (rank // px) % py, rank // (px * py)

    def rank(self, coords):
        """The rank of brick ``(i, j, k)`` (each index taken modulo its axis)."""
        px, py, pz = self.grid
        i, j, k = coords
        return i % px + px * (j % py + py * (k % pz))

    def index(self, xp, coordinate, axis):
        """The layer along ``axis`` of each coordinate (coordinates wrapped into ``[0, L)``)."""
        inner = xp.asarray(np.asarray(self.edges[axis][1:-1], dtype=np.float64))
        return xp.searchsorted(inner, coordinate.astype(np.float64), side="right")

    def neighbours(self, rank, axis):
        """The ranks beside ``rank`` along ``axis``, each once: lower then upper; one with 2 layers, none with 1."""
        parts = self.grid[axis]
        if parts == 1:
            return ()
        here = list(self.coords(rank))
        found = []
        for step in (-1, 1):
            there = list(here)
            there[axis] = here[axis] + step
            other = self.rank(there)
            if other not in found:
                found.append(other)
        return tuple(found)

    def near(self, xp, coordinate, axis, layer, radius):
        """Whether each coordinate lies in ``layer`` along ``axis`` or within ``radius`` of it (periodic)."""
        lo, hi = self.edges[axis][layer], self.edges[axis][layer + 1]
        length = self.box[axis]
        coordinate = coordinate.astype(np.float64)
        below = xp.remainder(lo - coordinate, length) < radius
        above = xp.remainder(coordinate - hi, length) < radius
        return below | above | ((coordinate >= lo) & (coordinate < hi))

    def inside(self, xp, positions, rank, radius):
        """Whether each atom lies farther than ``radius`` from every face of ``rank``'s brick that borders another.

        Such an atom has no ghost within ``radius``: the way to any other
        brick crosses a face (an axis of one layer has none: its atoms'
        periodic images are the rank's own). The margin covers the rounding
        of the neighbour build's distances.
        """
        inner = xp.ones(positions.shape[1], dtype=bool)
        for axis in self.split_axes:
            layer = self.coords(rank)[axis]
            lo, hi = self.edges[axis][layer], self.edges[axis][layer + 1]
            reach = radius * (1.0 + 1e-9) + 1e-12 * self.box[axis]
            x = positions[axis].astype(np.float64)
            inner &= (x - lo >= reach) & (hi - x >= reach)
        return inner

    def check_thickness(self, needed, what):
        """Raise ConfigError naming the grid, the box and the thickness when a split axis is thinner than ``needed``."""
        for axis in self.split_axes:
            thinnest = self.thickness(axis)
            if thinnest < needed:
                most = "x".join(str(max(1, int(side // needed))) for side in self.box)
                raise ConfigError(
                    f"grid={'x'.join(map(str, self.grid))} cuts the box {_sides(self.box)} into bricks as thin as "
                    f"{thinnest:.4g} along {'xyz'[axis]}; each must be at least {what} = {needed:.4g} thick so "
                    f"that ghosts and migrating atoms come from the adjacent bricks only: at most {most} bricks "
                    f"fit, or use a bigger system")

    def describe(self):
        """The grid and the edges, for a run's summary (JSON-ready)."""
        return {"process_grid": "x".join(map(str, self.grid)), "brick_edges": [list(e) for e in self.edges]}


def _sides(box):
    return "(" + ", ".join(f"{b:.4g}" for b in box) + ")"
