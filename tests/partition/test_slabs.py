"""Slabs on the engine: ghosts, migration and one rebuild decision; the single run to rounding."""

from dataclasses import replace

import numpy as np
import pytest
from _support import small

from hpcgpu import Simulation
from hpcgpu.errors import ConfigError, UnstableSimulation
from hpcgpu.partition.slabs import Slabs, _send_lists
from hpcgpu.workloads.md import LennardJones


@pytest.fixture(scope="module")
def liquid():
    """A melted Lennard-Jones liquid (from the fcc lattice, 400 local steps)."""

    def make(n_cells, thermostat):
        model = LennardJones(n_cells, temperature=1.44, thermostat=thermostat, backend="numba", seed=3)
        return model, model.step(model.initial_state(), 0.005, 400)

    return make


# 2 and 3 slabs: every rank a neighbour, the rebuild flag travels with the ghosts; 4: the allreduce
@pytest.mark.parametrize("partitions, thermostat", [(2, "none"), (3, "none"), (4, "none"), (2, "langevin")])
def test_md_slabs_reproduce_the_single_run_with_atoms_migrating(client, liquid, partitions, thermostat):
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
    for key in ("energy", "temperature", "pressure", "msd"):
        np.testing.assert_allclose(sim.diagnostics[key], expected[key], rtol=1e-10, err_msg=key)
    # the slabs start from the split state's list: they rebuild at the steps one process does
    np.testing.assert_array_equal(sim.diagnostics["neighbor_rebuilds"], expected["neighbor_rebuilds"])
    assert sim.state.rebuilds == reference.state.rebuilds > state.rebuilds
    summary = sim.summary()
    assert sum(summary["atoms_per_partition"]) == model.n and len(summary["slab_edges"]) == partitions + 1
    # Atoms crossed slab borders (they migrated between partitions) during the run.
    slab = np.searchsorted(summary["slab_edges"][1:-1], state.positions[2], side="right")
    slab_after = np.searchsorted(summary["slab_edges"][1:-1], sim.state.positions[2], side="right")
    assert (slab != slab_after).sum() > 0
    sim.close()


def test_md_slabs_refuse_slabs_thinner_than_the_ghost_radius(client):
    model = LennardJones(5, temperature=1.0, backend="numba")  # box side 8.4: two slabs at most
    with pytest.raises(ConfigError, match=r"partitions=3 .* at least cutoff \+ 2 skin = 3.1.* at most 2 partitions"):
        Simulation(model, dt=0.005, client=client, partitions=3)
    with pytest.raises(ConfigError, match="steps_per_task must be 1 for md"):
        Simulation(model, dt=0.005, client=client, partitions=2, steps_per_task=2)
    with pytest.raises(ConfigError, match="weights='calibrate' is only available for grid models"):
        Simulation(model, dt=0.005, client=client, partitions=2, weights="calibrate")


def test_slabs_find_ghosts_across_the_periodic_edge():
    slabs = Slabs((0.0, 4.0, 8.0, 12.0), axis=2, length=12.0)
    z = np.array([0.5, 3.9, 4.0, 7.0, 8.5, 11.9])
    assert slabs.of(np, z).tolist() == [0, 0, 1, 1, 2, 2]
    # slab 0 sees the top of slab 2 through the periodic edge and the bottom of slab 1
    assert slabs.near(np, z, 0, 1.0).tolist() == [True, True, True, False, False, True]
    assert slabs.neighbours(0) == (1, 2) and Slabs((0.0, 6.0, 12.0), 2, 12.0).neighbours(1) == (0,)


def test_a_rebuild_keeps_ghost_lists_in_the_order_the_neighbours_assembled():
    model = LennardJones(4, temperature=1.0, backend="numpy")  # ghost radius 2.5 + 0.3
    slabs = Slabs((0.0, 10.0, 20.0, 30.0), axis=2, length=30.0)

    def settled(z):
        block = model.select_atoms(model.initial_state(), np.arange(len(z)))
        positions = block.positions.copy()
        positions[2] = z
        return replace(block, positions=positions)

    # partition 1 after settling: four staying atoms, then one from slab 0 and one from slab 2
    state = settled([10.5, 19.5, 15.0, 12.0, 10.1, 19.9])
    arrivals = [model.select_atoms(state, np.array([4])), model.select_atoms(state, np.array([5]))]
    sends = _send_lists(model, slabs, 1, state, 4, arrivals)
    assert [s.tolist() for s in sends] == [[0, 3, 4], [1, 5]]
    # an atom from slab 2 that ended up near slab 0: slab 0 could not have assembled it
    state = settled([10.5, 19.5, 15.0, 12.0, 10.1, 11.0])
    with pytest.raises(UnstableSimulation, match="partition 1: the ghosts of partition 0"):
        _send_lists(model, slabs, 1, state, 4, arrivals)


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


def _slab_and_ghosts(model, state, slabs, p):
    """The atoms of slab ``p`` and, as its ghosts, every other atom within the ghost radius."""
    z = state.positions[2]
    own = np.nonzero(slabs.of(np, z) == p)[0]
    near = np.nonzero(slabs.near(np, z, p, model.ghost_radius()) & (slabs.of(np, z) != p))[0]
    return model.select_atoms(state, own), state.positions[:, near]


@pytest.mark.parametrize("backend", ["numba", "numpy"])
def test_inner_forces_then_the_edge_atoms_equal_the_forces_in_one_pass(liquid, backend):
    model, state = liquid(8, "none")  # box side 13.4: a slab of 7 has inner atoms (2.8 from both faces)
    model = model.with_backend(backend) if backend != "numba" else model
    length = float(model.box[2])
    slabs = Slabs((0.0, 2.0, 9.0, length), axis=2, length=length)
    block, ghosts = _slab_and_ghosts(model, model.to_host(state), slabs, 1)
    *_, neighbors, _ = model.slabs.forces_with_ghosts(block, ghosts, rebuild=True)
    block = replace(block, neighbors=neighbors)
    edge = ~slabs.inside(np, block.positions[2], 1, model.ghost_radius())
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
    whole = model.slabs.forces_with_ghosts(block, ghosts, rebuild=False)
    split = model.split_neighbors(block, edge)
    np.testing.assert_array_equal(np.asarray(split.inner.counts) + np.asarray(split.edge.counts),
                                  np.asarray(neighbors.counts))
    inner = model.inner_forces(block, split)
    in_two = model.slabs.forces_with_ghosts(block, ghosts, rebuild=False, inner=(split, inner))
    for name, one, two in zip(("forces", "energies", "virials"), whole[:3], in_two[:3]):
        if backend == "numba":  # each row summed in the same order: bitwise
            np.testing.assert_array_equal(two, one, err_msg=name)
        else:  # the NumPy reference pads rows to the longest of a chunk: to rounding
            np.testing.assert_allclose(two, one, rtol=1e-12, atol=1e-12, err_msg=name)
    assert in_two[3] is neighbors
    with pytest.raises(ConfigError, match="the ghosts changed without a neighbour-list rebuild"):
        model.slabs.forces_with_ghosts(block, ghosts[:, 1:], rebuild=False, inner=(split, inner))


def test_md_slabs_overlap_their_ghosts_and_match_the_run_that_does_not(liquid, monkeypatch):
    """Two ranks in this process (threads): the overlapped run takes the inner path and ends bitwise
    where a run that never overlaps ends."""
    from distributed import Client, LocalCluster

    from hpcgpu.partition import slabs as slab_module
    from hpcgpu.workloads.md.domains import SlabDomains

    model, state = liquid(8, "none")  # two slabs of 6.7: inner atoms in the middle of each
    calls = []
    original = SlabDomains.inner_forces

    def counted(self, block, split):
        calls.append(block.size)
        return original(self, block, split)

    monkeypatch.setattr(SlabDomains, "inner_forces", counted)
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=False, dashboard_address=None) as cluster, \
            Client(cluster) as client:
        finals = []
        # forced on (on GPUs by default), turned off by its threshold, and numba's default (off)
        for on_cpu, below in ((True, slab_module.SPECULATE_BELOW), (True, 0.0), (slab_module.SPECULATE_ON_CPU, 0.8)):
            monkeypatch.setattr(slab_module, "SPECULATE_ON_CPU", on_cpu)
            monkeypatch.setattr(slab_module, "SPECULATE_BELOW", below)
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
    slabs = Slabs((0.0, 0.1, length - 0.1, length), axis=2, length=length)
    host_block, host_ghosts = _slab_and_ghosts(reference, melted, slabs, 1)
    block = model.concat_blocks([host_block])
    ghosts = fast_backend.asarray(host_ghosts)
    *_, neighbors, _ = model.slabs.forces_with_ghosts(block, ghosts, rebuild=True)
    block = replace(block, neighbors=neighbors)
    edge = ~slabs.inside(np, host_block.positions[2], 1, model.ghost_radius())
    assert 0 < edge.sum() < block.size
    whole = model.slabs.forces_with_ghosts(block, ghosts, rebuild=False)
    split = model.split_neighbors(block, fast_backend.asarray(edge))
    inner = (split, model.inner_forces(block, split))
    in_two = model.slabs.forces_with_ghosts(block, ghosts, rebuild=False, inner=inner)
    for name, one, two in zip(("forces", "energies", "virials"), whole[:3], in_two[:3]):
        np.testing.assert_array_equal(fast_backend.to_host(two), fast_backend.to_host(one), err_msg=name)


def test_md_slabs_give_the_atoms_back_in_the_order_of_the_state_that_was_split(client):
    model = LennardJones(4, temperature=1.0, backend="numpy", seed=1)
    base = model.initial_state()
    ids = np.arange(base.size)[::-1].copy()  # valid ids, not increasing
    state = model.state_from_arrays(base.positions, base.velocities, ids=ids)
    reference = Simulation(model, state, dt=0.005, stop_steps=5, progress=False).run()
    sim = Simulation(model, state, dt=0.005, stop_steps=5, progress=False, client=client, partitions=2).run()
    np.testing.assert_array_equal(sim.state.ids, ids)
    np.testing.assert_allclose(sim.state.positions, reference.state.positions, rtol=0, atol=1e-12)
    sim.close()


@pytest.mark.parametrize("weights, match", [
    ([1, float("nan")], r"2 positive finite numbers \(one per partition\); got \[1, nan\] \(weights must be finite"),
    ([1, float("inf")], r"2 positive finite numbers \(one per partition\); got \[1, inf\]"),
    ([1, 10], r"at most 2 partitions or a bigger system, or weights closer to equal \(weights=\[1.0, 10.0\] "
              r"give slabs of 0.7\d+, 7.\d+\)"),
])
def test_md_slab_weights_are_checked_and_named(client, weights, match):
    model = LennardJones(5, temperature=1.0, backend="numpy")  # box side 8.4: two slabs at most
    with pytest.raises(ConfigError, match=match):
        Simulation(model, dt=0.005, client=client, partitions=2, weights=weights)
