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
argument as the open edges along y; it costs the frame's columns of
work, which :func:`hpcgpu.partition.grid.auto_grid_steps` keeps to about
a quarter of a block).

Along y the step itself shrinks: :meth:`GridBlocks.advance_rows` steps a
block whose south or north edge is open (a neighbour's rows in the frame)
with the kernels' ``open`` rule, and each stage steps only the rows that
stay valid. Beside the physics it holds each block's share of the health
check and the moves of a state between host and backend.

Examples
--------
>>> from hpcgpu.workloads.weather import ShallowWater
>>> model = ShallowWater("gravity_wave", nx=8, ny=12, backend="numpy")
>>> model.shape, model.periodic, model.reach(2)
((12, 8), (True, True), (12, 6, 12, 6))
"""

import math

from hpcgpu.kernels.stencil import OPEN
from hpcgpu.workloads.weather.stepper import STAGE_REACH, HostArrayPool

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

    def advance_rows(self, state, dt, steps, first_row, south_open, north_open, cache=None, fresh=False):
        """Advance a block of whole rows whose first row is global row ``first_row``.

        Open edges (a neighbour's rows in the frame) use the kernels'
        ``open`` rule; results within ``reach(steps)`` of an open edge are
        not valid. Closed edges are the grid's own boundary. ``cache`` (a
        dict owned by the caller's thread) keeps steppers, so repeated calls
        on blocks of one shape reuse their work buffers; the result then
        lives in those buffers until the next call with the same cache,
        unless ``fresh`` asks for it in arrays that the caller may keep
        (host arrays come from the cache's :class:`HostArrayPool`: ones the
        caller no longer refers to are reused).
        """
        bc_x, bc_s, bc_n = self.grid.codes
        rows = state.h.shape[0]
        boundary = (bc_x, OPEN if south_open else bc_s, OPEN if north_open else bc_n)
        key = (rows, first_row, boundary, dt)
        stepper = None if cache is None else cache.get(key)
        if stepper is None:
            f_corner = self.backend.asarray(self.coriolis_rows(first_row, first_row + rows), dtype=self.dtype)
            stepper = self.stepper(dt, boundary=boundary, f_corner=f_corner)
            if cache is not None:
                cache[key] = stepper
        out = None
        if fresh and steps > 0:
            empty = self.backend.empty
            if cache is not None and not self.backend.on_gpu:
                # results the caller has released come back from the pool
                # (no page faults on a resident block's next superstep)
                empty = cache.setdefault("result-arrays", HostArrayPool()).empty
            out = self.state_type(*(empty(a.shape, self.dtype) for a in state.arrays()))
        return stepper.advance(state, steps, out=out)

    def to_host(self, state):
        """The state with NumPy arrays (for gathering to a client without a GPU)."""
        return self.state_type(*(self.backend.to_host(a) for a in state.arrays()))

    def restore_state(self, host_state):
        """A host state (a checkpoint's) on this model's backend, in its dtype."""
        return self.state_type(*(self.backend.asarray(a, dtype=self.dtype) for a in host_state.arrays()))

    def block_health(self, state):
        """Extremes and non-finite fields of a block (host scalars)."""
        xp = self.backend.xp
        return {"u_max": float(xp.abs(state.u).max()), "v_max": float(xp.abs(state.v).max()),
                "h_min": float(state.h.min()), "h_max": float(state.h.max()),
                "bad": self.bad_fields(state)}

    def combine_health(self, parts, dt):
        """``(bad_fields, cfl)`` from :meth:`block_health` of every block."""
        bad = sorted({name for p in parts for name in p["bad"]}, key=self.field_names.index)
        h_min = min(p["h_min"] for p in parts)
        h_max = max(p["h_max"] for p in parts)
        if bad or not h_min > 0 or not math.isfinite(h_max):
            return bad or ["h"], math.nan
        g = self.grid
        wave = math.sqrt(self.params.g * h_max) * math.sqrt(1 / g.dx**2 + 1 / g.dy**2)
        u_max = max(p["u_max"] for p in parts)
        v_max = max(p["v_max"] for p in parts)
        return [], dt * (u_max / g.dx + v_max / g.dy + wave)
