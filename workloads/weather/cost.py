"""The cost model of the shallow-water (weather) model for ``hpcgpu plan``: bytes, flops, messages and memory per step.

Declared to the registry by :mod:`hpcgpu.workloads.weather.workload` (``plan=``); the
terms and helpers it builds on live in :mod:`hpcgpu.plan.workload_costs`.

Examples
--------
>>> weather = WeatherCost(16384, 16384, steps=1000)
>>> weather.process_grid(64), weather.steps_per_exchange(64)
((4, 16), 16)
>>> weather.process_grid(2), WeatherCost(1024, 512, steps=1).process_grid(2)
((1, 2), (1, 2))
"""

import math
from dataclasses import dataclass

from hpcgpu.errors import ConfigError
from hpcgpu.partition.process_grid import check_grid, choose_process_grid
from hpcgpu.plan.workload_costs import infeasible_step, kernel_time, step_cost
from hpcgpu.validation import check_dtype, check_int

__all__ = ["WeatherCost", "STAGE_REACH_X", "K_CHOICES"]

STAGE_REACH_X = (2, 2)
"""Columns ``(west, east)`` one tendency evaluation reads beyond the columns it
updates. The C-grid kernels read 2 west and 1 east (the mirror of
``STAGE_REACH`` in y); the block exchange is taken as symmetric, 2 each side
(an assumption until the 2-D grid's stepper says otherwise)."""

K_CHOICES = (16, 8, 4, 2)
"""Steps per halo exchange the engine picks from (the largest whose halo is at most a quarter of a block), else 1."""


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

    The ranks form a process grid (:meth:`process_grid`, x periodic, y
    walled unless ``periodic``). Every K steps a block receives a frame of
    halo points on each split side, ``3 K`` times the stage's reach wide
    (y: ``STAGE_REACH`` = 2 south, 1 north; x: :data:`STAGE_REACH_X`),
    corners included, by a staged exchange (x, then y carrying the x
    halos: 2 messages per split axis, one latency per stage since a
    stage's two messages travel together), and advances the block with
    its frame K steps. The rows it steps shrink stage by stage towards an
    open y edge (half the y halo on average); the x frame is stepped whole.
    K is the engine's rule (:meth:`steps_per_exchange`) unless
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
    launches_per_step = 3  # one fused kernel per Runge-Kutta stage

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
    def halo_rows(steps):
        """Rows ``(south, north)`` that ``steps`` steps read beyond a block: 3 stages of ``STAGE_REACH`` each."""
        from hpcgpu.workloads.weather.stepper import STAGE_REACH

        return 3 * steps * STAGE_REACH[0], 3 * steps * STAGE_REACH[1]

    @staticmethod
    def halo_columns(steps):
        """Columns ``(west, east)`` that ``steps`` steps read beyond a block: 3 stages of :data:`STAGE_REACH_X`."""
        return 3 * steps * STAGE_REACH_X[0], 3 * steps * STAGE_REACH_X[1]

    @classmethod
    def grid_halo(cls):
        """Halo widths ``(x, y)`` per side that the process grid is chosen by: the points one step recomputes.

        The x frame is stepped whole; the stepped rows shrink stage by stage,
        so a y halo costs half its rows on average. Blocks of whole rows are
        therefore preferred (two ranks split a grid into rows whenever ``ny``
        is at least 3/8 of ``nx``).
        """
        west, east = cls.halo_columns(1)
        south, north = cls.halo_rows(1)
        return (west + east) / 2, (south + north) / 4

    def process_grid(self, partitions):
        """The ``(px, py)`` grid of ``partitions`` ranks: least :meth:`grid_halo` surface, blocks that hold a halo.

        Raises
        ------
        ConfigError
            No grid of that many ranks has blocks as wide as one step's halo.
        """
        minimum = (max(self.halo_columns(1)), max(self.halo_rows(1)))
        return choose_process_grid(partitions, (self.nx, self.ny), halo=self.grid_halo(), minimum=minimum,
                                   tie="last")

    def _open_halos(self, grid, steps):
        """Halo widths ``(west, east, south, north)`` of the slowest block (walled y edges have none)."""
        px, py = grid
        west, east = self.halo_columns(steps) if px > 1 else (0, 0)  # x is periodic
        south, north = self.halo_rows(steps) if py > 1 else (0, 0)
        if py == 2 and not self.periodic:
            # each of the two blocks has one wall; the one that receives the wider halo is the slower
            south, north = max(south, north), 0
        return west, east, south, north

    def steps_per_exchange(self, partitions, grid=None):
        """K on ``partitions`` blocks (``grid``: default :meth:`process_grid`).

        The engine's rule: the largest of 16, 8, 4, 2 whose halo is at most
        a quarter of a block along every split axis, else 1; a given
        ``steps_per_task`` is lowered until the widest halo fits in a block.
        Returns 0 when even one step's halo is wider than a block.

        Examples
        --------
        >>> weather = WeatherCost(4096, 4096, steps=1)
        >>> weather.steps_per_exchange(16, grid=(1, 16)), weather.steps_per_exchange(16, grid=(4, 4))
        (8, 16)
        """
        grid = self.process_grid(partitions) if grid is None else check_grid(grid, 2, partitions)
        if partitions == 1:
            return self.steps_per_task or 16
        px, py = grid
        columns, rows = self.nx // px, self.ny // py

        def widest(k):
            return ((max(self.halo_columns(k)), columns) if px > 1 else (0, columns),
                    (max(self.halo_rows(k)), rows) if py > 1 else (0, rows))

        if self.steps_per_task is None:
            k = next((k for k in K_CHOICES if all(4 * halo <= block for halo, block in widest(k))), 1)
        else:
            k = self.steps_per_task
        while k > 0 and any(halo > block for halo, block in widest(k)):
            k -= 1
        return k

    def cost(self, partitions, device, link, scheduler, grid=None):
        """The StepCost of the slowest block on ``partitions`` ranks (``grid``: default :meth:`process_grid`)."""
        item = 4 if self.dtype == "float32" else 8
        if grid is None:
            try:
                grid = self.process_grid(partitions)
            except ConfigError:
                return infeasible_step(f"blocks of {self.nx} x {self.ny} cells over {partitions} ranks are thinner "
                                       f"than the {max(self.halo_rows(1))}-point halo of one step")
        grid = check_grid(grid, 2, partitions)
        px, py = grid
        k = self.steps_per_exchange(partitions, grid)
        if k == 0:
            return infeasible_step(f"blocks of {self.nx // px} x {self.ny // py} cells are thinner than the "
                                   f"{max(self.halo_rows(1))}-point halo of one step", grid)
        columns, rows = math.ceil(self.nx / px), math.ceil(self.ny / py)
        west, east, south, north = self._open_halos(grid, k)
        wide = columns + west + east
        extended = wide * (rows + south + north)
        frame = extended - columns * rows  # halo points, corners included
        computed = wide * (rows + (south + north) / 2)  # stepped rows shrink towards open y edges
        passes = self.field_passes_per_step["cpu" if device.kind == "cpu" else "gpu"]
        kernel_s, bound = kernel_time(passes * item * computed, self.flops_per_point_step * computed, device,
                                      "stencil", self.dtype)
        kernel_s += self.launches_per_step * device.launch_s
        # cutting the halos to send and writing the received ones into the frame around the block
        copy_s, _ = kernel_time(2 * 2 * self.state_fields * item * frame, 0, device, "copy", self.dtype)
        # what a block sends its neighbours every K steps equals the frame it receives from them
        halo_bytes = self.state_fields * item * frame
        y_messages = 0 if py == 1 else (1 if py == 2 and not self.periodic else 2)
        messages = (2 if px > 1 else 0) + y_messages
        stages = (px > 1) + (y_messages > 0)
        # two generations of the block with its frame, and the stepper's nine work fields
        memory = item * (2 * self.state_fields * extended + 3 * self.state_fields * extended)
        return step_cost(scheduler, partitions, kernel_s + copy_s / k, messages / k, halo_bytes / k, link, memory,
                         bound, k, rounds=stages / k, grid=grid)
