"""The events of a :class:`~hpcgpu.simulation.Simulation` run: when the next one falls due, what fires at a step,
the checks and diagnostics taken in from the executor, and the Ctrl-C guard around one chunk of steps.

:class:`ScheduledEvents` is the part of ``Simulation`` that reads its
schedules (checks, diagnostics, callbacks, writers, checkpoints) and the stop
criteria: ``Simulation.run`` advances the executor by
:meth:`~ScheduledEvents._steps_to_next_event` steps at a time, inside a
:class:`DeferredInterrupt`, then calls :meth:`~ScheduledEvents._events`.

Examples
--------
>>> from hpcgpu.simulation_events import DeferredInterrupt
>>> with DeferredInterrupt() as guard:   # a Ctrl-C in here would be raised at the end
...     steps_done = 4
>>> guard.pending, steps_done
(False, 4)
"""

import math
import signal
import threading
import time as _time

from hpcgpu.errors import UnstableSimulation
from hpcgpu.validation import check_float, check_int

__all__ = ["CHUNK_SECONDS", "DeferredInterrupt", "ScheduledEvents"]

CHUNK_SECONDS = 0.5
"""Longest stretch of steps between two looks at the wall clock, in seconds of work."""


class ScheduledEvents:
    """The schedule and check methods of :class:`~hpcgpu.simulation.Simulation` (a mixin).

    They read ``step``, ``time``, ``dt``, the schedules, ``_callbacks``,
    ``_writers``, ``_checkpoint`` and ``_executor`` of the simulation, and
    append the diagnostics taken in to ``_records``.
    """

    def _target_step(self, steps, stop_time):
        if steps is not None:
            return self.step + check_int("steps", steps, minimum=0)
        stop_time = check_float("stop_time", stop_time, minimum=0.0, allow_none=True)
        stop_time = self.stop_time if stop_time is None else stop_time
        targets = []
        if self.stop_steps is not None:
            targets.append(self.stop_steps)
        if stop_time is not None:
            # the first step at or after stop_time, tolerating the rounding of step * dt (which grows with the step)
            steps = stop_time / self.dt
            targets.append(math.ceil(steps - 1e-9 - 1e-12 * steps))
        return min(targets) if targets else None

    def _schedules(self):
        yield self.check_schedule
        yield self.diagnostics_schedule
        for schedule, _, _ in self._callbacks:
            yield schedule
        for writer in self._writers:
            yield writer.schedule
        if getattr(self, "_checkpoint", None) is not None and self._checkpoint[1] is not None:
            yield self._checkpoint[1]

    def _steps_to_next_event(self, target_step, seconds_per_step):
        granularity = self._executor.granularity
        if seconds_per_step is None:
            limit = max(10, granularity)
        else:
            limit = max(granularity, int(CHUNK_SECONDS / max(seconds_per_step, 1e-9)))
        if target_step is not None:
            limit = min(limit, target_step - self.step)
        after = self.step + 1
        for schedule in self._schedules():
            # steps from the step after this one, plus that one step
            limit = min(limit, 1 + schedule.steps_until(after, after * self.dt, self.dt))
        return max(1, limit)

    def _events(self, force_check=False):
        step, now, dt = self.step, self.time, self.dt
        diag = self.diagnostics_schedule.fires(step, now, dt)
        callbacks = [(f, n) for s, f, n in self._callbacks if s.fires(step, now, dt)]
        writers = [w for w in self._writers if w.schedule.fires(step, now, dt)]
        schedule = getattr(self, "_checkpoint", None) and self._checkpoint[1]
        save = bool(schedule) and schedule.fires(step, now, dt)
        wanted = force_check or diag or callbacks or writers or save or self.check_schedule.fires(step, now, dt)
        if wanted and self._checked_step != step:
            self._executor.request_health(step)
            self._checked_step = step
        if diag or force_check:
            self._executor.request_diagnostics(step)
        # Callbacks and writers see the state: every check up to now must pass first,
        # so that nothing is written from a run that has blown up. A writer whose write
        # runs on the ranks, behind the check just queued, needs no wait: the ranks stop
        # at a failed check, and the writer drops what it queued after (discard_from).
        on_ranks = [w for w in writers if _writes_behind_checks(w, self)]
        self._flush(block=bool(callbacks or len(on_ranks) < len(writers) or save))
        for function, _ in callbacks:
            function(self)
        for writer in writers:
            writer.write(self)
        if save:
            self.write_checkpoint(self._checkpoint[0])

    def _discard_unchecked_writes(self, step):
        """After a failed check at ``step``: writers drop the snapshots of that step and later they queued."""
        for writer in self._writers:
            discard = getattr(writer, "discard_from", None)
            if callable(discard):
                discard(self, step)

    def _flush(self, block=False):
        """Take in finished checks and diagnostics; raise on the first failed check."""
        for kind, step, value in self._executor.collect(block=block):
            if kind == "health":
                self._check(step, *value)
            else:
                value.update(step=step, time=step * self.dt, wall_s=self._wall_time())
                if "max_cfl" not in value:
                    value["max_cfl"] = self._latest_cfl[1] if self._latest_cfl[0] == step else float("nan")
                self._records.append(value)

    def _wall_time(self):
        """Seconds of run() so far, over all calls."""
        running = _time.perf_counter() - self._run_started if self._run_started is not None else 0.0
        return self.timing["run_s"] + running

    def _check(self, step, bad, cfl):
        limit = self.model.cfl_limit
        if self._records and self._records[-1]["step"] == step:
            self._records[-1]["max_cfl"] = cfl
        self._latest_cfl = (step, cfl)
        when = f"step {step} (t={step * self.dt:g})"
        if bad or not cfl == cfl:
            field = ", ".join(bad) or "unknown"
            if self._non_finite is None:  # the first failure: where the state went bad
                self._non_finite = (step, field, cfl)
            raise UnstableSimulation(
                f"{self.name}: {when}: field(s) {field} hold NaN/inf or a non-physical value; CFL number "
                f"{cfl:.3g} (stable limit {limit:.3g}). Reduce dt (now {self.dt:g}) or add viscosity.",
                step=step, field=field, cfl=cfl)
        if cfl > limit:
            raise UnstableSimulation(
                f"{self.name}: {when}: CFL number {cfl:.3g} exceeds the stable limit {limit:.3g}; "
                f"reduce dt (now {self.dt:g}).", step=step, field="cfl", cfl=cfl)


def _writes_behind_checks(writer, simulation):
    """Whether ``writer``'s next write only queues work on the ranks, behind the checks queued before it.

    A writer says so with ``writes_behind_checks(simulation)``, and then
    takes back what a failed check stopped with ``discard_from(simulation,
    step)`` (:class:`~hpcgpu.io.ZarrWriter` on a partitioned run).
    """
    ask = getattr(writer, "writes_behind_checks", None)
    return callable(ask) and callable(getattr(writer, "discard_from", None)) and bool(ask(simulation))


class DeferredInterrupt:
    """Hold a Ctrl-C (SIGINT) that arrives inside the block and raise it at the end.

    The steps of one call to the executor and their events (at most about
    :data:`CHUNK_SECONDS` of work) then finish, so ``step``, ``time`` and the
    state agree when :class:`KeyboardInterrupt` reaches the notebook, and a
    later ``run()`` continues exactly. A second Ctrl-C in the same block is
    raised at once (a callback that hangs can still be interrupted). Only
    Python's default handler, in the main thread, is replaced: another
    handler (or a thread, where signals cannot be handled) is left alone.
    """

    def __enter__(self):
        self.pending = False
        self._previous = None
        if (threading.current_thread() is threading.main_thread()
                and signal.getsignal(signal.SIGINT) is signal.default_int_handler):
            self._previous = signal.signal(signal.SIGINT, self._hold)
        return self

    def _hold(self, signum, frame):
        if self.pending:
            raise KeyboardInterrupt
        self.pending = True

    def __exit__(self, kind, error, traceback):
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)
        if self.pending and kind is None:
            raise KeyboardInterrupt
        return False
