"""Spatial decomposition of short-range particles on a dask cluster: slabs, ghosts, migration.

The periodic box is cut into P slabs along one axis (z); a partition owns
the atoms in its slab and keeps them resident on its worker. Forces need
every atom within ``cutoff + skin`` (the ghost radius) of a slab, so each
step the partitions next to it send it the positions of those atoms, its
*ghosts*. Nothing else moves, and the client only holds futures.

Ownership and the ghost lists change only when the neighbour lists are
rebuilt, which is decided for all partitions at once: a step rebuilds when
any atom anywhere has moved more than ``skin / 2`` since the last build
(the Verlet criterion of the single-partition run). One step is these tasks
(``P`` partitions, neighbours ``q`` of ``p``); only the kick waits for other
workers, so a step is two levels of tasks::

    moved p          (P >= 4 only) did one of p's atoms move more than
                     skin / 2?  (a bool; the state is drifted already, see
                     the kick)
    exchange q->p    q's own rebuild flag (as moved) and both possible
                     answers, as the decision is not known yet: the
                     positions of the atoms q sent p last time, in the
                     same order (no rebuild), and q's atoms now in p's slab
                     (migrants) with the positions of q's staying atoms
                     within the ghost radius of p's slab (rebuild)
    kick p           reads every flag (with at most three slabs every other
                     slab is a neighbour, so the exchanges carry them all
                     and there are no moved tasks; one slab tests its own
                     atoms); on a rebuild p keeps its staying
                     atoms and takes the migrants, and its ghosts from q are
                     q's staying atoms near p followed by the atoms p sent
                     q (q's own order after it settles, as q checks); then
                     forces from p's atoms and its ghosts and the second
                     half kick (model.kick_with_ghosts); on a rebuild it
                     also remembers which of its atoms each neighbour needs;
                     last, the next step's half kick and drift
                     (model.drift_block), kept beside the finished state
                     that diagnostics and gathers read

The ghosts of a rebuild are assembled without waiting for the neighbour to
settle: an atom that arrives in q from q's other neighbour lies within
``skin / 2`` (and a step) of that far edge, so in a slab at least
``cutoff + 2 skin`` thick it cannot be within ``cutoff + skin`` of p
(and it is checked on every rebuild).

Why it is exact: between rebuilds no atom moves more than ``skin / 2``, so
an atom that was farther than ``cutoff + skin`` from a slab at the last
rebuild (not a ghost) cannot come within ``cutoff`` of that slab's atoms,
the same argument that makes the Verlet list valid. Pair distances use the
minimum image of the whole box, so ghosts need no image shifts, and with two
slabs an atom near both edges of the other slab is sent once. Each force is
summed from the same pairs as in the single-partition run, in another
order: results agree to rounding (chaotic dynamics amplify it slowly).

A slab must be at least ``ghost radius + margin`` thick (``margin``, the
skin, is how far an atom may stray from its slab before a rebuild), so that
ghosts and migrants only come from the adjacent slabs.

The model provides ``ghost_radius``, ``migration_margin``,
``block_positions``, ``atom_ids``, ``select_atoms``, ``concat_blocks``,
``drift_block``, ``block_needs_rebuild``, ``kick_with_ghosts``,
``to_host``, ``block_sums``/``combine_sums``, ``block_health``/``combine_health``
and a ``box`` (see :class:`hpcgpu.workloads.md.LennardJones`).
"""

import math
from dataclasses import dataclass

import numpy as np

from hpcgpu.distributed import _HeldStateExecutor, _on_worker
from hpcgpu.errors import ConfigError, UnstableSimulation

__all__ = ["DomainExecutor", "Slabs"]


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

    def neighbours(self, p):
        """The other slabs next to ``p`` (periodic), each once, in increasing order."""
        if self.count == 1:
            return ()
        return tuple(sorted({(p - 1) % self.count, (p + 1) % self.count}))


@dataclass(frozen=True)
class _Domain:
    """One partition: its atoms (a model state carrying its neighbour list) and its send lists.

    ``send[k]`` indexes the atoms that neighbour ``slabs.neighbours(p)[k]``
    holds as ghosts (None until the first rebuild). ``drifted`` is
    ``state`` after the next step's half kick and drift, made by the task
    that made ``state`` (None after a split: made on first use).
    """

    state: object
    send: tuple = None
    drifted: object = None


def _next_drifted(model, domain, dt):
    """The domain's state half-kicked and drifted into the next step."""
    return domain.drifted if domain.drifted is not None else model.drift_block(domain.state, dt)


# -- tasks (module functions: they pickle by reference) ------------------------------

def _moved(model, dt, domain):
    model = _on_worker(model)
    return model.block_needs_rebuild(_next_drifted(model, domain, dt))


def _slab_index(model, slabs, state):
    return slabs.of(model.backend.xp, model.block_positions(state)[slabs.axis])


def _ghost_index(model, slabs, state, destination):
    xp = model.backend.xp
    near = slabs.near(xp, model.block_positions(state)[slabs.axis], destination, model.ghost_radius())
    return xp.nonzero(near)[0]


def _exchange(model, slabs, dt, domain, source, destination, k, carries_flag):
    """What partition ``source`` sends ``destination`` this step, cut from its drifted slab.

    Both answers, since the rebuild is decided over all partitions and
    waiting for that decision would put the other workers' flags on the
    critical path: ``(moved, plain, migrants, near)`` with ``moved`` the
    source's rebuild flag (:func:`_moved`; False unless ``carries_flag``:
    beyond three slabs the flag is a task of its own), ``plain`` the positions
    of the atoms on send list ``k`` in its order (the exchange of a step
    without a rebuild; None before the first rebuild), ``migrants`` the
    atoms now in the destination's slab and ``near`` the positions of the
    atoms staying in ``source`` within the ghost radius of the destination's
    slab (the exchange of a rebuild). The kick takes the one it needs.
    """
    model = _on_worker(model)
    state = _next_drifted(model, domain, dt)
    positions = model.block_positions(state)
    plain = None if domain.send is None else positions[:, domain.send[k]]
    xp = model.backend.xp
    slab = _slab_index(model, slabs, state)
    migrants = model.select_atoms(state, xp.nonzero(slab == destination)[0])
    near = slabs.near(xp, positions[slabs.axis], destination, model.ghost_radius())
    moved = carries_flag and model.block_needs_rebuild(state)
    return moved, plain, migrants, positions[:, xp.nonzero((slab == source) & near)[0]]


def _settle(model, slabs, p, state, arrivals):
    """``p``'s atoms still in its slab followed by the arrivals (in neighbour order)."""
    xp = model.backend.xp
    slab = _slab_index(model, slabs, state)
    allowed = (p, *slabs.neighbours(p))
    if int(sum(int((slab == q).sum()) for q in allowed)) != state.size:
        strays = [int(i) for i in model.backend.to_host(model.atom_ids(state))[
            ~np.isin(model.backend.to_host(slab), allowed)][:5]]
        raise UnstableSimulation(
            f"atoms {strays} left partition {p} for a slab beyond its neighbours within one neighbour-list "
            f"period: they moved faster than the decomposition allows (reduce dt, or use fewer partitions)",
            step=int(state.step), field="positions", cfl=math.nan)
    staying = model.select_atoms(state, xp.nonzero(slab == p)[0])
    return model.concat_blocks([staying, *arrivals]), staying.size


def _send_lists(model, slabs, p, state, staying, arrivals):
    """Which of ``p``'s settled atoms each neighbour holds as ghosts until the next rebuild.

    Neighbour ``q`` assembled them on the rebuild from two pieces: ``p``'s
    staying atoms near it (``p``'s exchange) and the atoms it sent ``p``
    (all within the ghost radius of its slab). The send list must be those
    atoms in that order, or ``q``'s neighbour list would point at the wrong
    ghosts; atoms that came from another slab cannot be near ``q`` while
    slabs are at least cutoff + 2 skin thick, and that is checked here.
    """
    xp = model.backend.xp
    sends, offset = [], staying
    offsets = []
    for batch in arrivals:
        offsets.append(offset)
        offset += batch.size
    for q, start, batch in zip(slabs.neighbours(p), offsets, arrivals):
        index = _ghost_index(model, slabs, state, q)
        expected = xp.concatenate([index[index < staying], xp.arange(start, start + batch.size)])
        if index.shape != expected.shape or not bool((index == expected).all()):
            raise UnstableSimulation(
                f"partition {p}: the ghosts of partition {q} are not its own atoms near {q} followed by the ones "
                f"{q} sent (an atom moved across a whole slab between neighbour-list builds): reduce dt, or use "
                f"fewer partitions", step=int(state.step), field="positions", cfl=math.nan)
        sends.append(index)
    return tuple(sends)


def _kick(model, slabs, p, dt, domain, outgoing, incoming, *moved):
    """Forces on ``p``'s atoms from its own and its ghosts, the closing half kick.

    ``outgoing[k]`` and ``incoming[k]`` are the exchanges from ``p`` to its
    ``k``-th neighbour and from that neighbour to ``p``. On a rebuild, ``p``
    first keeps its staying atoms and takes the migrants; its ghosts from
    a neighbour are that neighbour's staying atoms near ``p`` followed by
    the atoms ``p`` sent it (the neighbour's own settled order), and it
    remembers which of its atoms each neighbour now holds. Last, it makes
    the next step's half kick and drift, so that the next step starts
    with the rebuild test and the exchanges (one task fewer in a row).
    """
    model = _on_worker(model)
    xp, state, send = model.backend.xp, _next_drifted(model, domain, dt), domain.send
    flags = [exchange[0] for exchange in (*outgoing, *incoming)] + list(moved)
    rebuild = any(flags) if flags else model.block_needs_rebuild(state)
    if rebuild:
        arrivals = [migrants for _, _, migrants, _ in incoming]
        state, staying = _settle(model, slabs, p, state, arrivals)
        ghosts = [xp.concatenate([near, model.block_positions(sent)], axis=1)
                  for (_, _, _, near), (_, _, sent, _) in zip(incoming, outgoing)]
    else:
        ghosts = [plain for _, plain, _, _ in incoming]
    positions = xp.concatenate(ghosts, axis=1) if ghosts else state.positions[:, :0]
    state = model.kick_with_ghosts(state, positions, dt, rebuild)
    if rebuild:
        send = _send_lists(model, slabs, p, state, staying, arrivals)
    return _Domain(state, send, model.drift_block(state, dt))


class DomainExecutor(_HeldStateExecutor):
    """Slabs of a periodic box on dask workers, with ghost atoms and migration.

    Parameters are those of :func:`hpcgpu.distributed.DistributedExecutor`;
    ``weights`` set the slab thicknesses (proportional), ``steps_per_task``
    must be 1 (every step needs fresh ghost positions).

    Raises
    ------
    ConfigError
        A slab thinner than the ghost radius plus the margin (too many
        partitions for the box), or ``steps_per_task`` other than 1.

    Examples
    --------
    >>> from hpcgpu import Simulation  # doctest: +SKIP
    >>> from hpcgpu.workloads.md import LennardJones  # doctest: +SKIP
    >>> model = LennardJones(8, temperature=1.44, backend="numba")  # doctest: +SKIP
    >>> Simulation(model, dt=0.005, stop_steps=100, client=client, partitions=2).run()  # doctest: +SKIP
    """

    unit = "atoms"
    axis = 2

    def _check_steps_per_task(self):
        if self.steps_per_task != 1:
            raise ConfigError(f"steps_per_task must be 1 for {self.model.name}: every step needs the ghost "
                              f"atoms' new positions; got {self.steps_per_task}")

    def _layout(self, partitions):
        model = self.model
        length = float(model.box[self.axis])
        edges = np.concatenate([[0.0], np.cumsum(self.weights) / np.sum(self.weights) * length])
        edges[-1] = length
        thinnest = float(np.diff(edges).min())
        needed = model.ghost_radius() + model.migration_margin()
        if partitions > 1 and thinnest < needed:
            raise ConfigError(
                f"partitions={partitions} cuts the box (side {length:.4g} along {'xyz'[self.axis]}) into slabs "
                f"as thin as {thinnest:.4g}; each must be at least cutoff + 2 skin = {needed:.4g} so that ghosts "
                f"and migrating atoms come from the adjacent slabs only: use at most "
                f"{max(1, int(length // needed))} partitions or a bigger system")
        self.slabs = Slabs(tuple(float(e) for e in edges), self.axis, length)

    def _split(self, host_state):
        model = self.model
        slab = self.slabs.of(np, model.block_positions(host_state)[self.axis])
        blocks = [model.select_atoms(host_state, np.nonzero(slab == p)[0]) for p in range(self.slabs.count)]
        self.bounds = [(0, block.size) for block in blocks]  # atoms per partition at the start
        return [_Domain(block) for block in blocks]

    def request_diagnostics(self, step):
        futures = [self._submit(self._sums_task, self._model, block, 0, None,
                                key=self._key("diagnostics", self.superstep, p), worker=self.owner[p])
                   for p, block in enumerate(self.blocks)]
        self._pending.append(("diagnostics", step, futures))

    def _join(self, host_blocks):
        """The atoms of every partition in id order (the order of the single-partition state)."""
        model = self.model
        state = model.concat_blocks(host_blocks)
        return model.select_atoms(state, np.argsort(model.atom_ids(state), kind="stable"))

    def _superstep(self, steps):
        for _ in range(steps):
            self._one_step()

    def _one_step(self):
        model, slabs, dt = self._model, self.slabs, self.dt
        self.superstep += 1
        n = self.superstep
        count = slabs.count

        def submit(function, *args, phase, index, worker):
            return self._submit(function, *args, key=self._key(phase, n, *index), worker=worker)

        def cut(function, *args, phase, index, worker):
            # small results read from a resident slab: on its worker, first
            return self._submit_cut(function, *args, key=self._key(phase, n, *index), worker=worker)

        # each block already holds its drifted next step (made by the last kick)
        blocks = self.blocks
        # With at most three slabs every slab is a neighbour of every other: the exchanges carry
        # all the rebuild flags. Beyond, each slab's flag is a task of its own.
        moved = [] if count <= 3 else [cut(_moved, model, dt, block, phase="moved", index=(p,),
                                           worker=self.owner[p]) for p, block in enumerate(blocks)]
        # the exchanges carry both answers and the kick reads every flag itself: only the kick
        # waits for other workers (two levels a step)
        carries_flag = not moved
        exchanges = {(q, p): cut(_exchange, model, slabs, dt, blocks[q], q, p, k, carries_flag, phase="exchange",
                                 index=(q, p), worker=self.owner[q])
                     for q in range(count) for k, p in enumerate(slabs.neighbours(q))}
        new = []
        for p in range(count):
            outgoing = [exchanges[p, q] for q in slabs.neighbours(p)]
            incoming = [exchanges[q, p] for q in slabs.neighbours(p)]
            new.append(submit(_kick, model, slabs, p, dt, blocks[p], outgoing, incoming, *moved, phase="kick",
                              index=(p,), worker=self.owner[p]))
        self.blocks = new
        self.step += 1

    def describe(self):
        out = super().describe()
        out["slab_edges"] = list(self.slabs.bounds)
        return out
