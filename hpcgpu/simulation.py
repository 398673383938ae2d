"""The driver: one ``Simulation`` runs every workload, locally or on a cluster.

A model plugs in by providing (see :class:`hpcgpu.workloads.weather.ShallowWater`):

``backend``, ``grid`` (or a size), ``cfl_limit``
    where it runs and its stability limit;
``initial_state()``, ``stepper(dt)``, ``warm_up()``
    its state and time stepping;
``cfl(state, dt)``, ``bad_fields(state)``, ``diagnostics(state, dt)``
    checks and global diagnostics;
``to_dataset(state, time)``, ``attributes()``
    output as xarray.

What the summary reports of it (the diagnostics it conserves, the grid
points a step updates) its workload declares to :mod:`hpcgpu.registry`
under ``model.name``; a model no one registered may give ``conserved`` and
``grid_points(model)`` itself.

``Simulation`` is assembled from three modules besides this one: the
checkpoint methods (:mod:`hpcgpu.simulation_checkpoints`), the run's
schedules, events and checks (:mod:`hpcgpu.simulation_events`), and the
table of which run each output writer serves (:mod:`hpcgpu.writer_runs`).

Examples
--------
>>> from hpcgpu import Simulation
>>> from hpcgpu.workloads.weather import ShallowWater
>>> sim = Simulation(ShallowWater("gravity_wave", nx=16, ny=8, backend="numpy"), stop_steps=5,
...                  progress=False)
>>> sim.run().step
5
"""

import os
import time as _time
import uuid

from hpcgpu.cluster import worker_info
from hpcgpu.dashboard import publish as _publish_status
from hpcgpu.errors import ClusterError, ConfigError, UnstableSimulation, WorkerLost
from hpcgpu.partition.local import LocalExecutor
from hpcgpu.partition.rank_state import block_source, local_state
from hpcgpu.schedules import Schedule, as_schedule
from hpcgpu.simulation_checkpoints import Checkpointing
from hpcgpu.simulation_events import DeferredInterrupt, ScheduledEvents
from hpcgpu.validation import check_float, check_int, check_model_memory
from hpcgpu.writer_runs import WRITER_RUNS

__all__ = ["Simulation"]

# Restarts in a row from the same checkpoint before a lost worker ends the run: a crash
# that repeats on every attempt would otherwise loop, taking down one worker after another.
_MAX_RESTARTS = 3


class Simulation(Checkpointing, ScheduledEvents):
    """Run a model through time with stop criteria, schedules, checks and output.

    Parameters
    ----------
    model
        A model object, e.g. :class:`hpcgpu.workloads.weather.ShallowWater`.
    state : optional
        Initial state; defaults to the model's initial condition (on a
        cluster, a grid model's ranks build their own blocks of it: see
        :mod:`hpcgpu.partition.rank_state`).
    dt : float, optional
        Time step (model time units, s for the weather model). Defaults to
        the step at CFL number 0.5.
    stop_steps : int, optional
        Stop after this many steps in total.
    stop_time : float, optional
        Stop at the first step at or after this model time.
    wall_time_limit : float, optional
        Stop cleanly after this many seconds of wall-clock time in ``run``.
    diagnostics : int or Schedule, optional
        When to record global diagnostics (default every 10 steps, rounded
        up to whole tasks on a cluster).
    check : int or Schedule, optional
        When to check for NaN/inf and the CFL limit (default as for
        diagnostics; also before every diagnostic, callback and writer).
    progress : bool or None
        Show a tqdm progress bar; ``None`` shows it only on a terminal.
    name : str, optional
        A name for this run (progress bar, output, dashboard).
    client : distributed.Client, optional
        Run on a dask cluster (see :mod:`hpcgpu.partition.engine`).
    partitions, steps_per_task : int, optional
        Partitions of the state (default: one per worker) and time steps per
        task on the cluster (default: up to 16 for grids, as their halos
        allow, see :func:`hpcgpu.partition.grid.auto_grid_steps`; 1 for
        particles).
    weights : sequence of float or "calibrate", optional
        Relative partition sizes on the cluster (see
        :class:`hpcgpu.partition.engine.PartitionedExecutor`).
    grid : tuple of int or str, optional
        The process grid on the cluster, ranks along ``(x, y[, z])``:
        ``(4, 2)`` or ``"4x2"`` for a grid model, ``(2, 2, 2)`` for MD
        bricks (default: the layout of least halo surface for
        ``partitions``; see :mod:`hpcgpu.partition.process_grid`).

    Raises
    ------
    ConfigError
        Invalid parameters, or a ``dt`` whose CFL number at the start is above
        the model's stable limit.

    Examples
    --------
    >>> from hpcgpu.workloads.weather import ShallowWater
    >>> sim = Simulation(ShallowWater("rest", nx=8, ny=8, backend="numpy"), dt=60.0,
    ...                  stop_time=600.0, progress=False)
    >>> round(sim.run().time, 6)
    600.0
    """

    def __init__(self, model, state=None, *, dt=None, stop_steps=None, stop_time=None,
                 wall_time_limit=None, diagnostics=None, check=None, progress=None, name=None,
                 client=None, partitions=None, steps_per_task=None, weights=None, grid=None):
        self.model = model
        # on a cluster, grid ranks build (or read from a checkpoint) their own blocks: the client holds no state
        on_ranks = client is not None and block_source(model, state) is not None
        check_model_memory(model, None if client is None else worker_info(client), partitions,
                           client_builds=not on_ranks)
        if not on_ranks:
            state = local_state(model, state)
            dt = model.suggested_dt(state) if dt is None else dt
        self.dt = None if dt is None else check_float("dt", dt, minimum=0.0, strict_min=True)
        self.stop_steps = None if stop_steps is None else check_int("stop_steps", stop_steps, minimum=0)
        self.stop_time = check_float("stop_time", stop_time, minimum=0.0, allow_none=True)
        self.wall_time_limit = check_float("wall_time_limit", wall_time_limit, minimum=0.0,
                                           strict_min=True, allow_none=True)
        self.progress = progress
        self.name = name or f"{model.name}-{getattr(model, 'case', 'run')}"
        self.step = 0
        self.time = 0.0
        self._callbacks = []
        self._writers = []
        self._records = []
        self._warmed_up = False
        self.timing = {"warmup_s": 0.0, "run_s": 0.0, "steps": 0}
        if on_ranks:  # the start's CFL number (and dt, if none was given) from the ranks' blocks
            self._executor = self._make_executor(state, client, partitions, steps_per_task, weights, grid)
            self.dt, cfl = self._executor.dt, self._executor.initial_health[1]
        else:
            cfl = model.cfl(state, self.dt)
        if not cfl <= model.cfl_limit:
            if on_ranks:
                self._executor.close()
            safe = model.cfl_limit / cfl * self.dt if cfl == cfl and cfl > 0 else float("nan")
            raise ConfigError(
                f"dt={self.dt:g} gives a CFL number of {cfl:.3g} at the start, above the stable "
                f"limit {model.cfl_limit:.3g} of the time stepper; use dt <= {safe:.4g}")
        if not on_ranks:
            self._executor = self._make_executor(state, client, partitions, steps_per_task, weights, grid)
        # Defaults every 10 steps, rounded up to whole tasks so that checks never split a superstep.
        granularity = self._executor.granularity
        default = granularity * -(-10 // granularity)
        self.diagnostics_schedule = as_schedule(default if diagnostics is None else diagnostics, "diagnostics")
        self.check_schedule = as_schedule(default if check is None else check, "check")
        self._latest_cfl = (None, float("nan"))
        self._run_started = None
        self._checkpoint = None
        self._checked_step = None
        self.restarts = []  # one record per restart from a checkpoint after a lost worker
        self._own_checkpoints = []  # real paths of the checkpoints this run wrote (or was resumed from)
        self._unusable_checkpoints = []  # later ones resume() skipped as unreadable: not another run's
        self._closed = False
        # (step, fields, cfl) of the first check that found NaN/inf: run() refuses to step on from there
        self._non_finite = None
        # One id for a run and every run resumed from its checkpoints (saved in them): the writers
        # of one run may be handed to a resumed one, never to an unrelated one (see add_writer).
        self._history = uuid.uuid4().hex

    def _make_executor(self, state, client, partitions, steps_per_task, weights, grid=None):
        if client is None:
            if (partitions not in (None, 1) or steps_per_task not in (None, 1) or weights is not None
                    or grid is not None):
                raise ConfigError("partitions, steps_per_task, weights and grid need a dask client (client=...)")
            return LocalExecutor(self.model, state, self.dt)
        from hpcgpu.partition.engine import PartitionedExecutor

        return PartitionedExecutor(client, self.model, state, self.dt, partitions=partitions,
                                   steps_per_task=steps_per_task, weights=weights, name=self.name, grid=grid)

    # -- configuration -------------------------------------------------------
    def add_callback(self, function, schedule=1, name=None):
        """Call ``function(simulation)`` on a schedule (an int means every N steps)."""
        if not callable(function):
            raise ConfigError(f"callback must be callable; got {function!r}")
        self._callbacks.append((as_schedule(schedule), function, name or getattr(function, "__name__", "callback")))
        return self

    def add_writer(self, writer):
        """Add an output writer (e.g. :class:`hpcgpu.io.ZarrWriter`).

        A writer serves one run: once a simulation has run with it, only that
        simulation and those resumed from its checkpoints
        (:meth:`resume`) may use it, as they continue the same output.

        Raises
        ------
        ConfigError
            ``writer`` lacks a Schedule ``schedule`` or a ``write`` method, or
            it holds the output of another run (it would append this run's
            records to that run's store).
        """
        if not isinstance(getattr(writer, "schedule", None), Schedule) or not callable(getattr(writer, "write", None)):
            raise ConfigError(f"writer must have a Schedule 'schedule' and a 'write(simulation)' method; got {writer!r}")
        WRITER_RUNS.check(writer, self._history, self.name)  # here, at the line that reuses it, not later inside run()
        self._writers.append(writer)
        return self

    # -- state -----------------------------------------------------------------
    @property
    def executor(self):
        """What steps this run: a local executor, or the partitioned one of a cluster run (its ranks' work)."""
        return self._executor

    @property
    def state(self):
        """The current global state (live; copy it to keep it).

        On a partitioned run this gathers every rank's block to the client,
        here and only here (the run itself never does): first the ranks
        report their bytes, and a gather that would not fit the client's
        memory raises :class:`~hpcgpu.errors.GatherTooLarge` (a ConfigError
        naming the bytes needed and available). Reductions need no gather:
        :attr:`diagnostics`, ``executor.reduce_on_ranks(function)``
        (:mod:`hpcgpu.partition.rank_reductions`).
        """
        return self._executor.global_state()

    @property
    def diagnostics(self):
        """Recorded diagnostics as an ``xarray.Dataset`` along ``time``."""
        import xarray as xr

        self._flush()
        if not self._records:
            return xr.Dataset(attrs={"name": self.name})
        keys = [k for k in self._records[0] if k != "time"]
        data = {k: ("time", [r[k] for r in self._records]) for k in keys}
        ds = xr.Dataset(data, coords={"time": [r["time"] for r in self._records]},
                        attrs={"name": self.name, **_flat(self.model.attributes())})
        # the model's units (optional): without them a weather run's seconds and an N-body run's time read alike
        units = {**getattr(self.model, "diagnostic_units", {}), "wall_s": "s", "step": "1"}
        for name, unit in units.items():
            if name in ds.variables:
                ds[name].attrs["units"] = unit
        ds["time"].attrs["long_name"] = "model time"
        return ds

    def record_diagnostics(self):
        """Compute and record the model's diagnostics now; returns them."""
        # One record per step: a second call at the same step (or after summary()) replaces the
        # first, else the time coordinate of `diagnostics` repeats and `.sel(time=...)` fails. On a
        # cluster the first may still be on its way (a run stopped by Ctrl-C): wait for it too.
        self._flush(block=True)
        if self._records and self._records[-1]["step"] == self.step:
            self._records.pop()
        self._executor.request_diagnostics(self.step)
        self._flush(block=True)  # on a cluster the sums arrive later: wait for them
        return self._records[-1]

    # -- running -----------------------------------------------------------------
    def run(self, steps=None, *, stop_time=None, wall_time_limit=None, checkpoint=None, checkpoint_every=None,
            max_restarts=_MAX_RESTARTS):
        """Advance until a stop criterion is met; returns the simulation.

        Parameters
        ----------
        steps : int, optional
            Advance this many more steps (overrides ``stop_steps``).
        stop_time : float, optional
            Overrides the constructor's ``stop_time``.
        wall_time_limit : float, optional
            Overrides the constructor's ``wall_time_limit``.
        checkpoint : str, optional
            A directory for checkpoints of the global state (see
            :mod:`hpcgpu.checkpoint`): written on ``checkpoint_every`` and
            when the run stops (at its end or at the wall-time limit), so
            that :meth:`resume` continues it. On a cluster, a run that loses
            a worker restarts from the last checkpoint it wrote there on the
            workers left. The directory must hold no checkpoint later than
            the current step (another run's), except unreadable ones
            :meth:`resume` skipped.
        checkpoint_every : int or Schedule, optional
            When to write checkpoints besides the last (an int: every N steps).
        max_restarts : int, optional
            Restarts in a row from the same checkpoint after lost workers
            (default 3) before the run gives up; 0 never restarts.

        Notes
        -----
        Order of work:

        1. Once per simulation, the kernels are compiled on a tiny grid
           (``warmup_s`` in ``Simulation.timing``, kept apart from step time).
        2. At step 0, the state is checked, diagnostics are recorded and
           writers and callbacks that fire at step 0 run.
        3. Then, repeatedly: the number of steps ``n`` to the next event
           (a stop, a check, diagnostics, a callback or a writer, and at most
           about half a second of work, in whole tasks on a cluster) is
           advanced in one call; ``step`` and ``time`` move on; a check for
           NaN/inf and the CFL limit is requested whenever anything else
           fires or the check schedule does, then diagnostics; on a cluster
           both are reduced on the workers while the next supersteps run,
           and taken in when ready (a failed check raises
           :class:`~hpcgpu.errors.UnstableSimulation` naming the step it
           looked at). Before callbacks and writers, every pending check
           must have passed; then callbacks run in the order added, then
           writers write; then the progress bar moves and the stop criteria
           (steps, model time, wall time) are tested.
        4. When the run stops, the final state is checked (if its step was
           not checked already), a checkpoint is written (if asked for) and
           writers are closed (diagnostics written). Checkpoints on
           ``checkpoint_every`` are written after the writers of their step.

        Raises
        ------
        UnstableSimulation
            NaN/inf in a field or a CFL number above the limit; the message
            names the step, the field and the CFL number. ``step`` and
            ``time`` are then those of the failing step. Once a check found
            NaN/inf, every later call raises it too, stepping no further
            (continue from a checkpoint with :meth:`resume`, or from a new
            simulation); a run stopped by the CFL limit alone, its state
            still finite, may go on.
        ConfigError
            No stop criterion given, a bad ``max_restarts``, a
            ``checkpoint`` directory holding checkpoints later than the
            current step, or a writer holding another run's output (see
            :meth:`add_writer`).
        ClusterError
            The simulation was closed (:meth:`close`).
        WorkerLost
            A worker was lost with no checkpoint of this run to restart from,
            or after ``max_restarts`` restarts from the same checkpoint
            (chained to the last loss).
        """
        if self._closed:
            raise ClusterError(f"{self.name}: run() after close(): its executor (and any cluster-side state) is "
                               "released; create a new Simulation, or Simulation.resume(...) from a checkpoint")
        if self._non_finite is not None:
            step, field, cfl = self._non_finite
            raise UnstableSimulation(
                f"{self.name}: run() refused: the state is not finite since step {step} (t={step * self.dt:g}): "
                f"field(s) {field} hold NaN/inf or a non-physical value, and stepping on would carry them into "
                "every later step. Go on from a good state: restore a checkpoint written before it with "
                "Simulation.resume(CHECKPOINT_DIR), or build a new Simulation (e.g. with a smaller dt)",
                step=step, field=field, cfl=cfl)
        target_step = self._target_step(steps, stop_time)
        wall_time_limit = check_float("wall_time_limit", wall_time_limit, minimum=0.0, strict_min=True,
                                      allow_none=True)
        wall_limit = wall_time_limit if wall_time_limit is not None else self.wall_time_limit
        if target_step is None and wall_limit is None:
            raise ConfigError("run needs a stop criterion: steps, stop_steps, stop_time or wall_time_limit")
        if checkpoint is None and checkpoint_every is not None:
            raise ConfigError("checkpoint_every needs a checkpoint directory (checkpoint=PATH)")
        max_restarts = check_int("max_restarts", max_restarts, minimum=0)
        if checkpoint is not None:
            if os.path.exists(checkpoint) and not os.path.isdir(checkpoint):
                raise ConfigError(f"checkpoint={os.fspath(checkpoint)!r} is a file; give a directory for the "
                                  "checkpoints (created if missing)")
            self._check_checkpoint_folder(os.fspath(checkpoint))
        self._checkpoint = None if checkpoint is None else (
            os.fspath(checkpoint), None if checkpoint_every is None else as_schedule(checkpoint_every, "checkpoint_every"))
        # all checked before any is claimed: a refused writer leaves the others free for another run
        for writer in self._writers:
            WRITER_RUNS.check(writer, self._history, self.name)
        for writer in self._writers:
            WRITER_RUNS.claim(writer, self._history, self.name)
        try:
            return self._run(target_step, wall_limit, max_restarts)
        finally:
            self._checkpoint = None

    def _run(self, target_step, wall_limit, max_restarts):
        if not self._warmed_up:
            start = _time.perf_counter()
            self.model.warm_up()
            self.timing["warmup_s"] = _time.perf_counter() - start
            self._warmed_up = True
        if self.step == 0 and not self._records:
            with DeferredInterrupt():  # all of step 0's events, or a later run() skips the rest of them
                self._events(force_check=True)
        bar = self._progress_bar(target_step)
        started = self._run_started = _time.perf_counter()
        steps_at_start = self.step
        try:
            while True:
                elapsed = _time.perf_counter() - started
                stop = ((target_step is not None and self.step >= target_step)
                        or (wall_limit is not None and elapsed >= wall_limit))
                try:
                    if stop:
                        if self._checked_step != self.step:  # never return an unchecked state
                            self._executor.request_health(self.step)
                            self._checked_step = self.step
                        self._executor.synchronize()
                        self._flush(block=True)
                        break
                    done = self.step - steps_at_start
                    seconds_per_step = elapsed / done if done else None
                    n = self._steps_to_next_event(target_step, seconds_per_step)
                    # Ctrl-C waits for the end of these n steps and their events: raised inside
                    # advance(), it would leave a state some steps on from `step` (or half-written
                    # in reused buffers) that a later run() would silently continue.
                    with DeferredInterrupt():
                        self._executor.advance(n)
                        self.step += n
                        self.time = self.step * self.dt
                        if target_step is not None and self.step >= target_step:
                            # the closing check goes with the last steps: on a cluster, in the same
                            # epoch (a check asked for once they were sent costs an epoch of its own)
                            self._executor.request_health(self.step)
                            self._checked_step = self.step
                        self._events()
                    _publish_status(self)  # to the dask dashboard's hpcgpu page; never blocks
                except WorkerLost as error:
                    self._recover(error, max_restarts)  # from this run's last checkpoint, or re-raise
                    if bar is not None:
                        bar.n = max(0, self.step - steps_at_start)
                        bar.refresh()
                    continue
                if bar is not None:
                    bar.update(n)
            if self._checkpoint is not None:
                self.write_checkpoint(self._checkpoint[0])
        except UnstableSimulation as error:
            # On a cluster the driver queues steps ahead of the checks: label the state,
            # diagnostics and checkpoints with the step that failed, not the last one queued.
            self.step, self.time = error.step, error.step * self.dt
            self._checked_step = None
            self._discard_unchecked_writes(error.step)
            raise
        finally:
            if bar is not None:
                bar.close()
            self.timing["run_s"] += _time.perf_counter() - started
            self._run_started = None
            self.timing["steps"] += self.step - steps_at_start
            _publish_status(self, finished=True)
        for writer in self._writers:
            close = getattr(writer, "close", None)
            if close is not None:
                close(self)
        return self

    def _progress_bar(self, target_step):
        if self.progress is False:
            return None
        from tqdm.auto import tqdm

        total = None if target_step is None else target_step - self.step
        return tqdm(total=total, desc=self.name, unit="step", disable=None if self.progress is None else False,
                    leave=False)

    # -- reporting -----------------------------------------------------------------
    def summary(self):
        """Timing and conservation summary of the run so far (a dict)."""
        t = dict(self.timing)
        steps = max(t["steps"], 1)
        t["steps_per_s"] = t["steps"] / t["run_s"] if t["run_s"] > 0 else float("nan")
        declared = _declaration(self.model)
        if declared.grid_points is not None:
            t["point_updates_per_s"] = t["steps_per_s"] * declared.grid_points(self.model)
        t["seconds_per_step"] = t["run_s"] / steps
        out = {"name": self.name, "step": self.step, "time": self.time, "dt": self.dt, **t}
        if len(self._records) >= 1:
            current = self._records[-1]["step"] == self.step or self._closed
            first, last = self._records[0], self._records[-1] if current else self.record_diagnostics()
            for key in declared.conserved:
                if key in first and first[key]:
                    out[f"{key}_relative_change"] = (last[key] - first[key]) / abs(first[key])
            out["max_cfl"] = last.get("max_cfl")
        out.update(self._executor.describe())
        return out

    def close(self):
        """Release the executor's resources (cluster-side state included).

        The diagnostics of the current step are recorded first (if they are
        not already), so :meth:`summary` and :attr:`diagnostics` still
        describe the final state afterwards. Closing twice does nothing.
        The executor is released whatever happens; a failed health check
        (already raised by :meth:`run`, or found now) is not raised again.
        """
        if self._closed:
            return
        self._closed = True
        try:
            if self._records and self._records[-1]["step"] != self.step and getattr(self._executor, "usable", True):
                self.record_diagnostics()
        except UnstableSimulation as error:  # reported by run(); close() often runs in a finally, masking it
            self._discard_unchecked_writes(error.step)
        finally:
            self._executor.close()

    def __repr__(self):
        return (f"Simulation(name={self.name!r}, model={self.model!r}, dt={self.dt:g}, step={self.step}, "
                f"time={self.time:g})")

    def _repr_html_(self):
        """An HTML summary for Jupyter (:func:`hpcgpu.io.html_views.simulation_html`)."""
        from hpcgpu.io import html_views

        return html_views.simulation_html(self)


def _declaration(model):
    """What the model's workload declares of its summary (:mod:`hpcgpu.registry`).

    A model no one registered may say the same itself: ``conserved`` (the
    diagnostics whose relative change to report) and ``grid_points(model)``.
    """
    from hpcgpu import registry

    declared = registry.for_model(model)
    if declared is not None:
        return declared
    return registry.Workload(name=getattr(model, "name", ""), cli="", conserved=tuple(getattr(model, "conserved", ())),
                             grid_points=getattr(type(model), "grid_points", None))


def _flat(attrs):
    return {k: (v if isinstance(v, (int, float, str)) else str(v)) for k, v in attrs.items()}
