"""SSP-RK3 stepping of the shallow-water model, and the memory trick of its partitions.

:class:`ShallowWaterStepper` advances a state (or a framed block of one) with reusable
work buffers, using the backend's fused one-sweep step where it has one
(Numba) and three stage calls otherwise; at an open partition edge it steps
only the rows (south, north) or columns (west, east) that stay valid. :class:`HostArrayPool` hands out the arrays
a partition's step returns and takes them back once nothing refers to
them, so a resident partition does not fault in fresh pages every
superstep.
"""

import sys

import numpy as np

from hpcgpu.kernels import stencil
from hpcgpu.validation import check_int

__all__ = ["HostArrayPool", "ShallowWaterStepper", "STAGE_READS", "STAGE_REACH"]

# Rows (south, north) one tendency evaluation reads beyond the rows it
# updates: dv needs the Arakawa-Lamb coefficients of the cell row below, which
# need potential vorticity one row further; the north side reads one row. The
# C-grid is the same along x: columns (west, east).
STAGE_REACH = (2, 1)

# Field by field, what one stage of an output field reads of an input field
# beyond its own cell, (west, east, south, north) (the reference kernel's
# stencils, checked cell by cell in tests/workloads/test_weather_field_reach.py).
# The two-cell reaches of STAGE_REACH are the vortex force's: u reads v and h
# two columns west (the potential vorticity of the corner west of its
# cell's), v reads u and h two rows south; no field reads its own kind that
# far, so over many stages each field's cone grows by about one cell a stage
# on every side, not two. The energy budget reads the viscous terms' five
# points and the face depths, and nothing reads it.
STAGE_READS = {
    ("u", "u"): (1, 1, 1, 1), ("u", "v"): (2, 1, 0, 1), ("u", "h"): (2, 1, 1, 1),
    ("v", "u"): (0, 1, 2, 1), ("v", "v"): (1, 1, 1, 1), ("v", "h"): (1, 1, 2, 1),
    ("h", "u"): (0, 1, 0, 0), ("h", "v"): (0, 0, 0, 1), ("h", "h"): (1, 1, 1, 1),
}
BUDGET_READS = {("viscous_energy", "viscous_energy"): 0, ("viscous_energy", "u"): 1, ("viscous_energy", "v"): 1,
                ("viscous_energy", "h"): (1, 0, 1, 0)}


class ShallowWaterStepper:
    """SSP-RK3 time stepping with three reusable work states.

    ``advance`` never writes into the state it is given unless that state is
    one of its own buffers (the result of its previous ``advance``), so a
    driver that always feeds back the last result steps without allocating.

    A :class:`~hpcgpu.workloads.weather.ShallowWaterBudgetState`
    (a model with ``energy_budget``) is stepped by the three stage calls,
    bitwise the fused step, and each step adds to its ``viscous_energy``,
    cell by cell, the viscous energy tendency at the three stage inputs
    weighted as SSP-RK3 weights its stages (1/6, 1/6, 2/3): the budget's
    integral is third order, as the fields are.

    Parameters
    ----------
    model : ShallowWater
    dt : float
        Time step (s).
    boundary : tuple of int
        Kernel boundary codes ``(x, south, north)``.
    f_corner : array, optional
        Coriolis parameter on the state's corner rows (default: the model's).
    open_cols : tuple of bool
        ``(west, east)``: whether the state's first or last columns are a
        partition's frame (a neighbour's columns). The stepped column window
        shrinks towards an open side stage by stage, as the rows do towards
        an ``OPEN`` south or north edge.

    Examples
    --------
    >>> from hpcgpu.workloads.weather import ShallowWater
    >>> model = ShallowWater("unstable_jet", nx=32, ny=24, backend="numpy")
    >>> state = model.initial_state()
    >>> later = model.stepper(model.suggested_dt(state)).advance(state, 2)
    >>> later.h.shape
    (24, 32)
    """

    def __init__(self, model, dt, boundary, f_corner=None, open_cols=(False, False)):
        self.model = model
        self.dt = dt
        self.boundary = tuple(boundary)
        self.f_corner = f_corner
        self.open_cols = tuple(bool(side) for side in open_cols)
        self._work = []
        self._kernels = None
        self._budget = None

    def _budget_target(self, budget, out):
        """The array a step accumulates the energy budget into, holding ``budget`` (not ``budget`` itself
        unless it is the stepper's own, or ``out``'s)."""
        target = out.viscous_energy if out is not None else self._budget
        if target is None or target.shape != budget.shape:
            target = self._budget = self.model.backend.empty(budget.shape, np.float64)
        if target is not budget:
            target[...] = budget
        return target

    def _buffers(self, state):
        backend = self.model.backend
        shape, dtype = state.h.shape, state.h.dtype
        if not self._work or self._work[0][0].shape != shape or self._work[0][0].dtype != dtype:
            self._work = [tuple(backend.empty(shape, dtype) for _ in range(3)) for _ in range(3)]
        return self._work

    def _prepared(self, state):
        """The stencil kernels for this state's width and dtype, checked once (see ``prepare_shallow_water``)."""
        nx, dtype = state.h.shape[1], state.h.dtype
        if self._kernels is None or self._kernels.nx != nx or self._kernels.dtype != dtype:
            model = self.model
            p, g = model.params, model.grid
            f_corner = model._f_device() if self.f_corner is None else self.f_corner
            self._kernels = stencil.prepare_shallow_water(nx, dtype, f_corner=f_corner, g=p.g, dx=g.dx, dy=g.dy,
                                                          viscosity=p.viscosity, boundary=self.boundary,
                                                          backend=model.backend)
        return self._kernels

    def advance(self, state, steps=1, out=None):
        """Return the state ``steps`` time steps later.

        ``out`` (a state of the same shape, neither ``state`` nor one of the
        stepper's buffers) receives the result instead of a work buffer.
        """
        steps = check_int("steps", steps, minimum=0)
        if steps == 0:
            return state
        kernels = self._prepared(state)
        work = self._buffers(state)
        y0 = state.arrays()[:3]
        budget = getattr(state, "viscous_energy", None)
        if budget is not None:
            budget = self._budget_target(budget, out)
        # At an open edge (a partition's halo) each stage leaves its outer
        # STAGE_REACH rows invalid, so the next stage only needs the rows
        # that are still valid: the window shrinks stage by stage and ends on
        # exactly the rows the halo protects. Half the redundant halo work of
        # stepping the whole block; every valid point sees the same operations.
        # Columns shrink the same way towards an open west or east side.
        _, bc_s, bc_n = self.boundary
        shrink_s = STAGE_REACH[0] if bc_s == stencil.OPEN else 0
        shrink_n = STAGE_REACH[1] if bc_n == stencil.OPEN else 0
        shrink_w, shrink_e = (reach if side else 0 for reach, side in zip(STAGE_REACH, self.open_cols))
        lo, hi = 0, state.h.shape[0]
        west, east = 0, state.h.shape[1]
        # without an open side the kernels step whole rows (no window to pass)
        windowed = shrink_w or shrink_e
        for step in range(steps):
            free = [w for w in work if w[0] is not y0[0]]
            first, second = free[0], free[1]
            last = first if out is None or step < steps - 1 else out.arrays()[:3]
            # Backends with a fused step (Numba) do the three stages in one
            # sweep over memory; bitwise the same as the stage calls. Its
            # three stages step one column window (the rows shrink within
            # the sweep): the window shrinks by a step's reach between steps.
            if kernels.fused and budget is None:
                kernels.rk3_step(y0, last, self.dt, stencil.SSP_RK3_STAGES, rows=(lo, hi),
                                 cols=(west, east) if windowed else None)
                lo, hi = lo + 3 * shrink_s, hi - 3 * shrink_n
                west, east = west + 3 * shrink_w, east - 3 * shrink_e
                y0 = last
                continue
            stages = zip(stencil.SSP_RK3_STAGES, (y0, first, second), (first, second, last))
            rates = []
            for (a, b, c), src, dst in stages:
                if budget is not None:  # the stage's input, before a later stage overwrites it
                    rates.append((kernels.viscous_energy_tendency(src, rows=(lo, hi), cols=(west, east)), lo, west))
                kernels.stage(y0, src, dst, a=a, b=b, c=c * self.dt, rows=(lo, hi),
                              cols=(west, east) if windowed else None)
                lo, hi = lo + shrink_s, hi - shrink_n
                west, east = west + shrink_w, east - shrink_e
            if budget is not None:
                self._accumulate(budget, rates)
            y0 = last
        if budget is not None:
            return type(state)(*y0, budget)
        return type(state)(*y0)

    def _accumulate(self, budget, rates):
        """Add a step's viscous energy change to ``budget`` on the last stage's window, per cell.

        The rates at the three stage inputs, weighted as SSP-RK3 weights its
        stages' tendencies (1/6, 1/6, 2/3): the budget is integrated as the
        fields are, to third order. Cell by cell, so any block of the grid
        adds what one block adds there.
        """
        (first, lo1, w1), (second, lo2, w2), (third, lo3, w3) = rates
        rows, cols = third.shape
        window = (slice(lo3, lo3 + rows), slice(w3, w3 + cols))

        def cut(rate, lo, west):
            return rate[lo3 - lo:lo3 - lo + rows, w3 - west:w3 - west + cols]

        budget[window] += self.dt * ((cut(first, lo1, w1) + cut(second, lo2, w2)) / 6.0 + third * (2.0 / 3.0))


class HostArrayPool:
    """Host arrays for task results, reused once nothing else refers to them.

    A partition task returns its new block in fresh arrays (dask keeps the
    old block alive until every task that reads it is done), and a fresh
    50 MB NumPy array costs a page fault per 4 kB page when first written:
    about 6% of a 2048^2 shallow-water superstep on one core, and memory
    bandwidth the other worker wanted. The pool keeps the arrays it handed
    out; an array whose only reference is the pool's (dask released the
    block, and every view of it, since a NumPy view holds its base) is
    handed out again. Device arrays are not pooled: CuPy's memory pool
    already recycles them without faults.

    Parameters
    ----------
    limit : int
        Most arrays kept; beyond it, new arrays are allocated and not kept.

    Examples
    --------
    >>> import numpy as np
    >>> pool = HostArrayPool()
    >>> a = pool.empty((4, 4), np.float32)
    >>> held = a[1:3]            # a view keeps ``a`` in use
    >>> pool.empty((4, 4), np.float32) is a
    False
    >>> del a, held
    >>> b = pool.empty((4, 4), np.float32)
    >>> b.shape, len(pool)
    ((4, 4), 2)
    >>> c = pool.empty((2, 8), np.float32)  # another shape: the free (4, 4) array goes
    >>> len(pool)
    2
    """

    # references to a free array while empty() looks at it: the pool's
    # list, the loop variable and getrefcount's own argument
    _FREE_REFS = 3

    def __init__(self, limit=12):
        self.limit = limit
        self._arrays = []

    def __len__(self):
        return len(self._arrays)

    def empty(self, shape, dtype):
        """An uninitialised C-contiguous array not referenced anywhere else."""
        shape, dtype = tuple(shape), np.dtype(dtype)
        for array in self._arrays:
            if array.shape == shape and array.dtype == dtype and sys.getrefcount(array) <= self._FREE_REFS:
                return array
        array = None  # the loop's last array is not in use by this function
        # free arrays of another shape (blocks resized by a rebalance) are
        # not kept: they would hold memory and the pool's places
        self._arrays = [a for a in self._arrays if (a.shape == shape and a.dtype == dtype)
                        or sys.getrefcount(a) > self._FREE_REFS]
        array = np.empty(shape, dtype)
        if len(self._arrays) < self.limit:
            self._arrays.append(array)
        return array
