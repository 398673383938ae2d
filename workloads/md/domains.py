"""What the slab decomposition (:mod:`hpcgpu.partition.slabs`) asks of the Lennard-Jones model.

:class:`DomainMethods` is a mixin of :class:`hpcgpu.workloads.md.LennardJones`:
the ghost radius and migration margin of a slab, picking and joining atoms,
the rebuild test of one slab's atoms, and the forces on a slab's atoms from
themselves and their ghosts.
"""

from dataclasses import replace

from hpcgpu.errors import ConfigError
from hpcgpu.kernels import md as md_kernels

__all__ = ["DomainMethods"]


class DomainMethods:
    """The ``"domains"`` decomposition: slabs of the box, ghost atoms, migration.

    Examples
    --------
    >>> from hpcgpu.workloads.md import LennardJones
    >>> model = LennardJones(4, backend="numpy")
    >>> state = model.initial_state()
    >>> model.ghost_radius(), model.select_atoms(state, [0, 5]).size
    (2.8, 2)
    """

    def ghost_radius(self):
        """``cutoff + skin``: atoms this close to a domain are its ghosts."""
        return self.cutoff + self.skin

    def migration_margin(self):
        """How far (sigma) an atom may stray from its domain before the lists are rebuilt (the skin)."""
        return self.skin

    def block_positions(self, state):
        return state.positions

    def atom_ids(self, state):
        return state.ids

    def select_atoms(self, state, index):
        """The atoms ``index`` (an integer array) of a block, as independent arrays (no neighbour list)."""
        return type(state)(*(a[..., index] for a in state.arrays()), step=state.step, rebuilds=state.rebuilds)

    def block_needs_rebuild(self, state):
        """Whether an atom of the block moved more than ``skin / 2`` since its list was built (or it has none).

        Only the block's own atoms are checked (the first ``N`` of the list's
        reference positions); ghosts are checked by their own domains.
        """
        neighbors = state.neighbors
        if neighbors is None:
            return True
        largest = md_kernels.largest_displacement_squared(state.positions, neighbors.reference_positions, self.box,
                                                          backend=self.backend)
        return largest > (0.5 * self.skin) ** 2

    def kick_with_ghosts(self, state, ghost_positions, dt, rebuild):
        """:meth:`kick_block` for a domain: forces on its atoms from themselves and ``ghost_positions``.

        The neighbour list spans the block's atoms then the ghosts; it is
        rebuilt when ``rebuild`` (a decision taken over all domains), else
        the ghosts must be the same atoms, in the same order, as when it was built.
        """
        xp, n = self.backend.xp, state.size
        positions = xp.concatenate([state.positions, ghost_positions], axis=1)
        neighbors, rebuilds = state.neighbors, state.rebuilds
        if rebuild or neighbors is None:
            # rows for the domain's own atoms only: a ghost's row would be summed and thrown
            # away (a third of the pair work in two slabs of the 32,000-atom benchmark)
            neighbors = self.neighbor_list(positions, neighbors, rows=n)
            rebuilds += 1
        elif neighbors.size != positions.shape[1]:
            raise ConfigError(f"the ghosts changed without a neighbour-list rebuild ({neighbors.size} listed "
                              f"atoms, {positions.shape[1]} given)")
        forces, energies, virials = self.forces(positions, neighbors)
        forces, energies, virials = forces[:, :n], energies[:n], virials[:n]
        return replace(state, velocities=self._half_kick(state.velocities, forces, dt), forces=forces,
                       energies=energies, virials=virials, neighbors=neighbors, rebuilds=rebuilds)

    def take_block(self, state, start, stop):
        """Atoms ``start:stop`` as independent arrays (without a neighbour list)."""
        arrays = (a[..., start:stop].copy() for a in state.arrays())
        return type(state)(*arrays, step=state.step, rebuilds=state.rebuilds)

    def concat_blocks(self, states):
        """Blocks joined in order, on this model's backend (without a neighbour list)."""
        arrays = [self.backend.xp.concatenate([self.backend.asarray(a) for a in group], axis=-1)
                  for group in zip(*(s.arrays() for s in states))]
        return type(states[0])(*arrays, step=states[0].step, rebuilds=max(s.rebuilds for s in states))
