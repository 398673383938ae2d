"""Zarr snapshots of a partitioned particle run, written by the ranks with two-phase aggregation.

Particles are written by id, as MPI-IO's collective buffering writes: the
particle axis of the store is cut into chunks of :func:`chunk_length`
particles, and each rank *owns* a contiguous run of whole chunks
(:func:`writer_ranges`), so that no two ranks ever write one chunk. A
snapshot is then:

1. on the client, the store created (first snapshot) or extended along
   ``time`` (later ones) from a template of unwritten dask arrays,
   ``Dataset.to_zarr(compute=False)``: metadata, ``time``, ``step`` and the
   small coordinates (``axis``) only;
2. inside the epoch, at the snapshot's step (the engine's
   :meth:`~hpcgpu.partition.engine.PartitionedExecutor.request_on_ranks`,
   so the client waits for nothing), every rank takes its particles off the
   device once (``model.to_dataset`` of its block, in id order), tells every
   rank how many of its particles fall in that rank's id range (an
   allgather of P counts) and sends them there (the run's communicator,
   point to point, only to ranks that get some): the *exchange*;
3. each rank sorts what it received by id, checks that it holds every id
   of its range once, and queues the write of its chunks of the new time
   index on its worker's background thread (the bounded queue of
   :mod:`hpcgpu.io.writer_threads`); the next steps run while it writes. The
   first snapshot also writes the particle coordinate (``atom``,
   ``body``: 0 to N-1) this way.

Where the particles are does not matter: MD atoms migrate between bricks,
N-body bodies stay in their blocks, and the store is the same. Ids are
``state.ids`` (MD) or the block's place in the global order (all-pairs
bodies) and must be 0 to N-1, each once; the particle coordinate is the
particle's place in id order, as in the gathered ``to_dataset``.
``xarray.open_zarr`` sees the same variables, coordinates, attributes and
values as for a store written from the gathered state; only the chunks
differ. A failed write fails the next snapshot's epoch with the worker's
error, or :meth:`ParticleSnapshots.finish`.

Examples
--------
>>> chunk_length(1000, 4), writer_ranges(1000, 250, 4)
(250, [(0, 250), (250, 500), (500, 750), (750, 1000)])
>>> writer_ranges(5, 1, 3)
[(0, 1), (1, 3), (3, 5)]
"""

import math
import warnings
from dataclasses import dataclass
from time import perf_counter

import numpy as np

from hpcgpu.errors import ConfigError
from hpcgpu.io.rank_zarr import TIME_ATTRS
from hpcgpu.io.writer_threads import background_writes, finish_writes
from hpcgpu.partition.all_pairs import AllPairsDecomposition
from hpcgpu.partition.bricks import BrickDecomposition
from hpcgpu.partition.decomposition import on_worker

__all__ = ["MAX_CHUNK", "ParticleSnapshot", "ParticleSnapshots", "chunk_length", "particle_layout",
           "particle_writable", "template", "writer_ranges"]

MAX_CHUNK = 1 << 20
"""Particles per chunk at most (a chunk of positions in float64 is then 24 MiB)."""


def chunk_length(total, ranks):
    """Particles per chunk: one chunk per rank, at most :data:`MAX_CHUNK` (at least 1)."""
    return max(1, min(MAX_CHUNK, math.ceil(total / ranks)))


def writer_ranges(total, chunk, ranks):
    """The id range ``(first, stop)`` each rank writes: a contiguous run of whole chunks (possibly none)."""
    count = math.ceil(total / chunk)
    return [(min(total, (r * count // ranks) * chunk), min(total, ((r + 1) * count // ranks) * chunk))
            for r in range(ranks)]


def particle_writable(executor):
    """Whether the ranks of ``executor`` can write particle snapshots (a partitioned MD or all-pairs run)."""
    return (callable(getattr(executor, "request_on_ranks", None)) and callable(getattr(executor, "on_workers", None))
            and isinstance(getattr(executor, "decomposition", None), (AllPairsDecomposition, BrickDecomposition)))


def _block_ids(decomposition, rank, model, state):
    """The global ids of a rank's particles, sorted: the order of its ``to_dataset``."""
    if isinstance(decomposition, BrickDecomposition):
        return np.sort(model.backend.to_host(state.ids))
    first, stop = decomposition.bounds[rank]
    return np.arange(first, stop)


def _particle_dim(dataset):
    """The one dimension every data variable has (the particles'), or None."""
    common = None
    for variable in dataset.data_vars.values():
        common = set(variable.dims) if common is None else common & set(variable.dims)
    return next(iter(common)) if common is not None and len(common) == 1 else None


def particle_layout(spec, ranks, results):
    """``(schema, particle dimension, particles)`` of this worker's ranks (a worker task).

    ``schema`` is the model's ``to_dataset`` of the first rank's block at
    time 0, cut to no particle: variables, dims, dtypes and attributes. The
    dimension is None when the dataset has no one particle dimension (its
    snapshots are then gathered).
    """
    model = on_worker(spec.model)
    states = [spec.decomposition.model_state(getattr(result, "carried", result)) for result in results]
    dataset = model.to_dataset(states[0], time=0.0)
    dim = _particle_dim(dataset.isel(time=0, drop=True)) if "time" in dataset.dims else None
    if dim is None:
        return None, None, 0
    count = sum(_block_ids(spec.decomposition, rank, model, state).size for rank, state in zip(ranks, states))
    return dataset.isel({dim: slice(0, 0)}), dim, count


def template(schema, dim, total, chunk, time, step, names, attrs, first):
    """The snapshot's dataset: unwritten dask arrays chunked by ``chunk`` particles, and the small coordinates.

    The particle coordinate is in it (unwritten: the ranks write it) on the
    ``first`` snapshot only. Coordinates are those the gathered path keeps
    for ``names`` (those whose dims the variables have).
    """
    import dask.array as da
    import xarray as xr

    def shape_of(dims, with_dim):
        return tuple(with_dim if d == dim else schema.sizes[d] for d in dims)

    data = {}
    for name in names:
        variable = schema[name]
        dims = tuple(d for d in variable.dims if d != "time")
        data[name] = xr.Variable(("time", *dims), da.empty((1, *shape_of(dims, total)), dtype=variable.dtype,
                                                            chunks=(1, *shape_of(dims, chunk))), dict(variable.attrs))
    needed = {"time"}.union(*(v.dims for v in data.values()))
    coords = {}
    for name, coordinate in schema.coords.items():
        if name in ("time", "step") or not set(coordinate.dims) <= needed:
            continue
        if dim in coordinate.dims:
            if first and coordinate.dims == (dim,):
                coords[name] = xr.Variable(coordinate.dims, da.empty(shape_of(coordinate.dims, total),
                                                                      dtype=coordinate.dtype,
                                                                      chunks=shape_of(coordinate.dims, chunk)),
                                           dict(coordinate.attrs))
        else:
            coords[name] = xr.Variable(coordinate.dims, coordinate.values, dict(coordinate.attrs))
    time_attrs = dict(schema["time"].attrs) if "time" in schema.coords else dict(TIME_ATTRS)
    coords["time"] = xr.Variable(("time",), np.array([float(time)]), time_attrs)
    coords["step"] = xr.Variable(("time",), np.array([int(step)]))
    # no indexes: the particle coordinate stays an unwritten dask array (an index would compute it here)
    return xr.Dataset(data, coords=xr.Coordinates(coords, indexes={}), attrs=attrs)


@dataclass(frozen=True)
class ParticleSnapshot:
    """One snapshot's work on every rank: the exchange by id range, then the write of the rank's chunks (queued).

    Called by the engine inside the epoch (``task(context, state)``).
    """

    path: str
    index: int  # the snapshot's place along ``time``
    names: tuple  # the variables to write
    dim: str
    total: int
    chunk: int
    coordinates: tuple = ()  # the particle coordinates to write (the first snapshot's)
    what = "a particle snapshot"

    def __call__(self, context, state):
        writes = background_writes(self.path)
        writes.check()  # an earlier snapshot's failed write fails this epoch, with its error
        model, comm, rank = context.model, context.comm, context.rank
        dataset = model.to_dataset(state)  # the one copy off the device, in id order
        ids = _block_ids(context.decomposition, rank, model, state)
        if ids.size != dataset.sizes.get(self.dim, 0):
            raise ConfigError(f"particle snapshot: rank {rank} holds {ids.size} particle ids and "
                              f"{dataset.sizes.get(self.dim, 0)} {self.dim!r} entries; they must match")
        ranges = writer_ranges(self.total, self.chunk, context.size)
        cuts = [int(np.searchsorted(ids, first)) for first, _ in ranges] + [ids.size]
        counts = comm.allgather([cuts[w + 1] - cuts[w] for w in range(context.size)])
        axes = {name: dataset[name].dims.index(self.dim) for name in self.names}

        def part(w):
            cut = slice(cuts[w], cuts[w + 1])
            # copies: the write runs while the next steps change the rank's arrays
            return {"ids": ids[cut].copy(), **{name: np.take(dataset[name].values, np.arange(cut.start, cut.stop),
                                                              axis=axes[name]) for name in self.names}}

        sends = {w: part(w) for w in range(context.size) if w != rank and counts[rank][w]}
        sources = [s for s in range(context.size) if s != rank and counts[s][rank]]
        received = comm.exchange(sends, sources, tag=("particle-snapshot", self.index)) if context.size > 1 else {}
        parts = [received[s] if s != rank else part(rank) for s in range(context.size) if counts[s][rank]]
        first, stop = ranges[rank]
        if stop == first:
            return
        held = np.concatenate([p["ids"] for p in parts])
        order = np.argsort(held, kind="stable")
        if held.size != stop - first or not np.array_equal(held[order], np.arange(first, stop)):
            raise ConfigError(f"particle snapshot: rank {rank} writes ids {first} to {stop - 1} but received "
                              f"{held.size} ids there; particle ids must be 0 to {self.total - 1}, each once")
        values = {name: np.take(np.concatenate([p[name] for p in parts], axis=axes[name]), order, axis=axes[name])
                  for name in self.names}
        writes.submit(lambda: _write_chunks(self, rank, first, stop, values, axes, writes))


def _write_chunks(snapshot, rank, first, stop, values, axes, writes):
    """Write one rank's particles ``first:stop`` of every variable at the snapshot's time index (background)."""
    import zarr

    started, size = perf_counter(), 0
    group = zarr.open_group(snapshot.path, mode="r+")
    for name, array in values.items():
        key = [snapshot.index] + [slice(None)] * array.ndim
        key[axes[name] + 1] = slice(first, stop)
        group[name][tuple(key)] = array
        size += array.nbytes
    for name in snapshot.coordinates:
        group[name][first:stop] = np.arange(first, stop, dtype=group[name].dtype)
    writes.timings.append({"rank": rank, "bytes": size, "seconds": perf_counter() - started})


class ParticleSnapshots:
    """The rank-written snapshots of one store of a particle run: metadata on the client, particles by the ranks.

    Parameters
    ----------
    path : str
        The store (absolute: the workers write to it).
    """

    def __init__(self, path):
        self.path = path
        self._layout = None  # (schema, particle dim, total particles), asked of the ranks once

    def layout(self, executor):
        """``(schema, dim, total)`` of the run (one round trip to the workers, the first time); dim None: gather."""
        if self._layout is None:
            found = list(executor.on_workers(particle_layout, phase="snapshot-layout").values())
            schema, dim = found[0][0], found[0][1]
            self._layout = (schema, dim, sum(count for _, _, count in found))
        return self._layout

    def write(self, executor, first, time, step, names, attrs):
        """Queue one snapshot of the run of ``executor``, written by its ranks after the steps queued so far.

        ``first`` creates the store, otherwise the snapshot is appended.
        """
        schema, dim, total = self.layout(executor)
        chunk = chunk_length(total, executor.partitions)
        coordinates = tuple(name for name, c in schema.coords.items() if c.dims == (dim,)) if first else ()
        dataset = template(schema, dim, total, chunk, time, step, names, attrs, first)
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*[Cc]onsolidated metadata.*")
            if first:
                dataset.to_zarr(self.path, mode="w", consolidated=True, compute=False)
            else:
                dataset.to_zarr(self.path, append_dim="time", consolidated=True, compute=False)
        index = _time_length(self.path) - 1
        executor.request_on_ranks(ParticleSnapshot(self.path, index, tuple(names), dim, total, chunk,
                                                   tuple(c for c in coordinates if c in dataset.coords)))

    def finish(self, executor):
        """Wait until every queued write is done; raise the first failed one.

        Returns each rank's writes since the store's last finish:
        ``[{"rank", "bytes", "seconds"}]`` per snapshot.
        """
        done = executor.on_workers(finish_writes, self.path, phase="snapshot-finish")
        return sorted((timing for timings in done.values() for timing in timings), key=lambda t: t["rank"])


def _time_length(path):
    import zarr

    return zarr.open_group(path, mode="r")["time"].shape[0]
