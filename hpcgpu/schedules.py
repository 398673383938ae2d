"""When callbacks, writers and checks run: every N steps, or every T of model time.

A schedule answers one question for the driver: how many steps from now
until it next fires. With a constant time step that is exact for both kinds,
so the driver can advance many steps in one fused call between events.

Examples
--------
>>> Every(10).steps_until(step=3, time=0.3, dt=0.1)
7
>>> TimeInterval(1.0).steps_until(step=3, time=0.3, dt=0.1)
7
"""

import math
from dataclasses import dataclass

from hpcgpu.validation import check_float, check_int

__all__ = ["Schedule", "Every", "TimeInterval"]


class Schedule:
    """Base class: subclasses say how many steps until they next fire."""

    def steps_until(self, step, time, dt):  # pragma: no cover - interface
        raise NotImplementedError

    def fires(self, step, time, dt):
        """True if the schedule fires at this step."""
        return self.steps_until(step, time, dt) == 0


@dataclass(frozen=True)
class Every(Schedule):
    """Fire every ``steps`` time steps (at steps that are multiples of it).

    Parameters
    ----------
    steps : int
        Interval in steps, >= 1.
    """

    steps: int

    def __post_init__(self):
        object.__setattr__(self, "steps", check_int("steps", self.steps, minimum=1))

    def steps_until(self, step, time, dt):
        return (-step) % self.steps


@dataclass(frozen=True)
class TimeInterval(Schedule):
    """Fire at the first step at or after each multiple of ``interval`` model time.

    Parameters
    ----------
    interval : float
        Model-time interval (e.g. s), > 0.
    """

    interval: float

    def __post_init__(self):
        object.__setattr__(self, "interval",
                           check_float("interval", self.interval, minimum=0.0, strict_min=True))

    def _index(self, time, dt):
        # Tolerate rounding of time = step * dt so that exact multiples count.
        return math.floor((time + _slack(time, dt)) / self.interval)

    def steps_until(self, step, time, dt):
        # Fires at step n when (t_{n-1}, t_n] holds a multiple of the interval.
        target = (self._index(time - dt, dt) + 1) * self.interval
        return max(0, math.ceil((target - time - _slack(time, dt)) / dt))


def _slack(time, dt):
    """Rounding to tolerate in ``time = step * dt``: a fixed part of a step, and a relative part,
    as the rounding of ``step * dt`` grows with the step (beyond a 1e-9 step after some 1e7 steps)."""
    return 1e-9 * dt + 1e-12 * abs(time)


def as_schedule(value, name="schedule"):
    """A Schedule from a Schedule or an int number of steps."""
    if isinstance(value, Schedule):
        return value
    return Every(check_int(name, value, minimum=1))
