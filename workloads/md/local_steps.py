"""The Lennard-Jones model on a block of atoms: its step in two halves, forces with ghosts, its arrays.

:class:`LocalSteps` is the part of :class:`~hpcgpu.workloads.md.LennardJones`
that a step and a partitioned run use (a mixin: it holds no state; the
model supplies its box, cutoff, skin, thermostat, backend and kernels):

- the half of a velocity-Verlet (or BAOAB) step before the forces
  (:meth:`~LocalSteps.drift_block`) and the half after
  (:meth:`~LocalSteps.kick_block`, or :meth:`~LocalSteps.kick_with_ghosts`
  for a brick of :mod:`hpcgpu.partition.bricks`: forces on its atoms from
  themselves and their ghosts);
- the Verlet-list state a decomposition reads (:meth:`~LocalSteps.rebuild_progress`,
  :meth:`~LocalSteps.listed_positions`, :meth:`~LocalSteps.relist`) and the
  list cut into inner and edge rows for the GPU overlap
  (:meth:`~LocalSteps.split_neighbors`, :meth:`~LocalSteps.inner_forces`);
- picking and joining atoms, with every per-atom array, and the host
  copies a checkpoint takes.

Which atoms are ghosts, where they come from and where atoms migrate is
the decomposition's business, not the model's.

Examples
--------
>>> from hpcgpu.workloads.md import LennardJones
>>> model = LennardJones(3, backend="numpy")
>>> state = model.initial_state()
>>> half = model.drift_block(state, 0.005)        # half kick, drift
>>> full = model.kick_block(half, 0.005)           # forces, second half kick
>>> full.step, model.concat_blocks([model.take_block(full, 0, 50), model.take_block(full, 50, 108)]).size
(1, 108)
>>> model.ghost_radius(), model.select_atoms(state, [0, 5]).size
(2.8, 2)
"""

import math
from dataclasses import dataclass, replace

import numpy as np

from hpcgpu.errors import ConfigError
from hpcgpu.kernels import md as md_kernels
from hpcgpu.workloads.md import setup
from hpcgpu.workloads.md.state import MDState

__all__ = ["LocalSteps", "NeighborSplit"]


@dataclass(frozen=True)
class NeighborSplit:
    """A block's neighbour list cut in two by its rows: the atoms that list no ghost, and the rest.

    Each is the same list with the other rows' counts set to 0, so every
    backend's force kernel runs on it unchanged and sums each row it keeps
    in the same order as the whole list (bitwise the same forces on the
    CPU and GPU kernels; on the NumPy reference, to rounding).

    Attributes
    ----------
    inner : NeighborList
        The rows of atoms whose neighbours are all the block's own.
    edge : NeighborList
        The rows of atoms that list at least one ghost.
    edge_atoms : bool array (N,)
        Which of the block's own atoms are edge atoms.
    """

    inner: object
    edge: object
    edge_atoms: object


class LocalSteps:
    """The half steps, forces with ghosts and block methods of the Lennard-Jones model (a mixin)."""

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
        return self._kicked(state, dt, self.forces(state.positions, neighbors), neighbors, rebuilds)

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

    def kick_with_ghosts(self, state, ghost_positions, dt, rebuild, inner=None, joined=None):
        """:meth:`kick_block` for a brick: forces on its atoms from themselves and ``ghost_positions``.

        See :meth:`forces_with_ghosts` (``inner``: the inner atoms' forces,
        computed while the ghosts travelled; ``joined``: the atoms' and the
        ghosts' positions in one array, when the caller has it).
        """
        *terms, neighbors, rebuilds = self.forces_with_ghosts(state, ghost_positions, rebuild, inner, joined)
        return self._kicked(state, dt, terms, neighbors, rebuilds)

    def _kicked(self, state, dt, terms, neighbors, rebuilds):
        """The state after the second half kick ``v + f dt/2`` (one pass on backends that have it);
        ``terms``: forces, energies, virials and pair counts, as :meth:`LennardJones.forces` gives them."""
        forces, energies, virials, pair_counts = terms
        velocities = md_kernels.verlet_kick(state.velocities, forces, dt, backend=self.backend)
        return replace(state, velocities=velocities, forces=forces, energies=energies, virials=virials,
                       pair_counts=pair_counts, neighbors=neighbors, rebuilds=rebuilds)

    def ghost_radius(self):
        """``cutoff + skin``: atoms this close to a brick are its ghosts."""
        return self.cutoff + self.skin

    def migration_margin(self):
        """How far (sigma) an atom may stray from its brick before the lists are rebuilt (the skin)."""
        return self.skin

    def select_atoms(self, state, index):
        """The atoms ``index`` (an integer array) of a block, as independent arrays (no neighbour list).

        The arrays come out C-ordered: ``a[:, index]`` of a ``(3, N)`` array
        is Fortran-ordered, which every later step inherits
        (``concatenate`` and ``empty_like`` keep it), and the force kernel
        ran 17% slower on it; ``take`` is also 3x faster than that indexing.
        """
        # a host state (the client splitting it into bricks) stays on the host whatever the backend
        xp = np if isinstance(state.positions, np.ndarray) else self.backend.xp
        index = xp.asarray(index)
        return type(state)(*(xp.take(a, index, axis=-1) for a in state.arrays()), step=state.step,
                           rebuilds=state.rebuilds)

    def rebuild_progress(self, state):
        """The largest squared displacement of the block's atoms since its list was built, over the
        rebuild threshold ``(skin / 2)^2``: a rebuild is due above 1 (inf without a list)."""
        neighbors = state.neighbors
        if neighbors is None:
            return float("inf")
        model = self
        largest = md_kernels.largest_displacement_squared(state.positions, neighbors.reference_positions, model.box,
                                                          backend=model.backend)
        return float(largest) / (0.5 * model.skin) ** 2

    def rebuild_reach(self, state, steps, dt, margin=1.0, reference=None):
        """:meth:`rebuild_progress`, and the same ratio for a bound on the displacement ``steps`` steps on.

        For a rebuild decided ``steps`` steps after it is asked for (a
        decomposition's flags travelling between ranks): the bound is
        :func:`~hpcgpu.kernels.md.largest_reach_squared`'s, from the atoms'
        speeds and forces (``margin`` on the motion). Returns ``(progress,
        reach)``, both over ``(skin / 2)^2``; ``(inf, inf)`` without a list.
        ``reference`` (where the arrays are): the positions at the build,
        for a state that does not carry its list (the host copy a decomposition splits).
        """
        backend = self.backend
        if reference is None:
            if state.neighbors is None:
                return float("inf"), float("inf")
            reference = state.neighbors.reference_positions
        else:  # a host copy: the array expressions where it is
            backend = None
        now, ahead = md_kernels.largest_reach_squared(state.positions, reference, state.velocities, state.forces,
                                                      self.box, steps, dt, margin, backend=backend)
        threshold = (0.5 * self.skin) ** 2
        return now / threshold, ahead / threshold

    def listed_positions(self, state):
        """Host positions ``(3, N)`` of the block's atoms when its list was built (None without a list)."""
        neighbors = state.neighbors
        if neighbors is None:
            return None
        return self.backend.to_host(neighbors.reference_positions[:, :state.size])

    def relist(self, state, positions):
        """The block with a list built at ``positions`` (its atoms, then ghosts, where they were at the last
        build): the same pairs that build listed, so it is not counted as a new one."""
        model = self
        positions = model.backend.asarray(positions, dtype=model.dtype)
        return replace(state, neighbors=model.neighbor_list(positions, rows=state.size))

    def split_neighbors(self, state, edge_atoms):
        """The block's list cut into the rows of ``edge_atoms`` (a boolean array (N,)) and the others.

        The caller vouches that only edge atoms list ghosts (the brick
        decomposition marks every atom within the ghost radius of a face).
        Returns a :class:`NeighborSplit`, or None when the block has no list.
        """
        neighbors = state.neighbors
        if neighbors is None:
            return None
        xp, n = self.backend.xp, state.size
        counts = neighbors.counts
        # the ghosts' own rows are empty (the list has rows for the block's atoms only)
        edge = xp.concatenate([xp.asarray(edge_atoms, dtype=bool), xp.ones(neighbors.size - n, dtype=bool)])
        zero = xp.zeros_like(counts)
        return NeighborSplit(replace(neighbors, counts=xp.where(edge, zero, counts)),
                             replace(neighbors, counts=xp.where(edge, counts, zero)), edge[:n])

    def inner_forces(self, state, split):
        """Forces on the block's inner atoms (those whose rows list no ghost), zeros on the others.

        Returns ``(positions, forces, energies, virials, pair_counts)``: ``positions`` is
        the ``(3, atoms + ghosts)`` array the list indexes, the block's own
        atoms first and zeros (inside the box) where the ghosts go;
        :meth:`forces_with_ghosts` writes the ghosts there and adds the edge atoms.
        """
        model, n = self, state.size
        xp = model.backend.xp
        positions = xp.zeros((3, split.inner.size), dtype=state.positions.dtype)
        positions[:, :n] = state.positions
        return (positions, *model.forces(positions, split.inner))

    def forces_with_ghosts(self, state, ghost_positions, rebuild, inner=None, joined=None):
        """Forces on a brick's atoms from themselves and ``ghost_positions``, and the list they used.

        The neighbour list spans the block's atoms then the ghosts; it is
        rebuilt when ``rebuild`` (a decision taken over all bricks), else
        the ghosts must be the same atoms, in the same order, as when it was built.

        Returns
        -------
        forces, energies, virials, pair_counts, neighbors, rebuilds
            As :meth:`LennardJones.forces` gives them, for the block's own
            atoms; the list and the count of lists built so far.

        With ``inner`` (``(split, inner_forces(state, split))``, made from
        this list while the ghosts travelled; only without a rebuild) only
        the edge atoms' forces are computed here. ``joined`` (``(3, N +
        ghosts)``: the block's positions, then ``ghost_positions``) saves
        joining them here (a copy a step).
        """
        model, n = self, state.size
        if joined is not None and joined.shape[1] != n + ghost_positions.shape[1]:
            raise ConfigError(f"joined must hold the {n} atoms and {ghost_positions.shape[1]} ghosts; "
                              f"got {joined.shape[1]} columns")
        if inner is not None and not rebuild:
            split, (positions, forces, energies, virials, pair_counts) = inner
            if split.edge.size != n + ghost_positions.shape[1]:
                raise ConfigError(f"the ghosts changed without a neighbour-list rebuild ({split.edge.size} listed "
                                  f"atoms, {n + ghost_positions.shape[1]} given)")
            if joined is None:
                positions[:, n:] = ghost_positions
            else:
                positions = joined
            edge_forces, edge_energies, edge_virials, edge_pair_counts = model.forces(positions, split.edge)
            xp, edge = model.backend.xp, split.edge_atoms
            return (xp.where(edge[None, :], edge_forces[:, :n], forces[:, :n]),
                    xp.where(edge, edge_energies[:n], energies[:n]), xp.where(edge, edge_virials[:n], virials[:n]),
                    xp.where(edge, edge_pair_counts[:n], pair_counts[:n]), state.neighbors, state.rebuilds)
        positions = joined
        if positions is None:
            positions = model.backend.xp.concatenate([state.positions, ghost_positions], axis=1)
        neighbors, rebuilds = state.neighbors, state.rebuilds
        if rebuild or neighbors is None:
            # rows for the brick's own atoms only: a ghost's row would be summed and thrown
            # away (a third of the pair work in two slabs of the 32,000-atom benchmark)
            neighbors = model.neighbor_list(positions, neighbors, rows=n)
            rebuilds += 1
        elif neighbors.size != positions.shape[1]:
            raise ConfigError(f"the ghosts changed without a neighbour-list rebuild ({neighbors.size} listed "
                              f"atoms, {positions.shape[1]} given)")
        forces, energies, virials, pair_counts = model.forces(positions, neighbors)
        return forces[:, :n], energies[:n], virials[:n], pair_counts[:n], neighbors, rebuilds

    def take_block(self, state, start, stop):
        """Atoms ``start:stop`` as independent arrays (without a neighbour list)."""
        arrays = (a[..., start:stop].copy() for a in state.arrays())
        return type(state)(*arrays, step=state.step, rebuilds=state.rebuilds)

    def concat_blocks(self, states):
        """Blocks joined in order, on the model's backend (without a neighbour list)."""
        backend = self.backend
        arrays = [backend.xp.concatenate([backend.asarray(a) for a in group], axis=-1)
                  for group in zip(*(s.arrays() for s in states))]
        return type(states[0])(*arrays, step=states[0].step, rebuilds=max(s.rebuilds for s in states))

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
        if host.pair_counts is None:  # written before states carried them: counted again here
            positions = self.backend.asarray(host.positions)
            pair_counts = self.forces(positions, self.neighbor_list(positions))[3]
            host = replace(host, pair_counts=self.backend.to_host(pair_counts))
        state = self.concat_blocks([host])
        if host.neighbors is not None and not self.backend.on_gpu and host.neighbors.size == state.size:
            state = replace(state, neighbors=host.neighbors)
        return state

    def to_host(self, state):
        host = (self.backend.to_host(a) for a in state.arrays())
        return MDState(*host, step=state.step, rebuilds=state.rebuilds)
