"""The files of a checkpoint of rank pieces: atomic writes with checksums, and a manifest written last.

What a checkpoint written by its ranks needs whatever the pieces hold
(grid cells: :mod:`hpcgpu.rank_checkpoints`; particles:
:mod:`hpcgpu.particle_checkpoints`):

* :func:`write_file` writes a file through a temporary name, flushed to
  disk, then :func:`os.replace` into place, hashing the bytes on the way;
* :func:`write_array` writes one ``.npy`` piece that way and gives its
  manifest entry (file, dtype, shape, bytes, checksum);
* :func:`write_by_ranks` has every rank write its pieces from its worker;
* :func:`write_manifest` writes ``model.pkl`` (the model object and its
  state class: parameters only) and, last, ``manifest.json``: a directory
  without its manifest is an unfinished checkpoint, never resumed from;
* :func:`read_manifest` and :func:`load_array` read them back, checking each
  file's size and checksum: a mismatch is a
  :class:`~hpcgpu.errors.ConfigError` naming the file.

Checksums are xxh3-128 when the ``xxhash`` package is installed, else
SHA-256 (each entry says which).

Examples
--------
>>> import tempfile
>>> import numpy as np
>>> folder = tempfile.mkdtemp()
>>> entry = write_array(folder, "rank-000000-h.npy", np.arange(4.0))
>>> entry["shape"], load_array(folder, entry).tolist()
([4], [0.0, 1.0, 2.0, 3.0])
"""

import hashlib
import io
import json
import os
import pickle
import shutil
import time
import uuid

import numpy as np

from hpcgpu._version import __version__
from hpcgpu.errors import ConfigError

__all__ = ["MANIFEST", "fsync_directory", "has_pieces", "load_array", "read_manifest", "read_verified",
           "write_array", "write_by_ranks", "write_file", "write_manifest"]

MANIFEST = "manifest.json"
"""The file that makes a checkpoint directory of pieces complete (written last)."""
MODEL_FILE = "model.pkl"


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


def write_file(path, write):
    """Write ``path`` through a temporary name, flushed to disk; returns ``(algorithm, digest, bytes)``.

    ``write(sink)`` writes the bytes into ``sink`` (it has ``write``).
    """
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


def write_array(directory, name, array):
    """Write ``array`` (host) as the ``.npy`` file ``name`` of ``directory``; its manifest entry."""
    array = np.ascontiguousarray(array)
    algorithm, digest, size = write_file(os.path.join(directory, name),
                                         lambda sink: np.lib.format.write_array(sink, array))
    return {"file": name, "dtype": array.dtype.str, "shape": list(array.shape), "bytes": size,
            "algorithm": algorithm, "digest": digest}


def write_manifest(directory, model, state_type, manifest):
    """Write ``model.pkl`` and, last, ``manifest`` (a dict: meta, format, pieces...) into ``directory``; returns it."""
    os.makedirs(directory, exist_ok=True)
    payload = pickle.dumps({"model": model, "state_type": state_type}, protocol=pickle.HIGHEST_PROTOCOL)
    algorithm, digest, size = write_file(os.path.join(directory, MODEL_FILE), lambda sink: sink.write(payload))
    manifest = {**manifest, "hpcgpu_version": __version__, "written_unix": time.time(),
                "model_file": {"file": MODEL_FILE, "bytes": size, "algorithm": algorithm, "digest": digest}}
    text = json.dumps(manifest, default=float).encode()
    write_file(os.path.join(directory, MANIFEST), lambda sink: sink.write(text))
    fsync_directory(directory)
    return directory


def write_by_ranks(directory, executor, task):
    """Every worker of ``executor`` runs ``task`` on its ranks' resident blocks into ``directory`` (emptied first).

    ``task(spec, ranks, results, directory)`` returns ``(entries, state_type)``:
    the manifest entries of its ranks' pieces (each with its ``rank``).
    Returns every entry, in rank order, and the state class.
    """
    if os.path.exists(directory):  # an earlier checkpoint of this step, or pieces of an unfinished one
        shutil.rmtree(directory)
    os.makedirs(directory)
    gathered = list(executor.on_workers(task, directory, phase="checkpoint").values())
    pieces = sorted((entry for entries, _ in gathered for entry in entries), key=lambda e: e["rank"])
    return pieces, next(state_type for _, state_type in gathered if state_type is not None)


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


def read_verified(directory, entry):
    """The bytes of the file of ``entry`` (a manifest entry), checked against its size and checksum.

    Raises
    ------
    ConfigError
        The file's size or checksum is not the manifest's (the message names the file).
    """
    path = os.path.join(directory, entry["file"])
    with open(path, "rb") as stream:
        data = stream.read()
    if len(data) != entry["bytes"] or _digest(entry["algorithm"], data) != entry["digest"]:
        raise ConfigError(f"checkpoint piece {path} is corrupted: its {len(data)} bytes do not match the "
                          f"{entry['bytes']} bytes and {entry['algorithm']} checksum of {MANIFEST}; restore it, or "
                          "resume from an earlier checkpoint (delete this one)")
    return data


def read_manifest(directory):
    """``(manifest, content)`` of the checkpoint in ``directory``: ``content`` holds ``model`` and ``state_type``.

    Raises
    ------
    FileNotFoundError
        No manifest: an unfinished checkpoint.
    ConfigError
        A corrupted ``model.pkl``.
    """
    with open(os.path.join(directory, MANIFEST)) as stream:
        manifest = json.load(stream)
    return manifest, pickle.loads(read_verified(directory, manifest["model_file"]))


def load_array(directory, entry):
    """The array of one piece (checked against its entry), without a copy of its bytes."""
    data = read_verified(directory, entry)
    stream = io.BytesIO(data)
    version = np.lib.format.read_magic(stream)
    read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
    shape, fortran, dtype = read_header(stream)
    return np.frombuffer(data, dtype=dtype, count=int(np.prod(shape)), offset=stream.tell()).reshape(
        shape, order="F" if fortran else "C")
