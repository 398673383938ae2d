"""Diagnostics of the shallow-water model as sums over grid blocks: mass, energy, potential enstrophy.

With the model's ``energy_budget``, also the energy the viscous terms have
removed (``energy_dissipated``): the sum of the state's per-cell budget,
which the stepper accumulates (:class:`~hpcgpu.workloads.weather.ShallowWaterBudgetState`).

Every quantity is a sum over a block's owned cells (:func:`block_sums`),
combined afterwards (:func:`combine_sums`), so a partitioned run reduces
where its partitions live and only a few numbers per quantity travel. A
block keeps its sums as exact partials (:func:`hpcgpu.exact_sums.exact_partial`),
which add up to the correctly rounded total of every cell whatever the
split: the diagnostics are bitwise the same on any process grid, as the
fields are, where one rounded total per block would differ with every split.
:meth:`hpcgpu.workloads.weather.ShallowWater.diagnostics` is the entry point;
these read the model's public attributes (grid, params, backend,
``coriolis_rows``).
"""

import numpy as np

from hpcgpu.exact_sums import exact_partial
from hpcgpu.workloads.sums import exact_total

__all__ = ["block_sums", "combine_sums", "reference_block_sums", "uses_fused_sums"]


def _extended(model, array, where, field):
    """The owned cells of ``array`` with one row south of them and one column west (float64), plus
    the north wall's row of corners: what the staggered sums read beyond a block.

    Beyond a side that holds a neighbour's cells the frame has them; a
    block that holds a periodic axis whole wraps; at a wall scalars and
    tangential velocity are mirrored and the normal velocity is 0 (the
    rules of the global grid, so any block sums what one block would).
    """
    xp = model.backend.xp
    west, _, south, north = where.sides
    r, c = where.rows, where.cols
    r0 = r.start - (1 if south == "halo" else 0)
    c0 = c.start - (1 if west == "halo" else 0)
    block = xp.asarray(array[r0:r.stop, c0:c.stop]).astype(np.float64)
    if south == "wrap":  # the global last row
        block = xp.concatenate([xp.asarray(array[r.stop - 1:r.stop, c0:c.stop]).astype(np.float64), block])
    elif south == "wall":
        block = xp.concatenate([xp.zeros_like(block[:1]) if field == "v" else block[:1], block])
    if north == "wall":
        block = xp.concatenate([block, xp.zeros_like(block[-1:]) if field == "v" else block[-1:]])
    if west == "wrap":
        block = xp.concatenate([block[:, -1:], block], axis=1)
    elif west == "wall":
        block = xp.concatenate([xp.zeros_like(block[:, :1]) if field == "u" else block[:, :1], block], axis=1)
    return block


def uses_fused_sums(model):
    """Whether :func:`block_sums` takes the fused Numba pass for ``model`` (its ``numba`` backend), else the arrays'.

    Examples
    --------
    >>> from hpcgpu.workloads.weather import ShallowWater
    >>> uses_fused_sums(ShallowWater("unstable_jet", nx=8, ny=8, backend="numpy"))
    False
    """
    return model.backend.name == "numba"


def block_sums(model, state, where):
    """Exact partial sums over a block's owned cells: see :meth:`ShallowWater.block_sums
    <hpcgpu.workloads.weather.ShallowWater.block_sums>`.

    The ``numba`` backend's host blocks take one fused pass
    (:func:`hpcgpu.workloads.weather.diagnostics_numba.fused_block_sums`),
    equal partial for partial to :func:`reference_block_sums`, which the
    other backends use.
    """
    if uses_fused_sums(model):
        from hpcgpu.workloads.weather.diagnostics_numba import MAX_BLOCK_CELLS, fused_block_sums

        if (where.rows.stop - where.rows.start + 1) * (where.cols.stop - where.cols.start) < MAX_BLOCK_CELLS:
            return fused_block_sums(model, state, where)
    return reference_block_sums(model, state, where)


def reference_block_sums(model, state, where):
    """:func:`block_sums` by array operations of the backend's module (NumPy or CuPy): the reference.

    Examples
    --------
    >>> from hpcgpu.workloads.weather import ShallowWater
    >>> from hpcgpu.partition.block_region import whole_grid
    >>> model = ShallowWater("unstable_jet", nx=8, ny=8)
    >>> reference_block_sums(model, model.initial_state(), whole_grid(model.shape, model.periodic))["cells"]
    64
    """
    g = model.grid
    U, V, H = (_extended(model, a, where, name) for a, name in zip(state.arrays(), "uvh"))
    south_wall, north_wall = where.sides[2] == "wall", where.sides[3] == "wall"
    rows = where.rows.stop - where.rows.start
    cols = where.cols.stop - where.cols.start
    u, v, h = U[1:rows + 1, 1:], V[1:rows + 1, 1:], H[1:rows + 1, 1:]
    h_u = 0.5 * (H[1:rows + 1, 0:cols] + H[1:rows + 1, 1:cols + 1])
    h_v = 0.5 * (H[0:rows, 1:] + H[1:rows + 1, 1:])
    kinetic = h_u * u * u + h_v * v * v
    deviation = h - model.params.mean_depth
    corners = rows + (1 if north_wall else 0)
    zeta = ((V[1:corners + 1, 1:cols + 1] - V[1:corners + 1, 0:cols]) / g.dx
            - (U[1:corners + 1, 1:cols + 1] - U[0:corners, 1:cols + 1]) / g.dy)
    h_q = 0.25 * (H[0:corners, 0:cols] + H[0:corners, 1:cols + 1]
                  + H[1:corners + 1, 0:cols] + H[1:corners + 1, 1:cols + 1])
    start = where.owned_rows.start
    xp = model.backend.xp
    f = xp.asarray(model.coriolis_rows(start, start + corners - 1))[:, None]
    density = 0.5 * (f + zeta) ** 2 / h_q
    if south_wall:  # corners on a wall count half (trapezoidal rule along y)
        density[0] *= 0.5
    if north_wall:
        density[-1] *= 0.5
    # exact partial sums: any split of the grid into blocks adds up to the same correctly rounded totals
    sums = {"cells": int(rows * cols), "depth": exact_partial(h), "deviation": exact_partial(deviation),
            "deviation2": exact_partial(deviation * deviation), "kinetic2": exact_partial(kinetic),
            "enstrophy": exact_partial(density)}
    budget = getattr(state, "viscous_energy", None)
    if budget is not None:  # accumulated cell by cell: its owned cells are any split's
        sums["viscous_energy"] = exact_partial(where.interior(budget))
    return sums


def combine_sums(model, parts):
    """Mass, energy and potential enstrophy (dict of floats) from the :func:`block_sums` of all rows."""
    # exact partials add exactly: one correctly rounded total for any split into blocks
    total = {key: sum(p[key] for p in parts) if key == "cells" else exact_total([p[key] for p in parts])
             for key in parts[0]}
    area = model.grid.cell_area
    offset = total["deviation"] / total["cells"]  # mean depth minus the rest depth
    # APE about the actual mean depth, summed about the rest depth without cancellation
    potential = 0.5 * model.params.g * (total["deviation2"] - total["cells"] * offset * offset)
    out = {"mass": total["depth"] * area,
           "energy": (0.5 * total["kinetic2"] + potential) * area,
           "enstrophy": total["enstrophy"] * area}
    if "viscous_energy" in total:
        out["energy_dissipated"] = (0.0 - total["viscous_energy"]) * area  # 0.0, not -0.0, at the start
    return out
