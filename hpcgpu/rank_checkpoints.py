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
The files, checksums and manifest are :mod:`hpcgpu.checkpoint_files`'s;
particle runs write their pieces by :mod:`hpcgpu.particle_checkpoints`.

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

from dataclasses import dataclass, fields

import numpy as np

from hpcgpu.checkpoint_files import MANIFEST, fsync_directory, has_pieces, load_array, write_array, write_by_ranks
from hpcgpu.checkpoint_files import read_manifest as read_manifest_file
from hpcgpu.checkpoint_files import write_manifest as write_manifest_file
from hpcgpu.errors import ConfigError

__all__ = ["FORMAT", "MANIFEST", "CheckpointPieces", "fsync_directory", "has_pieces", "pieces_of", "read_manifest",
           "write_manifest", "write_pieces", "write_rank_checkpoint", "writes_pieces"]

FORMAT = "hpcgpu-rank-pieces-1"
"""The manifest's ``format`` of a grid run's pieces."""


def write_pieces(directory, rank, region, host_state):
    """Write one rank's owned cells (``host_state``, NumPy arrays), one ``.npy`` per field; its manifest entry."""
    entry = {"rank": int(rank), **region, "fields": {}}
    for field in fields(host_state):
        name = f"rank-{int(rank):06d}-{field.name}.npy"
        entry["fields"][field.name] = write_array(directory, name, getattr(host_state, field.name))
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
    pieces, state_type = write_by_ranks(directory, executor, _write_rank_pieces)
    return write_manifest(directory, model, state_type, meta, pieces, executor.decomposition.grid)


def write_manifest(directory, model, state_type, meta, pieces, process_grid):
    """Write ``model.pkl`` and, last, the manifest of ``pieces`` into ``directory``; returns it."""
    return write_manifest_file(directory, model, state_type, {
        **meta, "format": FORMAT, "grid_shape": [int(n) for n in model.shape],
        "process_grid": [int(n) for n in process_grid], "pieces": pieces})


def read_manifest(directory):
    """``(model, pieces, manifest)`` of the checkpoint in ``directory`` (its ``model.pkl`` checked).

    Raises
    ------
    FileNotFoundError
        No manifest: an unfinished checkpoint.
    ConfigError
        A corrupted ``model.pkl``.
    """
    manifest, content = read_manifest_file(directory)
    return content["model"], pieces_of(directory, manifest, content), manifest


def pieces_of(directory, manifest, content):
    """The block source of a grid checkpoint's pieces, from its manifest and ``model.pkl`` content."""
    return CheckpointPieces(directory, tuple(manifest["grid_shape"]), content["state_type"], manifest["pieces"])


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
                array = load_array(self.directory, piece["fields"][name])
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
