"""The SPMD engine: epochs of one pinned task per worker that run the time loop themselves.

dask is the cluster, not the time loop. :class:`PartitionedExecutor` splits
the state into partitions (one *rank* each) and keeps them resident on the
workers; an *epoch* is one task per worker (pinned there, not pure, never
retried) that advances its ranks through many steps, until the next thing
the driver needs: diagnostics, a health check, output, a checkpoint, the
stop. Inside an epoch the ranks exchange what their neighbours need
directly, through a :class:`~hpcgpu.partition.communicator.Communicator`
(halos for grids, every position for all-pairs gravity, ghost atoms,
migrants and the rebuild decision for short-range MD); the scheduler sees
one task per worker per epoch, never one per step. An epoch returns each
rank's new resident block, and rank 0 the diagnostic and health scalars
the driver asked for (reduced on the workers: only scalars reach the
client).

The driver's calls map onto epochs like this: ``advance(n)`` and the
``request_*`` calls after it are queued as a *program*; the queue goes to
the workers as one epoch when they would otherwise be idle, when it holds
about :data:`EPOCH_SECONDS` of work, or when the driver waits for a result
(``collect(block=True)``, ``synchronize``, ``global_state``). At most
:data:`MAX_AHEAD` epochs are in flight. So a run that records diagnostics
every 10 steps still runs epochs of about half a second, with the
diagnostics of every 10th step computed inside them.

How a model's state is split and what the ranks exchange is a
*decomposition* (:mod:`hpcgpu.partition.grid`, :mod:`~hpcgpu.partition.all_pairs`,
:mod:`~hpcgpu.partition.bricks`, on the base of :mod:`~hpcgpu.partition.decomposition`),
chosen by ``model.decomposition`` (:mod:`~hpcgpu.partition.decompositions`); what a
model must provide for each is written in :mod:`hpcgpu.partition.protocols`.
This module is the client side; what runs on the workers is
:mod:`hpcgpu.partition.epochs`.

Faults: a rank that raises, or whose wait for a message passes its
timeout, aborts the session on every rank (their waits end at once) and
the client re-raises the first rank's own error, once; a lost worker
aborts the session on the other workers (the scheduler plugin of
:mod:`hpcgpu.partition.dask_communicator`) and the client raises
:class:`~hpcgpu.errors.WorkerLost`, from which
:class:`~hpcgpu.simulation.Simulation` restarts at its last checkpoint on
the workers left. Errors are told apart by their types
(:func:`hpcgpu.partition.faults.is_lost_worker`), never by their words;
ranks aborted with no rank's error behind them are a lost worker only when
a worker of the run really left. Every wait has a timeout, and every wait
of the client for an epoch a deadline (:mod:`hpcgpu.partition.faults`;
the client's waits are :mod:`hpcgpu.partition.epoch_watch`):
past it the client aborts every rank and raises
:class:`~hpcgpu.errors.EpochDeadline`, naming the ranks not done and what
they were doing. A failed or closed run aborts the ranks it leaves
running. Nothing hangs; a rank stuck in compute keeps its worker's thread
until it returns (Python cannot stop a thread), but no longer its peers.

A health check that finds the state blown up (NaN/inf, or a CFL number
above the model's limit) ends its epoch's program there; the client then
drops the epochs sent after it and the queued program, so the run stands at
the failing step (its fields, for a look, from :meth:`~PartitionedExecutor.global_state`).
"""

import math
import os
import time
import uuid
from collections import deque

from hpcgpu.cluster import worker_info
from hpcgpu.errors import ClusterError, ConfigError
from hpcgpu.partition.communicator import DEFAULT_TIMEOUT_S
from hpcgpu.partition.epoch_watch import ROOT_CAUSE_WAIT_S, EpochWatch
from hpcgpu.partition.faults import DEADLINE_ENV, deadline_floor, deadline_why, epoch_deadline
from hpcgpu.partition.decomposition import Decomposition, forget_rank_caches, on_worker, rank_cache  # noqa: F401
from hpcgpu.partition.client_gather import check_gather, rank_state_nbytes
from hpcgpu.partition.decompositions import decomposition_for, decomposition_kind
from hpcgpu.partition.layout import check_weights
from hpcgpu.partition.epochs import RankResult, Spec, epoch_records, epoch_task, host_blocks, unhealthy  # noqa: F401
from hpcgpu.partition.process_grid import check_grid, parse_grid
from hpcgpu.partition.protocols import PROTOCOLS, missing_methods
from hpcgpu.partition.rank_reductions import reduction_operation, take_reduction
from hpcgpu.partition.rank_state import place_blocks, settle_dt
from hpcgpu.validation import check_float, check_int

__all__ = ["Decomposition", "EPOCH_SECONDS", "MAX_AHEAD", "PartitionedExecutor", "decomposition_for"]

EPOCH_SECONDS = 0.5
"""Work one epoch gathers before it is sent, in seconds (when the workers are busy)."""
MAX_AHEAD = 2
"""Epochs in flight at most: enough to hide the scheduler's round trip between
epochs, few enough to bound memory and the overshoot of a wall-time limit."""


# -- the client side -----------------------------------------------------------------------------------
def _host_blocks_of(spec, ranks, results):
    return host_blocks(spec, results)


class PartitionedExecutor:
    """A model's state in partitions resident on dask workers, advanced by SPMD epochs.

    Parameters
    ----------
    client : distributed.Client
    model
        A model whose ``decomposition`` is ``"grid"``, ``"bodies"``,
        ``"domains"`` or ``"spectral"`` (see :mod:`hpcgpu.partition.protocols`).
    state
        None (the model's initial condition), a block source, or a global
        state on the client: see :mod:`hpcgpu.partition.rank_state` (grid
        ranks build their own blocks; a global state is split and scattered).
    dt : float or None
        None: the step at CFL number 0.5 of an initial state the ranks built.
    partitions : int, optional
        Ranks P (default: one per worker). Ranks beyond the worker count
        share workers (each runs in a thread of its worker's epoch task).
    steps_per_task : int, optional
        Grid models: time steps K per halo exchange (default
        :func:`hpcgpu.partition.grid.auto_grid_steps`). Particle
        models exchange every step and take only 1.
    grid : tuple of int or str, optional
        The process grid, ranks along each axis of the decomposition in
        ``(x, y[, z])`` order (``(4, 2)``, ``"2x2x2"``); default: the one
        with the least halo surface for ``partitions``
        (:func:`hpcgpu.partition.process_grid.choose_process_grid`).
        Its product is the number of partitions.
    weights : sequence of float or "calibrate", optional
        Relative partition sizes (one positive finite number per
        partition), or ``"calibrate"`` (grids) to size them by each
        worker's measured step rate.
    name : str
        Run name (dashboard span and task keys).
    timeout : float
        Seconds any wait of a rank may take before the run is aborted (> 0).
    epoch_deadline : float, optional
        The least deadline of an epoch, in seconds (> 0; default
        :data:`~hpcgpu.partition.faults.DEADLINE_ENV` or 60 s): an epoch
        may take 10 times its expected time, and no less than this
        (:mod:`hpcgpu.partition.faults`).

    Raises
    ------
    ConfigError
        A partitioning the model cannot take (too many partitions, a halo
        or ghost radius wider than a partition), or ``timeout``,
        ``epoch_deadline``, ``partitions``, ``steps_per_task`` or
        ``weights`` out of range.
    EpochDeadline
        (from the calls that wait) An epoch passed its deadline: a rank is
        stuck; every rank was aborted.
    ClusterError
        The cluster has no workers.
    """

    def __init__(self, client, model, state, dt, *, partitions=None, steps_per_task=None, weights=None,
                 name="run", timeout=DEFAULT_TIMEOUT_S, grid=None, epoch_deadline=None):
        from hpcgpu.partition.dask_session import open_session

        # checked here: a bad value would otherwise fail deep in the session, or as a timeout mid-run
        timeout = check_float("timeout", timeout, minimum=0.0, strict_min=True)
        self.deadline_floor = deadline_floor(epoch_deadline)
        self._deadline_source = ("epoch_deadline" if epoch_deadline is not None
                                 else DEADLINE_ENV if DEADLINE_ENV in os.environ else "the default")
        self.client = client
        self.model = model
        self.name = name
        workers = sorted(worker_info(client))
        if not workers:
            raise ClusterError("the dask cluster has no workers")
        self.workers = workers
        if grid is not None:
            grid = parse_grid(grid) if isinstance(grid, str) else tuple(grid)
            if partitions is None:
                partitions = math.prod(grid) if all(isinstance(g, int) for g in grid) else None
        partitions = len(workers) if partitions is None else check_int("partitions", partitions, minimum=1)
        if grid is not None:
            grid = check_grid(grid, len(grid), partitions)
        if steps_per_task is not None:
            steps_per_task = check_int("steps_per_task", steps_per_task, minimum=1)
        builder = decomposition_for(model)
        kind = decomposition_kind(model)
        missing = missing_methods(model, PROTOCOLS[kind])
        if missing:
            raise ConfigError(f"{type(model).__name__} cannot be partitioned as {kind!r}: it lacks "
                              f"{', '.join(missing)} (see hpcgpu.partition.protocols)")
        self.owner = [workers[p % len(workers)] for p in range(partitions)]
        self.weights_requested = weights  # as given: a restart on the workers left asks for the same
        self.grid_requested = grid  # as given (None: chosen): a restart keeps a forced process grid
        if isinstance(weights, str):
            if weights != "calibrate":
                raise ConfigError(f"weights must be a sequence of numbers or 'calibrate'; got {weights!r}")
            self.rates = builder.calibrate(client, model)
            # ranks that share a worker share its rate
            weights = [self.rates[w] / self.owner.count(w) for w in self.owner]
            calibrated = True
        else:
            calibrated = False
            if weights is not None:
                weights = check_weights(weights, partitions)
        self.decomposition = builder.build(model, 1.0 if dt is None else dt, partitions, steps_per_task, weights,
                                           calibrated, grid=grid)
        self.token = uuid.uuid4().hex[:12]
        self._ranks = {}
        for rank, worker in enumerate(self.owner):
            self._ranks.setdefault(worker, []).append(rank)
        # each worker's current epoch result (here: its ranks' initial blocks, built there when they can be)
        self._results, parts = place_blocks(client, model, self.decomposition, state, self._ranks,
                                            lambda phase, index: self._key(phase, index, epoch=0))
        self.dt, self.decomposition, self.initial_health = settle_dt(model, self.decomposition, dt, parts)
        self.steps_per_task = self.decomposition.steps_per_task
        self.unit = self.decomposition.unit
        self.bounds = self.decomposition.sizes()
        self.weights = list(self.decomposition.weights)
        self.step = 0
        self.epoch = 0
        self.session = open_session(client, self.owner, timeout)
        self._watch = EpochWatch(client, self.session, self.owner, name, self._abandon)
        # the layout as the ranks need it: nothing of the client's split that grows with the state
        self._spec = client.scatter(Spec(model, self.dt, self.decomposition.for_ranks()), broadcast=True, hash=False)
        self._program = []
        self._in_flight = deque()  # (epoch, steps, records future, result futures)
        self._dropped = []  # epochs sent after a failed health check, still running: results discarded
        self._halted = False  # a failed health check is filed and the driver has not collected it yet
        self._ready = []
        self._seconds_per_step = None
        self._submitted = {}  # epoch -> (time.monotonic() it was sent, the run's step at its start, its operations)
        self._operations_done = set()  # kinds of operation of the epochs taken: a new one may compile kernels
        self._taken_at = 0.0  # when the client last took an epoch: the next one cannot have started before
        self._closed = False
        self._lost_at_close = False  # close() dropped checks or diagnostics that were asked for
        self._failure = None
        self.transport = "direct" if self.session.direct else "dask"  # until the ranks report theirs
        # per finished epoch: its steps and every rank's (seconds, seconds waiting for messages,
        # CPU seconds of the rank's thread)
        self.epoch_stats = []

    # -- what the driver calls -------------------------------------------------------------------------
    @property
    def partitions(self):
        return len(self.owner)

    @property
    def granularity(self):
        """Steps the driver's default schedules round to (K for grids, 1 for particles)."""
        return self.steps_per_task

    @property
    def usable(self):
        """False once the run was closed or an epoch failed (its partitions are gone)."""
        return not self._closed and self._failure is None

    def _check_open(self, what):
        if self._closed:
            raise ClusterError(f"{self.name}: {what} after the run was closed; its state is no longer on "
                               "the cluster (read diagnostics before close(), or keep the run open)")
        if self._failure is not None:
            raise ClusterError(f"{self.name}: {what} after the run failed ({self._failure}); its partitions are "
                               "gone: resume from a checkpoint")

    def advance(self, steps):
        """Queue ``steps`` time steps (sent to the workers as part of an epoch; returns at once).

        Waits for the oldest epoch first when :data:`MAX_AHEAD` are in
        flight. Does nothing once a failed health check is filed and not yet
        collected: the driver asked for these steps before it could know,
        and the run stays at the failing step.
        """
        self._check_open("the run was advanced")
        steps = check_int("steps", steps, minimum=0)
        if steps == 0 or self._halted:
            return
        if self._program and self._long_enough():
            # the throttle before the steps are counted: an interrupted wait (Ctrl-C) leaves them
            # uncounted here as in the driver, which counts them once this returns
            self._make_room()
            if self._halted:  # the epoch just taken failed its health check
                return
            self._submit()
        self._program.append(("advance", steps))
        self.step += steps

    def request_health(self, step):
        """Check the state after the queued steps for NaN/inf and the CFL number (result via :meth:`collect`).

        Ignored while a failed health check awaits collection (see :meth:`advance`).
        """
        self._check_open("a health check was requested")
        if not self._halted:
            self._program.append(("health", step))

    def request_diagnostics(self, step):
        """Reduce the model's diagnostics after the queued steps (result via :meth:`collect`).

        Ignored while a failed health check awaits collection (see :meth:`advance`).
        """
        self._check_open("diagnostics were requested")
        if not self._halted:
            self._program.append(("diagnostics", step))

    def request_on_ranks(self, task):
        """Run ``task(context, state)`` on every rank after the queued steps, inside the epoch (returns at once).

        ``context`` holds the rank's ``rank``, ``size``, ``model``,
        ``decomposition`` and ``comm`` (its communicator: the task may run
        collectives, which every rank reaches at the same point of the
        program); ``state`` is the rank's model state. A task's ``what``
        (words, e.g. "a snapshot") names it in a deadline's report. Its
        return value is dropped; an error in it fails the epoch, as a rank's
        step does. Ignored while a failed health check awaits collection
        (see :meth:`advance`).
        """
        self._check_open("work on the ranks was requested")
        if not self._halted:
            self._program.append(("ranks", task))

    def collect(self, block=False):
        """Finished health checks and diagnostics, in order: ``(kind, step, value)``.

        Sends the queued program when the workers would otherwise idle (or
        when ``block``, which also waits for everything sent). A failed
        health check is the last record returned: what was queued or sent
        after it is dropped, and ``step`` and the state are those of
        its step.

        Raises
        ------
        ClusterError
            After :meth:`close`, when waiting (``block``) or when close
            dropped checks or diagnostics still to come (those taken in
            before it are still returned).
        """
        if self._closed and (block or self._lost_at_close):
            self._check_open("results were collected")
        self._drain(block)
        ready, self._ready = self._ready, []
        self._halted = False  # the driver has the failed check now: it decides what comes next
        return ready

    def synchronize(self):
        """Send what is queued and wait until every epoch has finished (raises on a failure)."""
        self._check_open("the run was synchronized")
        self._drain(block=True)  # the records stay for the driver's next collect

    def health(self):
        """Blocking health check of the current state: ``(bad_fields, cfl)``."""
        self.request_health(self.step)
        return [value for kind, _, value in self.collect(block=True) if kind == "health"][-1]

    def diagnostics(self):
        """Blocking global diagnostics of the current state (dict of floats)."""
        self.request_diagnostics(self.step)
        values = [value for kind, _, value in self.collect(block=True) if kind == "diagnostics"][-1]
        values["max_cfl"] = self.health()[1]
        return values

    def reduce_on_ranks(self, function, *args):
        """The sum over the ranks of ``function(rank, block, *args)`` after the queued steps (blocking).

        Runs inside an epoch, so the ranks may exchange messages; only the
        sum reaches the client (:mod:`hpcgpu.partition.rank_reductions`).
        """
        self._check_open("a reduction on the ranks was requested")
        operation = reduction_operation(self.step, function, args)
        if not self._halted:
            self._program.append(operation)
        self.synchronize()
        value, self._ready = take_reduction(self._ready, operation)
        return value

    def global_state(self):
        """Gather the whole state to the client (on request only: output, a look; never while stepping).

        Raises :class:`~hpcgpu.errors.GatherTooLarge` first if the blocks
        and their joined copy would not fit the client's memory
        (:mod:`hpcgpu.partition.client_gather`; the ranks report their bytes).
        """
        self._check_open("the state was requested")
        sizes = self.on_workers(rank_state_nbytes, phase="gather-size")
        check_gather(self.model, [n for worker in sizes.values() for n in worker], self.decomposition)
        gathered = self.on_workers(_host_blocks_of, phase="gather")
        blocks = [None] * self.partitions
        for worker, ranks in self._ranks.items():
            for rank, block in zip(ranks, gathered[worker]):
                blocks[rank] = block
        return self.decomposition.join(self.model, blocks)

    def on_workers(self, function, *args, phase="ranks"):
        """``{worker: function(spec, ranks, results, *args)}``, run on every worker with its ranks' resident
        results (after every epoch sent has finished): the ranks' own work on their blocks, e.g. checkpoint pieces."""
        self._check_open(f"the ranks' {phase} work was requested")
        self.synchronize()
        futures = [self.client.submit(function, self._spec, ranks, self._results[w], *args, workers=[w],
                                      allow_other_workers=False, pure=False,
                                      key=self._key(phase, self.workers.index(w), uuid.uuid4().hex[:8]))
                   for w, ranks in self._ranks.items()]
        seconds = epoch_deadline(None, self.deadline_floor, self.session.timeout)
        # a worker lost meanwhile: WorkerLost, not a task waiting for it forever
        self._watch.wait(futures, dict(at=time.monotonic() + seconds, seconds=seconds, epoch=self.epoch,
                                       results=dict(zip(self._ranks, futures)), what=f"{self.name}: the ranks' {phase}",
                                       why=deadline_why(None, self.deadline_floor, self._deadline_source)))
        return dict(zip(self._ranks, self._watch.gather(futures)))

    def describe(self):
        return {"executor": "distributed", "engine": "spmd", "transport": self.transport,
                # what was asked for ("auto" resolves per worker); a user's model may only have its backend
                "backend": getattr(self.model, "backend_request", None) or self.model.backend.name,
                "partitions": self.partitions,
                "steps_per_task": self.steps_per_task, "workers": len(self.workers),
                f"{self.unit}_per_partition": [b - a for a, b in self.bounds], "epochs": self.epoch,
                **self.decomposition.describe()}

    def close(self):
        """Release the partitions and end the communicator session.

        An epoch still running is aborted on its ranks first, so that it
        ends at once instead of holding the workers (and this call) until
        it is done; the checks and diagnostics it would have returned are
        lost (:meth:`collect` then raises).
        """
        if self._closed:
            return
        self._closed = True
        from hpcgpu.partition.dask_session import close_session

        self._lost_at_close = bool(self._in_flight) or any(op != "advance" for op, _ in self._program)
        futures = [f for _, _, records, results in [*self._in_flight, *self._dropped]
                   for f in (records, *results.values())]
        if self._failure is not None or any(not f.done() for f in futures):
            # cancelling does not stop a running task: the ranks' waits must end (a failed run's
            # epochs were cancelled, and read as done, while their ranks may still run)
            self._watch.abort_ranks(f"{self.name} was closed")
        self.client.cancel(futures)
        self._in_flight.clear()
        self._dropped = []
        self._program = []
        self._results = {}
        try:
            close_session(self.client, self.session)
        finally:
            self._spec = None
            forget_rank_caches(self.session.id)

    # -- epochs ------------------------------------------------------------------------------------------
    def _key(self, phase, *index, epoch=None):
        # a tuple: dask groups tasks (and their dashboard span) by its first part, unique to this run
        return (f"{self.model.name}-{phase}-{self.token}", self.epoch if epoch is None else epoch, *index)

    def _drain(self, block):
        """Send the queued program if the workers would idle (or ``block``); take the epochs that are done (or all).

        Never more than :data:`MAX_AHEAD` epochs in flight: without
        ``block`` the program stays queued while they are.
        """
        while self._in_flight and self._in_flight[0][2].done():
            self._take()
        if self._program and (block or not self._in_flight or self._long_enough()):
            if block:
                self._make_room()
            if self._program and len(self._in_flight) < MAX_AHEAD:
                self._submit()
        while self._in_flight and (block or self._in_flight[0][2].done()):
            self._take()

    def _make_room(self):
        """Take epochs until fewer than :data:`MAX_AHEAD` are in flight (or one failed its health check)."""
        while len(self._in_flight) >= MAX_AHEAD and not self._halted:
            self._take()

    def _long_enough(self):
        if self._seconds_per_step is None:
            return True
        steps = sum(value for op, value in self._program if op == "advance")
        return steps * self._seconds_per_step >= EPOCH_SECONDS

    def _submit(self):
        from distributed import span

        self._settle_dropped()  # their ranks must be done before new ones of the session start
        program, epoch = self._program, self.epoch + 1
        steps = sum(value for op, value in program if op == "advance")
        first_step = self.step - steps  # the queued steps are counted already
        results = {}
        with span(self.name):
            for worker, ranks in self._ranks.items():
                results[worker] = self.client.submit(
                    epoch_task, self._spec, self.session, ranks, self._results[worker], program, (epoch, first_step),
                    key=self._key("epoch", self.workers.index(worker), epoch=epoch), workers=[worker],
                    allow_other_workers=False, pure=False, retries=0)
            first = self.owner[0]
            # first on its worker: not behind the next epoch's task, which may wait for every rank
            records = self.client.submit(epoch_records, results[first], key=self._key("records", epoch=epoch),
                                         workers=[first], allow_other_workers=False, pure=False, priority=1)
        # the executor's own state changes only now: an interrupt above leaves the program queued
        self._program, self.epoch, self._results = [], epoch, results
        self._in_flight.append((epoch, steps, records, results))
        self._submitted[epoch] = (time.monotonic(), first_step, {op for op, _ in program})

    def _take(self):
        """Wait for the oldest epoch in flight, file its records and learn its speed (raises on a failed epoch).

        It leaves the queue only once its records are here: an interrupted
        wait (Ctrl-C) leaves it in flight, to be taken again, records included.
        """
        entry = self._in_flight[0]
        epoch, steps, records, results = entry
        self._watch.wait([records, *results.values()], self._deadline(epoch, steps, results))
        found, seconds, done, ranks, transport = self._watch.gather([records])[0]
        self._in_flight.popleft()
        self._operations_done |= self._submitted.pop(epoch, (0, 0, set()))[2]
        self._taken_at = time.monotonic()
        self.transport = transport
        self._ready.extend(found)
        self.epoch_stats.append({"steps": done, "seconds": seconds, "ranks": ranks})
        if done:
            rate = seconds / done
            self._seconds_per_step = rate if self._seconds_per_step is None else 0.5 * (self._seconds_per_step + rate)
        if any(kind == "health" and unhealthy(self.model, *value) for kind, _, value in found):
            self._stop_at(entry, done)

    def _stop_at(self, entry, done):
        """After ``entry``'s failed health check: its results are the state; what came after it is dropped.

        Its ranks stopped at the check (:func:`~hpcgpu.partition.epochs._run_program`), after
        ``done`` of its steps; ``step`` becomes theirs, so that :meth:`global_state`
        shows the fields that blew up, not later steps on them.
        """
        _, steps, _, results = entry
        later = list(self._in_flight)
        self.step -= (steps - done) + sum(s for _, s, _, _ in later) + sum(
            value for op, value in self._program if op == "advance")
        self._program = []
        self._results = results
        self._halted = True
        self._dropped.extend(later)
        self._in_flight.clear()
        self._settle_dropped()

    def _settle_dropped(self):
        """Wait for the dropped epochs to end; their results (and errors) are discarded.

        Not cancelled: a rank whose peer's task was cancelled before it
        started would wait for its messages until the timeout, holding its
        worker. On the blown-up state they end at their first health check.
        """
        from distributed import wait

        if not self._dropped:
            return
        futures = [f for _, _, records, results in self._dropped for f in (records, *results.values())]
        try:
            wait(futures, timeout=self.session.timeout + ROOT_CAUSE_WAIT_S)
        except Exception:  # noqa: BLE001 - a timeout or their failure: not the run's, cancelled below
            pass
        self.client.cancel(futures)
        self._dropped = []

    def _deadline(self, epoch, steps, results):
        """The deadline of ``epoch`` (``steps`` steps, its futures ``results``), see :mod:`hpcgpu.partition.faults`.

        Counted from when it could start: not before it was sent, nor
        before the client took the epoch before it. An epoch with a kind of
        operation no epoch before it had (the first diagnostics) may compile
        kernels: its speed counts as not measured.
        """
        sent, first_step, operations = self._submitted.get(epoch, (time.monotonic(), self.step - steps, set()))
        new = bool(operations - self._operations_done)
        expected = None if self._seconds_per_step is None or new else steps * self._seconds_per_step
        seconds = epoch_deadline(expected, self.deadline_floor, self.session.timeout)
        return dict(at=max(sent, self._taken_at) + seconds, seconds=seconds, epoch=epoch, results=results,
                    why=deadline_why(expected, self.deadline_floor, self._deadline_source),
                    what=f"{self.name}: epoch {epoch} (steps {first_step} to {first_step + steps})")

    def _abandon(self, futures, reason="an epoch failed"):
        """The run failed: its epochs are dropped and every rank still running is aborted (none holds its worker)."""
        self._failure = self._failure or reason
        self._program = []
        try:
            self._watch.abort_ranks(f"{self.name} failed: {reason}")
        finally:
            self.client.cancel(list(futures))
            for _, _, records, results in [*self._in_flight, *self._dropped]:
                self.client.cancel([records, *results.values()])
            self._in_flight.clear()
            self._dropped = []
