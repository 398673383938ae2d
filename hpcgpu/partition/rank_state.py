"""Where a partitioned run's initial blocks come from: built by the ranks themselves, or split on the client.

A decomposition that can (``builds_blocks``: the distributed grid) lets
every rank build its own initial block on its worker
(:meth:`~hpcgpu.partition.decomposition.Decomposition.build_block`) from a
*block source*: an object whose ``owned_block(model, where)`` gives the
state of the owned cells of ``where`` (a
:class:`~hpcgpu.partition.block_region.BlockRegion`) as host or backend
arrays. Two sources exist: :class:`InitialBlocks`, the model's own initial
condition (``model.initial_block``), and a checkpoint's pieces
(:class:`hpcgpu.rank_checkpoints.CheckpointPieces`). Only the source and the
layout travel to the workers; no full-size array is built on the client or
passes through the scheduler. The ranks report each block's health (small
dicts), from which the client learns the start's CFL number and, when no
``dt`` was given, the step at CFL number 0.5.

The bricks of MD (``builds_initial_blocks``) build their atoms the same
way from the model's lattice (:mod:`hpcgpu.partition.brick_start`), and
the all-pairs ranks of N-body their bodies by id
(:mod:`hpcgpu.partition.bodies_start`); their reports carry exact sums of
the raw velocities, from which :func:`settle_dt` settles the decomposition
(``settled``: the velocities' normalisation, atoms per brick). Where the
health reads the velocities (``health_after_settling``: the bodies' CFL
number without softening) the ranks report it once more, on the settled
blocks (:func:`settled_health`): the start's CFL number and ``dt`` are the
one-process run's. Particle decompositions (``particle_pieces``: bricks
and all-pairs bodies) also build their blocks from a checkpoint's
particle pieces (:class:`hpcgpu.particle_checkpoints.ParticlePieces`):
each rank keeps the particles of its brick or of its id range.

A state the user brings (a global state on the client), and every model
whose decomposition cannot build blocks, take the fallback: the client
splits the global state and scatters the blocks
(:meth:`~hpcgpu.partition.decomposition.Decomposition.split_state`).

Examples
--------
>>> from hpcgpu.workloads.weather import ShallowWater
>>> model = ShallowWater("gravity_wave", nx=16, ny=8, backend="numpy")
>>> block_source(model, None)
InitialBlocks()
>>> block_source(model, model.initial_state()) is None  # a state the user brings: split on the client
True
"""

import dataclasses

from hpcgpu.errors import ConfigError
from hpcgpu.partition.decomposition import InitialBlocks

__all__ = ["DEFAULT_CFL", "InitialBlocks", "block_source", "build_blocks", "local_state", "place_blocks",
           "settle_dt", "settled_health"]

DEFAULT_CFL = 0.5
"""The CFL number of the step chosen when none is given (as ``model.suggested_dt``'s default)."""


def block_source(model, state):
    """The block source the ranks build ``state`` from, or None when the client must split it.

    ``state`` None means the model's initial condition (:class:`InitialBlocks`
    when the model has ``initial_block`` and its decomposition builds
    blocks); a block source (``owned_block``: grid or particle pieces of a
    checkpoint) is itself; anything else is a global state the user brought.
    """
    from hpcgpu.partition.decompositions import DECOMPOSITIONS

    kind = DECOMPOSITIONS.get(getattr(model, "decomposition", None))
    if kind is None or not (kind.builds_blocks or kind.builds_initial_blocks or kind.particle_pieces):
        return None
    if state is None:  # a decomposition that builds only from pieces splits the initial state
        builds = kind.builds_blocks or kind.builds_initial_blocks
        return InitialBlocks() if builds and callable(getattr(model, "initial_block", None)) else None
    return state if callable(getattr(state, "owned_block", None)) else None


def local_state(model, state):
    """The whole state on the model's backend in this process, from ``state`` (None, a block source or a state)."""
    if state is None:
        return model.initial_state()
    if callable(getattr(state, "owned_block", None)):
        whole = state.whole_state(model)
        restore = getattr(model, "restore_state", None)
        return whole if restore is None else restore(whole)
    return state


def build_blocks(model, decomposition, ranks, source):
    """The initial blocks of ``ranks`` on this worker, and each one's health (a worker task).

    Returns ``(results, health)``: a :class:`~hpcgpu.partition.epochs.RankResult`
    per rank (what an epoch carries on) and each block's part of the health
    check, computed on the host copy (a NumPy twin of the model).
    """
    from hpcgpu.partition.decomposition import on_worker
    from hpcgpu.partition.epochs import RankResult

    model = on_worker(model)
    host_model = model.with_backend("numpy")
    results, health = [], []
    for rank in ranks:
        block = decomposition.build_block(model, rank, source)
        results.append(RankResult(block))
        health.append(decomposition.initial_report(host_model, block))
    return results, health


def _first(pair):
    return pair[0]


def _second(pair):
    return pair[1]


def place_blocks(client, model, decomposition, state, ranks_by_worker, key):
    """Each worker's initial blocks, resident there: ``({worker: future(s)}, health parts or None)``.

    With a block source (see :func:`block_source`) the ranks build their
    blocks; otherwise the client splits ``state`` (the model's initial
    state when None) and scatters the blocks. ``key(phase, index)`` names
    the tasks.
    """
    source = block_source(model, state)
    if source is None:
        state = model.initial_state() if state is None else state
        blocks = decomposition.split_state(model, state)
        return {worker: client.scatter([blocks[r] for r in ranks], workers=[worker], hash=False)
                for worker, ranks in ranks_by_worker.items()}, None
    results, health = {}, []
    for index, (worker, ranks) in enumerate(ranks_by_worker.items()):
        options = dict(workers=[worker], allow_other_workers=False, pure=False)
        built = client.submit(build_blocks, model, decomposition, ranks, source, key=key("build", index), **options)
        results[worker] = client.submit(_first, built, key=key("blocks", index), **options)
        health.append(client.submit(_second, built, key=key("health", index), **options))
    _wait_watching(client, health, list(ranks_by_worker))
    parts = [part for worker_parts in client.gather(health) for part in worker_parts]
    if decomposition.health_after_settling:
        settled = decomposition.settled(model, parts)
        again = [client.submit(settled_health, model, settled, results[worker], key=key("health-settled", index),
                               workers=[worker], allow_other_workers=False, pure=False)
                 for index, worker in enumerate(ranks_by_worker)]
        _wait_watching(client, again, list(ranks_by_worker))
        healths = [health for worker_parts in client.gather(again) for health in worker_parts]
        parts = [{**part, **health} for part, health in zip(parts, healths)]
    return results, parts


def settled_health(model, decomposition, results):
    """The health of each block in ``results`` as the run starts it: with what ``decomposition`` settled (a task)."""
    from hpcgpu.partition.decomposition import on_worker

    host_model = on_worker(model).with_backend("numpy")
    return [host_model.block_health(decomposition.model_state(result.carried)) for result in results]


def _wait_watching(client, futures, workers, poll_s=1.0):
    """Wait for ``futures`` (pinned to ``workers``); WorkerLost as soon as one of those workers is gone."""
    from distributed import wait

    from hpcgpu.cluster import worker_info
    from hpcgpu.errors import WorkerLost

    while any(f.status == "pending" for f in futures):
        try:
            wait(futures, timeout=poll_s)
        except Exception:  # noqa: BLE001 - dask's TimeoutError: not done yet
            pass
        missing = sorted(set(workers) - set(worker_info(client)))
        if missing and any(f.status == "pending" for f in futures):
            client.cancel(futures)
            raise WorkerLost(f"{', '.join(missing)} left the cluster while the ranks built their initial blocks")


def settle_dt(model, decomposition, dt, parts):
    """``(dt, decomposition, (bad, cfl))`` once the ranks reported their blocks' health ``parts``.

    Without ``parts`` (the client split the state) ``dt`` and the layout
    stay and the health is None. Else the layout is ``settled`` on the
    parts; without ``dt``, it becomes the model's ``suggested_dt_for_rate``
    (if it has one) or the step at CFL number :data:`DEFAULT_CFL`.

    Raises
    ------
    ConfigError
        No ``dt`` given and the initial state has no finite positive CFL rate.
    """
    if parts is None:
        return dt, decomposition, None
    decomposition = decomposition.settled(model, parts)
    choose = getattr(model, "suggested_dt_for_rate", None)  # a model's own rule for its step
    if dt is None and choose is not None:
        dt = choose(model.combine_health(parts, 1.0)[1])
        decomposition = dataclasses.replace(decomposition, dt=float(dt))
    elif dt is None:
        rate = model.combine_health(parts, 1.0)[1]
        if not rate > 0 or rate == float("inf"):
            raise ConfigError(f"dt: the initial state's CFL number per unit time is {rate!r}, so no step can be "
                              "chosen from it; give dt (a positive number) or check the initial state")
        dt = DEFAULT_CFL / rate
        decomposition = dataclasses.replace(decomposition, dt=float(dt))
    return dt, decomposition, model.combine_health(parts, dt)
