"""MD on bricks: ghosts by a staged x-y-z exchange, migration, one rebuild decision; the single run to rounding.

Slabs are the ``1 x 1 x P`` case of the same decomposition.
"""

from dataclasses import replace

import numpy as np
import pytest
from _support import small

from hpcgpu import Simulation
from hpcgpu.errors import ConfigError, UnstableSimulation
from hpcgpu.partition import bricks as brick_module
from hpcgpu.partition.brick_geometry import Bricks
from hpcgpu.partition.bricks import BrickDecomposition, plan_ghosts
from hpcgpu.partition.engine import PartitionedExecutor
from hpcgpu.partition.rebuild_flags import rebuild_delay
from hpcgpu.workloads.md import LennardJones


@pytest.fixture(scope="module")
def liquid():
    """A melted Lennard-Jones liquid (from the fcc lattice, 400 local steps)."""

    def make(n_cells, thermostat):
        model = LennardJones(n_cells, temperature=1.44, thermostat=thermostat, backend="numba", seed=3)
        return model, model.step(model.initial_state(), 0.005, 400)

    return make


def _layers(bricks, positions):
    """The brick coordinates ``(3, N)`` of each atom."""
    return np.array([bricks.index(np, positions[axis], axis) for axis in range(3)])


def _corner_rush(cells, grid):
    """A thin liquid whose atoms within 2 sigma of a brick corner all get 3 sigma/tau more along (1, 1, 1)."""
    model = LennardJones(cells, density=0.6, temperature=1.2, cutoff=2.0, skin=0.3, backend="numba", seed=3)
    state = model.step(model.initial_state(), 0.005, 100)
    box = np.asarray(model.box)[:, None]
    corner = np.asarray([side / parts for side, parts in zip(model.box, grid)])[:, None]
    offset = (state.positions - corner + box / 2) % box - box / 2
    velocities = state.velocities.copy()
    velocities[:, (offset ** 2).sum(axis=0) < 2.0 ** 2] += 3.0
    return model, model.state_from_arrays(state.positions, velocities, ids=state.ids)


# 2x2x2: every axis two layers (one neighbour each), the flags ride along; 3x2x1: three layers and two;
# 1x1x4: slabs, four layers: the flags reach every rank a step late (a rebuild decided one step late)
@pytest.mark.parametrize("cells, grid", [((4, 4, 4), (2, 2, 2)), ((6, 4, 3), (3, 2, 1)), ((3, 3, 8), (1, 1, 4))])
def test_bricks_equal_one_process_with_atoms_crossing_faces_edges_and_corners(client, cells, grid):
    model, state = _corner_rush(cells, grid)
    reference = model.step(state, 0.005, 100)
    run = PartitionedExecutor(client, model, state, 0.005, partitions=int(np.prod(grid)), grid=grid)
    try:
        run.advance(100)
        final = run.global_state()
        diagnostics = run.diagnostics()
        summary = run.describe()
    finally:
        run.close()
    assert summary["process_grid"] == "x".join(map(str, grid)) and sum(summary["atoms_per_partition"]) == model.n
    side = max(model.box)
    np.testing.assert_array_equal(final.ids, reference.ids)
    np.testing.assert_array_equal(final.images, reference.images)
    np.testing.assert_allclose(final.positions, reference.positions, rtol=1e-12, atol=1e-12 * side)
    speed = np.abs(reference.velocities).max()
    np.testing.assert_allclose(final.velocities, reference.velocities, rtol=1e-12, atol=1e-12 * speed)
    expected = model.diagnostics(reference)
    for key in ("energy", "potential_energy_full"):
        np.testing.assert_allclose(diagnostics[key], expected[key], rtol=1e-12, err_msg=key)
    # each pair inside the cutoff counted once, whichever bricks hold its atoms (ghosts count half)
    assert diagnostics["interacting_pairs"] == expected["interacting_pairs"] > 0
    if rebuild_delay(grid) == 0:
        assert final.rebuilds == reference.rebuilds > state.rebuilds  # the same builds, at the same steps
    else:  # decided late on a bound of the displacement: at least those builds
        assert final.rebuilds >= reference.rebuilds > state.rebuilds
    # atoms changed brick along one, two and three axes (faces, edges, corners) as far as the grid has them
    bricks = Bricks.weighted(grid, model.box)
    axes_changed = (_layers(bricks, state.positions) != _layers(bricks, final.positions)).sum(axis=0)
    for crossed in range(1, len(bricks.split_axes) + 1):
        assert (axes_changed == crossed).sum() >= 1, crossed


def test_bricks_from_a_state_without_a_list_build_their_own_on_the_first_step(client):
    model, state = _corner_rush((4, 4, 4), (2, 2, 2))
    state = replace(state, neighbors=None)  # split by position; every rank builds at its first step
    reference = model.step(state, 0.005, 40)
    run = PartitionedExecutor(client, model, state, 0.005, grid=(2, 2, 2))
    try:
        run.advance(40)
        final = run.global_state()
    finally:
        run.close()
    np.testing.assert_allclose(final.positions, reference.positions, rtol=1e-12, atol=1e-12 * max(model.box))
    assert final.rebuilds == reference.rebuilds


def test_sixteen_bricks_on_two_workers_end_at_the_energy_of_one_partition(client):
    """``hpcgpu run md --workers 2 --partitions 16`` at a smaller size: the grid it picks, to 1e-10."""
    model = LennardJones(8, temperature=1.0, backend="numba", seed=2)  # box side 13.4: at most 4 bricks per axis
    one = Simulation(model, dt=0.005, stop_steps=50, progress=False).run()
    sixteen = Simulation(model, dt=0.005, stop_steps=50, progress=False, client=client, partitions=16).run()
    summary = sixteen.summary()
    layers = [int(n) for n in summary["process_grid"].split("x")]
    assert summary["partitions"] == 16 and np.prod(layers) == 16
    assert max(layers) > 1 and sorted(layers) != [1, 1, 16]
    np.testing.assert_allclose(float(sixteen.diagnostics["energy"][-1]), float(one.diagnostics["energy"][-1]),
                               rtol=1e-10)
    sixteen.close()


# 2 and 3 bricks: every rank a neighbour, the rebuild flag travels with the ghosts; 4: the grid it picks
@pytest.mark.parametrize("partitions, thermostat", [(2, "none"), (3, "none"), (4, "none"), (2, "langevin")])
def test_md_bricks_reproduce_the_single_run_with_atoms_migrating(client, liquid, partitions, thermostat):
    model, state = liquid({3: 6, 4: 8}.get(partitions, 5), thermostat)
    reference = Simulation(model, state, dt=0.005, stop_steps=100, progress=False).run()
    sim = Simulation(model, state, dt=0.005, stop_steps=100, progress=False, client=client,
                     partitions=partitions).run()
    # Chaotic dynamics amplify the rounding of another summation order: ~1e-14 after 100 steps.
    for name in ("positions", "velocities", "forces"):
        np.testing.assert_allclose(getattr(sim.state, name), getattr(reference.state, name), rtol=0, atol=1e-9,
                                   err_msg=name)
    np.testing.assert_array_equal(sim.state.images, reference.state.images)
    np.testing.assert_array_equal(sim.state.ids, reference.state.ids)
    expected = reference.diagnostics.sel(time=sim.diagnostics.time)
    for key in ("energy", "temperature", "pressure", "msd", "potential_energy_full"):
        np.testing.assert_allclose(sim.diagnostics[key], expected[key], rtol=1e-10, err_msg=key)
    np.testing.assert_array_equal(sim.diagnostics["interacting_pairs"], expected["interacting_pairs"])
    summary = sim.summary()
    layers = [int(n) for n in summary["process_grid"].split("x")]
    if rebuild_delay(layers) == 0:
        # the bricks start from the split state's list: they rebuild at the steps one process does
        np.testing.assert_array_equal(sim.diagnostics["neighbor_rebuilds"], expected["neighbor_rebuilds"])
        assert sim.state.rebuilds == reference.state.rebuilds > state.rebuilds
    else:  # four layers: decided a step late, on a bound of the displacement
        assert (np.asarray(sim.diagnostics["neighbor_rebuilds"]) >= np.asarray(expected["neighbor_rebuilds"])).all()
        assert sim.state.rebuilds >= reference.state.rebuilds > state.rebuilds
    assert sum(summary["atoms_per_partition"]) == model.n and np.prod(layers) == partitions
    # Atoms crossed brick faces (they migrated between partitions) during the run.
    bricks = Bricks(tuple(tuple(e) for e in summary["brick_edges"]), model.box)
    assert (_layers(bricks, state.positions) != _layers(bricks, sim.state.positions)).any(axis=0).sum() > 0
    sim.close()


def test_md_bricks_refuse_bricks_thinner_than_the_ghost_radius(client):
    model = LennardJones(5, temperature=1.0, backend="numba")  # box side 8.4: two bricks per axis at most
    with pytest.raises(ConfigError, match=r"partitions=3 cannot be laid out .* at most 8 ranks fit \(2x2x2\).*"
                                          r"bricks of md must be at least cutoff \+ 2 skin = 3.1 thick"):
        Simulation(model, dt=0.005, client=client, partitions=3)
    with pytest.raises(ConfigError, match=r"grid=1x3x1 cuts the box \(8.398, 8.398, 8.398\) into bricks "
                                          r"as thin as 2.799 along y; each must be at least cutoff \+ 2 skin = 3.1"):
        PartitionedExecutor(client, model, model.initial_state(), 0.005, grid=(1, 3, 1))
    with pytest.raises(ConfigError, match=r"grid=2x2x2 holds 8 ranks but partitions=4"):
        PartitionedExecutor(client, model, model.initial_state(), 0.005, partitions=4, grid=(2, 2, 2))
    with pytest.raises(ConfigError, match="steps_per_task must be 1 for md"):
        Simulation(model, dt=0.005, client=client, partitions=2, steps_per_task=2)
    with pytest.raises(ConfigError, match="weights='calibrate' is only available for grid models"):
        Simulation(model, dt=0.005, client=client, partitions=2, weights="calibrate")


def test_bricks_number_ranks_x_fastest_and_find_their_neighbours_on_axes_of_one_two_and_three_layers():
    bricks = Bricks.weighted((3, 2, 1), (9.0, 4.0, 5.0))
    assert [bricks.coords(r) for r in (0, 1, 3, 5)] == [(0, 0, 0), (1, 0, 0), (0, 1, 0), (2, 1, 0)]
    assert all(bricks.rank(bricks.coords(r)) == r for r in range(6))
    assert bricks.neighbours(0, 0) == (2, 1)  # three layers: lower (periodic) then upper
    assert bricks.neighbours(4, 1) == (1,)  # two layers: the same neighbour on both sides, once
    assert bricks.neighbours(4, 2) == ()  # one layer: its own periodic images
    assert bricks.split_axes == (0, 1)
    # layer 0 of x sees the top of layer 2 through the periodic edge and the bottom of layer 1
    x = np.array([0.5, 2.9, 3.0, 5.0, 6.5, 8.9])
    assert bricks.index(np, x, 0).tolist() == [0, 0, 1, 1, 2, 2]
    assert bricks.near(np, x, 0, 0, 1.0).tolist() == [True, True, True, False, False, True]


def test_weights_cut_each_axis_by_the_weights_of_its_layers():
    # ranks x fastest: layer sums along x (1 + 3, 1 + 3) equal, along y (1 + 1, 3 + 3) 1 : 3
    bricks = Bricks.weighted((2, 2, 1), (8.0, 8.0, 8.0), [1.0, 1.0, 3.0, 3.0])
    assert bricks.edges == ((0.0, 4.0, 8.0), (0.0, 2.0, 8.0), (0.0, 8.0))
    assert Bricks.weighted((1, 1, 3), (1.0, 1.0, 6.0), [1.0, 2.0, 3.0]).edges[2] == (0.0, 1.0, 3.0, 6.0)


@pytest.mark.parametrize("grid", [(2, 2, 2), (3, 2, 1), (1, 1, 4), (1, 2, 1)])
def test_the_staged_exchange_brings_every_atom_near_a_brick_once(grid):
    """Played on the host as split() plays it: each rank holds its atoms and, once each, every other atom
    within the ghost radius of its brick along every cut axis (edges and corners through the later stages)."""
    rng = np.random.default_rng(11)
    box = (9.0, 8.0, 12.0)
    positions = rng.uniform(0.0, 1.0, (3, 4000)) * np.asarray(box)[:, None]
    bricks, radius = Bricks.weighted(grid, box), 1.3
    owner = np.array([bricks.rank(c) for c in _layers(bricks, positions).T])
    held = [np.nonzero(owner == p)[0] for p in range(bricks.count)]
    for axis in bricks.split_axes:
        stage = [plan_ghosts(bricks, np, positions[:, held[p]], p, axis, radius) for p in range(bricks.count)]
        held = [np.concatenate([held[p], *[held[q][dict(stage[q])[p]] for q in bricks.neighbours(p, axis)]])
                for p in range(bricks.count)]
    for p in range(bricks.count):
        coords = bricks.coords(p)
        near = np.ones(positions.shape[1], dtype=bool)
        for axis in bricks.split_axes:
            near &= bricks.near(np, positions[axis], axis, coords[axis], radius)
        assert len(np.unique(held[p])) == len(held[p]), p
        assert set(held[p].tolist()) == set(np.nonzero(near)[0].tolist()), p
        assert held[p][:(owner == p).sum()].tolist() == np.nonzero(owner == p)[0].tolist()


def test_selected_atoms_are_c_ordered_copies_of_the_chosen_columns(liquid):
    # a[:, index] of a (3, N) array is Fortran-ordered, and every later step inherited that
    # (concatenate and empty_like keep it): the force kernel ran 17% slower on it
    model, state = liquid(4, "none")
    index = np.random.default_rng(7).permutation(state.size)[: state.size // 3]
    picked = model.select_atoms(state, index)
    for name, array, whole in zip(("positions", "velocities", "forces", "images", "origins", "ids", "energies",
                                   "virials"), picked.arrays(), state.arrays()):
        assert array.flags.c_contiguous, name
        np.testing.assert_array_equal(array, whole[..., index], err_msg=name)
    assert not np.shares_memory(picked.positions, state.positions)


def _slabs(model, cuts):
    """Bricks of one layer along x and y, cut along z at ``cuts``."""
    length = float(model.box[2])
    return Bricks(((0.0, float(model.box[0])), (0.0, float(model.box[1])), (0.0, *cuts, length)), model.box)


def _brick_and_ghosts(model, state, bricks, p):
    """The atoms of brick ``p`` and, as its ghosts, every other atom within the ghost radius."""
    z = state.positions[2]
    layer = bricks.coords(p)[2]
    own = np.nonzero(bricks.index(np, z, 2) == layer)[0]
    near = np.nonzero(bricks.near(np, z, 2, layer, model.ghost_radius()) & (bricks.index(np, z, 2) != layer))[0]
    return model.select_atoms(state, own), state.positions[:, near]


@pytest.mark.parametrize("backend", ["numba", "numpy"])
def test_inner_forces_then_the_edge_atoms_equal_the_forces_in_one_pass(liquid, backend):
    model, state = liquid(8, "none")  # box side 13.4: a slab of 7 has inner atoms (2.8 from both faces)
    model = model.with_backend(backend) if backend != "numba" else model
    bricks = _slabs(model, (2.0, 9.0))
    block, ghosts = _brick_and_ghosts(model, model.to_host(state), bricks, 1)
    *_, neighbors, _ = model.forces_with_ghosts(block, ghosts, rebuild=True)
    block = replace(block, neighbors=neighbors)
    edge = ~bricks.inside(np, block.positions, 1, model.ghost_radius())
    assert 0 < edge.sum() < block.size
    # what makes the cut exact: the inner atoms' rows list none of the ghosts (indices >= N)
    rows = np.asarray(neighbors.neighbors)[:block.size][~edge]
    listed = np.arange(neighbors.capacity)[None, :] < np.asarray(neighbors.counts)[:block.size][~edge][:, None]
    assert not ((rows >= block.size) & listed).any()
    assert ((np.asarray(neighbors.neighbors)[:block.size][edge] >= block.size)).any()
    # the atoms move a little (no rebuild): the list stays, the forces change
    rng = np.random.default_rng(7)
    block = replace(block, positions=block.positions + rng.uniform(-0.05, 0.05, block.positions.shape))
    ghosts = ghosts + rng.uniform(-0.05, 0.05, ghosts.shape)
    whole = model.forces_with_ghosts(block, ghosts, rebuild=False)
    split = model.split_neighbors(block, edge)
    np.testing.assert_array_equal(np.asarray(split.inner.counts) + np.asarray(split.edge.counts),
                                  np.asarray(neighbors.counts))
    inner = model.inner_forces(block, split)
    in_two = model.forces_with_ghosts(block, ghosts, rebuild=False, inner=(split, inner))
    for name, one, two in zip(("forces", "energies", "virials", "pair_counts"), whole[:4], in_two[:4]):
        if backend == "numba" or name == "pair_counts":  # each row summed in the same order: bitwise
            np.testing.assert_array_equal(two, one, err_msg=name)
        else:  # the NumPy reference pads rows to the longest of a chunk: to rounding
            np.testing.assert_allclose(two, one, rtol=1e-12, atol=1e-12, err_msg=name)
    assert in_two[4] is neighbors
    with pytest.raises(ConfigError, match="the ghosts changed without a neighbour-list rebuild"):
        model.forces_with_ghosts(block, ghosts[:, 1:], rebuild=False, inner=(split, inner))


def test_md_bricks_overlap_their_ghosts_and_match_the_run_that_does_not(liquid, monkeypatch):
    """Two ranks in this process (threads): the overlapped run takes the inner path and ends bitwise
    where a run that never overlaps ends."""
    from distributed import Client, LocalCluster

    from hpcgpu.workloads.md.local_steps import LocalSteps

    model, state = liquid(8, "none")  # two bricks of 6.7: inner atoms in the middle of each
    calls = []
    original = LocalSteps.inner_forces

    def counted(self, block, split):
        calls.append(block.size)
        return original(self, block, split)

    monkeypatch.setattr(LocalSteps, "inner_forces", counted)
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=False, dashboard_address=None) as cluster, \
            Client(cluster) as client:
        finals = []
        # forced on (on GPUs by default), turned off by its threshold, and numba's default (off)
        for on_cpu, below in ((True, brick_module.SPECULATE_BELOW), (True, 0.0),
                              (brick_module.SPECULATE_ON_CPU, 0.8)):
            monkeypatch.setattr(brick_module, "SPECULATE_ON_CPU", on_cpu)
            monkeypatch.setattr(brick_module, "SPECULATE_BELOW", below)
            calls.clear()
            sim = Simulation(model, state, dt=0.005, stop_steps=60, progress=False, client=client, partitions=2).run()
            finals.append((sim.state, len(calls)))
            sim.close()
    (overlapped, inner_calls), (plain, plain_calls), (_, default_calls) = finals
    # most steps of both ranks speculate (60 steps, a rebuild every few), none when it is turned off
    assert inner_calls > 60 and plain_calls == 0 and default_calls == 0
    for name in ("positions", "velocities", "forces"):
        np.testing.assert_array_equal(getattr(overlapped, name), getattr(plain, name), err_msg=name)


def test_every_backend_splits_the_forces_into_inner_and_edge_atoms_as_one_pass(fast_backend):
    """The device kernels too: each row of the split lists is summed as in the whole list."""
    cells, cutoff = small(fast_backend, 5, 3), small(fast_backend, 2.5, 2.0)
    reference = LennardJones(cells, temperature=1.44, cutoff=cutoff, backend="numpy", seed=5)
    melted = reference.step(reference.initial_state(), 0.005, 100)
    model = reference.with_backend(fast_backend)
    length = float(model.box[2])
    # one thick slab (inner atoms at least cutoff + skin from both faces) and a thin one for ghosts
    bricks = _slabs(model, (0.1, length - 0.1))
    host_block, host_ghosts = _brick_and_ghosts(reference, melted, bricks, 1)
    block = model.concat_blocks([host_block])
    ghosts = fast_backend.asarray(host_ghosts)
    *_, neighbors, _ = model.forces_with_ghosts(block, ghosts, rebuild=True)
    block = replace(block, neighbors=neighbors)
    edge = ~bricks.inside(np, host_block.positions, 1, model.ghost_radius())
    assert 0 < edge.sum() < block.size
    whole = model.forces_with_ghosts(block, ghosts, rebuild=False)
    split = model.split_neighbors(block, fast_backend.asarray(edge))
    inner = (split, model.inner_forces(block, split))
    in_two = model.forces_with_ghosts(block, ghosts, rebuild=False, inner=inner)
    for name, one, two in zip(("forces", "energies", "virials", "pair_counts"), whole[:4], in_two[:4]):
        np.testing.assert_array_equal(fast_backend.to_host(two), fast_backend.to_host(one), err_msg=name)


def test_md_bricks_give_the_atoms_back_in_the_order_of_the_state_that_was_split(client):
    model = LennardJones(4, temperature=1.0, backend="numpy", seed=1)
    base = model.initial_state()
    ids = np.arange(base.size)[::-1].copy()  # valid ids, not increasing
    state = model.state_from_arrays(base.positions, base.velocities, ids=ids)
    reference = Simulation(model, state, dt=0.005, stop_steps=5, progress=False).run()
    sim = Simulation(model, state, dt=0.005, stop_steps=5, progress=False, client=client, partitions=2).run()
    np.testing.assert_array_equal(sim.state.ids, ids)
    np.testing.assert_allclose(sim.state.positions, reference.state.positions, rtol=0, atol=1e-12)
    sim.close()


def test_a_state_without_a_list_is_split_by_position_and_every_rank_builds_on_its_first_step():
    model = LennardJones(4, temperature=1.0, backend="numpy", seed=1)
    state = replace(model.initial_state(), neighbors=None)
    decomposition = BrickDecomposition.build(model, 0.005, 2, None, None, False, grid=(2, 1, 1))
    domains = decomposition.split_state(model, state)
    assert [d.sends for d in domains] == [None, None] and sum(decomposition.counts) == model.n
    for p, domain in enumerate(domains):
        assert (decomposition.bricks.index(np, domain.state.positions[0], 0) == p).all()


@pytest.mark.parametrize("weights, match", [
    ([1, float("nan")], r"2 positive finite numbers \(one per partition\); got \[1, nan\] \(weights must be finite"),
    ([1, float("inf")], r"2 positive finite numbers \(one per partition\); got \[1, inf\]"),
    ([1, 10], r"grid=2x1x1 cuts the box \(8.398, 8.398, 8.398\) into bricks as thin as 0.76\d+ along x; "
              r".* at most 2x2x2 bricks fit, or use a bigger system, or weights closer to equal "
              r"\(weights=\[1.0, 10.0\]\)"),
])
def test_md_brick_weights_are_checked_and_named(client, weights, match):
    model = LennardJones(5, temperature=1.0, backend="numpy")  # box side 8.4: two bricks per axis at most
    with pytest.raises(ConfigError, match=match):
        Simulation(model, dt=0.005, client=client, partitions=2, weights=weights)


class _ThreadComm:
    """Ranks in threads of this process, messages through queues (enough for one rebuild exchange)."""

    def __init__(self, boxes, rank, size):
        self.boxes, self.rank, self.size = boxes, rank, size

    def _box(self, source, dest, tag):
        import queue

        return self.boxes.setdefault((source, dest, str(tag)), queue.Queue())

    def isend(self, obj, dest, tag):
        self._box(self.rank, dest, tag).put(obj)
        return None

    def irecv(self, source, tag):
        return self._box(source, self.rank, tag)

    def waitall(self, requests):
        return [None if r is None else r.get(timeout=2) for r in requests]  # a peer that raised: queue.Empty


def _rebuild_on_threads(decomposition, model, states):
    """Every rank's rebuild exchange run at once (threads): ``(state, sends, ghosts)`` or the error, per rank."""
    import threading
    from types import SimpleNamespace

    boxes, results = {}, [None] * len(states)

    def rank(p):
        context = SimpleNamespace(model=model, rank=p, comm=_ThreadComm(boxes, p, len(states)))
        try:
            if len(decomposition.bricks.split_axes) == 1:
                results[p] = decomposition._settle_slab(context, states[p])
            else:
                settled = decomposition._migrate(context, states[p])
                results[p] = (settled, *decomposition._borders(context, settled))
        except Exception as error:  # noqa: BLE001 - handed to the test
            results[p] = error

    threads = [threading.Thread(target=rank, args=(p,)) for p in range(len(states))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    return results


def _atoms_at(model, points, ids):
    block = model.select_atoms(model.initial_state(), np.arange(len(points)))
    return replace(block, positions=np.ascontiguousarray(np.asarray(points, dtype=float).T), ids=np.asarray(ids))


def _slab_states(model, heights):
    """Per rank, atoms at x = y = 1 and the given z, numbered across the ranks."""
    first = np.cumsum([0] + [len(h) for h in heights])
    return [_atoms_at(model, [(1.0, 1.0, z) for z in h], np.arange(first[p], first[p + 1]))
            for p, h in enumerate(heights)]


def _check_send_lists_give_the_ghosts(decomposition, results):
    """Each rank's ghosts are, neighbour by neighbour, the atoms each neighbour's send list picks."""
    bricks = decomposition.bricks
    for p, (state, sends, ghosts) in enumerate(results):
        assert len(set(state.ids.tolist())) == state.size
        expected = []
        for axis, stage in sends:
            for q in bricks.neighbours(p, axis):
                q_state, q_sends, q_ghosts = results[q]
                held = np.concatenate([q_state.positions, q_ghosts], axis=1)
                expected.append(held[:, dict(dict(q_sends)[axis])[p]])
        np.testing.assert_array_equal(ghosts, np.concatenate(expected, axis=1) if expected else ghosts)
        for axis in bricks.split_axes:  # every atom settled in its brick
            assert (bricks.index(np, state.positions[axis], axis) == bricks.coords(p)[axis]).all()


def test_a_slab_rebuild_sends_migrants_and_ghosts_in_one_message_and_refuses_atoms_that_crossed_a_slab():
    model = LennardJones(4, temperature=1.0, backend="numpy")  # ghost radius 2.5 + 0.3
    box = (30.0, 30.0, 30.0)
    decomposition = BrickDecomposition(Bricks(((0.0, 30.0), (0.0, 30.0), (0.0, 10.0, 20.0, 30.0)), box), (1.0,) * 3,
                                       0.005)
    z = [[5.0, 10.2, 8.5, 29.0], [10.5, 19.5, 15.0, 12.0, 9.9, 20.1], [25.0, 20.5, 19.8, 1.0]]
    results = _rebuild_on_threads(decomposition, model, _slab_states(model, z))
    _check_send_lists_give_the_ghosts(decomposition, results)
    assert [r[0].size for r in results] == [4, 6, 4]
    # an atom of partition 2 that reached 11.0 went into slab 1 within reach of slab 0: slab 0 cannot know it
    z[2][1] = 11.0
    errors = [r for r in _rebuild_on_threads(decomposition, model, _slab_states(model, z))
              if isinstance(r, Exception)]
    assert len(errors) == 1 and "partition 1: an atom from partition 2 came within the ghost radius of partition 0" \
        in str(errors[0])
    # four slabs: an atom of slab 0 found in slab 2 crossed a whole slab
    four = BrickDecomposition(Bricks(((0.0, 40.0), (0.0, 40.0), (0.0, 10.0, 20.0, 30.0, 40.0)), (40.0,) * 3),
                              (1.0,) * 4, 0.005)
    errors = [r for r in _rebuild_on_threads(four, model, _slab_states(model, [[5.0, 25.0], [15.0], [25.0], [35.0]]))
              if isinstance(r, UnstableSimulation)]
    assert len(errors) == 1 and "atoms [1] left partition 0 for a brick beyond its neighbours along z" in str(errors[0])


def test_a_staged_rebuild_settles_every_atom_and_sends_the_ghosts_its_lists_name():
    model = LennardJones(4, temperature=1.0, backend="numpy")
    box = (12.0, 9.0, 7.0)
    bricks = Bricks.weighted((3, 2, 1), box)
    decomposition = BrickDecomposition(bricks, (1.0,) * 6, 0.005)
    rng = np.random.default_rng(5)
    points = rng.uniform(0.0, 1.0, (600, 3)) * np.asarray(box)
    owner = np.array([bricks.rank(c) for c in _layers(bricks, points.T).T])
    # each rank holds its atoms, some of them moved up to 0.3 across its faces (migrants)
    moved = (points + rng.uniform(-0.3, 0.3, points.shape)) % np.asarray(box)
    states = [_atoms_at(model, moved[owner == p], np.nonzero(owner == p)[0]) for p in range(bricks.count)]
    results = _rebuild_on_threads(decomposition, model, states)
    assert not any(isinstance(r, Exception) for r in results)
    _check_send_lists_give_the_ghosts(decomposition, results)
    assert sorted(np.concatenate([r[0].ids for r in results]).tolist()) == list(range(600))
