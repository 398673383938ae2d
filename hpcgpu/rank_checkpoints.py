"""Checkpoints of a partitioned grid run: one piece per rank and field, and a manifest written last.

Each rank writes the cells it owns, one ``.npy`` file per field
(``rank-000003-h.npy``), straight from its worker into the checkpoint's
directory ``step-NNNNNNNNNN/`` (each piece through a temporary name, flushed
to disk, then renamed into place). The client then writes ``model.pkl``
(the model object and its state class: parameters only) and, last,
``manifest.json``, also through a temporary name and :func:`os.replace`:
step, time, dt, stop criteria and the diagnostics recorded so far (as
:mod:`hpcgpu.checkpoint`'s ``meta.json``), the grid's shape, the process
grid, and per piece its region, file, dtype, shape, size and checksum.
A directory without its manifest is an unfinished checkpoint and is never
resumed from. Only the pieces' names and checksums pass through the client.

Pieces are host arrays, so a checkpoint resumes on any backend, any number
of ranks and any process grid: each new rank reads the cells it owns from
the pieces that overlap them (:class:`CheckpointPieces`, a block source of
:mod:`hpcgpu.partition.rank_state`), checking each piece's checksum; a
mismatch is a :class:`~hpcgpu.errors.ConfigError` naming the piece. A run
in one process reads the whole grid the same way. Checksums are xxh3-128
when the ``xxhash`` package is installed, else SHA-256 (the manifest says
which). The directory must be one file system that every worker and the
client see (a parallel file system, or a local disk for a one-node run).

Examples
--------
>>> import tempfile
>>> from hpcgpu import Simulation
>>> from hpcgpu.workloads.weather import ShallowWater
>>> from hpcgpu.partition.block_region import whole_grid
>>> model = ShallowWater("gravity_wave", nx=16, ny=8, backend="numpy")
>>> folder = tempfile.mkdtemp()
>>> state = model.to_host(model.initial_state())
>>> pieces = [write_pieces(folder, 0, {"rows": [0, 8], "cols": [0, 16]}, state)]
>>> directory = write_manifest(folder, model, type(state), {"step": 0}, pieces, (1, 1))
>>> source = read_manifest(directory)[1]
>>> bool((source.owned_block(model, whole_grid(model.shape, model.periodic)).h == state.h).all())
True
"""

import hashlib
import io
import json
import os
import pickle
import shutil
import time
import uuid
from dataclasses import dataclass, fields

import numpy as np

from hpcgpu._version import __version__
from hpcgpu.errors import ConfigError

__all__ = ["MANIFEST", "CheckpointPieces", "fsync_directory", "has_pieces", "read_manifest", "write_manifest",
           "write_pieces", "write_rank_checkpoint", "writes_pieces"]

MANIFEST = "manifest.json"
"""The file that makes a checkpoint directory of pieces complete (written last)."""
_MODEL = "model.pkl"
_FORMAT = "hpcgpu-rank-pieces-1"


def _hasher():
    """``(algorithm name, hash object)``: xxh3-128 when xxhash is installed, else SHA-256."""
    try:
        import xxhash
    except ImportError:
        return "sha256", hashlib.sha256()
    return "xxh3_128", xxhash.xxh3_128()


def _digest(algorithm, data):
    if algorithm == "sha256":
        return hashlib.sha256(data).hexdigest()
    if algorithm == "xxh3_128":
        try:
            import xxhash
        except ImportError:
            raise ConfigError("checkpoint: its pieces carry xxh3_128 checksums; install the xxhash package to "
                              "read it") from None
        return xxhash.xxh3_128(data).hexdigest()
    raise ConfigError(f"checkpoint: unknown checksum algorithm {algorithm!r} (sha256 or xxh3_128)")


class _HashingFile:
    """A file that hashes what is written to it (one pass over the bytes)."""

    def __init__(self, stream, hasher):
        self.stream, self.hasher, self.size = stream, hasher, 0

    def write(self, data):
        self.hasher.update(data)
        self.size += len(data)
        return self.stream.write(data)


def _write_file(path, write):
    """Write ``path`` through a temporary name, flushed to disk; returns ``(algorithm, digest, bytes)``."""
    algorithm, hasher = _hasher()
    temporary = f"{path}.tmp-{uuid.uuid4().hex[:8]}"
    try:
        with open(temporary, "wb") as stream:
            sink = _HashingFile(stream, hasher)
            write(sink)
            stream.flush()
            os.fsync(stream.fileno())
        os.replace(temporary, path)
    except BaseException:
        if os.path.exists(temporary):
            os.remove(temporary)
        raise
    return algorithm, hasher.hexdigest(), sink.size


def write_pieces(directory, rank, region, host_state):
    """Write one rank's owned cells (``host_state``, NumPy arrays), one ``.npy`` per field; its manifest entry."""
    entry = {"rank": int(rank), **region, "fields": {}}
    for field in fields(host_state):
        array = np.ascontiguousarray(getattr(host_state, field.name))
        name = f"rank-{int(rank):06d}-{field.name}.npy"
        algorithm, digest, size = _write_file(os.path.join(directory, name),
                                              lambda sink, a=array: np.lib.format.write_array(sink, a))
        entry["fields"][field.name] = {"file": name, "dtype": array.dtype.str, "shape": list(array.shape),
                                       "bytes": size, "algorithm": algorithm, "digest": digest}
    return entry


def _write_rank_pieces(spec, ranks, results, directory):
    """Every rank of this worker writes its piece (a worker task); their manifest entries and the state class."""
    from hpcgpu.partition.decomposition import on_worker

    model = on_worker(spec.model)
    entries, state_type = [], None
    for rank, result in zip(ranks, results):
        carried = getattr(result, "carried", result)
        host = model.to_host(spec.decomposition.model_state(carried))
        state_type = type(host)
        entries.append(write_pieces(directory, rank, spec.decomposition.piece_region(rank), host))
    return entries, state_type


def writes_pieces(executor):
    """Whether ``executor``'s checkpoints are pieces written by its ranks (a partitioned grid run)."""
    decomposition = getattr(executor, "decomposition", None)
    return callable(getattr(executor, "on_workers", None)) and getattr(decomposition, "builds_blocks", False)


def write_rank_checkpoint(directory, executor, model, meta):
    """The ranks of ``executor`` write their pieces into ``directory`` (emptied first), then the client the manifest.

    :func:`hpcgpu.checkpoint.write_rank_checkpoint` names the directory
    and prunes older checkpoints around this.
    """
    if os.path.exists(directory):  # an earlier checkpoint of this step, or pieces of an unfinished one
        shutil.rmtree(directory)
    os.makedirs(directory)
    gathered = list(executor.on_workers(_write_rank_pieces, directory, phase="checkpoint").values())
    pieces = sorted((entry for entries, _ in gathered for entry in entries), key=lambda e: e["rank"])
    return write_manifest(directory, model, gathered[0][1], meta, pieces, executor.decomposition.grid)


def write_manifest(directory, model, state_type, meta, pieces, process_grid):
    """Write ``model.pkl`` and, last, the manifest of ``pieces`` into ``directory``; returns it."""
    os.makedirs(directory, exist_ok=True)
    payload = pickle.dumps({"model": model, "state_type": state_type}, protocol=pickle.HIGHEST_PROTOCOL)
    algorithm, digest, size = _write_file(os.path.join(directory, _MODEL), lambda sink: sink.write(payload))
    manifest = {**meta, "format": _FORMAT, "hpcgpu_version": __version__, "written_unix": time.time(),
                "grid_shape": [int(n) for n in model.shape], "process_grid": [int(n) for n in process_grid],
                "model_file": {"file": _MODEL, "bytes": size, "algorithm": algorithm, "digest": digest},
                "pieces": pieces}
    text = json.dumps(manifest, default=float).encode()
    _write_file(os.path.join(directory, MANIFEST), lambda sink: sink.write(text))
    fsync_directory(directory)
    return directory


def fsync_directory(path):
    """Flush ``path``'s entries (renames into it) to disk, where the file system can."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:  # some filesystems (network mounts, Windows) cannot sync a directory: the files are synced
        pass
    finally:
        os.close(fd)


def has_pieces(directory):
    """Whether ``directory`` holds rank pieces (with or without their manifest)."""
    return any(name.startswith("rank-") and name.endswith(".npy") for name in os.listdir(directory))


def _read_verified(directory, entry):
    """The bytes of the file of ``entry`` (a manifest entry), checked against its size and checksum."""
    path = os.path.join(directory, entry["file"])
    with open(path, "rb") as stream:
        data = stream.read()
    if len(data) != entry["bytes"] or _digest(entry["algorithm"], data) != entry["digest"]:
        raise ConfigError(f"checkpoint piece {path} is corrupted: its {len(data)} bytes do not match the "
                          f"{entry['bytes']} bytes and {entry['algorithm']} checksum of {MANIFEST}; restore it, or "
                          "resume from an earlier checkpoint (delete this one)")
    return data


def read_manifest(directory):
    """``(model, pieces, manifest)`` of the checkpoint in ``directory`` (its ``model.pkl`` checked).

    Raises
    ------
    FileNotFoundError
        No manifest: an unfinished checkpoint.
    ConfigError
        A corrupted ``model.pkl``.
    """
    with open(os.path.join(directory, MANIFEST)) as stream:
        manifest = json.load(stream)
    content = pickle.loads(_read_verified(directory, manifest["model_file"]))
    pieces = CheckpointPieces(directory, tuple(manifest["grid_shape"]), content["state_type"], manifest["pieces"])
    return content["model"], pieces, manifest


def _load_piece(directory, entry):
    """The array of one piece's field (checked), without a copy of its bytes."""
    data = _read_verified(directory, entry)
    stream = io.BytesIO(data)
    version = np.lib.format.read_magic(stream)
    read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
    shape, fortran, dtype = read_header(stream)
    return np.frombuffer(data, dtype=dtype, count=int(np.prod(shape)), offset=stream.tell()).reshape(
        shape, order="F" if fortran else "C")


@dataclass(frozen=True)
class CheckpointPieces:
    """A block source (see :mod:`hpcgpu.partition.rank_state`): any block's cells, read from a checkpoint's pieces."""

    directory: str
    grid_shape: tuple
    state_type: type
    pieces: list

    def owned_block(self, model, where):
        """The state of the owned cells of ``where`` (a BlockRegion), from the pieces that overlap them.

        Raises
        ------
        ConfigError
            The model's grid is not the checkpoint's, a piece is corrupted
            or the pieces do not cover the block.
        """
        if tuple(model.shape) != self.grid_shape:
            raise ConfigError(f"checkpoint {self.directory}: its grid is {self.grid_shape} (ny, nx); the model's is "
                              f"{tuple(model.shape)}")
        rows, cols = where.owned_rows, where.owned_cols
        names = [f.name for f in fields(self.state_type)]
        first = self.pieces[0]["fields"]
        out = {name: np.empty((len(rows), len(cols)), dtype=np.dtype(first[name]["dtype"])) for name in names}
        covered = 0
        for piece in self.pieces:
            (r0, r1), (c0, c1) = piece["rows"], piece["cols"]
            top, bottom = max(r0, rows.start), min(r1, rows.stop)
            left, right = max(c0, cols.start), min(c1, cols.stop)
            if top >= bottom or left >= right:
                continue
            for name in names:
                array = _load_piece(self.directory, piece["fields"][name])
                out[name][top - rows.start:bottom - rows.start, left - cols.start:right - cols.start] = \
                    array[top - r0:bottom - r0, left - c0:right - c0]
            covered += (bottom - top) * (right - left)
        if covered != len(rows) * len(cols):
            raise ConfigError(f"checkpoint {self.directory}: its pieces cover {covered} of the {len(rows) * len(cols)} "
                              f"cells of rows {rows.start}:{rows.stop}, columns {cols.start}:{cols.stop}")
        return self.state_type(*(out[name] for name in names))

    def whole_state(self, model):
        """The whole grid's state (host arrays), for a run in one process."""
        from hpcgpu.partition.block_region import whole_grid

        return self.owned_block(model, whole_grid(model.shape, model.periodic))
