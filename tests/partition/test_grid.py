"""The distributed structured grid: any process grid gives the one-block answer bitwise, for the weather model
and for a user's own model that describes only its local physics."""

import inspect

import numpy as np
import pytest

from hpcgpu import Simulation
from hpcgpu.errors import ConfigError
from hpcgpu.partition.grid import GridDecomposition, auto_grid_steps
from hpcgpu.partition.process_grid import choose_process_grid, parse_grid
from hpcgpu.partition.protocols import GridModel, GridPhysics, missing_methods
from hpcgpu.workloads.weather import ShallowWater

GRIDS = [(1, 1), (2, 1), (1, 2), (2, 2), (3, 2), (2, 4)]


def _reference(model, state, dt, steps, diagnostics=None):
    return Simulation(model, state, dt=dt, stop_steps=steps, progress=False, diagnostics=diagnostics).run()


def _assert_same(result, reference, fields=("u", "v", "h")):
    for name in fields:
        np.testing.assert_array_equal(getattr(result.state, name), getattr(reference.state, name), err_msg=name)


# -- weather on process grids -------------------------------------------------------------------------------
@pytest.mark.parametrize("steps_per_task", [1, None], ids=["K1", "Kauto"])
@pytest.mark.parametrize("case", ["turbulence", "unstable_jet"], ids=["periodic", "channel"])
@pytest.mark.parametrize("grid", GRIDS, ids=["x".join(map(str, g)) for g in GRIDS])
def test_weather_on_any_process_grid_equals_one_block_bitwise(client, grid, case, steps_per_task):
    # uneven blocks on most grids; 3x2 and 2x4 put 3 and 4 ranks on each of the 2 workers
    model = ShallowWater(case, nx=50, ny=61, backend="numba", Lx=5.0e5, Ly=6.1e5)
    state = model.initial_state()
    dt = model.suggested_dt(state)
    steps = 13  # not a multiple of K: a last, shorter superstep
    reference = _reference(model, state, dt, steps, diagnostics=1)
    sim = Simulation(model, state, dt=dt, stop_steps=steps, progress=False, client=client, grid=grid,
                     steps_per_task=steps_per_task, diagnostics=1)
    sim.run()
    summary = sim.summary()
    assert summary["process_grid"] == f"{grid[0]}x{grid[1]}" and summary["partitions"] == grid[0] * grid[1]
    assert sum(summary["block_rows"]) == 61 and sum(summary["block_cols"]) == 50
    _assert_same(sim, reference)
    got, expected = sim.diagnostics, reference.diagnostics.sel(time=sim.diagnostics.time)
    for key in ("mass", "energy", "enstrophy", "max_cfl"):  # exact partial sums: bitwise on any grid
        np.testing.assert_array_equal(got[key], expected[key], err_msg=key)
    sim.close()


@pytest.mark.parametrize("grid", [(2, 2), (3, 1)], ids=["2x2", "3x1"])
def test_the_energy_budget_on_a_process_grid_equals_one_block_bitwise(client, grid):
    """The viscous energy accumulated cell by cell every step, summed as exact partials: the same budget."""
    model = ShallowWater("unstable_jet", nx=48, ny=48, backend="numba", energy_budget=True)
    state = model.initial_state()
    dt = model.suggested_dt(state)
    reference = _reference(model, state, dt, 11, diagnostics=1)
    sim = Simulation(model, state, dt=dt, stop_steps=11, progress=False, client=client, grid=grid, steps_per_task=2,
                     diagnostics=1).run()
    got, expected = sim.diagnostics, reference.diagnostics.sel(time=sim.diagnostics.time)
    assert float(got["energy_dissipated"][-1]) > 0
    for key in ("energy", "energy_dissipated"):
        np.testing.assert_array_equal(got[key], expected[key], err_msg=key)
    for name in ("u", "v", "h"):
        np.testing.assert_array_equal(getattr(sim.state, name), getattr(reference.state, name), err_msg=name)
    sim.close()


def test_walls_on_both_axes_partition_in_two_dimensions(client):
    model = ShallowWater("turbulence", nx=40, ny=36, backend="numpy", boundary=("wall", "wall"))
    state = model.initial_state()
    dt = model.suggested_dt(state)
    reference = _reference(model, state, dt, 9)
    for grid in ((2, 2), (3, 1)):
        sim = Simulation(model, state, dt=dt, stop_steps=9, progress=False, client=client, grid=grid).run()
        _assert_same(sim, reference)
        sim.close()


@pytest.mark.parametrize("steps_per_task", [1, 4, 16])
def test_steps_per_exchange_reproduce_the_single_block_run_bitwise(client, steps_per_task):
    # 16 steps per exchange read 96 rows south of a block: 4 blocks need >= 384 rows
    model = ShallowWater("turbulence", nx=24, ny=401, backend="numba", Lx=2.4e5, Ly=4.01e6)
    state = model.initial_state()
    dt = model.suggested_dt(state)
    reference = _reference(model, state, dt, 203)  # not a multiple of K
    sim = Simulation(model, state, dt=dt, stop_steps=203, progress=False, client=client,
                     partitions=4, steps_per_task=steps_per_task)
    sim.run()
    assert sim.summary()["process_grid"] == "1x4"  # 24 columns cannot hold the frame of a second column block
    _assert_same(sim, reference)
    sim.close()


def test_a_channel_split_in_rows_balances_the_halo_work(client):
    model = ShallowWater("unstable_jet", nx=40, ny=61, backend="numba")
    state = model.initial_state()
    dt = model.suggested_dt(state)
    reference = _reference(model, state, dt, 40)
    sim = Simulation(model, state, dt=dt, stop_steps=40, progress=False, client=client, partitions=3,
                     steps_per_task=2).run()
    _assert_same(sim, reference)
    rows = sim.summary()["block_rows"]
    south, _, _, north = model.reach(2)[2], None, None, model.reach(2)[3]
    # each block's own rows plus half the frame rows of its open edges: equal to within rounding
    work = [r + (south * (p > 0) + north * (p < 2)) / 2 for p, r in enumerate(rows)]
    assert sum(rows) == 61 and max(work) - min(work) <= 1.5 and rows[1] < rows[0]
    sim.close()


def test_grids_take_as_many_steps_per_exchange_as_their_frames_allow(client):
    tall = ShallowWater("turbulence", nx=16, ny=800, backend="numba")  # 400 rows a block: K = 16
    square = ShallowWater("turbulence", nx=256, ny=256, backend="numba")
    assert auto_grid_steps(tall, (1, 2)) == 16
    assert auto_grid_steps(square, (2, 2)) == 4 and auto_grid_steps(square, (8, 8)) == 1
    sim = Simulation(tall, dt=10.0, stop_steps=16, progress=False, client=client, partitions=2)
    assert sim.summary()["steps_per_task"] == 16
    _assert_same(sim.run(), _reference(tall, tall.initial_state(), 10.0, 16))
    sim.close()


def test_weights_reach_the_blocks(client):
    model = ShallowWater("turbulence", nx=16, ny=80, backend="numba")
    sim = Simulation(model, dt=100.0, stop_steps=4, progress=False, client=client, partitions=2, weights=[3, 1])
    assert sim.summary()["block_rows"] == [60, 20]
    sim.close()
    calibrated = Simulation(model, dt=100.0, stop_steps=4, progress=False, client=client, partitions=2,
                            weights="calibrate")
    rates = calibrated._executor.rates
    assert len(rates) == 2 and all(rate > 0 for rate in rates.values())
    assert sum(calibrated.summary()["block_rows"]) == 80
    calibrated.close()


# -- layout -----------------------------------------------------------------------------------------------------
def test_the_default_process_grid_has_the_least_frame_surface():
    wide = ShallowWater("turbulence", nx=4096, ny=512, backend="numpy")
    square = ShallowWater("turbulence", nx=1024, ny=1024, backend="numpy")
    assert GridDecomposition.build(wide, 1.0, 8, None, None, False).grid == (8, 1)
    assert GridDecomposition.build(square, 1.0, 16, None, None, False).grid == (4, 4)
    assert GridDecomposition.build(square, 1.0, 2, None, None, False).grid == (1, 2)  # rows stay contiguous
    assert choose_process_grid(16, (4096, 4096)) == (4, 4)


def test_frames_hold_what_k_steps_read_and_a_periodic_axis_of_one_block_wraps():
    model = ShallowWater("unstable_jet", nx=64, ny=128, backend="numpy")  # periodic x, walls in y
    layout = GridDecomposition.build(model, 1.0, 4, 2, None, False, grid=(2, 2))
    assert layout.frame == model.reach(2) == (12, 6, 12, 6)
    corner = layout.region(0)
    assert corner.sides == ("halo", "halo", "wall", "halo")
    assert layout.framed_shape(0) == (layout.y_bounds[0][1] + 6, 12 + 32 + 6)
    assert corner.first_col == -12 and corner.first_row == 0
    rows = GridDecomposition.build(model, 1.0, 2, 2, None, False, grid=(1, 2))
    assert rows.region(1).sides == ("wrap", "wrap", "halo", "wall")


@pytest.mark.parametrize("kwargs, match", [
    (dict(partitions=41), r"partitions=41 cannot be laid out .* at most \d+ ranks fit"),
    (dict(partitions=4, steps_per_task=8), r"steps_per_task=8 reads 48 cells .* use steps_per_task <= 1"),
    (dict(grid=(2, 2), partitions=3), r"grid=2x2 holds 4 ranks but partitions=3"),
    (dict(grid=(4, 1), steps_per_task=2), r"grid=4x1 splits 16 columns into 4 blocks of at least 12"),
    (dict(grid=(2, 2, 2)), r"grid must be a tuple of 2 positive ints"),
    (dict(grid="4by2"), r"grid must be two or three positive integers joined by 'x'"),
    (dict(partitions=0), "partitions must be >= 1"),
    (dict(partitions=2, weights=[1, 2, 3]), r"sequence of 2 positive finite numbers \(one per partition\); got 3"),
])
def test_bad_process_grids_name_the_parameter(client, kwargs, match):
    model = ShallowWater("unstable_jet", nx=16, ny=40, backend="numba")
    with pytest.raises(ConfigError, match=match):
        Simulation(model, dt=100.0, stop_steps=4, progress=False, client=client, **kwargs)


def test_a_grid_without_a_client_is_a_config_error():
    model = ShallowWater("unstable_jet", nx=16, ny=40, backend="numpy")
    with pytest.raises(ConfigError, match="need a dask client"):
        Simulation(model, dt=100.0, grid=(2, 1))
    assert parse_grid("4x2") == (4, 2) and parse_grid("2,2,2") == (2, 2, 2)


# -- a user's own model -----------------------------------------------------------------------------------------
def test_a_users_grid_model_is_local_physics_in_a_few_lines():
    import _user_models

    from _user_models import Heat

    model = Heat()
    assert missing_methods(model, GridPhysics) == [] and missing_methods(model, GridModel) == []
    methods = [name for name, value in vars(Heat).items() if inspect.isfunction(value)]
    assert len(methods) <= 8, methods
    source = inspect.getsource(Heat)
    assert len(source.strip().splitlines()) <= 40, len(source.strip().splitlines())
    assert "HeatState" in inspect.getsource(_user_models)


@pytest.mark.parametrize("grid", [(2, 2), (3, 2), (1, 3)])
def test_a_users_grid_model_partitions_bitwise_through_the_protocol_alone(client, grid):
    from _user_models import Heat

    model = Heat(nx=12, ny=30)
    reference = Simulation(model, dt=0.05, stop_steps=7, progress=False, diagnostics=1).run()
    sim = Simulation(model, dt=0.05, stop_steps=7, progress=False, client=client, grid=grid, steps_per_task=2,
                     diagnostics=1).run()
    np.testing.assert_array_equal(sim.state.T, reference.state.T)
    assert not np.array_equal(sim.state.T, model.initial_state().T)  # it did step
    np.testing.assert_array_equal(sim.diagnostics.heat, reference.diagnostics.heat)
    sim.close()


_NOTEBOOK_SCRIPT = '''
import numpy as np
from _user_models import Heat


class NotebookHeat(Heat):
    """Defined where a notebook or a script defines its model: in __main__."""


if __name__ == "__main__":
    from hpcgpu import Simulation
    from hpcgpu.cluster import start_cluster

    model = NotebookHeat(nx=8, ny=24)
    reference = Simulation(model, dt=0.05, stop_steps=5, progress=False).run()
    client = start_cluster(workers=2, quiet=True)
    try:
        sim = Simulation(model, dt=0.05, stop_steps=5, progress=False, client=client, grid=(2, 2)).run()
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


# -- what the ranks send --------------------------------------------------------------------------------------
def frame_bytes_per_step(model, grid, steps_per_task=None):
    """Bytes the busiest rank sends per time step in its frame exchange (communicator counters)."""
    from _thread_comm import run_group

    partitions = grid[0] * grid[1]
    layout = GridDecomposition.build(model, 1.0, partitions, steps_per_task, None, False, grid=grid)
    blocks = layout.split(model, model.initial_state())

    class Context:
        def __init__(self, comm):
            self.comm, self.rank, self.model = comm, comm.rank, model

    def exchange(comm):
        layout.fill_frames(Context(comm), blocks[comm.rank].state)
        return comm.counters_by_family().get("frame", {}).get("bytes", 0)

    results, _ = run_group(partitions, exchange, timeout=60.0)
    assert not any(isinstance(r, Exception) for r in results), results
    return max(results) / layout.steps_per_task


def test_a_square_grid_sends_about_half_the_bytes_of_row_blocks():
    model = ShallowWater("turbulence", nx=512, ny=512, backend="numpy")
    rows = frame_bytes_per_step(model, (1, 16))
    blocks = frame_bytes_per_step(model, (4, 4))
    # each field sends its own K-step cone (model.field_reach), not the frame: with K = 1 rows, u 4 south and
    # 3 north, v 3 and 3, h 4 and 3 (the frame is 6 and 3), of 512 cells and 8 bytes
    assert rows == (7 + 6 + 7) * 512 * 8
    # blocks of 128 x 128 with K = 4: u (west, east, south, north) = (12, 12, 13, 12), v (13, 12, 12, 12),
    # h (13, 12, 13, 12); columns of 128 rows, then rows of 128 cells plus the field's own x frame
    u, v, h = (24 * 128 + 25 * 152), (25 * 128 + 24 * 153), (25 * 128 + 25 * 153)
    assert blocks == (u + v + h) * 8 / 4
    assert blocks / rows < 0.51
    # the uniform frame of today's row blocks: 9 rows of 512 cells a step, 3 fields
    assert blocks / (9 * 512 * 3 * 8) < 0.4


def test_fields_read_less_than_the_frame_travel_narrower_and_the_rest_repeats_their_edge():
    model = ShallowWater("turbulence", nx=48, ny=48, backend="numpy")
    layout = GridDecomposition.build(model, 1.0, 9, 2, None, False, grid=(3, 3))
    assert layout.frame == (12, 6, 12, 6)
    assert dict(layout.field_frames) == model.field_reach(2)
    state = model.initial_state()
    blocks = layout.split(model, state)
    from _thread_comm import run_group

    class Context:
        def __init__(self, comm):
            self.comm, self.rank, self.model = comm, comm.rank, model

    def exchange(comm):
        layout.fill_frames(Context(comm), blocks[comm.rank].state)
        return blocks[comm.rank].state

    results, _ = run_group(9, exchange, timeout=60.0)
    where = layout.region(4)
    u = results[4].u
    rows = (where.first_row + np.arange(u.shape[0])) % 48
    cols = (where.first_col + np.arange(u.shape[1])) % 48
    expected = state.u[np.ix_(rows, cols)]
    west, east, south, north = model.field_reach(2)["u"]  # (6, 6, 7, 6) of a frame of (12, 6, 12, 6)
    inside = (slice(12 - south, u.shape[0] - 6 + north), slice(12 - west, u.shape[1] - 6 + east))
    np.testing.assert_array_equal(u[inside], expected[inside])
    # beyond the cells sent, the frame repeats the outermost ones (no zeros, no stale values)
    np.testing.assert_array_equal(u[:12 - south, 12 - west:], np.broadcast_to(u[12 - south, 12 - west:],
                                                                            (12 - south, u.shape[1] - 12 + west)))
    np.testing.assert_array_equal(u[:, :12 - west], np.broadcast_to(u[:, 12 - west:13 - west], (u.shape[0], 12 - west)))


def test_the_plan_counts_the_bytes_the_communicator_counts():
    from hpcgpu.plan import SchedulerModel
    from hpcgpu.plan.profiles import DEVICES, LINKS
    from hpcgpu.plan.workload_costs import WeatherCost

    model = ShallowWater("turbulence", nx=512, ny=512, backend="numpy")
    weather = WeatherCost(512, 512, steps=1, dtype="float64", periodic=True)
    for grid in ((1, 16), (2, 8), (4, 4)):
        cost = weather.cost(16, DEVICES["h100"], LINKS["ndr"], SchedulerModel(), grid=grid)
        assert cost.exchange_bytes == frame_bytes_per_step(model, grid), grid


@pytest.mark.parametrize("backend_name", ["numpy", "numba", pytest.param("cuda", marks=pytest.mark.gpu),
                                          pytest.param("cupy", marks=pytest.mark.gpu)])
def test_supersteps_of_narrow_field_frames_equal_one_block_bitwise_on_every_backend(backend_name):
    """The exchange and K steps on every rank of a 3 x 3 grid, in threads: on a GPU the frame cells no field
    was sent keep stale values (no fill), on a CPU they repeat the cells sent; either way, bitwise one block."""
    from _support import simulated, usable_backend
    from _thread_comm import run_group

    if backend_name == "cuda" and simulated():
        pytest.skip("nine thread ranks are too slow for the CUDA simulator (its kernels: test_weather_field_reach)")
    usable_backend(backend_name)
    model = ShallowWater("turbulence", nx=48, ny=45, Lx=4.8e5, Ly=4.5e5, backend=backend_name)
    state = model.initial_state()
    dt = model.suggested_dt(state)
    layout = GridDecomposition.build(model, dt, 9, 2, None, False, grid=(3, 3))
    assert layout.field_frames
    blocks = layout.split(model, model.to_host(state))

    class Context:
        def __init__(self, comm):
            self.comm, self.rank, self.model, self.cache = comm, comm.rank, model, {}

    def run(comm):
        context = Context(comm)
        carried = layout.advance(context, layout.resume(context, blocks[comm.rank]), 5)  # K = 2: 2 + 2 + 1
        return model.to_host(carried.owned())

    results, _ = run_group(9, run, timeout=300.0)
    assert not any(isinstance(r, Exception) for r in results), results
    joined = layout.join(model, results)
    reference = model.stepper(dt).advance(state, 5)
    for name in ("u", "v", "h"):
        np.testing.assert_array_equal(model.backend.to_host(getattr(joined, name)),
                                      model.backend.to_host(getattr(reference, name)), err_msg=name)
