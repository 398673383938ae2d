"""Grid rows on the engine: the same answer as one block, bitwise, for any P and K; halos in place."""

import time

import numpy as np
import pytest

from hpcgpu import Simulation
from hpcgpu._gpu_probe import simulator_enabled
from hpcgpu.errors import ConfigError
from hpcgpu.partition.layout import split_rows
from hpcgpu.partition.rows import (SLOWDOWN_ENV, RowDecomposition, auto_steps_per_task, emulate_slowdown,
                                   halo_balanced_weights, weights_from_rates)
from hpcgpu.workloads.weather import ShallowWater


def _reference(model, state, dt, steps):
    return Simulation(model, state, dt=dt, stop_steps=steps, progress=False).run()


def _assert_same(result, reference):
    for name in ("u", "v", "h"):
        np.testing.assert_array_equal(getattr(result.state, name), getattr(reference.state, name), err_msg=name)


def _supersteps(model, state, bounds, steps, blocks=None, caches=None):
    """One superstep of every row block in this process, as the ranks do it (periodic rows)."""
    blocks = blocks or [model.take_block(state, a, b) for a, b in bounds]
    caches = caches if caches is not None else [{} for _ in bounds]
    south_width, north_width = model.halo_rows(steps)
    count = len(blocks)
    out = []
    for p, block in enumerate(blocks):
        south_block, north_block = blocks[(p - 1) % count], blocks[(p + 1) % count]
        rows_south = south_block.h.shape[0]
        south = model.row_view(south_block, rows_south - south_width, rows_south)
        north = model.row_view(north_block, 0, north_width)
        assembled = model.assemble_rows(model.take_block(south, 0, south_width), block,
                                        model.take_block(north, 0, north_width))
        result = model.advance_rows(assembled, 30.0, steps, bounds[p][0] - south_width, True, True,
                                    cache=caches[p], fresh=True)
        out.append(model.row_view(result, south_width, south_width + block.h.shape[0]))
    return out


# -- the model's row methods, as a rank uses them --------------------------------------------------
@pytest.mark.parametrize("backend", ["numpy", "numba"])
def test_resident_blocks_take_their_halos_in_place_and_match_one_block(backend):
    model = ShallowWater("turbulence", nx=24, ny=40, backend=backend)
    state = model.initial_state()
    bounds = [(0, 17), (17, 40)]
    first = _supersteps(model, state, bounds, 2)
    # a superstep's result keeps spare rows for the next halos: assembling
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
    second = _supersteps(model, state, bounds, 2, blocks=first)
    reference = model.step(state, 30.0, steps=4)
    np.testing.assert_array_equal(np.concatenate([b.h for b in second]), model.backend.to_host(reference.h))
    np.testing.assert_array_equal(np.concatenate([b.u for b in second]), model.backend.to_host(reference.u))


def test_released_results_are_reused_and_held_ones_never_overwritten():
    import weakref

    model = ShallowWater("turbulence", nx=24, ny=40, backend="numpy")
    state = model.initial_state()
    bounds = [(0, 17), (17, 40)]
    caches = [{}, {}]
    blocks = _supersteps(model, state, bounds, 2, caches=caches)
    held = blocks[0].h  # a view still in use (a halo in flight): its arrays must never be handed out again
    kept = held.copy()
    generations = []
    for _ in range(4):
        blocks = _supersteps(model, state, bounds, 2, blocks=blocks, caches=caches)
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


# -- runs on the engine ---------------------------------------------------------------------------------
@pytest.mark.parametrize("partitions", [1, 2, 3, 4])
def test_partitions_reproduce_the_single_block_run_bitwise(client, partitions):
    # 61 rows: uneven blocks for 2, 3 and 4 partitions (3 and 4 share the two workers)
    model = ShallowWater("unstable_jet", nx=40, ny=61, backend="numba")
    state = model.initial_state()
    dt = model.suggested_dt(state)
    reference = _reference(model, state, dt, 200)
    sim = Simulation(model, state, dt=dt, stop_steps=200, progress=False, client=client,
                     partitions=partitions, steps_per_task=2)
    sim.run()
    _assert_same(sim, reference)
    rows = sim.summary()["rows_per_partition"]
    # a channel: equal work, not equal rows (the blocks at the walls step fewer halo rows)
    expected = halo_balanced_weights(model, 2, partitions, periodic=False)
    assert sum(rows) == 61 and all(abs(r - e) < 1 for r, e in zip(rows, expected))
    diagnostics, expected = sim.diagnostics, reference.diagnostics.sel(time=sim.diagnostics.time)
    assert diagnostics.sizes["time"] == reference.diagnostics.sizes["time"]
    for key in ("mass", "energy", "enstrophy", "max_cfl"):
        np.testing.assert_allclose(diagnostics[key], expected[key], rtol=1e-12)
    sim.close()


@pytest.mark.parametrize("steps_per_task", [1, 4, 16])
def test_steps_per_exchange_reproduce_the_single_block_run_bitwise(client, steps_per_task):
    # 16 steps per exchange read 96 rows south of a block: 4 blocks need >= 384 rows.
    model = ShallowWater("turbulence", nx=24, ny=401, backend="numba", Lx=2.4e5, Ly=4.01e6)
    state = model.initial_state()
    dt = model.suggested_dt(state)
    reference = _reference(model, state, dt, 203)  # not a multiple of K: a last, shorter superstep
    sim = Simulation(model, state, dt=dt, stop_steps=203, progress=False, client=client,
                     partitions=4, steps_per_task=steps_per_task)
    sim.run()
    _assert_same(sim, reference)
    sim.close()


def test_grids_take_as_many_steps_per_exchange_as_their_halos_allow(client):
    tall = ShallowWater("turbulence", nx=16, ny=800, backend="numba")  # 400 rows a block: K = 16
    short = ShallowWater("turbulence", nx=16, ny=100, backend="numba")  # 50 rows: 4 x 6K <= 50 for K = 2
    assert auto_steps_per_task(tall, 2) == 16 and auto_steps_per_task(short, 2) == 2
    assert auto_steps_per_task(short, 10) == 1
    for model, k in ((tall, 16), (short, 2)):
        sim = Simulation(model, dt=10.0, stop_steps=k, progress=False, client=client, partitions=2)
        assert sim.summary()["steps_per_task"] == k
        reference = _reference(model, model.initial_state(), 10.0, k)
        _assert_same(sim.run(), reference)
        sim.close()


def test_periodic_channel_and_walls_both_partition(client):
    for case in ("gravity_wave", "rest"):
        model = ShallowWater(case, nx=24, ny=40, backend="numba")
        state = model.initial_state()
        dt = model.suggested_dt(state) if case != "rest" else 60.0
        reference = _reference(model, state, dt, 30)
        sim = Simulation(model, state, dt=dt, stop_steps=30, progress=False, client=client, partitions=3,
                         steps_per_task=2).run()
        _assert_same(sim, reference)
        np.testing.assert_allclose(sim.diagnostics.energy, reference.diagnostics.energy, rtol=1e-12)
        sim.close()


@pytest.mark.parametrize("steps_per_task", [1, 3, 16])
def test_stepping_while_the_halos_travel_reproduces_the_single_block_run_bitwise(client, monkeypatch,
                                                                                  steps_per_task):
    """The overlapped superstep (block first, then its edge strips), forced on for every K: walls and a
    periodic channel, 2 to 4 blocks, uneven rows, a last shorter superstep."""
    from hpcgpu.partition.rows import OVERLAP_ENV

    monkeypatch.setenv(OVERLAP_ENV, "1")
    for case, partitions in (("turbulence", 4), ("gravity_wave", 2), ("gravity_wave", 3)):
        model = ShallowWater(case, nx=24, ny=401, backend="numba", Lx=2.4e5, Ly=4.01e6)
        state = model.initial_state()
        dt = model.suggested_dt(state)
        steps = 5 * steps_per_task + 2
        reference = _reference(model, state, dt, steps)
        sim = Simulation(model, state, dt=dt, stop_steps=steps, progress=False, client=client,
                         partitions=partitions, steps_per_task=steps_per_task)
        assert sim._executor.decomposition.overlap
        sim.run()
        _assert_same(sim, reference)
        sim.close()


@pytest.mark.parametrize("name", [
    pytest.param("cuda", marks=pytest.mark.cudasim if simulator_enabled() else pytest.mark.gpu, id="cuda"),
    pytest.param("cupy", marks=pytest.mark.gpu, id="cupy")])
def test_device_blocks_step_while_the_halos_travel_and_match_one_block(client, monkeypatch, name):
    """The overlapped superstep (K = 1) on device arrays: views, strips and row writes on the GPU
    (the CUDA simulator at a tiny size here), against one block on the same backend."""
    from _support import small, usable_backend

    from hpcgpu.partition.rows import OVERLAP_ENV

    monkeypatch.setenv(OVERLAP_ENV, "1")
    backend = usable_backend(name)
    ny = small(backend, 96, 24)
    model = ShallowWater("gravity_wave", nx=small(backend, 64, 8), ny=ny, backend=name, dtype="float64")
    state = model.initial_state()
    dt = model.suggested_dt(state)
    steps = small(backend, 9, 2)
    expected = _reference(model, state, dt, steps)
    sim = Simulation(model, state, dt=dt, stop_steps=steps, progress=False, client=client, partitions=2,
                     steps_per_task=1)
    assert sim._executor.decomposition.overlap
    got = sim.run().state
    for field in ("u", "v", "h"):
        np.testing.assert_array_equal(backend.to_host(getattr(got, field)),
                                      backend.to_host(getattr(expected.state, field)), err_msg=field)
    sim.close()


def test_halos_overlap_the_block_only_when_asked(monkeypatch):
    from hpcgpu.partition.rows import OVERLAP_ENV, _overlap_default

    monkeypatch.delenv(OVERLAP_ENV, raising=False)
    assert not any(_overlap_default(k) for k in (1, 2, 4, 16))
    monkeypatch.setenv(OVERLAP_ENV, "1")
    assert all(_overlap_default(k) for k in (1, 2, 4, 16))
    monkeypatch.setenv(OVERLAP_ENV, "0")
    assert not _overlap_default(1)


# -- layout ----------------------------------------------------------------------------------------------
def test_weighted_partitions_follow_the_weights():
    assert split_rows(101, [3, 1]) == [(0, 76), (76, 101)]
    # a block too small for the halo is raised to it; the others keep their proportions
    assert split_rows(100, [1, 50, 50], minimum=10) == [(0, 10), (10, 55), (55, 100)]
    for rows in (100, 101, 257):
        (a, b), (c, d) = split_rows(rows, [3.0, 1.0])
        assert abs((b - a) - 3 * (d - c)) <= 4  # within one row of 3:1 each
        assert abs((b - a) - 0.75 * rows) <= 1


def test_default_blocks_of_a_channel_balance_their_halo_work_and_a_periodic_grid_splits_evenly():
    channel = ShallowWater("unstable_jet", nx=16, ny=1000, backend="numpy")
    south, north = channel.halo_rows(16)
    layout = RowDecomposition.build(channel, 30.0, 4, 16, None, calibrated=False)
    rows = [b - a for a, b in layout.bounds]
    # each block's own rows plus half the halo rows of its open edges: equal to within rounding
    work = [r + (south * (p > 0) + north * (p < 3)) / 2 for p, r in enumerate(rows)]
    assert sum(rows) == 1000 and max(work) - min(work) <= 1
    assert rows[1] < rows[0] and rows[2] < rows[3]  # inner blocks step two halos
    assert layout.weights == (1.0, 1.0, 1.0, 1.0)  # what the user asked for: equal work
    # given weights are taken as they are
    given = RowDecomposition.build(channel, 30.0, 2, 16, [1, 1], calibrated=False)
    assert [b - a for a, b in given.bounds] == [500, 500]
    periodic = ShallowWater("turbulence", nx=16, ny=1000, backend="numpy")
    even = RowDecomposition.build(periodic, 30.0, 4, 16, None, calibrated=False)
    assert [b - a for a, b in even.bounds] == [250] * 4


def test_calibrated_rates_leave_room_for_the_halo_work_of_each_block():
    model = ShallowWater("unstable_jet", nx=40, ny=400, backend="numpy")
    weights = weights_from_rates(model, 4, [2.0, 1.0])
    extra = sum(model.halo_rows(4)) / 2
    # each block's stepped rows (its own plus half its halo) follow the rates
    assert sum(weights) == pytest.approx(400)
    assert (weights[0] + extra) / (weights[1] + extra) == pytest.approx(2.0)
    assert weights[0] / weights[1] > 2.0
    assert weights_from_rates(model, 4, [1.0, 1.0, 1.0]) == pytest.approx([400 / 3] * 3)
    layout = RowDecomposition.build(model, 30.0, 2, 4, [2.0, 1.0], calibrated=True)
    assert layout.bounds[0][1] == round(weights[0]) and layout.neighbours(0) == (None, 1)


def test_an_emulated_slow_worker_sleeps_in_proportion(monkeypatch):
    monkeypatch.setenv(SLOWDOWN_ENV, "3")
    started = time.perf_counter()
    time.sleep(0.02)
    emulate_slowdown(started)
    assert time.perf_counter() - started >= 3 * 0.02
    monkeypatch.setenv(SLOWDOWN_ENV, "1")
    started = time.perf_counter()
    emulate_slowdown(started)
    assert time.perf_counter() - started < 0.01


def test_weights_reach_the_partitions(client):
    model = ShallowWater("unstable_jet", nx=16, ny=80, backend="numba")
    sim = Simulation(model, dt=100.0, stop_steps=4, progress=False, client=client, partitions=2,
                     weights=[3, 1])
    assert sim.summary()["rows_per_partition"] == [60, 20]
    sim.close()
    calibrated = Simulation(model, dt=100.0, stop_steps=4, progress=False, client=client, partitions=2,
                            weights="calibrate")
    rates = calibrated._executor.rates
    assert len(rates) == 2 and all(rate > 0 for rate in rates.values())
    assert sum(calibrated.summary()["rows_per_partition"]) == 80
    calibrated.close()


@pytest.mark.parametrize("kwargs, match", [
    (dict(partitions=41), "partitions must be <= 40"),
    (dict(partitions=4, steps_per_task=4), r"steps_per_task=4 needs 24 rows of halo per block, 96 rows on "
                                           r"partitions=4, but the grid has 40: use steps_per_task <= 1"),
    (dict(partitions=2, steps_per_task=64), r"steps_per_task=64 needs 384 rows of halo per block, 768 rows on "
                                            r"partitions=2, but the grid has 40: use steps_per_task <= 2"),
    (dict(partitions=0), "partitions must be >= 1"),
    (dict(partitions=2, steps_per_task=0), "steps_per_task must be >= 1"),
    (dict(partitions=2, weights=[1, 2, 3]), r"sequence of 2 positive finite numbers \(one per partition\); got 3"),
    (dict(partitions=2, weights=[1, -1]), r"positive finite numbers .*got \[1, -1\] \(weights must be > 0"),
    (dict(partitions=2, weights=5), r"weights must be None, 'calibrate' or a sequence of 2 .*; got 5"),
    (dict(partitions=2, weights="fast"), "weights must be a sequence of numbers or 'calibrate'"),
])
def test_bad_partitioning_names_the_parameter(client, kwargs, match):
    model = ShallowWater("unstable_jet", nx=16, ny=40, backend="numba")
    with pytest.raises(ConfigError, match=match):
        Simulation(model, dt=100.0, stop_steps=4, progress=False, client=client, **kwargs)


def test_partitions_without_a_client_is_a_config_error():
    model = ShallowWater("unstable_jet", nx=16, ny=40, backend="numpy")
    with pytest.raises(ConfigError, match="need a dask client"):
        Simulation(model, dt=100.0, partitions=2)


@pytest.mark.parametrize("partitions", [2, 3])
def test_a_users_own_row_model_partitions_through_the_protocol_alone(client, partitions):
    from _user_models import Heat  # its state has one field, T: nothing of the weather model

    from hpcgpu.partition.protocols import RowModel, missing_methods

    model = Heat(nx=8, ny=30)
    assert missing_methods(model, RowModel) == []
    reference = Simulation(model, dt=0.2, stop_steps=7, progress=False).run()
    sim = Simulation(model, dt=0.2, stop_steps=7, progress=False, client=client, partitions=partitions,
                     steps_per_task=2).run()
    assert sim.summary()["rows_per_partition"] == [30 // partitions] * partitions
    np.testing.assert_array_equal(sim.state.T, reference.state.T)
    assert not np.array_equal(sim.state.T, model.initial_state().T)  # it did step
    sim.close()


def test_blocks_that_cannot_hold_their_halo_never_suggest_zero_partitions():
    with pytest.raises(ConfigError, match=r"needs at least 768 rows \(384 per block for the halo\) but the grid has "
                                          r"128; use fewer steps_per_task \(a narrower halo\) or a bigger grid"):
        split_rows(128, [1, 1], minimum=384)
    with pytest.raises(ConfigError, match="use at most 3 partitions or fewer steps_per_task"):
        split_rows(100, [1] * 4, minimum=30)


def test_finite_weights_whose_sum_overflows_still_place_every_row():
    assert split_rows(40, [1e308, 1e308], minimum=6) == [(0, 20), (20, 40)]
    assert split_rows(40, [1e308, 1e307], minimum=6) == [(0, 34), (34, 40)]
    assert split_rows(40, [1e-300, 3e-300]) == [(0, 10), (10, 40)]


_NOTEBOOK_SCRIPT = '''
import numpy as np
from _user_models import Heat


class NotebookHeat(Heat):
    """Defined where a notebook or a script defines its model: in __main__."""


if __name__ == "__main__":
    from hpcgpu import Simulation
    from hpcgpu.cluster import start_cluster

    model = NotebookHeat(nx=8, ny=24)
    reference = Simulation(model, dt=0.2, stop_steps=5, progress=False).run()
    client = start_cluster(workers=2, quiet=True)
    try:
        sim = Simulation(model, dt=0.2, stop_steps=5, progress=False, client=client, partitions=2).run()
        print("bitwise equal:", bool(np.array_equal(sim.state.T, reference.state.T)))
        sim.close()
    finally:
        cluster = client.cluster
        client.close()
        cluster.close()
'''


def test_a_model_class_defined_in_main_partitions_like_an_importable_one(tmp_path):
    import os
    import subprocess
    import sys

    script = tmp_path / "notebook_model.py"
    script.write_text(_NOTEBOOK_SCRIPT)
    tests = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([tests, os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "bitwise equal: True" in done.stdout


def test_calibrated_ranks_that_share_a_worker_share_its_rate(client, monkeypatch):
    workers = sorted(client.scheduler_info()["workers"])
    # equal measured rates: a worker holding two of the three ranks gives each half of its rate
    monkeypatch.setattr(RowDecomposition, "calibrate", classmethod(lambda cls, c, m: {w: 50.0 for w in workers}))
    model = ShallowWater("unstable_jet", nx=16, ny=120, backend="numba")
    sim = Simulation(model, dt=100.0, stop_steps=2, progress=False, client=client, partitions=3, steps_per_task=1,
                     weights="calibrate")
    rows = sim.summary()["rows_per_partition"]
    assert sum(rows) == 120 and rows[1] > 1.8 * rows[0] and abs(rows[0] - rows[2]) <= 1, rows
    sim.close()
