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

__all__ = ["Checkpointing"]


class Checkpointing:
    """The checkpoint methods of :class:`~hpcgpu.simulation.Simulation` (a mixin)."""

    def write_checkpoint(self, path):
        """Write the global state, step, time and diagnostics under ``path`` (atomically); returns its directory."""
        from hpcgpu import checkpoint

        self._flush(block=True)
        state = self._executor.global_state()
        save = getattr(self.model, "checkpoint_state", self.model.to_host)
        meta = {"step": self.step, "time": self.time, "dt": self.dt, "name": self.name,
                "stop_steps": self.stop_steps, "stop_time": self.stop_time, "records": self._records,
                "model": repr(self.model),
                "random_state": getattr(self.model, "random_state_description", "none: the stepping draws no random numbers")}
        return checkpoint.write_checkpoint(path, self.model, save(state), meta)

    @classmethod
    def resume(cls, path, *, backend=None, client=None, partitions=None, steps_per_task=None, weights=None,
               stop_steps=None, stop_time=None, wall_time_limit=None, progress=None, **kwargs):
        """A simulation continuing from the newest good checkpoint under ``path``.

        The run continues exactly as the uninterrupted one would (bitwise on
        the same backend and number of workers; to rounding on another
        count): same model, state, step, time, dt, stop criteria (unless
        given here) and the diagnostics recorded so far. Callbacks and
        writers are not saved: add them again.

        Parameters
        ----------
        path : str
            The checkpoint directory given to :meth:`run`.
        backend : str, optional
            Continue on another backend (default: the one it ran on; ``auto`` resolves here).
        client, partitions, steps_per_task, weights, progress, wall_time_limit
            As for the constructor: any number of workers, or none.
        stop_steps, stop_time : optional
            New stop criteria (default: the saved ones).

        Raises
        ------
        ConfigError
            No usable checkpoint under ``path``.
        """
        from hpcgpu import checkpoint

        model, host_state, meta = checkpoint.read_checkpoint(os.fspath(path))
        if backend is not None or getattr(model, "backend_request", None) == "auto":
            model = model.with_backend(backend or "auto")
        sim = cls(model, _restore(model, host_state), dt=meta["dt"],
                  stop_steps=meta["stop_steps"] if stop_steps is None else stop_steps,
                  stop_time=meta["stop_time"] if stop_time is None else stop_time, wall_time_limit=wall_time_limit,
                  progress=progress, name=meta["name"], client=client, partitions=partitions,
                  steps_per_task=steps_per_task, weights=weights, **kwargs)
        sim.step, sim.time, sim._records = int(meta["step"]), float(meta["time"]), list(meta["records"])
        return sim

    def _recover(self, error):
        """After a lost worker: restart from the last checkpoint on the workers left; returns the step."""
        from hpcgpu import checkpoint

        if self._checkpoint is None or not checkpoint.list_checkpoints(self._checkpoint[0]):
            raise error
        executor = self._executor
        if not hasattr(executor, "client"):
            raise error
        import warnings

        _, host_state, meta = checkpoint.read_checkpoint(self._checkpoint[0])  # this run's model is self.model
        try:
            executor.close()
        except Exception:  # noqa: BLE001 - the old partitions are gone anyway
            pass
        client = executor.client
        self._executor = self._make_executor(_restore(self.model, host_state), client, executor.partitions,
                                             executor.steps_per_task, None)
        lost = self.step - int(meta["step"])
        self.step, self.time, self._records = int(meta["step"]), float(meta["time"]), list(meta["records"])
        self._checked_step = None
        self.restarts.append({"step": self.step, "steps_lost": lost, "error": str(error),
                              "workers": len(self._executor.workers)})
        warnings.warn(f"{self.name}: {error}; restarted from the checkpoint at step {self.step} on "
                      f"{len(self._executor.workers)} worker(s)", RuntimeWarning, stacklevel=3)
        return self.step


def _restore(model, host_state):
    """A checkpointed host state on ``model``'s backend (the model's own ``restore_state`` if it has one)."""
    restore = getattr(model, "restore_state", None)
    return restore(host_state) if restore is not None else model.concat_blocks([host_state])
