"""All pairs: each rank holds a block of bodies and needs every body's position every step.

A step on rank p: the part of the step before the forces on its own bodies
(``model.drift_block``: the half kick and drift of kick-drift-kick, the
half drift of drift-kick-drift), an allgather of every rank's positions
and masses, the forces on its bodies from all of them and the part after
(``model.kick_block``). Only positions travel, never velocities or the
rest of the state. Each body sums the same sources in the same order as in
one process, so results are bitwise those of the single-block run.

Each rank checkpoints its bodies, with their ids, as a piece
(:mod:`hpcgpu.particle_checkpoints`); a rank of a resumed run, on any
number of ranks, reads the bodies of its id range from the pieces.
"""

from dataclasses import dataclass

import numpy as np

from hpcgpu.errors import ConfigError
from hpcgpu.partition.decomposition import Decomposition
from hpcgpu.partition.layout import split_rows

__all__ = ["AllPairsDecomposition", "Bodies"]


@dataclass(frozen=True)
class Bodies:
    """A rank's bodies (``state``) and that state advanced to just before the next forces (``drifted``).

    ``drifted`` is made by the step that made ``state`` (None after a split:
    made on first use), so each step starts with the exchange.
    """

    state: object
    drifted: object = None


@dataclass(frozen=True)
class AllPairsDecomposition(Decomposition):
    """Blocks of bodies ``bounds[p] = (first, stop)``; one allgather of positions per step."""

    bounds: tuple
    weights: tuple
    dt: float
    steps_per_task = 1
    unit = "bodies"
    particle_pieces = True

    @classmethod
    def build(cls, model, dt, partitions, steps_per_task, weights, calibrated, grid=None):
        if grid is not None and tuple(grid) != (partitions,):
            raise ConfigError(f"grid must be None for {model.name}: all-pairs bodies are split into {partitions} "
                              f"blocks of bodies, not over a process grid; got {grid!r}")
        if steps_per_task not in (None, 1):
            raise ConfigError(f"steps_per_task must be 1 for {model.name}: every step needs the positions of "
                              f"all bodies; got {steps_per_task}")
        size = model.decomposition_size()
        if partitions > size:
            raise ConfigError(f"partitions must be <= {size} (the bodies of the model); got {partitions}")
        weights = [1.0] * partitions if weights is None else [float(w) for w in weights]
        return cls(tuple(split_rows(size, weights)), tuple(weights), float(dt))

    def sizes(self):
        return list(self.bounds)

    def split(self, model, host_state):
        return [Bodies(model.take_block(host_state, a, b)) for a, b in self.bounds]

    def join(self, model, host_blocks):
        return model.concat_blocks(host_blocks)

    def build_block(self, model, rank, source):
        """Rank ``rank``'s bodies read from a checkpoint's particle pieces (:mod:`hpcgpu.particle_checkpoints`)."""
        from hpcgpu.particle_checkpoints import IdRange

        if not callable(getattr(source, "has_extra", None)):
            raise ConfigError(f"all-pairs ranks build their bodies from a checkpoint's particle pieces; got {source!r}")
        state, _ = source.owned_block(model, IdRange(*self.bounds[rank]))
        return Bodies(state)

    def checkpoint_particles(self, model, rank, bodies):
        """``(host state, extra, region)`` of rank ``rank``'s checkpoint piece: its bodies and their ids."""
        first, stop = (int(i) for i in self.bounds[rank])
        return model.to_host(bodies.state), {"ids": np.arange(first, stop, dtype=np.int64)}, {"ids": [first, stop]}

    # -- the rank's side ------------------------------------------------------------------------------------
    def resume(self, context, bodies):
        if bodies.drifted is not None:
            return bodies
        state = context.model.concat_blocks([bodies.state])
        return Bodies(state, context.model.drift_block(state, self.dt))

    def advance(self, context, bodies, steps):
        model, comm = context.model, context.comm
        start = self.bounds[context.rank][0]
        state, drifted = bodies.state, bodies.drifted
        for _ in range(steps):
            blocks = comm.allgather(model.block_positions(drifted))
            state = model.kick_block(drifted, blocks, start, self.dt)
            drifted = model.drift_block(state, self.dt)
        return Bodies(state, drifted)

    def model_state(self, bodies):
        return bodies.state

    def block_sums(self, context, bodies):
        model = context.model
        extra = None
        if getattr(model, "sums_need_positions", False):
            extra = context.comm.allgather(model.block_positions(bodies.state))
        return model.block_sums(bodies.state, self.bounds[context.rank][0], extra)
