"""The device check (scripts/device_check.sh): its time plan, its pieces, and its rehearsal.

A lent GPU machine gives 15 minutes of device time in all, its start
included; the device check spends at most 12 of them, in two commands (420 s
and 300 s). These tests make sure here that the plan fits, that a stage which
overruns is clipped and the summary still written, that the kernel-variant
script keeps every row it made when a variant fails, and (slow; opt out with
HPCGPU_REHEARSAL=0) that the whole rehearsal passes within the plan's own
limits: both commands, in a fresh Python 3.12 environment (3.11 where there
is no 3.12) holding only the GPU image's packages plus the carried
wheelhouse, under the CUDA simulator.

The rehearsal was opt-in until the simulator's launch times were made
steady: under numba-cuda 0.30's simulator (the GPU image's) the same launch
took either 0.13 s or 8-100 s, a GIL convoy between its per-module lock and
its busy-polling main thread. ``hpcgpu.kernels.cuda_simulator`` makes the
poll yield the GIL (0.14-0.65 s every launch), and the whole rehearsal now
takes under two minutes here with every stage well inside its limit.
"""

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "device_check.sh"
DEVICE_BUDGET_S = 15 * 60
"""Device time lent to a session, the machine's start (a few minutes), transfers and idle included."""
PLAN_BUDGET_S = 12 * 60
"""What the two commands' deadlines may add up to: the rest of DEVICE_BUDGET_S is for the start."""
GPU_STAGES_1 = ["install", "info", "gpu-tests", "variants"]
GPU_STAGES_2 = ["install", "info", "stencil-cuda", "stencil-cupy", "nbody-cuda", "nbody-cupy", "md-cuda", "md-cupy",
                "matrix-cuda", "matrix-cupy", "engine", "weather"]

pytestmark = pytest.mark.skipif(shutil.which("bash") is None or shutil.which("timeout") is None,
                                reason="needs bash and coreutils' timeout")


def _load(name):
    spec = importlib.util.spec_from_file_location(f"_device_check_{name}", ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _clean_env(**extra):
    """This process's environment without what would change how the script's Pythons run."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("NUMBA_", "HPCGPU_", "PYTHON", "VIRTUAL_ENV", "OUT", "SITE", "WHEELS", "REHEARS",
                                "DEADLINE_S", "KILL_S", "RESERVE_S", "MIN_STAGE_S", "TEST_TIMEOUT", "FRESH"))}
    env.update(extra)
    return env


def _plan(**env):
    text = subprocess.run(["bash", str(SCRIPT), "plan"], capture_output=True, text=True, check=True,
                          env=_clean_env(**env)).stdout
    rows, deadlines, reserve = [], {}, None
    for line in text.splitlines():
        parts = line.split()
        if parts and parts[0] in ("1", "2"):
            rows.append((parts[0], parts[1], int(parts[2]), "fill" in line))
        m = re.match(r"command (\d): \d+ s of timeouts \+ (\d+) s reserve = \d+ s \(deadline (\d+) s", line)
        if m:
            deadlines[m.group(1)], reserve = int(m.group(3)), int(m.group(2))
    return rows, deadlines, reserve, text


def _planned(command, stage):
    rows, *_ = _plan()
    (seconds,) = [r[2] for r in rows if r[0] == command and r[1] == stage]
    return seconds


def test_both_commands_fit_12_minutes_with_the_gpu_stages_in_priority_order():
    rows, deadlines, reserve, text = _plan()
    assert set(deadlines) == {"1", "2"} and reserve is not None, text
    # the whole plan leaves the 15 minutes' rest for the machine's start (a few minutes)
    assert sum(deadlines.values()) <= PLAN_BUDGET_S < DEVICE_BUDGET_S - 120, text
    for command, stages in (("1", GPU_STAGES_1), ("2", GPU_STAGES_2)):
        mine = [r for r in rows if r[0] == command]
        assert [r[1] for r in mine] == stages, text
        assert mine[0][1] == "install"
        fixed = sum(seconds for _, _, seconds, fill in mine if not fill)
        assert fixed + reserve <= deadlines[command] <= 540, text  # each command well under 10 minutes too
    names = {r[1] for r in rows}
    # CPU-only stages run on the development machine, never on GPU time
    assert not names & {"bench-cpu", "scaling", "cpu-tests", "acceptance"}
    # the test tier gets most of command 1; the variants only fill what is left
    one = dict((r[1], r[2]) for r in rows if r[0] == "1")
    assert one["gpu-tests"] >= 0.75 * deadlines["1"], text
    assert [r[1] for r in rows if r[3]] == ["variants"]
    assert "720 s (12.0 min)" in text


def test_the_plan_prints_a_deadline_given_for_both_commands():
    _, deadlines, _, text = _plan(DEADLINE_S="300")
    assert deadlines == {"1": 300, "2": 300}, text


_FAKE_PYTHON = """#!/usr/bin/env bash
# Stands in for python3 in test_a_stage_that_overruns_is_clipped...: the summary is real,
# the stencil bench hangs, everything else takes a moment and prints one result line.
case "$1" in
    *device_check_summary.py) exec "$REAL_PYTHON" "$@" ;;
esac
case "$*" in
    *"bench stencil"*) exec sleep 300 ;;
esac
sleep 0.2
echo '{"suite": "fake", "case": "fake", "backend": "cuda", "dtype": "float32", "size": 1, "value": 1.0, "unit": "1/s"}'
"""


def test_a_stage_that_overruns_is_clipped_to_the_deadline_and_the_summary_is_still_written(tmp_path):
    fake = tmp_path / "python3"
    fake.write_text(_FAKE_PYTHON)
    fake.chmod(0o755)
    wheels = tmp_path / "whl"
    wheels.mkdir()
    (wheels / "fake-1.0-py3-none-any.whl").write_text("")
    out = tmp_path / "out"
    deadline = 12
    env = _clean_env(PY=str(fake), REAL_PYTHON=sys.executable, OUT=str(out), WHEELS=str(wheels),
                     SITE=str(tmp_path / "site"), DEADLINE_S=str(deadline), RESERVE_S="2", KILL_S="1",
                     MIN_STAGE_S="2")
    started = time.monotonic()
    done = subprocess.run(["bash", str(SCRIPT), "2"], env=env, capture_output=True, text=True, timeout=60)
    elapsed = time.monotonic() - started
    assert elapsed < deadline + 3, done.stdout
    stages = {s["stage"]: s for s in map(json.loads, (out / "stages.jsonl").read_text().splitlines())}
    assert list(stages) == GPU_STAGES_2, done.stdout
    assert stages["install"]["status"] == 0 and stages["info"]["status"] == 0
    hung = stages["stencil-cuda"]
    assert hung["status"] == 124 and "clipped" in hung["note"] and "timed out" in hung["note"]
    assert hung["planned"] == _planned("2", "stencil-cuda") and hung["timeout"] < deadline
    assert all(stages[s]["cpu_seconds"] is not None for s in ("install", "info", "stencil-cuda"))
    assert all(stages[s]["status"] is None and "skipped" in stages[s]["note"] for s in GPU_STAGES_2[3:])
    summary = (out / "summary.txt").read_text()
    assert "stencil-cuda" in summary and "timed out" in summary and "weather" in summary
    assert summary.splitlines()[0] in done.stdout  # also printed


def test_variant_rows_are_written_as_they_are_made_and_a_failing_variant_becomes_an_error_row(tmp_path):
    variants = _load("gpu_kernel_variants")
    from hpcgpu.errors import ConfigError

    path = tmp_path / "rows.jsonl"
    seen = []

    def measured(k):
        def run():
            # every earlier row is already on disk when the next variant starts
            seen.append(len(path.read_text().splitlines()))
            return dict(check=0.5, ms=1.0 + k, gpts=2.0, gbs=3.0, copy=0.5, copy_gbs=6.0)
        return run

    def boom():
        raise RuntimeError("ptxas: too much shared data")

    def refused():
        raise ConfigError("multi_step=PassLaunch(8, 128, 256) cannot run in float64")

    def mismatch():
        return dict(check=3.0, ms=1.0, gpts=2.0, gbs=3.0, copy=0.5, copy_gbs=6.0)

    fake = [variants.Variant("cuda", "diffusion", "float64", "a", True, measured(0)),
            variants.Variant("cuda", "diffusion", "float64", "b", False, boom),
            variants.Variant("cuda", "diffusion", "float64", "c", False, refused),
            variants.Variant("cuda", "diffusion", "float64", "d", False, mismatch),
            variants.Variant("cuda", "shallow_water", "float64", "e", True, measured(4))]
    sink = variants.JsonLines(str(path))
    printed = []

    class Stream:
        def write(self, text):
            printed.append(text)

        def flush(self):
            pass

    rows = variants.measure(fake, sink, stream=Stream())
    sink.close()
    assert seen == [0, 4]
    on_disk = [json.loads(line) for line in path.read_text().splitlines()]
    assert on_disk == json.loads(json.dumps(rows))
    assert [r["status"] for r in on_disk] == ["ok", "error", "refused", "mismatch", "ok"]
    assert on_disk[1]["error"] == "RuntimeError: ptxas: too much shared data"
    assert "ConfigError" in on_disk[2]["error"] and on_disk[4]["ms"] == 5.0
    assert "ERROR" in "".join(printed) and "REFUSED" in "".join(printed)


def test_variant_rows_survive_a_failure_while_the_variants_are_being_made(tmp_path):
    variants = _load("gpu_kernel_variants")

    def make():
        yield variants.Variant("cupy", "diffusion", "float32", "a", True,
                               lambda: dict(check=0.1, ms=1.0, gpts=1.0, gbs=1.0, copy=0.1, copy_gbs=10.0))
        raise MemoryError("out of device memory")

    sink = variants.JsonLines(str(tmp_path / "rows.jsonl"))
    rows = variants.measure(make(), sink, stream=open(os.devnull, "w"))
    sink.close()
    assert [r["status"] for r in rows] == ["ok", "error"]
    assert rows[1]["case"] == "setup" and "MemoryError" in rows[1]["error"]
    assert len((tmp_path / "rows.jsonl").read_text().splitlines()) == 2


def test_the_variants_script_without_cupy_writes_one_clean_error_row(tmp_path, monkeypatch, capsys):
    variants = _load("gpu_kernel_variants")
    monkeypatch.setitem(sys.modules, "cupy", None)  # import cupy raises ImportError
    path = tmp_path / "rows.jsonl"
    assert variants.main(["--jsonl", str(path)]) == 2
    (row,) = [json.loads(line) for line in path.read_text().splitlines()]
    assert row["status"] == "error" and "cupy" in row["error"] and row["case"] == "setup"
    assert "Traceback" not in capsys.readouterr().err


def test_the_summary_counts_a_killed_tier_from_its_verbose_log(tmp_path):
    summary = _load("device_check_summary")
    (tmp_path / "gpu-tests.log").write_text(
        "tests/kernels/test_a.py::test_x[cuda-float32] PASSED [  1%]\n"
        "tests/kernels/test_a.py::test_y[cupy] FAILED [  2%]\n"
        "tests/partition/test_nccl.py::test_z[nccl] SKIPPED (no NCCL) [  3%]\n"
        "_____ ERROR collecting tests/test_cluster.py _____\n")
    (tmp_path / "stages.jsonl").write_text(json.dumps(dict(
        command="1", stage="gpu-tests", status=124, seconds=420.3, timeout=420, planned=420,
        note="timed out")) + "\n")
    result = summary.tier_results(str(tmp_path))
    assert result["counts"] == {"passed": 1, "failed": 1, "errors": 0, "skipped": 1}
    assert result["collection_errors"] == ["tests/test_cluster.py"]
    assert result["nccl"]["skipped"] == 1 and "log" in result["source"]
    text = summary.summarize(str(tmp_path))
    assert "1 passed, 1 failed" in text and "COLLECTION ERROR tests/test_cluster.py" in text
    ok, _, data = summary.verdict([str(tmp_path)])
    assert not ok and any("timed out" in p for p in data["problems"])


def test_the_simulated_cuda_backend_measures_free_ram_without_cupy(monkeypatch):
    """The rehearsal's weather stage runs the cuda backend under the simulator, without CuPy."""
    from hpcgpu import _gpu_probe
    from hpcgpu.backends import get_backend
    from hpcgpu.validation import available_memory

    if not _gpu_probe.simulator_enabled():
        pytest.skip("needs the CUDA simulator (a machine without a GPU)")
    monkeypatch.setitem(sys.modules, "cupy", None)  # import cupy raises ImportError
    assert available_memory(get_backend("cuda")) > 0


def test_the_wheelhouse_pins_what_the_gpu_image_lacks():
    text = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_wheelhouse.sh"), "--list"], capture_output=True,
                          text=True, check=True).stdout
    pins = dict(line.split("==") for line in text.split())
    assert {"dask", "distributed", "zarr", "numcodecs", "bokeh", "pytest-timeout", "setuptools", "tornado"} <= set(pins)
    # the image's own packages are not carried (64 MiB for everything the device tool carries)
    assert not set(pins) & {"numpy", "numba", "numba-cuda", "scipy", "pandas", "cupy-cuda13x", "pytest"}
    # a rehearsal on Python 3.11 (CI) also needs dask's backport of importlib.metadata; the GPU's 3.12 does not
    assert "importlib-metadata" not in pins
    older = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_wheelhouse.sh"), "--list"], capture_output=True,
                           text=True, check=True, env=dict(os.environ, PYTHON_VERSION="3.11")).stdout
    backports = {"importlib-metadata", "zipp", "lazy-importer"}
    assert dict(line.split("==") for line in older.split()).keys() == set(pins) | backports


REHEARSAL_TIMEOUT_S = 1800
"""The rehearsal test's ceiling: building the environment cold (a few minutes of PyPI downloads),
the wheelhouse, then both commands, which their own deadlines bound (12 minutes at most)."""


# pytest-timeout's marker only where it is installed: the GPU image lacks it, and the tier collects
# this module there too (with --strict-markers an unknown marker is a collection error).
_timeout = (pytest.mark.timeout(REHEARSAL_TIMEOUT_S + 60) if importlib.util.find_spec("pytest_timeout")
            else pytest.mark.slow)


@pytest.mark.slow
@_timeout
@pytest.mark.skipif(os.environ.get("HPCGPU_REHEARSAL", "1") == "0", reason="opted out (HPCGPU_REHEARSAL=0)")
def test_the_rehearsal_runs_both_commands_cleanly_in_an_image_like_environment(tmp_path):
    """Both commands under the CUDA simulator, within the plan's own limits (an overrun fails), in
    a Python 3.12 venv (3.11 where there is no 3.12) with only the GPU image's packages and the
    carried wheelhouse; builds (once, then reused from ~/.cache/hpcgpu) that environment and the
    wheelhouse from PyPI when missing.

    Its stages' times are CPU-bound Python (the simulator runs each GPU thread as a Python thread),
    so on a machine shared with work at a higher priority they stretch with the load: the report
    gives each stage's CPU seconds beside its wall time, and says so for a stage that timed out
    while it mostly waited for the CPUs."""
    out = tmp_path / "rehearsal"
    done = subprocess.run(["bash", str(SCRIPT), "rehearse"], env=_clean_env(OUT=str(out)), capture_output=True,
                          text=True, timeout=REHEARSAL_TIMEOUT_S)
    print("\n".join(line for line in done.stdout.splitlines() if line.startswith(("rehearse:", "gpu_wheelhouse:"))))
    if "rehearse: no Python 3.12 or 3.11 here" in done.stdout:
        pytest.skip("no Python 3.12 or 3.11 to build the rehearsal environment with")
    report = out / "rehearsal.txt"
    assert done.returncode == 0, (report.read_text() if report.exists() else done.stdout[-5000:] + done.stderr[-3000:])
    data = json.loads((out / "rehearsal.json").read_text())
    assert data["ok"] and not data["problems"]
    assert [(s["command"], s["stage"]) for s in data["stages"]] == (
        [("1", s) for s in GPU_STAGES_1] + [("2", s) for s in GPU_STAGES_2])
    for stage in data["stages"]:
        if stage["stage"].endswith("-cupy") or stage["stage"] == "variants":
            assert stage["status"] in (0, 2), stage  # CuPy is not in the rehearsal environment: a clean error
        else:
            assert stage["status"] == 0, stage
    # the rehearsal ran each stage under the GPU plan's own limit (clipped to the deadline), not more
    rows, deadlines, _, _ = _plan()
    plan = {(r[0], r[1]): r[2] for r in rows}
    for command in ("1", "2"):
        for stage in map(json.loads, (out / command / "stages.jsonl").read_text().splitlines()):
            assert stage["timeout"] <= plan[(command, stage["stage"])], stage
        assert f"deadline {deadlines[command]} s" in done.stdout
    for command in ("1", "2"):
        assert (out / command / "summary.txt").exists()
    tier = (out / "1" / "summary.txt").read_text()
    assert "0 collection errors" in tier and "0 failed, 0 errors" in tier
    assert json.loads((out / "2" / "weather-summary.json").read_text())["steps"] == 2
    bare = (out / "bare-collection.log").read_text()  # the tier collected without the wheelhouse too
    assert "exit status 0" in bare and "ERROR collecting" not in bare
