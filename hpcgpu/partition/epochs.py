"""The worker side of the SPMD engine: one epoch of a worker's ranks.

:func:`epoch_task` is the task :class:`~hpcgpu.partition.engine.PartitionedExecutor`
pins on each worker: it runs the program the driver queued (advances,
health checks, diagnostics) on each of the worker's ranks (one thread each
beyond the first), through the run's decomposition and a communicator set
up for the session, and returns every rank's :class:`RankResult`. A rank
that raises aborts the session on every rank; the worker re-raises the root
cause, not the aborts it caused (both through
:mod:`hpcgpu.partition.worker_ranks`, as the distributed CG's ranks).
"""

import time
from dataclasses import dataclass, field

from hpcgpu.errors import ConfigError
from hpcgpu.partition.communicator import LoopbackCommunicator
from hpcgpu.partition.decomposition import on_worker, rank_cache
from hpcgpu.partition.rank_activity import recording
from hpcgpu.partition.rank_reductions import run_reduction
from hpcgpu.partition.worker_ranks import aborting_on_failure, run_ranks

__all__ = ["RankResult", "Spec", "epoch_records", "epoch_task", "host_blocks", "unhealthy"]


@dataclass
class RankResult:
    """What one rank keeps between epochs (``carried``, its resident block) and what rank 0 reports."""

    carried: object
    records: list = field(default_factory=list)
    seconds: float = 0.0
    steps: int = 0
    ranks: list = None  # on rank 0: (seconds, seconds waiting for messages, rank thread's CPU seconds) of every rank
    transport: str = ""


@dataclass(frozen=True)
class Spec:
    """What every epoch task needs that does not change during a run (scattered once)."""

    model: object
    dt: float
    decomposition: object


class _Context:
    """One rank's view of the run inside an epoch: model, communicator, layout, caches."""

    def __init__(self, spec, session, rank, worker=None):
        # the communicator first: whatever fails after it can still abort the other ranks
        if session is None:
            self.comm = LoopbackCommunicator()
            self.cache = rank_cache("local", rank)
        else:
            from hpcgpu.partition.communicator_choice import choose_communicator

            # NCCL for device buffers when every rank has its own GPU, else dask's comm layer
            self.comm = choose_communicator(session, rank, worker)
            self.cache = rank_cache(session.id, rank)
        self.rank = rank
        self.size = self.comm.size
        self.dt = spec.dt
        self.decomposition = spec.decomposition
        self.model = None
        self.model = on_worker(spec.model)


def unhealthy(model, bad, cfl):
    """Whether a health check's ``(bad, cfl)`` fails: NaN/inf fields, or a CFL number NaN or above ``model.cfl_limit``.

    :class:`~hpcgpu.simulation.Simulation` raises
    :class:`~hpcgpu.errors.UnstableSimulation` on such a check; the ranks
    stop their program there, and the client drops what was sent after it.
    """
    return bool(bad) or not cfl <= getattr(model, "cfl_limit", float("inf"))


_OPERATION_WORDS = {"health": "a health check", "diagnostics": "diagnostics", "reduce": "a reduction"}


def _run_program(context, carried, program, activity=None, where=(None, 0)):
    """Run ``program`` (advances, health checks, diagnostics, work on the ranks, reductions) on one rank.

    A ``("ranks", task)`` operation calls ``task(context, state)`` on every
    rank (``state`` the rank's model state; ``context.comm`` its
    communicator): collective work the driver queued between steps, such
    as the exchange of a snapshot's particles. A ``("reduce", ...)``
    operation sums a function of every rank's block up to rank 0
    (:mod:`hpcgpu.partition.rank_reductions`). Returns the rank's RankResult.

    ``activity`` (a :class:`~hpcgpu.partition.rank_activity.RankActivity`)
    records each operation, named by ``where``: the epoch's number and the
    run's step at its start.
    """
    decomposition, model, comm = context.decomposition, context.model, context.comm
    records, steps = [], 0
    epoch, first_step = where
    label = "" if epoch is None else f"epoch {epoch}, "
    # the rank thread's own CPU time beside its wall time: the gap is what
    # other threads and processes took from its core while it had work
    started, waited, cpu = time.perf_counter(), comm.wait_seconds, time.thread_time() - comm.wait_cpu_seconds
    carried = decomposition.resume(context, carried)
    for op, value in program:
        if activity is not None:
            step = first_step + steps
            activity.set(f"{label}advancing steps {step} to {step + value}" if op == "advance"
                         else f"{label}{_OPERATION_WORDS.get(op) or getattr(value, 'what', op)} at step {step}")
        if op == "advance":
            carried = decomposition.advance(context, carried, value)
            steps += value
        elif op == "health":
            parts = comm.allgather(decomposition.block_health(context, carried))
            bad, cfl = model.combine_health(parts, context.dt)
            if context.rank == 0:
                records.append(("health", value, (bad, cfl)))
            if unhealthy(model, bad, cfl):
                break  # every rank saw the same parts: all stop here, the driver reports the step
        elif op == "diagnostics":
            parts = comm.gather(decomposition.block_sums(context, carried))
            if context.rank == 0:
                records.append(("diagnostics", value, model.combine_sums(parts)))
        elif op == "ranks":  # the ranks' own work on their state, with their communicator (e.g. a snapshot)
            value(context, decomposition.model_state(carried))
        elif op == "reduce":  # a diagnostic summed over the ranks (hpcgpu.partition.rank_reductions)
            record = run_reduction(context, carried, value)
            if record is not None:
                records.append(record)
        else:  # pragma: no cover - the client builds programs
            raise ConfigError(f"unknown epoch operation {op!r}")
    model.backend.synchronize()
    seconds = time.perf_counter() - started
    # CPU outside the waits, beside the wall time outside them (a wait's own CPU, taking a
    # message in, is the exchange's: with it a tiny step's share could pass 1)
    ranks = comm.gather((seconds, comm.wait_seconds - waited, time.thread_time() - comm.wait_cpu_seconds - cpu))
    return RankResult(carried, records, seconds, steps, ranks, comm.transport)


def _run_rank(spec, session, rank, carried, program, worker=None, where=(None, 0)):
    context = None
    with aborting_on_failure(session, rank, worker, lambda: getattr(context, "comm", None)), \
            recording(getattr(session, "id", None), rank) as activity:
        context = _Context(spec, session, rank, worker)
        activity.comm = context.comm
        return _run_program(context, carried, program, activity, where)


def epoch_task(spec, session, ranks, carried, program, where=(None, 0)):
    """The epoch of the ranks on this worker (one thread each beyond the first); their RankResults.

    ``carried`` holds, per rank, its RankResult of the last epoch or its
    initial block; ``where`` is ``(epoch number, the run's step at its
    start)``, the words of a deadline's report
    (:mod:`hpcgpu.partition.rank_activity`).
    """
    carried = [c.carried if isinstance(c, RankResult) else c for c in carried]
    worker = None
    if session is not None:
        from distributed import get_worker

        worker = get_worker()  # the rank threads are not task threads: they get it from here
    return run_ranks(ranks, lambda k: _run_rank(spec, session, ranks[k], carried[k], program, worker, where))


def epoch_records(results):
    """Rank 0's records and timing, from its worker's epoch results (a small task: only scalars travel)."""
    first = results[0]
    return first.records, first.seconds, first.steps, first.ranks, first.transport


def host_blocks(spec, results):
    """The host copy of the model state of each rank in ``results`` (one worker's epoch results)."""
    model = on_worker(spec.model)
    return [model.to_host(spec.decomposition.model_state(r.carried)) for r in results]


def _local_epoch(spec, carried, program):
    """The single-process path (tests, and a rank's work in isolation)."""
    return _run_program(_Context(spec, None, 0), carried, program)

