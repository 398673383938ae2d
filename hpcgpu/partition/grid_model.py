"""A base class for a user's own grid model: write the local physics, get the driver and the distributed grid.

A model on a structured 2-D grid describes only its local physics
(:class:`~hpcgpu.partition.protocols.GridPhysics`): its grid ``shape`` and
``periodic`` axes, ``reach`` (how far a step reads), ``initial_block``,
``step_block`` on a framed block, ``block_sums`` / ``combine_sums`` of its
diagnostics and ``cfl``. :class:`GridModelBase` supplies the rest: what
:class:`~hpcgpu.simulation.Simulation` needs of every model (initial state,
time step, stepper, health, output as an ``xarray.Dataset``) and what the
distributed grid (:mod:`hpcgpu.partition.grid`) needs of a block. The same
model then runs in one process or on any process grid, bitwise the same.

A whole grid in one block is a :class:`~hpcgpu.partition.block_region.BlockRegion`
whose periodic sides are ``"wrap"``: a step that wraps (``numpy.roll``)
handles one block and a framed block alike.

Examples
--------
>>> import numpy as np
>>> from dataclasses import dataclass
>>> from hpcgpu.exact_sums import exact_partial
>>> @dataclass
... class Field:
...     T: object
>>> class Smooth(GridModelBase):
...     name, shape, periodic = "smooth", (8, 8), (True, True)
...     def reach(self, steps): return steps
...     def initial_block(self, where):
...         y, x = np.mgrid[where.owned_rows.start:where.owned_rows.stop, where.owned_cols.start:where.owned_cols.stop]
...         return Field(np.sin(x + 2.0 * y))
...     def step_block(self, state, dt, steps, where):
...         T = state.T
...         for _ in range(steps):
...             T = T + dt * (np.roll(T, 1, 0) + np.roll(T, -1, 0) + np.roll(T, 1, 1) + np.roll(T, -1, 1) - 4 * T)
...         return Field(T)
...     def block_sums(self, state, where): return {"total": exact_partial(where.interior(state.T))}
...     def combine_sums(self, parts): return {"total": float(sum(p["total"] for p in parts))}
...     def cfl(self, state, dt): return 4 * dt if np.isfinite(state.T).all() else float("nan")
>>> model = Smooth()
>>> state = model.stepper(0.1).advance(model.initial_state(), 3)
>>> round(model.diagnostics(state)["total"], 12) == round(model.diagnostics(model.initial_state())["total"], 12)
True
"""

import copy
import math

from hpcgpu.backends import get_backend
from hpcgpu.partition.block_region import whole_grid
from hpcgpu.partition.grid import state_arrays, with_arrays
from hpcgpu.validation import check_float, check_int

__all__ = ["GridModelBase"]


class _WholeGridStepper:
    """Steps the whole grid as one block (the single-process path of :class:`GridModelBase`)."""

    def __init__(self, model, dt):
        self.model, self.dt = model, dt
        self.where = whole_grid(model.shape, model.periodic)

    def advance(self, state, steps=1):
        steps = check_int("steps", steps, minimum=0)
        return state if steps == 0 else self.model.step_block(state, self.dt, steps, self.where)


class GridModelBase:
    """What every grid model shares; a subclass writes only its local physics.

    Class attributes a subclass may set: ``name`` (short name), ``shape``
    (``(ny, nx)``, or set in ``__init__``), ``periodic`` (``(x, y)``,
    default both), ``cfl_limit`` (the stable limit of its :meth:`~hpcgpu.partition.protocols.GridPhysics.cfl`,
    default 1). ``backend`` is NumPy unless the subclass sets another
    (:func:`hpcgpu.backends.get_backend`).
    """

    name = "grid-model"
    decomposition = "grid"
    periodic = (True, True)
    cfl_limit = 1.0

    @property
    def backend(self):
        backend = self.__dict__.get("_backend")
        return get_backend("numpy") if backend is None else backend

    @backend.setter
    def backend(self, value):
        self.__dict__["_backend"] = get_backend(value)

    # -- SteppedModel ------------------------------------------------------------------------------------
    def initial_state(self):
        """The state of the whole grid at time 0 (:meth:`~hpcgpu.partition.protocols.GridPhysics.initial_block` of one block)."""
        state = self.initial_block(whole_grid(self.shape, self.periodic))
        return with_arrays(state, [self.backend.asarray(a) for a in state_arrays(state)])

    def suggested_dt(self, state, cfl=0.5):
        """The step whose :meth:`~hpcgpu.partition.protocols.GridPhysics.cfl` is ``cfl`` (the CFL number is taken as proportional to dt)."""
        cfl = check_float("cfl", cfl, minimum=0.0, strict_min=True)
        return cfl / self.cfl(state, 1.0)

    def stepper(self, dt):
        """An object whose ``advance(state, steps)`` steps the whole grid."""
        return _WholeGridStepper(self, check_float("dt", dt, minimum=0.0, strict_min=True))

    def warm_up(self):
        """Nothing to compile by default (a Numba or CUDA model steps a tiny grid here)."""

    def bad_fields(self, state):
        """Names of the fields holding NaN or inf."""
        xp = self.backend.xp
        return [name for name, array in zip(self._field_names(state), state_arrays(state))
                if not bool(xp.isfinite(array).all())]

    def diagnostics(self, state, dt=None):
        """The diagnostics of the whole grid (:meth:`combine_sums` of one block), and ``max_cfl`` for a ``dt``."""
        out = self.combine_sums([self.block_sums(state, whole_grid(self.shape, self.periodic))])
        if dt is not None:
            out["max_cfl"] = self.cfl(state, dt)
        return out

    def to_dataset(self, state, time=None):
        """The fields as an ``xarray.Dataset`` on cell indices ``y``, ``x``."""
        import xarray as xr

        data = {name: (("y", "x"), self.backend.to_host(array))
                for name, array in zip(self._field_names(state), state_arrays(state))}
        ds = xr.Dataset(data, attrs=self.attributes())
        if time is not None:
            ds = ds.expand_dims(time=[float(time)])
        return ds

    def attributes(self):
        """The model's name and grid as flat attributes."""
        ny, nx = self.shape
        return {"model": self.name, "nx": nx, "ny": ny,
                "periodic": "/".join("periodic" if p else "wall" for p in self.periodic)}

    # -- what the distributed grid needs ---------------------------------------------------------------------
    def block_health(self, state):
        """A block's non-finite fields and its CFL number per unit dt."""
        bad = self.bad_fields(state)
        return {"bad": bad, "cfl_rate": math.nan if bad else float(self.cfl(state, 1.0))}

    def combine_health(self, parts, dt):
        """``(bad_fields, cfl)``: every block's bad fields, and the largest block CFL number at ``dt``."""
        bad = sorted({name for p in parts for name in p["bad"]})
        rates = [p["cfl_rate"] for p in parts]
        return bad, (math.nan if bad or any(math.isnan(r) for r in rates) else max(rates) * dt)

    def to_host(self, state):
        """The state with NumPy arrays."""
        return with_arrays(state, [self.backend.to_host(a) for a in state_arrays(state)])

    def restore_state(self, host_state):
        """A host state (a checkpoint's) on this model's backend."""
        return with_arrays(host_state, [self.backend.asarray(a) for a in state_arrays(host_state)])

    def with_backend(self, backend):
        """The same model on another backend (a shallow copy)."""
        other = copy.copy(self)
        other.backend = backend
        return other

    @staticmethod
    def _field_names(state):
        from dataclasses import fields

        return [f.name for f in fields(state)]
