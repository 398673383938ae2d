"""``hpcgpu plan``: the performance model on known cases, its input checks and its command line."""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hpcgpu._plan_workloads import MolecularDynamics, NBody, Weather
from hpcgpu._profiles import DEVICES, LINKS, device_profile, measured_device
from hpcgpu.errors import ConfigError
from hpcgpu.plan import USABLE_MEMORY_FRACTION, SchedulerModel, plan

HPCGPU = [sys.executable, "-P", "-m", "hpcgpu.cli"]
DOCS = Path(__file__).resolve().parents[1] / "docs"


def run_cli(*args, timeout=120):
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    return subprocess.run([*HPCGPU, *args], capture_output=True, text=True, timeout=timeout, env=env)


def feasible(rows):
    return [r for r in rows if r.feasible]


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
    assert two.transfer_s + two.scheduler_s > two.compute_s
    assert two.seconds_per_step > result.row(1).seconds_per_step
    assert any(w.startswith("too small to gain from more than 1 GPU") for w in result.warnings)


@pytest.mark.parametrize("workload, size, max_gpus", [
    ("weather", dict(nx=16384, ny=16384), 16),
    ("md", dict(atoms=50_000_000), 8),  # 4P tasks per step: dask's overhead catches up at 16
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
def test_efficiency_never_rises_and_memory_per_gpu_falls_with_the_gpu_count(workload, size, device):
    rows = feasible(plan(workload, steps=100, device=device, interconnect="100gbe", max_gpus=64, **size).rows)
    efficiency = [r.parallel_efficiency for r in rows if not math.isnan(r.parallel_efficiency)]
    memory = [r.memory_per_gpu_bytes for r in rows]
    assert len(rows) >= 3
    assert all(a >= b - 1e-12 for a, b in zip(efficiency, efficiency[1:]))
    assert all(a > b for a, b in zip(memory, memory[1:]))


def test_a_state_too_big_for_one_gpu_gives_the_minimum_gpu_count():
    result = plan("weather", nx=131072, ny=131072, steps=100, device="a100", max_gpus=64)
    usable = USABLE_MEMORY_FRACTION * DEVICES["a100"].memory_bytes
    least = result.min_gpus_to_fit
    assert least > 1
    a100 = DEVICES["a100"]
    workload = Weather(131072, 131072, steps=100)
    assert workload.cost(least, a100, LINKS["ndr"], SchedulerModel()).memory_bytes <= usable
    assert workload.cost(least - 1, a100, LINKS["ndr"], SchedulerModel()).memory_bytes > usable
    assert any(w.startswith("does not fit") and f"at least {least} GPUs" in w for w in result.warnings)
    fitting = [r for r in result.rows if r.fits]
    assert [r.gpus for r in result.rows if not r.fits] == [p for p in (1, 2, 4, 8, 16) if p < least]
    assert fitting[0].parallel_efficiency == pytest.approx(1.0)


def test_weather_blocks_thinner_than_the_halo_are_reported_not_planned():
    result = plan("weather", nx=256, ny=64, steps=10, max_gpus=16)
    assert [r.feasible for r in result.rows] == [True, True, True, True, False]
    assert result.row(8).steps_per_task == 1  # 8 rows per block leave room for one step's 6-row halo
    assert any("cannot split" in w for w in result.warnings)


def test_the_scheduler_term_counts_the_engines_tasks():
    per_task = SchedulerModel(task_overhead_s=1e-3, round_trip_s=0.0)
    weather = Weather(4096, 4096, steps=1, steps_per_task=16, periodic=True)
    assert weather.cost(4, DEVICES["h100"], LINKS["ndr"], per_task).scheduler_s == pytest.approx(3 * 4e-3 / 16)
    md = MolecularDynamics(10_000_000, steps=1)
    # per slab: the kick, one exchange per neighbour and (beyond three slabs) the rebuild test
    assert md.cost(8, DEVICES["h100"], LINKS["ndr"], per_task).scheduler_s == pytest.approx(8 * 4 * 1e-3)
    assert md.cost(3, DEVICES["h100"], LINKS["ndr"], per_task).scheduler_s == pytest.approx(3 * 3 * 1e-3)
    assert md.cost(2, DEVICES["h100"], LINKS["ndr"], per_task).scheduler_s == pytest.approx(2 * 2 * 1e-3)
    nbody = NBody(100_000, steps=1)
    # per block: the positions cut and the kick (which also drifts into the next step)
    assert nbody.cost(4, DEVICES["h100"], LINKS["ndr"], per_task).scheduler_s == pytest.approx(8e-3)


def test_md_uses_the_full_neighbour_list_size():
    assert MolecularDynamics(10 ** 6, steps=1).pairs_per_atom == pytest.approx(77.6, abs=0.1)


# -- device profiles --------------------------------------------------------------------

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
    assert profile.fraction("stencil", "float32") == pytest.approx(2.0e8 * Weather.flops_per_point_step / 300e9)
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
     ["interconnect", "nvlink", "ndr", "100gbe", "tcp-local"]),
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
    assert len([line for line in table.stdout.splitlines() if line.split()[:1] in (["1"], ["2"], ["4"])]) == 3
    lines = run_cli("plan", "md", "--atoms", "1e7", "--steps", "1e6", "--device", "h200", "--interconnect",
                    "nvlink", "--max-gpus", "4", "--json")
    assert lines.returncode == 0, lines.stderr
    records = [json.loads(line) for line in lines.stdout.splitlines()]
    assert [r["gpus"] for r in records if r["kind"] == "plan"] == [1, 2, 4]
    assert records[-1]["kind"] == "summary" and records[-1]["device"] == "h200"
    assert records[0]["size"] == {"atoms": 10_000_000} and records[0]["steps"] == 1_000_000
    bad = run_cli("plan", "weather", "--nx", "64", "--ny", "64", "--interconnect", "infiniband")
    assert bad.returncode == 2 and "interconnect must be one of" in bad.stderr


def test_check_against_this_machine_reports_a_finite_relative_error():
    result = run_cli("plan", "--check", "--json", "--nx", "512", "--ny", "256", "--steps-per-task", "4",
                     timeout=180)
    assert result.returncode == 0, result.stderr
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    assert [r["workers"] for r in rows] == [1, 2]
    for row in rows:
        assert row["kind"] == "check" and math.isfinite(row["relative_error"])
        assert row["predicted_s_per_step"] > 0 and row["measured_s_per_step"] > 0
    assert math.isfinite(rows[0]["measured_efficiency"])
