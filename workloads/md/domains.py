"""What the slab decomposition (:mod:`hpcgpu.partition.slabs`) asks of the Lennard-Jones model.

:class:`SlabDomains` is an object a :class:`hpcgpu.workloads.md.LennardJones`
holds (``model.slabs``) and delegates to: the ghost radius and migration
margin of a slab, picking and joining atoms, the rebuild test of one slab's
atoms, and the forces on a slab's atoms from themselves and their ghosts.
It reads the model's public attributes and calls its public methods only;
the kick that follows the forces is the model's.
"""

from hpcgpu.errors import ConfigError
from hpcgpu.kernels import md as md_kernels

__all__ = ["SlabDomains"]


class SlabDomains:
    """The ``"domains"`` decomposition of a model: slabs of the box, ghost atoms, migration.

    Parameters
    ----------
    model : LennardJones
        The model whose box, cutoff, skin, backend, neighbour lists and
        forces it uses.

    Examples
    --------
    >>> from hpcgpu.workloads.md import LennardJones
    >>> model = LennardJones(4, backend="numpy")
    >>> state = model.initial_state()
    >>> model.slabs.ghost_radius(), model.slabs.select_atoms(state, [0, 5]).size
    (2.8, 2)
    """

    def __init__(self, model):
        self.model = model

    def ghost_radius(self):
        """``cutoff + skin``: atoms this close to a domain are its ghosts."""
        return self.model.cutoff + self.model.skin

    def migration_margin(self):
        """How far (sigma) an atom may stray from its domain before the lists are rebuilt (the skin)."""
        return self.model.skin

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
        model = self.model
        largest = md_kernels.largest_displacement_squared(state.positions, neighbors.reference_positions, model.box,
                                                          backend=model.backend)
        return largest > (0.5 * model.skin) ** 2

    def forces_with_ghosts(self, state, ghost_positions, rebuild):
        """Forces on a domain's atoms from themselves and ``ghost_positions``, and the list they used.

        The neighbour list spans the block's atoms then the ghosts; it is
        rebuilt when ``rebuild`` (a decision taken over all domains), else
        the ghosts must be the same atoms, in the same order, as when it was built.

        Returns
        -------
        forces, energies, virials, neighbors, rebuilds
            As :meth:`LennardJones.forces` gives them, for the block's own
            atoms; the list and the count of lists built so far.
        """
        model, n = self.model, state.size
        positions = model.backend.xp.concatenate([state.positions, ghost_positions], axis=1)
        neighbors, rebuilds = state.neighbors, state.rebuilds
        if rebuild or neighbors is None:
            # rows for the domain's own atoms only: a ghost's row would be summed and thrown
            # away (a third of the pair work in two slabs of the 32,000-atom benchmark)
            neighbors = model.neighbor_list(positions, neighbors, rows=n)
            rebuilds += 1
        elif neighbors.size != positions.shape[1]:
            raise ConfigError(f"the ghosts changed without a neighbour-list rebuild ({neighbors.size} listed "
                              f"atoms, {positions.shape[1]} given)")
        forces, energies, virials = model.forces(positions, neighbors)
        return forces[:, :n], energies[:n], virials[:n], neighbors, rebuilds

    def take_block(self, state, start, stop):
        """Atoms ``start:stop`` as independent arrays (without a neighbour list)."""
        arrays = (a[..., start:stop].copy() for a in state.arrays())
        return type(state)(*arrays, step=state.step, rebuilds=state.rebuilds)

    def concat_blocks(self, states):
        """Blocks joined in order, on the model's backend (without a neighbour list)."""
        backend = self.model.backend
        arrays = [backend.xp.concatenate([backend.asarray(a) for a in group], axis=-1)
                  for group in zip(*(s.arrays() for s in states))]
        return type(states[0])(*arrays, step=states[0].step, rebuilds=max(s.rebuilds for s in states))
