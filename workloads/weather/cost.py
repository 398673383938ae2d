"""The cost model of the shallow-water (weather) model for ``hpcgpu plan``: bytes, flops, messages and memory per step.

Declared to the registry by :mod:`hpcgpu.workloads.weather.workload` (``plan=``); the
terms and helpers it builds on live in :mod:`hpcgpu.plan.workload_costs`.
"""

import math
from dataclasses import dataclass

from hpcgpu.plan.workload_costs import infeasible_step, kernel_time, step_cost
from hpcgpu.validation import check_dtype, check_int

__all__ = ["WeatherCost"]


@dataclass(frozen=True)
class WeatherCost:
    """The shallow-water model (SSP-RK3, Arakawa C-grid) on an ``nx x ny`` grid, split into row blocks.

    On a GPU a step is three fused stages reading and writing 6 + 9 + 9
    fields per point (the traffic ``hpcgpu bench stencil`` counts); on a CPU
    the Numba backend pipelines the three stages in one sweep, which reads
    the state once and writes it once (6). Each stage costs about 130 flops
    per point (counted in ``kernels/stencil/physics.py`` and
    ``_numba._output_row``: potential vorticity, fluxes and Bernoulli ~27,
    the Arakawa-Lamb coefficients recomputed where used, tendencies,
    viscosity and the Runge-Kutta update ~104). Every K steps a rank sends
    its neighbours their halo rows (``ShallowWater.halo_rows(K)``: 3 fields
    each, one message per neighbour; :mod:`hpcgpu.partition.rows`), writes
    the halos it receives into the spare rows around its block, and
    advances its block and halos K steps; the rows it steps shrink stage by
    stage towards an open edge, so the redundant work is half the halo on
    average. K is the engine's default
    (:func:`hpcgpu.partition.rows.auto_steps_per_task`) unless
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
        """Rows ``(south, north)`` that ``steps`` steps read beyond a block (the model's own answer)."""
        from hpcgpu.workloads.weather import ShallowWater

        return ShallowWater.halo_rows(None, steps)

    def steps_per_exchange(self, partitions):
        """K on ``partitions`` blocks: the engine's default, or the given K lowered until a block holds its halo.

        Returns 0 when even one step's halo is wider than a block.
        """
        rows = self.ny // partitions
        if partitions == 1:
            return self.steps_per_task or 16
        if self.steps_per_task is None:
            from hpcgpu.partition.rows import auto_steps_per_task

            k = auto_steps_per_task(_RowShape(self.ny, self.halo_rows), partitions)
        else:
            k = self.steps_per_task
        # hpcgpu.partition.layout.split_rows: a block must hold the widest halo it gives away
        while k > 0 and max(self.halo_rows(k)) > rows:
            k -= 1
        return k

    def cost(self, partitions, device, link, scheduler):
        item = 4 if self.dtype == "float32" else 8
        rows = math.ceil(self.ny / partitions)
        k = self.steps_per_exchange(partitions)
        if k == 0:
            return infeasible_step(f"blocks of {self.ny // partitions} rows are thinner than the "
                               f"{max(self.halo_rows(1))}-row halo of one step")
        south, north = self.halo_rows(k)
        if partitions == 1:
            sides, halo = 0, 0
        elif partitions == 2 and not self.periodic:
            sides, halo = 1, max(south, north)
        else:
            sides, halo = 2, south + north
        extended = (rows + halo) * self.nx
        computed = (rows + halo / 2) * self.nx  # the stepped rows shrink towards open edges
        passes = self.field_passes_per_step["cpu" if device.kind == "cpu" else "gpu"]
        kernel_s, bound = kernel_time(passes * item * computed, self.flops_per_point_step * computed, device,
                                      "stencil", self.dtype)
        kernel_s += self.launches_per_step * device.launch_s
        # cutting the halos to send and writing the received ones into the block's spare rows
        copy_bytes = 2 * 2 * self.state_fields * item * halo * self.nx
        copy_s, _ = kernel_time(copy_bytes, 0, device, "copy", self.dtype)
        # the rows a rank sends its neighbours every K steps, one message each
        halo_bytes = self.state_fields * item * halo * self.nx
        # two generations of the block with spare rows, and the stepper's nine work fields
        memory = item * (2 * self.state_fields * extended + 3 * self.state_fields * extended)
        return step_cost(scheduler, partitions, kernel_s + copy_s / k, sides / k, halo_bytes / k, link, memory,
                          bound, k)


@dataclass(frozen=True)
class _RowShape:
    """What :func:`hpcgpu.partition.rows.auto_steps_per_task` reads of a row model."""

    rows: int
    halo: object
    decomposition = "rows"

    def decomposition_size(self):
        return self.rows

    def halo_rows(self, steps):
        return self.halo(steps)
