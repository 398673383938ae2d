"""Row blocks of a grid on a dask cluster: halo exchange and K-step tasks.

:class:`RowExecutor` keeps P blocks of grid rows on the workers; a
superstep cuts, on each block's worker, the rows its neighbours need
(``halo_rows(K)`` wide) and then advances every block K steps in one task
(see :mod:`hpcgpu.distributed` for the engine they share with the particle
decompositions). :func:`auto_steps_per_task` picks K when none is given and
:func:`calibrate_workers` measures each worker's step rate for weighted
blocks.
"""

import threading
import time
import uuid
import weakref

from hpcgpu.cluster import worker_info
from hpcgpu.distributed import RESULT_TIMEOUT_S, _emulate_slowdown, _on_worker, _PartitionedExecutor
from hpcgpu.validation import check_int

__all__ = ["RowExecutor", "auto_steps_per_task", "calibrate_workers"]

_thread_state = threading.local()


def auto_steps_per_task(model, partitions):
    """Time steps per task K for ``model`` on ``partitions`` equal blocks, when none is given.

    Row models: the largest of 16, 8, 4, 2 whose halo (the wider side) is
    at most a quarter of a block, else 1. A quarter keeps the redundant halo
    work under about 15% of a block while the scheduler is paid once per K
    steps (at K = 1 its round trips took 19-21% of a 2-worker step here).
    Models that need every position each step (bodies, MD slabs): 1.

    Examples
    --------
    >>> from hpcgpu.workloads.weather import ShallowWater
    >>> model = ShallowWater("unstable_jet", nx=64, ny=1024, backend="numpy")
    >>> auto_steps_per_task(model, 2), auto_steps_per_task(model, 16), auto_steps_per_task(model, 64)
    (16, 2, 1)
    """
    if getattr(model, "decomposition", "rows") != "rows":
        return 1
    rows = model.decomposition_size() // check_int("partitions", partitions, minimum=1)
    for k in (16, 8, 4, 2):
        if 4 * max(model.halo_rows(k)) <= rows:
            return k
    return 1


def _stepper_cache(model):
    """Steppers of this worker thread for this model: work buffers live across tasks."""
    caches = getattr(_thread_state, "caches", None)
    if caches is None:
        # weak keys: a model dropped from _resolved's cache takes its buffers with it
        caches = _thread_state.caches = weakref.WeakKeyDictionary()
    return caches.setdefault(model, {})


def _advance_block(model, dt, steps, block, south, north, first_row):
    started = time.perf_counter()
    model = _on_worker(model)
    # The block keeps spare rows around it from the task that made it: the
    # halos go there, so a resident block is never copied whole (the spare
    # rows are outside every view of the block that other tasks read).
    assembled = model.assemble_rows(south, block, north)
    skip = 0 if south is None else south.h.shape[0]
    result = model.advance_rows(assembled, dt, steps, first_row - skip, south_open=south is not None,
                                north_open=north is not None, cache=_stepper_cache(model), fresh=True)
    _emulate_slowdown(started)
    return model.row_view(result, skip, skip + block.h.shape[0])


def _cut_rows(model, block, start, stop):
    model = _on_worker(model)
    if model.backend.on_gpu:
        return model.take_block(block, start, stop)
    # Host halos are views: nothing writes the rows of a block once its task
    # has returned it (the next halos go into the spare rows around it), and
    # a copy cost ~1.5 ms of page faults per 2 MB cut on a superstep's
    # critical path. A neighbour on another worker receives its own copy.
    return model.row_view(block, start, stop)


def _first_rows(model, block, count):
    return _cut_rows(model, block, 0, count)


def _last_rows(model, block, count):
    rows = block.h.shape[0]
    return _cut_rows(model, block, rows - count, rows)


def _calibration_rate(model, rows=256, seconds=0.3):
    """Steps per second of this worker on a small grid of the model."""
    model = _on_worker(model)
    from hpcgpu.grid import Grid  # noqa: F401 - model types stay on the worker

    state = model.initial_state()
    block = model.take_block(state, 0, min(rows, model.decomposition_size()))
    dt = model.suggested_dt(state, 0.3)
    model.advance_rows(block, dt, 1, 0, False, False)  # compile
    steps, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        started = time.perf_counter()
        block = model.advance_rows(block, dt, 2, 0, False, False)
        _emulate_slowdown(started)
        steps += 2
    model.backend.synchronize()
    return steps / (time.perf_counter() - start)


def calibrate_workers(client, model):
    """``{worker address: steps/s}`` from a short run of ``model`` on every worker."""
    workers = sorted(worker_info(client))
    futures = {w: client.submit(_calibration_rate, model, key=f"{model.name}-calibrate-{uuid.uuid4().hex}",
                                workers=[w], allow_other_workers=False, pure=False)
               for w in workers}
    return {w: float(f.result(timeout=RESULT_TIMEOUT_S)) for w, f in futures.items()}


class RowExecutor(_PartitionedExecutor):
    """Blocks of grid rows; each task advances K steps after a halo exchange.

    Parameters are those of :func:`DistributedExecutor`. Raises ConfigError
    when a block is thinner than the halo K steps read.
    """

    unit = "rows"

    def _default_steps_per_task(self, model, partitions):
        return auto_steps_per_task(model, partitions)

    def _calibrate(self, client, model):
        return calibrate_workers(client, model)

    def _minimum_block(self, partitions):
        return max(self.model.halo_rows(self.steps_per_task)) if partitions > 1 else 1

    def _weights_from_rates(self, rates):
        """Rows in proportion to the rates, after the halo work every block does whatever its size.

        A block steps its rows plus, on average, half its halo rows (the
        stepped rows shrink stage by stage), so a slow worker's block needs
        fewer rows than its rate's share: ``rows_p + extra`` proportional to
        ``rate_p``.
        """
        count = len(rates)
        if count == 1:
            return list(rates)
        extra = sum(self.model.halo_rows(self.steps_per_task)) / 2
        total = self.model.decomposition_size() + count * extra
        shares = [rate / sum(rates) * total - extra for rate in rates]
        # split_rows raises a too-small block to the halo width; keep weights positive
        return [max(share, 1e-3) for share in shares]

    def _neighbours(self, p):
        periodic = self.model.periodic_rows()
        count = self.partitions
        south = (p - 1) % count if (p > 0 or periodic) else None
        north = (p + 1) % count if (p < count - 1 or periodic) else None
        return south, north

    def _superstep(self, steps):
        model, blocks = self._model, self.blocks
        self.superstep += 1
        n = self.superstep
        if self.partitions == 1:
            self.blocks = [self._submit(_advance_block, model, self.dt, steps, blocks[0], None, None, 0,
                                        key=self._key("advance", n, 0), worker=self.owner[0])]
            self.step += steps
            return
        south_width, north_width = self.model.halo_rows(steps)
        halos = []
        for p in range(self.partitions):
            south, north = self._neighbours(p)
            halos.append((
                None if south is None else self._submit_cut(
                    _last_rows, model, blocks[south], south_width, key=self._key("halo", n, p, "south"),
                    worker=self.owner[south]),
                None if north is None else self._submit_cut(
                    _first_rows, model, blocks[north], north_width, key=self._key("halo", n, p, "north"),
                    worker=self.owner[north])))
        self.blocks = [self._submit(_advance_block, model, self.dt, steps, blocks[p], south_halo, north_halo,
                                    start, key=self._key("advance", n, p), worker=self.owner[p])
                       for p, ((start, _), (south_halo, north_halo)) in enumerate(zip(self.bounds, halos))]
        self.step += steps

    def _sums_extra(self, p):
        south, _ = self._neighbours(p)
        if south is None:
            return None
        return self._submit_cut(_last_rows, self._model, self.blocks[south], 1,
                                key=self._key("diag-row", self.superstep, p), worker=self.owner[south])
