"""``hpcgpu bench matrix``: the JSON lines it prints, at a tiny size (no timing asserts)."""

import io
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from hpcgpu.backends import get_backend
from hpcgpu.bench import matrix as bench
from hpcgpu.bench.harness import Recorder

REQUIRED = {"suite", "case", "backend", "dtype", "size", "metric", "value", "unit", "median_s",
            "repeats", "ratio_to_numpy"}


def test_cli_prints_gemm_and_spmv_lines_for_each_backend_dtype_and_size():
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    result = subprocess.run(
        [sys.executable, "-P", "-m", "hpcgpu.cli", "bench", "matrix", "--size", "40", "--size", "33",
         "--steps", "2", "--budget", "0.05", "--backend", "numpy", "--backend", "numba",
         "--dtype", "float32", "--dtype", "float64"],
        capture_output=True, text=True, timeout=600, env=env)
    assert result.returncode == 0, result.stderr
    lines = [json.loads(line) for line in result.stdout.strip().splitlines()]
    assert {(r["case"], r["backend"], r["dtype"], r["size"]) for r in lines} == {
        (c, b, d, n) for c in ("gemm", "spmv") for b in ("numpy", "numba")
        for d in ("float32", "float64") for n in (40, 33)} | {
        ("cg", b, d, 8) for b in ("numpy", "numba") for d in ("float32", "float64")}  # CG on side // 8 >= 8
    for r in lines:
        assert REQUIRED <= set(r) and r["suite"] == "matrix"
        assert r["value"] > 0 and r["repeats"] >= 2 and r["median_s"] > 0
        assert r["ratio_to_numpy"] > 0
        if r["backend"] == "numpy":
            assert r["ratio_to_numpy"] == 1.0


def _records(case, sizes, dtypes):
    recorder = Recorder("matrix", stream=io.StringIO())
    backends = [get_backend("numba"), get_backend("numpy")]
    bench.run(recorder, backends, sizes=sizes, dtypes=dtypes, steps=3, budget_s=0.05, cases=[case])
    assert not recorder.errors, recorder.errors
    printed = [json.loads(line) for line in recorder.stream.getvalue().splitlines()]
    assert printed == recorder.results
    return recorder.results


def test_gemm_lines_count_two_n_cubed_and_check_the_product():
    lines = _records("gemm", (48,), ("float32", "float64"))
    assert [r["backend"] for r in lines] == ["numpy", "numba", "numpy", "numba"]  # numpy first
    for r in lines:
        assert r["case"] == "gemm" and r["metric"] == "flops_per_s" and r["unit"] == "flop/s"
        assert r["value"] == pytest.approx(2 * 48**3 / r["median_s"])
        assert r["gflops"] == pytest.approx(r["value"] / 1e9)
        assert r["allow_tf32"] is False
        limit = 5e-6 if r["dtype"] == "float32" else 1e-13
        assert 0 <= r["relative_error"] <= limit
    numba_line = lines[1]
    assert numba_line["blas"] is True
    assert numba_line["ratio_to_numpy"] == pytest.approx(numba_line["value"] / lines[0]["value"])


def test_spmv_lines_count_the_bytes_of_one_product():
    (numpy_line, numba_line) = _records("spmv", (30,), ("float64",))
    rows = 30 * 30
    nnz = 5 * rows - 4 * 30  # the 5-point stencil loses one neighbour per boundary point and side
    for r in (numpy_line, numba_line):
        assert r["case"] == "spmv" and r["metric"] == "bytes_per_s" and r["unit"] == "B/s"
        assert r["rows"] == rows and r["nnz"] == nnz and r["matrix"] == "poisson-5-point"
        assert r["bytes_per_product"] == nnz * (8 + 4) + (rows + 1) * 4 + 2 * rows * 8
        assert r["products_per_call"] == 3
        assert r["seconds_per_product"] == pytest.approx(r["median_s"] / 3)
        assert r["value"] == pytest.approx(r["bytes_per_product"] / r["seconds_per_product"])
        assert r["fraction_of_copy"] == pytest.approx(r["value"] / (r["copy_gb_per_s"] * 1e9))
    assert numba_line["ratio_to_numpy"] == pytest.approx(numba_line["value"] / numpy_line["value"])


def test_cg_lines_report_the_time_to_a_checked_solution():
    (numpy_line, numba_line) = _records("cg", (160,), ("float64",))
    for r in (numpy_line, numba_line):
        assert r["case"] == "cg" and r["metric"] == "solves_per_s" and r["size"] == 20 and r["rows"] == 400
        assert r["seconds_to_solution"] == pytest.approx(1.0 / r["value"])
        assert r["final_relative_residual"] <= r["tolerance"] == 1e-10
        assert r["relative_error"] < 1e-8 and 10 < r["iterations"] < 200
    assert numba_line["ratio_to_numpy"] == pytest.approx(numba_line["value"] / numpy_line["value"])


def test_the_bench_matrix_is_the_poisson_operator():
    A = bench.poisson_matrix(np, 7, np.float64)
    dense = A.to_dense()
    assert A.shape == (49, 49) and (dense == dense.T).all()
    assert (np.diag(dense) == 4).all() and (dense.sum(axis=1)[24] == 0)
    assert np.linalg.eigvalsh(dense).min() > 0  # Dirichlet: positive definite


def test_gpu_only_cases_record_nothing_on_the_cpu():
    recorder = Recorder("matrix", stream=io.StringIO())
    bench.run(recorder, [get_backend("numpy"), get_backend("numba")], sizes=(16,), budget_s=0.05,
              cases=["gemm_tf32", "gemm_tiles"])
    assert recorder.results == [] and recorder.errors == []


def test_cg_on_two_workers_reports_its_overhead_per_iteration_beside_the_local_solve():
    recorder = Recorder("matrix", stream=io.StringIO())
    bench.run(recorder, [get_backend("numba")], sizes=(96,), dtypes=("float64",), steps=1, budget_s=0.05,
              cases=[], workers=2)
    assert not recorder.errors, recorder.errors
    (line,) = recorder.results
    assert (line["case"], line["size"], line["rows"], line["workers"]) == ("cg_partitions", 24, 576, 2)
    assert line["metric"] == "iterations_per_s" and line["value"] == pytest.approx(1 / line["seconds_per_iteration"])
    assert line["overhead_s_per_iteration"] == pytest.approx(
        line["seconds_per_iteration"] - line["local_seconds_per_iteration"])
    # the same Jacobi-preconditioned CG: the rank-order sums may move the last iteration, no more
    assert abs(line["iterations"] - line["local_iterations"]) <= 2 and line["iterations"] > 10
    assert line["relative_error"] < 1e-6 and line["tolerance"] == 1e-8


def test_the_cli_takes_workers_for_matrix_and_names_the_range():
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    result = subprocess.run([sys.executable, "-P", "-m", "hpcgpu.cli", "bench", "matrix", "--workers", "1"],
                            capture_output=True, text=True, timeout=120, env=env)
    assert result.returncode == 2 and "workers" in result.stderr and ">= 2" in result.stderr
