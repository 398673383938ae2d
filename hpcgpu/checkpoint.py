"""Checkpoints: the global state on disk, written atomically, read back with a fallback.

A checkpoint directory holds one sub-directory per checkpoint,
``step-0000001234/``, with

* ``state.pkl``: the model object (its parameters) and the global state on
  the host, pickled (states are frozen dataclasses of arrays; a molecular
  dynamics state keeps its neighbour list, so a resumed run sums forces in
  the same order as an uninterrupted one);
* ``meta.json``: step, model time, dt, run name, stop criteria, the
  diagnostics recorded so far, the hpcgpu version, the time it was written
  and the SHA-256 of ``state.pkl``.

Both are written into a hidden temporary directory, flushed to disk, and
the directory is renamed into place: a crash mid-write leaves no
half-checkpoint under a real name. Reading checks the digest; a partial or
corrupt checkpoint is skipped with a warning and the previous good one is
used. The newest :data:`KEEP` checkpoints up to the step just written are
kept; a checkpoint at a later step (another run's history) is never deleted
in favour of it.

These checkpoints hold the global state, so a run resumes on any number of
workers. A partitioned run writes its checkpoints as pieces instead, one
per rank, under a ``manifest.json`` written last: grid cells
(:mod:`hpcgpu.rank_checkpoints`) or particles, MD bricks and N-body
blocks (:mod:`hpcgpu.particle_checkpoints`). The same directory names, the
same metadata, read by the same :func:`read_checkpoint` (which then
returns the pieces as a block source in place of the state). Pickle runs code when
loaded: load only checkpoints you wrote.

Examples
--------
>>> import tempfile
>>> from hpcgpu import Simulation
>>> from hpcgpu.workloads.weather import ShallowWater
>>> path = tempfile.mkdtemp()
>>> sim = Simulation(ShallowWater("gravity_wave", nx=16, ny=8, backend="numpy"), stop_steps=6, progress=False)
>>> _ = sim.run(checkpoint=path, checkpoint_every=3)
>>> Simulation.resume(path, progress=False).step
6
"""

import hashlib
import json
import os
import pickle
import shutil
import time
import uuid
import warnings

from hpcgpu import checkpoint_files, particle_checkpoints, rank_checkpoints
from hpcgpu._version import __version__
from hpcgpu.checkpoint_files import fsync_directory
from hpcgpu.errors import ConfigError

__all__ = ["write_checkpoint", "write_rank_checkpoint", "ranks_write_pieces", "read_checkpoint", "list_checkpoints",
           "checkpoint_directory", "checkpoint_step", "prune_checkpoints", "KEEP"]

KEEP = 2
"""Checkpoints kept (the newest up to the one just written); older ones are deleted after a new one is in place."""
_PREFIX = "step-"


def checkpoint_step(directory):
    """The step of the checkpoint directory ``directory`` (from its name, ``step-NNNNNNNNNN``).

    Examples
    --------
    >>> checkpoint_step("/scratch/run/step-0000000040")
    40
    """
    return int(os.path.basename(os.path.normpath(directory))[len(_PREFIX):])


def checkpoint_directory(path, step):
    """The directory of the checkpoint of ``step`` under ``path``.

    Examples
    --------
    >>> checkpoint_directory("/scratch/run", 40)
    '/scratch/run/step-0000000040'
    """
    return os.path.join(path, f"{_PREFIX}{int(step):010d}")


def write_checkpoint(path, model, host_state, meta):
    """Write one checkpoint under ``path`` atomically; returns its directory."""
    os.makedirs(path, exist_ok=True)
    step = int(meta["step"])
    temporary = os.path.join(path, f".tmp-{uuid.uuid4().hex}")
    os.makedirs(temporary)
    try:
        payload = pickle.dumps({"model": model, "state": host_state}, protocol=pickle.HIGHEST_PROTOCOL)
        with open(os.path.join(temporary, "state.pkl"), "wb") as stream:
            stream.write(payload)
            stream.flush()
            os.fsync(stream.fileno())
        meta = {**meta, "hpcgpu_version": __version__, "written_unix": time.time(),
                "sha256": hashlib.sha256(payload).hexdigest(), "bytes": len(payload)}
        with open(os.path.join(temporary, "meta.json"), "w") as stream:
            json.dump(meta, stream, default=float)
            stream.flush()
            os.fsync(stream.fileno())
        final = checkpoint_directory(path, step)
        if os.path.exists(final):
            shutil.rmtree(final)
        os.rename(temporary, final)
        fsync_directory(path)
    except BaseException:
        shutil.rmtree(temporary, ignore_errors=True)
        raise
    prune_checkpoints(path, step)
    return final


def ranks_write_pieces(executor):
    """Whether the ranks of ``executor`` write its checkpoints as pieces (a partitioned grid or particle run)."""
    return rank_checkpoints.writes_pieces(executor) or particle_checkpoints.writes_particle_pieces(executor)


def write_rank_checkpoint(path, executor, model, meta):
    """The ranks of a partitioned run write the checkpoint of ``meta["step"]`` under ``path``; its directory.

    Pieces and manifest as :func:`hpcgpu.rank_checkpoints.write_rank_checkpoint`
    (grids) or :func:`hpcgpu.particle_checkpoints.write_rank_checkpoint`
    (particles) write them; older checkpoints pruned as by :func:`write_checkpoint`.
    """
    os.makedirs(path, exist_ok=True)
    step = int(meta["step"])
    writer = particle_checkpoints if particle_checkpoints.writes_particle_pieces(executor) else rank_checkpoints
    directory = writer.write_rank_checkpoint(checkpoint_directory(path, step), executor, model, meta)
    fsync_directory(path)
    prune_checkpoints(path, step)
    return directory


def prune_checkpoints(path, step):
    """Delete the checkpoints under ``path`` older than the newest :data:`KEEP` up to ``step`` (just written)."""
    # Pruning by step alone would delete the checkpoint just written when the
    # directory holds later steps (another run's): only earlier ones are pruned.
    earlier = [c for c in list_checkpoints(path) if checkpoint_step(c) <= step]
    for old in earlier[:-KEEP]:
        shutil.rmtree(old, ignore_errors=True)


def list_checkpoints(path):
    """Checkpoint directories under ``path``, oldest first (complete or not)."""
    if not os.path.isdir(path):
        return []
    names = sorted(n for n in os.listdir(path) if n.startswith(_PREFIX) and n[len(_PREFIX):].isdigit())
    return [os.path.join(path, n) for n in names]


def _load(directory):
    if os.path.exists(os.path.join(directory, checkpoint_files.MANIFEST)):
        manifest, content = checkpoint_files.read_manifest(directory)
        reader = particle_checkpoints if manifest.get("format") == particle_checkpoints.FORMAT else rank_checkpoints
        return content["model"], reader.pieces_of(directory, manifest, content), manifest
    if not os.path.exists(os.path.join(directory, "meta.json")) and os.path.isdir(directory) and \
            checkpoint_files.has_pieces(directory):
        raise FileNotFoundError(f"no {checkpoint_files.MANIFEST}: an unfinished checkpoint of rank pieces, ignored")
    with open(os.path.join(directory, "meta.json")) as stream:
        meta = json.load(stream)
    with open(os.path.join(directory, "state.pkl"), "rb") as stream:
        payload = stream.read()
    if hashlib.sha256(payload).hexdigest() != meta.get("sha256"):
        raise ValueError("state.pkl does not match the digest in meta.json (truncated or corrupted)")
    content = pickle.loads(payload)
    return content["model"], content["state"], meta


def read_checkpoint(path, candidates=None):
    """``(model, host_state, meta)`` of the newest good checkpoint under ``path``.

    A checkpoint that cannot be read or fails its digest is skipped with a
    warning (naming it and why) in favour of the previous one; so is one of
    rank pieces without its manifest. For a checkpoint of rank pieces,
    ``host_state`` is a :class:`~hpcgpu.rank_checkpoints.CheckpointPieces`
    or a :class:`~hpcgpu.particle_checkpoints.ParticlePieces`
    (its pieces are read, and checked, by whoever builds blocks from it).

    Parameters
    ----------
    path : str
        The checkpoint directory.
    candidates : sequence of str, optional
        Only these checkpoint directories (default: every one under ``path``),
        e.g. those a run wrote itself.

    Raises
    ------
    ConfigError
        No checkpoint, or none readable, under ``path``.
    """
    candidates = list_checkpoints(path) if candidates is None else sorted(candidates, key=checkpoint_step)
    if not candidates:
        raise ConfigError(f"checkpoint: no checkpoint under {path!r} (expected {_PREFIX}NNNNNNNNNN directories)")
    problems = []
    for directory in reversed(candidates):
        try:
            model, state, meta = _load(directory)
        except Exception as error:  # noqa: BLE001 - any unreadable checkpoint falls back to an older one
            problems.append(f"{os.path.basename(directory)}: {type(error).__name__}: {error}")
            warnings.warn(f"checkpoint {directory} is unusable ({error}); trying the previous one",
                          RuntimeWarning, stacklevel=3)
            continue
        return model, state, meta
    raise ConfigError(f"checkpoint: no usable checkpoint under {path!r}: " + "; ".join(problems))
