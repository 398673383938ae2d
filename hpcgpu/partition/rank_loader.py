"""A state the user brings, loaded by each rank: its block, never the whole state through the client.

A grid run that starts from the user's own data (a reanalysis, an earlier
run's output, a file per variable) need not build that state on the
client, which would then split it and send every block through the
scheduler. :class:`RankLoader` is given to :class:`~hpcgpu.Simulation`
in place of a state; on a cluster each rank calls it on its worker for
the cells it owns, and a run in one process calls it once for the whole
grid. :meth:`RankLoader.from_arrays` loads from array-likes that slice
lazily (dask arrays, Zarr arrays, NumPy memory maps, xarray variables):
only the block's cells are read, on the rank's worker.

It is a *block source* (``owned_block(model, where)``, as the model's own
initial condition and a checkpoint's pieces are;
:mod:`hpcgpu.partition.rank_state`): grid models only. Particle runs
start from the model's case or from a checkpoint.

Examples
--------
>>> import numpy as np
>>> from hpcgpu import Simulation
>>> from hpcgpu.workloads.weather import ShallowWater
>>> model = ShallowWater("gravity_wave", nx=16, ny=8, backend="numpy")
>>> start = model.to_host(model.initial_state())
>>> loader = RankLoader.from_arrays({"u": start.u, "v": start.v, "h": start.h}, model.state_from_arrays)
>>> sim = Simulation(model, loader, stop_steps=2, progress=False)
>>> bool((loader.whole_state(model).h == start.h).all())
True
"""

from dataclasses import dataclass

import numpy as np

from hpcgpu.errors import ConfigError

__all__ = ["RankLoader"]


def _read(array, rows, cols):
    """The cells ``rows`` x ``cols`` of an array-like, as a NumPy array, read in this process.

    A dask array is computed with the synchronous scheduler: on a worker,
    dask's default would send tasks to the cluster whose workers are busy
    running the ranks.
    """
    part = array[rows, cols]
    if hasattr(part, "dask") and callable(getattr(part, "compute", None)):
        part = part.compute(scheduler="sync")
    values = getattr(part, "values", part)  # an xarray variable
    return np.ascontiguousarray(np.asarray(values))


@dataclass(frozen=True)
class _FromArrays:
    """The load function of :meth:`RankLoader.from_arrays` (picklable, for the workers)."""

    arrays: dict
    make_state: object

    def __call__(self, model, rows, cols):
        fields = {name: _read(array, rows, cols) for name, array in self.arrays.items()}
        if _takes_shape(self.make_state):  # a block is not the whole grid: say its shape (state_from_arrays)
            shape = next(iter(fields.values())).shape
            return self.make_state(**fields, shape=shape)
        return self.make_state(**fields)


def _takes_shape(function):
    import inspect

    try:
        return "shape" in inspect.signature(function).parameters
    except (TypeError, ValueError):
        return False


@dataclass(frozen=True)
class RankLoader:
    """A grid model's starting state, each block loaded where its rank runs.

    Parameters
    ----------
    load : callable
        ``load(model, rows, cols)`` returns the model's state on the cells
        ``rows`` x ``cols`` (two ``slice`` objects of global indices), with
        host (NumPy) arrays of shape ``(rows, cols)`` for every field. It
        runs on the rank's worker (so it must be picklable: a module-level
        function, or a closure cloudpickle can carry) and reads what the
        worker sees (a shared file system, object storage).

    Examples
    --------
    >>> from hpcgpu.workloads.weather import ShallowWater
    >>> model = ShallowWater("gravity_wave", nx=8, ny=4, backend="numpy")
    >>> def calm(m, rows, cols):
    ...     shape = (rows.stop - rows.start, cols.stop - cols.start)
    ...     return m.state_from_arrays(np.zeros(shape), np.zeros(shape), np.full(shape, 10.0), shape=shape)
    >>> calm = RankLoader(calm)
    >>> calm.whole_state(model).h.shape
    (4, 8)
    """

    load: object

    def __post_init__(self):
        if not callable(self.load):
            raise ConfigError(f"load must be a callable load(model, rows, cols) returning the block's state; "
                              f"got {self.load!r}")

    @classmethod
    def from_arrays(cls, arrays, make_state):
        """A loader that slices ``arrays`` (``{field: array-like of shape (ny, nx)}``) and builds the state.

        Parameters
        ----------
        arrays : dict of str to array-like
            Dask, Zarr or xarray arrays (read lazily: a rank reads its
            block only) or NumPy arrays (carried whole to every worker:
            small grids only).
        make_state : callable
            ``make_state(**{field: numpy array})``, e.g. the model's
            ``state_from_arrays``; given the block's ``shape=(rows, cols)``
            too when it takes that keyword.
        """
        if not isinstance(arrays, dict) or not arrays:
            raise ConfigError(f"arrays must be a non-empty dict of field name to array; got {type(arrays).__name__}")
        for name, array in arrays.items():
            if len(getattr(array, "shape", ())) != 2:
                raise ConfigError(f"arrays[{name!r}] must be 2-D (ny, nx); got shape {getattr(array, 'shape', None)}")
        if not callable(make_state):
            raise ConfigError(f"make_state must be callable (e.g. model.state_from_arrays); got {make_state!r}")
        return cls(_FromArrays(dict(arrays), make_state))

    def owned_block(self, model, where):
        """The state of the owned cells of ``where`` (a grid's BlockRegion), loaded here."""
        rows, cols = getattr(where, "owned_rows", None), getattr(where, "owned_cols", None)
        if rows is None or cols is None:
            raise ConfigError("RankLoader serves grid models (blocks of rows and columns); a particle run starts "
                              "from the model's case or from a checkpoint")
        state = self.load(model, slice(rows.start, rows.stop), slice(cols.start, cols.stop))
        expected = (len(rows), len(cols))
        for name in getattr(model, "field_names", ()):
            shape = tuple(np.shape(getattr(state, name, None)))
            if shape != expected:
                raise ConfigError(f"RankLoader: load(model, rows={rows.start}:{rows.stop}, cols={cols.start}:"
                                  f"{cols.stop}) gave field {name!r} of shape {shape}; expected {expected}")
        return state

    def whole_state(self, model):
        """The whole grid's state (a run in one process)."""
        from hpcgpu.partition.block_region import whole_grid

        return self.owned_block(model, whole_grid(model.shape, model.periodic))
