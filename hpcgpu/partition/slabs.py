"""Slabs of a periodic box for short-range particles: ghost atoms, migration, one rebuild decision.

The box is cut into P slabs along z; rank p owns the atoms in its slab.
Forces need every atom within the ghost radius (``cutoff + skin``) of the
slab, so its neighbours send it the positions of those atoms, its
*ghosts*, every step. Which atoms those are, and which slab owns which
atom, changes only when the neighbour lists are rebuilt, which is decided
for all ranks at once: a step rebuilds when any atom anywhere has moved
more than ``skin / 2`` since the last build (the Verlet criterion of one
process). A step on rank p:

1. its atoms are already half-kicked and drifted (the last step did it);
2. it posts the plain ghost exchange (the positions of the atoms each
   neighbour holds as ghosts, in the order the neighbour listed them) and
   takes part in an allreduce of the rebuild flags; both travel at once,
   so a step without a rebuild waits for one round of messages;
3. on a rebuild it sends each neighbour the atoms that moved into that
   neighbour's slab (*migrants*) and the positions of its staying atoms
   within the ghost radius of that slab; it keeps its staying atoms and
   takes the migrants, and its ghosts from a neighbour are that
   neighbour's staying atoms near it followed by the atoms it sent that
   neighbour (the neighbour's own order once it settles, checked);
4. forces from its atoms and ghosts, the closing half kick, and the next
   step's half kick and drift.

A state split with its neighbour list (one process's, say) is cut where
its atoms were when that list was built, and each rank's first list is
built from those positions: the ranks then rebuild at the steps one
process would, not all on their first step (:meth:`SlabDecomposition.split`).

Between 2 and 3 a rank does not idle: while the ghosts travel it computes
the forces on its *inner* atoms, those whose neighbour rows list no ghost
(the atoms farther than the ghost radius from both faces when the list
was built: :meth:`Slabs.inside`, :meth:`SlabModel.split_neighbors`), and
once the ghosts are in, only the edge atoms'. Each row is summed as in one
pass, so the forces are the same. It does so when its own atoms are below
:data:`SPECULATE_BELOW` of the rebuild threshold: a rebuild another rank
calls for throws the inner forces away, and that is likeliest near the
threshold. It does so on GPUs only (:data:`SPECULATE_ON_CPU`): there the
inner pass runs on the device while the host takes the ghosts in, and a
kernel's empty rows cost next to nothing; on CPUs the two passes cost more
than the wait they hide.

Why it is exact: between rebuilds no atom moves more than ``skin / 2``, so
an atom farther than ``cutoff + skin`` from a slab at the last rebuild
cannot come within ``cutoff`` of it (the argument that makes a Verlet list
valid). Pair distances use the minimum image of the whole box, so ghosts
need no shifts. Each force sums the pairs of the single-process run in
another order: results agree to rounding. A slab must be at least
``cutoff + 2 skin`` thick, so ghosts and migrants come from the adjacent
slabs only (checked on every rebuild).
"""

import math
from dataclasses import dataclass

import numpy as np

from hpcgpu.errors import ConfigError, UnstableSimulation
from hpcgpu.partition.decomposition import Decomposition

__all__ = ["Domain", "SPECULATE_BELOW", "SPECULATE_ON_CPU", "SlabDecomposition", "Slabs"]

SPECULATE_BELOW = 0.8
"""A rank computes its inner atoms' forces while its ghosts travel when its
atoms moved less than this fraction of the rebuild threshold (``skin / 2``)
since the last build: nearer to it, another rank's rebuild (which discards
them) is likely."""

SPECULATE_ON_CPU = False
"""Whether ranks on CPU backends compute inner forces while their ghosts travel.
Off: each of the two passes loops over every row of the list (a row of the
other pass is empty) and the edge pass's rows are the costly ones (minimum
image), so on a CPU the passes cost more than one: 32,000 atoms on 2 slabs,
13.78 against 12.62 ms a step (median of 6 alternated runs, slower in all 6;
docs/benchmarks.md)."""


def _speculates(model):
    """Whether ``model``'s ranks compute inner forces while their ghosts travel."""
    return bool(model.backend.on_gpu or SPECULATE_ON_CPU)


@dataclass(frozen=True)
class Slabs:
    """Slabs of a periodic box along one axis.

    Attributes
    ----------
    bounds : tuple of float
        ``P + 1`` edges from 0 to ``length``; slab ``p`` is ``[bounds[p], bounds[p + 1])``.
    axis : int
        The axis cut (0, 1, 2 for x, y, z).
    length : float
        The box side along ``axis``.

    Examples
    --------
    >>> slabs = Slabs((0.0, 5.0, 10.0), axis=2, length=10.0)
    >>> slabs.of(np, np.array([0.0, 4.9, 5.0, 9.99])).tolist()
    [0, 0, 1, 1]
    >>> slabs.near(np, np.array([5.5, 9.5, 7.5]), 0, 1.0).tolist()
    [True, True, False]
    >>> slabs.inside(np, np.array([0.5, 2.5, 4.5, 7.5]), 0, 1.0).tolist()
    [False, True, False, False]
    """

    bounds: tuple
    axis: int
    length: float

    @property
    def count(self):
        return len(self.bounds) - 1

    def of(self, xp, z):
        """The slab of each coordinate in ``z`` (wrapped into ``[0, length)``)."""
        inner = xp.asarray(np.asarray(self.bounds[1:-1], dtype=np.float64))
        return xp.searchsorted(inner, z.astype(np.float64), side="right")

    def near(self, xp, z, p, radius):
        """Whether each coordinate lies within ``radius`` of slab ``p`` (periodic), outside it or in it."""
        lo, hi, length = self.bounds[p], self.bounds[p + 1], self.length
        z = z.astype(np.float64)
        below = xp.remainder(lo - z, length) < radius
        above = xp.remainder(z - hi, length) < radius
        return below | above | ((z >= lo) & (z < hi))

    def inside(self, xp, z, p, radius):
        """Whether each coordinate lies in slab ``p`` farther than ``radius`` from both its faces.

        No coordinate outside the slab is then within ``radius`` of it, even
        through the periodic edge: the way there crosses a face. (The margin
        covers the rounding of the neighbour build's distances.)
        """
        lo, hi = self.bounds[p], self.bounds[p + 1]
        reach = radius * (1.0 + 1e-9) + 1e-12 * self.length
        z = z.astype(np.float64)
        return (z - lo >= reach) & (hi - z >= reach)

    def neighbours(self, p):
        """The other slabs next to ``p`` (periodic), each once, in increasing order."""
        if self.count == 1:
            return ()
        return tuple(sorted({(p - 1) % self.count, (p + 1) % self.count}))


@dataclass(frozen=True)
class Domain:
    """One rank's atoms (a model state with its neighbour list), its send lists and its next drifted step.

    ``send[k]`` indexes the atoms that neighbour ``slabs.neighbours(p)[k]``
    holds as ghosts (None until the first rebuild). ``drifted`` is
    ``state`` after the next step's half kick and drift (None after a
    split: made on first use). ``split`` is the neighbour list cut into the
    rows that list no ghost and the others (None until the first rebuild).
    ``listed`` is, after a split of a state that had a neighbour list, the
    host positions its atoms and then its ghosts had when that list was
    built: the rank builds its first list from them (None afterwards).
    """

    state: object
    send: tuple = None
    drifted: object = None
    split: object = None
    listed: object = None


def _step_of(state):
    """The step a block's state is at, for error messages (-1 for a model whose state has no ``step``)."""
    return int(getattr(state, "step", -1))


def _slab_index(model, slabs, state):
    return slabs.of(model.backend.xp, model.block_positions(state)[slabs.axis])


def _ghost_index(model, slabs, state, destination):
    xp = model.backend.xp
    near = slabs.near(xp, model.block_positions(state)[slabs.axis], destination, model.ghost_radius())
    return xp.nonzero(near)[0]


def _rebuild_offer(model, slabs, state, source, destination):
    """What ``source`` sends ``destination`` on a rebuild: its atoms now in that slab, and the
    positions of its staying atoms within the ghost radius of it."""
    xp = model.backend.xp
    positions = model.block_positions(state)
    slab = _slab_index(model, slabs, state)
    migrants = model.select_atoms(state, xp.nonzero(slab == destination)[0])
    near = slabs.near(xp, positions[slabs.axis], destination, model.ghost_radius())
    return migrants, xp.take(positions, xp.nonzero((slab == source) & near)[0], axis=1)


def _settle(model, slabs, p, state, arrivals):
    """``p``'s atoms still in its slab followed by the arrivals (in neighbour order)."""
    xp = model.backend.xp
    slab = _slab_index(model, slabs, state)
    allowed = (p, *slabs.neighbours(p))
    if int(sum(int((slab == q).sum()) for q in allowed)) != model.block_size(state):
        strays = [int(i) for i in model.backend.to_host(model.atom_ids(state))[
            ~np.isin(model.backend.to_host(slab), allowed)][:5]]
        raise UnstableSimulation(
            f"atoms {strays} left partition {p} for a slab beyond its neighbours within one neighbour-list "
            f"period: they moved faster than the decomposition allows (reduce dt, or use fewer partitions)",
            step=_step_of(state), field="positions", cfl=math.nan)
    staying = model.select_atoms(state, xp.nonzero(slab == p)[0])
    return model.concat_blocks([staying, *arrivals]), model.block_size(staying)


def _send_lists(model, slabs, p, state, staying, arrivals):
    """Which of ``p``'s settled atoms each neighbour holds as ghosts until the next rebuild.

    Neighbour ``q`` assembled them on the rebuild from two pieces: ``p``'s
    staying atoms near it and the atoms it sent ``p`` (all within the ghost
    radius of its slab). The send list must be those atoms in that order,
    or ``q``'s neighbour list would point at the wrong ghosts; atoms that
    came from another slab cannot be near ``q`` while slabs are at least
    cutoff + 2 skin thick, and that is checked here.
    """
    xp = model.backend.xp
    sends, offset = [], staying
    offsets = []
    for batch in arrivals:
        offsets.append(offset)
        offset += model.block_size(batch)
    for q, start, batch in zip(slabs.neighbours(p), offsets, arrivals):
        index = _ghost_index(model, slabs, state, q)
        expected = xp.concatenate([index[index < staying], xp.arange(start, start + model.block_size(batch))])
        if index.shape != expected.shape or not bool((index == expected).all()):
            raise UnstableSimulation(
                f"partition {p}: the ghosts of partition {q} are not its own atoms near {q} followed by the ones "
                f"{q} sent (an atom moved across a whole slab between neighbour-list builds): reduce dt, or use "
                f"fewer partitions", step=_step_of(state), field="positions", cfl=math.nan)
        sends.append(index)
    return tuple(sends)


@dataclass(frozen=True)
class SlabDecomposition(Decomposition):
    """Slabs of the box along z, one per rank (thickness in proportion to the weights)."""

    slabs: Slabs
    weights: tuple
    dt: float
    counts: tuple = ()
    order: object = None  # the atom ids of the state that was split, in its order (join gives them back so)
    steps_per_task = 1
    unit = "atoms"
    axis = 2

    @classmethod
    def calibrate(cls, client, model):
        raise ConfigError("weights='calibrate' is only available for grid models; give slab weights as "
                          "numbers, one per partition")

    @classmethod
    def build(cls, model, dt, partitions, steps_per_task, weights, calibrated, grid=None):
        if grid is not None and tuple(grid) != (1, 1, partitions):
            raise ConfigError(f"grid must be (1, 1, {partitions}) for slabs along z; got {grid!r}")
        if steps_per_task not in (None, 1):
            raise ConfigError(f"steps_per_task must be 1 for {model.name}: every step needs the ghost atoms' "
                              f"new positions; got {steps_per_task}")
        if partitions > model.decomposition_size():
            raise ConfigError(f"partitions must be <= {model.decomposition_size()} (the atoms of the model); "
                              f"got {partitions}")
        weights = [1.0] * partitions if weights is None else list(weights)
        if (len(weights) != partitions
                or not all(isinstance(w, (int, float, np.number)) and math.isfinite(w) and w > 0 for w in weights)):
            raise ConfigError(f"weights must be positive finite numbers, one per partition ({partitions}); "
                              f"got {weights}")
        weights = [float(w) for w in weights]
        length = float(model.box[cls.axis])
        shares = np.asarray(weights) / max(weights)  # finite weights whose sum overflows stay usable
        edges = np.concatenate([[0.0], np.cumsum(shares) / np.sum(shares) * length])
        edges[-1] = length
        thinnest = float(np.diff(edges).min())
        needed = model.ghost_radius() + model.migration_margin()
        if partitions > 1 and thinnest < needed:
            raise ConfigError(
                f"partitions={partitions} cuts the box (side {length:.4g} along {'xyz'[cls.axis]}) into slabs "
                f"as thin as {thinnest:.4g}; each must be at least cutoff + 2 skin = {needed:.4g} so that ghosts "
                f"and migrating atoms come from the adjacent slabs only: use at most "
                f"{max(1, int(length // needed))} partitions or a bigger system"
                + ("" if len(set(weights)) == 1 else
                   f", or weights closer to equal (weights={weights} give slabs of "
                   f"{', '.join(f'{w:.4g}' for w in np.diff(edges))})"))
        return cls(Slabs(tuple(float(e) for e in edges), cls.axis, length), tuple(weights), float(dt))

    def split_state(self, model, state):
        return self.split(model, model.to_host(state), model.listed_positions(state))

    def split(self, model, host_state, listed=None):
        """Each rank's atoms, and with ``listed`` (where the atoms were when their list was built) its ghosts.

        Without ``listed`` the atoms go to the slab they are in and every
        rank builds its lists on its first step. With it, the slabs are cut
        as they would have been at that build: each atom goes to the slab it
        was in then, each rank's ghosts are the atoms that were within the
        ghost radius of it then, and its first list is built from those
        positions. The run then rebuilds at the steps one process would
        (the Verlet criterion measured from the same build), and its count
        of builds is the same.
        """
        object.__setattr__(self, "order", np.asarray(model.atom_ids(host_state)).copy())
        where = model.block_positions(host_state) if listed is None else listed
        slab = self.slabs.of(np, np.asarray(where[self.axis]))
        owned = [np.nonzero(slab == p)[0] for p in range(self.slabs.count)]
        blocks = [model.select_atoms(host_state, index) for index in owned]
        object.__setattr__(self, "counts", tuple(model.block_size(block) for block in blocks))
        if listed is None:
            return [Domain(block) for block in blocks]
        listed = np.asarray(listed)
        radius = model.ghost_radius()
        # sends[q][k]: which of q's atoms its k-th neighbour holds as ghosts, in q's order
        sends = [tuple(np.nonzero(self.slabs.near(np, listed[self.axis, owned[q]], p, radius))[0]
                       for p in self.slabs.neighbours(q)) for q in range(self.slabs.count)]
        domains = []
        for p, block in enumerate(blocks):
            ghosts = [owned[q][sends[q][self.slabs.neighbours(q).index(p)]] for q in self.slabs.neighbours(p)]
            at_build = np.take(listed, np.concatenate([owned[p], *ghosts]).astype(np.int64), axis=1)
            domains.append(Domain(block, sends[p], listed=at_build))
        return domains

    def sizes(self):
        """Atoms per slab at the start (known once the state is split)."""
        return [(0, n) for n in self.counts] or [(0, 0)] * self.slabs.count

    def describe(self):
        return {"slab_edges": list(self.slabs.bounds)}

    def join(self, model, host_blocks):
        """The atoms of every slab in the order of the state that was split (id order if none was)."""
        state = model.concat_blocks(host_blocks)
        ids = np.asarray(model.atom_ids(state))
        by_id = np.argsort(ids, kind="stable")
        if self.order is None or len(self.order) != len(ids):
            return model.select_atoms(state, by_id)
        # the split state's order: where each of its ids sits among the sorted ids
        return model.select_atoms(state, by_id[np.searchsorted(ids[by_id], self.order)])

    # -- the rank's side ------------------------------------------------------------------------------------
    def resume(self, context, domain):
        if domain.drifted is not None:
            return domain
        model, state, split = context.model, domain.state, domain.split
        if domain.listed is not None:  # the list of the split state, rebuilt for this slab (not a new build)
            state = model.relist(state, domain.listed)
            if self.slabs.neighbours(context.rank) and _speculates(model):
                z = model.backend.asarray(domain.listed[self.axis, :model.block_size(state)])
                split = model.split_neighbors(state, ~self.slabs.inside(model.backend.xp, z, context.rank,
                                                                        model.ghost_radius()))
        return Domain(state, domain.send, model.drift_block(state, self.dt), split)

    def model_state(self, domain):
        return domain.state

    def advance(self, context, domain, steps):
        for _ in range(steps):
            domain = self._step(context, domain)
        return domain

    def _step(self, context, domain):
        model, comm, p, slabs = context.model, context.comm, context.rank, self.slabs
        xp = model.backend.xp
        state, send = domain.drifted, domain.send
        neighbours = slabs.neighbours(p)
        progress = model.rebuild_progress(state)
        needs = progress > 1.0
        plain_in, plain_out = [], []
        # With every other rank a neighbour (2 or 3 slabs), the ghosts carry their rank's
        # rebuild flag: the "any" of the flags is then the allreduce's, without its messages.
        carried = send is not None and len(neighbours) == comm.size - 1
        if send is not None:  # every rank has send lists after the first rebuild: the plain exchange
            plain_in = [comm.irecv(q, "ghosts") for q in neighbours]
            positions = model.block_positions(state)
            # take, not positions[:, index]: C-ordered ghosts (see SlabDomains.select_atoms)
            ghosts_out = [xp.take(positions, index, axis=1) for index in send]
            plain_out = [comm.isend((ghosts_out[k], needs) if carried else ghosts_out[k], q, "ghosts")
                         for k, q in enumerate(neighbours)]
        inner = None
        if send is not None and domain.split is not None and progress < SPECULATE_BELOW ** 2:  # split: if _speculates
            # while the ghosts travel: the atoms that need none (discarded if a rank rebuilds)
            inner = (domain.split, model.inner_forces(state, domain.split))
        if carried:
            received = comm.waitall(plain_in)
            rebuild = needs or any(flag for _, flag in received)
            plain = [ghosts for ghosts, _ in received]
        else:
            rebuild = bool(comm.allreduce(needs, op="any"))
            plain = comm.waitall(plain_in)
        comm.waitall(plain_out)
        if rebuild:
            offers = [_rebuild_offer(model, slabs, state, p, q) for q in neighbours]
            incoming = [comm.irecv(q, "rebuild") for q in neighbours]
            outgoing = [comm.isend(offer, q, "rebuild") for offer, q in zip(offers, neighbours)]
            received = comm.waitall(incoming)
            comm.waitall(outgoing)
            arrivals = [migrants for migrants, _ in received]
            state, staying = _settle(model, slabs, p, state, arrivals)
            ghosts = [xp.concatenate([near, model.block_positions(sent)], axis=1)
                      for (_, near), (sent, _) in zip(received, offers)]
        else:
            ghosts = plain
        if len(ghosts) == 1:  # one neighbour (2 slabs): its array as it came, only read below
            positions = ghosts[0]
        else:
            positions = xp.concatenate(ghosts, axis=1) if ghosts else model.block_positions(state)[:, :0]
        state = model.kick_with_ghosts(state, positions, self.dt, rebuild, None if rebuild else inner)
        split = domain.split
        if rebuild:
            send = _send_lists(model, slabs, p, state, staying, arrivals)
            split = None
            if neighbours and _speculates(model):  # the atoms within the ghost radius of a face list ghosts
                z = model.block_positions(state)[slabs.axis]
                split = model.split_neighbors(state, ~slabs.inside(xp, z, p, model.ghost_radius()))
        return Domain(state, send, model.drift_block(state, self.dt), split)
