"""An emulated slow device, for benchmarks of mixed clusters on machines that have none.

A worker started with :data:`SLOWDOWN_ENV` set to a factor f > 1 sleeps
``(f - 1)`` times its compute time after each block step and calibration
step (:func:`emulate_slowdown`, called by :mod:`hpcgpu.partition.grid`),
so it behaves like a device f times slower without taking CPU from the
others. ``hpcgpu bench scaling`` uses it for its mixed-cluster balance
case.

Examples
--------
>>> import os, time
>>> os.environ.pop(SLOWDOWN_ENV, None) and None
>>> started = time.perf_counter()
>>> emulate_slowdown(started)  # no factor set: returns at once
>>> time.perf_counter() - started < 0.01
True
"""

import os
import time

__all__ = ["SLOWDOWN_ENV", "emulate_slowdown"]

SLOWDOWN_ENV = "HPCGPU_EMULATE_SLOWDOWN"
"""Environment variable (benchmarks and tests only): the factor by which a
worker started with it set runs slower than it computes."""


def emulate_slowdown(started):
    """Sleep so that the work begun at ``started`` (a ``time.perf_counter()`` value) took
    :data:`SLOWDOWN_ENV` times as long; nothing when the factor is unset or at most 1."""
    factor = float(os.environ.get(SLOWDOWN_ENV, "1") or 1)
    if factor > 1:
        time.sleep((factor - 1.0) * (time.perf_counter() - started))
