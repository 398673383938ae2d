"""All pairs on the engine: every position each step, the same answer as one process bitwise (KDK and DKD)."""

import numpy as np
import pytest

from hpcgpu import Simulation
from hpcgpu.errors import ConfigError
from hpcgpu.workloads.astro import NBody


@pytest.mark.parametrize("integrator", ["kdk", "dkd"])
@pytest.mark.parametrize("partitions", [2, 3])
def test_body_partitions_reproduce_the_single_run_bitwise(client, partitions, integrator):
    model = NBody("galaxy_collision", n=301, backend="numba", seed=5, integrator=integrator)
    state = model.initial_state()
    reference = Simulation(model, state, dt=0.005, stop_steps=40, diagnostics=10, progress=False).run()
    sim = Simulation(model, state, dt=0.005, stop_steps=40, diagnostics=10, progress=False, client=client,
                     partitions=partitions).run()
    for name in ("positions", "velocities", "accelerations", "potentials"):
        np.testing.assert_array_equal(getattr(sim.state, name), getattr(reference.state, name), err_msg=name)
    assert sim.diagnostics.sizes["time"] == 5
    expected = reference.diagnostics.sel(time=sim.diagnostics.time)
    for key in ("energy", "potential_energy", "virial_ratio", "momentum_x", "lagrangian_radius_50"):
        np.testing.assert_allclose(sim.diagnostics[key], expected[key], rtol=1e-12, atol=1e-15)
    assert sum(sim.summary()["bodies_per_partition"]) == 301
    if integrator == "dkd":  # the energy at the synchronised positions, from every block's positions
        final = model.state_from_arrays(sim.state.positions, sim.state.velocities, sim.state.masses)
        np.testing.assert_allclose(float(sim.diagnostics.energy[-1]), model.diagnostics(final)["energy"],
                                   rtol=1e-12)
    sim.close()


def test_a_step_moves_only_positions_one_allgather_per_step(client):
    """Each rank waits for messages once per step (the allgather) plus once per epoch for its timings."""
    model = NBody("plummer", n=96, backend="numba")
    sim = Simulation(model, dt=0.01, stop_steps=30, diagnostics=30, progress=False, client=client, partitions=2)
    sim.run()
    stats = sim._executor.epoch_stats
    assert sum(epoch["steps"] for epoch in stats) == 30 and len(stats[0]["ranks"]) == 2
    assert all(0 <= waited <= seconds for epoch in stats for seconds, waited, _ in epoch["ranks"])
    # the rank thread's CPU: positive, and at most its wall time (plus the clocks' ticks)
    assert all(0 < cpu <= seconds + 0.02 for epoch in stats for seconds, _, cpu in epoch["ranks"])
    sim.close()


def test_bodies_need_every_position_each_step(client):
    model = NBody("plummer", n=64, backend="numba")
    with pytest.raises(ConfigError, match="steps_per_task must be 1"):
        Simulation(model, dt=0.01, client=client, partitions=2, steps_per_task=4)
    with pytest.raises(ConfigError, match="weights='calibrate' is only available for grid models"):
        Simulation(model, dt=0.01, client=client, partitions=2, weights="calibrate")
    with pytest.raises(ConfigError, match="partitions must be <= 64"):
        Simulation(model, dt=0.01, client=client, partitions=65)
