"""Checkpoints of a partitioned particle run (MD bricks, N-body blocks): one piece per rank, a manifest written last.

Each rank writes the particles it owns straight from its worker into the
checkpoint's directory ``step-NNNNNNNNNN/``: one ``.npy`` file per
per-particle array of its state (``rank-000003-positions.npy``, the atom
ids among them), and the arrays its decomposition adds
(``rank-000003-extra-ids.npy``: an N-body block's body ids;
``rank-000003-extra-listed.npy``: where an MD brick's atoms were when its
neighbour list was built). The state's scalars (step, list builds) and the
piece's region (a brick's bounding box of positions, a block's id range)
go into its manifest entry. The client then writes ``model.pkl`` and,
last, ``manifest.json``, through :mod:`hpcgpu.checkpoint_files` (the same
atomic writes and checksums as a grid run's pieces,
:mod:`hpcgpu.rank_checkpoints`): a directory without its manifest is never
resumed from, and only the pieces' names, regions and checksums pass
through the client.

Pieces are host arrays, so a checkpoint resumes on any backend, any number
of ranks and any brick grid: :class:`ParticlePieces` is the block source
each new rank builds its block from (its decomposition's ``build_block``),
reading only the pieces whose region can hold its particles and keeping
those it owns: an N-body rank the bodies of its id range
(:class:`IdRange`), an MD brick the atoms whose position falls in its brick
(with their ghosts, as :mod:`hpcgpu.partition.brick_start` plays the
exchange). A piece whose size or checksum is not the manifest's is a
:class:`~hpcgpu.errors.ConfigError` naming it. A run in one process reads
the whole state in id order (:meth:`ParticlePieces.whole_state`).

Examples
--------
>>> import tempfile
>>> import numpy as np
>>> from hpcgpu.workloads.astro import NBody
>>> model = NBody("plummer", n=8, backend="numpy")
>>> state = model.to_host(model.initial_state())
>>> folder = tempfile.mkdtemp()
>>> pieces = [write_particle_piece(folder, 0, {"ids": [0, 8]}, state, {"ids": np.arange(8)})]
>>> source = ParticlePieces(folder, type(state), pieces)
>>> block, extra = source.owned_block(model, IdRange(2, 5))
>>> bool((block.positions == state.positions[:, 2:5]).all()), extra["ids"].tolist()
(True, [2, 3, 4])
"""

import dataclasses
from dataclasses import dataclass

import numpy as np

from hpcgpu.checkpoint_files import load_array, write_array, write_by_ranks, write_manifest
from hpcgpu.errors import ConfigError

__all__ = ["FORMAT", "IdRange", "ParticlePieces", "periodic_overlap", "pieces_of", "position_bounds",
           "take_particles", "write_particle_piece", "write_rank_checkpoint", "writes_particle_pieces"]

FORMAT = "hpcgpu-particle-pieces-1"
"""The manifest's ``format`` of a particle run's pieces."""


def writes_particle_pieces(executor):
    """Whether ``executor``'s checkpoints are particle pieces written by its ranks (a partitioned particle run)."""
    decomposition = getattr(executor, "decomposition", None)
    return callable(getattr(executor, "on_workers", None)) and getattr(decomposition, "particle_pieces", False)


def particle_fields(state):
    """``(arrays, scalars)`` of a particle state (a dataclass): its per-particle arrays and its plain numbers.

    Fields that are None (derived data, as a neighbour list) are left out;
    the state class must give them a default.

    Raises
    ------
    ConfigError
        The state is not a dataclass, or a field is neither an array over
        the particles, a number, nor None with a default.
    """
    if not dataclasses.is_dataclass(state):
        raise ConfigError(f"a particle checkpoint piece needs a dataclass state; got {type(state).__name__}")
    size = int(state.size)
    arrays, scalars = {}, {}
    for field in dataclasses.fields(state):
        value = getattr(state, field.name)
        if isinstance(value, (bool, int, float, np.integer, np.floating)):
            scalars[field.name] = value.item() if isinstance(value, np.generic) else value
        elif getattr(value, "ndim", 0) >= 1 and value.shape[-1] == size:
            arrays[field.name] = np.asarray(value)
        elif value is None and (field.default is not dataclasses.MISSING
                                or field.default_factory is not dataclasses.MISSING):
            continue
        else:
            raise ConfigError(f"{type(state).__name__}.{field.name}: a particle checkpoint piece holds arrays over "
                              f"the {size} particles (last axis), numbers, and None for fields with a default; "
                              f"got {type(value).__name__}")
    return arrays, scalars


def write_particle_piece(directory, rank, region, host_state, extra=None):
    """Write one rank's particles (``host_state``, NumPy arrays) and its ``extra`` arrays; its manifest entry.

    ``region`` (JSON) says which particles the piece may hold, for a reader
    to skip it: ``bounds`` / ``listed_bounds`` (per axis, ``[low, high]``
    of the positions or listed positions) or ``ids`` (``[first, stop)``).
    """
    arrays, scalars = particle_fields(host_state)
    prefix = f"rank-{int(rank):06d}"
    return {"rank": int(rank), "particles": int(host_state.size), **region, "scalars": scalars,
            "fields": {name: write_array(directory, f"{prefix}-{name}.npy", a) for name, a in arrays.items()},
            "extra": {name: write_array(directory, f"{prefix}-extra-{name}.npy", np.asarray(a))
                      for name, a in (extra or {}).items()}}


def _write_rank_particles(spec, ranks, results, directory):
    """Every rank of this worker writes its particles (a worker task); their manifest entries and the state class."""
    from hpcgpu.partition.decomposition import on_worker

    model = on_worker(spec.model)
    entries, state_type = [], None
    for rank, result in zip(ranks, results):
        carried = getattr(result, "carried", result)
        host, extra, region = spec.decomposition.checkpoint_particles(model, rank, carried)
        state_type = type(host)
        entries.append(write_particle_piece(directory, rank, region, host, extra))
    return entries, state_type


def write_rank_checkpoint(directory, executor, model, meta):
    """The ranks of ``executor`` write their particles into ``directory`` (emptied first), then the client the manifest.

    :func:`hpcgpu.checkpoint.write_rank_checkpoint` names the directory
    and prunes older checkpoints around this.
    """
    pieces, state_type = write_by_ranks(directory, executor, _write_rank_particles)
    decomposition = executor.decomposition
    grid = getattr(getattr(decomposition, "bricks", None), "grid", (len(pieces),))
    particles = sum(piece["particles"] for piece in pieces)
    return write_manifest(directory, model, state_type, {
        **meta, "format": FORMAT, "decomposition": model.decomposition, "particles": particles,
        "process_grid": [int(n) for n in grid], "pieces": pieces})


def pieces_of(directory, manifest, content):
    """The block source of a particle checkpoint's pieces, from its manifest and ``model.pkl`` content."""
    return ParticlePieces(directory, content["state_type"], manifest["pieces"])


def position_bounds(positions):
    """``[[low, high], ...]`` of ``positions`` ``(3, N)`` per axis (JSON; None without particles)."""
    positions = np.asarray(positions)
    if positions.shape[-1] == 0:
        return None
    return [[float(row.min()), float(row.max())] for row in positions]


def periodic_overlap(low, high, lo, hi, radius, length):
    """Whether ``[low, high]`` meets ``[lo - radius, hi + radius]`` on a periodic axis of ``length`` (generously).

    Examples
    --------
    >>> periodic_overlap(9.5, 9.9, 0.0, 2.0, 1.0, 10.0), periodic_overlap(5.0, 6.0, 0.0, 2.0, 1.0, 10.0)
    (True, False)
    """
    slack = 1e-9 * length  # a prefilter: the exact test on each particle follows
    if hi - lo + 2 * radius + 2 * slack >= length:
        return True
    return any(low <= hi + radius + slack + k * length and high >= lo - radius - slack + k * length
               for k in (-1, 0, 1))


def take_particles(state, index):
    """The particles ``index`` of a host particle state, every per-particle array (scalars kept)."""
    arrays, scalars = particle_fields(state)
    return type(state)(**{name: np.take(a, index, axis=-1) for name, a in arrays.items()}, **scalars)


@dataclass(frozen=True)
class IdRange:
    """The particles of ids ``first <= id < stop``, in id order: an N-body rank's block."""

    first: int
    stop: int

    def wants(self, entry):
        """Whether a piece (its manifest entry) may hold some of these ids."""
        ids = entry.get("ids")
        return ids is None or (ids[0] < self.stop and ids[1] > self.first)

    def keep(self, state, extra):
        """The indices of the ids kept, in id order."""
        ids = np.asarray(extra["ids"] if "ids" in extra else state.ids)
        inside = np.nonzero((ids >= self.first) & (ids < self.stop))[0]
        return inside[np.argsort(ids[inside], kind="stable")]


@dataclass(frozen=True)
class ParticlePieces:
    """A block source of particles: any rank's particles, read from a checkpoint's pieces.

    ``pieces`` are the manifest's entries; a *selection* (:class:`IdRange`,
    :class:`~hpcgpu.partition.brick_start.BrickHalo`) says which pieces a
    rank reads (``wants``) and which particles it keeps (``keep``).
    """

    directory: str
    state_type: type
    pieces: list

    def has_extra(self, name):
        """Whether every piece holds the extra array ``name`` (e.g. ``"listed"``: every rank had a list)."""
        return all(name in piece.get("extra", {}) for piece in self.pieces)

    @property
    def particles(self):
        """Particles in all."""
        return sum(piece["particles"] for piece in self.pieces)

    def scalars(self):
        """The state's numbers: each the largest over the pieces (step: the same on every rank; list builds:
        as a model's ``concat_blocks`` joins them)."""
        names = self.pieces[0]["scalars"]
        return {name: max(piece["scalars"][name] for piece in self.pieces) for name in names}

    def _read(self, chosen):
        """``(state, extra)`` of the pieces ``chosen``, joined in their order (host arrays, checked)."""
        names = list(chosen[0]["fields"])
        arrays = {name: np.concatenate([load_array(self.directory, p["fields"][name]) for p in chosen], axis=-1)
                  for name in names}
        extras = [name for name in chosen[0].get("extra", {}) if all(name in p.get("extra", {}) for p in chosen)]
        extra = {name: np.concatenate([load_array(self.directory, p["extra"][name]) for p in chosen], axis=-1)
                 for name in extras}
        return self.state_type(**arrays, **self.scalars()), extra

    def owned_block(self, model, where):
        """``(state, extra)``: the particles that the selection ``where`` keeps, from the pieces it wants.

        Host arrays; ``extra`` holds the extra arrays of those particles.

        Raises
        ------
        ConfigError
            A piece it reads is corrupted (the message names it).
        """
        chosen = [piece for piece in self.pieces if where.wants(piece)] or self.pieces[:1]
        state, extra = self._read(chosen)
        index = where.keep(state, extra)
        return take_particles(state, index), {name: np.take(a, index, axis=-1) for name, a in extra.items()}

    def whole_state(self, model):
        """Every particle in id order, for a run in one process (with a list built where the ranks' were, if the
        pieces say where and the model can: ``relist``)."""
        state, extra = self._read(self.pieces)
        ids = np.asarray(extra["ids"] if "ids" in extra else state.ids)
        order = np.argsort(ids, kind="stable")
        state = take_particles(state, order)
        if "listed" in extra and callable(getattr(model, "relist", None)):
            return model.relist(state, np.take(extra["listed"], order, axis=-1))
        if not callable(getattr(model, "restore_state", None)):
            return model.concat_blocks([state])
        return state
