"""The Lennard-Jones model's steps in two halves, and its atoms in blocks: what :mod:`hpcgpu.partition.bricks` needs.

:class:`AtomBlocks` is the part of :class:`~hpcgpu.workloads.md.LennardJones`
that implements :class:`hpcgpu.partition.protocols.SlabModel`: the half of a
velocity-Verlet (or BAOAB) step before the forces and the half after, the
forces on a slab's atoms with their ghosts (through ``model.slabs``, a
:class:`~hpcgpu.workloads.md.domains.SlabDomains`), picking and joining
atoms, and the host copies a checkpoint takes. It holds no state; the model
supplies its box, cutoff, skin, thermostat, backend and kernels.

Examples
--------
>>> from hpcgpu.workloads.md import LennardJones
>>> model = LennardJones(3, backend="numpy")
>>> state = model.initial_state()
>>> half = model.drift_block(state, 0.005)        # half kick, drift
>>> full = model.kick_block(half, 0.005)           # forces, second half kick
>>> full.step, model.concat_blocks([model.take_block(full, 0, 50), model.take_block(full, 50, 108)]).size
(1, 108)
"""

import math
from dataclasses import replace

from hpcgpu.kernels import md as md_kernels
from hpcgpu.workloads.md import setup
from hpcgpu.workloads.md.state import MDState

__all__ = ["AtomBlocks"]


class AtomBlocks:
    """The block and half-step methods of the Lennard-Jones model (a mixin of :class:`LennardJones`)."""

    def drift_block(self, state, dt):
        """The part of a step before the forces: half kick and drift (with the O step of BAOAB).

        Each atom on its own; the neighbour list is kept (the kick checks it).
        """
        if self.thermostat == "none":
            positions, velocities, images = md_kernels.verlet_drift(state.positions, state.velocities, state.forces,
                                                                    state.images, self.box, dt, backend=self.backend)
            return replace(state, positions=positions, velocities=velocities, images=images, step=state.step + 1)
        half = 0.5 * dt
        velocities = state.velocities + state.forces * half
        xp = self.backend.xp
        positions = state.positions + velocities * half
        c1 = math.exp(-self.friction * dt)
        key = setup.stream_key(self.seed, setup.STREAM_LANGEVIN, state.step)
        noise = setup.gaussians(xp, key, state.ids).astype(self.dtype)
        velocities = c1 * velocities + math.sqrt((1.0 - c1 * c1) * self.temperature) * noise
        positions = positions + velocities * half
        positions, images = md_kernels.wrap_into_box(self.backend.xp, self.box, positions, state.images.copy())
        return replace(state, positions=positions, velocities=velocities, images=images, step=state.step + 1)

    def kick_block(self, state, dt):
        """The part after the drift: neighbour list if stale, forces, second half kick."""
        neighbors, rebuilds = state.neighbors, state.rebuilds
        if neighbors is None or md_kernels.needs_rebuild(neighbors, state.positions, self.backend):
            rebuilds += 1
            if self.sort_every and rebuilds % self.sort_every == 0:
                state = self.sorted_into_cells(state)
            neighbors = self.neighbor_list(state.positions, neighbors)
        forces, energies, virials = self.forces(state.positions, neighbors)
        return self._kicked(state, dt, forces, energies, virials, neighbors, rebuilds)

    def sorted_into_cells(self, state):
        """The state with its atoms in cell order (every per-atom array; no neighbour list).

        Examples
        --------
        >>> import numpy as np
        >>> from hpcgpu.workloads.md import LennardJones
        >>> model = LennardJones(3, backend="numpy")
        >>> state = model.initial_state()
        >>> shuffled = model.select_atoms(state, np.random.default_rng(0).permutation(state.size))
        >>> again = model.sorted_into_cells(shuffled)
        >>> bool((model.sorted_into_cells(again).ids == again.ids).all()), sorted(again.ids) == list(range(108))
        (True, True)
        """
        order = md_kernels.cell_order(state.positions, self.box, radius=self.cutoff + self.skin,
                                      backend=self.backend)
        return self.select_atoms(state, order)

    def kick_with_ghosts(self, state, ghost_positions, dt, rebuild, inner=None):
        """:meth:`kick_block` for a domain: forces on its atoms from themselves and ``ghost_positions``.

        See :meth:`SlabDomains.forces_with_ghosts <hpcgpu.workloads.md.domains.SlabDomains.forces_with_ghosts>`
        (``inner``: the inner atoms' forces, computed while the ghosts travelled).
        """
        forces, energies, virials, neighbors, rebuilds = self.slabs.forces_with_ghosts(state, ghost_positions,
                                                                                       rebuild, inner)
        return self._kicked(state, dt, forces, energies, virials, neighbors, rebuilds)

    def _kicked(self, state, dt, forces, energies, virials, neighbors, rebuilds):
        """The state after the second half kick ``v + f dt/2`` (one pass on backends that have it)."""
        velocities = md_kernels.verlet_kick(state.velocities, forces, dt, backend=self.backend)
        return replace(state, velocities=velocities, forces=forces, energies=energies, virials=virials,
                       neighbors=neighbors, rebuilds=rebuilds)

    # the brick decomposition's side (hpcgpu.partition.bricks), held in self.slabs
    def ghost_radius(self):
        return self.slabs.ghost_radius()

    def migration_margin(self):
        return self.slabs.migration_margin()

    def select_atoms(self, state, index):
        return self.slabs.select_atoms(state, index)

    def rebuild_progress(self, state):
        return self.slabs.rebuild_progress(state)

    def listed_positions(self, state):
        return self.slabs.listed_positions(state)

    def relist(self, state, positions):
        return self.slabs.relist(state, positions)

    def split_neighbors(self, state, edge_atoms):
        return self.slabs.split_neighbors(state, edge_atoms)

    def inner_forces(self, state, split):
        return self.slabs.inner_forces(state, split)

    def take_block(self, state, start, stop):
        return self.slabs.take_block(state, start, stop)

    def concat_blocks(self, states):
        return self.slabs.concat_blocks(states)

    def decomposition_size(self):
        return self.n

    random_state_description = ("counter-based: the Langevin noise is a pure function of (seed, step, atom id); "
                                "the seed is in the model and the step in the state")

    def checkpoint_state(self, state):
        """The state on the host for a checkpoint, with its neighbour list when that is on the host.

        Keeping the list makes a resumed run sum forces in the same order as
        the uninterrupted one (bitwise on the same backend).
        """
        host = self.to_host(state)
        if state.neighbors is not None and not self.backend.on_gpu:
            host = replace(host, neighbors=state.neighbors)
        return host

    def restore_state(self, host):
        """A checkpointed state on this model's backend (its neighbour list kept on the CPU)."""
        state = self.concat_blocks([host])
        if host.neighbors is not None and not self.backend.on_gpu and host.neighbors.size == state.size:
            state = replace(state, neighbors=host.neighbors)
        return state

    def to_host(self, state):
        host = (self.backend.to_host(a) for a in state.arrays())
        return MDState(*host, step=state.step, rebuilds=state.rebuilds)
