"""The distributed structured grid: a px x py process grid of blocks that trade framed halos every K steps.

Each rank owns a block of ``rows x cols`` cells and keeps it inside arrays
with a *frame*: as many cells beyond each side as K steps read there
(``model.reach(K)``), on the sides that have a neighbour. A superstep of K
steps on a rank:

1. **x stage**: send its first and last owned columns (its own rows only)
   to its west and east neighbours, and write theirs into its west and east
   frame;
2. **y stage**: send its first and last owned rows *across the whole framed
   width* to its south and north neighbours, and write theirs into its
   south and north frame. The rows carry the x frames just filled, so the
   corner cells arrive with them: four messages, no diagonal ones (the
   staging of LAMMPS' ``comm_brick``);
3. step the framed block K steps (``model.step_block``); the cells the
   frame protects are exactly those K steps leave valid, so the owned
   cells are computed by the same operations as in one block: results are
   bitwise those of one process.

An axis split over one rank has no frame: on a periodic axis the block
wraps onto itself (``"wrap"``: the model's step wraps, as ``numpy.roll``
does), on a walled one the domain ends (``"wall"``). The model sees where
its block lies through a :class:`~hpcgpu.partition.block_region.BlockRegion`.

Blocks are a tensor product: every process column shares its column
bounds, every process row its row bounds, so each rank has at most one
neighbour per side. Without weights the split gives every block the same
stepping work (blocks at a wall step less frame, so hold a few more
cells); weights (one per rank, or ``"calibrate"``) are averaged along each
axis of the process grid.

Examples
--------
>>> from hpcgpu.workloads.weather import ShallowWater
>>> model = ShallowWater("unstable_jet", nx=64, ny=64, backend="numpy")
>>> layout = GridDecomposition.build(model, 30.0, 4, None, None, False, grid=(2, 2))
>>> layout.grid, layout.steps_per_task, layout.x_bounds
((2, 2), 1, ((0, 32), (32, 64)))
"""

import math
import time
from dataclasses import dataclass, fields

import numpy as np

from hpcgpu.errors import ConfigError
from hpcgpu.partition.block_region import BlockRegion
from hpcgpu.partition.decomposition import Decomposition
from hpcgpu.partition.layout import alignment, split_rows
from hpcgpu.partition.process_grid import check_grid, choose_process_grid
from hpcgpu.partition.slowdown import emulate_slowdown

__all__ = ["FramedBlock", "GridDecomposition", "auto_grid_steps", "reach_of", "state_arrays", "with_arrays"]

_STEP_CHOICES = (16, 8, 4, 2)


@dataclass(frozen=True)
class FramedBlock:
    """What a rank keeps between epochs: its state in framed arrays, and where the block lies."""

    state: object
    where: BlockRegion

    def owned(self):
        """The state of the owned cells (views)."""
        return with_arrays(self.state, [self.where.interior(a) for a in state_arrays(self.state)])


def _takes_cache(model):
    import inspect

    try:
        return "cache" in inspect.signature(model.step_block).parameters
    except (TypeError, ValueError):  # pragma: no cover - builtins without a signature
        return False


def state_arrays(state):
    """The 2-D arrays of a grid state, in field order (a dataclass of arrays)."""
    return tuple(getattr(state, f.name) for f in fields(state))


def with_arrays(state, arrays):
    """A state of ``state``'s type holding ``arrays`` (in field order)."""
    return type(state)(*arrays)


def reach_of(model, steps):
    """``(west, east, south, north)`` cells that ``steps`` steps of ``model`` read beyond a block.

    ``model.reach(steps)`` may give one number (every side), ``(x, y)`` or
    the four sides.
    """
    reach = model.reach(steps)
    if isinstance(reach, (int, np.integer)):
        reach = (reach,) * 4
    reach = tuple(int(r) for r in reach)
    if len(reach) == 2:
        reach = (reach[0], reach[0], reach[1], reach[1])
    if len(reach) != 4 or any(r < 0 for r in reach):
        raise ConfigError(f"{type(model).__name__}.reach({steps}) must be an int >= 0, (x, y) or (west, east, south, "
                          f"north); got {model.reach(steps)!r}")
    return reach


def _blocks(shape, grid):
    """``(rows, cols)`` of an equal block of ``shape`` on ``grid`` (for choosing K)."""
    (ny, nx), (px, py) = shape, grid
    return ny // py, nx // px


def auto_grid_steps(model, grid):
    """Steps per halo exchange K when none is given: the largest of 16, 8, 4, 2 whose frame is at most a
    quarter of a block along every split axis, else 1.

    A quarter keeps the redundant frame work low while an exchange is paid
    once per K steps.

    Examples
    --------
    >>> from hpcgpu.workloads.weather import ShallowWater
    >>> model = ShallowWater("unstable_jet", nx=1024, ny=1024, backend="numpy")
    >>> auto_grid_steps(model, (1, 2)), auto_grid_steps(model, (4, 4)), auto_grid_steps(model, (64, 1))
    (16, 8, 1)
    """
    rows, cols = _blocks(model.shape, grid)
    px, py = grid
    for k in _STEP_CHOICES:
        west, east, south, north = reach_of(model, k)
        if (py == 1 or 4 * max(south, north) <= rows) and (px == 1 or 4 * max(west, east) <= cols):
            return k
    return 1


def _sides(index, count, periodic):
    """``(low, high)`` of one axis for block ``index`` of ``count``: 'halo', 'wall' or 'wrap'."""
    if count == 1:
        return ("wrap", "wrap") if periodic else ("wall", "wall")
    low = "halo" if (index > 0 or periodic) else "wall"
    high = "halo" if (index < count - 1 or periodic) else "wall"
    return low, high


def _balanced(extent, count, periodic, frame_low, frame_high, shrink):
    """Weights that give every block of one axis the same stepping work.

    A block steps its own cells plus the frame on each side with a
    neighbour: all of it, or about half where the model's stepped rows or
    columns shrink stage by stage towards an open edge (``shrink``: the
    model's ``shrinks_rows`` / ``shrinks_cols``).
    """
    factor = 0.5 if shrink else 1.0
    extras = [factor * (frame_low * (_sides(p, count, periodic)[0] == "halo")
                        + frame_high * (_sides(p, count, periodic)[1] == "halo")) for p in range(count)]
    total = extent + sum(extras)
    return [max(total / count - extra, 1e-3) for extra in extras]


def _axis_weights(weights, grid):
    """Per-rank weights (x fastest) averaged along each axis: ``(x weights, y weights)``."""
    px, py = grid
    table = np.asarray(weights, dtype=float).reshape(py, px)
    return list(table.mean(axis=0)), list(table.mean(axis=1))


@dataclass(frozen=True)
class GridDecomposition(Decomposition):
    """Blocks of a 2-D grid on a ``(px, py)`` process grid, framed halos every K steps.

    ``x_bounds[i]`` are the columns of process column i, ``y_bounds[j]``
    the rows of process row j; rank ``j * px + i`` holds their block.
    """

    grid: tuple
    x_bounds: tuple
    y_bounds: tuple
    frame: tuple  # cells (west, east, south, north) beyond a block that K steps read
    steps_per_task: int
    periodic: tuple  # (x, y)
    weights: tuple
    dt: float
    unit = "cells"

    # -- the client side ----------------------------------------------------------------------------------
    @classmethod
    def calibrate(cls, client, model):
        """``{worker address: steps/s}`` from a short run of a small block of ``model`` on every worker."""
        import uuid

        from hpcgpu.cluster import worker_info

        workers = sorted(worker_info(client))
        futures = {w: client.submit(_calibration_rate, model, key=f"{model.name}-calibrate-{uuid.uuid4().hex}",
                                    workers=[w], allow_other_workers=False, pure=False) for w in workers}
        return {w: float(f.result(timeout=_CALIBRATION_TIMEOUT_S)) for w, f in futures.items()}

    @classmethod
    def build(cls, model, dt, partitions, steps_per_task, weights, calibrated, grid=None):
        """The layout of ``model`` on ``partitions`` ranks (``grid`` forces the process grid)."""
        ny, nx = model.shape
        periodic = tuple(bool(p) for p in model.periodic)
        if grid is None:
            grid = _least_surface_grid(model, partitions, steps_per_task)
        grid = check_grid(grid, 2, partitions)
        px, py = grid
        if px > nx or py > ny:
            raise ConfigError(f"grid={px}x{py} splits a grid of nx={nx}, ny={ny} into blocks of no cells: use at most "
                              f"{nx} ranks along x and {ny} along y")
        k = auto_grid_steps(model, grid) if steps_per_task is None else steps_per_task
        frame = reach_of(model, k)
        x_weights = _balanced(nx, px, periodic[0], frame[0], frame[1], getattr(model, "shrinks_cols", False))
        y_weights = _balanced(ny, py, periodic[1], frame[2], frame[3], getattr(model, "shrinks_rows", False))
        given = None
        if weights is not None:
            given = [float(w) for w in weights]
            x_given, y_given = _axis_weights(given, grid)
            x_weights = [w * g / sum(x_given) * px for w, g in zip(x_weights, x_given)]
            y_weights = [w * g / sum(y_given) * py for w, g in zip(y_weights, y_given)]
        x_bounds = _split_axis("x", nx, x_weights, max(frame[:2]) if px > 1 else 1, k, grid, steps_per_task)
        y_bounds = _split_axis("y", ny, y_weights, max(frame[2:]) if py > 1 else 1, k, grid, steps_per_task)
        return cls(grid, tuple(x_bounds), tuple(y_bounds), frame, k, periodic,
                   tuple(given if given is not None else [1.0] * partitions), float(dt))

    def coordinates(self, rank):
        """``(i, j)``: the process column and row of ``rank``."""
        px = self.grid[0]
        return rank % px, rank // px

    def rank_of(self, i, j):
        """The rank at process column ``i``, row ``j`` (wrapped on periodic axes)."""
        px, py = self.grid
        return (j % py) * px + (i % px)

    def region(self, rank):
        """The :class:`BlockRegion` of ``rank``'s framed arrays."""
        i, j = self.coordinates(rank)
        (c0, c1), (r0, r1) = self.x_bounds[i], self.y_bounds[j]
        west, east = _sides(i, self.grid[0], self.periodic[0])
        south, north = _sides(j, self.grid[1], self.periodic[1])
        sides = (west, east, south, north)
        fw, fe, fs, fn = (width if side == "halo" else 0 for width, side in zip(self.frame, sides))
        return BlockRegion(first_row=r0 - fs, first_col=c0 - fw, rows=slice(fs, fs + r1 - r0),
                           cols=slice(fw, fw + c1 - c0), sides=sides,
                           shape=(self.y_bounds[-1][1], self.x_bounds[-1][1]))

    def framed_shape(self, rank):
        """Shape of ``rank``'s framed arrays."""
        where = self.region(rank)
        fn = self.frame[3] if where.sides[3] == "halo" else 0
        fe = self.frame[1] if where.sides[1] == "halo" else 0
        return where.rows.stop + fn, where.cols.stop + fe

    def sizes(self):
        return [(0, (r1 - r0) * (c1 - c0)) for (r0, r1) in self.y_bounds for (c0, c1) in self.x_bounds]

    def describe(self):
        return {"process_grid": "x".join(map(str, self.grid)), "block_rows": [b - a for a, b in self.y_bounds],
                "block_cols": [b - a for a, b in self.x_bounds]}

    def split(self, model, host_state):
        blocks = []
        arrays = state_arrays(host_state)
        for rank in range(math.prod(self.grid)):
            where = self.region(rank)
            framed = []
            for array in arrays:
                block = np.zeros(self.framed_shape(rank), dtype=array.dtype)
                rows, cols = where.owned_rows, where.owned_cols
                block[where.rows, where.cols] = array[rows.start:rows.stop, cols.start:cols.stop]
                framed.append(block)
            blocks.append(FramedBlock(with_arrays(host_state, framed), where))
        return blocks

    builds_blocks = True

    def owned_region(self, rank):
        """The :class:`BlockRegion` of ``rank``'s owned cells alone, without a frame (what ``initial_block`` gets)."""
        where = self.region(rank)
        rows, cols = where.owned_rows, where.owned_cols
        return BlockRegion(first_row=rows.start, first_col=cols.start, rows=slice(0, len(rows)),
                           cols=slice(0, len(cols)), sides=where.sides, shape=where.shape)

    def build_block(self, model, rank, source):
        """Rank ``rank``'s framed initial block (host), its owned cells from ``source``, its frames zero (as :meth:`split`)."""
        where = self.region(rank)
        owned = source.owned_block(model, self.owned_region(rank))
        expected = (len(where.owned_rows), len(where.owned_cols))
        framed = []
        for name, array in zip((f.name for f in fields(owned)), state_arrays(owned)):
            array = array if isinstance(array, np.ndarray) else model.backend.to_host(array)
            if array.shape != expected:
                raise ConfigError(f"{type(model).__name__}: the initial block of rows {where.owned_rows.start}:"
                                  f"{where.owned_rows.stop}, columns {where.owned_cols.start}:{where.owned_cols.stop} "
                                  f"has {name} of shape {array.shape}; expected {expected} (the owned cells)")
            block = np.zeros(self.framed_shape(rank), dtype=array.dtype)
            block[where.rows, where.cols] = array
            framed.append(block)
        return FramedBlock(with_arrays(owned, framed), where)

    def piece_region(self, rank):
        """``{"rows": [first, stop], "cols": [first, stop]}``: the global cells ``rank`` owns."""
        where = self.region(rank)
        return {"rows": [where.owned_rows.start, where.owned_rows.stop],
                "cols": [where.owned_cols.start, where.owned_cols.stop]}

    def join(self, model, host_blocks):
        ny, nx = self.y_bounds[-1][1], self.x_bounds[-1][1]
        first = state_arrays(host_blocks[0])
        out = [np.empty((ny, nx), dtype=a.dtype) for a in first]
        for rank, block in enumerate(host_blocks):
            i, j = self.coordinates(rank)
            (c0, c1), (r0, r1) = self.x_bounds[i], self.y_bounds[j]
            for target, source in zip(out, state_arrays(block)):
                target[r0:r1, c0:c1] = source
        return with_arrays(host_blocks[0], [model.backend.asarray(a) for a in out])

    # -- the rank side ------------------------------------------------------------------------------------
    def resume(self, context, carried):
        arrays = state_arrays(carried.state)
        xp = context.model.backend.xp
        if all(isinstance(a, xp.ndarray) for a in arrays):
            return carried
        return FramedBlock(with_arrays(carried.state, [context.model.backend.asarray(a) for a in arrays]),
                           carried.where)

    def model_state(self, carried):
        """The rank's owned cells (views into its framed arrays)."""
        return carried.owned()

    def advance(self, context, carried, steps):
        model, where = context.model, carried.where
        # a model's step may keep work buffers per block shape in the rank's cache
        options = {"cache": context.cache} if _takes_cache(model) else {}
        state = carried.state
        remaining = steps
        while remaining > 0:
            k = min(self.steps_per_task, remaining)
            self.fill_frames(context, state)
            started = time.perf_counter()
            state = model.step_block(state, self.dt, k, where, **options)
            emulate_slowdown(started)  # benchmarks of mixed clusters only (SLOWDOWN_ENV)
            remaining -= k
        return FramedBlock(state, where)

    def fill_frames(self, context, state):
        """The staged halo exchange into ``state``'s frames: x frames, then y frames across the framed width
        (the corners ride along)."""
        comm, rank = context.comm, context.rank
        where = self.region(rank)
        arrays = state_arrays(state)
        i, j = self.coordinates(rank)
        fw, fe, fs, fn = self.frame
        rows, cols = where.rows, where.cols
        if "halo" in where.sides[:2]:
            west, east = self.rank_of(i - 1, j), self.rank_of(i + 1, j)
            xp = context.model.backend.xp
            incoming = {}
            if where.sides[0] == "halo":
                incoming["west"] = comm.irecv(west, ("frame", "west"))
            if where.sides[1] == "halo":
                incoming["east"] = comm.irecv(east, ("frame", "east"))
            sends = []
            if where.sides[0] == "halo":  # my first columns are the west neighbour's east frame
                sends.append(comm.isend(tuple(xp.ascontiguousarray(a[rows, cols.start:cols.start + fe])
                                              for a in arrays), west, ("frame", "east")))
            if where.sides[1] == "halo":
                sends.append(comm.isend(tuple(xp.ascontiguousarray(a[rows, cols.stop - fw:cols.stop])
                                              for a in arrays), east, ("frame", "west")))
            if "west" in incoming:
                for target, part in zip(arrays, incoming["west"].wait(comm.timeout)):
                    target[rows, :fw] = context.model.backend.asarray(part)
            if "east" in incoming:
                for target, part in zip(arrays, incoming["east"].wait(comm.timeout)):
                    target[rows, cols.stop:] = context.model.backend.asarray(part)
            comm.waitall(sends)
        if "halo" in where.sides[2:]:
            south, north = self.rank_of(i, j - 1), self.rank_of(i, j + 1)
            incoming = {}
            if where.sides[2] == "halo":
                incoming["south"] = comm.irecv(south, ("frame", "south"))
            if where.sides[3] == "halo":
                incoming["north"] = comm.irecv(north, ("frame", "north"))
            sends = []
            if where.sides[2] == "halo":  # whole framed rows: the x frames' corners go with them
                sends.append(comm.isend(tuple(a[rows.start:rows.start + fn] for a in arrays), south,
                                        ("frame", "north")))
            if where.sides[3] == "halo":
                sends.append(comm.isend(tuple(a[rows.stop - fs:rows.stop] for a in arrays), north, ("frame", "south")))
            if "south" in incoming:
                for target, part in zip(arrays, incoming["south"].wait(comm.timeout)):
                    target[:fs] = context.model.backend.asarray(part)
            if "north" in incoming:
                for target, part in zip(arrays, incoming["north"].wait(comm.timeout)):
                    target[rows.stop:] = context.model.backend.asarray(part)
            comm.waitall(sends)

    def block_sums(self, context, carried):
        """This rank's partial sums, over its owned cells, with its frames filled from the neighbours."""
        self.fill_frames(context, carried.state)
        return context.model.block_sums(carried.state, carried.where)


def _least_surface_grid(model, partitions, steps_per_task):
    """The process grid of least frame surface whose blocks hold the frame of K steps (1 when K is not given)."""
    ny, nx = model.shape

    def choose(k):
        one = reach_of(model, k)
        widths = (max(one[:2]), max(one[2:]))
        return choose_process_grid(partitions, (nx, ny), halo=widths, minimum=widths, tie="last")

    try:
        return choose(1 if steps_per_task is None else steps_per_task)
    except ConfigError as error:
        fits = []
        for k in (16, 8, 4, 2, 1):
            if steps_per_task is not None and k < steps_per_task:
                try:
                    choose(k)
                    fits.append(k)
                except ConfigError:
                    pass
        if fits:  # say which K would do
            raise ConfigError(f"steps_per_task={steps_per_task} reads {max(reach_of(model, steps_per_task))} cells "
                              f"beyond a block: {error}; or use steps_per_task <= {fits[0]}") from None
        raise


_CALIBRATION_TIMEOUT_S = 600.0


def _calibration_rate(model, rows=256, seconds=0.3):
    """Steps per second of this worker on a block of at most ``rows`` rows of the model, walls at its edges."""
    from hpcgpu.partition.decomposition import on_worker

    model = on_worker(model)
    ny, nx = model.shape
    rows = min(rows, ny)
    sides = ("wrap", "wrap") if model.periodic[0] else ("wall", "wall")
    where = BlockRegion(first_row=0, first_col=0, rows=slice(0, rows), cols=slice(0, nx),
                        sides=(*sides, "wall", "wall"), shape=(ny, nx))
    if callable(getattr(model, "initial_block", None)):  # the block alone, not the whole grid
        block = model.initial_block(where)
        block = with_arrays(block, [model.backend.asarray(a) for a in state_arrays(block)])
    else:
        state = model.initial_state()
        block = with_arrays(state, [a[:rows].copy() for a in state_arrays(state)])
    dt = model.suggested_dt(block, 0.3)
    options = {"cache": {}} if _takes_cache(model) else {}
    model.step_block(block, dt, 1, where, **options)  # compile
    steps, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        started = time.perf_counter()
        block = model.step_block(block, dt, 2, where, **options)
        emulate_slowdown(started)
        steps += 2
    model.backend.synchronize()
    return steps / (time.perf_counter() - start)


def _split_axis(axis, extent, weights, minimum, k, grid, steps_per_task):
    """Bounds along one axis; a ConfigError that names the axis, the grid and K when blocks are too small."""
    try:
        # cuts on multiples of a power of two: the rank-written Zarr chunks (the divisor of every cut) stay big
        return split_rows(extent, weights, minimum, align=1 if len(weights) == 1 else alignment(extent, len(weights)))
    except ConfigError:
        count = len(weights)
        cells = "columns" if axis == "x" else "rows"
        advice = "fewer steps_per_task (a narrower frame), " if steps_per_task is not None and k > 1 else ""
        raise ConfigError(f"grid={grid[0]}x{grid[1]} splits {extent} {cells} into {count} blocks of at least {minimum} "
                          f"{cells} (the frame of K={k} steps): {count * minimum} > {extent}; use {advice}fewer ranks "
                          f"along {axis}, another grid, or a bigger domain") from None
