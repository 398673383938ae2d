"""``hpcgpu plan``: the performance model on known cases, its input checks and its command line."""

import json
import math
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from hpcgpu.errors import ConfigError
from hpcgpu.partition.engine import EPOCH_SECONDS
from hpcgpu.plan import USABLE_MEMORY_FRACTION, SchedulerModel, plan
from hpcgpu.plan.check import fit_link
from hpcgpu.plan.devices import device_profile, measured_device
from hpcgpu.plan.profiles import DEVICES, LINKS, LinkProfile, link_profile
from hpcgpu.plan.workload_costs import MolecularDynamicsCost, NBodyCost, WeatherCost, launch_wait_s

HPCGPU = [sys.executable, "-P", "-m", "hpcgpu.cli"]
DOCS = Path(__file__).resolve().parents[1] / "docs"


def run_cli(*args, timeout=120):
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    return subprocess.run([*HPCGPU, *args], capture_output=True, text=True, timeout=timeout, env=env)


def feasible(rows):
    return [r for r in rows if r.feasible]


H100 = DEVICES["h100"]
NO_LAUNCH = replace(H100, launch_s=0.0)
BANDWIDTH_ONLY = LinkProfile("bandwidth only", bandwidth=1e9, latency_s=0.0)
LATENCY_ONLY = LinkProfile("latency only", bandwidth=1e30, latency_s=1e-3)


# -- known cases ------------------------------------------------------------------------

def test_direct_nbody_at_large_n_is_compute_bound_and_scales_as_one_over_p():
    bodies, h100 = 1_000_000, DEVICES["h100"]
    result = plan("nbody", bodies=bodies, steps=10, device="h100", interconnect="nvlink", max_gpus=4)
    one = result.row(1)
    assert one.bound == "compute"
    flops_time = 20 * bodies ** 2 / (h100.peak("float32") * h100.fraction("nbody", "float32"))
    assert one.compute_s == pytest.approx(flops_time, rel=0.01)
    for gpus in (2, 4):
        assert result.row(gpus).compute_s == pytest.approx(one.compute_s / gpus, rel=0.01)
        assert result.row(gpus).parallel_efficiency > 0.9
    assert not any("too small" in w for w in result.warnings)


def test_weather_on_a_large_grid_is_bandwidth_bound():
    nx = ny = 16384
    h100 = DEVICES["h100"]
    result = plan("weather", nx=nx, ny=ny, steps=10_000, device="h100", max_gpus=1)
    one = result.row(1)
    assert one.bound == "bandwidth"
    traffic_time = 24 * 4 * nx * ny / (h100.copy_bandwidth * h100.fraction("stencil", "float32"))
    # the rest is the launches and the halo copies (under a per cent at K = 16)
    assert traffic_time < one.compute_s < 1.02 * traffic_time
    assert one.time_to_solution_s == pytest.approx(10_000 * one.seconds_per_step)


def test_a_tiny_grid_on_ethernet_is_communication_bound_and_gets_the_too_small_warning():
    result = plan("weather", nx=64, ny=64, steps=1000, device="h100", interconnect="100gbe", max_gpus=4)
    two = result.row(2)
    assert two.parallel_efficiency < 0.5
    assert two.exchange_s + two.scheduler_s > two.compute_s
    assert two.seconds_per_step > result.row(1).seconds_per_step
    assert any(w.startswith("too small to gain from more than 1 GPU") for w in result.warnings)


@pytest.mark.parametrize("workload, size, max_gpus", [
    ("weather", dict(nx=16384, ny=16384), 16),
    ("md", dict(atoms=50_000_000), 16),
    ("nbody", dict(bodies=1_000_000), 16),
])
def test_a_large_fixed_problem_gets_faster_with_each_gpu_count_at_falling_efficiency(workload, size, max_gpus):
    rows = plan(workload, steps=100, device="h100", interconnect="ndr", max_gpus=max_gpus, **size).rows
    times = [r.time_to_solution_s for r in rows]
    efficiency = [r.parallel_efficiency for r in rows]
    assert times == sorted(times, reverse=True)
    assert all(a >= b for a, b in zip(efficiency, efficiency[1:]))


@pytest.mark.parametrize("workload, size", [
    ("weather", dict(nx=4096, ny=4096)), ("weather", dict(nx=64, ny=1024, periodic=True)),
    ("md", dict(atoms=10_000_000)), ("md", dict(atoms=100_000)),
    ("nbody", dict(bodies=1_000_000)), ("nbody", dict(bodies=1000)),
])
@pytest.mark.parametrize("device", ["h100", "cpu"])
def test_efficiency_never_rises_at_one_k_and_memory_per_gpu_falls_with_the_gpu_count(workload, size, device):
    rows = feasible(plan(workload, steps=100, device=device, interconnect="100gbe", max_gpus=64, **size).rows)
    rated = [r for r in rows if not math.isnan(r.parallel_efficiency)]
    memory = [r.memory_per_gpu_bytes for r in rows]
    assert len(rows) >= 3
    # where the engine lowers K (smaller blocks), the redundant halo work falls and efficiency may rise
    assert all(a.parallel_efficiency >= b.parallel_efficiency - 1e-12 for a, b in zip(rated, rated[1:])
               if a.steps_per_task == b.steps_per_task)
    assert all(a > b for a, b in zip(memory, memory[1:]))


def test_a_state_too_big_for_one_gpu_gives_the_minimum_gpu_count():
    result = plan("weather", nx=131072, ny=131072, steps=100, device="a100", max_gpus=64)
    usable = USABLE_MEMORY_FRACTION * DEVICES["a100"].memory_bytes
    least = result.min_gpus_to_fit
    assert least > 1
    a100 = DEVICES["a100"]
    workload = WeatherCost(131072, 131072, steps=100)
    assert workload.cost(least, a100, LINKS["ndr"], SchedulerModel()).memory_bytes <= usable
    assert workload.cost(least - 1, a100, LINKS["ndr"], SchedulerModel()).memory_bytes > usable
    assert any(w.startswith("does not fit") and f"at least {least} GPUs" in w for w in result.warnings)
    fitting = [r for r in result.rows if r.fits]
    assert [r.gpus for r in result.rows if not r.fits] == [p for p in (1, 2, 4, 8, 16) if p < least]
    assert fitting[0].parallel_efficiency == pytest.approx(1.0)


def test_weather_blocks_thinner_than_the_halo_are_reported_not_planned():
    # one step reads 6 cells beyond a block along x and y: 24 x 24 cells hold at most 4 x 4 blocks
    result = plan("weather", nx=24, ny=24, steps=10, max_gpus=32)
    assert [r.feasible for r in result.rows] == [True, True, True, True, True, False]
    assert result.row(16).grid == (4, 4) and result.row(16).steps_per_task == 1
    assert result.row(32).grid == () and "thinner than the 6-cell frame" in result.row(32).note
    assert any("cannot split" in w for w in result.warnings)
    # a forced grid whose blocks cannot hold one step's halo
    assert not WeatherCost(24, 24, steps=1).cost(8, H100, LINKS["ndr"], SchedulerModel(), grid=(1, 8)).feasible


# -- the exchange and the scheduler ---------------------------------------------------------

def test_weather_rows_halo_term_is_independent_of_the_rows_per_gpu_and_proportional_to_nx():
    def exchange(nx, ny, link=BANDWIDTH_ONLY):
        return WeatherCost(nx, ny, steps=1, steps_per_task=4).cost(4, H100, link, SchedulerModel(), grid=(1, 4))

    assert exchange(2048, 4096).exchange_s == pytest.approx(exchange(2048, 16384).exchange_s, rel=1e-12)
    assert exchange(4096, 4096).exchange_s == pytest.approx(2 * exchange(2048, 4096).exchange_s, rel=1e-12)
    # every K = 4 steps: each field's own cone of rows (of a frame of 24 + 12): u 13 + 12, v 12 + 12, h 13 + 12
    # float32 rows to the two neighbours, one message each, sent together: one latency
    cost = exchange(2048, 4096)
    assert cost.grid == (1, 4)
    assert cost.exchange_bytes == pytest.approx((25 + 24 + 25) * 2048 * 4 / 4)
    assert cost.messages == pytest.approx(2 / 4) and cost.rounds == pytest.approx(1 / 4)
    assert exchange(2048, 4096, LATENCY_ONLY).exchange_s == pytest.approx(1 / 4 * 1e-3)


def test_weather_2d_blocks_exchange_a_frame_with_corners_in_two_stages_and_step_it():
    weather = WeatherCost(4096, 4096, steps=1, steps_per_task=4)
    cost = weather.cost(16, NO_LAUNCH, BANDWIDTH_ONLY, SchedulerModel(), grid=(4, 4))
    # blocks of 1024 x 1024 with frames of 24 west and south, 12 east and north (reach 2 and 1 per stage);
    # each field sends its own cone: u (west, east, south, north) = (12, 12, 13, 12), v (13, 12, 12, 12),
    # h (13, 12, 13, 12)
    sent = sum((1024 + x) * (1024 + y) - 1024 * 1024 for x, y in ((24, 25), (25, 24), (25, 25)))
    assert cost.exchange_bytes == pytest.approx(sent * 4 / 4)
    assert cost.messages == pytest.approx(4 / 4) and cost.rounds == pytest.approx(2 / 4)
    latency = weather.cost(16, H100, LATENCY_ONLY, SchedulerModel(), grid=(4, 4))
    assert latency.exchange_s == pytest.approx(2 / 4 * 1e-3)
    # the stepped cells: the x and y frames shrinking to half on average (periodic x: 36 columns a block)
    unit = WeatherCost(4096, 4096, steps=1, steps_per_task=1)
    one = unit.cost(1, NO_LAUNCH, BANDWIDTH_ONLY, SchedulerModel()).compute_s
    stepped = cost.compute_s / one * 4096 * 4096
    copies = 2 * 2 * sent * 4 / H100.copy_bandwidth / 4 / (one / (4096 * 4096))  # cut, then written
    # between walls the engine gives the blocks at a wall more rows for equal work: every block steps the mean
    assert stepped - copies == pytest.approx((1024 + 18) * (4096 + (12 + 36 + 36 + 24) / 2) / 4, rel=1e-9)
    periodic = WeatherCost(4096, 4096, steps=1, steps_per_task=4, periodic=True)
    stepped = periodic.cost(16, NO_LAUNCH, BANDWIDTH_ONLY, SchedulerModel(), grid=(4, 4)).compute_s / one * 4096 * 4096
    assert stepped - copies == pytest.approx((1024 + 18) * (1024 + 18), rel=1e-9)


@pytest.mark.parametrize("nx, ny, partitions", [
    (1024, 512, 2), (512, 1024, 2), (16384, 16384, 64), (16384, 16384, 128), (4096, 1024, 16), (256, 256, 6),
    (64, 1024, 16), (1024, 1024, 16),
])
def test_weather_grid_and_k_are_the_ones_the_engine_chooses(nx, ny, partitions):
    from hpcgpu.partition.grid import GridDecomposition
    from hpcgpu.workloads.weather import ShallowWater

    model = ShallowWater("unstable_jet", nx=nx, ny=ny, backend="numpy")
    layout = GridDecomposition.build(model, 30.0, partitions, None, None, False)
    weather = WeatherCost(nx, ny, steps=1)
    assert weather.process_grid(partitions) == layout.grid
    assert weather.steps_per_exchange(partitions) == layout.steps_per_task
    assert weather.cost(partitions, H100, LINKS["ndr"], SchedulerModel()).grid == layout.grid


def test_weather_rows_go_to_two_ranks_when_ny_is_not_smaller_and_the_table_names_the_grid():
    assert WeatherCost(512, 1024, steps=1).process_grid(2) == (1, 2)
    assert WeatherCost(1024, 1024, steps=1).process_grid(2) == (1, 2)
    assert WeatherCost(1024, 512, steps=1).process_grid(2) == (2, 1)
    result = plan("weather", nx=16384, ny=16384, steps=10, device="h200", max_gpus=64)
    assert [r.grid for r in result.rows] == [(1, 1), (1, 2), (1, 4), (2, 4), (4, 4), (4, 8), (8, 8)]
    assert " 8x8 " in result.table()


def test_weather_k_is_the_largest_whose_halo_is_a_quarter_of_the_block_on_every_split_axis():
    weather = WeatherCost(4096, 1024, steps=1)
    # blocks of 1024 x 1024: a halo of 96 = 6 x 16 fits four times along both axes
    assert weather.steps_per_exchange(4, grid=(4, 1)) == 16
    # blocks of 128 columns: 6 K <= 32 gives K = 4, whatever the rows
    assert weather.steps_per_exchange(32, grid=(32, 1)) == 4
    # an unsplit axis does not count: 4096 x 64 rows, only y split
    assert weather.steps_per_exchange(16, grid=(1, 16)) == 2
    # a K given is lowered until the widest halo fits in the block (6 K <= 32 columns)
    assert WeatherCost(4096, 1024, steps=1, steps_per_task=16).steps_per_exchange(128, grid=(128, 1)) == 5


def test_nbody_allgather_term_grows_with_the_gpu_count_and_the_bodies():
    link = LinkProfile("example", bandwidth=45e9, latency_s=20e-6)

    def exchange(bodies, gpus):
        return NBodyCost(bodies, steps=1).cost(gpus, H100, link, SchedulerModel()).exchange_s

    by_gpus = [exchange(1_000_000, p) for p in (1, 2, 4, 8, 16)]
    assert by_gpus[0] == 0.0 and by_gpus == sorted(by_gpus) and len(set(by_gpus)) == 5
    by_bodies = [exchange(n, 8) for n in (10_000, 100_000, 1_000_000)]
    assert by_bodies == sorted(by_bodies) and len(set(by_bodies)) == 3
    # an allgather by recursive doubling: log2 P rounds, P - 1 blocks of positions and masses (4 float32 each)
    assert exchange(1_000_000, 8) == pytest.approx(3 * 20e-6 + 7 * 4 * 4 * 125_000 / 45e9)
    cost = NBodyCost(1_000_000, steps=1).cost(6, H100, link, SchedulerModel())
    assert cost.messages == 3 and cost.grid == (6,)


def test_md_ghosts_fill_the_shell_around_a_brick_on_its_split_axes():
    md = MolecularDynamicsCost(8_000_000, steps=1, rebuild_every=10 ** 9)  # rebuilds too rare to count
    side, radius = md.box_side, md.ghost_radius

    def ghost_bytes(grid):
        return md.cost(math.prod(grid), H100, BANDWIDTH_ONLY, SchedulerModel(), grid=grid).exchange_bytes

    for grid in [(1, 1, 4), (2, 2, 2), (4, 2, 1), (4, 4, 4)]:
        brick = [side / p for p in grid]
        shell = math.prod(b + 2 * radius * (p > 1) for b, p in zip(brick, grid)) - math.prod(brick)
        assert ghost_bytes(grid) == pytest.approx(shell * md.density * 3 * 8, rel=1e-6), grid
    # slabs: the same two faces however many; bricks: the shell shrinks with the brick
    assert ghost_bytes((1, 1, 8)) == pytest.approx(ghost_bytes((1, 1, 4)), rel=1e-9)
    assert ghost_bytes((4, 4, 4)) < ghost_bytes((2, 2, 2)) < ghost_bytes((1, 1, 8))


def test_md_exchanges_in_one_stage_per_split_axis_and_no_collective():
    md = MolecularDynamicsCost(10_000_000, steps=1, rebuild_every=15)
    for gpus, grid in [(2, (2, 1, 1)), (8, (4, 2, 1)), (64, (4, 4, 4)), (4096, (16, 16, 16)), (27, (3, 3, 3))]:
        cost = md.cost(gpus, H100, LATENCY_ONLY, SchedulerModel())
        stages = sum(p > 1 for p in grid)
        assert cost.grid == grid
        # 2 messages per stage, once more on rebuild steps; the rebuild flags ride along on every grid
        # (hpcgpu.partition.rebuild_flags): past 3 layers a rebuild decided late, a little more often
        period = 15 if max(grid) <= 3 else 15 - 0.5 * (max(grid) // 2 - 1)
        assert md.rebuild_period(grid) == period
        assert cost.messages == pytest.approx(2 * stages * (1 + 1 / period))
        assert cost.rounds == pytest.approx(stages * (1 + 1 / period))
        # on a GPU the ghost messages of most steps hide behind the inner atoms' forces, where there are some
        assert cost.exchange_s <= cost.rounds * 1e-3 * (1 + 1e-12)
        cpu = md.cost(gpus, DEVICES["cpu"], LATENCY_ONLY, SchedulerModel())
        assert cpu.exchange_s == pytest.approx(cpu.rounds * 1e-3)


def test_md_bricks_thinner_than_the_ghost_radius_are_reported_not_planned():
    md = MolecularDynamicsCost(100_000, steps=1)  # a box of 48.8 sigma: at most 15 bricks of 3.1 per axis
    assert md.cost(2744, H100, LINKS["ndr"], SchedulerModel()).grid == (14, 14, 14)
    refused = md.cost(4096, H100, LINKS["ndr"], SchedulerModel())
    assert not refused.feasible and "thinner than cutoff + 2 skin" in refused.note
    assert not md.cost(32, H100, LINKS["ndr"], SchedulerModel(), grid=(1, 1, 32)).feasible


def test_md_of_1e8_atoms_splits_into_bricks_up_to_1024_gpus():
    result = plan("md", atoms=1e8, steps=1000, device="h200", interconnect="ndr", max_gpus=1024)
    assert all(r.feasible for r in result.rows)
    assert result.row(256).grid == (8, 8, 4) and result.row(1024).grid == (16, 8, 8)
    # what bricks buy over slabs: at 128 GPUs slabs gave 0.32 (z slabs of 3.8 sigma, 2 big faces each)
    assert result.row(128).parallel_efficiency > 0.75
    # issue 32's target: no collective a step (late rebuilds) and the exchange beside the inner forces
    assert result.row(256).parallel_efficiency >= 0.8 and result.row(256).rounds_per_step < 3.5
    slab = MolecularDynamicsCost(10 ** 8, steps=1).cost(128, DEVICES["h200"], LINKS["ndr"], SchedulerModel(),
                                                        grid=(1, 1, 128))
    # 128 slabs: a rebuild flag would need 63 steps to reach every rank, longer than a list lasts
    assert not slab.feasible and "decided 63 steps late" in slab.note


def test_the_scheduler_is_paid_once_per_epoch_over_its_steps():
    scheduler = SchedulerModel(epoch_overhead_s=2e-3, task_overhead_s=1e-4)
    weather = WeatherCost(4096, 4096, steps=1, steps_per_task=8)
    cost = weather.cost(4, H100, LINKS["ndr"], scheduler)
    # an epoch's 5 tasks are submitted while earlier epochs step: only the hand-over is exposed
    assert cost.scheduler_s == pytest.approx((2e-3 + 0.2 * 5 * 1e-4) / cost.steps_per_epoch)
    # the engine gathers whole supersteps until an epoch holds EPOCH_SECONDS of work
    step = cost.compute_s + cost.exchange_s
    assert cost.steps_per_epoch % 8 == 0
    assert EPOCH_SECONDS <= cost.steps_per_epoch * step < EPOCH_SECONDS + 8 * step
    # a step longer than an epoch: one superstep per epoch
    assert SchedulerModel().steps_in_epoch(2.0, steps_per_task=4) == 4
    fixed = SchedulerModel(epoch_overhead_s=2e-3, task_overhead_s=0.0, steps_per_epoch=100)
    for workload in (weather, MolecularDynamicsCost(1_000_000, steps=1), NBodyCost(100_000, steps=1)):
        assert workload.cost(4, H100, LINKS["ndr"], fixed).scheduler_s == pytest.approx(2e-5)


@pytest.mark.parametrize("work", [0.0, 0.01, 0.05, 0.0655, 0.5])
def test_the_submission_is_exposed_only_where_it_outlasts_the_epochs_work(work):
    scheduler = SchedulerModel(epoch_overhead_s=2e-3, task_overhead_s=1e-4, handover_share=0.2)
    partitions = 1023  # 1024 tasks: 81.92 ms of submission, 20.48 ms of hand-over
    submission, handover = 0.8 * 1024 * 1e-4, 2e-3 + 0.2 * 1024 * 1e-4
    assert scheduler.submission_s(partitions) == pytest.approx(submission)
    assert scheduler.handover_s(partitions) == pytest.approx(handover)
    assert scheduler.exposed_epoch_s(partitions, work) == pytest.approx(handover + max(0.0, submission - work))
    # all of it is paid once, whatever hides it
    assert scheduler.epoch_s(partitions) == pytest.approx(submission + handover)


def test_the_scheduler_per_step_follows_the_engines_epochs_of_work():
    scheduler = SchedulerModel(epoch_overhead_s=2e-3, task_overhead_s=1e-3)
    # 1 ms steps: 500 steps per epoch hide 0.8 x 1025 ms = 820 ms of submission only in part
    exposed = 2e-3 + 0.2 * 1025e-3 + (0.8 * 1025e-3 - 0.5)
    assert scheduler.per_step_s(1024, 1e-3) == pytest.approx(exposed / 500)
    # 10 ms steps: the epoch's 500 ms hide the 4 ms of submission of 4 workers
    assert scheduler.per_step_s(4, 1e-2) == pytest.approx((2e-3 + 0.2 * 5e-3) / 50)
    # the old model charged the whole epoch: the new is never more
    assert scheduler.per_step_s(4, 1e-2) < scheduler.epoch_s(4) / 50
    # a plan's rows use it: MD on 1024 GPUs, 1025 tasks an epoch
    row = plan("md", atoms=1e8, steps=1, device="h200", max_gpus=1024).row(1024)
    default = SchedulerModel()
    assert row.steps_per_epoch == default.steps_in_epoch(row.compute_s + row.exchange_s)
    assert row.scheduler_s == pytest.approx(default.per_step_s(1024, row.compute_s + row.exchange_s))
    assert row.scheduler_s == pytest.approx(default.handover_s(1024) / row.steps_per_epoch)  # submission hidden


# -- kernel launches ----------------------------------------------------------------------

def test_a_gpu_waits_for_the_first_launch_after_a_sync_and_behind_short_kernels_only():
    launch = H100.launch_s
    assert launch_wait_s(H100, [[1e-3] * 48]) == pytest.approx(launch)  # the host stays ahead
    assert launch_wait_s(H100, [[1e-3] * 48] * 3) == pytest.approx(3 * launch)  # once per stretch
    assert launch_wait_s(H100, [[1e-6] * 10]) == pytest.approx(10 * launch - 9e-6)  # host-bound
    # behind one long kernel the host catches up: the short kernels queued during it do not wait
    assert launch_wait_s(H100, [[1e-6, 1e-3, 1e-6, 1e-6]]) == pytest.approx(2 * launch - 1e-6)
    # a CPU runs each region itself: every launch is paid
    cpu = DEVICES["cpu"]
    assert launch_wait_s(cpu, [[1e-3] * 4, [1e-3] * 2]) == pytest.approx(6 * cpu.launch_s)


def test_weather_on_gpus_pays_the_launches_after_its_two_exchange_stages_per_superstep():
    weather = WeatherCost(16384, 16384, steps=1)
    cost = weather.cost(64, DEVICES["h200"], BANDWIDTH_ONLY, SchedulerModel(), grid=(8, 8))
    free = weather.cost(64, replace(DEVICES["h200"], launch_s=0.0), BANDWIDTH_ONLY, SchedulerModel(), grid=(8, 8))
    k, launch = cost.steps_per_task, DEVICES["h200"].launch_s
    assert k == 16
    # per superstep: the 6 x-frame writes (3 fields x 2 sides) after the x stage, the 6 y-frame writes
    # and the first of the 48 stage kernels after the y stage: 13 launches, less the 11 short copies' own
    # time (each well under a launch), over K = 16 steps
    assert cost.compute_s - free.compute_s == pytest.approx(13 * launch / k, rel=0.03)
    assert cost.compute_s - free.compute_s < 13 * launch / k
    assert cost.compute_s - free.compute_s < launch  # the old model charged 3 launches a step
    # on a CPU the three stages of every step are paid, as plan --check measures them
    cpu = DEVICES["cpu"]
    on_cpu = weather.cost(64, cpu, BANDWIDTH_ONLY, SchedulerModel(), grid=(8, 8))
    cpu_free = weather.cost(64, replace(cpu, launch_s=0.0), BANDWIDTH_ONLY, SchedulerModel(), grid=(8, 8))
    assert on_cpu.compute_s - cpu_free.compute_s == pytest.approx(3 * cpu.launch_s)


def test_md_on_gpus_pays_the_ghost_cuts_of_each_stage_and_the_first_launch_after_them():
    from hpcgpu.plan.workload_costs import launch_wait_s

    md, h200 = MolecularDynamicsCost(10 ** 8, steps=1), DEVICES["h200"]
    launch = h200.launch_s
    for stages in (3, 2):
        stretches = md.launch_stretches(1e-3, 0.9, 1e-6, stages)
        # one cut for both neighbours, then the join of the stage before and the next cut, then the last
        # join and the forces behind it; the kick, drift, rebuild test and reductions queue behind the forces
        assert [len(s) for s in stretches] == [1] + [2] * (stages - 1) + [7]
        assert launch_wait_s(h200, stretches) == pytest.approx((2 * stages + 1) * launch, rel=0.02)
    for grid in ((8, 8, 4), (16, 16, 1)):
        paid = md.cost(256, h200, BANDWIDTH_ONLY, SchedulerModel(), grid=grid).compute_s
        free = md.cost(256, replace(h200, launch_s=0.0), BANDWIDTH_ONLY, SchedulerModel(), grid=grid).compute_s
        # the steps that speculate launch their cuts beside the inner forces: less than the plain step's waits
        stages = sum(p > 1 for p in grid)
        assert launch <= paid - free < (2 * stages + 1) * launch


def test_a_link_is_fitted_from_two_round_trips():
    latency, bandwidth = 150e-6, 2e9
    trips = {size: 2 * (latency + size / bandwidth) for size in (4096, 2 ** 20)}
    link = fit_link(trips)
    assert link.latency_s == pytest.approx(latency) and link.bandwidth == pytest.approx(bandwidth)
    assert link.basis == "measured"
    # noise that makes the large message no slower is credited with at most 64 GB/s
    assert fit_link({4096: 1e-3, 2 ** 20: 0.9e-3}).bandwidth == pytest.approx(64e9)


def test_md_uses_the_full_neighbour_list_size():
    assert MolecularDynamicsCost(10 ** 6, steps=1).pairs_per_atom == pytest.approx(77.6, abs=0.1)


# -- device profiles --------------------------------------------------------------------

def test_only_this_machines_link_is_measured_and_every_other_is_marked_an_assumption():
    assert LINKS["tcp-local"].basis == "measured"
    for name in ("nvlink", "ndr", "ucx-nvlink", "ucx-ndr", "100gbe"):
        assert LINKS[name].basis == "assumed", name
        assert "not yet measured" in LINKS[name].source
    given = link_profile("ndr", latency_us=5)
    assert given.basis == "given" and given.latency_s == 5e-6 and given.bandwidth == LINKS["ndr"].bandwidth
    assert link_profile("tcp-local", bandwidth_gbs=0.8).basis == "given"


def test_the_summary_lists_what_is_assumed():
    summary = plan("md", atoms=10 ** 6, steps=10, device="h100", interconnect="ndr", max_gpus=2).records()[-1]
    assert summary["interconnect_basis"] == "assumed" and summary["scheduler_basis"] == "assumed"
    assert {"interconnect", "scheduler", "fraction:md", "fraction:neighbor_build"} <= set(summary["assumed"])
    assert "fraction:stencil" not in summary["assumed"]  # measured on the H200
    assert summary["interconnect_latency_s"] == LINKS["ndr"].latency_s
    local = plan("weather", nx=512, ny=512, steps=10, device="cpu", interconnect="tcp-local", max_gpus=2,
                 scheduler=SchedulerModel(3e-3, 0.0, source="measured: here")).records()[-1]
    assert local["interconnect_basis"] == "measured" and local["scheduler_basis"] == "measured"
    assert "interconnect" not in local["assumed"] and "scheduler" not in local["assumed"]


def test_named_profiles_carry_their_data_sheet_numbers():
    assert DEVICES["h100"].bandwidth == 3.35e12 and DEVICES["h100"].memory_bytes == 80e9
    assert DEVICES["h200"].bandwidth == 4.8e12 and DEVICES["h200"].memory_bytes == 141e9
    assert DEVICES["h200"].peak_flops == DEVICES["h100"].peak_flops
    assert DEVICES["a100"].peak("float64") == 9.7e12


def test_a_measured_profile_reads_copy_gemm_and_kernel_fractions_from_bench_lines(tmp_path):
    lines = [
        {"suite": "copy", "case": "copy", "backend": "cupy", "dtype": "float32", "metric": "bytes_per_s",
         "value": 4.0e12, "memory_bytes": 141e9},
        {"suite": "matrix", "case": "gemm", "backend": "cupy", "dtype": "float64", "metric": "flops_per_s",
         "value": 50e12},
        {"suite": "matrix", "case": "spmv", "backend": "cupy", "dtype": "float64", "metric": "bytes_per_s",
         "value": 1.0e12, "copy_gb_per_s": 4000.0},
        {"suite": "stencil", "case": "shallow_water", "backend": "cuda", "dtype": "float32",
         "metric": "point_updates_per_s", "value": 1e10, "fraction_of_copy": 0.55, "copy_gb_per_s": 4000.0},
        {"suite": "stencil", "case": "shallow_water", "backend": "cupy", "dtype": "float32",
         "metric": "point_updates_per_s", "value": 1e10, "fraction_of_copy": 0.6, "copy_gb_per_s": 4000.0},
    ]
    path = tmp_path / "bench.jsonl"
    path.write_text("\n".join(json.dumps(line) for line in lines) + "\nnot json\n")
    profile = device_profile(str(path))
    assert profile.kind == "gpu" and profile.bandwidth == 4.0e12 and profile.copy_fraction == 1.0
    assert profile.memory_bytes == 141e9 and profile.peak("float64") == 50e12
    assert profile.fraction("stencil", "float32") == 0.6
    assert "measured" in profile.sources["stencil"]


def test_a_cpu_profile_takes_the_fused_steps_flop_rate_over_the_peak(tmp_path):
    lines = [
        {"suite": "matrix", "case": "gemm", "backend": "numpy", "dtype": "float32", "metric": "flops_per_s",
         "value": 300e9, "copy_gb_per_s": 20.0},
        {"suite": "stencil", "case": "shallow_water", "backend": "numba", "dtype": "float32",
         "metric": "point_updates_per_s", "value": 1.6e8, "fraction_of_copy": 0.7, "copy_gb_per_s": 20.0},
        {"suite": "stencil", "case": "shallow_water_fused_step", "backend": "numba", "dtype": "float32",
         "metric": "point_updates_per_s", "value": 2.0e8, "fraction_of_copy": 0.2, "copy_gb_per_s": 20.0},
    ]
    path = tmp_path / "bench.jsonl"
    path.write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    profile = device_profile(str(path), memory_gb=20)
    assert profile.kind == "cpu"
    assert profile.fraction("stencil", "float32") == pytest.approx(2.0e8 * WeatherCost.flops_per_point_step / 300e9)
    assert "fused" in profile.sources["stencil"]


def test_the_h200_bench_lines_in_docs_give_the_documented_fraction():
    profile = measured_device(DOCS / "bench-h200-2026-11-30.jsonl", memory_gb=141)
    assert profile.fraction("stencil", "float32") == pytest.approx(0.266, abs=0.005)
    assert 3.5e12 < profile.copy_bandwidth < 4.3e12


# -- bad input ----------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs, words", [
    (dict(workload="climate", nx=8, ny=8, steps=1), ["workload", "'weather'", "'md'", "'nbody'"]),
    (dict(workload="weather", nx=64, ny=64, steps=1, device="b200"), ["device", "h100", "h200", "a100", "cpu"]),
    (dict(workload="weather", nx=64, ny=64, steps=1, interconnect="ethernet"),
     ["interconnect", "nvlink", "ndr", "ucx-ndr", "100gbe", "tcp-local"]),
    (dict(workload="weather", nx=0, ny=64, steps=1), ["nx", ">= 4"]),
    (dict(workload="weather", nx=64, ny=-8, steps=1), ["ny"]),
    (dict(workload="weather", nx=64, ny=64, steps=0), ["steps", ">= 1"]),
    (dict(workload="md", atoms=0, steps=1), ["atoms"]),
    (dict(workload="nbody", bodies=-5, steps=1), ["bodies"]),
    (dict(workload="nbody", bodies=100, steps=1, max_gpus=0), ["max_gpus"]),
    (dict(workload="nbody", steps=1), ["bodies"]),
    (dict(workload="md", nx=64, atoms=1000, steps=1), ["nx", "atoms"]),
    (dict(workload="md", atoms=1000, steps=1, dtype="float16"), ["dtype"]),
])
def test_bad_input_raises_config_error_naming_the_parameter_and_valid_choices(kwargs, words):
    workload = kwargs.pop("workload")
    with pytest.raises(ConfigError) as error:
        plan(workload, **kwargs)
    for word in words:
        assert word in str(error.value)


def test_a_measured_profile_without_a_memory_size_asks_for_one():
    with pytest.raises(ConfigError, match="memory_gb"):
        device_profile(str(DOCS / "bench-h200-2026-11-30.jsonl"))


# -- command line -------------------------------------------------------------------------

def test_cli_prints_the_table_and_json_lines():
    table = run_cli("plan", "weather", "--nx", "16384", "--ny", "16384", "--steps", "1e4", "--max-gpus", "4")
    assert table.returncode == 0, table.stderr
    assert "hpcgpu plan: weather 16384 x 16384" in table.stdout and "efficiency" in table.stdout
    assert table.stdout.splitlines()[1].split()[:2] == ["GPUs", "grid"]
    assert table.stdout.splitlines()[1].split()[6:9] == ["compute", "exchange", "scheduler"]
    assert len([line for line in table.stdout.splitlines() if line.split()[:1] in (["1"], ["2"], ["4"])]) == 3
    lines = run_cli("plan", "md", "--atoms", "1e7", "--steps", "1e6", "--device", "h200", "--interconnect",
                    "nvlink", "--max-gpus", "4", "--json")
    assert lines.returncode == 0, lines.stderr
    records = [json.loads(line) for line in lines.stdout.splitlines()]
    assert [r["gpus"] for r in records if r["kind"] == "plan"] == [1, 2, 4]
    assert records[-1]["kind"] == "summary" and records[-1]["device"] == "h200"
    assert records[0]["size"] == {"atoms": 10_000_000} and records[0]["steps"] == 1_000_000
    assert records[1]["exchange_s"] > 0 and records[1]["messages_per_step"] > 0
    assert [r["grid"] for r in records if r["kind"] == "plan"] == [[1, 1, 1], [2, 1, 1], [4, 1, 1]]
    bad = run_cli("plan", "weather", "--nx", "64", "--ny", "64", "--interconnect", "infiniband")
    assert bad.returncode == 2 and "interconnect must be one of" in bad.stderr


def test_cli_overrides_of_the_link_and_the_scheduler_are_labelled_given():
    lines = run_cli("plan", "nbody", "--bodies", "1e5", "--max-gpus", "2", "--link-gbs", "2", "--link-latency-us",
                    "150", "--epoch-overhead-ms", "5", "--json")
    assert lines.returncode == 0, lines.stderr
    summary = json.loads(lines.stdout.splitlines()[-1])
    assert summary["interconnect_basis"] == "given" and summary["interconnect_bandwidth_bytes_per_s"] == 2e9
    assert summary["interconnect_latency_s"] == pytest.approx(150e-6)
    assert summary["scheduler_basis"] == "given" and summary["epoch_overhead_s"] == pytest.approx(5e-3)


def test_check_against_this_machine_reports_a_finite_relative_error():
    result = run_cli("plan", "--check", "--json", "--nx", "512", "--ny", "256", "--steps-per-task", "4",
                     timeout=180)
    assert result.returncode == 0, result.stderr
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    assert [r["workers"] for r in rows] == [1, 2]
    for row in rows:
        assert row["kind"] == "check" and math.isfinite(row["relative_error"])
        assert row["predicted_s_per_step"] > 0 and row["measured_s_per_step"] > 0
        assert row["steps_per_task"] == 4 and row["steps_per_epoch"] % 4 == 0
        assert row["predicted_scheduler_s"] > 0
    # one worker sends nothing; two exchange halos
    assert rows[0]["predicted_exchange_s"] == 0 and rows[1]["predicted_exchange_s"] > 0
    profile = rows[0]["profile"]
    assert profile["link_latency_s"] >= 0 and profile["link_bytes_per_s"] > 0
    assert profile["epoch_overhead_s_1_workers"] > 0 and profile["epoch_overhead_s_2_workers"] > 0
    assert math.isfinite(rows[0]["measured_efficiency"])


def test_the_table_shows_a_dash_where_a_gpu_count_has_no_efficiency(capsys):
    """GPU counts below the smallest that fits have no baseline: '-', not 'nan'."""
    from hpcgpu.cli import main

    assert main(["plan", "weather", "--nx", "65536", "--ny", "65536", "--steps", "1e4", "--device", "h200"]) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines() if line.strip()[:1].isdigit()]
    assert "nan" not in " ".join(" ".join(r) for r in rows)
    unfit = [r for r in rows if "fit" in r]
    assert [r[0] for r in unfit] == ["1", "2"] and all(r[r.index("GB") + 1] == "-" for r in unfit)
