"""Grid rows: each rank holds a block of rows and trades halos with its two neighbours every K steps.

A superstep of K steps on rank p: send its first ``north`` rows to the
rank south of it (they are that rank's north halo) and its last ``south``
rows to the rank north of it, receive its own halos, write them into the
spare rows around its block (no copy of the block), advance K steps with
open edges, and keep the rows that stayed valid (``halo_rows(K)`` is how
far K steps read). The results equal the single-block run bitwise: every
point is computed by the same operations; only the open edges differ, and
they are cut away.

With :data:`OVERLAP_ENV` set to 1 a superstep instead steps its block
alone while the halos travel and then the two thin edge strips
(:meth:`RowDecomposition._overlapped_superstep`): a neighbour that runs
late by up to a step costs nothing, where the assembled superstep waits
for it. Its strips cost about ``K x (2 x reach)`` rows of extra stepping
per step and two more stepping calls: 2-3% faster at K <= 2 on 2048^2
blocks here, slower on small blocks, so it is not the default yet.

Without weights the rows are split for equal work, not equal rows
(:func:`halo_balanced_weights`): in a channel the two blocks at the walls
step one halo, the others two, so the wall blocks hold a few more rows.

:func:`auto_steps_per_task` picks K when none is given (fewer, larger
exchanges against redundant halo work) and :func:`calibrate_workers`
measures each worker's step rate for weighted blocks.
"""

import time
import uuid
from dataclasses import dataclass

from hpcgpu.cluster import worker_info
from hpcgpu.errors import ConfigError
from hpcgpu.partition.decomposition import Decomposition, on_worker
from hpcgpu.partition.layout import split_rows
from hpcgpu.validation import check_int

__all__ = ["RowDecomposition", "SLOWDOWN_ENV", "auto_steps_per_task", "calibrate_workers", "halo_balanced_weights"]

SLOWDOWN_ENV = "HPCGPU_EMULATE_SLOWDOWN"
"""Environment variable (benchmarks and tests only): a worker started with it
set to a factor f > 1 sleeps ``(f - 1)`` times the compute time after each
row-block advance and calibration step, so it behaves like a device f times
slower without taking CPU from the others. ``hpcgpu bench scaling`` uses it
for its mixed-cluster balance case on machines without mixed devices."""

_CALIBRATION_TIMEOUT_S = 600.0


def emulate_slowdown(started):
    """Sleep so that the work begun at ``started`` took SLOWDOWN_ENV times as long."""
    import os

    factor = float(os.environ.get(SLOWDOWN_ENV, "1") or 1)
    if factor > 1:
        time.sleep((factor - 1.0) * (time.perf_counter() - started))


def auto_steps_per_task(model, partitions):
    """Time steps per halo exchange K for ``model`` on ``partitions`` equal blocks, when none is given.

    Row models: the largest of 16, 8, 4, 2 whose halo (the wider side) is
    at most a quarter of a block, else 1. A quarter keeps the redundant halo
    work under about 15% of a block while an exchange is paid once per K
    steps. Models that need every position each step (bodies, MD slabs): 1.

    Examples
    --------
    >>> from hpcgpu.workloads.weather import ShallowWater
    >>> model = ShallowWater("unstable_jet", nx=64, ny=1024, backend="numpy")
    >>> auto_steps_per_task(model, 2), auto_steps_per_task(model, 16), auto_steps_per_task(model, 64)
    (16, 2, 1)
    """
    if getattr(model, "decomposition", "rows") not in ("rows", "grid"):
        return 1
    rows = model.decomposition_size() // check_int("partitions", partitions, minimum=1)
    for k in (16, 8, 4, 2):
        if 4 * max(model.halo_rows(k)) <= rows:
            return k
    return 1


def _calibration_rate(model, rows=256, seconds=0.3):
    """Steps per second of this worker on a small grid of the model."""
    model = on_worker(model)
    state = model.initial_state()
    block = model.take_block(state, 0, min(rows, model.decomposition_size()))
    dt = model.suggested_dt(state, 0.3)
    model.advance_rows(block, dt, 1, 0, False, False)  # compile
    steps, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        started = time.perf_counter()
        block = model.advance_rows(block, dt, 2, 0, False, False)
        emulate_slowdown(started)
        steps += 2
    model.backend.synchronize()
    return steps / (time.perf_counter() - start)


def calibrate_workers(client, model):
    """``{worker address: steps/s}`` from a short run of ``model`` on every worker."""
    workers = sorted(worker_info(client))
    futures = {w: client.submit(_calibration_rate, model, key=f"{model.name}-calibrate-{uuid.uuid4().hex}",
                                workers=[w], allow_other_workers=False, pure=False)
               for w in workers}
    return {w: float(f.result(timeout=_CALIBRATION_TIMEOUT_S)) for w, f in futures.items()}


def weights_from_rates(model, steps_per_task, rates):
    """Block weights that make blocks on workers of these step rates finish together.

    A block steps its rows plus, on average, half its halo rows (the
    stepped rows shrink stage by stage), so a slow worker's block needs
    fewer rows than its rate's share: ``rows_p + extra`` proportional to
    ``rate_p``.
    """
    count = len(rates)
    if count == 1:
        return list(rates)
    extra = sum(model.halo_rows(steps_per_task)) / 2
    total = model.decomposition_size() + count * extra
    shares = [rate / sum(rates) * total - extra for rate in rates]
    # split_rows raises a too-small block to the halo width; keep weights positive
    return [max(share, 1e-3) for share in shares]


def halo_balanced_weights(model, steps_per_task, partitions, periodic):
    """Rows per block (as split weights) that give every block the same stepping work.

    A block steps its own rows plus, on average, half the halo rows of each
    edge it shares with a neighbour (the stepped rows shrink towards an open
    edge): ``(south + north) / 2`` for a block between two neighbours, less
    for the two blocks at the walls of a channel. Equal rows would leave the
    inner blocks the slowest; these make ``rows_p + extra_p`` equal. In a
    periodic domain every block has two neighbours: equal rows.

    Examples
    --------
    >>> from hpcgpu.workloads.weather import ShallowWater
    >>> channel = ShallowWater("unstable_jet", nx=16, ny=400, backend="numpy")
    >>> [round(w, 1) for w in halo_balanced_weights(channel, 4, 3, periodic=False)]
    [139.3, 127.3, 133.3]
    """
    south, north = model.halo_rows(steps_per_task)
    extras = [(south * (periodic or p > 0) + north * (periodic or p < partitions - 1)) / 2
              for p in range(partitions)]
    total = model.decomposition_size() + sum(extras)
    return [max(total / partitions - extra, 1e-3) for extra in extras]


@dataclass(frozen=True)
class RowDecomposition(Decomposition):
    """Blocks of grid rows, ``bounds[p] = (first, stop)`` on rank p, K steps per halo exchange."""

    bounds: tuple
    steps_per_task: int
    periodic: bool
    weights: tuple
    dt: float
    overlap: bool = False
    unit = "rows"

    @classmethod
    def calibrate(cls, client, model):
        return calibrate_workers(client, model)

    @classmethod
    def build(cls, model, dt, partitions, steps_per_task, weights, calibrated, grid=None):
        """The layout of ``model`` on ``partitions`` ranks (K defaults to :func:`auto_steps_per_task`)."""
        if grid is not None and tuple(grid) != (1, partitions):
            raise ConfigError(f"grid must be (1, {partitions}) for a model split into blocks of rows; got {grid!r}")
        rows = model.decomposition_size()
        if partitions > rows:
            raise ConfigError(f"partitions must be <= {rows} (the rows of the model); got {partitions}")
        k = auto_steps_per_task(model, partitions) if steps_per_task is None else steps_per_task
        periodic = bool(model.periodic_rows())
        shares = None
        if weights is None:  # equal work, not equal rows: the blocks at a wall step fewer halo rows
            weights = [1.0] * partitions
            shares = halo_balanced_weights(model, k, partitions, periodic)
        weights = list(weights)
        if calibrated:
            weights = weights_from_rates(model, k, weights)
        minimum = max(model.halo_rows(k)) if partitions > 1 else 1
        if partitions * minimum > rows and steps_per_task is not None:
            fits = [c for c in (16, 8, 4, 2, 1) if c < k and partitions * max(model.halo_rows(c)) <= rows]
            if fits:  # say which K would do, beside split_rows's advice on partitions
                raise ConfigError(
                    f"steps_per_task={k} needs {minimum} rows of halo per block, {partitions * minimum} rows on "
                    f"partitions={partitions}, but the grid has {rows}: use steps_per_task <= {fits[0]}, fewer "
                    "partitions or a bigger grid")
        bounds = split_rows(rows, weights if shares is None else shares, minimum)
        overlap = _overlap_default(k)
        return cls(tuple(bounds), k, periodic, tuple(float(w) for w in weights), float(dt), overlap)

    def sizes(self):
        return list(self.bounds)

    def split(self, model, host_state):
        return [model.take_block(host_state, a, b) for a, b in self.bounds]

    def neighbours(self, rank):
        """``(south, north)`` ranks of ``rank`` (None at a wall)."""
        count = len(self.bounds)
        south = (rank - 1) % count if (rank > 0 or self.periodic) else None
        north = (rank + 1) % count if (rank < count - 1 or self.periodic) else None
        return south, north

    # -- the rank's side ----------------------------------------------------------------------------------
    def advance(self, context, block, steps):
        remaining = steps
        while remaining > 0:
            k = min(self.steps_per_task, remaining)
            block = self._superstep(context, block, k)
            remaining -= k
        return block

    def _superstep(self, context, block, steps):
        model, comm, rank = context.model, context.comm, context.rank
        if self.overlap and len(self.bounds) > 1 and model.block_size(block) >= sum(model.halo_rows(steps)):
            return self._overlapped_superstep(context, block, steps)
        started = time.perf_counter()
        first_row = self.bounds[rank][0]
        if len(self.bounds) == 1:
            result = model.advance_rows(model.assemble_rows(None, block, None), self.dt, steps, first_row, False,
                                        False, cache=context.cache, fresh=True)
            emulate_slowdown(started)
            return result
        south, north = self.neighbours(rank)
        rows = model.block_size(block)
        incoming_south, incoming_north, sends = self._post_halos(context, block, steps)
        south_rows = None if incoming_south is None else incoming_south.wait(comm.timeout)
        north_rows = None if incoming_north is None else incoming_north.wait(comm.timeout)
        assembled = model.assemble_rows(south_rows, block, north_rows)
        skip = 0 if south_rows is None else model.block_size(south_rows)
        result = model.advance_rows(assembled, self.dt, steps, first_row - skip, south_open=south is not None,
                                    north_open=north is not None, cache=context.cache, fresh=True)
        comm.waitall(sends)
        emulate_slowdown(started)
        return model.row_view(result, skip, skip + rows)

    def _post_halos(self, context, block, steps):
        """Post this rank's halo receives, then its sends; returns ``(incoming south, incoming north, sends)``."""
        model, comm = context.model, context.comm
        south, north = self.neighbours(context.rank)
        south_width, north_width = model.halo_rows(steps)
        rows = model.block_size(block)
        # receives first, then sends: a neighbour's halo may already be here
        incoming_south = None if south is None else comm.irecv(south, "south-halo")
        incoming_north = None if north is None else comm.irecv(north, "north-halo")
        sends = []
        if south is not None:  # my first rows are the south neighbour's north halo
            sends.append(comm.isend(_cut(model, block, 0, north_width), south, "north-halo"))
        if north is not None:
            sends.append(comm.isend(_cut(model, block, rows - south_width, rows), north, "south-halo"))
        return incoming_south, incoming_north, sends

    def _overlapped_superstep(self, context, block, steps):
        """A superstep that steps its block while the halos travel, then its two edge strips.

        The block stepped alone, with open edges where it has neighbours,
        leaves every row at least the halo width from such an edge valid.
        The rows within it come from a strip: the halo that arrived and the
        block's rows the halo's reach needs, stepped apart and cut to the
        rows it makes valid. Every point is computed by the same operations
        as in the assembled block, so the result is bitwise the same. A
        neighbour that is late by up to the block's own stepping time costs
        nothing: the exchange no longer puts the ranks in lock step.
        """
        model, comm, rank = context.model, context.comm, context.rank
        started = time.perf_counter()
        first_row = self.bounds[rank][0]
        south, north = self.neighbours(rank)
        south_width, north_width = model.halo_rows(steps)
        rows = model.block_size(block)
        incoming_south, incoming_north, sends = self._post_halos(context, block, steps)
        result = model.advance_rows(block, self.dt, steps, first_row, south_open=south is not None,
                                    north_open=north is not None, cache=context.cache, fresh=True)
        reach = south_width + north_width
        if incoming_south is not None:  # valid out of it: the block's first south_width rows
            strip = model.concat_blocks([incoming_south.wait(comm.timeout), model.row_view(block, 0, reach)])
            edge = model.advance_rows(strip, self.dt, steps, first_row - south_width, True, True,
                                      cache=context.cache)
            model.write_rows(result, 0, model.row_view(edge, south_width, 2 * south_width))
        if incoming_north is not None:  # valid out of it: the block's last north_width rows
            strip = model.concat_blocks([model.row_view(block, rows - reach, rows), incoming_north.wait(comm.timeout)])
            edge = model.advance_rows(strip, self.dt, steps, first_row + rows - reach, True, True,
                                      cache=context.cache)
            model.write_rows(result, rows - north_width, model.row_view(edge, south_width, reach))
        comm.waitall(sends)
        emulate_slowdown(started)
        return result

    def block_sums(self, context, block):
        """Partial sums of this block; the last row of the south neighbour comes over for the corners."""
        model, comm, rank = context.model, context.comm, context.rank
        south, north = self.neighbours(rank)
        if len(self.bounds) == 1:
            rows = model.block_size(block)
            south_row = None if not self.periodic else model.take_block(block, rows - 1, rows)
        else:
            incoming = None if south is None else comm.irecv(south, "diagnostic-row")
            rows = model.block_size(block)
            send = None if north is None else comm.isend(_cut(model, block, rows - 1, rows), north,
                                                         "diagnostic-row")
            south_row = None if incoming is None else incoming.wait(comm.timeout)
            if send is not None:
                send.wait(comm.timeout)
        return model.block_sums(model.concat_blocks([block]), self.bounds[rank][0], south_row)


OVERLAP_ENV = "HPCGPU_HALO_OVERLAP"
"""Environment variable, read where the layout is built (the client): ``1``
turns the overlapped superstep on for every K; anything else leaves it off."""


def _overlap_default(steps_per_task):
    """Whether supersteps of K steps step the block while the halos travel (only when :data:`OVERLAP_ENV` is 1)."""
    import os

    # measured on 2 workers, alternated (docs/benchmarks.md): 2-3% faster at
    # K = 1 and 2 on 2048^2 blocks, 3% slower at K = 4; but 6% slower on
    # 1024 x 80 blocks and 30% on 256 x 64 (three stepping calls a superstep
    # instead of one), so it is off until a block-size rule is measured
    return os.environ.get(OVERLAP_ENV, "").strip() == "1"


def _cut(model, block, start, stop):
    """Rows ``start:stop`` of a block to send: views on the host (the block is not written while they travel)."""
    if model.backend.on_gpu:
        return model.take_block(block, start, stop)
    return model.row_view(block, start, stop)
