"""Brick ranks build their own initial atoms: the client's split of the whole lattice, without the client."""

import numpy as np
import pytest

from hpcgpu import Simulation
from hpcgpu.partition.brick_start import candidate_cells, rank_start
from hpcgpu.partition.bricks import BrickDecomposition
from hpcgpu.partition.rank_state import InitialBlocks
from hpcgpu.partition.rebuild_flags import rebuild_delay
from hpcgpu.workloads.md import LennardJones
from hpcgpu.workloads.md import setup as md_setup


# 2x2x1 and 2x2x2: two layers (one neighbour); 3x2x1: three; 1x1x4: slabs with a rebuild delay
@pytest.mark.parametrize("cells, grid", [((6, 6, 3), (2, 2, 1)), ((6, 6, 6), (2, 2, 2)), ((9, 6, 3), (3, 2, 1)),
                                         ((3, 3, 12), (1, 1, 4))])
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_every_rank_builds_the_atoms_lists_and_ghosts_the_client_split_gives(cells, grid, dtype):
    model = LennardJones(cells, temperature=1.2, cutoff=2.0, backend="numpy", seed=5, dtype=dtype)
    whole = model.initial_state()
    decomposition = BrickDecomposition.build(model, 0.005, int(np.prod(grid)), None, None, False, grid=grid)
    split = decomposition.split(model, model.to_host(whole), model.listed_positions(whole))
    built = [decomposition.build_block(model, rank, InitialBlocks()) for rank in range(len(split))]
    sums = [decomposition.initial_report(model, block)["velocity_sums"] for block in built]
    assert sum(s["atoms"] for s in sums) == model.n
    settled = decomposition.settled(model, [decomposition.initial_report(model, block) for block in built])
    keep = not rebuild_delay(grid)
    for rank, (expected, block) in enumerate(zip(split, built)):
        state = settled.model_state(block)
        np.testing.assert_array_equal(state.ids, expected.state.ids)
        np.testing.assert_array_equal(state.positions, expected.state.positions)
        np.testing.assert_array_equal(state.velocities, expected.state.velocities)  # bitwise: same sums
        assert state.velocities.dtype == state.positions.dtype == model.dtype
        tolerance = 1e-12 if dtype == "float64" else 1e-5
        np.testing.assert_allclose(state.forces, expected.state.forces, rtol=0, atol=tolerance)
        np.testing.assert_allclose(state.energies, expected.state.energies, rtol=tolerance)
        if keep:
            np.testing.assert_array_equal(block.listed, expected.listed)
            assert [(axis, [q for q, _ in stage]) for axis, stage in block.sends] == \
                [(axis, [q for q, _ in stage]) for axis, stage in expected.sends]
            for (_, mine), (_, theirs) in zip(block.sends, expected.sends):
                for (_, a), (_, b) in zip(mine, theirs):
                    np.testing.assert_array_equal(a, b)
        else:
            assert block.sends is None and block.listed is None


def test_a_rank_lists_only_the_cells_near_its_brick():
    model = LennardJones((24, 4, 4), cutoff=2.0, backend="numpy")
    decomposition = BrickDecomposition.build(model, 0.005, 4, None, None, False, grid=(4, 1, 1))
    cells = candidate_cells(decomposition.bricks, 1, 0, model.ghost_radius(), 24)
    assert 6 <= len(cells) < 24 and {6, 11} <= set(cells.tolist())
    state, _, listed = rank_start(decomposition.bricks, model, 1, True)
    assert state.size == model.n // 4 and listed.shape[1] < model.n // 2


def test_lattice_and_velocities_are_pure_functions_of_the_atom_id():
    model = LennardJones(4, temperature=0.9, backend="numpy", seed=11)
    ids = np.array([255, 3, 100])
    np.testing.assert_array_equal(md_setup.fcc_positions(model.cells, model.box, ids),
                                  md_setup.fcc_lattice(model.cells, model.box)[:, ids])
    raw = md_setup.raw_velocities(np, np.arange(model.n), model.seed)
    np.testing.assert_array_equal(md_setup.raw_velocities(np, ids, model.seed), raw[:, ids])
    # any split of the sums gives the same normalisation, bitwise
    pieces = [md_setup.velocity_sums(raw[:, a:b]) for a, b in ((0, 7), (7, 130), (130, model.n))]
    assert md_setup.velocity_normalisation(pieces, 0.9) == md_setup.velocity_normalisation(
        [md_setup.velocity_sums(raw)], 0.9)


def test_a_two_by_two_brick_run_never_builds_the_whole_state_on_the_client(client, monkeypatch):
    model = LennardJones((6, 6, 3), temperature=1.2, cutoff=2.0, backend="numba", seed=7)
    reference = Simulation(model, dt=0.005, stop_steps=50, progress=False).run()
    calls = []
    whole = LennardJones.initial_state
    # (the warm-up's own 108-atom model may build its state: it is counted apart)
    monkeypatch.setattr(LennardJones, "initial_state", lambda self: calls.append(self.n) or whole(self))
    sim = Simulation(model, dt=0.005, stop_steps=50, progress=False, client=client,
                     partitions=4, grid=(2, 2, 1))
    try:
        assert model.n not in calls  # the ranks built their atoms
        assert sum(sim.summary()["atoms_per_partition"]) == model.n
        start = sim.state
        assert model.n not in calls
        np.testing.assert_allclose(start.velocities.sum(axis=1), 0.0, atol=1e-12)
        kinetic = 0.5 * float((start.velocities ** 2).sum())
        assert kinetic * 2 / (3 * model.n - 3) == pytest.approx(1.2, rel=1e-14)
        sim.run()
        assert model.n not in calls
        final, expected = sim.state, reference.state
        np.testing.assert_array_equal(final.ids, expected.ids)
        for name in ("positions", "velocities", "forces"):
            np.testing.assert_allclose(getattr(final, name), getattr(expected, name), rtol=0, atol=1e-12,
                                       err_msg=name)
        first = sim.diagnostics.isel(time=0)
        assert float(first["temperature"]) == pytest.approx(1.2, rel=1e-14)
        for axis in "xyz":
            assert abs(float(first[f"momentum_{axis}"])) < 1e-12
        np.testing.assert_array_equal(sim.diagnostics["neighbor_rebuilds"], reference.diagnostics["neighbor_rebuilds"])
    finally:
        sim.close()
