"""A distributed particle set on 3-D bricks: owned atoms, ghosts by a staged x-y-z exchange, migration.

The periodic box is cut into ``px x py x pz`` bricks (:class:`~hpcgpu.partition.brick_geometry.Bricks`),
one per rank; rank p owns the atoms in its brick, with every per-atom array
of the model's state. Forces need every atom within the ghost radius
(``cutoff + skin``) of the brick: its *ghosts*. They come as in LAMMPS'
``comm_brick``: along x, then y, then z, each rank sends its two
neighbours on the axis the atoms it holds (its own and the ghosts of the
earlier stages) that lie within the ghost radius of the neighbour's layer.
Edge and corner ghosts so ride along with the faces: six messages a step
in 3-D, two for slabs (the ``1 x 1 x P`` grid), and one when an axis has
two layers (the neighbour below is the one above: each atom goes once).
An axis of one layer sends nothing: the force kernel takes the minimum
image of the whole box, so a rank's own atoms are their periodic images
there, and ghosts across a periodic face travel unshifted for the same
reason (a shifted copy would be counted twice on an axis of one or two layers).

Which atoms are ghosts, and which rank owns which atom, changes only when
the neighbour lists are rebuilt, which all ranks do at the same step with
no collective: a rank raises a flag (the step) when one of its atoms may
have moved more than ``skin / 2`` since the last build by the time the
flag has reached every rank, and the flags ride in the ghost messages
(:mod:`hpcgpu.partition.rebuild_flags`). While no axis has more than 3
layers a step's flags reach every rank in its own exchange and the test
is the single process's (the same builds at the same steps); with more,
the rebuild comes a few steps after the flag, on a bound that leaves
room for those steps, and a step that keeps a list some atom has moved
more than ``skin / 2`` from raises (a dangerous build).

A step on rank p:

1. its atoms are already half-kicked and drifted (the last step did it);
2. the ghost exchange with the send lists of the last rebuild (and the flags):
   each stage's ghosts for both neighbours cut by one ``take`` and joined
   to what the rank holds by one copy;
3. on a rebuild, staged the same way: atoms that left the brick go to the
   neighbour whose layer they are in (*migration*, along x, y, z), then
   new send lists are cut from the current positions and the ghosts sent;
4. forces from its atoms and ghosts, the closing half kick, and the next
   step's half kick and drift.

Why it is exact: between rebuilds no atom moves more than ``skin / 2``, so
an atom farther than ``cutoff + skin`` from a brick at the last rebuild
cannot come within ``cutoff`` of its atoms. A brick must be at least
``cutoff + 2 skin`` thick along each cut axis, so that ghosts and migrants
come from the adjacent bricks only (checked on every rebuild). Each force
sums the pairs of the single-process run in another order: results agree
to rounding.

On GPUs a rank computes the forces of its *inner* atoms (those whose rows
list no ghost) while the ghosts travel (:data:`SPECULATE_BELOW`,
:data:`SPECULATE_ON_CPU`): it queues them first, and the exchange's cuts
and joins run on a second CUDA stream beside them, so that the whole
exchange, not only its first stage, hides behind them.
"""

import math
import threading
from contextlib import contextmanager
from dataclasses import dataclass, replace

import numpy as np

from hpcgpu.errors import ConfigError, UnstableSimulation
from hpcgpu.partition.brick_geometry import Bricks
from hpcgpu.partition.brick_start import normalised, pieces_start, rank_start, start_report
from hpcgpu.partition.decomposition import Decomposition, InitialBlocks
from hpcgpu.partition.process_grid import check_grid, choose_process_grid
from hpcgpu.partition.rebuild_flags import LATE_REBUILD_MARGIN, check_list_holds, earliest, rebuild_delay, rebuild_due

__all__ = ["BrickDecomposition", "Bricks", "Domain", "SPECULATE_BELOW", "SPECULATE_ON_CPU", "plan_ghosts", "merged_cut",
           "cut_ghosts"]

SPECULATE_BELOW = 0.8
"""A rank computes its inner atoms' forces while its ghosts travel when its atoms moved less than this
fraction of the rebuild threshold (``skin / 2``) since the last build: nearer to it, another rank's
rebuild (which discards them) is likely."""

SPECULATE_ON_CPU = False
"""Whether ranks on CPU backends compute inner forces while their ghosts travel. Off: the two passes
cost more than the one they replace on a CPU (docs/journal.md, 2026-12-02)."""

def _speculates(model):
    return bool(model.backend.on_gpu or SPECULATE_ON_CPU)


_SIDE_STREAMS = threading.local()


@contextmanager
def _beside(model):
    """Run the block's array work on a second CUDA stream, ordered after and before the current one (CuPy);
    on other array modules, as it is.

    The inner forces are queued on the current stream; the exchange's cuts
    and joins, and NCCL's sends and receives (which wait on the caller's
    current stream), then run beside them instead of queueing behind them.
    """
    xp = model.backend.xp
    if xp is np or not hasattr(xp, "cuda"):
        yield
        return
    main = xp.cuda.get_current_stream()
    streams = _SIDE_STREAMS.__dict__.setdefault("by_device", {})
    device = xp.cuda.Device().id
    side = streams.get(device)
    if side is None:
        side = streams[device] = xp.cuda.Stream(non_blocking=True)
    side.wait_event(main.record())
    with side:
        yield
    main.wait_event(side.record())


@dataclass(frozen=True)
class Domain:
    """One rank's atoms (a model state with its neighbour list), its send lists and its next drifted step.

    ``sends`` holds one ``(axis, ((rank, index), ...))`` per cut axis:
    ``index`` picks, from the rank's atoms followed by the ghosts of the
    earlier stages, what that neighbour holds as ghosts (None until the
    first rebuild). ``drifted`` is ``state`` after the next step's half
    kick and drift (None after a split). ``split`` is the neighbour list
    cut into inner and edge rows (GPUs; None otherwise). ``listed`` is,
    after a split of a state that had a neighbour list, the host positions
    of the rank's atoms and then its ghosts when that list was built.
    ``heard`` is the earliest rebuild flag the rank has heard since the
    last rebuild (a step; None: none), ``cuts`` the :func:`merged_cut` of
    each stage (made at the first step that uses the send lists).
    ``raw_velocities``: the block was built by its rank and its velocities
    wait for the normalisation the decomposition carries
    (:mod:`hpcgpu.partition.brick_start`).
    """

    state: object
    sends: tuple = None
    drifted: object = None
    split: object = None
    listed: object = None
    heard: int = None
    cuts: tuple = None
    raw_velocities: bool = False


def plan_ghosts(bricks, xp, held, rank, axis, radius):
    """What ``rank`` sends its neighbours along ``axis``: ``((neighbour, index), ...)``.

    ``held`` is ``(3, N)``: the rank's atoms, then the ghosts of the earlier
    stages; ``index`` picks those within ``radius`` of the neighbour's layer.

    Examples
    --------
    >>> import numpy as np
    >>> bricks = Bricks.weighted((3, 1, 1), (9.0, 9.0, 9.0))
    >>> held = np.array([[3.5, 4.5, 5.9], [1.0, 1.0, 1.0], [1.0, 1.0, 1.0]])
    >>> [(q, index.tolist()) for q, index in plan_ghosts(bricks, np, held, 1, 0, 1.0)]
    [(0, [0]), (2, [2])]
    """
    return tuple((q, xp.nonzero(bricks.near(xp, held[axis], axis, bricks.coords(q)[axis], radius))[0])
                 for q in bricks.neighbours(rank, axis))


def merged_cut(xp, stage, held_count):
    """One flat index that cuts a stage's ghosts for all its neighbours from ``(3, held_count)`` positions.

    Returns ``(flat, counts, held_count)``: :func:`cut_ghosts` takes
    ``flat`` from the raveled positions, which gives each neighbour's
    ghosts as a contiguous ``(3, count)`` piece, in ``stage``'s order: one
    launch on a GPU for both sides of an axis.

    Examples
    --------
    >>> import numpy as np
    >>> held = np.arange(12.0).reshape(3, 4)
    >>> cut = merged_cut(np, ((1, np.array([0, 3])), (2, np.array([1]))), 4)
    >>> [piece.tolist() for piece in cut_ghosts(np, held, cut)]
    [[[0.0, 3.0], [4.0, 7.0], [8.0, 11.0]], [[1.0], [5.0], [9.0]]]
    """
    flat = [index + axis * held_count for _, index in stage for axis in range(3)]
    return xp.concatenate(flat) if flat else xp.zeros(0, dtype=np.int64), tuple(len(i) for _, i in stage), held_count


def cut_ghosts(xp, held, cut):
    """Each neighbour's ghosts, ``(3, count)`` pieces of one ``take`` of ``held`` by a :func:`merged_cut`."""
    flat, counts, held_count = cut
    if held.shape[1] != held_count:
        raise ConfigError(f"a ghost cut made for {held_count} held atoms was given {held.shape[1]}")
    taken = xp.take(xp.ascontiguousarray(held).reshape(-1), flat)
    starts = np.cumsum([0, *(3 * c for c in counts)])
    return [taken[a:b].reshape(3, c) for a, b, c in zip(starts[:-1], starts[1:], counts)]


def _swap(comm, outgoing, tag):
    """Send each ``(rank, payload)`` and receive one payload from each of those ranks, in their order."""
    incoming = [comm.irecv(q, tag) for q, _ in outgoing]
    posted = [comm.isend(payload, q, tag) for q, payload in outgoing]
    received = comm.waitall(incoming)
    comm.waitall(posted)
    return received


def _joined(xp, own, parts):
    if not parts:
        return own
    return xp.concatenate([own, *parts], axis=1)


def _ghosts_of(xp, own, parts):
    if len(parts) == 1:  # one stage from one neighbour (two slabs): its array as it came, only read
        return parts[0]
    return xp.concatenate(parts, axis=1) if parts else own[:, :0]


@dataclass(frozen=True)
class BrickDecomposition(Decomposition):
    """The box in ``px x py x pz`` bricks, one per rank (layer thickness in proportion to the weights)."""

    bricks: Bricks
    weights: tuple
    dt: float
    counts: tuple = ()
    order: object = None  # the atom ids of the state that was split, in its order (join gives them back so)
    velocities: tuple = None  # (mean, scale) of the ranks' raw initial velocities (rank-built blocks)
    steps_per_task = 1
    unit = "atoms"
    builds_initial_blocks = True
    particle_pieces = True
    join_copies = 3  # a gather's blocks, their concatenation, and that sorted by id (hpcgpu.partition.client_gather)

    @classmethod
    def build(cls, model, dt, partitions, steps_per_task, weights, calibrated, grid=None):
        """The bricks for ``partitions`` ranks: on ``grid`` (px, py, pz), or the one of least ghost surface."""
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
        box = tuple(float(b) for b in model.box)
        radius = model.ghost_radius()
        needed = radius + model.migration_margin()
        what = "cutoff + 2 skin"
        if grid is None:
            try:
                grid = choose_process_grid(partitions, box, halo=(radius,) * 3, minimum=(needed,) * 3, tie="first")
            except ConfigError as error:
                raise ConfigError(f"{error} (bricks of {model.name} must be at least {what} = {needed:.4g} thick "
                                  f"so that ghosts and migrating atoms come from the adjacent bricks only)") from None
        grid = check_grid(grid, 3, partitions)
        bricks = Bricks.weighted(grid, box, weights)
        try:
            bricks.check_thickness(needed, what)
        except ConfigError as error:
            if len(set(weights)) == 1:
                raise
            raise ConfigError(f"{error}, or weights closer to equal (weights={weights})") from None
        return cls(bricks, tuple(weights), float(dt))

    # -- the client's side -----------------------------------------------------------------------------------
    def split_state(self, model, state):
        listed = getattr(model, "listed_positions", None)
        return self.split(model, model.to_host(state), None if listed is None else listed(state))

    def split(self, model, host_state, listed=None):
        """Each rank's atoms, and with ``listed`` (where the atoms were when their list was built) its ghosts.

        Without ``listed`` the atoms go to the brick they are in and every
        rank builds its lists on its first step. With it, the bricks are
        cut as they would have been at that build: each atom goes to the
        brick it was in then, and the staged ghost exchange is played here
        on those positions (:func:`plan_ghosts`), so each rank's first list
        is built from them and the run rebuilds at the steps one process would.
        """
        bricks = self.bricks
        object.__setattr__(self, "order", np.asarray(host_state.ids).copy())
        if listed is not None and not self._list_lasts(model, host_state, listed):
            listed = None
        where = np.asarray(host_state.positions if listed is None else listed)
        layer = [bricks.index(np, where[axis], axis) for axis in range(3)]
        rank_of = layer[0] + bricks.grid[0] * (layer[1] + bricks.grid[1] * layer[2])
        owned = [np.nonzero(rank_of == p)[0] for p in range(bricks.count)]
        blocks = [model.select_atoms(host_state, index) for index in owned]
        object.__setattr__(self, "counts", tuple(block.size for block in blocks))
        if listed is None:
            return [Domain(block) for block in blocks]
        held = list(owned)  # per rank: global indices of its atoms, then its ghosts so far
        sends = [[] for _ in range(bricks.count)]
        radius = model.ghost_radius()
        for axis in bricks.split_axes:
            stage = [plan_ghosts(bricks, np, where[:, held[p]], p, axis, radius) for p in range(bricks.count)]
            before = list(held)
            for p in range(bricks.count):
                sends[p].append((axis, stage[p]))
                parts = [before[q][dict(stage[q])[p]] for q in bricks.neighbours(p, axis)]
                held[p] = np.concatenate([before[p], *parts])
        return [Domain(block, tuple(sends[p]), listed=np.take(where, held[p].astype(np.int64), axis=1))
                for p, block in enumerate(blocks)]

    def _list_lasts(self, model, host_state, listed):
        """Whether the split state's list holds until a flag raised at the first step comes back (decided late).

        No rank has tested the list before the first step: it keeps it only
        if the bound of :mod:`~hpcgpu.partition.rebuild_flags` covers the
        delay's steps and that first one; else every rank builds its own.
        """
        delay = rebuild_delay(self.bricks.grid)
        if not delay:
            return True
        _, reach = model.rebuild_reach(host_state, delay + 1, self.dt, LATE_REBUILD_MARGIN, reference=listed)
        return reach <= 1.0

    def build_block(self, model, rank, source):
        """Rank ``rank``'s initial atoms, built on its worker from the model's lattice (``source`` the
        model's initial condition: their velocities wait for :meth:`settled`) or read from a checkpoint's
        pieces (:func:`~hpcgpu.partition.brick_start.pieces_start`)."""
        keep_lists = not rebuild_delay(self.bricks.grid)  # with a delay every rank builds on its first step
        if isinstance(source, InitialBlocks):
            state, sends, listed = rank_start(self.bricks, model, rank, keep_lists)
            return Domain(state, sends, listed=listed, raw_velocities=True)
        if callable(getattr(source, "has_extra", None)):  # particle pieces (hpcgpu.particle_checkpoints)
            state, sends, listed = pieces_start(self.bricks, model, rank, source, keep_lists)
            return Domain(state, sends, listed=listed)
        raise ConfigError(f"bricks build their atoms from the model's initial condition or a checkpoint's "
                          f"particle pieces; got {source!r}")

    def initial_report(self, model, block):
        """The block's health, its atoms and, for a block built from the lattice, the exact sums of its raw
        velocities."""
        health = {**super().initial_report(model, block), "atoms": int(block.state.size)}
        return {**health, **start_report(model, block.state)} if block.raw_velocities else health

    def settled(self, model, parts):
        """The layout once the ranks reported their blocks: atoms per brick and the velocities' normalisation."""
        if all("velocity_sums" in part for part in parts):
            sums = [part["velocity_sums"] for part in parts]
            return replace(self, velocities=model.start_normalisation(sums), counts=tuple(s["atoms"] for s in sums))
        if all("atoms" in part for part in parts):
            return replace(self, counts=tuple(part["atoms"] for part in parts))
        return self

    def checkpoint_particles(self, model, rank, domain):
        """``(host state, extra, region)`` of rank ``rank``'s checkpoint piece (:mod:`hpcgpu.particle_checkpoints`).

        ``extra`` holds ``listed``, where the atoms were when their list was
        built (when the model says: ``listed_positions``), so that a resumed
        run keeps their lists; ``region`` their bounding boxes.
        """
        from hpcgpu.particle_checkpoints import position_bounds

        state = self.model_state(domain)
        listed = None
        if getattr(state, "neighbors", None) is not None and callable(getattr(model, "listed_positions", None)):
            listed = model.listed_positions(state)
        elif domain.listed is not None:  # a block not stepped yet: the list it will be given
            listed = domain.listed[:, :state.size]
        host = model.to_host(state)
        region = {"bounds": position_bounds(host.positions)}
        if listed is None:
            return host, {}, region
        listed = np.ascontiguousarray(model.backend.to_host(listed))
        return host, {"listed": listed}, {**region, "listed_bounds": position_bounds(listed)}

    def for_ranks(self):
        """The layout without ``order`` (N atom ids, read by the client's :meth:`join` only)."""
        return replace(self, order=None)

    def sizes(self):
        """Atoms per brick at the start (known once the state is split)."""
        return [(0, n) for n in self.counts] or [(0, 0)] * self.bricks.count

    def describe(self):
        return self.bricks.describe()

    def join(self, model, host_blocks):
        """The atoms of every brick in the order of the state that was split (id order if none was)."""
        state = model.concat_blocks(host_blocks)
        ids = np.asarray(state.ids)
        by_id = np.argsort(ids, kind="stable")
        if self.order is None or len(self.order) != len(ids):
            return model.select_atoms(state, by_id)
        return model.select_atoms(state, by_id[np.searchsorted(ids[by_id], self.order)])

    # -- the rank's side ------------------------------------------------------------------------------------
    def resume(self, context, domain):
        if domain.drifted is not None:
            return domain
        model, state, split = context.model, self.model_state(domain), domain.split
        if isinstance(state.positions, np.ndarray) and model.backend.xp is not np:
            state = model.concat_blocks([state])  # split on the host by the client: onto this rank's GPU
        sends = domain.sends
        if sends is not None:  # made on the host by split(): the index arrays go where the atoms are
            sends = tuple((axis, tuple((q, model.backend.asarray(index)) for q, index in stage))
                          for axis, stage in sends)
        if domain.listed is not None:  # the list of the split state, rebuilt for this brick (not a new build)
            state = model.relist(state, domain.listed)
            split = self._inner_split(model, state, context.rank,
                                      model.backend.asarray(domain.listed[:, :state.size]))
        return Domain(state, sends, model.drift_block(state, self.dt), split)

    def model_state(self, domain):
        if domain.raw_velocities and self.velocities is not None:
            return normalised(domain.state, self.velocities)
        return domain.state

    def advance(self, context, domain, steps):
        for _ in range(steps):
            domain = self._step(context, domain)
        return domain

    def _inner_split(self, model, state, rank, positions):
        """The list cut into the rows of atoms within the ghost radius of a face and the others (GPUs)."""
        if not self.bricks.split_axes or not _speculates(model) or not hasattr(model, "split_neighbors"):
            return None
        inner = self.bricks.inside(model.backend.xp, positions, rank, model.ghost_radius())
        return model.split_neighbors(state, ~inner)

    def _step(self, context, domain):
        model, p = context.model, context.rank
        xp = model.backend.xp
        state, sends, cuts = domain.drifted, domain.sends, domain.cuts
        delay = rebuild_delay(self.bricks.grid)
        step = int(state.step)
        if delay:
            progress, reach = model.rebuild_reach(state, delay, self.dt, LATE_REBUILD_MARGIN)
        else:
            progress = reach = model.rebuild_progress(state)
        heard = earliest(domain.heard, step if reach > 1.0 else None)
        inner, joined = None, None
        rebuild = sends is None  # no lists yet (a split without them): every rank builds
        if not rebuild:
            if domain.split is not None and heard is None and reach < SPECULATE_BELOW ** 2:
                # the atoms that need no ghosts first (discarded if the ranks rebuild); on a GPU the
                # exchange's cuts and joins then run beside them, on a stream of their own
                inner = (domain.split, model.inner_forces(state, domain.split))
                with _beside(model):
                    heard, held, cuts = self._exchange(context, state, sends, cuts, heard, delay)
            else:
                heard, held, cuts = self._exchange(context, state, sends, cuts, heard, delay)
            rebuild = rebuild_due(heard, step, delay)
            if not rebuild:
                check_list_holds(progress, p, step, delay)
                joined = held
        if rebuild and len(self.bricks.split_axes) == 1:  # slabs: migrants and ghosts in one message
            state, sends, ghosts = self._settle_slab(context, state)
        elif rebuild:
            state = self._migrate(context, state)
            sends, ghosts = self._borders(context, state)
        if rebuild:
            heard, cuts, joined = None, None, _joined(xp, state.positions, [ghosts])
        state = model.kick_with_ghosts(state, joined[:, state.size:], self.dt, rebuild,
                                       None if rebuild else inner, joined=joined)
        split = domain.split
        if rebuild:
            split = self._inner_split(model, state, p, state.positions)
        return Domain(state, sends, model.drift_block(state, self.dt), split, heard=heard,
                      cuts=None if cuts is None else tuple(cuts))

    def _exchange(self, context, state, sends, cuts, heard, delay):
        """The staged ghost exchange of a step with the flags: ``(heard, held, cuts)``.

        ``held`` is the rank's positions followed by every ghost (what the
        forces read), ``cuts`` the stages' :func:`merged_cut`. Once a rank
        knows the rebuild is due it sends the flags alone (and ``held`` is
        not complete: the rebuild replaces it).
        """
        model, comm = context.model, context.comm
        xp, step = model.backend.xp, int(state.step)
        held, cuts = state.positions, list(cuts or [None] * len(sends))
        for number, (axis, stage) in enumerate(sends):
            known = rebuild_due(heard, step, delay)
            if not known and (cuts[number] is None or cuts[number][2] != held.shape[1]):
                cuts[number] = merged_cut(xp, stage, held.shape[1])
            payloads = [None] * len(stage) if known else cut_ghosts(xp, held, cuts[number])
            incoming = [comm.irecv(q, ("ghosts", axis)) for q, _ in stage]
            posted = [comm.isend((payload, heard), q, ("ghosts", axis)) for (q, _), payload in zip(stage, payloads)]
            received = comm.waitall(incoming)
            comm.waitall(posted)
            heard = earliest(heard, *(flag for _, flag in received))
            if not rebuild_due(heard, step, delay):  # what it holds: its atoms, then the ghosts so far
                held = _joined(xp, held, [payload for payload, _ in received])
        return heard, held, cuts

    def _leaving(self, context, state, axis):
        """Each atom's layer along ``axis``, the rank's and its neighbours'; raises if an atom went past them."""
        model, p, bricks = context.model, context.rank, self.bricks
        layer = bricks.index(model.backend.xp, state.positions[axis], axis)
        here = bricks.coords(p)[axis]
        targets = [bricks.coords(q)[axis] for q in bricks.neighbours(p, axis)]
        kept = int((layer == here).sum()) + sum(int((layer == t).sum()) for t in targets)
        if kept != state.size:
            host = model.backend.to_host(layer)
            strays = [int(i) for i in model.backend.to_host(state.ids)[
                ~np.isin(host, [here, *targets])][:5]]
            raise UnstableSimulation(
                f"atoms {strays} left partition {p} for a brick beyond its neighbours along {'xyz'[axis]} within "
                f"one neighbour-list period: they moved faster than the decomposition allows (reduce dt, or use "
                f"fewer partitions)", step=int(getattr(state, "step", -1)), field="positions", cfl=math.nan)
        return layer, here, targets

    def _migrate(self, context, state):
        """The rank's atoms after those that left its brick went to the neighbours (staged x, y, z)."""
        model, comm, p, bricks = context.model, context.comm, context.rank, self.bricks
        xp = model.backend.xp
        for axis in bricks.split_axes:
            layer, here, targets = self._leaving(context, state, axis)
            outgoing = [(q, model.select_atoms(state, xp.nonzero(layer == t)[0]))
                        for q, t in zip(bricks.neighbours(p, axis), targets)]
            arrivals = _swap(comm, outgoing, ("migrants", axis))
            staying = model.select_atoms(state, xp.nonzero(layer == here)[0])
            state = model.concat_blocks([staying, *arrivals])
        return state

    def _settle_slab(self, context, state):
        """Migration and new ghosts in one message per neighbour, when one axis is cut (slabs).

        Each neighbour gets the atoms that moved into its layer and the
        positions of the staying atoms near it; its ghosts from this rank
        are then those followed by the atoms it sent here, whose positions
        it has (an atom that came from the other side cannot be near it
        while layers are at least ``cutoff + 2 skin`` thick: checked).
        Returns the settled state, the send lists and the ghosts.
        """
        model, comm, p, bricks = context.model, context.comm, context.rank, self.bricks
        xp, radius = model.backend.xp, model.ghost_radius()
        (axis,) = bricks.split_axes
        neighbours = bricks.neighbours(p, axis)
        layer, here, targets = self._leaving(context, state, axis)
        staying = model.select_atoms(state, xp.nonzero(layer == here)[0])
        kept = staying.positions
        near = [xp.nonzero(bricks.near(xp, kept[axis], axis, t, radius))[0] for t in targets]
        movers = [model.select_atoms(state, xp.nonzero(layer == t)[0]) for t in targets]
        offers = [(q, (moving, xp.take(kept, index, axis=1))) for q, moving, index in zip(neighbours, movers, near)]
        received = _swap(comm, offers, ("settle", axis))
        arrivals = [moving for moving, _ in received]
        state = model.concat_blocks([staying, *arrivals])
        stage, start = [], staying.size
        for k, (q, batch) in enumerate(zip(neighbours, arrivals)):
            count = batch.size
            for other, (source, later) in enumerate(zip(neighbours, arrivals)):
                if other != k and bool(bricks.near(xp, later.positions[axis], axis, targets[k],
                                                   radius).any()):
                    raise UnstableSimulation(
                        f"partition {p}: an atom from partition {source} came within the ghost radius of partition "
                        f"{q} in one neighbour-list period (it crossed a whole brick): reduce dt, or use fewer "
                        f"partitions", step=int(getattr(state, "step", -1)), field="positions", cfl=math.nan)
            stage.append((q, xp.concatenate([near[k], xp.arange(start, start + count, dtype=near[k].dtype)])))
            start += count
        parts = [xp.concatenate([near_here, moving.positions], axis=1)
                 for (_, near_here), moving in zip(received, movers)]
        return state, ((axis, tuple(stage)),), _ghosts_of(xp, kept, parts)

    def current_ghosts(self, context, domain):
        """The positions ``(3, G)`` of every atom within the ghost radius of the rank's brick, now.

        A fresh staged exchange from the current positions (every rank calls
        it at the same point of its program): what a reduction over pairs
        reads beside the rank's own atoms (:mod:`hpcgpu.partition.rank_reductions`).
        """
        return self._borders(context, domain.state)[1]

    def _borders(self, context, state):
        """New send lists cut from the current positions, and the ghosts they bring (staged x, y, z)."""
        model, comm, p, bricks = context.model, context.comm, context.rank, self.bricks
        xp = model.backend.xp
        own = state.positions
        held, parts, sends = own, [], []
        for axis in bricks.split_axes:
            stage = plan_ghosts(bricks, xp, held, p, axis, model.ghost_radius())
            received = _swap(comm, [(q, xp.take(held, index, axis=1)) for q, index in stage], ("borders", axis))
            parts.extend(received)
            sends.append((axis, stage))
            held = _joined(xp, own, parts)
        return tuple(sends), _ghosts_of(xp, own, parts)
