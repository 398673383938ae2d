"""The shallow-water model on a distributed grid: the local physics :mod:`hpcgpu.partition.grid` asks for.

:class:`GridBlocks` is the part of :class:`~hpcgpu.workloads.weather.ShallowWater`
that implements :class:`hpcgpu.partition.protocols.GridModel`: the grid's
shape and periodic axes, how far K steps read (``reach``), a step of a
framed block (``step_block``) and its diagnostic partial sums
(``block_sums``, in :mod:`hpcgpu.workloads.weather.diagnostics`). Where a
block lies comes in a :class:`~hpcgpu.partition.block_region.BlockRegion`;
the model never sees a neighbour.

The kernels know one boundary rule for x (periodic, wall, or open at both
ends) and one for each of south and north (periodic, wall or open), and
step a window of rows and one of columns. The step shrinks towards every
side whose frame holds a neighbour's cells: :meth:`GridBlocks.advance_rows`
steps such a block with the kernels' ``open`` rule there, and each stage
steps only the rows and columns that stay valid (half the frame's work,
on average, of stepping it whole). A block with one open x side and a
wall on the other keeps the wall rule for x: at the open side it computes
garbage only within the stage's reach, which the shrinking window leaves
behind (the open rule would do the same). Beside the physics it holds
each block's share of the health check and the moves of a state between
host and backend.

Examples
--------
>>> from hpcgpu.workloads.weather import ShallowWater
>>> model = ShallowWater("gravity_wave", nx=8, ny=12, backend="numpy")
>>> model.shape, model.periodic, model.reach(2)
((12, 8), (True, True), (12, 6, 12, 6))
"""

import math

import numpy as np

from hpcgpu.kernels.stencil import OPEN
from hpcgpu.partition.field_reach import compose_reach
from hpcgpu.workloads.weather.stepper import BUDGET_READS, STAGE_READS, STAGE_REACH, HostArrayPool

__all__ = ["GridBlocks", "shallow_water_field_reach"]


def shallow_water_field_reach(steps, energy_budget=False):
    """``{field: (west, east, south, north)}``: cells of each field beyond a block that ``steps`` steps read.

    The cone of :data:`~hpcgpu.workloads.weather.stepper.STAGE_READS` over
    the 3 stages of each SSP-RK3 step (and the energy budget's reads, which
    need no frame of the budget itself).

    Examples
    --------
    >>> shallow_water_field_reach(16)
    {'u': (48, 48, 49, 48), 'v': (49, 48, 48, 48), 'h': (49, 48, 49, 48)}
    """
    reads = {**STAGE_READS, **BUDGET_READS} if energy_budget else STAGE_READS
    return compose_reach(reads, 3 * steps)


class GridBlocks:
    """The distributed-grid methods of the shallow-water model (a mixin of :class:`ShallowWater`)."""

    shrinks_rows = True  # the stepper steps fewer rows stage by stage towards an open south or north edge
    shrinks_cols = True  # and fewer columns towards an open west or east side

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

    def field_reach(self, steps):
        """Cells ``(west, east, south, north)`` of each field that ``steps`` steps read beyond a block.

        Narrower than :meth:`reach` (which frames the arrays: the stepped
        windows shrink by ``STAGE_REACH`` a stage): no chain of reads takes
        the two-cell reach twice in a row, so each field's cone grows by
        about one cell a stage on every side. The distributed grid sends
        only these cells (:func:`shallow_water_field_reach`).
        """
        return shallow_water_field_reach(steps, self.energy_budget)

    def initial_block(self, where):
        """The case's initial fields on the owned cells of ``where``, built on those cells only.

        Bitwise the same cells as :meth:`initial_state`'s (the case's
        profiles are cut from whole axes; ``turbulence`` builds the whole
        grid and cuts, see :mod:`hpcgpu.workloads.weather.cases`).
        """
        rows, cols = where.owned_rows, where.owned_cols
        return self.state_from_arrays(*self.case_fields(rows, cols), shape=(len(rows), len(cols)))

    def step_block(self, state, dt, steps, where, cache=None):
        """A framed block ``steps`` steps later; only the cells the frame protects are valid.

        ``where`` says which sides hold a neighbour's cells (stepped as
        open edges, the stepped rows and columns shrinking towards them)
        and the global row of the block's first row (for the Coriolis
        parameter).
        """
        west, east, south, north = where.opens()
        return self.advance_rows(state, dt, steps, where.first_row, south_open=south, north_open=north,
                                 cache=cache, fresh=True, west_open=west, east_open=east)

    def advance_rows(self, state, dt, steps, first_row, south_open, north_open, cache=None, fresh=False,
                     west_open=False, east_open=False):
        """Advance a block whose first row is global row ``first_row``.

        Open edges (a neighbour's cells in the frame: ``*_open``) use the
        kernels' ``open`` rule (along x where both sides are open, else
        the grid's x rule, whose garbage at the open side stays within the
        stage's reach); results within ``reach(steps)`` of an open edge
        are not valid. Closed edges are the grid's own boundary. ``cache`` (a
        dict owned by the caller's thread) keeps steppers, so repeated calls
        on blocks of one shape reuse their work buffers; the result then
        lives in those buffers until the next call with the same cache,
        unless ``fresh`` asks for it in arrays that the caller may keep
        (host arrays come from the cache's :class:`HostArrayPool`: ones the
        caller no longer refers to are reused).
        """
        bc_x, bc_s, bc_n = self.grid.codes
        rows = state.h.shape[0]
        open_cols = (bool(west_open), bool(east_open))
        boundary = (OPEN if all(open_cols) else bc_x, OPEN if south_open else bc_s, OPEN if north_open else bc_n)
        key = (rows, first_row, boundary, open_cols, dt)
        stepper = None if cache is None else cache.get(key)
        if stepper is None:
            f_corner = self.backend.asarray(self.coriolis_rows(first_row, first_row + rows), dtype=self.dtype)
            stepper = self.stepper(dt, boundary=boundary, f_corner=f_corner, open_cols=open_cols)
            if cache is not None:
                cache[key] = stepper
        out = None
        if fresh and steps > 0:
            empty = self.backend.empty
            if cache is not None and not self.backend.on_gpu:
                # results the caller has released come back from the pool
                # (no page faults on a resident block's next superstep)
                empty = cache.setdefault("result-arrays", HostArrayPool()).empty
            out = self.state_type(*(empty(a.shape, a.dtype) for a in state.arrays()))
        return stepper.advance(state, steps, out=out)

    def to_host(self, state):
        """The state with NumPy arrays (for gathering to a client without a GPU)."""
        return self.state_type(*(self.backend.to_host(a) for a in state.arrays()))

    def restore_state(self, host_state):
        """A host state (a checkpoint's) on this model's backend, in its dtype."""
        # the fields in the model's dtype; an energy budget stays float64
        dtypes = [self.dtype] * len(self.field_names) + [np.float64]
        return self.state_type(*(self.backend.asarray(a, dtype=dtype)
                                 for a, dtype in zip(host_state.arrays(), dtypes)))

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
