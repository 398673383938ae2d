"""All pairs: each rank holds a block of bodies and needs every body's position every step.

A step on rank p: the part of the step before the forces on its own bodies
(``model.drift_block``: the half kick and drift of kick-drift-kick, the
half drift of drift-kick-drift), an allgather of every rank's positions
and masses, the forces on its bodies from all of them and the part after
(``model.kick_block``). Only positions travel, never velocities or the
rest of the state. Each body sums the same sources in the same order as in
one process, so results are bitwise those of the single-block run.

A model whose bodies are functions of their ids (``initial_block``: the
N-body cases) lets every rank build its own block on its worker
(:meth:`AllPairsDecomposition.build_block`, :mod:`hpcgpu.partition.bodies_start`):
the client builds no body. The ranks report exact sums of their raw
velocities; the decomposition carries the normalisation the client makes
of them (``velocities``) and each rank applies it to its own bodies.

Each rank checkpoints its bodies, with their ids, as a piece
(:mod:`hpcgpu.particle_checkpoints`); a rank of a resumed run, on any
number of ranks, reads the bodies of its id range from the pieces.
"""

from dataclasses import dataclass, replace

import numpy as np

from hpcgpu.errors import ConfigError
from hpcgpu.partition.bodies_start import shifted
from hpcgpu.partition.decomposition import Decomposition, InitialBlocks
from hpcgpu.partition.layout import split_rows

__all__ = ["AllPairsDecomposition", "Bodies"]


@dataclass(frozen=True)
class Bodies:
    """A rank's bodies (``state``) and that state advanced to just before the next forces (``drifted``).

    ``drifted`` is made by the step that made ``state`` (None after a split:
    made on first use), so each step starts with the exchange.
    ``raw_from``: the block was built by its rank, its first body is
    ``raw_from`` and its velocities wait for the normalisation the
    decomposition carries (None: they are the run's).
    """

    state: object
    drifted: object = None
    raw_from: int = None


@dataclass(frozen=True)
class AllPairsDecomposition(Decomposition):
    """Blocks of bodies ``bounds[p] = (first, stop)``; one allgather of positions per step."""

    bounds: tuple
    weights: tuple
    dt: float
    velocities: tuple = None  # the normalisation of rank-built raw velocities (model.start_normalisation)
    steps_per_task = 1
    unit = "bodies"
    builds_initial_blocks = True
    health_after_settling = True
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
        """Rank ``rank``'s bodies: from the model's case (``model.initial_block``; their velocities wait for
        :meth:`settled`), or read from a checkpoint's particle pieces (:mod:`hpcgpu.particle_checkpoints`)."""
        if isinstance(source, InitialBlocks):
            first, stop = self.bounds[rank]
            return Bodies(model.initial_block(first, stop), raw_from=first)
        if not callable(getattr(source, "has_extra", None)):
            raise ConfigError("all-pairs ranks build their bodies from the model's initial condition or from a "
                              f"checkpoint's particle pieces; got {source!r}")
        from hpcgpu.particle_checkpoints import IdRange

        state, _ = source.owned_block(model, IdRange(*self.bounds[rank]))
        return Bodies(state)

    def initial_report(self, model, block):
        """The block's health and, for a rank-built block, the exact sums of its raw velocities."""
        health = super().initial_report(model, block)
        if block.raw_from is None:
            return health
        return {**health, "velocity_sums": model.start_velocity_sums(block.state, block.raw_from)}

    def settled(self, model, parts):
        """The layout once the ranks reported their blocks: the normalisation of their raw velocities."""
        if not all("velocity_sums" in part for part in parts):
            return self
        return replace(self, velocities=model.start_normalisation([part["velocity_sums"] for part in parts]))

    def checkpoint_particles(self, model, rank, bodies):
        """``(host state, extra, region)`` of rank ``rank``'s checkpoint piece: its bodies and their ids."""
        first, stop = (int(i) for i in self.bounds[rank])
        return model.to_host(bodies.state), {"ids": np.arange(first, stop, dtype=np.int64)}, {"ids": [first, stop]}

    # -- the rank's side ------------------------------------------------------------------------------------
    def resume(self, context, bodies):
        if bodies.drifted is not None:
            return bodies
        state = context.model.concat_blocks([self.model_state(bodies)])
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
        if bodies.raw_from is not None and self.velocities is not None:
            state = bodies.state
            velocities = shifted(state.velocities, bodies.raw_from, self.velocities)
            return replace(state, velocities=velocities.astype(state.positions.dtype))
        return bodies.state

    def block_sums(self, context, bodies):
        model = context.model
        extra = None
        if getattr(model, "sums_need_positions", False):
            extra = context.comm.allgather(model.block_positions(bodies.state))
        return model.block_sums(bodies.state, self.bounds[context.rank][0], extra)
