"""Models that fail on purpose, for the engine's fault tests (importable by the workers: tests/ is on their path)."""

import os
import time

from hpcgpu.workloads.weather import ShallowWater


class FailingRows(ShallowWater):
    """Shallow water whose rank holding global row ``fail_row`` raises after ``fail_after`` advances.

    Counted per worker process; the other ranks keep stepping and must be
    released by the abort, not by their timeout.
    """

    calls = 0

    def __init__(self, *args, fail_row=0, fail_after=3, **kwargs):
        super().__init__(*args, **kwargs)
        self.fail_row, self.fail_after = fail_row, fail_after

    def advance_rows(self, state, dt, steps, first_row, *args, **kwargs):
        rows = state.h.shape[0]
        if first_row <= self.fail_row < first_row + rows and self.fail_row > 0:
            FailingRows.calls += 1
            if FailingRows.calls > self.fail_after:
                raise ValueError(f"injected failure in the block holding row {self.fail_row} (pid {os.getpid()})")
        return super().advance_rows(state, dt, steps, first_row, *args, **kwargs)

    def with_backend(self, backend):
        other = super().with_backend(backend)
        other.__class__ = FailingRows
        other.fail_row, other.fail_after = self.fail_row, self.fail_after
        return other


class SlowRows(ShallowWater):
    """Shallow water that sleeps ``pause`` seconds per advance, so that epochs last long enough to be hit."""

    def __init__(self, *args, pause=0.05, **kwargs):
        super().__init__(*args, **kwargs)
        self.pause = pause

    def advance_rows(self, *args, **kwargs):
        time.sleep(self.pause)
        return super().advance_rows(*args, **kwargs)


class PoisonedRows(ShallowWater):
    """Shallow water whose blocks turn NaN on their ``poison_at``-th advance in each worker process (per ``token``)."""

    calls = {}

    def __init__(self, *args, poison_at=3, token="", **kwargs):
        super().__init__(*args, **kwargs)
        self.poison_at, self.token = poison_at, token

    def advance_rows(self, *args, **kwargs):
        result = super().advance_rows(*args, **kwargs)
        count = PoisonedRows.calls[self.token] = PoisonedRows.calls.get(self.token, 0) + 1
        if count == self.poison_at:
            result.h[...] = float("nan")
        return result

    def with_backend(self, backend):
        other = super().with_backend(backend)
        other.__class__ = PoisonedRows
        other.poison_at, other.token = self.poison_at, self.token
        return other


class StuckRows(ShallowWater):
    """Shallow water whose rank holding global row ``stuck_row`` (> 0) hangs in its ``stuck_at``-th advance.

    It sleeps without touching its communicator, as an endless kernel
    would, until the file ``release`` exists (or 120 s pass, so that a
    failed test frees its worker). Counted per worker process and ``token``.
    """

    calls = {}

    def __init__(self, *args, stuck_row=1, stuck_at=3, release="", token="", **kwargs):
        super().__init__(*args, **kwargs)
        self.stuck_row, self.stuck_at, self.release, self.token = stuck_row, stuck_at, release, token

    def advance_rows(self, state, dt, steps, first_row, *args, **kwargs):
        if first_row <= self.stuck_row < first_row + state.h.shape[0]:
            count = StuckRows.calls[self.token] = StuckRows.calls.get(self.token, 0) + 1
            if count == self.stuck_at:
                until = time.monotonic() + 120
                while not os.path.exists(self.release) and time.monotonic() < until:
                    time.sleep(0.02)
        return super().advance_rows(state, dt, steps, first_row, *args, **kwargs)

    def with_backend(self, backend):
        other = super().with_backend(backend)
        other.__class__ = StuckRows
        other.stuck_row, other.stuck_at, other.release, other.token = (self.stuck_row, self.stuck_at, self.release,
                                                                       self.token)
        return other


class LostWordsRows(ShallowWater):
    """Shallow water whose rank holding global row ``fail_row`` (> 0) raises, after ``fail_after`` advances, an
    error whose words say "lost" and "cancelled"; every raise is a line in the file ``attempts``."""

    calls = {}

    def __init__(self, *args, fail_row=1, fail_after=3, attempts="", **kwargs):
        super().__init__(*args, **kwargs)
        self.fail_row, self.fail_after, self.attempts = fail_row, fail_after, attempts

    def advance_rows(self, state, dt, steps, first_row, *args, **kwargs):
        if first_row <= self.fail_row < first_row + state.h.shape[0]:
            count = LostWordsRows.calls[self.attempts] = LostWordsRows.calls.get(self.attempts, 0) + 1
            if count > self.fail_after:
                with open(self.attempts, "a") as record:
                    record.write(f"{os.getpid()}\n")
                raise ValueError("the mass of the lost fluid is not conserved: step cancelled")
        return super().advance_rows(state, dt, steps, first_row, *args, **kwargs)

    def with_backend(self, backend):
        other = super().with_backend(backend)
        other.__class__ = LostWordsRows
        other.fail_row, other.fail_after, other.attempts = self.fail_row, self.fail_after, self.attempts
        return other
