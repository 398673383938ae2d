"""How a shallow-water state splits into blocks of grid rows: what :mod:`hpcgpu.partition.rows` needs.

:class:`RowBlocks` is the part of :class:`~hpcgpu.workloads.weather.ShallowWater`
that implements :class:`hpcgpu.partition.protocols.RowModel`: cutting,
joining and viewing row blocks, writing halos around a resident block in
place, stepping a block with open edges, and each block's share of the
health check. It holds no state of its own; the model supplies ``grid``,
``backend``, ``dtype``, ``params``, ``state_type`` and its stepper.

Examples
--------
>>> from hpcgpu.workloads.weather import ShallowWater
>>> model = ShallowWater("gravity_wave", nx=8, ny=12, backend="numpy")
>>> state = model.initial_state()
>>> south, north = model.take_block(state, 0, 5), model.take_block(state, 5, 12)
>>> joined = model.concat_blocks([south, north])
>>> bool((joined.h == state.h).all()), model.halo_rows(2)
(True, (12, 6))
"""

import functools
import math

from hpcgpu.kernels.stencil import OPEN
from hpcgpu.workloads.weather.stepper import STAGE_REACH, HostArrayPool, spare_rows_base

__all__ = ["RowBlocks"]


class RowBlocks:
    """The row-block methods of the shallow-water model (a mixin of :class:`ShallowWater`)."""

    def decomposition_size(self):
        """Number of rows the state is split along (the grid's ny)."""
        return self.grid.ny

    def block_size(self, state):
        """Rows of a row block (with the halo rows around it, when it is an assembled block)."""
        return state.h.shape[0]

    def periodic_rows(self):
        """True when the decomposed axis wraps around."""
        return not self.grid.wall_y

    def halo_rows(self, steps):
        """Rows ``(south, north)`` that ``steps`` steps read beyond a row block.

        One tendency reads ``STAGE_REACH`` = 2 rows south and 1 row north;
        SSP-RK3 evaluates it three times per step.
        """
        return 3 * steps * STAGE_REACH[0], 3 * steps * STAGE_REACH[1]

    def take_block(self, state, start, stop):
        """Rows ``start:stop`` of a state, as independent arrays on the same device."""
        return self.state_type(*(a[start:stop].copy() for a in state.arrays()))

    def row_view(self, state, start, stop):
        """Rows ``start:stop`` of a state as views (no copy; they keep the whole arrays alive)."""
        return self.state_type(*(a[start:stop] for a in state.arrays()))

    def concat_blocks(self, states):
        """Row blocks stacked south to north, moved to this model's backend.

        A single block already on the backend is returned as it is (callers
        only read it).
        """
        asarray = functools.partial(self.backend.asarray, dtype=self.dtype)
        if len(states) == 1:
            return self.state_type(*(asarray(a) for a in states[0].arrays()))
        xp = self.backend.xp
        return self.state_type(*(xp.concatenate([asarray(s.arrays()[k]) for s in states]) for k in range(3)))

    def write_rows(self, block, start, rows):
        """Write the row block ``rows`` into ``block`` from its row ``start`` on (in place)."""
        for target, source in zip(block.arrays(), rows.arrays()):
            target[start:start + source.shape[0]] = source

    def assemble_rows(self, south, block, north):
        """``block`` with ``south`` rows below it and ``north`` rows above (either may be None).

        A block returned by :meth:`advance_rows` with ``fresh=True`` and cut
        by :meth:`row_view` sits inside arrays with spare rows on each side:
        when they are exactly as many as the halos, the halos are written
        into them and nothing else is copied, so a resident partition is not
        copied twice per superstep. Otherwise (a block that was sent
        between workers, or a different halo width) the rows are
        concatenated into new arrays.
        """
        below = 0 if south is None else south.h.shape[0]
        above = 0 if north is None else north.h.shape[0]
        bases = [spare_rows_base(a, below, above) for a in block.arrays()]
        if any(base is None for base in bases) or block.h.dtype != self.dtype:
            return self.concat_blocks([piece for piece in (south, block, north) if piece is not None])
        for base, k in zip(bases, range(3)):
            if south is not None:
                base[:below] = self.backend.asarray(south.arrays()[k], dtype=self.dtype)
            if north is not None:
                base[base.shape[0] - above:] = self.backend.asarray(north.arrays()[k], dtype=self.dtype)
        return self.state_type(*bases)

    def to_host(self, state):
        """The state with NumPy arrays (for gathering to a client without a GPU)."""
        return self.state_type(*(self.backend.to_host(a) for a in state.arrays()))

    def advance_rows(self, state, dt, steps, first_row, south_open, north_open, cache=None, fresh=False):
        """Advance a row block whose first row is global row ``first_row``.

        Open edges (partition halos) use the kernels' ``open`` rule; results
        within ``halo_rows(steps)`` of an open edge are not valid. Closed
        edges are the grid's own boundary. ``cache`` (a dict owned by the
        caller's thread) keeps steppers, so repeated calls on blocks of one
        shape reuse their work buffers; the result then lives in those
        buffers until the next call with the same cache, unless ``fresh``
        asks for it in arrays that the caller may keep (host arrays come
        from the cache's :class:`HostArrayPool`: ones the caller no longer
        refers to are reused).
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
                # (no page faults on a resident partition's next superstep)
                empty = cache.setdefault("result-arrays", HostArrayPool()).empty
            out = self.state_type(*(empty(a.shape, self.dtype) for a in state.arrays()))
        return stepper.advance(state, steps, out=out)

    def block_health(self, state):
        """Extremes and non-finite fields of a row block (host scalars)."""
        xp = self.backend.xp
        return {"u_max": float(xp.abs(state.u).max()), "v_max": float(xp.abs(state.v).max()),
                "h_min": float(state.h.min()), "h_max": float(state.h.max()),
                "bad": self.bad_fields(state)}

    def combine_health(self, parts, dt):
        """``(bad_fields, cfl)`` from :meth:`block_health` of every row block."""
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
