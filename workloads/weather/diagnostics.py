"""Diagnostics of the shallow-water model as sums over row blocks: mass, energy, potential enstrophy.

Every quantity is a sum over a block of rows (:func:`block_sums`),
combined afterwards (:func:`combine_sums`), so a partitioned run reduces
where its partitions live and only one number per row and quantity
travels. A block keeps its sums row by row and :func:`combine_sums` adds
all rows with :func:`~hpcgpu.workloads.sums.exact_total` (:func:`math.fsum`:
correctly rounded, so independent of the order): the diagnostics are then
bitwise the same on any number of partitions, as the fields are, where one
total per block would round differently with every split.
:meth:`hpcgpu.workloads.weather.ShallowWater.diagnostics` is the entry point;
these read the model's public attributes (grid, params, backend,
``coriolis_rows``).
"""

import numpy as np

from hpcgpu.kernels import stencil
from hpcgpu.kernels.stencil import WALL
from hpcgpu.workloads.sums import exact_total

__all__ = ["block_sums", "combine_sums"]


def block_sums(model, state, start, south=None):
    """Partial sums over the rows of ``state`` (global rows from ``start``): see :meth:`ShallowWater.block_sums
    <hpcgpu.workloads.weather.ShallowWater.block_sums>`."""
    xp = model.backend.xp
    g = model.grid
    u, v, h = (xp.asarray(a).astype(np.float64) for a in state.arrays())
    if south is None:
        # South wall: scalars and tangential velocity are mirrored, v beyond is 0.
        su, sv, sh = u[:1], xp.zeros_like(v[:1]), h[:1]
    else:
        su, sv, sh = (xp.asarray(a).astype(np.float64) for a in south.arrays())
    rows = h.shape[0]
    north_wall = g.wall_y and start + rows == g.ny
    tail = [(u[-1:], xp.zeros_like(v[-1:]), h[-1:])] if north_wall else []
    U = xp.concatenate([su, u] + [t[0] for t in tail])
    V = xp.concatenate([sv, v] + [t[1] for t in tail])
    H = xp.concatenate([sh, h] + [t[2] for t in tail])
    bc_x = g.codes[0]
    # One ghost column each side by the x boundary rule (no y padding: rows are explicit).
    Hx = stencil.pad(H, (bc_x, WALL, WALL), width=1)[1:-1]
    Ux = stencil.pad(U, (bc_x, WALL, WALL), normal="x", width=1)[1:-1]
    Vx = stencil.pad(V, (bc_x, WALL, WALL), width=1)[1:-1]
    nx = g.nx
    h_u = 0.5 * (Hx[1:rows + 1, 0:nx] + Hx[1:rows + 1, 1:nx + 1])
    h_v = 0.5 * (H[0:rows] + H[1:rows + 1])
    kinetic = (h_u * u * u).sum(axis=1) + (h_v * v * v).sum(axis=1)
    deviation = h - model.params.mean_depth
    corners = rows + (1 if north_wall else 0)
    zeta = ((Vx[1:corners + 1, 1:nx + 1] - Vx[1:corners + 1, 0:nx]) / g.dx
            - (Ux[1:corners + 1, 1:nx + 1] - Ux[0:corners, 1:nx + 1]) / g.dy)
    h_q = 0.25 * (Hx[0:corners, 0:nx] + Hx[0:corners, 1:nx + 1]
                  + Hx[1:corners + 1, 0:nx] + Hx[1:corners + 1, 1:nx + 1])
    f = xp.asarray(model.coriolis_rows(start, start + corners - 1))[:, None]
    density = 0.5 * (f + zeta) ** 2 / h_q
    if south is None and start == 0:
        density[0] *= 0.5
    if north_wall:
        density[-1] *= 0.5
    # sums by row (host float64 arrays): every row is summed by the same operations in any block
    host = model.backend.to_host
    return {"cells": int(h.size), "depth": host(h.sum(axis=1)), "deviation": host(deviation.sum(axis=1)),
            "deviation2": host((deviation * deviation).sum(axis=1)), "kinetic2": host(kinetic),
            "enstrophy": host(density.sum(axis=1))}


def combine_sums(model, parts):
    """Mass, energy and potential enstrophy (dict of floats) from the :func:`block_sums` of all rows."""
    # every row's sum, added with one correctly rounded sum: the same total for any split into blocks
    total = {key: sum(p[key] for p in parts) if key == "cells" else
             exact_total(np.concatenate([np.ravel(p[key]) for p in parts])) for key in parts[0]}
    area = model.grid.cell_area
    offset = total["deviation"] / total["cells"]  # mean depth minus the rest depth
    # APE about the actual mean depth, summed about the rest depth without cancellation
    potential = 0.5 * model.params.g * (total["deviation2"] - total["cells"] * offset * offset)
    return {"mass": total["depth"] * area,
            "energy": (0.5 * total["kinetic2"] + potential) * area,
            "enstrophy": total["enstrophy"] * area}
