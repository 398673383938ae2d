"""Partitioned runs on a real dask cluster: same answer as one block, state stays on workers."""

import os
import signal
import time

import numpy as np
import pytest
from dask.sizeof import sizeof

from hpcgpu import Simulation
from hpcgpu.cluster import cluster
from hpcgpu.distributed import split_rows
from hpcgpu.errors import ClusterError, ConfigError
from hpcgpu.workloads.weather import ShallowWater


def _reference(model, state, dt, steps):
    return Simulation(model, state, dt=dt, stop_steps=steps, progress=False).run()


def _assert_same(result, reference):
    for name in ("u", "v", "h"):
        np.testing.assert_array_equal(getattr(result.state, name), getattr(reference.state, name), err_msg=name)


def _cut_and_advance(model, state, bounds, steps, blocks=None):
    """One superstep of every row block in-process, as the executor's tasks do it."""
    from hpcgpu.rows import _advance_block, _first_rows, _last_rows

    blocks = blocks or [model.take_block(state, a, b) for a, b in bounds]
    south_width, north_width = model.halo_rows(steps)
    count = len(blocks)
    return [_advance_block(model, 30.0, steps, block, _last_rows(model, blocks[(p - 1) % count], south_width),
                           _first_rows(model, blocks[(p + 1) % count], north_width), bounds[p][0])
            for p, block in enumerate(blocks)]


@pytest.mark.parametrize("backend", ["numpy", "numba"])
def test_resident_blocks_take_their_halos_in_place_and_match_one_block(backend):
    model = ShallowWater("turbulence", nx=24, ny=40, backend=backend)
    state = model.initial_state()
    bounds = [(0, 17), (17, 40)]
    first = _cut_and_advance(model, state, bounds, 2)
    # the result of a task keeps spare rows for the next halos: assembling
    # writes them there instead of copying the block
    below, above = model.halo_rows(2)
    south, north = model.take_block(first[1], 23 - below, 23), model.take_block(first[1], 0, above)
    assembled = model.assemble_rows(south, first[0], north)
    assert assembled.h.shape == (below + 17 + above, 24)
    assert all(np.shares_memory(a, b) for a, b in zip(assembled.arrays(), first[0].arrays()))
    np.testing.assert_array_equal(assembled.h[:below], south.h)
    np.testing.assert_array_equal(assembled.h[below:below + 17], first[0].h)
    # other halo widths do not fit the spare rows: new arrays
    assert not np.shares_memory(model.assemble_rows(south, first[0], None).h, first[0].h)
    # a block without spare rows (as after a transfer) is concatenated into new arrays
    compact = model.take_block(first[0], 0, 17)
    copied = model.assemble_rows(south, compact, north)
    assert not np.shares_memory(copied.h, compact.h)
    np.testing.assert_array_equal(copied.h, assembled.h)
    second = _cut_and_advance(model, state, bounds, 2, blocks=first)
    reference = model.step(state, 30.0, steps=4)
    np.testing.assert_array_equal(np.concatenate([b.h for b in second]), model.backend.to_host(reference.h))
    np.testing.assert_array_equal(np.concatenate([b.u for b in second]), model.backend.to_host(reference.u))


def test_released_task_results_are_reused_and_held_ones_never_overwritten():
    import weakref

    model = ShallowWater("turbulence", nx=24, ny=40, backend="numpy")
    state = model.initial_state()
    bounds = [(0, 17), (17, 40)]
    blocks = _cut_and_advance(model, state, bounds, 2)
    held = blocks[0].h  # a view still in use: its arrays must never be handed out again
    kept = held.copy()
    generations = []
    for _ in range(4):
        blocks = _cut_and_advance(model, state, bounds, 2, blocks=blocks)
        generations.append([weakref.ref(a.base) for b in blocks for a in b.arrays()])
    np.testing.assert_array_equal(held, kept)
    # superstep n writes into the arrays of superstep n - 2, released by then
    assert all(ref() is not None for ref in generations[0])
    assert {id(ref()) for ref in generations[2]} == {id(ref()) for ref in generations[0]}
    assert all(ref() is not held.base for generation in generations for ref in generation)
    reference = model.step(state, 30.0, steps=10)
    for name in ("h", "u", "v"):
        np.testing.assert_array_equal(np.concatenate([getattr(b, name) for b in blocks]), getattr(reference, name))


def test_open_edges_step_only_the_rows_that_stay_valid():
    from hpcgpu.workloads.weather import STAGE_REACH

    model = ShallowWater("turbulence", nx=16, ny=48, backend="numpy")
    state = model.initial_state()
    calls = []
    kernels = model.backend.kernels("stencil")
    original = kernels.shallow_water_stage

    def recording(*args):
        calls.append(args[0].shape[0])
        return original(*args)

    kernels.shallow_water_stage = recording
    try:
        model.advance_rows(state, 30.0, 2, 0, south_open=True, north_open=True)
        model.advance_rows(state, 30.0, 1, 0, south_open=False, north_open=False)
    finally:
        kernels.shallow_water_stage = original
    shrink = sum(STAGE_REACH)
    assert calls == [48 - shrink * s for s in range(6)] + [48, 48, 48]


@pytest.mark.parametrize("partitions", [1, 2, 3, 4])
def test_partitions_reproduce_the_single_block_run_bitwise(client, partitions):
    # 61 rows: uneven blocks for 2, 3 and 4 partitions
    model = ShallowWater("unstable_jet", nx=40, ny=61, backend="numba")
    state = model.initial_state()
    dt = model.suggested_dt(state)
    reference = _reference(model, state, dt, 200)
    sim = Simulation(model, state, dt=dt, stop_steps=200, progress=False, client=client,
                     partitions=partitions, steps_per_task=2)
    sim.run()
    _assert_same(sim, reference)
    rows = sim.summary()["rows_per_partition"]
    assert sum(rows) == 61 and max(rows) - min(rows) <= 1
    diagnostics, expected = sim.diagnostics, reference.diagnostics.sel(time=sim.diagnostics.time)
    for key in ("mass", "energy", "enstrophy", "max_cfl"):
        np.testing.assert_allclose(diagnostics[key], expected[key], rtol=1e-12)


@pytest.mark.parametrize("steps_per_task", [1, 4, 16])
def test_steps_per_task_reproduce_the_single_block_run_bitwise(client, steps_per_task):
    # 16 steps per task read 96 rows south of a block: 4 blocks need >= 384 rows.
    model = ShallowWater("turbulence", nx=24, ny=401, backend="numba", Lx=2.4e5, Ly=4.01e6)
    state = model.initial_state()
    dt = model.suggested_dt(state)
    reference = _reference(model, state, dt, 203)  # not a multiple of K: a last, shorter superstep
    sim = Simulation(model, state, dt=dt, stop_steps=203, progress=False, client=client,
                     partitions=4, steps_per_task=steps_per_task)
    sim.run()
    _assert_same(sim, reference)


def test_grids_take_as_many_steps_per_task_as_their_halos_allow(client):
    from hpcgpu.rows import auto_steps_per_task

    tall = ShallowWater("turbulence", nx=16, ny=800, backend="numba")  # 400 rows a block: K = 16
    short = ShallowWater("turbulence", nx=16, ny=100, backend="numba")  # 50 rows: 4 x 6K <= 50 for K = 2
    assert auto_steps_per_task(tall, 2) == 16 and auto_steps_per_task(short, 2) == 2
    assert auto_steps_per_task(short, 10) == 1
    for model, k in ((tall, 16), (short, 2)):
        sim = Simulation(model, dt=10.0, stop_steps=k, progress=False, client=client, partitions=2)
        assert sim.summary()["steps_per_task"] == k
        reference = _reference(model, model.initial_state(), 10.0, k)
        _assert_same(sim.run(), reference)


def test_periodic_channel_and_walls_both_partition(client):
    for case in ("gravity_wave", "rest"):
        model = ShallowWater(case, nx=24, ny=40, backend="numba")
        state = model.initial_state()
        dt = model.suggested_dt(state) if case != "rest" else 60.0
        reference = _reference(model, state, dt, 30)
        sim = Simulation(model, state, dt=dt, stop_steps=30, progress=False, client=client, partitions=3,
                         steps_per_task=2).run()
        _assert_same(sim, reference)


def test_state_is_not_moved_to_the_client_during_a_run(client):
    model = ShallowWater("unstable_jet", nx=64, ny=64, backend="numba")
    state = model.initial_state()
    field_bytes = state.h.nbytes
    received = []
    original = client.gather

    def counting_gather(futures, *args, **kwargs):
        result = original(futures, *args, **kwargs)
        received.append((sizeof(result), _holds_array(result)))
        return result

    client.gather = counting_gather
    try:
        sim = Simulation(model, state, dt=model.suggested_dt(state), stop_steps=120, progress=False,
                         client=client, partitions=2, steps_per_task=4, diagnostics=8, check=4)
        sim.run()
        assert len(sim.diagnostics["time"]) >= 10
    finally:
        client.gather = original
    assert received, "diagnostics and checks travel to the client"
    assert not any(holds for _, holds in received), "an array reached the client"
    largest = max(size for size, _ in received)
    assert largest < 4096 < field_bytes, f"the client received {largest} bytes at once"


def _holds_array(value):
    if isinstance(value, np.ndarray) or hasattr(value, "__cuda_array_interface__"):
        return True
    if isinstance(value, dict):
        return any(_holds_array(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return any(_holds_array(v) for v in value)
    return hasattr(value, "arrays")


def test_weighted_partitions_follow_the_weights():
    assert split_rows(101, [3, 1]) == [(0, 76), (76, 101)]
    # a block too small for the halo is raised to it; the others keep their proportions
    assert split_rows(100, [1, 50, 50], minimum=10) == [(0, 10), (10, 55), (55, 100)]
    for rows in (100, 101, 257):
        (a, b), (c, d) = split_rows(rows, [3.0, 1.0])
        assert abs((b - a) - 3 * (d - c)) <= 4  # within one row of 3:1 each
        assert abs((b - a) - 0.75 * rows) <= 1


def test_calibrated_rates_leave_room_for_the_halo_work_of_each_block():
    from types import SimpleNamespace

    from hpcgpu.rows import RowExecutor

    model = ShallowWater("unstable_jet", nx=40, ny=400, backend="numpy")
    executor = SimpleNamespace(model=model, steps_per_task=4)
    weights = RowExecutor._weights_from_rates(executor, [2.0, 1.0])
    extra = sum(model.halo_rows(4)) / 2
    # each block's stepped rows (its own plus half its halo) follow the rates
    assert sum(weights) == pytest.approx(400)
    assert (weights[0] + extra) / (weights[1] + extra) == pytest.approx(2.0)
    assert weights[0] / weights[1] > 2.0
    assert RowExecutor._weights_from_rates(executor, [1.0, 1.0, 1.0]) == pytest.approx([400 / 3] * 3)


def test_host_halo_cuts_are_views_of_the_block_and_stay_untouched_by_the_next_advance():
    from hpcgpu.rows import _advance_block, _first_rows, _last_rows

    model = ShallowWater("unstable_jet", nx=32, ny=48, backend="numba", dtype="float64")
    state = model.initial_state()
    dt = model.suggested_dt(state, 0.4)
    south_width, north_width = model.halo_rows(2)
    rows = model.take_block(state, 16, 32)
    south, north = model.take_block(state, 16 - south_width, 16), model.take_block(state, 32, 32 + north_width)
    block = _advance_block(model, dt, 2, rows, south, north, 16)
    first, last = _first_rows(model, block, north_width), _last_rows(model, block, south_width)
    assert all(np.shares_memory(a, b) for a, b in zip(first.arrays(), block.arrays()))
    assert all(np.shares_memory(a, b) for a, b in zip(last.arrays(), block.arrays()))
    kept = [a.copy() for a in (*first.arrays(), *last.arrays())]
    # the next superstep writes its halos around the block, not into the rows cut from it
    _advance_block(model, dt, 2, block, south, north, 16)
    assert all(np.array_equal(a, b) for a, b in zip(kept, (*first.arrays(), *last.arrays())))


def test_an_emulated_slow_worker_sleeps_in_proportion(monkeypatch):
    from hpcgpu.distributed import SLOWDOWN_ENV, _emulate_slowdown

    monkeypatch.setenv(SLOWDOWN_ENV, "3")
    started = time.perf_counter()
    time.sleep(0.02)
    _emulate_slowdown(started)
    assert time.perf_counter() - started >= 3 * 0.02
    monkeypatch.setenv(SLOWDOWN_ENV, "1")
    started = time.perf_counter()
    _emulate_slowdown(started)
    assert time.perf_counter() - started < 0.01


def test_weights_reach_the_partitions(client):
    model = ShallowWater("unstable_jet", nx=16, ny=80, backend="numba")
    sim = Simulation(model, dt=100.0, stop_steps=4, progress=False, client=client, partitions=2,
                     weights=[3, 1])
    assert sim.summary()["rows_per_partition"] == [60, 20]
    calibrated = Simulation(model, dt=100.0, stop_steps=4, progress=False, client=client, partitions=2,
                            weights="calibrate")
    rates = calibrated._executor.rates
    assert len(rates) == 2 and all(rate > 0 for rate in rates.values())
    assert sum(calibrated.summary()["rows_per_partition"]) == 80


def test_dashboard_names_tasks_and_the_run(client):
    model = ShallowWater("unstable_jet", nx=16, ny=40, backend="numba")
    Simulation(model, dt=100.0, stop_steps=6, progress=False, client=client, partitions=2, steps_per_task=3,
               name="named-jet-run").run()

    def names(dask_scheduler):
        spans = dask_scheduler.extensions["spans"]
        return sorted(dask_scheduler.task_prefixes), sorted({s.name[-1] for s in spans.spans.values()})

    prefixes, spans = client.run_on_scheduler(names)
    assert {"weather-advance", "weather-halo", "weather-health", "weather-diagnostics"} <= set(prefixes)
    assert "named-jet-run" in spans


@pytest.mark.parametrize("kwargs, match", [
    (dict(partitions=41), "partitions must be <= 40"),
    (dict(partitions=4, steps_per_task=4), "needs at least 96 rows"),
    (dict(partitions=0), "partitions must be >= 1"),
    (dict(partitions=2, steps_per_task=0), "steps_per_task must be >= 1"),
    (dict(partitions=2, weights=[1, 2, 3]), "one entry per partition"),
    (dict(partitions=2, weights=[1, -1]), "weights must be positive"),
])
def test_bad_partitioning_names_the_parameter(client, kwargs, match):
    model = ShallowWater("unstable_jet", nx=16, ny=40, backend="numba")
    with pytest.raises(ConfigError, match=match):
        Simulation(model, dt=100.0, stop_steps=4, progress=False, client=client, **kwargs)


def test_partitions_without_a_client_is_a_config_error():
    model = ShallowWater("unstable_jet", nx=16, ny=40, backend="numpy")
    with pytest.raises(ConfigError, match="need a dask client"):
        Simulation(model, dt=100.0, partitions=2)


def test_a_closed_run_keeps_its_final_diagnostics_and_refuses_new_work(client):
    """The final step (7 steps at K = 2: not a whole task, nor a diagnostics step) is summarised after close."""
    model = ShallowWater("unstable_jet", nx=16, ny=40, backend="numpy")
    sim = Simulation(model, dt=100.0, stop_steps=7, diagnostics=4, progress=False, client=client, partitions=2,
                     steps_per_task=2)
    sim.run()
    assert [r["step"] for r in sim._records] == [0, 4]
    final = sim.state
    sim.close()
    sim.close()  # twice does nothing
    summary = sim.summary()
    assert summary["step"] == 7 and [r["step"] for r in sim._records] == [0, 4, 7]
    assert abs(summary["mass_relative_change"]) < 1e-12
    expected = model.diagnostics(final)
    assert sim._records[-1]["energy"] == pytest.approx(expected["energy"], rel=1e-12)
    for call in (sim.record_diagnostics, lambda: sim.run(steps=2), lambda: sim.state):
        with pytest.raises(ClusterError, match="closed"):
            call()


def test_unreachable_scheduler_fails_fast_with_a_clear_error():
    start = time.perf_counter()
    with pytest.raises(ClusterError, match="could not reach a dask scheduler at 'tcp://127.0.0.1:9'"):
        cluster("tcp://127.0.0.1:9", timeout=3, quiet=True)
    assert time.perf_counter() - start < 30


def test_losing_a_worker_ends_the_run_with_a_clear_error():
    client = cluster(workers=2, threads_per_worker=1, gpus=False, dashboard_address="127.0.0.1:0", quiet=True)
    try:
        model = ShallowWater("unstable_jet", nx=64, ny=64, backend="numba")
        sim = Simulation(model, stop_steps=100000, progress=False, client=client, partitions=2, steps_per_task=2)
        pids = client.run(os.getpid)

        def kill_one(simulation):
            if simulation.step == 20:
                os.kill(sorted(pids.values())[-1], signal.SIGKILL)

        sim.add_callback(kill_one, 10)
        start = time.perf_counter()
        with pytest.raises(ClusterError, match="worker was lost|lost|cluster"):
            sim.run()
        assert time.perf_counter() - start < 120
    finally:
        cluster_object = client.cluster
        client.close()
        cluster_object.close()


@pytest.mark.parametrize("partitions", [2, 3])
def test_body_partitions_reproduce_the_single_run_bitwise(client, partitions):
    from hpcgpu.workloads.astro import NBody

    model = NBody("galaxy_collision", n=301, backend="numba", seed=5)
    state = model.initial_state()
    reference = Simulation(model, state, dt=0.005, stop_steps=40, progress=False).run()
    sim = Simulation(model, state, dt=0.005, stop_steps=40, progress=False, client=client,
                     partitions=partitions).run()
    for name in ("positions", "velocities", "accelerations", "potentials"):
        np.testing.assert_array_equal(getattr(sim.state, name), getattr(reference.state, name), err_msg=name)
    expected = reference.diagnostics.sel(time=sim.diagnostics.time)
    for key in ("energy", "virial_ratio", "momentum_x", "lagrangian_radius_50"):
        np.testing.assert_allclose(sim.diagnostics[key], expected[key], rtol=1e-12, atol=1e-15)
    assert sum(sim.summary()["bodies_per_partition"]) == 301


def test_an_nbody_step_is_the_positions_cut_and_the_kick(client):
    from distributed import get_task_stream

    from hpcgpu.workloads.astro import NBody

    model = NBody("plummer", n=96, backend="numba")
    with get_task_stream(client) as stream:
        Simulation(model, dt=0.01, stop_steps=4, progress=False, client=client, partitions=3).run()
    per_step = {}
    for record in stream.data:
        key = record["key"]
        phase = str(key[0]).split("-")[1] if isinstance(key, tuple) else None
        if phase in ("positions", "kick", "drift"):
            per_step.setdefault(key[1], []).append(phase)
    assert len(per_step) == 4
    for phases in per_step.values():  # what the plan's scheduler term counts
        assert sorted(phases) == ["kick"] * 3 + ["positions"] * 3


def test_bodies_need_every_position_each_step(client):
    from hpcgpu.workloads.astro import NBody

    model = NBody("plummer", n=64, backend="numba")
    with pytest.raises(ConfigError, match="steps_per_task must be 1"):
        Simulation(model, dt=0.01, client=client, partitions=2, steps_per_task=4)


@pytest.fixture(scope="module")
def liquid():
    """A melted Lennard-Jones liquid (from the fcc lattice, 400 local steps)."""
    from hpcgpu.workloads.md import LennardJones

    def make(n_cells, thermostat):
        model = LennardJones(n_cells, temperature=1.44, thermostat=thermostat, backend="numba", seed=3)
        return model, model.step(model.initial_state(), 0.005, 400)

    return make


@pytest.mark.parametrize("partitions, thermostat", [(2, "none"), (3, "none"), (4, "none"), (2, "langevin")])
def test_md_domains_reproduce_the_single_run_with_atoms_migrating(client, liquid, partitions, thermostat):
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
    summary = sim.summary()
    assert sum(summary["atoms_per_partition"]) == model.n and len(summary["slab_edges"]) == partitions + 1
    # Atoms crossed slab borders (they migrated between partitions) during the run.
    slab = np.searchsorted(summary["slab_edges"][1:-1], state.positions[2], side="right")
    slab_after = np.searchsorted(summary["slab_edges"][1:-1], sim.state.positions[2], side="right")
    assert (slab != slab_after).sum() > 0


@pytest.mark.parametrize("partitions, per_slab, phases", [(4, 4, {"moved", "exchange", "kick"}),
                                                     (3, 3, {"exchange", "kick"}), (2, 2, {"exchange", "kick"})])
def test_an_md_step_is_the_exchanges_and_the_kick(client, liquid, partitions, per_slab, phases):
    """Per slab and step: an exchange per neighbour and the kick; beyond three slabs the
    exchanges do not reach every slab, and each slab's rebuild flag is a task of its own."""
    from distributed import get_task_stream

    model, state = liquid(8 if partitions == 4 else 6, "none")
    with get_task_stream(client) as stream:
        Simulation(model, state, dt=0.005, stop_steps=5, progress=False, client=client,
                   partitions=partitions).run()
    per_step = {}
    for record in stream.data:
        key = record["key"]
        phase = str(key[0]).split("-")[1] if isinstance(key, tuple) else None
        if phase in ("moved", "exchange", "kick", "drift", "rebuild", "migrants", "settle", "ghosts"):
            per_step.setdefault(key[1], []).append(phase)
    assert len(per_step) == 5
    for seen in per_step.values():  # what the plan's scheduler term counts
        assert len(seen) == per_slab * partitions
        assert set(seen) == phases


def test_md_domains_refuse_slabs_thinner_than_the_ghost_radius(client):
    from hpcgpu.workloads.md import LennardJones

    model = LennardJones(5, temperature=1.0, backend="numba")  # box side 8.4: two slabs at most
    with pytest.raises(ConfigError, match=r"partitions=3 .* at least cutoff \+ 2 skin = 3.1.* at most 2 partitions"):
        Simulation(model, dt=0.005, client=client, partitions=3)
    with pytest.raises(ConfigError, match="steps_per_task must be 1 for md"):
        Simulation(model, dt=0.005, client=client, partitions=2, steps_per_task=2)
    with pytest.raises(ConfigError, match="weights='calibrate' is only available for grid models"):
        Simulation(model, dt=0.005, client=client, partitions=2, weights="calibrate")


def test_slabs_find_ghosts_across_the_periodic_edge():
    from hpcgpu.domains import Slabs

    slabs = Slabs((0.0, 4.0, 8.0, 12.0), axis=2, length=12.0)
    z = np.array([0.5, 3.9, 4.0, 7.0, 8.5, 11.9])
    assert slabs.of(np, z).tolist() == [0, 0, 1, 1, 2, 2]
    # slab 0 sees the top of slab 2 through the periodic edge and the bottom of slab 1
    assert slabs.near(np, z, 0, 1.0).tolist() == [True, True, True, False, False, True]
    assert slabs.neighbours(0) == (1, 2) and Slabs((0.0, 6.0, 12.0), 2, 12.0).neighbours(1) == (0,)


def test_a_rebuild_keeps_ghost_lists_in_the_order_the_neighbours_assembled():
    from dataclasses import replace

    from hpcgpu.domains import Slabs, _send_lists
    from hpcgpu.errors import UnstableSimulation
    from hpcgpu.workloads.md import LennardJones

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
