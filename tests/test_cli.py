"""The command line, end to end in subprocesses."""

import json
import math
import os
import subprocess
import sys

import pytest
import xarray as xr

# -P: the source tree must not shadow the installed package
HPCGPU = [sys.executable, "-P", "-m", "hpcgpu.cli"]


def run(*args, timeout=600, env=None, cwd=None):
    env = {k: v for k, v in (env or os.environ).items() if k != "NUMBA_ENABLE_CUDASIM"}
    return subprocess.run([*HPCGPU, *args], capture_output=True, text=True, timeout=timeout, env=env, cwd=cwd)


def test_info_json_lists_backends():
    result = run("info", "--json")
    assert result.returncode == 0, result.stderr
    info = json.loads(result.stdout)
    assert [b["name"] for b in info["backends"]] == ["numpy", "numba", "cuda", "cupy"]
    assert info["auto"] in ("numba", "cuda")


def test_info_says_the_cpu_vector_width_and_how_to_widen_it(tmp_path):
    from hpcgpu._cpu_vectors import wide_vector_features

    result = run("info")
    assert result.returncode == 0 and "cpu vectors:" in result.stdout
    wide = run("info", "--wide-vectors")
    if wide_vector_features() is None:  # no AVX-512: nothing wider to ask for
        assert wide.returncode == 1 and "no AVX-512" in wide.stderr
        return
    assert wide.returncode == 0 and wide.stdout.strip().endswith(",-prefer-256-bit")
    assert "AVX-512 is available" in result.stdout
    # The kernels compiled for 512-bit vectors (own cache) agree with numpy, and info says the width.
    env = {**os.environ, "NUMBA_CPU_FEATURES": wide.stdout.strip(), "NUMBA_CACHE_DIR": str(tmp_path)}
    env.pop("NUMBA_ENABLE_CUDASIM", None)
    check = subprocess.run([sys.executable, "-P", "-c", """
import numpy as np
from hpcgpu.kernels import nbody, stencil
rng = np.random.default_rng(3)
x, m = rng.standard_normal((3, 300)), rng.random(300)
a = nbody.accelerations(x, m, softening=0.05, backend="numba")
b = nbody.accelerations(x, m, softening=0.05, backend="numpy")
assert np.allclose(a, b, rtol=1e-10, atol=1e-12), abs(a - b).max()
f = rng.random((64, 48))
d = stencil.diffuse(f, diffusivity=0.1, dt=1.0, steps=20, backend="numba")
assert np.allclose(d, stencil.diffuse(f, diffusivity=0.1, dt=1.0, steps=20, backend="numpy"), rtol=1e-12)
print("ok")
"""], env=env, capture_output=True, text=True, timeout=600)
    assert check.returncode == 0 and check.stdout.strip() == "ok", check.stderr[-2000:]
    assert "512-bit" in run("info", env=env).stdout


def test_run_weather_writes_fields_picture_and_summary(tmp_path):
    out = tmp_path / "jet"
    result = run("run", "weather", "--case", "unstable_jet", "--nx", "48", "--ny", "24", "--steps", "60",
                 "--snapshots", "3", "--out", str(out), "--backend", "numba", "--no-progress", "--energy-budget")
    assert result.returncode == 0, result.stderr
    assert "grid-point updates/s" in result.stdout and "mass change" in result.stdout
    fields = xr.open_zarr(out / "fields.zarr")
    assert fields.sizes["time"] == 4 and fields["h"].shape[1:] == (24, 48)
    diagnostics = xr.open_zarr(out / "fields.zarr", group="diagnostics")
    assert diagnostics.sizes["time"] >= 2
    png = (out / "final.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
    summary = json.loads((out / "summary.json").read_text())
    assert summary["step"] == 60 and abs(summary["mass_relative_change"]) < 1e-12
    assert summary["point_updates_per_s"] > 0
    # the default jet loses energy to viscosity: a budget, not a conservation error
    assert "energy budget:" in result.stdout and "viscosity removes energy" in result.stdout
    assert "conservation" not in result.stdout.lower()
    assert summary["energy_change"] < 0 < summary["energy_dissipated"]
    assert abs(summary["energy_budget_error"]) < 0.05 * abs(summary["energy_change"])
    assert summary["energy_budget_error"] == pytest.approx(summary["energy_change"] + summary["energy_dissipated"])


def test_bad_input_is_a_clear_error_not_a_traceback(tmp_path):
    for args, word in ((("--nx", "2"), "nx"), (("--dt", "-1"), "dt"), (("--backend", "tpu"), "backend"),
                       (("--dt", "1e5"), "CFL"), (("--dt", "0"), "dt must be > 0"),
                       (("--stop-time", "0"), "stop_time must be > 0"),
                       (("--workers", "2", "--steps-per-task", "0"), "steps_per_task must be >= 1")):
        result = run("run", "weather", *args, "--steps", "2", "--out", str(tmp_path / "x"), "--no-progress")
        assert result.returncode == 2, (args, result.stderr)
        assert "Traceback" not in result.stderr
        assert word in result.stderr


@pytest.mark.parametrize("args, message", [
    (("stencil", "--size", "2"), "size must be >= 4, got 2"),
    (("nbody", "--size", "1"), "size must be >= 2, got 1"),
    (("nbody", "--size", "64", "--steps", "0"), "steps must be >= 1, got 0"),
    (("matrix", "--size", "64", "--budget", "0"), "budget must be > 0.0"),
    (("md", "--size", "256", "--workers", "1"), "workers must be >= 2, got 1"),
])
def test_bench_bad_input_is_a_clear_error(args, message):
    result = run("bench", *args, "--backend", "numba")
    assert result.returncode == 2, result.stderr
    assert message in result.stderr and "Traceback" not in result.stderr and not result.stdout


def test_bench_stencil_prints_json_lines():
    result = run("bench", "stencil", "--size", "64", "--steps", "3", "--budget", "0.05",
                 "--backend", "numpy", "--backend", "numba")
    assert result.returncode == 0, result.stderr
    lines = [json.loads(line) for line in result.stdout.strip().splitlines()]
    assert {(r["case"], r["backend"]) for r in lines} == {
        ("diffusion", "numpy"), ("diffusion", "numba"), ("diffusion_dirichlet", "numpy"),
        ("diffusion_dirichlet", "numba"), ("shallow_water", "numpy"), ("shallow_water", "numba"),
        ("shallow_water_fused_step", "numba")}
    required = {"suite", "case", "backend", "dtype", "size", "metric", "value", "unit", "median_s",
                "repeats", "ratio_to_numpy"}
    for r in lines:
        assert required <= set(r)
        assert r["metric"] == "point_updates_per_s" and r["value"] > 0 and r["repeats"] >= 2
        assert r["fraction_of_copy"] > 0
        if r["backend"] == "numba" and r["case"] != "shallow_water_fused_step":
            assert r["ratio_to_numpy"] > 0
    fused = next(r for r in lines if r["case"] == "shallow_water_fused_step")
    stages = next(r for r in lines if r["case"] == "shallow_water" and r["backend"] == "numba")
    assert fused["speedup_vs_stages"] == pytest.approx(stages["median_s"] / fused["median_s"])


def test_bench_nbody_prints_json_lines():
    result = run("bench", "nbody", "--size", "600", "--size", "900", "--steps", "2", "--budget", "0.05",
                 "--backend", "numpy", "--backend", "numba", "--dtype", "float32", "--dtype", "float64")
    assert result.returncode == 0, result.stderr
    lines = [json.loads(line) for line in result.stdout.strip().splitlines()]
    assert {(r["backend"], r["dtype"], r["size"]) for r in lines} == {
        (b, d, n) for b in ("numpy", "numba") for d in ("float32", "float64") for n in (600, 900)}
    for r in lines:
        assert r["case"] == "direct" and r["metric"] == "interactions_per_s" and r["value"] > 0
        assert r["gflops"] == 20 * r["value"] / 1e9
        assert r["ratio_to_numpy"] > 0
        if r["backend"] == "numpy":
            assert r["targets_timed"] < r["size"] and "note" in r
        else:
            assert r["targets_timed"] == r["size"] and r["evaluations_per_call"] == 2


def test_bench_nbody_blocks_on_two_workers_beside_the_one_process_rate():
    result = run("bench", "nbody", "--size", "300", "--steps", "3", "--budget", "0.05", "--backend", "numba",
                 "--workers", "2", "--dtype", "float64")
    assert result.returncode == 0, result.stderr
    one, blocks = [json.loads(line) for line in result.stdout.strip().splitlines()]
    assert (one["case"], blocks["case"], blocks["workers"], blocks["size"]) == ("direct", "direct_blocks", 2, 300)
    assert blocks["repeats"] >= 2 and blocks["steps_per_call"] == 3
    assert math.isclose(blocks["value"], 300 * 300 * 3 / blocks["median_s"], rel_tol=1e-9)
    assert math.isclose(blocks["ratio_to_one_process"], blocks["value"] / one["value"], rel_tol=1e-9)


def test_run_weather_on_a_local_cluster(tmp_path):
    out = tmp_path / "cluster"
    result = run("run", "weather", "--nx", "32", "--ny", "48", "--steps", "24", "--workers", "2",
                 "--steps-per-task", "3", "--out", str(out), "--backend", "numba", "--no-progress",
                 "--energy-budget")
    assert result.returncode == 0, result.stderr
    # a channel: the block at the south wall steps fewer halo rows, so it holds more rows
    assert ("2 workers, 2 partitions on a 1x2 process grid (blocks of [26, 22] rows x [32] columns), 3 steps per "
            "task") in result.stdout
    summary = json.loads((out / "summary.json").read_text())
    assert summary["executor"] == "distributed" and summary["step"] == 24
    assert abs(summary["mass_relative_change"]) < 1e-12
    assert summary["energy_dissipated"] > 0 and "energy budget:" in result.stdout


def test_bench_scaling_prints_efficiency_and_baseline():
    result = run("bench", "scaling", "weather", "--size", "64", "--steps", "2", "--workers", "2",
                 "--backend", "numba")
    assert result.returncode == 0, result.stderr
    lines = [json.loads(line) for line in result.stdout.strip().splitlines()]
    metrics = {(r["case"], r["metric"]) for r in lines}
    assert ("weak-scaling", "parallel_efficiency") in metrics
    assert ("strong-scaling", "parallel_efficiency") in metrics
    assert ("map_overlap-baseline", "speedup_vs_map_overlap") in metrics
    baselines = {r["scaling"]: r for r in lines if r["case"] == "map_overlap-baseline"}
    assert {k: r["problem_size"] for k, r in baselines.items()} == {"weak": [64, 128], "strong": [64, 64]}
    timed_strong = next(r for r in lines if r["case"] == "strong-scaling" and r["metric"] == "seconds_per_step")
    strong = baselines["strong"]
    assert strong["value"] == pytest.approx(strong["map_overlap_seconds_per_step"] / timed_strong["value"])
    baseline = baselines["weak"]
    runs = baseline["map_overlap_runs_s_per_step"]
    # two rounds of two runs each, the rounds on fresh clusters in turn
    assert baseline["repeats"] == 4 and len(runs) == 4
    assert baseline["map_overlap_seconds_per_step"] == sorted(runs)[2]
    timed = {(r["case"], r["workers"], r["steps_per_task"]): r for r in lines if r["metric"] == "seconds_per_step"}
    assert set(timed) == {("weak-scaling", 1, 2), ("weak-scaling", 2, 2), ("strong-scaling", 2, 2),
                          ("weak-scaling", 2, 1)}
    assert all(r["repeats"] == 4 for r in timed.values())
    weak = {n: timed[("weak-scaling", n, 2)]["value"] for n in (1, 2)}
    efficiency = next(r for r in lines if r["case"] == "weak-scaling" and r["metric"] == "parallel_efficiency")
    assert efficiency["value"] == pytest.approx(weak[1] / weak[2])
    # beside it the machine's own ceiling: the same kernels in two plain processes, no dask
    ceiling = next(r for r in lines if r["case"] == "contention-ceiling")
    assert ceiling["workers"] == 2 and len(ceiling["side_by_side_steps_per_s"]) == 2
    side_by_side = ceiling["side_by_side_steps_per_s"]
    # coupled ranks step at the slowest one's pace: the ceiling is the slowest copy's (the median's beside it)
    assert ceiling["value"] == pytest.approx(min(side_by_side) / ceiling["alone_steps_per_s"])
    assert ceiling["median_efficiency"] == pytest.approx(
        (side_by_side[0] + side_by_side[1]) / 2 / ceiling["alone_steps_per_s"])
    assert efficiency["ceiling"] == ceiling["value"]
    assert efficiency["efficiency_vs_ceiling"] == pytest.approx(efficiency["value"] / ceiling["value"])
    # the mixed pair: the emulated slow worker's block gets fewer cells after calibration
    calibrated = next(r for r in lines if r["case"] == "balance" and r["weights"] == "calibrate")
    assert calibrated["slowdown"] == 2.0
    rates, cells = calibrated["rates"], calibrated["cells_per_partition"]
    assert rates[0] != rates[1] and (cells[0] > cells[1]) == (rates[0] > rates[1])
    for r in lines:
        assert r["value"] > 0
        if r["metric"] == "seconds_per_step" and "scheduler_share" in r:
            assert 0 <= r["scheduler_share"] <= 1
            # the client's share of the workers' cores: above 1 where a step is shorter than its scheduling
            assert r["bystander_cpu_s"] >= 0
            assert r["bystander_core_share"] == pytest.approx(r["bystander_cpu_s"] / (r["value"] * r["workers"]))
            # the busiest rank's thread CPU over its working time: it ran for some of it, never for more
            assert 0 < r["rank_cpu_share"] <= 1.05


def test_run_astro_writes_snapshots_picture_and_summary(tmp_path):
    out = tmp_path / "galaxies"
    result = run("run", "astro", "--case", "galaxy_collision", "--n", "256", "--steps", "40", "--snapshots", "2",
                 "--out", str(out), "--backend", "numba", "--no-progress")
    assert result.returncode == 0, result.stderr
    assert "G interactions/s" in result.stdout and "virial ratio" in result.stdout
    snapshots = xr.open_zarr(out / "snapshots.zarr")
    assert snapshots.sizes["time"] == 3 and snapshots["positions"].shape[1:] == (3, 256)
    assert (out / "final.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    summary = json.loads((out / "summary.json").read_text())
    assert summary["step"] == 40 and abs(summary["energy_relative_change"]) < 1e-2


def test_run_md_writes_snapshots_trajectory_picture_and_summary(tmp_path):
    out = tmp_path / "melt"
    result = run("run", "md", "--n-cells", "4", "--steps", "60", "--snapshots", "3", "--xyz", "--out", str(out),
                 "--backend", "numba", "--no-progress")
    assert result.returncode == 0, result.stderr
    assert " atom-steps/s" in result.stdout and "g(r) peak" in result.stdout
    snapshots = xr.open_zarr(out / "snapshots.zarr")
    assert snapshots.sizes["time"] == 4 and snapshots["positions"].shape[1:] == (3, 256)
    diagnostics = xr.open_zarr(out / "snapshots.zarr", group="diagnostics")
    assert {"temperature", "pressure", "msd"} <= set(diagnostics.data_vars)
    lines = (out / "trajectory.xyz").read_text().splitlines()
    assert len(lines) == 4 * (2 + 256) and lines[0] == "256" and "Lattice=" in lines[1]
    assert (out / "md.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    summary = json.loads((out / "summary.json").read_text())
    assert summary["step"] == 60 and summary["n"] == 256 and abs(summary["energy_relative_change"]) < 1e-3
    assert summary["neighbor_rebuilds"] >= 1 and summary["rdf_samples"] >= 1 and summary["xyz"].endswith(".xyz")


def test_run_md_on_two_workers(tmp_path):
    out = tmp_path / "bricks"
    result = run("run", "md", "--n-cells", "5", "--steps", "30", "--snapshots", "2", "--out", str(out),
                 "--backend", "numba", "--workers", "2", "--no-progress")
    assert result.returncode == 0, result.stderr
    assert "2 bricks (2x1x1) holding [250, 250] atoms" in result.stdout
    summary = json.loads((out / "summary.json").read_text())
    assert summary["partitions"] == 2 and summary["step"] == 30 and abs(summary["energy_relative_change"]) < 1e-3


def test_run_md_langevin_and_bad_input(tmp_path):
    result = run("run", "md", "--n-cells", "3", "--steps", "40", "--thermostat", "langevin", "--temperature", "0.85",
                 "--out", str(tmp_path / "nvt"), "--backend", "numba", "--no-progress")
    assert result.returncode == 0, result.stderr
    summary = json.loads((tmp_path / "nvt" / "summary.json").read_text())
    assert summary["thermostat"] == "langevin" and summary["n"] == 108
    for args, word in ((("--cutoff", "5"), "cutoff"), (("--density", "0"), "density"), (("--dt", "0"), "dt"),
                       (("--temperature", "-1"), "temperature"), (("--thermostat", "nose"), "thermostat")):
        result = run("run", "md", "--n-cells", "4", "--steps", "2", *args, "--out", str(tmp_path / "x"),
                     "--no-progress")
        assert result.returncode == 2, (args, result.stderr)
        assert "Traceback" not in result.stderr and word in result.stderr


def test_a_batch_job_stops_at_its_wall_time_with_a_checkpoint_and_the_next_one_resumes(tmp_path):
    out, ckpt = tmp_path / "out", tmp_path / "ckpt"
    common = ("--no-progress", "--out", str(out))
    first = run("run", "weather", "--nx", "128", "--ny", "96", "--steps", "3000", "--backend", "numba",
                "--snapshots", "6", "--checkpoint", str(ckpt), "--wall-time", "0.3", *common)
    assert first.returncode == 0, first.stderr
    stopped = json.loads((out / "summary.json").read_text())["step"]
    assert 0 < stopped < 3000
    second = run("run", "weather", "--resume", str(ckpt), "--snapshots", "6", *common)
    assert second.returncode == 0, second.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["step"] == 3000 and summary["case"] == "unstable_jet"
    steps = xr.open_zarr(out / "fields.zarr")["step"].values.tolist()
    assert steps == sorted(set(steps)) and steps[0] == 0 and steps[-1] == 3000 and len(steps) == 7
    for workload, extra in (("md", ("--n-cells", "4", "--steps", "20")), ("astro", ("--n", "64", "--steps", "20"))):
        path = tmp_path / workload
        result = run("run", workload, *extra, "--backend", "numba", "--checkpoint", str(path / "ckpt"),
                     "--out", str(path / "a"), "--no-progress")
        assert result.returncode == 0, result.stderr
        result = run("run", workload, "--resume", str(path / "ckpt"), "--steps", "30", "--out", str(path / "a"),
                     "--no-progress")
        assert result.returncode == 0 and "checkpoint" not in result.stderr.lower(), result.stderr
    bad = run("run", "weather", "--checkpoint-every", "5", "--steps", "10", *common)
    assert bad.returncode == 2 and "--checkpoint-every needs --checkpoint" in bad.stderr


# -- every run command as the README gives it, at its default size, to the end ------------------------
# (a default cluster run once crashed at its last step, in the summary, and only shortened runs were tested)
DEFAULT_RUNS = {
    "weather": (7417, ("mass_relative_change", 1e-12)),
    "md": (2000, ("energy_relative_change", 1e-3)),
    "astro": (2000, ("energy_relative_change", 1e-2)),
}


@pytest.mark.slow
@pytest.mark.parametrize("model", sorted(DEFAULT_RUNS))
def test_every_run_command_finishes_at_its_default_size_on_two_workers(tmp_path, model):
    steps, (quantity, bound) = DEFAULT_RUNS[model]
    result = run("run", model, "--workers", "2", timeout=1800, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    (folder,) = (tmp_path / "hpcgpu-output").iterdir()
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["step"] == steps and summary["executor"] == "distributed" and summary["workers"] == 2
    assert abs(summary[quantity]) < bound, (quantity, summary[quantity])


@pytest.mark.slow
def test_run_vorticity_finishes_at_its_default_size(tmp_path):
    result = run("run", "vorticity", timeout=1800, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    (folder,) = (tmp_path / "hpcgpu-output").iterdir()
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["step"] > 0 and summary["step"] * summary["dt"] >= summary["time"] - 1e-9


def test_run_astro_takes_the_integrator(tmp_path):
    out = tmp_path / "kepler"
    result = run("run", "astro", "--case", "kepler", "--integrator", "dkd", "--steps", "1000", "--dtype", "float64",
                 "--snapshots", "2", "--out", str(out), "--backend", "numpy", "--no-progress")
    assert result.returncode == 0, result.stderr
    assert "astro/kepler (direct, dkd)" in result.stdout and "integrator='dkd'" in result.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["integrator"] == "dkd" and summary["step"] == 1000
    assert 0 < abs(summary["energy_relative_change"]) < 1e-4  # half an orbit: at pericentre, the largest error
    assert xr.open_zarr(out / "snapshots.zarr").attrs["integrator"] == "dkd"
    bad = run("run", "astro", "--integrator", "rk4", "--steps", "2", "--out", str(tmp_path / "x"), "--no-progress")
    assert bad.returncode == 2 and "--integrator" in bad.stderr and "'kdk', 'dkd'" in bad.stderr


def test_bench_comm_prints_round_trips_bandwidth_and_collectives_beside_the_task_path():
    result = run("bench", "comm", "--size", "64", "--size", "4096", "--repeats", "3")
    assert result.returncode == 0, result.stderr
    lines = [json.loads(line) for line in result.stdout.strip().splitlines()]
    required = {"suite", "case", "workers", "size", "metric", "value", "unit", "median_s", "p90_s", "repeats",
                "transport", "protocol"}
    for r in lines:
        assert required <= set(r), sorted(required - set(r))
        assert r["suite"] == "comm" and r["protocol"] == "tcp"
        # the communicator over tcp takes the direct path (the ranks' sockets); the task chains, dask's
        assert r["transport"] == ("dask" if r["path"] == "tasks" else "direct")
        assert r["value"] > 0 and 0 < r["median_s"] <= r["p90_s"] and r["repeats"] >= 3
    pairs = {tuple(r["workers"]) for r in lines if r["case"] == "round_trip"}
    assert len(pairs) == 2 and {(b, a) for a, b in pairs} == pairs  # both ordered pairs of two workers
    for case, metric, unit in (("round_trip", "round_trip_s", "s"), ("bandwidth", "bandwidth_bytes_per_s", "B/s")):
        rows = [r for r in lines if r["case"] == case]
        # one line per ordered pair and size
        expected = sorted((pair, size) for pair in pairs for size in (64, 4096))
        assert sorted((tuple(r["workers"]), r["size"]) for r in rows) == expected
        assert all(r["metric"] == metric and r["unit"] == unit and r["path"] == "communicator" for r in rows)
        assert all(r["repeats"] == 3 and r["source"] == r["workers"][0] for r in rows)
    for r in (r for r in lines if r["case"] == "bandwidth"):
        assert math.isclose(r["value"], 2 * r["size"] / r["median_s"], rel_tol=1e-9)
    collectives = {r["case"]: r for r in lines if r["case"] in ("allreduce", "barrier")}
    assert set(collectives) == {"allreduce", "barrier"}
    assert all(r["metric"] == "latency_s" and len(r["workers"]) == 2 for r in collectives.values())
    (shared,) = [r for r in lines if r["case"] == "allreduce_shared_ranks"]
    # 8 ranks over the 2 workers: recursive doubling takes log2(8) = 3 rounds and 3 messages on every rank
    assert shared["ranks"] == 8 and shared["metric"] == "latency_s" and shared["rounds_per_rank"] == 3
    assert shared["rounds_by_rank"] == shared["messages_by_rank"] == [3] * 8
    tasks = [r for r in lines if r["case"] == "task_round_trip"]
    assert {tuple(r["workers"]) for r in tasks} == pairs
    small = {tuple(r["workers"]): r["value"] for r in lines if r["case"] == "round_trip" and r["size"] == 64}
    for r in tasks:  # the comparison with the old path: the smallest size, through dask tasks
        assert r["size"] == 64 and r["path"] == "tasks" and r["metric"] == "round_trip_s"
        assert math.isclose(r["ratio_to_communicator"], r["value"] / small[tuple(r["workers"])], rel_tol=1e-9)


@pytest.mark.parametrize("args, message", [
    (("--size", "0"), "size must be >= 1, got 0"),
    (("--workers", "1"), "workers must be >= 2, got 1"),
    (("--repeats", "0"), "repeats must be >= 1, got 0"),
])
def test_bench_comm_bad_input_is_a_clear_error(args, message):
    result = run("bench", "comm", *args, timeout=120)
    assert result.returncode == 2, result.stderr
    assert message in result.stderr and "Traceback" not in result.stderr and not result.stdout


# -- output steps, resumed runs and option checks (fixes of a review) ------------------------------------------
def _steps(store, group=None):
    return xr.open_zarr(store, group=group)["step"].values.tolist()


def test_run_weather_output_steps_do_not_depend_on_the_steps_per_task_and_include_the_last(tmp_path, monkeypatch):
    # In-process, on a one-worker threads cluster (a process cluster takes most of the time budget).
    from distributed import Client, LocalCluster

    from hpcgpu.cli import main
    from hpcgpu.workloads.weather import cli as weather_cli

    out = tmp_path / "k6"
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=False, dashboard_address=":0") as cluster, \
            Client(cluster, set_as_default=False) as client:
        monkeypatch.setattr(weather_cli, "open_client", lambda args: client)
        status = main(["run", "weather", "--case", "gravity_wave", "--nx", "16", "--ny", "16", "--steps", "21",
                       "--snapshots", "4", "--backend", "numpy", "--no-progress", "--out", str(out),
                       "--workers", "1", "--steps-per-task", "6"])
    assert status == 0
    assert json.loads((out / "summary.json").read_text())["steps_per_task"] == 6
    # 21 // 4 = 5 steps apart (not rounded to K = 6), and the final step
    assert _steps(out / "fields.zarr") == [0, 5, 10, 15, 20, 21]
    assert _steps(out / "fields.zarr", "diagnostics") == list(range(22))


def _run_in_process(capsys, *args):
    """``hpcgpu ARGS`` in this process (no interpreter start-up): ``(status, stderr)``."""
    from hpcgpu.cli import main

    status = main(list(args))
    return status, capsys.readouterr().err


def _keep_checkpoints_up_to(folder, step):
    """Stand in for a job stopped at ``step`` (a wall-time stop is timing-dependent): drop later checkpoints."""
    import shutil

    from hpcgpu import checkpoint

    for path in checkpoint.list_checkpoints(str(folder)):
        if checkpoint.checkpoint_step(path) > step:
            shutil.rmtree(path)


def test_run_weather_resume_appends_to_its_own_store_with_the_cadence_of_the_whole_run(tmp_path, monkeypatch,
                                                                                      capsys):
    import shutil

    monkeypatch.chdir(tmp_path)
    common = ("--backend", "numpy", "--no-progress", "--snapshots", "4")
    status, err = _run_in_process(capsys, "run", "weather", "--case", "gravity_wave", "--nx", "16", "--ny", "8",
                                  "--steps", "400", "--checkpoint", "ck", "--checkpoint-every", "250", *common)
    assert status == 0, err
    _keep_checkpoints_up_to(tmp_path / "ck", 250)
    folder = tmp_path / "hpcgpu-output" / "weather-gravity_wave"
    shutil.rmtree(folder / "fields.zarr")  # as if the job had stopped at step 250 ...
    # ... and the next job resumes without repeating --case or --steps
    status, err = _run_in_process(capsys, "run", "weather", "--resume", "ck", *common)
    assert status == 0, err
    assert [p.name for p in (tmp_path / "hpcgpu-output").iterdir()] == ["weather-gravity_wave"]
    assert json.loads((folder / "summary.json").read_text())["step"] == 400
    # the steps of the uninterrupted run (400 // 4 apart; diagnostics 400 // 200 apart, the part before
    # the checkpoint from it)
    assert _steps(folder / "fields.zarr") == [300, 400]
    assert _steps(folder / "fields.zarr", "diagnostics") == list(range(0, 401, 2))


def test_run_weather_resume_with_steps_extends_the_run_and_refuses_one_before_the_checkpoint(tmp_path, capsys):
    out, ck = str(tmp_path / "out"), str(tmp_path / "ck")
    common = ("--backend", "numpy", "--no-progress", "--snapshots", "4", "--out", out)
    status, err = _run_in_process(capsys, "run", "weather", "--case", "gravity_wave", "--nx", "16", "--ny", "8",
                                  "--steps", "40", "--checkpoint", ck, *common)
    assert status == 0, err
    status, err = _run_in_process(capsys, "run", "weather", "--resume", ck, "--steps", "45", *common)
    assert status == 0, err
    assert json.loads((tmp_path / "out" / "summary.json").read_text())["step"] == 45
    # the cadence of the run as started (every 10), and the new last step
    assert _steps(tmp_path / "out" / "fields.zarr") == [0, 10, 20, 30, 40, 45]
    status, err = _run_in_process(capsys, "run", "weather", "--resume", ck, "--steps", "20", *common)
    assert status == 2 and "--steps 20 stops before step 45" in err


def test_run_md_resume_appends_to_the_trajectory_of_its_own_run(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    common = ("--backend", "numpy", "--no-progress", "--snapshots", "4", "--xyz")
    status, err = _run_in_process(capsys, "run", "md", "--n-cells", "3", "--cutoff", "2.0", "--thermostat",
                                  "langevin", "--steps", "40", "--checkpoint", "ck", "--checkpoint-every", "25",
                                  *common)
    assert status == 0, err
    _keep_checkpoints_up_to(tmp_path / "ck", 25)
    folder = tmp_path / "hpcgpu-output" / "md-langevin"
    # the steps after the checkpoint were written already: kept, not written twice; earlier ones not lost
    status, err = _run_in_process(capsys, "run", "md", "--resume", "ck", *common)
    assert status == 0, err
    assert [p.name for p in (tmp_path / "hpcgpu-output").iterdir()] == ["md-langevin"]
    text = (folder / "trajectory.xyz").read_text()
    assert [int(w[5:]) for w in text.split() if w.startswith("Step=")] == [0, 10, 20, 30, 40]
    assert len(text.splitlines()) == 5 * (2 + 108)
    assert _steps(folder / "snapshots.zarr") == [0, 10, 20, 30, 40]


def test_run_astro_resume_writes_to_the_store_of_its_case(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    common = ("--backend", "numpy", "--no-progress", "--snapshots", "2")
    status, err = _run_in_process(capsys, "run", "astro", "--case", "kepler", "--steps", "20", "--checkpoint", "ck",
                                  *common)
    assert status == 0, err
    status, err = _run_in_process(capsys, "run", "astro", "--resume", "ck", "--steps", "25", *common)
    assert status == 0, err
    assert [p.name for p in (tmp_path / "hpcgpu-output").iterdir()] == ["astro-kepler"]
    assert _steps(tmp_path / "hpcgpu-output" / "astro-kepler" / "snapshots.zarr") == [0, 10, 20, 25]


# (workload, its model class, the options of a small new run, its store)
RESUMABLE = (("weather", "ShallowWater", ("--case", "gravity_wave", "--nx", "16", "--ny", "8"), "fields.zarr"),
             ("vorticity", "BarotropicVorticity", ("--case", "rossby_wave", "--nx", "16", "--ny", "16"),
              "fields.zarr"),
             ("md", "LennardJones", ("--n-cells", "3", "--cutoff", "2.0"), "snapshots.zarr"),
             ("astro", "NBody", ("--case", "kepler"), "snapshots.zarr"))


@pytest.mark.parametrize("workload, model_class, options, store", RESUMABLE, ids=[r[0] for r in RESUMABLE])
def test_run_resume_builds_no_model_of_its_own_and_ends_where_the_uninterrupted_run_does(
        workload, model_class, options, store, tmp_path, monkeypatch, capsys):
    import importlib

    package = importlib.import_module(f"hpcgpu.workloads.{workload}")
    real = getattr(package, model_class)
    built = []

    def counted(*args, **kwargs):  # the constructor the CLI calls (warm_up's tiny models do not come here)
        built.append((args, kwargs))
        return real(*args, **kwargs)

    monkeypatch.setattr(package, model_class, counted)
    ck, resumed, whole = (str(tmp_path / name) for name in ("ck", "resumed", "whole"))
    common = ("--backend", "numpy", "--no-progress", "--snapshots", "4")
    status, err = _run_in_process(capsys, "run", workload, *options, "--steps", "20", "--checkpoint", ck,
                                  "--out", resumed, *common)
    assert status == 0, err
    assert len(built) == 1  # a new run builds its model from the options (the count sees it)
    # no model options: before, the CLI built (and dropped) the default case at its full default size
    status, err = _run_in_process(capsys, "run", workload, "--resume", ck, "--steps", "25", "--out", resumed,
                                  *common)
    assert status == 0, err
    assert len(built) == 1, f"--resume built a model of the command line's options: {built[1:]}"
    status, err = _run_in_process(capsys, "run", workload, *options, "--steps", "25", "--out", whole, *common)
    assert status == 0, err
    ends = [xr.open_zarr(os.path.join(out, store)).isel(time=-1).load() for out in (resumed, whole)]
    assert int(ends[0]["step"]) == int(ends[1]["step"]) == 25
    xr.testing.assert_equal(ends[0], ends[1])  # bitwise: the same backend, no cluster
    summaries = [json.loads((tmp_path / out / "summary.json").read_text()) for out in ("resumed", "whole")]
    assert summaries[0]["step"] == summaries[1]["step"] == 25


def test_run_weather_bad_weights_are_an_error_before_a_cluster_starts(monkeypatch, capsys):
    from hpcgpu.workloads.weather import cli as weather_cli

    def no_cluster(args):
        raise AssertionError("a cluster was started before --weights was checked")

    monkeypatch.setattr(weather_cli, "open_client", no_cluster)
    for weights in ("1,x", "1,-2", "1,nan", ""):
        status, err = _run_in_process(capsys, "run", "weather", "--case", "gravity_wave", "--nx", "16", "--ny", "8",
                                      "--steps", "4", "--backend", "numpy", "--no-progress", "--workers", "2",
                                      "--weights", weights)
        assert status == 2, (weights, err)
        assert err.strip() == ("hpcgpu: error: --weights must be 'calibrate' or comma-separated positive numbers; "
                               f"got {weights!r}")


@pytest.mark.parametrize("workload, options, named", [
    ("weather", ("--steps-per-task", "4"), "--steps-per-task needs"),
    ("weather", ("--partitions", "2", "--weights", "1,2"), "--partitions, --weights need"),
    ("md", ("--partitions", "2"), "--partitions needs"),
])
def test_cluster_options_without_a_cluster_are_named_in_the_error(capsys, workload, options, named):
    status, err = _run_in_process(capsys, "run", workload, "--steps", "2", "--backend", "numpy", "--no-progress",
                                  *options)
    assert status == 2, err
    assert err.strip() == f"hpcgpu: error: {named} a cluster: add --workers N (a local one) or --scheduler ADDRESS"


@pytest.mark.parametrize("args, message", [
    (("--quick", "--report", "{tmp}"), "--report must name a file; '{tmp}' is a folder"),
    (("--quick", "--report", "{tmp}/file.txt/report.html"), "--report: cannot make the folder"),
    (("--quick", "--budget", "5"), "--budget applies to the stencil, nbody, md and matrix suites; "
                                   "cluster acceptance runs for a fixed length"),
    (("scaling", "--budget", "5"), "--budget applies to the stencil, nbody, md and matrix suites; "
                                   "scaling runs for a fixed length"),
    (("comm", "--budget", "5"), "--budget applies to the stencil, nbody, md and matrix suites; "
                                "comm runs for a fixed length"),
])
def test_bench_options_that_cannot_work_fail_before_any_measuring(tmp_path, monkeypatch, capsys, args, message):
    """Not after minutes of measuring (the report), and not silently ignored (the budget)."""
    from hpcgpu import cluster

    def no_cluster(*args, **kwargs):
        raise AssertionError("a cluster was started")

    monkeypatch.setattr(cluster, "start_cluster", no_cluster)
    (tmp_path / "file.txt").write_text("")
    status, err = _run_in_process(capsys, "bench", *(a.format(tmp=tmp_path) for a in args))
    assert status == 2, err
    assert err.startswith("hpcgpu: error: " + message.format(tmp=tmp_path)), err


def test_ctrl_c_ends_a_command_with_one_line_and_status_130(tmp_path):
    import signal
    import time

    process = subprocess.Popen([*HPCGPU, "run", "weather", "--nx", "64", "--ny", "32", "--steps", "1000000",
                                "--no-progress", "--backend", "numpy", "--out", str(tmp_path / "out")],
                               stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not (tmp_path / "out" / "fields.zarr").exists():
            time.sleep(0.2)  # stepping (the first output is written)
        time.sleep(1.0)
        process.send_signal(signal.SIGINT)
        _, err = process.communicate(timeout=60)
    finally:
        process.kill()
    assert process.returncode == 130, err
    assert "Traceback" not in err and err.rstrip().endswith("hpcgpu: interrupted"), err


def test_run_takes_the_plan_and_bench_name_of_a_workload(tmp_path, capsys):
    """``hpcgpu plan nbody`` and ``hpcgpu bench nbody`` exist, so ``hpcgpu run nbody`` is ``run astro``."""
    status, err = _run_in_process(capsys, "run", "nbody", "--case", "kepler", "--steps", "3", "--backend", "numpy",
                                  "--no-progress", "--out", str(tmp_path / "out"))
    assert status == 0, err
    assert "NBody(case='kepler'" in err and (tmp_path / "out" / "summary.json").exists()


@pytest.mark.parametrize("command", [("run", "weather", "--steps", "2"), ("bench", "--quick")])
def test_workers_and_scheduler_together_are_refused(monkeypatch, capsys, command):
    """--workers would be ignored by a joined scheduler: say so before anything starts."""
    from hpcgpu import cluster

    monkeypatch.setattr(cluster, "start_cluster", lambda *a, **k: (_ for _ in ()).throw(AssertionError("started")))
    status, err = _run_in_process(capsys, *command, "--workers", "2", "--scheduler", "tcp://127.0.0.1:8786")
    assert status == 2, err
    assert err.strip() == ("hpcgpu: error: --workers starts a local cluster and --scheduler joins a running one: "
                           "give one of them")


def test_info_prints_the_autotuned_kernel_variants(tmp_path):
    env = dict(os.environ, HPCGPU_CACHE_DIR=str(tmp_path))
    env.pop("HPCGPU_AUTOTUNE", None)
    tuned = run("info", "--tune", env=env)
    assert tuned.returncode == 0, tuned.stderr
    assert "nbody.direct.inverse_sqrt.float64:" in tuned.stdout and "matrix.spmv.format.float32:" in tuned.stdout
    assert "stencil.diffusion.ring_bytes.float64:" in tuned.stdout  # the sweep depth (a block size)
    from hpcgpu.kernels.nbody import _numba

    if len(_numba.sweep_variants_available()) > 1:  # an explicit float32 sweep to choose from on this CPU
        assert "nbody.direct.sweep.float32:" in tuned.stdout
    assert (tmp_path / "autotune.json").exists()
    listed = json.loads(run("info", "--json", env=env).stdout)["autotune"]
    assert listed["kernels"]["nbody.direct.inverse_sqrt.float64"]["choice"] in ("bit_trick", "divide")
    pinned = run("info", env=dict(env, HPCGPU_AUTOTUNE="0"))
    assert "kernel variants: defaults (HPCGPU_AUTOTUNE=0)" in pinned.stdout
