"""The cost model of the shallow-water (weather) model for ``hpcgpu plan``: bytes, flops, messages and memory per step.

Declared to the registry by :mod:`hpcgpu.workloads.weather.workload` (``plan=``); the
terms and helpers it builds on live in :mod:`hpcgpu.plan.workload_costs`.

Examples
--------
>>> weather = WeatherCost(16384, 16384, steps=1000)
>>> weather.process_grid(64), weather.steps_per_exchange(64)
((8, 8), 16)
>>> weather.process_grid(2), WeatherCost(1024, 512, steps=1).process_grid(2)
((1, 2), (2, 1))
"""

import math
from dataclasses import dataclass

from hpcgpu.errors import ConfigError
from hpcgpu.partition.process_grid import check_grid, choose_process_grid
from hpcgpu.plan.workload_costs import infeasible_step, kernel_time, launch_wait_s, step_cost
from hpcgpu.validation import check_dtype, check_int

__all__ = ["WeatherCost"]


@dataclass(frozen=True)
class WeatherCost:
    """The shallow-water model (SSP-RK3, Arakawa C-grid) on an ``nx x ny`` grid, split into ``px x py`` blocks.

    On a GPU a step is three fused stages reading and writing 6 + 9 + 9
    fields per point (the traffic ``hpcgpu bench stencil`` counts); on a CPU
    the Numba backend pipelines the three stages in one sweep, which reads
    the state once and writes it once (6). Each stage costs about 130 flops
    per point (counted in ``kernels/stencil/physics.py`` and
    ``_numba._output_row``: potential vorticity, fluxes and Bernoulli ~27,
    the Arakawa-Lamb coefficients recomputed where used, tendencies,
    viscosity and the Runge-Kutta update ~104).

    The ranks form the process grid the engine chooses
    (:mod:`hpcgpu.partition.grid`; x periodic, y walled unless
    ``periodic``). Every K steps a block receives a frame as wide as K
    steps read on each side with a neighbour (the model's own
    ``reach(K)``: 6 K cells west and south, 3 K east and north), corners
    included, by a staged exchange (x, then y across the framed width: 2
    messages per split axis, one latency per stage since a stage's two
    messages travel together), and steps the block with its frame K steps.
    The stepped rows and columns shrink stage by stage towards every side
    with a neighbour (the kernels' row and column windows: half the frame
    on average, along both axes). The engine splits each axis for equal
    stepping work, so every block costs the average.
    K is the engine's (:meth:`steps_per_exchange`) unless
    ``steps_per_task`` is given.
    """

    nx: int
    ny: int
    steps: int
    dtype: str = "float32"
    steps_per_task: int = None
    periodic: bool = False

    name = "weather"
    field_passes_per_step = {"gpu": 24, "cpu": 6}
    flops_per_point_step = 390
    state_fields = 3
    launches_per_step = 3  # one fused kernel per Runge-Kutta stage (launch_stretches adds the halo copies)

    def __post_init__(self):
        check_int("nx", self.nx, minimum=4)
        check_int("ny", self.ny, minimum=4)
        check_int("steps", self.steps, minimum=1)
        if self.steps_per_task is not None:
            check_int("steps_per_task", self.steps_per_task, minimum=1)
        object.__setattr__(self, "dtype", check_dtype("dtype", self.dtype).name)

    def size(self):
        return {"nx": self.nx, "ny": self.ny}

    def describe(self):
        k = "K auto" if self.steps_per_task is None else f"K <= {self.steps_per_task}"
        return f"weather {self.nx} x {self.ny} ({self.dtype}), {self.steps} steps, {k}"

    @staticmethod
    def reach(steps):
        """Cells ``(west, east, south, north)`` that ``steps`` steps read beyond a block (the model's own answer)."""
        from hpcgpu.workloads.weather.grid_blocks import GridBlocks

        return GridBlocks.reach(None, steps)

    @staticmethod
    def field_reach(steps):
        """``{field: (west, east, south, north)}``: the cells of each field the exchange sends (the model's answer).

        Examples
        --------
        >>> WeatherCost.field_reach(1)
        {'u': (3, 3, 4, 3), 'v': (4, 3, 3, 3), 'h': (4, 3, 4, 3)}
        """
        from hpcgpu.workloads.weather.grid_blocks import shallow_water_field_reach

        return shallow_water_field_reach(steps)

    def _choose(self, partitions, steps):
        west, east, south, north = self.reach(steps)
        widths = (max(west, east), max(south, north))
        return choose_process_grid(partitions, (self.nx, self.ny), halo=widths, minimum=widths, tie="last")

    def process_grid(self, partitions):
        """The ``(px, py)`` grid the engine chooses for ``partitions`` ranks.

        The least frame surface among the grids whose blocks hold the frame
        of one step (of ``steps_per_task`` steps when given, lowered until
        some grid holds it), as :class:`hpcgpu.partition.grid.GridDecomposition`
        chooses it.

        Raises
        ------
        ConfigError
            No grid of that many ranks has blocks as wide as one step's frame.
        """
        k = self.steps_per_task or 1
        while True:
            try:
                return self._choose(partitions, k)
            except ConfigError:
                if k == 1:
                    raise
                k -= 1

    def steps_per_exchange(self, partitions, grid=None):
        """K on ``partitions`` blocks (``grid``: default :meth:`process_grid`).

        The engine's rule (:func:`hpcgpu.partition.grid.auto_grid_steps`):
        the largest of 16, 8, 4, 2 whose frame is at most a quarter of a
        block along every split axis, else 1; a given ``steps_per_task`` is
        lowered until the frame fits in a block. Returns 0 when even one
        step's frame is wider than a block.

        Examples
        --------
        >>> weather = WeatherCost(4096, 4096, steps=1)
        >>> weather.steps_per_exchange(16, grid=(1, 16)), weather.steps_per_exchange(16, grid=(4, 4))
        (8, 16)
        """
        from hpcgpu.partition.grid import auto_grid_steps

        grid = self.process_grid(partitions) if grid is None else check_grid(grid, 2, partitions)
        if partitions == 1:
            return self.steps_per_task or 16
        k = self.steps_per_task or auto_grid_steps(_GridShape(self.nx, self.ny, self.reach), grid)
        px, py = grid
        columns, rows = self.nx // px, self.ny // py

        def fits(k):
            west, east, south, north = self.reach(k)
            return (px == 1 or max(west, east) <= columns) and (py == 1 or max(south, north) <= rows)

        while k > 0 and not fits(k):
            k -= 1
        return k

    def _stepped(self, extent, count, periodic, low, high):
        """Cells along one axis that a block steps: the engine splits for equal work, so the average block's.

        Each block steps its own cells and, on average over the K steps,
        half the frame on each side with a neighbour (the stepped window
        shrinks stage by stage from the whole frame to the owned cells);
        returns ``(stepped, framed)``, the framed being the widest block's
        cells with its whole frame (the arrays it keeps).
        """
        if count == 1:
            return extent, extent
        sides = [((p > 0 or periodic), (p < count - 1 or periodic)) for p in range(count)]
        frames = [low * a + high * b for a, b in sides]
        stepped = (extent + 0.5 * sum(frames)) / count
        return stepped, math.ceil(extent / count) + max(frames)

    def launch_stretches(self, step_s, copy_s, steps, x_messages, y_messages, copies_launch=True):
        """The kernels of one superstep (seconds, launch order) between the synchronisations of its exchange.

        As :meth:`hpcgpu.partition.grid.GridDecomposition.fill_frames` and
        ``advance`` run them: the x stage sends the cut x halos (one
        contiguous copy per field and message, which needs them done) and
        writes the received x frames (one copy per field and message);
        the y stage sends whole rows, frames included, so it waits for those
        writes; its own writes, the ``3 K`` stage kernels of the K steps
        and the next superstep's x cuts then queue without a wait. Without
        ``copies_launch`` (a CPU: NumPy copies the frames, no kernel) only
        the stage kernels count.

        Parameters
        ----------
        step_s : float
            The stage kernels' seconds per step (three equal kernels).
        copy_s : float
            Seconds of all the halo cuts and frame writes of a superstep.
        steps : int
            K, steps per superstep.
        x_messages, y_messages : int
            Messages a block receives along x and along y.

        Examples
        --------
        >>> stretches = WeatherCost(64, 64, steps=1).launch_stretches(3e-3, 1.2e-4, 2, 2, 2)
        >>> [len(s) for s in stretches], round(stretches[0][0] * 1e6), round(stretches[1][6] * 1e6)
        ([6, 18], 5, 1000)
        """
        fields = self.state_fields
        copies = fields * 2 * (x_messages + y_messages)  # each message's fields: cut, then written
        copy = copy_s / copies if copies else 0.0
        stage_kernels = [step_s / 3] * (3 * steps)
        if not copies_launch:
            return [stage_kernels]
        cuts_x, writes_x, writes_y = ([copy] * (fields * m) for m in (x_messages, x_messages, y_messages))
        if x_messages and y_messages:
            return [writes_x, writes_y + stage_kernels + cuts_x]
        if x_messages:
            return [writes_x + stage_kernels + cuts_x]
        return [writes_y + stage_kernels]

    def cost(self, partitions, device, link, scheduler, grid=None):
        """The StepCost of a block on ``partitions`` ranks (``grid``: default :meth:`process_grid`)."""
        item = 4 if self.dtype == "float32" else 8
        if grid is None:
            try:
                grid = self.process_grid(partitions)
            except ConfigError:
                return infeasible_step(f"blocks of {self.nx} x {self.ny} cells over {partitions} ranks are thinner "
                                       f"than the {max(self.reach(1))}-cell frame of one step")
        grid = check_grid(grid, 2, partitions)
        px, py = grid
        k = self.steps_per_exchange(partitions, grid)
        if k == 0:
            return infeasible_step(f"blocks of {self.nx // px} x {self.ny // py} cells are thinner than the "
                                   f"{max(self.reach(1))}-cell frame of one step", grid)
        west, east, south, north = self.reach(k)
        stepped_x, framed_x = self._stepped(self.nx, px, True, west, east)  # x is periodic
        stepped_y, framed_y = self._stepped(self.ny, py, self.periodic, south, north)
        computed = stepped_x * stepped_y
        columns, rows = math.ceil(self.nx / px), math.ceil(self.ny / py)
        frame = framed_x * framed_y - columns * rows  # the widest block's halo cells, corners included
        # each field travels as wide as its own K-step cone, narrower than the frame on the wide sides
        sent = 0
        for widths in self.field_reach(k).values():
            field_x = self._stepped(self.nx, px, True, *widths[:2])[1]
            field_y = self._stepped(self.ny, py, self.periodic, *widths[2:])[1]
            sent += field_x * field_y - columns * rows
        passes = self.field_passes_per_step["cpu" if device.kind == "cpu" else "gpu"]
        kernel_s, bound = kernel_time(passes * item * computed, self.flops_per_point_step * computed, device,
                                      "stencil", self.dtype)
        # cutting the halos to send and writing the received ones into the frame around the block; a CPU
        # then fills the frame cells no field was sent (a copy of its outermost received cells)
        copy_bytes = 2 * 2 * item * sent
        if device.kind == "cpu":
            copy_bytes += 2 * item * (self.state_fields * frame - sent)
        copy_s, _ = kernel_time(copy_bytes, 0, device, "copy", self.dtype)
        # what a block sends its neighbours every K steps equals what it receives from them
        halo_bytes = item * sent
        x_messages = 0 if px == 1 else 2  # x is periodic
        y_messages = 0 if py == 1 else (1 if py == 2 and not self.periodic else 2)
        stages = (x_messages > 0) + (y_messages > 0)
        kernel_s += launch_wait_s(device, self.launch_stretches(kernel_s, copy_s, k, x_messages, y_messages,
                                                                device.kind != "cpu")) / k
        # two generations of the framed block, and the stepper's nine work fields
        memory = item * 5 * self.state_fields * framed_x * framed_y
        return step_cost(scheduler, partitions, kernel_s + copy_s / k, (x_messages + y_messages) / k,
                         halo_bytes / k, link, memory, bound, k, rounds=stages / k, grid=grid)


@dataclass(frozen=True)
class _GridShape:
    """What :func:`hpcgpu.partition.grid.auto_grid_steps` reads of a grid model."""

    nx: int
    ny: int
    reach: object

    @property
    def shape(self):
        return self.ny, self.nx
