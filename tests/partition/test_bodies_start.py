"""All-pairs ranks build their own bodies by id: the one-process start bitwise, nothing N-sized from the client."""

import pickle

import cloudpickle
import numpy as np
import pytest
from _support import small

from hpcgpu import Simulation
from hpcgpu.partition.all_pairs import AllPairsDecomposition
from hpcgpu.partition.bricks import BrickDecomposition
from hpcgpu.partition.rank_state import InitialBlocks
from hpcgpu.workloads.astro import NBody
from hpcgpu.workloads.md import LennardJones

FIELDS = ("positions", "velocities", "masses", "accelerations", "potentials")


def _built_on_ranks(model, partitions):
    """The start as ``partitions`` ranks build it: each block alone, then the client's normalisation."""
    decomposition = AllPairsDecomposition.build(model, 0.01, partitions, None, None, False)
    blocks = [decomposition.build_block(model, rank, InitialBlocks()) for rank in range(partitions)]
    reports = [decomposition.initial_report(model.with_backend("numpy"), block) for block in blocks]
    settled = decomposition.settled(model, reports)
    return model.to_host(model.concat_blocks([settled.model_state(block) for block in blocks]))


@pytest.mark.parametrize("case, n", [("plummer", 101), ("galaxy_collision", 77), ("kepler", 2)])
@pytest.mark.parametrize("backend", ["numpy", "numba"])
@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("partitions", [2, 3])
def test_bodies_built_on_2_and_3_ranks_are_the_one_process_start_bitwise(case, n, backend, dtype, partitions):
    model = NBody(case, n=n, backend=backend, dtype=dtype, seed=5)
    whole = model.to_host(model.initial_state())
    built = _built_on_ranks(model, min(partitions, n))
    for name in FIELDS:
        got, expected = getattr(built, name), getattr(whole, name)
        assert got.dtype == expected.dtype, name
        np.testing.assert_array_equal(got, expected, err_msg=name)


def test_every_backend_builds_the_rank_blocks_of_its_one_process_start_bitwise(backend, dtype):
    """The forces of a block's bodies from all positions are those of the whole set (GPU kernels too)."""
    model = NBody("galaxy_collision", n=small(backend, 300, 12), backend=backend, dtype=dtype, seed=8)
    whole = model.to_host(model.initial_state())
    built = _built_on_ranks(model, 3)
    for name in FIELDS:
        np.testing.assert_array_equal(getattr(built, name), getattr(whole, name), err_msg=name)


def test_a_rank_block_holds_only_its_bodies_and_raw_velocities_until_settled():
    model = NBody("plummer", n=90, backend="numpy", seed=2)
    decomposition = AllPairsDecomposition.build(model, 0.01, 3, None, None, False)
    block = decomposition.build_block(model, 1, InitialBlocks())
    assert block.raw_from == 30 and block.state.size == 30
    assert block.state.velocities.dtype == np.float64  # raw: the momentum is removed once every rank reported
    report = decomposition.initial_report(model, block)
    assert len(pickle.dumps(report)) < 2000  # exact sums and the health: small, whatever N
    with pytest.raises(Exception, match="initial condition only"):
        decomposition.build_block(model, 0, object())


@pytest.mark.parametrize("partitions, softening", [(2, None), (3, 0.0)])
def test_a_body_run_on_the_cluster_never_builds_or_sends_the_bodies(client, monkeypatch, partitions, softening):
    """The ranks build their bodies; the client sends only small tasks; the run is the one-process run bitwise.

    ``dt`` is chosen from the start (no softening: the CFL number reads the
    velocities, reported again once settled) as one process chooses it.
    """
    model = NBody("plummer", n=2000, backend="numba", seed=9, softening=softening)
    reference = Simulation(model, stop_steps=6, diagnostics=3, progress=False).run()
    built = []
    real = NBody.initial_state
    # (the warm-up's own 16-body model may build its state: it is counted apart)
    monkeypatch.setattr(NBody, "initial_state", lambda self: built.append(self.n) or real(self))
    sent = []
    submit, scatter = client.submit, client.scatter

    def measured(send, payload):
        def wrapper(*args, **kwargs):
            sent.append((send.__name__, len(cloudpickle.dumps(payload(args)))))
            return send(*args, **kwargs)
        return wrapper

    monkeypatch.setattr(client, "submit", measured(submit, lambda args: args[1:]))  # the task's arguments
    monkeypatch.setattr(client, "scatter", measured(scatter, lambda args: args[0]))  # the data scattered
    sim = Simulation(model, stop_steps=6, diagnostics=3, progress=False, client=client, partitions=partitions)
    try:
        assert sim.dt == reference.dt  # bitwise: the same health as one process
        assert sum(sim.summary()["bodies_per_partition"]) == model.n
        sim.run()
        assert model.n not in built
        assert sent, "the client sent the build, the spec and the epochs"
        largest = max(size for _, size in sent)
        # positions alone are 3 N float64 = 48 kB: what travels is a model, a layout and futures
        assert largest < 8000, f"the client sent {largest} bytes at once: {sent}"
        for name in FIELDS:
            np.testing.assert_array_equal(getattr(sim.state, name), getattr(reference.state, name), err_msg=name)
        for key in ("energy", "virial_ratio", "momentum_x", "lagrangian_radius_50"):
            np.testing.assert_array_equal(sim.diagnostics[key], reference.diagnostics[key], err_msg=key)
    finally:
        sim.close()


def test_the_spec_broadcast_holds_nothing_that_grows_with_the_state():
    """A brick split on the client keeps the atom order for its join; the ranks' copy of the layout does not."""
    model = LennardJones((6, 6, 6), temperature=1.0, cutoff=2.0, backend="numpy", seed=3)
    state = model.initial_state()
    decomposition = BrickDecomposition.build(model, 0.005, 2, None, None, False)
    blocks = decomposition.split(model, model.to_host(state))
    assert decomposition.order.shape == (model.n,)
    for_ranks = decomposition.for_ranks()
    assert for_ranks.order is None and for_ranks.bricks == decomposition.bricks
    assert len(pickle.dumps(for_ranks)) < 2000 < len(pickle.dumps(decomposition))
    joined = decomposition.join(model, [block.state for block in blocks])
    np.testing.assert_array_equal(joined.ids, state.ids)
    bodies = AllPairsDecomposition.build(NBody("plummer", n=10**5, backend="numpy"), 0.01, 4, None, None, False)
    assert bodies.for_ranks() is bodies and len(pickle.dumps(bodies)) < 1000
