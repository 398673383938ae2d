"""Output writers: fields and diagnostics to Zarr through xarray.

Zarr is read natively by xarray, dask and the weather community's tools
(``xarray.open_zarr(path)``). A :class:`ZarrWriter` appends one snapshot of
the model's fields along ``time`` each time its schedule fires, and writes
the run's diagnostics time series into the group ``diagnostics`` when the
run stops.

Examples
--------
>>> import tempfile, xarray as xr
>>> from hpcgpu import Simulation
>>> from hpcgpu.schedules import Every
>>> from hpcgpu.workloads.weather import ShallowWater
>>> path = tempfile.mkdtemp() + "/run.zarr"
>>> sim = Simulation(ShallowWater("gravity_wave", nx=16, ny=8, backend="numpy"), stop_steps=4,
...                  progress=False)
>>> _ = sim.add_writer(ZarrWriter(path, Every(2))).run()
>>> xr.open_zarr(path).sizes["time"]
3
"""

import os
import shutil
import warnings

from hpcgpu.errors import ConfigError
from hpcgpu.schedules import as_schedule

__all__ = ["ZarrWriter", "open_output"]


class ZarrWriter:
    """Append snapshots of the model's fields to a Zarr store on a schedule.

    Parameters
    ----------
    path : str or os.PathLike
        Directory of the Zarr store. An existing store is replaced when
        ``overwrite`` is true, otherwise writing to it raises ConfigError.
    schedule : int or Schedule
        When to write (an int means every N steps). Step 0 is included.
    fields : sequence of str, optional
        Variables of ``model.to_dataset`` to keep (default: all).
    diagnostics : bool
        Also write the diagnostics time series (group ``diagnostics``) at the
        end of each run.
    overwrite : bool
    append : bool
        Continue an existing store (a run resumed from a checkpoint):
        snapshots are appended, and those of steps the store already holds
        (written after the checkpoint, before the run stopped) are not
        written twice.

    Notes
    -----
    A writer serves one run: :meth:`hpcgpu.Simulation.add_writer` refuses one
    that wrote for another simulation, except a simulation resumed from that
    one's checkpoints, which continues the store as ``append`` does (steps
    already written are not written again).

    On a partitioned grid run whose model describes its output
    (``output_coords``, ``output_variables``; the weather model does), the
    ranks write their regions of each snapshot on background threads of
    their workers and the client only metadata and coordinates
    (:mod:`hpcgpu.io.rank_zarr`); the store must then be on a file system
    every worker sees. :meth:`flush` (called by :meth:`close` and before
    each checkpoint) waits for those writes and raises a failed one's
    error. On a partitioned particle run (MD bricks, all-pairs N-body) the
    ranks exchange their particles by id range and each writes whole chunks
    of the particle axis (:mod:`hpcgpu.io.particle_zarr`). Other runs
    gather the state to the client and write it there.
    """

    def __init__(self, path, schedule, *, fields=None, diagnostics=True, overwrite=True, append=False):
        self.path = os.fspath(path)
        self.schedule = as_schedule(schedule)
        self.fields = None if fields is None else tuple(fields)
        self.diagnostics = diagnostics
        self.overwrite = overwrite
        self.snapshots = 0
        self._last_step = None
        self._warned_layout = False
        self._rank_snapshots = None  # the ranks' queued writes of a partitioned grid run
        self._particles = None  # a partitioned particle run's: the run's layout, asked of the ranks once
        self._particles_queued = False  # snapshots queued on the ranks since the last flush
        self._pending_on = None  # the executor whose ranks still write snapshots (since the last flush)
        self._queued = []  # (step, snapshots before it, last step before it) of each queued on ranks since the flush
        self._alignment = (None, None)  # (executor, whether its blocks cover whole chunks of the store)
        if append and os.path.exists(self.path):
            import xarray as xr

            stored = xr.open_zarr(self.path)
            self.snapshots = stored.sizes.get("time", 0)
            self._last_step = int(stored["step"].max()) if "step" in stored.coords and self.snapshots else None
        elif os.path.exists(self.path):
            if not overwrite:
                raise ConfigError(f"path {self.path!r} exists; pass overwrite=True or another path")
            # overwrite replaces a Zarr store (an earlier run's), never a file or a folder of other data
            if not _replaceable(self.path):
                raise ConfigError(f"path {self.path!r} exists and is not a Zarr store (a file, or a folder "
                                  "holding other files); ZarrWriter would delete it: give another path")
        self._written = (self.snapshots, self._last_step)  # snapshots and last step known to be whole in the store

    def write(self, simulation):
        """Append the current state of ``simulation``."""
        self._rewind_lost(simulation)
        if self._last_step is not None and simulation.step <= self._last_step:
            return  # already in the store (written before the run was resumed)
        if self._write_by_ranks(simulation) or self._write_particles_by_ranks(simulation):
            return
        ds = simulation.model.to_dataset(simulation.state, time=simulation.time)
        ds = ds.assign_coords(step=("time", [simulation.step]))
        if self.fields is not None:
            missing = set(self.fields) - set(ds.data_vars)
            if missing:
                raise ConfigError(f"fields {sorted(missing)} are not outputs of {simulation.model!r}; "
                                  f"valid: {sorted(ds.data_vars)}")
            ds = ds[list(self.fields)]
        ds.attrs["run_name"] = simulation.name
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*[Cc]onsolidated metadata.*")
            if self.snapshots == 0:
                if os.path.exists(self.path):
                    shutil.rmtree(self.path)
                from hpcgpu.io.rank_zarr import snapshot_encoding

                ds.to_zarr(self.path, mode="w", consolidated=True, encoding=snapshot_encoding(ds))
            else:
                ds.to_zarr(self.path, append_dim="time", consolidated=True)
        self.snapshots += 1
        self._written = (self.snapshots, simulation.step)
        # a run that goes back to a checkpoint (a resume with this writer, a restart after a lost
        # worker) steps through these steps again: they are in the store already
        self._last_step = simulation.step

    def _write_by_ranks(self, simulation):
        """On a partitioned grid run, the ranks write their regions (:mod:`hpcgpu.io.rank_zarr`); False otherwise."""
        from hpcgpu.io import rank_zarr

        model, executor = simulation.model, simulation.executor
        if not rank_zarr.rank_writable(model, executor, self.fields):
            return False
        names = self._grid_names(model)
        first = self.snapshots == 0
        if not first and not self._aligned(executor, names[0]):
            # a run resumed on another layout: two ranks would write one chunk at once (a lost update)
            if not self._warned_layout:
                warnings.warn(f"Zarr output {self.path}: the store's chunks do not align with this run's blocks "
                              "(resumed on another number of ranks or process grid), so its snapshots are "
                              "gathered and written by the client", RuntimeWarning, stacklevel=3)
                self._warned_layout = True
            return False
        if first and os.path.exists(self.path):
            shutil.rmtree(self.path)
        if first:
            self._alignment = (executor, True)  # the store is made now, chunked by these blocks
        if self._rank_snapshots is None:
            # absolute: a worker's working directory need not be the client's
            self._rank_snapshots = rank_zarr.RankSnapshots(os.path.abspath(self.path))
        self._queued.append((simulation.step, self.snapshots, self._last_step))
        self._rank_snapshots.write(executor, model, first, simulation.time, simulation.step, names,
                                   {**model.attributes(), "run_name": simulation.name})
        self._pending_on = executor
        self.snapshots += 1
        self._last_step = simulation.step
        return True

    def _write_particles_by_ranks(self, simulation):
        """On a partitioned particle run, the ranks write the particles by id (:mod:`hpcgpu.io.particle_zarr`).

        False otherwise, and for a model whose dataset has no one particle dimension.
        """
        from hpcgpu.io import particle_zarr

        executor = simulation.executor
        if not particle_zarr.particle_writable(executor):
            return False
        if not isinstance(self._particles, particle_zarr.ParticleSnapshots):
            # absolute: a worker's working directory need not be the client's
            self._particles = particle_zarr.ParticleSnapshots(os.path.abspath(self.path))
        schema, dim, _ = self._particles.layout(executor)
        if dim is None:
            return False
        names = list(schema.data_vars)
        if self.fields is not None:
            missing = set(self.fields) - set(names)
            if missing:
                raise ConfigError(f"fields {sorted(missing)} are not outputs of {simulation.model!r}; "
                                  f"valid: {sorted(names)}")
            names = [name for name in names if name in self.fields]
        first = self.snapshots == 0
        if first and os.path.exists(self.path):
            shutil.rmtree(self.path)
        self._queued.append((simulation.step, self.snapshots, self._last_step))
        self._particles.write(executor, first, simulation.time, simulation.step, names,
                              {**_attributes(simulation.model, schema), "run_name": simulation.name})
        self._particles_queued = True
        self._pending_on = executor
        self.snapshots += 1
        self._last_step = simulation.step
        return True

    def flush(self, simulation):
        """Wait until the snapshots the ranks still write are in the store; raise a failed write's error.

        :meth:`close` and every checkpoint of ``simulation`` call it.
        """
        self._rewind_lost(simulation)
        if self._rank_snapshots is not None:
            rank_snapshots, self._rank_snapshots = self._rank_snapshots, None
            rank_snapshots.finish(simulation.executor)
        if self._particles_queued:
            self._particles_queued = False
            self._particles.finish(simulation.executor)
        self._pending_on, self._queued = None, []
        self._written = (self.snapshots, self._last_step)

    def writes_behind_checks(self, simulation):
        """Whether the next :meth:`write` only queues the snapshot on the ranks of ``simulation``'s partitioned run.

        The ranks run it behind the health check of its step, and stop at
        that check if it fails: the driver goes on stepping instead of
        waiting for the check first (which would empty the queue of
        epochs at every snapshot), and a failed check takes the snapshot
        back out (:meth:`discard_from`).
        """
        from hpcgpu.io import particle_zarr, rank_zarr

        executor = simulation.executor
        if self._pending_on is not None and self._pending_on is not executor:
            return False  # a restart after a lost worker: the writes of the old ranks are dropped first
        if rank_zarr.rank_writable(simulation.model, executor, self.fields):
            names = self._grid_names(simulation.model)  # a field it lacks: write() raises the ConfigError
            return self.snapshots == 0 or self._aligned(executor, names[0])
        # particles: once the first snapshot asked the ranks for the run's layout
        return (isinstance(self._particles, particle_zarr.ParticleSnapshots) and self._particles_queued
                and particle_zarr.particle_writable(executor))

    def discard_from(self, simulation, step):
        """Take the snapshots of ``step`` and later out of the store, and finish writing the ones before.

        Called by :class:`~hpcgpu.Simulation` after a health check failed
        at ``step``: the ranks stopped at that check, before the snapshots
        queued behind it (:meth:`writes_behind_checks`), so those hold no
        values and are cut along ``time``. A failed write of an earlier
        snapshot is reported as a warning (the failed check is the error).
        """
        dropped = [entry for entry in self._queued if entry[0] >= step]
        if dropped:
            _, count, last_step = dropped[0]
            self._queued = [entry for entry in self._queued if entry[0] < step]
            if self._rank_snapshots is not None:
                self._rank_snapshots.discard_from(count)
            _cut_time(self.path, count)
            self.snapshots, self._last_step = count, last_step
        try:
            self.flush(simulation)  # the derived variables of the last snapshot kept, as close() would
        except Exception as error:  # noqa: BLE001 - reported beside the failed check, which is raised
            warnings.warn(f"Zarr output {self.path}: a snapshot before the failed check at step {step} was not "
                          f"written whole: {error}", RuntimeWarning, stacklevel=2)

    def _grid_names(self, model):
        """The output variables of a grid model this writer keeps (all, or ``fields``; an unknown one is an error)."""
        names = list(model.output_variables())
        if self.fields is not None:
            missing = set(self.fields) - set(names)
            if missing:
                raise ConfigError(f"fields {sorted(missing)} are not outputs of {model!r}; valid: {sorted(names)}")
            names = [name for name in names if name in self.fields]
        return names

    def _aligned(self, executor, name):
        """Whether the blocks of ``executor`` cover whole chunks of ``name`` in the store (asked once per executor)."""
        if self._alignment[0] is not executor:
            self._alignment = (executor, _blocks_fill_whole_chunks(self.path, name, executor.decomposition))
        return self._alignment[1]

    def _rewind_lost(self, simulation):
        """After a restart from a checkpoint (a lost worker), forget the snapshots the old ranks may not have written.

        Every snapshot up to the last flush (each checkpoint flushes) is
        whole; the later ones were queued on ranks of the executor the run
        left, some perhaps on the lost worker. They are cut from the store
        (their steps run again and are written again), after the writes
        still queued on the workers left have ended.
        """
        if self._pending_on is None or self._pending_on is simulation.executor:
            return
        from hpcgpu.io.writer_threads import drop_writes

        self._pending_on, self._rank_snapshots, self._particles_queued, self._queued = None, None, False, []
        if callable(getattr(simulation.executor, "on_workers", None)):
            simulation.executor.on_workers(drop_writes, os.path.abspath(self.path), phase="snapshot-drop")
        count, last_step = self._written
        if 0 < count < self.snapshots:
            _cut_time(self.path, count)
        self.snapshots, self._last_step = count, last_step

    def close(self, simulation):
        """Wait for the snapshots the ranks still write; write the diagnostics time series (group ``diagnostics``)."""
        self.flush(simulation)
        if not self.diagnostics:
            return
        ds = simulation.diagnostics
        if not ds.data_vars:
            return
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*[Cc]onsolidated metadata.*")
            ds.to_zarr(self.path, group="diagnostics", mode="w", consolidated=True)

    def __repr__(self):
        return f"ZarrWriter({self.path!r}, {self.schedule!r})"


def _cut_time(path, length):
    """Shorten every array along ``time`` of the store at ``path`` to ``length`` entries (metadata re-consolidated)."""
    import zarr

    group = zarr.open_group(path, mode="r+", use_consolidated=False)
    for _, array in group.arrays():
        dims = getattr(array.metadata, "dimension_names", None) or array.attrs.get("_ARRAY_DIMENSIONS")
        if dims and dims[0] == "time" and array.shape[0] > length:
            array.resize((length, *array.shape[1:]))
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*[Cc]onsolidated metadata.*")
        zarr.consolidate_metadata(path)


def _attributes(model, schema):
    """The dataset's attributes as the gathered path writes them: the client's model's (its backend as asked)."""
    attributes = getattr(model, "attributes", None)
    return attributes() if callable(attributes) else dict(schema.attrs)


def _replaceable(path):
    """True for an empty folder or a Zarr store (v2 or v3 metadata at its top)."""
    if not os.path.isdir(path):
        return False
    names = set(os.listdir(path))
    return not names or bool(names & {".zgroup", ".zarray", ".zmetadata", "zarr.json"})


def open_output(path):
    """Open a store written by :class:`ZarrWriter`: ``(fields, diagnostics)`` datasets."""
    import xarray as xr

    fields = xr.open_zarr(path)
    try:
        diagnostics = xr.open_zarr(path, group="diagnostics")
    except (FileNotFoundError, KeyError, OSError):
        diagnostics = None
    return fields, diagnostics


def _blocks_fill_whole_chunks(path, name, decomposition):
    """Whether every block of ``decomposition`` covers whole chunks of the variable ``name`` in the store."""
    import zarr

    array = zarr.open_group(path, mode="r")[name]
    chunks = getattr(array, "shards", None) or array.chunks  # a shard is what one writer must own whole
    return all(edge % chunk == 0 or edge == extent
               for bounds, chunk, extent in ((decomposition.y_bounds, chunks[-2], decomposition.y_bounds[-1][1]),
                                             (decomposition.x_bounds, chunks[-1], decomposition.x_bounds[-1][1]))
               for pair in bounds for edge in pair)
