"""Reductions on the ranks: parts summed up to the client; MD's g(r) on bricks equals the one-process g(r)."""

import numpy as np
import pytest

from hpcgpu import Simulation
from hpcgpu.errors import ClusterError, ConfigError
from hpcgpu.partition.rank_reductions import combine_parts, reduction_operation, take_reduction
from hpcgpu.workloads.md import LennardJones, run_rdf


def atoms_owned(rank, block):
    """A rank's part: how many atoms it owns, and its rank in a one-hot array of the ranks."""
    state = block if rank.decomposition is None else rank.decomposition.model_state(block)
    one_hot = np.zeros(rank.size)
    one_hot[rank.rank] = 1.0
    return {"atoms": state.size, "ranks": one_hot}


def test_parts_sum_key_by_key_in_rank_order():
    total = combine_parts([{"n": 1, "h": np.array([1.0, 0.0])}, {"n": 2, "h": np.array([0.5, 2.0])}])
    assert total["n"] == 3
    np.testing.assert_array_equal(total["h"], [1.5, 2.0])
    first = np.array([1.0])
    combine_parts([first, np.array([2.0])])
    assert first[0] == 1.0  # the first part is not summed into
    with pytest.raises(ConfigError, match="keys"):
        combine_parts([{"a": 1}, {"b": 1}])


def test_a_reduction_takes_a_function_and_only_its_own_record():
    with pytest.raises(ConfigError, match="callable"):
        reduction_operation(0, "atoms_owned", ())
    operation = reduction_operation(5, atoms_owned, ())
    other = reduction_operation(5, atoms_owned, ())
    ready = [("diagnostics", 5, {"energy": 1.0}), ("reduced", 5, (other[1][1], 7)),
             ("reduced", 5, (operation[1][1], 3))]
    value, rest = take_reduction(ready, operation)
    assert value == 3 and rest == ready[:2]
    with pytest.raises(ClusterError, match="did not run"):
        take_reduction(rest[:1], operation)


def test_a_local_run_reduces_its_whole_state_as_one_rank():
    sim = Simulation(LennardJones(3, backend="numpy"), dt=0.005, stop_steps=2, progress=False)
    total = sim.executor.reduce_on_ranks(atoms_owned)
    assert total["atoms"] == sim.model.n
    np.testing.assert_array_equal(total["ranks"], [1.0])


@pytest.fixture(scope="module")
def liquid():
    """500 atoms melted for 300 steps on one process (numba): a liquid with atoms near every brick face."""
    model = LennardJones(5, temperature=1.44, backend="numba", seed=7)
    return model, model.step(model.initial_state(), 0.005, 300)


def test_rdf_on_2x2x1_bricks_equals_the_one_process_rdf(client, liquid):
    model, state = liquid
    local = Simulation(model, state, dt=0.005, progress=False)
    # diagnostics queued around the reductions stay the driver's
    sim = Simulation(model, state, dt=0.005, progress=False, client=client, partitions=4, grid=(2, 2, 1),
                     diagnostics=5)
    try:
        local.run(30)
        samples = []
        sim.add_callback(lambda s: samples.append(run_rdf(s, bins=64)), 10, name="rdf")
        sim.run(30)
        assert len(samples) == 4  # steps 0, 10, 20, 30
        parts = sim.executor.reduce_on_ranks(atoms_owned)
        r, g = run_rdf(sim, bins=64)
        gathered = sim.state
        assert sim.diagnostics.sizes["time"] == 7  # steps 0, 5, ..., 30: none taken by a reduction
    finally:
        sim.close()
    assert parts["atoms"] == model.n
    np.testing.assert_array_equal(parts["ranks"], [1.0, 1.0, 1.0, 1.0])  # every rank took part once
    # the same positions: the same pair counts, exactly, and so the same g(r)
    expected_r, expected_g = model.rdf(gathered, bins=64)
    np.testing.assert_array_equal(r, expected_r)
    np.testing.assert_array_equal(g, expected_g)
    np.testing.assert_array_equal(samples[-1][1], expected_g)
    # the one-process run, whose positions differ by rounding: the same counts but for a pair at a bin edge
    # (which moves between two bins, counted twice)
    counts = model.rdf_counts(gathered, 64, model.cutoff)
    reference = local.model.rdf_counts(local.state, 64, model.cutoff)
    assert np.abs(counts - reference).max() <= 2 and (counts != reference).sum() <= 4
    assert g.max() > 2.0  # a liquid's first peak


def test_rdf_beyond_the_cutoff_on_bricks_is_refused_before_the_ranks_run(client, liquid):
    model, state = liquid
    sim = Simulation(model, state, dt=0.005, progress=False, client=client, partitions=2)
    try:
        with pytest.raises(ConfigError, match="r_max must be <= the cutoff"):
            run_rdf(sim, r_max=model.cutoff + 0.5)
        _, g = run_rdf(sim, bins=32)  # the run goes on
    finally:
        sim.close()
    np.testing.assert_array_equal(g, model.rdf(state, bins=32)[1])
