"""The shallow-water diagnostics of a host block in one fused Numba pass, bitwise those of the array path.

:func:`hpcgpu.workloads.weather.diagnostics.block_sums` with array
operations widens the block's three fields to float64 with a frame of one
row and column (copies), builds every diagnostic's cell terms as
temporaries, then bins each in a pass of its own
(:func:`hpcgpu.exact_sums.exact_partial`). :func:`fused_block_sums` walks
the block once, row by row: it gathers the two framed rows it needs
(float64, a few kilobytes that stay in cache), computes every term with
the same float64 operations in the same order, and adds the terms' bits
straight into integer exponent bins
(:func:`hpcgpu.exact_bins_numba.add_to_int_bins`). The terms are the same
floats, and exact sums do not depend on the order in which they are
added, so the partials are equal to the array path's (the tests check it
on every kind of side); the kernel releases the GIL, so a worker's other
threads run meanwhile.

What lies beyond a block's owned cells is described to the kernel by
index maps (:func:`frame_maps`): the source row of every framed row, the
source column of the west frame column, and which of those are zero (the
normal velocity at a wall).

Examples
--------
>>> from hpcgpu.workloads.weather import ShallowWater
>>> from hpcgpu.partition.block_region import whole_grid
>>> from hpcgpu.workloads.weather.diagnostics import reference_block_sums
>>> model = ShallowWater("unstable_jet", nx=32, ny=16, backend="numba")
>>> state, where = model.initial_state(), whole_grid(model.shape, model.periodic)
>>> fused_block_sums(model, state, where) == reference_block_sums(model, state, where)
True
"""

import numpy as np
from numba import njit

from hpcgpu.exact_bins_numba import COPIES, add_to_int_bins
from hpcgpu.exact_sums import exact_partial, exact_partial_from_bins

__all__ = ["fused_block_sums", "frame_maps", "QUANTITIES", "MAX_BLOCK_CELLS"]

QUANTITIES = ("depth", "deviation", "deviation2", "kinetic2", "enstrophy")
"""The sums the kernel bins, in the order of its bins' first axis."""
MAX_BLOCK_CELLS = 1 << 35
"""Cells (and corners) a block may have: every int64 bin copy stays exact below ``2**36`` terms."""


def frame_maps(where):
    """Index maps of the framed block that the diagnostics read, as :func:`fused_block_sums` passes them.

    Parameters
    ----------
    where : hpcgpu.partition.block_region.BlockRegion
        The block's owned cells and what lies beyond each side.

    Returns
    -------
    source_rows : numpy.ndarray of int64
        For each framed row ``R`` (0: the row south of the owned cells; then
        the owned rows; then, at a north wall, the row beyond it), the
        array's row that holds it.
    zero_v_rows : numpy.ndarray of bool
        Where the framed row is a wall's, whose normal velocity ``v`` is 0.
    west_column : int
        The array's column that holds the frame column west of the owned
        cells (a neighbour's, the block's last on a periodic axis, or the
        first mirrored at a wall).
    zero_u_west : bool
        Whether that column is a wall's, whose ``u`` is 0.

    Examples
    --------
    >>> from hpcgpu.partition.block_region import whole_grid
    >>> rows, zero, west, zero_u = frame_maps(whole_grid((3, 4), (True, False)))
    >>> rows.tolist(), zero.tolist(), west, zero_u
    ([0, 0, 1, 2, 2], [True, False, False, False, True], 3, False)
    """
    west, _, south, north = where.sides
    r, c = where.rows, where.cols
    south_row = {"halo": r.start - 1, "wrap": r.stop - 1, "wall": r.start}[south]
    rows = [south_row, *range(r.start, r.stop)] + ([r.stop - 1] if north == "wall" else [])
    zero = [south == "wall"] + [False] * (r.stop - r.start) + ([True] if north == "wall" else [])
    west_column = {"halo": c.start - 1, "wrap": c.stop - 1, "wall": c.start}[west]
    return np.array(rows, np.int64), np.array(zero, np.bool_), int(west_column), west == "wall"


def fused_block_sums(model, state, where):
    """Exact partial sums over a host block's owned cells, in one Numba pass: equal to the array path's.

    Parameters
    ----------
    model : hpcgpu.workloads.weather.ShallowWater
        The model (its grid, parameters and ``coriolis_rows``).
    state : ShallowWaterState
        The block's fields, NumPy arrays (float32 or float64).
    where : hpcgpu.partition.block_region.BlockRegion
        The block's owned cells and what lies beyond each side.

    Returns
    -------
    dict
        As :func:`hpcgpu.workloads.weather.diagnostics.block_sums`.

    Examples
    --------
    >>> from hpcgpu.workloads.weather import ShallowWater
    >>> from hpcgpu.partition.block_region import whole_grid
    >>> model = ShallowWater("unstable_jet", nx=32, ny=16, backend="numba")
    >>> sums = fused_block_sums(model, model.initial_state(), whole_grid(model.shape, model.periodic))
    >>> sums["cells"], sums["depth"].count
    (512, 512)
    """
    source_rows, zero_v_rows, west_column, zero_u_west = frame_maps(where)
    rows = where.rows.stop - where.rows.start
    cols = where.cols.stop - where.cols.start
    corners = len(source_rows) - 1  # a north wall adds its row of corners
    start = where.owned_rows.start
    coriolis = np.ascontiguousarray(model.coriolis_rows(start, start + corners - 1), dtype=np.float64)
    highs = np.zeros((len(QUANTITIES), 2048, COPIES), np.int64)
    lows = np.zeros_like(highs)
    specials = np.zeros((len(QUANTITIES), 3), np.int64)
    if rows and cols:
        u, v, h = (np.asarray(a) for a in state.arrays()[:3])
        g = model.grid
        _block_bins(u, v, h, source_rows, zero_v_rows, west_column, zero_u_west, where.cols.start, cols, rows,
                    coriolis, float(model.params.mean_depth), float(g.dx), float(g.dy),
                    where.sides[2] == "wall", where.sides[3] == "wall", highs, lows, specials)
    counts = {"enstrophy": corners * cols}
    sums = {"cells": int(rows * cols)}
    for q, name in enumerate(QUANTITIES):
        sums[name] = exact_partial_from_bins(highs[q], lows[q], specials[q], counts.get(name, rows * cols))
    budget = getattr(state, "viscous_energy", None)
    if budget is not None:  # accumulated cell by cell: its owned cells are any split's
        sums["viscous_energy"] = exact_partial(where.interior(budget))
    return sums


@njit(cache=True, nogil=True)
def _gather_row(array, row, first_col, cols, west_column, zero_west, zero_row, out):
    """Framed row ``row`` of ``array`` as float64: ``out[0]`` the west frame column, ``out[1:]`` the owned ones."""
    if zero_row:
        out[:] = 0.0
        return
    out[0] = 0.0 if zero_west else np.float64(array[row, west_column])
    for j in range(cols):
        out[j + 1] = np.float64(array[row, first_col + j])


@njit(cache=True, nogil=True, error_model="numpy")  # IEEE division: x / 0 is inf or NaN, as in NumPy
def _block_bins(u, v, h, source_rows, zero_v_rows, west_column, zero_u_west, first_col, cols, rows,
                coriolis, mean_depth, dx, dy, south_wall, north_wall, highs, lows, specials):
    """Bin every diagnostic's terms of the block, framed row by framed row (see the module's docstring).

    The float64 operations are the array path's, in its order (``x**2``
    is ``x * x`` there too), so every term is the same float.
    """
    corners = source_rows.shape[0] - 1
    # framed rows R - 1 and R of each field (index 0 of a row: the west frame column)
    U = np.empty((2, cols + 1))
    V = np.empty((2, cols + 1))
    H = np.empty((2, cols + 1))
    terms = np.empty((5, cols))
    bits = terms.view(np.int64)
    _gather_row(u, source_rows[0], first_col, cols, west_column, zero_u_west, False, U[0])
    _gather_row(v, source_rows[0], first_col, cols, west_column, False, zero_v_rows[0], V[0])
    _gather_row(h, source_rows[0], first_col, cols, west_column, False, False, H[0])
    for R in range(1, corners + 1):
        now, before = R % 2, (R - 1) % 2
        _gather_row(u, source_rows[R], first_col, cols, west_column, zero_u_west, False, U[now])
        _gather_row(v, source_rows[R], first_col, cols, west_column, False, zero_v_rows[R], V[now])
        _gather_row(h, source_rows[R], first_col, cols, west_column, False, False, H[now])
        Un, Ub, Vn, Hn, Hb = U[now], U[before], V[now], H[now], H[before]
        if R <= rows:  # the cells of owned row R - 1
            for j in range(cols):
                depth = Hn[j + 1]
                h_u = 0.5 * (Hn[j] + depth)
                h_v = 0.5 * (Hb[j + 1] + depth)
                deviation = depth - mean_depth
                terms[0, j] = depth
                terms[1, j] = deviation
                terms[2, j] = deviation * deviation
                terms[3, j] = h_u * Un[j + 1] * Un[j + 1] + h_v * Vn[j + 1] * Vn[j + 1]
            for q in range(4):
                add_to_int_bins(bits[q], highs[q], lows[q], specials[q])
        # the corners of row R - 1: the south-west corners of its cells
        f = coriolis[R - 1]
        for j in range(cols):
            zeta = (Vn[j + 1] - Vn[j]) / dx - (Un[j + 1] - Ub[j + 1]) / dy
            h_q = 0.25 * (Hb[j] + Hb[j + 1] + Hn[j] + Hn[j + 1])
            absolute = f + zeta
            terms[4, j] = 0.5 * (absolute * absolute) / h_q
        # corners on a wall count half (trapezoidal rule along y); halved twice where one row is both walls'
        halvings = (1 if south_wall and R == 1 else 0) + (1 if north_wall and R == corners else 0)
        for _ in range(halvings):
            for j in range(cols):
                terms[4, j] *= 0.5
        add_to_int_bins(bits[4], highs[4], lows[4], specials[4])
