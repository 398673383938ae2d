"""What the brick decomposition (:mod:`hpcgpu.partition.bricks`) asks of the Lennard-Jones model.

:class:`SlabDomains` is an object a :class:`hpcgpu.workloads.md.LennardJones`
holds (``model.slabs``) and delegates to: the ghost radius and migration
margin of a slab, picking and joining atoms, the rebuild test of one slab's
atoms, and the forces on a slab's atoms from themselves and their ghosts.
It reads the model's public attributes and calls its public methods only;
the kick that follows the forces is the model's.
"""

from dataclasses import dataclass, replace

from hpcgpu.errors import ConfigError
from hpcgpu.kernels import md as md_kernels

__all__ = ["NeighborSplit", "SlabDomains"]


@dataclass(frozen=True)
class NeighborSplit:
    """A slab's neighbour list cut in two by its rows: the atoms that list no ghost, and the rest.

    Each is the same list with the other rows' counts set to 0, so every
    backend's force kernel runs on it unchanged and sums each row it keeps
    in the same order as the whole list (bitwise the same forces on the
    CPU and GPU kernels; on the NumPy reference, to rounding).

    Attributes
    ----------
    inner : NeighborList
        The rows of atoms whose neighbours are all the slab's own.
    edge : NeighborList
        The rows of atoms that list at least one ghost.
    edge_atoms : bool array (N,)
        Which of the slab's own atoms are edge atoms.
    """

    inner: object
    edge: object
    edge_atoms: object


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

    def select_atoms(self, state, index):
        """The atoms ``index`` (an integer array) of a block, as independent arrays (no neighbour list).

        The arrays come out C-ordered: ``a[:, index]`` of a ``(3, N)`` array
        is Fortran-ordered, which every later step inherits
        (``concatenate`` and ``empty_like`` keep it), and the force kernel
        ran 17% slower on it; ``take`` is also 3x faster than that indexing.
        """
        xp = self.model.backend.xp
        index = xp.asarray(index)
        return type(state)(*(xp.take(a, index, axis=-1) for a in state.arrays()), step=state.step,
                           rebuilds=state.rebuilds)

    def rebuild_progress(self, state):
        """The largest squared displacement of the block's atoms since its list was built, over the
        rebuild threshold ``(skin / 2)^2``: a rebuild is due above 1 (inf without a list)."""
        neighbors = state.neighbors
        if neighbors is None:
            return float("inf")
        model = self.model
        largest = md_kernels.largest_displacement_squared(state.positions, neighbors.reference_positions, model.box,
                                                          backend=model.backend)
        return float(largest) / (0.5 * model.skin) ** 2

    def listed_positions(self, state):
        """Host positions ``(3, N)`` of the block's atoms when its list was built (None without a list)."""
        neighbors = state.neighbors
        if neighbors is None:
            return None
        return self.model.backend.to_host(neighbors.reference_positions[:, :state.size])

    def relist(self, state, positions):
        """The block with a list built at ``positions`` (its atoms, then ghosts, where they were at the last
        build): the same pairs that build listed, so it is not counted as a new one."""
        model = self.model
        positions = model.backend.asarray(positions, dtype=model.dtype)
        return replace(state, neighbors=model.neighbor_list(positions, rows=state.size))

    def split_neighbors(self, state, edge_atoms):
        """The block's list cut into the rows of ``edge_atoms`` (a boolean array (N,)) and the others.

        The caller vouches that only edge atoms list ghosts (the slab
        decomposition marks every atom within the ghost radius of a face).
        Returns a :class:`NeighborSplit`, or None when the block has no list.
        """
        neighbors = state.neighbors
        if neighbors is None:
            return None
        xp, n = self.model.backend.xp, state.size
        counts = neighbors.counts
        # the ghosts' own rows are empty (the list has rows for the block's atoms only)
        edge = xp.concatenate([xp.asarray(edge_atoms, dtype=bool), xp.ones(neighbors.size - n, dtype=bool)])
        zero = xp.zeros_like(counts)
        return NeighborSplit(replace(neighbors, counts=xp.where(edge, zero, counts)),
                             replace(neighbors, counts=xp.where(edge, counts, zero)), edge[:n])

    def inner_forces(self, state, split):
        """Forces on the block's inner atoms (those whose rows list no ghost), zeros on the others.

        Returns ``(positions, forces, energies, virials)``: ``positions`` is
        the ``(3, atoms + ghosts)`` array the list indexes, the block's own
        atoms first and zeros (inside the box) where the ghosts go;
        :meth:`forces_with_ghosts` writes the ghosts there and adds the edge atoms.
        """
        model, n = self.model, state.size
        xp = model.backend.xp
        positions = xp.zeros((3, split.inner.size), dtype=state.positions.dtype)
        positions[:, :n] = state.positions
        return (positions, *model.forces(positions, split.inner))

    def forces_with_ghosts(self, state, ghost_positions, rebuild, inner=None):
        """Forces on a domain's atoms from themselves and ``ghost_positions``, and the list they used.

        The neighbour list spans the block's atoms then the ghosts; it is
        rebuilt when ``rebuild`` (a decision taken over all domains), else
        the ghosts must be the same atoms, in the same order, as when it was built.

        Returns
        -------
        forces, energies, virials, neighbors, rebuilds
            As :meth:`LennardJones.forces` gives them, for the block's own
            atoms; the list and the count of lists built so far.

        With ``inner`` (``(split, inner_forces(state, split))``, made from
        this list while the ghosts travelled; only without a rebuild) only
        the edge atoms' forces are computed here.
        """
        model, n = self.model, state.size
        if inner is not None and not rebuild:
            split, (positions, forces, energies, virials) = inner
            if split.edge.size != n + ghost_positions.shape[1]:
                raise ConfigError(f"the ghosts changed without a neighbour-list rebuild ({split.edge.size} listed "
                                  f"atoms, {n + ghost_positions.shape[1]} given)")
            positions[:, n:] = ghost_positions
            edge_forces, edge_energies, edge_virials = model.forces(positions, split.edge)
            xp, edge = model.backend.xp, split.edge_atoms
            return (xp.where(edge[None, :], edge_forces[:, :n], forces[:, :n]),
                    xp.where(edge, edge_energies[:n], energies[:n]), xp.where(edge, edge_virials[:n], virials[:n]),
                    state.neighbors, state.rebuilds)
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
