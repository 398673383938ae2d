"""The cell grid of a neighbour-list build, shared by the backends that use cells.

The box is cut into ``nx * ny * nz`` cells, numbered with x fastest
(``c = cx + nx * (cy + ny * cz)``), so that the cells of one x row have
consecutive numbers and, once atoms are sorted by cell, consecutive atoms.
A cell is at least ``radius / reach`` wide along every side (a little more:
see :data:`MARGIN`), so every pair closer than ``radius`` lies within
``reach`` cells of each other along every axis, periodic images included.

Each atom scans, for every row within ``reach`` rows in y and z, the run of
cells within ``reach`` cells in x: one or two (where the run wraps around
the box) contiguous ranges of sorted atoms. Along an axis with fewer than
``2 * reach + 1`` cells the scan takes every cell of that axis once instead,
so no cell, and no atom, is ever visited twice (the distance is the minimum
image, so visiting a cell through two images would count its atoms twice).
"""

import math

__all__ = ["MARGIN", "grid", "cell_coordinate"]

MARGIN = 1e-4
"""Relative margin added to the smallest cell side: the cell of an atom is
computed in float64 from the position as given, the distances in the
positions' dtype (float32: 6e-8 of the box side), so an atom within rounding
of a cell face may sit on either side of it; slightly wider cells keep every
pair within ``radius`` inside the stencil anyway."""

MAX_CELLS_PER_ATOM = 2
"""At most this many cells per atom (at least 27 in all): a dilute system in
a big box gets fewer, bigger cells instead of a huge, mostly empty grid."""


def grid(box, radius, n_atoms, reach=1):
    """Cells per side ``(nx, ny, nz)`` for a build of ``radius`` in ``box``.

    Examples
    --------
    >>> grid((33.6, 33.6, 33.6), 2.8, 32000)
    (11, 11, 11)
    >>> grid((33.6, 33.6, 33.6), 2.8, 32000, reach=2)
    (23, 23, 23)
    >>> grid((5.0, 5.0, 50.0), 2.8, 100)
    (1, 1, 17)
    """
    side = radius * (1.0 + MARGIN) / reach
    counts = [max(1, int(math.floor(length / side))) for length in box]
    limit = max(27, MAX_CELLS_PER_ATOM * n_atoms)
    while counts[0] * counts[1] * counts[2] > limit:
        # Widen the cells of the finest axis first: cells stay near cubes.
        k = max(range(3), key=lambda a: counts[a] / box[a])
        counts[k] = max(1, counts[k] * 3 // 4)
    return tuple(counts)


def cell_coordinate(x, length, cells):
    """Cell index along one axis of a coordinate ``x`` (any image), in float64.

    ``x / length`` wrapped into [0, 1), times ``cells``, floored and clamped
    to ``cells - 1`` (wrapping a tiny negative value can round to exactly 1).
    The backends compute the same formula in their own code.

    Examples
    --------
    >>> cell_coordinate(-0.5, 10.0, 4), cell_coordinate(10.0, 10.0, 4), cell_coordinate(7.4, 10.0, 4)
    (3, 0, 2)
    """
    s = x / length
    s = s - math.floor(s)
    c = int(math.floor(s * cells))
    return min(c, cells - 1)


def sort_by_cell(xp, cell, n_cells):
    """``(order, start)`` of a stable sort of atoms by cell, on any array module.

    ``order`` (int32) lists the atoms cell by cell, in increasing index
    within a cell; cell ``c`` holds ``order[start[c]:start[c + 1]]``
    (``start``: int32, ``n_cells + 1`` entries). The GPU backends use this
    (a radix sort and a binary search in CuPy; NumPy under the simulator
    and in the emulator tests).

    Examples
    --------
    >>> import numpy as np
    >>> order, start = sort_by_cell(np, np.array([2, 0, 2, 1], np.int32), 4)
    >>> order.tolist(), start.tolist()
    ([1, 3, 0, 2], [0, 1, 2, 4, 4])
    """
    order = xp.argsort(cell, kind="stable").astype(xp.int32)
    start = xp.searchsorted(cell[order], xp.arange(n_cells + 1, dtype=cell.dtype))
    return order, start.astype(xp.int32)
