"""``hpcgpu bench io``: per-rank and aggregate write rates of snapshots and checkpoints beside a plain NumPy write.

The model of the ``io`` benchmark case a workload declares (the weather
model's: a gravity wave on a doubly periodic grid, so blocks are of equal
size and chunks are whole blocks; ``size`` x ``size`` cells) is placed
on the ranks of a cluster (one rank per worker, the process grid the
engine chooses) and, without stepping:

* case ``snapshot``: writes ``snapshots`` Zarr snapshots as
  :class:`~hpcgpu.io.ZarrWriter` does on a partitioned run (the client
  writes metadata, each rank its region on its worker's background
  thread; :class:`~hpcgpu.io.rank_zarr.RankSnapshots`). One line per rank
  (its state-field bytes over its seconds of writing) and one
  ``aggregate`` line: the bytes of every variable the snapshots store
  (the state fields and the derived vorticity) over the client's wall
  time from the first snapshot to the last write finished (metadata,
  computing the vorticity and the waits included);
* case ``checkpoint``: each rank writes its checkpoint pieces
  (:func:`hpcgpu.rank_checkpoints.write_pieces`, flushed to disk), one
  line per rank and one ``aggregate`` line (the slowest rank's time);
* case ``numpy``: the client writes the same bytes as one snapshot
  (every variable) with :func:`numpy.save` into the same folder, flushed to disk:
  the file system's plain rate. Every other line carries
  ``ratio_to_numpy``, its rate over this one.

One JSON object per line, with ``suite`` ("io"), ``case``, ``scope``
("rank" or "aggregate"), ``rank``, ``bytes``, ``seconds``,
``bytes_per_s``, ``ratio_to_numpy``, ``size``, ``dtype`` and
``folder``. The folder is a local path (node-local NVMe, a mounted
parallel file system) or an fsspec URL (object storage: snapshots and
the NumPy baseline only); it is emptied of what the suite wrote at the end.

Examples
--------
>>> rate(1_000_000, 0.5)
2000000.0
"""

import json
import os
import shutil
import sys
import tempfile
from time import perf_counter

import numpy as np

from hpcgpu.errors import ConfigError

__all__ = ["DEFAULT_SIZE", "DEFAULT_SNAPSHOTS", "rate", "run"]

DEFAULT_SIZE = 1024
"""Cells per side of the benchmarked grid."""
DEFAULT_SNAPSHOTS = 3
"""Snapshots per measurement."""


def rate(size, seconds):
    """Bytes per second (0 when no time passed)."""
    return float(size) / seconds if seconds > 0 else 0.0


def _numpy_write(fs, folder, size, dtype):
    """Seconds the client takes to write ``size`` bytes of ``dtype`` with numpy.save (flushed to disk on a
    local file system; through ``fs``, an fsspec file system, elsewhere)."""
    data = np.ones(max(1, size // np.dtype(dtype).itemsize), dtype=dtype)
    path = f"{folder}/numpy-baseline.npy"
    started = perf_counter()
    with fs.open(path, "wb") as stream:
        np.save(stream, data)
        stream.flush()
        if _is_local(fs):
            os.fsync(stream.fileno())
    seconds = perf_counter() - started
    fs.rm(path)
    return seconds


def _is_local(fs):
    """Whether ``fs`` is this machine's file system (files can be flushed to disk and renamed in place)."""
    return _is_posix(fs)


def _is_posix(fs):
    from fsspec.implementations.local import LocalFileSystem

    return isinstance(fs, LocalFileSystem)


def _where(folder):
    """``(fs, root, url)`` of ``folder``: a local path or an fsspec URL (``file://``, ``s3://``, ...).

    Examples
    --------
    >>> fs, root, url = _where("file:///tmp/somewhere")
    >>> _is_local(fs), root, url
    (True, '/tmp/somewhere', 'file:///tmp/somewhere')
    """
    from fsspec.core import url_to_fs

    try:
        fs, root = url_to_fs(folder)
    except (ImportError, ValueError) as error:  # an unknown protocol, or its package missing (s3fs, gcsfs, ...)
        raise ConfigError(f"folder {folder!r}: {error}") from None
    url = folder if "://" in folder else root
    return fs, root.rstrip("/"), url.rstrip("/")


def timed_pieces(spec, ranks, results, directory):
    """Each rank of this worker writes its checkpoint pieces (a worker task): ``[{"rank", "bytes", "seconds"}]``."""
    from hpcgpu.partition.decomposition import on_worker
    from hpcgpu.rank_checkpoints import write_pieces

    model = on_worker(spec.model)
    out = []
    for rank, result in zip(ranks, results):
        host = model.to_host(spec.decomposition.model_state(getattr(result, "carried", result)))
        started = perf_counter()
        entry = write_pieces(directory, rank, spec.decomposition.piece_region(rank), host)
        out.append({"rank": rank, "bytes": sum(f["bytes"] for f in entry["fields"].values()),
                    "seconds": perf_counter() - started})
    return out


def run(client, *, folder=None, size=DEFAULT_SIZE, dtype="float64", snapshots=DEFAULT_SNAPSHOTS, stream=None):
    """Measure on the workers of ``client``; print JSON lines to ``stream`` (stdout); returns the lines.

    Parameters
    ----------
    client : distributed.Client
        Every worker gets one rank.
    folder : str, optional
        Where to write (a new temporary folder by default): a path, or an
        fsspec URL (``file://``, ``s3://`` with s3fs installed, ...). It
        must be one file system that the client and every worker see.
        Checkpoints are measured on local paths only (they are POSIX
        files, renamed into place).
    size : int
        Cells per side, at least 16.
    dtype : {"float32", "float64"}
    snapshots : int
        At least 1.
    """
    from hpcgpu import Simulation
    from hpcgpu.io.rank_zarr import RankSnapshots
    from hpcgpu.registry import benchmark_case

    if not isinstance(size, int) or size < 16:
        raise ConfigError(f"size must be an int >= 16 (cells per side); got {size!r}")
    if not isinstance(snapshots, int) or snapshots < 1:
        raise ConfigError(f"snapshots must be an int >= 1; got {snapshots!r}")
    stream = stream or sys.stdout
    own_folder = folder is None
    folder = tempfile.mkdtemp(prefix="hpcgpu-bench-io-") if own_folder else os.fspath(folder)
    fs, root, folder = _where(folder)
    fs.makedirs(root, exist_ok=True)
    local = _is_local(fs)
    workers = len(client.scheduler_info()["workers"])
    _, case = benchmark_case("io")
    model = case.build(size, dtype=dtype, backend="numpy", scale=1)
    sim = Simulation(model, stop_steps=1, progress=False, client=client, partitions=max(2, workers))
    lines = []
    common = {"suite": "io", "size": size, "dtype": dtype, "folder": folder}
    try:
        executor = sim.executor
        # a local folder as a path (zarr's fsspec store would not make its folders), anything else as its URL
        store = os.path.join(root, "bench-snapshots.zarr") if _is_posix(fs) else f"{folder}/bench-snapshots.zarr"
        writes = RankSnapshots(store)
        started = perf_counter()
        for index in range(snapshots):
            writes.write(executor, model, index == 0, float(index), index, list(model.output_variables()),
                         model.attributes())
        snapshot_ranks = writes.finish(executor)
        snapshot_wall = perf_counter() - started
        checkpoint_ranks = []
        if local:  # checkpoints are POSIX files (written, flushed, renamed into place): not on object storage
            pieces = os.path.join(root, "bench-checkpoint")
            os.makedirs(pieces, exist_ok=True)
            started = perf_counter()
            checkpoint_ranks = [t for ts in executor.on_workers(timed_pieces, pieces, phase="bench-io").values()
                                for t in ts]
            checkpoint_wall = perf_counter() - started
        # a snapshot's bytes: every variable it stores, the derived ones (vorticity) beside the state fields
        one_snapshot = sum(int(np.prod(model.shape)) * np.dtype(dtype_of).itemsize
                           for _, dtype_of, _ in model.output_variables().values())
        numpy_seconds = _numpy_write(fs, root, one_snapshot, dtype)
        numpy_rate = rate(one_snapshot, numpy_seconds)

        def emit(case, scope, rank, size_bytes, seconds):
            line = {**common, "case": case, "scope": scope, "rank": rank, "bytes": int(size_bytes),
                    "seconds": seconds, "bytes_per_s": rate(size_bytes, seconds),
                    "ratio_to_numpy": rate(size_bytes, seconds) / numpy_rate if numpy_rate else None}
            lines.append(line)
            print(json.dumps(line), file=stream, flush=True)

        emit("numpy", "aggregate", None, one_snapshot, numpy_seconds)
        for timing in snapshot_ranks:  # per rank, its snapshots in order
            emit("snapshot", "rank", timing["rank"], timing["bytes"], timing["seconds"])
        emit("snapshot", "aggregate", None, one_snapshot * snapshots, snapshot_wall)
        for timing in sorted(checkpoint_ranks, key=lambda t: t["rank"]):
            emit("checkpoint", "rank", timing["rank"], timing["bytes"], timing["seconds"])
        if checkpoint_ranks:
            emit("checkpoint", "aggregate", None, sum(t["bytes"] for t in checkpoint_ranks), checkpoint_wall)
    finally:
        sim.close()
        for name in ("bench-snapshots.zarr", "bench-checkpoint"):
            if fs.exists(f"{root}/{name}"):
                fs.rm(f"{root}/{name}", recursive=True)
        if own_folder:
            shutil.rmtree(root, ignore_errors=True)
    return lines
