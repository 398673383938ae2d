"""``hpcgpu bench md``: well-formed JSON-lines records at tiny sizes (speed is never asserted)."""

import io
import json
import math
import os
import subprocess
import sys

import pytest
from _support import usable_backend

from hpcgpu.backends import get_backend
from hpcgpu.bench import md
from hpcgpu.bench.harness import Recorder
from hpcgpu.errors import ConfigError

# -P: the source tree must not shadow the installed package
HPCGPU = [sys.executable, "-P", "-m", "hpcgpu.cli"]
SHARED = {"suite", "case", "backend", "dtype", "size", "metric", "value", "unit", "median_s", "repeats",
          "ratio_to_numpy"}
MD_FIELDS = {"steps_per_call", "seconds_per_step", "requested_size", "n_cells", "density", "temperature",
             "cutoff", "skin", "dt", "ensemble", "shift", "neighbor_rebuilds", "neighbors_per_atom",
             "neighbor_capacity", "build_s", "forces_s", "other_s", "build_share", "seconds_per_build",
             "warmup_s", "setup_s", "energy_change", "final_temperature", "threads"}


def cli(*args, timeout=600):
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    return subprocess.run([*HPCGPU, *args], capture_output=True, text=True, timeout=timeout, env=env)


def bench(backends, size, steps, dtypes=("float64",)):
    """Run the suite in-process; returns the recorder and the JSON lines it printed."""
    stream = io.StringIO()
    recorder = Recorder("md", stream=stream)
    md.run(recorder, [get_backend(b) if isinstance(b, str) else b for b in backends], sizes=[size],
           dtypes=list(dtypes), steps=steps, budget_s=0.01)
    return recorder, [json.loads(line) for line in stream.getvalue().splitlines()]


def check_record(r, *, backend, dtype, atoms, steps):
    """The fields every md line carries, with values that make sense for the run."""
    assert SHARED | MD_FIELDS <= set(r), sorted(SHARED | MD_FIELDS - set(r))
    assert (r["suite"], r["case"], r["backend"], r["dtype"]) == ("md", "lj_liquid", backend, dtype)
    assert (r["metric"], r["unit"]) == ("atom_steps_per_s", "1/s")
    assert r["size"] == atoms == 4 * r["n_cells"] ** 3
    assert r["steps_per_call"] == steps
    assert r["value"] > 0 and r["median_s"] > 0
    assert math.isclose(r["value"], atoms * steps / r["median_s"], rel_tol=1e-9)
    assert math.isclose(r["seconds_per_step"], r["median_s"] / steps, rel_tol=1e-9)
    assert (r["temperature"], r["cutoff"], r["skin"], r["dt"], r["ensemble"], r["shift"]) == (
        1.44, 2.5, 0.3, 0.005, "nve", True)
    assert math.isclose(r["density"], 0.8442, rel_tol=1e-12)
    # About 4/3 pi 2.8^3 * 0.8442 = 78 atoms within cutoff + skin (fewer in the smallest boxes).
    assert 40 < r["neighbors_per_atom"] < 100 and r["neighbor_capacity"] >= r["neighbors_per_atom"]
    assert isinstance(r["neighbor_rebuilds"], int) and r["neighbor_rebuilds"] >= 0
    assert min(r["build_s"], r["forces_s"], r["warmup_s"], r["setup_s"]) >= 0 and r["forces_s"] > 0
    assert 0 <= r["build_share"] <= 1
    assert (r["seconds_per_build"] is None) == (r["neighbor_rebuilds"] == 0)
    # NVE from the lattice: the total energy holds to well under a per cent.
    assert r["energy_change"] < 1e-3
    assert 0.5 < r["final_temperature"] < 1.5


def test_cli_prints_one_well_formed_line_per_backend_and_dtype():
    result = cli("bench", "md", "--size", "256", "--steps", "5", "--budget", "0.05", "--backend", "numpy",
                 "--backend", "numba", "--dtype", "float32", "--dtype", "float64")
    assert result.returncode == 0, result.stderr
    lines = [json.loads(line) for line in result.stdout.strip().splitlines()]
    assert [(r["backend"], r["dtype"]) for r in lines] == [
        ("numpy", "float32"), ("numba", "float32"), ("numpy", "float64"), ("numba", "float64")]
    for r in lines:
        check_record(r, backend=r["backend"], dtype=r["dtype"], atoms=256, steps=5)
        assert r["requested_size"] == 256
        if r["backend"] == "numpy":
            assert r["ratio_to_numpy"] == 1.0 and r["repeats"] == 1 and "note" in r
            assert r["threads"] is None
        else:
            numpy_line = next(x for x in lines if x["backend"] == "numpy" and x["dtype"] == r["dtype"])
            assert math.isclose(r["ratio_to_numpy"], r["value"] / numpy_line["value"], rel_tol=1e-9)
            assert r["repeats"] >= 2 and r["threads"] >= 1 and "note" not in r


def test_size_is_rounded_to_an_fcc_lattice_and_rebuilds_are_counted():
    _, (line,) = bench(["numba"], size=520, steps=40)
    check_record(line, backend="numba", dtype="float64", atoms=500, steps=40)
    assert line["requested_size"] == 520 and line["n_cells"] == 5
    # At T = 1.44 the fastest atoms cross half the skin within a few steps.
    assert line["neighbor_rebuilds"] >= 1 and line["build_s"] > 0
    assert math.isclose(line["seconds_per_build"], line["build_s"] / line["neighbor_rebuilds"])


def test_numpy_runs_at_most_a_few_steps_and_says_so():
    _, (line,) = bench(["numpy"], size=108, steps=md.NUMPY_STEPS + 5)
    check_record(line, backend="numpy", dtype="float64", atoms=108, steps=md.NUMPY_STEPS)
    assert f"{md.NUMPY_STEPS} steps" in line["note"]


@pytest.mark.cudasim
def test_cuda_backend_record_under_the_simulator_or_on_a_gpu():
    cuda = usable_backend("cuda")
    _, (line,) = bench([cuda], size=108, steps=1)
    check_record(line, backend="cuda", dtype="float64", atoms=108, steps=1)
    assert line["ratio_to_numpy"] is None


def test_too_small_a_box_is_a_clear_error():
    with pytest.raises(ConfigError, match="size=40 atoms"):
        bench(["numba"], size=40, steps=1)
    result = cli("bench", "md", "--size", "40", "--backend", "numba")
    assert result.returncode == 2
    assert "size=40" in result.stderr and "Traceback" not in result.stderr


def test_n_cells_for_rounds_the_cube_root():
    from hpcgpu.workloads.md.workload import n_cells_for

    assert [n_cells_for(n) for n in (32000, 256, 300, 1_000_000, 1_048_576)] == [20, 4, 4, 63, 64]


def test_slab_case_on_two_workers_reports_its_rate_beside_the_one_process_rate():
    result = cli("bench", "md", "--size", "500", "--steps", "10", "--budget", "0.05", "--backend", "numba",
                 "--workers", "2", "--dtype", "float64")
    assert result.returncode == 0, result.stderr
    one, bricks = [json.loads(line) for line in result.stdout.strip().splitlines()]
    check_record(one, backend="numba", dtype="float64", atoms=500, steps=10)
    assert (bricks["case"], bricks["metric"], bricks["size"], bricks["workers"]) == (
        "lj_liquid_bricks", "atom_steps_per_s", 500, 2)
    assert bricks["repeats"] >= 2
    assert math.isclose(bricks["value"], 500 * 10 / bricks["median_s"], rel_tol=1e-9)
    assert math.isclose(bricks["ratio_to_one_process"], bricks["value"] / one["value"], rel_tol=1e-9)


def test_slab_case_needs_two_workers():
    with pytest.raises(ConfigError, match="workers must be >= 2"):
        md.run(Recorder("md", stream=io.StringIO()), [get_backend("numba")], sizes=[500], steps=1, workers=1)
