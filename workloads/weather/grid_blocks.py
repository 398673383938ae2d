"""The shallow-water model on a distributed grid: the local physics :mod:`hpcgpu.partition.grid` asks for.

:class:`GridBlocks` is the part of :class:`~hpcgpu.workloads.weather.ShallowWater`
that implements :class:`hpcgpu.partition.protocols.GridModel`: the grid's
shape and periodic axes, how far K steps read (``reach``), a step of a
framed block (``step_block``) and its diagnostic partial sums
(``block_sums``, in :mod:`hpcgpu.workloads.weather.diagnostics`). Where a
block lies comes in a :class:`~hpcgpu.partition.block_region.BlockRegion`;
the model never sees a neighbour.

The kernels know one boundary rule for x (periodic or wall) and one for
each of south and north (periodic, wall or open). A frame along x is
stepped with the grid's own x rule: at a side whose frame holds a
neighbour's columns that rule computes garbage, but only within the
frame, which K steps' reach never lets into the owned cells (the same
argument as the row blocks' open edges; it costs the frame's columns of
work, which :func:`hpcgpu.partition.grid.auto_grid_steps` keeps to about
a quarter of a block).

Examples
--------
>>> from hpcgpu.workloads.weather import ShallowWater
>>> model = ShallowWater("gravity_wave", nx=8, ny=12, backend="numpy")
>>> model.shape, model.periodic, model.reach(2)
((12, 8), (True, True), (12, 6, 12, 6))
"""

from hpcgpu.workloads.weather.stepper import STAGE_REACH

__all__ = ["GridBlocks"]


class GridBlocks:
    """The distributed-grid methods of the shallow-water model (a mixin of :class:`ShallowWater`)."""

    shrinks_rows = True  # the stepper steps fewer rows stage by stage towards an open south or north edge

    @property
    def shape(self):
        """The grid's ``(ny, nx)`` cells."""
        return self.grid.shape

    @property
    def periodic(self):
        """``(x, y)``: whether each axis wraps around."""
        return not self.grid.wall_x, not self.grid.wall_y

    def reach(self, steps):
        """Cells ``(west, east, south, north)`` that ``steps`` steps read beyond a block.

        One tendency reads ``STAGE_REACH`` = 2 cells south (west) and 1
        north (east): the C-grid is the same along both axes. SSP-RK3
        evaluates it three times per step.
        """
        low, high = 3 * steps * STAGE_REACH[0], 3 * steps * STAGE_REACH[1]
        return low, high, low, high

    def initial_block(self, where):
        """The case's initial fields on the owned cells of ``where`` (cut from the whole grid's)."""
        state = self.initial_state()
        rows, cols = where.owned_rows, where.owned_cols
        return self.state_type(*(a[rows.start:rows.stop, cols.start:cols.stop].copy() for a in state.arrays()))

    def step_block(self, state, dt, steps, where, cache=None):
        """A framed block ``steps`` steps later; only the cells the frame protects are valid.

        ``where`` says which sides hold a neighbour's cells (stepped as
        open edges along y, with the grid's rule along x) and the global
        row of the block's first row (for the Coriolis parameter).
        """
        _, _, south, north = where.sides
        return self.advance_rows(state, dt, steps, where.first_row, south_open=south == "halo",
                                 north_open=north == "halo", cache=cache, fresh=True)
