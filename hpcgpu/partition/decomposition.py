"""What every decomposition builds on: the base class, and a rank's model and caches on its worker.

A *decomposition* says how a model's state is split into ranks and what a
rank does in an epoch of the SPMD engine (:mod:`hpcgpu.partition.engine`):
one module per kind (:mod:`~hpcgpu.partition.grid`,
:mod:`~hpcgpu.partition.all_pairs`, :mod:`~hpcgpu.partition.bricks`), each a
subclass of :class:`Decomposition`, found by kind in
:mod:`hpcgpu.partition.decompositions`. This module sits below them and
below the engine: it imports neither.
"""

import dataclasses
import functools
import threading

__all__ = ["Decomposition", "InitialBlocks", "forget_rank_caches", "on_worker", "rank_cache"]


@functools.lru_cache(maxsize=8)
def _resolved(model_bytes):
    import pickle

    model = pickle.loads(model_bytes)
    # "auto" resolves on the worker's own hardware (its GPU, or Numba).
    if getattr(model, "backend_request", None) == "auto":
        model = model.with_backend("auto")
    return model


def on_worker(model):
    """``model`` with its ``"auto"`` backend resolved on this worker (cached per model)."""
    import pickle

    try:
        model_bytes = pickle.dumps(model)
    except (pickle.PicklingError, AttributeError, TypeError):
        # a class defined in a script or notebook (__main__) reached the worker by value
        # (dask sends tasks with cloudpickle): plain pickle cannot name it there
        import cloudpickle

        model_bytes = cloudpickle.dumps(model)
    return _resolved(model_bytes)


_rank_caches = {}
_rank_caches_lock = threading.Lock()


def rank_cache(session_id, rank):
    """A dict that lives on this worker for one rank of one session, epoch after epoch (work buffers)."""
    with _rank_caches_lock:
        return _rank_caches.setdefault((session_id, rank), {})


def forget_rank_caches(session_id):
    """Drop the caches of every rank of ``session_id`` in this process (the session closed)."""
    with _rank_caches_lock:
        for key in [k for k in _rank_caches if k[0] == session_id]:
            del _rank_caches[key]


class Decomposition:
    """How a model's state is split into ranks and what a rank does in an epoch (base class).

    The client side (``layout``, ``split``, ``join``) runs once per run; the
    rank side (``resume``, ``advance``, ``model_state``, ``block_sums``)
    inside every epoch, on the workers. Subclasses are frozen dataclasses:
    they travel to the workers with the run's :class:`~hpcgpu.partition.epochs.Spec`.
    """

    unit = "items"
    builds_blocks = False
    """Whether a rank can build its own initial block (:meth:`build_block`) and checkpoint it as a piece
    (:meth:`piece_region`); else the client splits a global state (:meth:`split_state`)."""
    builds_initial_blocks = False
    """Whether a rank can build its own initial block from the model (:meth:`build_block`) though its
    checkpoints are not grid pieces (bricks: atoms move between ranks)."""
    health_after_settling = False
    """Whether the health of a rank-built block depends on what :meth:`settled` brings (all-pairs bodies:
    the start's CFL number reads the velocities), so the ranks report it once more after settling."""
    particle_pieces = False
    """Whether each rank checkpoints its particles as a piece (``checkpoint_particles(model, rank, carried)``)
    and builds its block from such pieces (:mod:`hpcgpu.particle_checkpoints`): bricks and all-pairs bodies."""

    @classmethod
    def calibrate(cls, client, model):
        """``{worker: steps/s}`` for ``weights="calibrate"``; only grid decompositions measure it."""
        from hpcgpu.errors import ConfigError

        raise ConfigError(f"weights='calibrate' is only available for grid models; give {cls.unit} weights as "
                          "numbers, one per partition")

    # client side
    def split_state(self, model, state):
        """The initial block of each rank, from the model's global state wherever it lives.

        The engine calls this; the default copies the state to the host and
        calls :meth:`split`. A decomposition that needs more of the state
        than its host copy keeps (bricks: where the neighbour list was built)
        reads it here.
        """
        return self.split(model, model.to_host(state))

    def split(self, model, host_state):  # pragma: no cover - interface
        """The initial block of each rank, from the global state on the host."""
        raise NotImplementedError

    def build_block(self, model, rank, source):  # pragma: no cover - interface
        """Rank ``rank``'s initial block (host arrays), built on its worker from ``source``.

        ``source`` has ``owned_block(model, where)``: the state of the owned
        cells of ``where`` (see :mod:`hpcgpu.partition.rank_state`).
        """
        raise NotImplementedError

    def initial_report(self, model, block):
        """What a rank reports of its built block (small): its health, and what :meth:`settled` needs."""
        return model.block_health(self.model_state(block))

    def settled(self, model, parts):
        """The layout once every rank's :meth:`initial_report` is in (a rank-built start's sums); as it is here."""
        return self

    def for_ranks(self):
        """This layout as the ranks need it (what the run's spec broadcasts): without what only the client uses.

        The default is the layout itself; one that keeps data of the client's
        split (bricks: the atom order ``join`` restores) drops it here, so that
        nothing that grows with the state travels to every worker.
        """
        return self

    def piece_region(self, rank):  # pragma: no cover - interface
        """What rank ``rank`` owns, as JSON (a checkpoint piece's region)."""
        raise NotImplementedError

    def join(self, model, host_blocks):
        """The global state from every rank's block (host), in rank order."""
        return model.concat_blocks(host_blocks)

    def sizes(self):  # pragma: no cover - interface
        """Items per rank at the start (``bounds``-like pairs for describe and the dashboard)."""
        raise NotImplementedError

    def describe(self):
        """Facts of the layout for the run's summary (beside partitions and sizes)."""
        return {}

    # rank side
    def resume(self, context, carried):
        """What :meth:`advance` works on, from what the last epoch left (or the initial block)."""
        return carried

    def advance(self, context, carried, steps):  # pragma: no cover - interface
        raise NotImplementedError

    def model_state(self, carried):
        """The model state of the rank's own items."""
        return carried

    def block_sums(self, context, carried):
        """This rank's part of the diagnostics."""
        return context.model.block_sums(self.model_state(carried), 0, None)

    def block_health(self, context, carried):
        """This rank's part of the health check (a decomposition whose check reads neighbours overrides it)."""
        return context.model.block_health(self.model_state(carried))


@dataclasses.dataclass(frozen=True)
class InitialBlocks:
    """The block source of a model's own initial condition: ``model.initial_block(where)`` on each rank."""

    def owned_block(self, model, where):
        """The model's initial state on the owned cells of ``where``."""
        return model.initial_block(where)

    def whole_state(self, model):
        """The whole grid's initial state (a run in one process)."""
        return model.initial_state()
