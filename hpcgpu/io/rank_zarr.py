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
2. inside the epoch, at the snapshot's step (the engine's
   :meth:`~hpcgpu.partition.engine.PartitionedExecutor.request_on_ranks`,
   so the client waits for nothing and the epochs behind it keep
   flowing), every rank copies the owned cells of the state fields off the
   device once and queues their write into its region of the new time
   index on its worker's background thread (:class:`GridSnapshot`);
3. at the next snapshot (or at :meth:`RankSnapshots.finish`), once every
   rank's fields are in the store (each rank waits for its worker's writes,
   then a barrier), every rank computes the derived variables of its region
   (e.g. the weather model's vorticity, which reads one column and one row
   beyond the block) from the fields in the store, and writes them.

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
from dataclasses import dataclass
from dataclasses import fields as dataclass_fields
from time import perf_counter

import numpy as np

from hpcgpu.io.writer_threads import background_writes, finish_writes, wait_writes
from hpcgpu.partition.decomposition import on_worker, rank_cache
from hpcgpu.rank_checkpoints import writes_pieces

__all__ = ["INNER_CHUNK", "SMALL_CHUNK", "TIME_ATTRS", "GridSnapshot", "RankSnapshots", "block_chunks", "chunk_size",
           "index_runs", "inner_chunks", "rank_writable", "read_cells", "template", "write_derived_regions",
           "write_field_regions"]

SMALL_CHUNK = 8
"""Chunks narrower than this (cells, along y or x) draw a warning: the blocks share no larger divisor."""
SPARE_KEY = "snapshot-host-copy"
"""Where a rank's cache holds a host copy of its cells that no queued write reads any more (the next copy's memory)."""
TIME_ATTRS = {"units": "s", "long_name": "model time"}
"""The attributes of the ``time`` coordinate (as the grid models' ``to_dataset`` gives them)."""


def snapshot_encoding(dataset, shards=None):
    """Zarr encoding of a snapshot's variables: Blosc LZ4 with byte shuffle (the first write of a store).

    ``shards`` (one length per dimension of the variables, e.g. a rank
    block's ``(1, rows, cols)``), when given, makes each variable a Zarr v3
    sharded array: a shard is what one rank writes whole, and readers
    fetch its inner chunks (:func:`inner_chunks`) one by one.

    Zarr's default (Zstandard) took 0.28 s to write a 4096^2 float32
    field here and stored it in 46 MB; LZ4 after a byte shuffle took 0.11 s
    for 41 MB. A snapshot is compressed while the run steps (on a worker's
    background thread, or on the client), so its CPU time is stepping time
    on a busy node.

    Examples
    --------
    >>> import numpy as np, xarray as xr
    >>> encoding = snapshot_encoding(xr.Dataset({"h": ("x", np.ones(4))}, coords={"x": np.arange(4.0)}))
    >>> list(encoding), type(encoding["h"]["compressors"][0]).__name__
    (['h'], 'BloscCodec')
    >>> {k: v for k, v in snapshot_encoding(xr.Dataset({"h": ("x", np.ones(2048))}), (2048,))["h"].items()
    ...  if k != "compressors"}
    {'shards': (2048,), 'chunks': (512,)}
    """
    from zarr.codecs import BloscCodec

    encoding = {name: {"compressors": [BloscCodec(cname="lz4", clevel=5, shuffle="shuffle")]}
                for name in dataset.data_vars}
    if shards is not None and tuple(inner_chunks(shards)) != tuple(shards):
        for name in encoding:
            encoding[name].update(shards=tuple(shards), chunks=inner_chunks(shards))
    return encoding


INNER_CHUNK = 512
"""Cells per side of a sharded store's inner chunks at most (1 MiB of float32 in 2-D): what a reader fetches."""


def inner_chunks(shard, most=None):
    """The inner chunk shape of ``shard``: along each axis the largest divisor of its length up to ``most``.

    ``most`` defaults to :data:`INNER_CHUNK`.

    An axis whose largest such divisor is under an eighth of ``most`` (a
    length with no small factors) is left whole: thin chunks read slower
    than whole shards.

    Examples
    --------
    >>> inner_chunks((1, 2048, 4096)), inner_chunks((1, 24, 1031))
    ((1, 512, 512), (1, 24, 1031))
    """
    most = INNER_CHUNK if most is None else most

    def along(length):
        if length <= most:
            return length
        best = max(d for d in range(1, most + 1) if length % d == 0)
        return best if best >= most // 8 else length

    return tuple(along(int(length)) for length in shard)


def chunk_size(bounds):
    """The largest chunk length that divides every block of ``bounds`` (``[(start, stop), ...]`` along one axis)."""
    return math.gcd(*(int(edge) for pair in bounds for edge in pair))


def block_chunks(decomposition):
    """``(1, rows, cols)``: the largest piece of a snapshot that divides every block (a chunk, or a shard)."""
    return (1, chunk_size(decomposition.y_bounds), chunk_size(decomposition.x_bounds))


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
    if getattr(model, "field_names", None) is None:
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
    chunks = block_chunks(decomposition)
    if min(chunks[1:]) < SMALL_CHUNK:
        warnings.warn(f"Zarr output: chunks of {chunks[1]} x {chunks[2]} cells, the largest that divide every "
                      f"block (rows {decomposition.y_bounds}, columns {decomposition.x_bounds}); many small "
                      "chunks write slowly: a grid whose blocks share a larger divisor writes faster",
                      RuntimeWarning, stacklevel=3)
    variables = model.output_variables()
    data = {name: (("time", *variables[name][0]), da.empty((1, ny, nx), dtype=variables[name][1], chunks=chunks),
                   dict(variables[name][2])) for name in names}
    coords = dict(model.output_coords())
    coords["time"] = ("time", np.array([float(time)]), dict(TIME_ATTRS))
    coords["step"] = ("time", np.array([int(step)]))
    return xr.Dataset(data, coords=coords, attrs=attrs)


class RankSnapshots:
    """The rank-written snapshots of one store: metadata on the client, regions on background threads of the workers.

    Each worker writes on one background thread per store, fed by a
    bounded queue (:mod:`hpcgpu.io.writer_threads`; a full queue makes
    the next snapshot wait): the ranks copy their owned cells off the device once,
    queue the write and return, so the next steps run while the snapshot
    is written. That work runs inside the epoch (:class:`GridSnapshot`),
    so a snapshot drains no epoch pipeline: the client only lengthens the
    store's arrays. The derived variables of a snapshot read cells of
    other ranks from the store: they are queued at the next snapshot (or at
    :meth:`finish`), once every rank's fields are written. A failed write
    fails the next snapshot's epoch, or raises in :meth:`finish`, with the
    worker's error.

    Parameters
    ----------
    path : str
        The store.
    """

    def __init__(self, path):
        self.path = path
        self._derived = None  # (time index, names) of the last snapshot: its derived variables still to write
        self._derived_before = {}  # time index -> what _derived was before that snapshot was queued

    def write(self, executor, model, first, time, step, names, attrs):
        """Queue one snapshot of the run of ``executor``, written by its ranks after the steps queued so far.

        ``first`` creates the store, otherwise it is appended.
        """
        if first:
            ds = template(model, executor.decomposition, time, step, names, attrs)
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", message=".*[Cc]onsolidated metadata.*")
                # shards aligned with the blocks: each rank writes whole shards, readers fetch inner chunks
                ds.to_zarr(self.path, mode="w", consolidated=True, compute=False,
                           encoding=snapshot_encoding(ds, block_chunks(executor.decomposition)))
            index = 0
        else:
            # the store's arrays one longer along time: a tenth of what xarray's append of a template costs
            index = extend_time(self.path, time, step)
        fields = tuple(name for name in names if name in model.field_names)
        derived = tuple(name for name in names if name not in model.field_names)
        executor.request_on_ranks(GridSnapshot(self.path, index, fields, self._derived, bool(derived)))
        self._derived_before[index] = self._derived
        self._derived = (index, derived) if derived else None

    def discard_from(self, index):
        """Forget the snapshots queued at time ``index`` and later: the ranks never ran them (a failed check).

        The derived variables they would have written for the snapshot
        before them are written by :meth:`finish` instead.
        """
        if index in self._derived_before:
            self._derived = self._derived_before[index]
        self._derived_before = {at: before for at, before in self._derived_before.items() if at < index}

    def finish(self, executor):
        """Wait until every queued write is done (derived variables included); raise the first failed one.

        Returns each rank's state-field writes since the store's last
        finish: ``[{"rank", "bytes", "seconds"}]`` per snapshot.
        """
        self._queue_derived(executor)
        self._derived_before = {}
        done = executor.on_workers(finish_writes, self.path, phase="snapshot-finish")
        return sorted((timing for timings in done.values() for timing in timings), key=lambda t: t["rank"])

    def _queue_derived(self, executor):
        if self._derived is None:
            return
        index, names = self._derived
        self._derived = None
        # every rank's fields of that snapshot written (and their errors raised) before any rank reads them
        executor.on_workers(wait_writes, self.path, phase="snapshot-wait")
        session_id = getattr(getattr(executor, "session", None), "id", None)
        executor.on_workers(queue_derived_regions, self.path, index, names, session_id, phase="snapshot-derived")


@dataclass(frozen=True)
class GridSnapshot:
    """One snapshot's work on every rank of a grid run: the previous snapshot's derived variables, then its fields.

    Called by the engine inside the epoch (``task(context, state)``). The
    derived variables of the previous snapshot (``derived``: its time
    index and names, or None) read other ranks' cells from the store, so
    each rank first waits for its worker's queued writes and then for every
    rank (a barrier); those writes had the steps since that snapshot to
    run. Then the rank copies its owned cells (the one copy off the
    device) and queues the writes on its worker's background thread: the
    next steps run while it writes.

    Examples
    --------
    >>> GridSnapshot("/tmp/run.zarr", 2, ("h", "u", "v"), (1, ("vorticity",))).what
    'a grid snapshot'
    """

    path: str
    index: int  # the snapshot's place along ``time``
    fields: tuple  # the state fields to write
    derived: tuple = None  # (time index, names) of the previous snapshot's derived variables still to write
    keeps_copy: bool = True  # the host copy is held for this snapshot's own derived variables (written next time)
    what = "a grid snapshot"

    def __call__(self, context, state):
        writes = background_writes(self.path)
        rank = context.rank
        region = context.decomposition.piece_region(rank)
        rows, cols = slice(*region["rows"]), slice(*region["cols"])
        derived = None
        if self.derived is None:
            writes.check()  # an earlier snapshot's failed write fails this epoch, with its error
        else:
            writes.wait()  # this worker's writes, the previous snapshot's fields among them (raises a failed one)
            context.comm.barrier()  # and every other worker's: the derived variables read across the blocks
            index, names = self.derived
            # the rank's own cells of that snapshot from its host copy, kept for this: only the cells
            # beyond the block are read back from the store
            held = writes.held.pop(rank, None)
            derived = (context.model.with_backend("numpy"), index, names,
                       held[1] if held is not None and held[0] == index else None)
        # free host copies of this rank's cells live in its cache, for the session: snapshot after snapshot,
        # and store after store (a run resumed, a writer's next run), each copy goes to memory already mapped
        spares = context.cache
        host = _host_copy(context.model, state, spares.pop(SPARE_KEY, None))
        copies = [(rank, rows, cols, host)] if self.fields else []
        keeps_copy = bool(self.fields) and self.keeps_copy
        if keeps_copy:
            writes.held[rank] = (self.index, host)
        path, index, fields = self.path, self.index, self.fields

        def job():
            if derived is not None:
                model, at, names, own = derived
                write_derived_regions(model, path, at, names, [(rows, cols)], [own])
                if own is not None:
                    spares[SPARE_KEY] = own  # read for the last time: the next snapshot copies into it
            if copies:
                write_field_regions(path, index, fields, copies)
                if not keeps_copy:
                    spares[SPARE_KEY] = host

        writes.submit(job)


def extend_time(path, time, step):
    """Lengthen every array along ``time`` of the store at ``path`` by one; returns the new time index.

    The new entry's ``time`` and ``step`` coordinates are written; the
    variables' new cells hold the fill value until the ranks write them.
    The consolidated metadata is written again.
    """
    import zarr

    group = zarr.open_group(path, mode="r+", use_consolidated=False)  # the arrays' own metadata, not the summary
    index = group["time"].shape[0]
    for _, array in group.arrays():
        dims = getattr(array.metadata, "dimension_names", None) or array.attrs.get("_ARRAY_DIMENSIONS")
        if dims and dims[0] == "time":
            array.resize((index + 1, *array.shape[1:]))
    group["time"][index] = float(time)
    group["step"][index] = int(step)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*[Cc]onsolidated metadata.*")
        zarr.consolidate_metadata(path)
    return index


def _time_length(path):
    import zarr

    return zarr.open_group(path, mode="r")["time"].shape[0]


def _regions(spec, ranks):
    for rank in ranks:
        region = spec.decomposition.piece_region(rank)
        yield rank, slice(*region["rows"]), slice(*region["cols"])


def _host_copy(model, state, into=None):
    """The owned cells of ``state`` as NumPy arrays of their own: copied off the device once, or copied in host
    memory when they are views of the rank's live block (that the next steps overwrite).

    ``into`` (a host state no one reads any more, or None) lends its
    arrays to the copies in host memory where shapes and types match:
    fresh arrays of a snapshot's size cost more than the copy itself here
    (0.16 s against 0.015 s for three 2048 x 4096 float32 fields), as the
    kernel hands over and zeroes every page anew.
    """
    host = model.to_host(state)
    copies = []
    for field in dataclass_fields(host):
        live, cells = getattr(state, field.name), getattr(host, field.name)
        if not isinstance(live, np.ndarray):
            copies.append(np.asarray(cells))  # to_host copied it off the device: already the rank's own
            continue
        spare = getattr(into, field.name, None)
        if isinstance(spare, np.ndarray) and spare.shape == cells.shape and spare.dtype == cells.dtype:
            np.copyto(spare, cells)
            copies.append(spare)
        else:
            copies.append(np.array(cells))
    return type(host)(*copies)


def write_field_regions(path, index, names, copies):
    """Write the state fields ``names`` of ``copies`` (``[(rank, rows, cols, host state)]``) at time ``index``.

    Each rank's bytes and seconds are kept (``timings``: :func:`finish_writes` returns them).
    """
    import zarr

    arrays = _writable_arrays(zarr.open_group(path, mode="r+"), names)
    for rank, rows, cols, host in copies:
        started, size = perf_counter(), 0
        for name, array in arrays.items():
            values = getattr(host, name)
            _write_region(array, index, rows, cols, values)
            size += values.nbytes
        background_writes(path).timings.append({"rank": rank, "bytes": size, "seconds": perf_counter() - started})


def queue_derived_regions(spec, ranks, results, path, index, names, session_id=None):
    """Each rank of this worker queues the write of its region's derived variables at time ``index`` (a worker task).

    The host copies they read go back to the ranks' caches of session
    ``session_id`` (when given) for the next snapshot to copy into.
    """
    model = on_worker(spec.model).with_backend("numpy")
    writes = background_writes(path)
    regions = [(rows, cols) for _, rows, cols in _regions(spec, ranks)]
    held = [writes.held.pop(rank, None) for rank in ranks]
    hosts = [h[1] if h is not None and h[0] == index else None for h in held]

    def job():
        write_derived_regions(model, path, index, names, regions, hosts)
        for rank, host in zip(ranks, hosts):
            if host is not None and session_id is not None:
                rank_cache(session_id, rank)[SPARE_KEY] = host

    writes.submit(job)
    return len(ranks)


def write_derived_regions(model, path, index, names, regions, hosts=None):
    """Write the derived variables ``names`` of ``regions`` at time ``index``.

    They are computed by ``model.derived_output_block`` from the state
    fields at that time: the region's own cells from ``hosts`` (per
    region, its host state of that snapshot, or None) where given, every
    other cell (those beyond the region) read from the store.
    """
    import zarr

    group = zarr.open_group(path, mode="r+")
    opened = {}  # the fields read, each opened once (its metadata is a file read)
    arrays = _writable_arrays(group, names)
    for (rows, cols), host in zip(regions, hosts or [None] * len(regions)):

        def read(field, row_index, col_index, rows=rows, cols=cols, host=host):
            if field not in opened:
                opened[field] = group[field]
            return read_cells(opened[field], index, row_index, col_index,
                              None if host is None else (rows, cols, getattr(host, field)))

        values = model.derived_output_block(read, rows, cols)
        for name in names:
            _write_region(arrays[name], index, rows, cols, values[name])


def _writable_arrays(group, names):
    """The arrays ``names`` of the Zarr ``group``, set to write every chunk they are given.

    Zarr skips a chunk that holds only the fill value, and finds out by
    comparing every cell (a third of a snapshot's write time here): a
    snapshot's chunks are never all fill, so every one is written unread.
    """
    return {name: group[name].with_config({"write_empty_chunks": True}) for name in names}


def _write_region(array, index, rows, cols, values):
    """``array[index, rows, cols] = values``, given as the whole piece (time axis included): Zarr then encodes
    a whole shard or chunk from ``values`` itself, with no copy into a fresh chunk first."""
    array[index:index + 1, rows, cols] = values[np.newaxis]


def index_runs(indices, cuts=()):
    """``[(start, stop), ...]``: the runs of consecutive values of ``indices``, in order, also cut at ``cuts``.

    Examples
    --------
    >>> index_runs([7, 0, 1, 2, 3]), index_runs([1, 2, 3, 4], cuts=(3,))
    ([(7, 8), (0, 4)], [(1, 3), (3, 5)])
    """
    indices = np.asarray(indices, dtype=np.int64)
    if indices.size == 0:
        return []
    breaks = np.flatnonzero((np.diff(indices) != 1) | np.isin(indices[1:], cuts)) + 1
    return [(int(run[0]), int(run[-1]) + 1) for run in np.split(indices, breaks)]


def read_cells(array, index, rows, cols, local=None):
    """The cells ``rows`` x ``cols`` (index sequences) of a Zarr array at time ``index``, read run by run.

    Zarr's orthogonal indexing with integer arrays handles every index
    on its own; a block with a wrapped neighbour row is a few contiguous
    runs, each read as a slice of the chunks it touches. ``local``
    (``(row slice, column slice, values)``: a block's own cells at that
    time, in memory) serves the cells it holds without reading them; cells
    that are all in ``local`` come back as a view of it (read-only use).

    Examples
    --------
    >>> cells = np.arange(24.0).reshape(1, 4, 6)
    >>> read_cells(cells, 0, [3, 0, 1], [5, 0])
    array([[23., 18.],
           [ 5.,  0.],
           [11.,  6.]])
    >>> read_cells(cells, 0, [3, 0], [0, 1], (slice(0, 2), slice(0, 2), -cells[0, :2, :2]))
    array([[18., 19.],
           [-0., -1.]])
    """
    cuts = ((), ()) if local is None else ((local[0].start, local[0].stop), (local[1].start, local[1].stop))

    def piece(r0, r1, c0, c1):
        if local is not None and cuts[0][0] <= r0 and r1 <= cuts[0][1] and cuts[1][0] <= c0 and c1 <= cuts[1][1]:
            return local[2][r0 - cuts[0][0]:r1 - cuts[0][0], c0 - cuts[1][0]:c1 - cuts[1][0]]
        return array[index, r0:r1, c0:c1]

    pieces = [[piece(r0, r1, c0, c1) for c0, c1 in index_runs(cols, cuts[1])] for r0, r1 in index_runs(rows, cuts[0])]
    # one piece (a block's own cells) is handed over as it is, a view of ``local`` included: not joined into a copy
    return pieces[0][0] if len(pieces) == 1 and len(pieces[0]) == 1 else np.block(pieces)
