"""Row blocks with a global spectral solve after every stage: how the barotropic vorticity model is partitioned.

A model such as :class:`~hpcgpu.workloads.vorticity.BarotropicVorticity`
updates its prognostic field locally in each Runge-Kutta stage (a stencil
that reads one row beyond a block) and then solves a Poisson equation for
the streamfunction, which couples every point of the domain. A rank owns a
block of whole rows (a ``1 x P`` process grid of the distributed grid,
:class:`~hpcgpu.partition.grid.GridDecomposition`, whose frames, halo
exchange, split and checkpoint layout it reuses). One stage on a rank:

1. fill the one-row frames from the south and north neighbours;
2. ``model.stage_block``: the updated field on the owned rows;
3. the solve, a slab FFT (a pencil FFT on a ``1 x P`` grid):
   ``model.forward_lines`` transforms the owned rows along x (rows are
   whole); an all-to-all (:func:`~hpcgpu.partition.transpose.rows_to_columns`)
   gives each rank every row of its share of the x wavenumbers;
   ``model.solve_columns`` transforms along y, divides by the operator's
   eigenvalues and transforms back (a wall in y: the odd reflection, per
   column); a second all-to-all returns the rows, and
   ``model.inverse_lines`` transforms them back along x.

Why an FFT and not the distributed conjugate gradient
(:mod:`hpcgpu.linalg.cg_ranks`) on the same blocks: every 1-D transform of
the slab FFT runs on the same line of numbers as in one process, and a
line's transform does not depend on how many lines are transformed beside
it, so the partitioned run is *bitwise* the one-process run, on any number
of ranks, where CG agrees only to its tolerance (its dot products sum in
another order). It is also cheaper: a stage costs two all-to-alls (each
rank's whole block crosses the network twice) and one halo exchange,
where CG needs hundreds of iterations, each a halo exchange and two
allreduces, whose latency dominates at scale. The price is the
all-to-all's bandwidth and at most ``nx // 2 + 1`` ranks (one x
wavenumber each); a 2-D pencil decomposition would lift that limit.

The conjugate-gradient solver of the model stays single-process.

Examples
--------
>>> from hpcgpu.workloads.vorticity import BarotropicVorticity
>>> model = BarotropicVorticity("rossby_wave", nx=32, ny=30, backend="numpy")
>>> layout = SpectralDecomposition.build(model, 600.0, 3, None, None, False)
>>> layout.grid, layout.y_bounds, layout.column_bounds
((1, 3), ((0, 10), (10, 20), (20, 30)), ((0, 5), (5, 11), (11, 17)))
"""

import time
from dataclasses import dataclass, replace

from hpcgpu.errors import ConfigError
from hpcgpu.partition.grid import FramedBlock, GridDecomposition, state_arrays, with_arrays
from hpcgpu.partition.transpose import columns_to_rows, even_bounds, rows_to_columns

__all__ = ["SpectralDecomposition"]

_FORWARD_TAG, _BACKWARD_TAG = "spectral-rows-to-columns", "spectral-columns-to-rows"
_CALIBRATION_TIMEOUT_S = 600.0


@dataclass(frozen=True)
class SpectralDecomposition(GridDecomposition):
    """Blocks of whole rows on a ``1 x P`` process grid, a halo exchange and a slab-FFT solve per stage.

    ``column_bounds[q]`` are the x wavenumbers (columns of the x
    transform) rank ``q`` solves along y.
    """

    column_bounds: tuple = ()

    @classmethod
    def build(cls, model, dt, partitions, steps_per_task, weights, calibrated, grid=None):
        """The layout of ``model`` on ``partitions`` ranks: rows split (by ``weights``), x wavenumbers evenly."""
        if grid is not None and tuple(grid) != (1, partitions):
            raise ConfigError(f"grid={'x'.join(map(str, grid))}: {type(model).__name__} splits whole rows (its solve "
                              f"transforms rows along x), so its process grid is 1x{partitions}; give grid=(1, "
                              f"{partitions}) or none")
        if steps_per_task not in (None, 1):
            raise ConfigError(f"steps_per_task={steps_per_task}: {type(model).__name__} solves over the whole domain "
                              "after every stage, so its blocks exchange every step; use steps_per_task=1 or none")
        if not model.periodic[0]:
            raise ConfigError(f"{type(model).__name__} must be periodic in x to be split into row blocks with an "
                              "FFT along x")
        check = getattr(model, "check_partitions", None)
        if check is not None:  # a model's own limits (the vorticity model's CG solver is single-process)
            check(partitions)
        columns = model.shape[1] // 2 + 1
        if partitions > columns:
            raise ConfigError(f"partitions={partitions}: the solve splits the {columns} x wavenumbers of nx="
                              f"{model.shape[1]} over the ranks, one at least each; use at most {columns} partitions")
        layout = super().build(model, dt, partitions, 1, weights, calibrated, grid=(1, partitions))
        return replace(layout, column_bounds=even_bounds(columns, partitions))

    @classmethod
    def calibrate(cls, client, model):
        """``{worker address: steps/s}`` of a short one-process run of ``model`` on every worker."""
        import uuid

        from hpcgpu.cluster import worker_info

        futures = {w: client.submit(_calibration_rate, model, key=f"{model.name}-calibrate-{uuid.uuid4().hex}",
                                    workers=[w], allow_other_workers=False, pure=False)
                   for w in sorted(worker_info(client))}
        return {w: float(f.result(timeout=_CALIBRATION_TIMEOUT_S)) for w, f in futures.items()}

    def describe(self):
        return {**super().describe(), "wavenumbers_per_rank": [b - a for a, b in self.column_bounds]}

    # -- the rank side ------------------------------------------------------------------------------------
    def advance(self, context, carried, steps):
        model, where = context.model, carried.where
        prognostic, solved = model.spectral_fields
        # own arrays: the last epoch's blocks are never written (a failed health check returns to them)
        state = with_arrays(carried.state, [a.copy() for a in state_arrays(carried.state)])
        target, solution = getattr(state, prognostic), getattr(state, solved)
        for _ in range(steps):
            start = with_arrays(state, [where.interior(a).copy() for a in state_arrays(state)])
            for stage in range(model.stages):
                self.fill_frames(context, state)
                updated = model.stage_block(state, start, stage, self.dt, where)
                result = self.solve(context, updated, where)
                where.interior(target)[...] = updated
                where.interior(solution)[...] = result
        return FramedBlock(state, where)

    def solve(self, context, updated, where):
        """The model's solve of ``updated`` (the owned rows): x transform, transpose, y solve, back."""
        model, comm = context.model, context.comm
        xp = model.backend.xp
        spectra = model.forward_lines(updated, where)
        first, stop = self.column_bounds[context.rank]
        columns = rows_to_columns(comm, spectra, self.column_bounds, _FORWARD_TAG, xp)
        columns = model.solve_columns(columns, first, stop)
        spectra = columns_to_rows(comm, columns, self.y_bounds, _BACKWARD_TAG, xp)
        return model.inverse_lines(spectra, where)

    def block_health(self, context, carried):
        """This rank's part of the health check, its frames filled (the velocities read a row beyond)."""
        self.fill_frames(context, carried.state)
        return context.model.block_health(carried.state, carried.where)


def _calibration_rate(model, seconds=0.3):
    """Steps per second of this worker on the whole model in one process."""
    from hpcgpu.partition.decomposition import on_worker

    model = on_worker(model)
    state = model.initial_state()
    stepper = model.stepper(model.suggested_dt(state, 0.3))
    state = stepper.advance(state, 1)  # compile
    steps, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        state = stepper.advance(state, 1)
        steps += 1
    model.backend.synchronize()
    return steps / (time.perf_counter() - start)
