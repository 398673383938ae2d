"""Checkpoints of a :class:`~hpcgpu.simulation.Simulation`: writing one, resuming from one, and
restarting from the last one after a lost worker.

:class:`Checkpointing` is the part of ``Simulation`` that talks to
:mod:`hpcgpu.checkpoint` (the files: the global state, step, time, dt, stop
criteria and the diagnostics recorded so far); ``Simulation.run`` decides
when to write them and calls :meth:`Checkpointing._recover` when the
executor reports a lost worker.

Examples
--------
>>> import tempfile
>>> from hpcgpu import Simulation
>>> from hpcgpu.workloads.weather import ShallowWater
>>> model = ShallowWater("gravity_wave", nx=16, ny=8, backend="numpy")
>>> folder = tempfile.mkdtemp()
>>> first = Simulation(model, stop_steps=4, progress=False).run(checkpoint=folder)
>>> later = Simulation.resume(folder, stop_steps=6, progress=False)
>>> later.step, later.run().step
(4, 6)
"""

import os

from hpcgpu.errors import ClusterError, ConfigError, WorkerLost

__all__ = ["Checkpointing"]


class Checkpointing:
    """The checkpoint methods of :class:`~hpcgpu.simulation.Simulation` (a mixin)."""

    def write_checkpoint(self, path):
        """Write the state, step, time and diagnostics under ``path`` (atomically); returns its directory.

        A partitioned run's ranks write their own pieces (grids:
        :mod:`hpcgpu.rank_checkpoints`; particles:
        :mod:`hpcgpu.particle_checkpoints`); other runs write the global state.
        """
        from hpcgpu import checkpoint

        self._flush(block=True)
        for writer in self._writers:  # snapshots still being written (by the ranks) are whole before a checkpoint
            flush = getattr(writer, "flush", None)
            if flush is not None:
                flush(self)
        meta = {"step": self.step, "time": self.time, "dt": self.dt, "name": self.name,
                "stop_steps": self.stop_steps, "stop_time": self.stop_time, "records": self._records,
                "schedules": {"diagnostics": _schedule_meta(self.diagnostics_schedule),
                              "check": _schedule_meta(self.check_schedule)},
                "model": repr(self.model), "history": self._history,
                "random_state": getattr(self.model, "random_state_description", "none: the stepping draws no random numbers")}
        if checkpoint.ranks_write_pieces(self._executor):  # each rank writes its own piece
            directory = checkpoint.write_rank_checkpoint(path, self._executor, self.model, meta)
        else:
            save = getattr(self.model, "checkpoint_state", self.model.to_host)
            directory = checkpoint.write_checkpoint(path, self.model, save(self._executor.global_state()), meta)
        # the only ones _recover restarts from (those pruned since are forgotten: a long run writes many)
        self._own_checkpoints = [c for c in self._own_checkpoints if os.path.isdir(c)]
        self._own_checkpoints.append(os.path.realpath(directory))
        return directory

    @classmethod
    def resume(cls, path, *, backend=None, client=None, partitions=None, steps_per_task=None, weights=None,
               stop_steps=None, stop_time=None, wall_time_limit=None, progress=None, **kwargs):
        """A simulation continuing from the newest good checkpoint under ``path``.

        The run continues exactly as the uninterrupted one would (bitwise on
        the same backend and number of workers; to rounding on another
        count): same model, state, step, time, dt, stop criteria (unless
        given here), diagnostics and check schedules (unless given here, or
        of a Schedule class of your own) and the diagnostics recorded so far.
        Callbacks and writers are not saved: add them again (new ones, or,
        in the same process, the writers of the run that wrote the
        checkpoint: they continue its output).

        Parameters
        ----------
        path : str
            The checkpoint directory given to :meth:`run`.
        backend : str, optional
            Continue on another backend (default: the one it ran on; ``auto`` resolves here).
        client, partitions, steps_per_task, weights, progress, wall_time_limit, name
            As for the constructor: any number of workers, or none.
        stop_steps, stop_time : optional
            New stop criteria: giving either replaces both saved ones, so that
            a run can be extended (default: the saved ones).

        Raises
        ------
        ConfigError
            No usable checkpoint under ``path``, or a ``dt`` or ``state`` (the
            checkpoint's are continued).
        """
        from hpcgpu import checkpoint

        model, host_state, meta = checkpoint.read_checkpoint(os.fspath(path))
        fixed = sorted({"dt", "state"} & set(kwargs))
        if fixed:  # else a TypeError about repeated keyword arguments, from inside resume
            raise ConfigError(f"{', '.join(fixed)}: a resumed run continues the checkpoint's state and dt "
                              f"(dt={meta['dt']:g}); for others start a new Simulation(model, state, dt=...)")
        name = kwargs.pop("name", None) or meta["name"]
        if backend is not None or getattr(model, "backend_request", None) == "auto":
            model = model.with_backend(backend or "auto")
        # the saved schedules: else the diagnostics after the resume fall back to the default cadence
        for option, saved in meta.get("schedules", {}).items():
            if saved is not None and option not in kwargs:
                kwargs[option] = _schedule_from_meta(saved)
        if stop_steps is None and stop_time is None:
            stop_steps, stop_time = meta["stop_steps"], meta["stop_time"]
        # else the stop asked for: the earlier of it and a saved one would stop where the saved run did
        sim = cls(model, _restore(model, host_state), dt=meta["dt"], stop_steps=stop_steps,
                  stop_time=stop_time, wall_time_limit=wall_time_limit,
                  progress=progress, name=name, client=client, partitions=partitions,
                  steps_per_task=steps_per_task, weights=weights, **kwargs)
        sim.step, sim.time, sim._records = int(meta["step"]), float(meta["time"]), list(meta["records"])
        # the run it continues, whose writers it may take over (older checkpoints have no id: a new one)
        sim._history = meta.get("history") or sim._history
        # It continues the history of this folder: the checkpoint it came from is its own, and
        # later ones were unusable (read_checkpoint skipped them), so run(checkpoint=path) may go on.
        path = os.fspath(path)
        later = [c for c in checkpoint.list_checkpoints(path) if checkpoint.checkpoint_step(c) > sim.step]
        sim._own_checkpoints.append(os.path.realpath(os.path.join(path, f"step-{sim.step:010d}")))
        sim._unusable_checkpoints.extend(os.path.realpath(c) for c in later)
        return sim

    def _check_checkpoint_folder(self, path):
        """Refuse a checkpoint folder holding checkpoints later than this run's step (another run's history)."""
        from hpcgpu import checkpoint

        known = set(self._own_checkpoints) | set(self._unusable_checkpoints)
        later = [c for c in checkpoint.list_checkpoints(path)
                 if checkpoint.checkpoint_step(c) > self.step and os.path.realpath(c) not in known]
        if later:
            steps = ", ".join(str(checkpoint.checkpoint_step(c)) for c in later)
            raise ConfigError(
                f"checkpoint={path!r} already holds checkpoints at step(s) {steps}, later than this run's step "
                f"{self.step}: they belong to another run (or a later part of this one), and mixing histories "
                "would restart a lost worker from the wrong one. Give an empty directory, delete those "
                f"checkpoints, or continue from them with Simulation.resume({path!r}).")

    def _recover(self, error, max_restarts):
        """After a lost worker: restart from this run's last checkpoint on the workers left; returns the step.

        Re-raises ``error`` unless it is a :class:`~hpcgpu.errors.WorkerLost` on a
        cluster and this run wrote a checkpoint at or before its step into the
        folder given to :meth:`run`. After ``max_restarts`` restarts in a row from
        the same checkpoint (the failure repeats before the next checkpoint),
        raises a :class:`~hpcgpu.errors.WorkerLost` chained to ``error``.
        """
        from hpcgpu import checkpoint

        executor = self._executor
        if not isinstance(error, WorkerLost) or self._checkpoint is None or not hasattr(executor, "client"):
            raise error
        folder = os.path.realpath(self._checkpoint[0])
        # Only checkpoints this run wrote, never one past its step: another run's, in the same
        # folder, would continue a different history.
        own = [c for c in self._own_checkpoints if os.path.dirname(c) == folder and os.path.isdir(c)
               and checkpoint.checkpoint_step(c) <= self.step]
        if not own:
            raise error
        import warnings

        _, host_state, meta = checkpoint.read_checkpoint(folder, candidates=own)  # this run's model is self.model
        step = int(meta["step"])
        repeats = 0
        for record in reversed(self.restarts):
            if record["step"] != step:
                break
            repeats += 1
        if repeats >= max_restarts:
            why = (f"not restarting again: the last {repeats} restart(s) from the checkpoint at step {step} failed "
                   "before the next checkpoint, so the failure repeats (look at the workers' logs)") if repeats else \
                "not restarting"
            raise WorkerLost(f"{self.name}: {error}; {why} (max_restarts={max_restarts})") from error
        try:
            executor.close()
        except Exception:  # noqa: BLE001 - the old partitions are gone anyway
            pass
        client = executor.client
        try:
            # the weights asked for (numbers, or "calibrate" again on the workers left) and a forced grid
            self._executor = self._make_executor(_restore(self.model, host_state), client, executor.partitions,
                                                 executor.steps_per_task, getattr(executor, "weights_requested", None),
                                                 getattr(executor, "grid_requested", None))
        except ClusterError as failure:  # e.g. no workers left: the lost worker is the cause to report
            raise WorkerLost(f"{self.name}: {error}; restarting from the checkpoint at step {step} failed: "
                             f"{failure}") from error
        lost = self.step - step
        self.step, self.time, self._records = step, float(meta["time"]), list(meta["records"])
        self._checked_step = None
        self.restarts.append({"step": self.step, "steps_lost": lost, "error": str(error),
                              "workers": len(self._executor.workers)})
        warnings.warn(f"{self.name}: {error}; restarted from the checkpoint at step {self.step} on "
                      f"{len(self._executor.workers)} worker(s)", RuntimeWarning, stacklevel=3)
        return self.step


def _schedule_meta(schedule):
    """A JSON form of a built-in schedule; None for a Schedule class of the user's own (not saved)."""
    from hpcgpu.schedules import Every, TimeInterval

    if type(schedule) is Every:
        return {"every": schedule.steps}
    if type(schedule) is TimeInterval:
        return {"interval": schedule.interval}
    return None


def _schedule_from_meta(saved):
    """The schedule :func:`_schedule_meta` saved."""
    from hpcgpu.schedules import Every, TimeInterval

    return Every(saved["every"]) if "every" in saved else TimeInterval(saved["interval"])


def _restore(model, host_state):
    """A checkpointed host state on ``model``'s backend (the model's own ``restore_state`` if it has one).

    A checkpoint's pieces stay as they are: the ranks read them (or the run's one process does).
    """
    if callable(getattr(host_state, "owned_block", None)):
        return host_state
    restore = getattr(model, "restore_state", None)
    return restore(host_state) if restore is not None else model.concat_blocks([host_state])
