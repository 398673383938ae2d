"""Where a block of a distributed grid lies: its global cells, its halo frame and what is beyond each side.

A rank of a distributed structured grid (:mod:`hpcgpu.partition.grid`)
holds its cells inside arrays with a *frame*: ``halo`` extra cells on each
side that has a neighbour, filled by the halo exchange before every
superstep. A :class:`BlockRegion` tells a model's ``step_block`` and
``block_sums`` everything it needs to know about such an array: the
global index of its first row and column, which of its cells the rank
owns, and for each side whether the frame holds a neighbour's cells
(``"halo"``), the domain ends there (``"wall"``), or the axis is periodic
and whole in this block, so the block wraps onto itself (``"wrap"``).

Examples
--------
>>> import numpy as np
>>> where = BlockRegion(first_row=-2, first_col=0, rows=slice(2, 6), cols=slice(0, 8),
...                     sides=("wrap", "wrap", "halo", "halo"), shape=(16, 8))
>>> where.owned_rows, where.owned_cols
(range(0, 4), range(0, 8))
>>> where.interior(np.zeros((9, 8))).shape
(4, 8)
"""

from dataclasses import dataclass

__all__ = ["BlockRegion", "SIDES", "whole_grid"]

SIDES = ("west", "east", "south", "north")
"""The order of ``BlockRegion.sides`` and of a 4-tuple reach or halo."""


@dataclass(frozen=True)
class BlockRegion:
    """A block's place in the global grid.

    Attributes
    ----------
    first_row, first_col : int
        Global row and column of the array's element ``[0, 0]`` (a frame
        cell: may be below 0 or at and past the grid's end on a periodic
        axis; wrap it with ``% ny``).
    rows, cols : slice
        The owned cells within the array (``array[rows, cols]``).
    sides : tuple of str
        ``(west, east, south, north)``, each ``"halo"`` (the frame holds the
        neighbour's cells), ``"wall"`` (the domain's edge: no frame) or
        ``"wrap"`` (a periodic axis held whole by this block: no frame; a
        step wraps, as ``numpy.roll`` does).
    shape : tuple of int
        The global grid ``(ny, nx)``.
    """

    first_row: int
    first_col: int
    rows: slice
    cols: slice
    sides: tuple
    shape: tuple

    @property
    def owned_rows(self):
        """Global rows this block owns."""
        return range(self.first_row + self.rows.start, self.first_row + self.rows.stop)

    @property
    def owned_cols(self):
        """Global columns this block owns."""
        return range(self.first_col + self.cols.start, self.first_col + self.cols.stop)

    def interior(self, array):
        """The owned cells of ``array`` (a view)."""
        return array[self.rows, self.cols]

    def side(self, name):
        """What lies beyond side ``name`` (``"west"``, ``"east"``, ``"south"``, ``"north"``)."""
        return self.sides[SIDES.index(name)]

    def opens(self):
        """``(west, east, south, north)`` booleans: True where the frame holds a neighbour's cells."""
        return tuple(side == "halo" for side in self.sides)


def whole_grid(shape, periodic):
    """The region of one block that holds the whole grid ``shape`` (``(ny, nx)``), periodic axes ``(x, y)`` wrapping.

    Examples
    --------
    >>> whole_grid((4, 6), (True, False)).sides
    ('wrap', 'wrap', 'wall', 'wall')
    """
    x = "wrap" if periodic[0] else "wall"
    y = "wrap" if periodic[1] else "wall"
    ny, nx = shape
    return BlockRegion(first_row=0, first_col=0, rows=slice(0, ny), cols=slice(0, nx), sides=(x, x, y, y),
                       shape=(ny, nx))
