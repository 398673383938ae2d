"""Zarr snapshots of a partitioned grid run, written by the ranks: the client writes only metadata and coordinates.

On a partitioned grid run (:func:`hpcgpu.rank_checkpoints.writes_pieces`)
whose model describes its output (``output_coords()``,
``output_variables()`` and, for variables that are no state field,
``derived_output_block(read, rows, cols)``), a snapshot is written in three
steps:

1. the client creates (first snapshot) or extends along ``time`` (later
   ones) the store from a *template*: the coordinates as NumPy arrays and
   every variable as an unwritten dask array, through
   ``Dataset.to_zarr(compute=False)``, which writes metadata and the
   coordinates only;
2. every rank writes the owned cells of the state fields into its region
   of the new time index, on its worker (zarr directly);
3. every rank computes the derived variables of its region (e.g. the
   weather model's vorticity, which reads one column and one row beyond
   the block) from the fields just written, and writes them.

Chunks are aligned with the blocks: along each axis the chunk size is the
greatest common divisor of the block bounds, so no chunk holds the cells of
two ranks and no two ranks ever write the same chunk. Only the template's
1-D coordinates and the ranks' small acknowledgements pass through the
client; ``xarray.open_zarr`` sees the same variables, coordinates,
attributes and values as for a store written from the gathered state.

Examples
--------
>>> chunk_size([(0, 12), (12, 20)])
4
"""

import math
import warnings

import numpy as np

from hpcgpu.partition.decomposition import on_worker
from hpcgpu.rank_checkpoints import writes_pieces

__all__ = ["TIME_ATTRS", "chunk_size", "rank_writable", "template", "write_snapshot"]

TIME_ATTRS = {"units": "s", "long_name": "model time"}
"""The attributes of the ``time`` coordinate (as the grid models' ``to_dataset`` gives them)."""


def chunk_size(bounds):
    """The largest chunk length that divides every block of ``bounds`` (``[(start, stop), ...]`` along one axis)."""
    return math.gcd(*(int(edge) for pair in bounds for edge in pair))


def rank_writable(model, executor, fields=None):
    """Whether the ranks of ``executor`` can write ``model``'s snapshots themselves (else the client gathers).

    ``fields`` (names kept, or None for all) must keep every state field
    when it keeps a derived variable: the ranks compute those from the
    fields in the store.
    """
    if not writes_pieces(executor):
        return False
    if not all(callable(getattr(model, name, None)) for name in ("output_coords", "output_variables")):
        return False
    names = set(model.output_variables())
    derived = names - set(model.field_names)
    if derived and not callable(getattr(model, "derived_output_block", None)):
        return False
    kept = names if fields is None else set(fields)
    return not (kept & derived) or set(model.field_names) <= kept


def template(model, decomposition, time, step, names, attrs):
    """The snapshot's dataset of unwritten dask arrays, chunked like the blocks, with its coordinates.

    Parameters
    ----------
    model : grid model with ``output_coords`` and ``output_variables``
    decomposition : GridDecomposition
        The run's layout (``y_bounds``, ``x_bounds``).
    time, step : float, int
        The snapshot's model time and step (coordinates along ``time``).
    names : sequence of str
        The variables to write.
    attrs : dict
        The dataset's attributes.
    """
    import dask.array as da
    import xarray as xr

    ny, nx = model.shape
    chunks = (1, chunk_size(decomposition.y_bounds), chunk_size(decomposition.x_bounds))
    variables = model.output_variables()
    data = {name: (("time", *variables[name][0]), da.empty((1, ny, nx), dtype=variables[name][1], chunks=chunks),
                   dict(variables[name][2])) for name in names}
    coords = dict(model.output_coords())
    coords["time"] = ("time", np.array([float(time)]), dict(TIME_ATTRS))
    coords["step"] = ("time", np.array([int(step)]))
    return xr.Dataset(data, coords=coords, attrs=attrs)


def write_snapshot(executor, model, path, first, time, step, names, attrs):
    """Write one snapshot of the run of ``executor`` into the store at ``path``: metadata here, regions by the ranks.

    ``first`` creates the store (replacing one there); otherwise the
    snapshot is appended along ``time``. A rank's failed write raises
    here, on the client, with the worker's error.
    """
    ds = template(model, executor.decomposition, time, step, names, attrs)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*[Cc]onsolidated metadata.*")
        if first:
            ds.to_zarr(path, mode="w", consolidated=True, compute=False)
        else:
            ds.to_zarr(path, append_dim="time", consolidated=True, compute=False)
    index = _time_length(path) - 1
    fields = [name for name in names if name in model.field_names]
    derived = [name for name in names if name not in model.field_names]
    executor.on_workers(write_field_regions, path, index, fields, phase="snapshot")
    if derived:  # after every rank's fields are in the store: a region's derived cells read beyond it
        executor.on_workers(write_derived_regions, path, index, derived, phase="snapshot-derived")


def _time_length(path):
    import zarr

    return zarr.open_group(path, mode="r")["time"].shape[0]


def _regions(spec, ranks):
    for rank in ranks:
        region = spec.decomposition.piece_region(rank)
        yield rank, slice(*region["rows"]), slice(*region["cols"])


def write_field_regions(spec, ranks, results, path, index, names):
    """Each rank of this worker writes its owned cells of the state fields ``names`` at time ``index`` (a worker task)."""
    import zarr

    model = on_worker(spec.model)
    group = zarr.open_group(path, mode="r+")
    arrays = {name: group[name] for name in names}
    for (rank, rows, cols), result in zip(_regions(spec, ranks), results):
        host = model.to_host(spec.decomposition.model_state(getattr(result, "carried", result)))  # off the device once
        for name, array in arrays.items():
            array[index, rows, cols] = np.asarray(getattr(host, name))
    return len(ranks)


def write_derived_regions(spec, ranks, results, path, index, names):
    """Each rank of this worker writes the derived variables ``names`` of its region at time ``index`` (a worker task).

    They are computed by ``model.derived_output_block`` from the state
    fields already in the store (the cells beyond the block included).
    """
    import zarr

    model = on_worker(spec.model).with_backend("numpy")
    group = zarr.open_group(path, mode="r+")

    def read(field, rows, cols):
        return group[field].oindex[index, np.asarray(rows), np.asarray(cols)]

    for rank, rows, cols in _regions(spec, ranks):
        values = model.derived_output_block(read, rows, cols)
        for name in names:
            group[name][index, rows, cols] = values[name]
    return len(ranks)
