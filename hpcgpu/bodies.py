"""All-pairs particles on a dask cluster: blocks of bodies that need every position each step.

A step is two rounds of tasks. Each block cuts the positions and masses of
its bodies after the step's half kick and drift (small); each block then
takes all positions, computes the accelerations on its own bodies, kicks
the second half and, last, makes the next step's half kick and drift (its
own bodies only; kept beside the finished state that diagnostics and
gathers read), so the next step starts with the cut. Only positions move
between workers, never velocities or the rest of the state, and the client
holds futures only. Results equal the single-block run bitwise (each body
sums the same sources in the same order).

The model provides ``decomposition_size``, ``drift_block``,
``block_positions``, ``kick_block`` and the common block methods (see
:class:`hpcgpu.workloads.astro.NBody` and :mod:`hpcgpu.distributed`).
"""

from dataclasses import dataclass

from hpcgpu.distributed import _HeldStateExecutor, _on_worker
from hpcgpu.errors import ConfigError

__all__ = ["BodyExecutor"]


@dataclass(frozen=True)
class _Bodies:
    """One block: its bodies' state, and that state after the next half kick
    and drift (made by the task that made ``state``; None after a split:
    made on first use)."""

    state: object
    drifted: object = None


# -- tasks: module-level functions, so they pickle by reference ---------------

def _next_drifted(model, block, dt):
    if block.drifted is not None:
        return block.drifted
    return model.drift_block(model.concat_blocks([block.state]), dt)


def _block_positions(model, dt, block):
    model = _on_worker(model)
    return model.block_positions(_next_drifted(model, block, dt))


def _kick_block(model, dt, block, start, *positions):
    model = _on_worker(model)
    state = model.kick_block(_next_drifted(model, block, dt), positions, start, dt)
    return _Bodies(state, model.drift_block(state, dt))


class BodyExecutor(_HeldStateExecutor):
    """Blocks of bodies; each step needs every body's position (all-pairs forces).

    A step is two rounds of tasks: each block cuts its positions after the
    step's half kick and drift (small); each block then takes all
    positions, computes the accelerations on its own bodies, kicks the
    second half and makes the next half kick and drift. Only positions
    move between workers, never velocities or the rest of the state, and
    the client holds futures only.
    """

    unit = "bodies"

    def _split(self, host_state):
        return [_Bodies(block) for block in super()._split(host_state)]

    def _check_steps_per_task(self):
        if self.steps_per_task != 1:
            raise ConfigError(f"steps_per_task must be 1 for {self.model.name}: every step needs the "
                              f"positions of all bodies; got {self.steps_per_task}")

    def _superstep(self, steps):
        model = self._model
        for _ in range(steps):
            self.superstep += 1
            n = self.superstep
            # each block already holds its drifted next step (made by the last kick)
            positions = [self._submit_cut(_block_positions, model, self.dt, block,
                                          key=self._key("positions", n, p), worker=self.owner[p])
                         for p, block in enumerate(self.blocks)]
            self.blocks = [self._submit(_kick_block, model, self.dt, block, self.bounds[p][0], *positions,
                                        key=self._key("kick", n, p), worker=self.owner[p])
                           for p, block in enumerate(self.blocks)]
            self.step += 1
