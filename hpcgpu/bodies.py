"""All-pairs particles on a dask cluster: blocks of bodies that need every position each step.

A step is two rounds of tasks. Each block kicks half a step and drifts (its
own bodies only), then cuts its new positions and masses (small); each block
then takes all positions, computes the accelerations on its own bodies and
kicks the second half. Only positions move between workers, never
velocities or the rest of the state, and the client holds futures only.
Results equal the single-block run bitwise (each body sums the same sources
in the same order).

The model provides ``decomposition_size``, ``drift_block``,
``block_positions``, ``kick_block`` and the common block methods (see
:class:`hpcgpu.workloads.astro.NBody` and :mod:`hpcgpu.distributed`).
"""

from hpcgpu.distributed import _on_worker, _PartitionedExecutor
from hpcgpu.errors import ConfigError

__all__ = ["BodyExecutor"]


# -- tasks: module-level functions, so they pickle by reference ---------------

def _drift_block(model, dt, block):
    model = _on_worker(model)
    return model.drift_block(model.concat_blocks([block]), dt)


def _block_positions(model, block):
    return _on_worker(model).block_positions(block)


def _kick_block(model, dt, block, start, *positions):
    model = _on_worker(model)
    return model.kick_block(model.concat_blocks([block]), positions, start, dt)


class BodyExecutor(_PartitionedExecutor):
    """Blocks of bodies; each step needs every body's position (all-pairs forces).

    A step is two rounds of tasks: each block kicks half a step and drifts
    (local), then cuts its new positions (small); each block then takes all
    positions, computes the accelerations on its own bodies and kicks the
    second half. Only positions move between workers, never velocities or
    the rest of the state, and the client holds futures only.
    """

    unit = "bodies"

    def _check_steps_per_task(self):
        if self.steps_per_task != 1:
            raise ConfigError(f"steps_per_task must be 1 for {self.model.name}: every step needs the "
                              f"positions of all bodies; got {self.steps_per_task}")

    def _superstep(self, steps):
        model = self._model
        for _ in range(steps):
            self.superstep += 1
            n = self.superstep
            drifted = [self._submit(_drift_block, model, self.dt, block, key=self._key("drift", n, p),
                                    worker=self.owner[p]) for p, block in enumerate(self.blocks)]
            positions = [self._submit_cut(_block_positions, model, block, key=self._key("positions", n, p),
                                          worker=self.owner[p]) for p, block in enumerate(drifted)]
            self.blocks = [self._submit(_kick_block, model, self.dt, block, self.bounds[p][0], *positions,
                                        key=self._key("kick", n, p), worker=self.owner[p])
                           for p, block in enumerate(drifted)]
            self.step += 1
