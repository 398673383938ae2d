"""Every GPU kernel compiles for sm_90 here, without a GPU, at every launch its chooser can pick.

``scripts/compile_table.py`` compiles each Numba-CUDA kernel with
``numba.cuda.compile_ptx`` and each CuPy source with nvcc (NVRTC's front
end), assembles them with ``ptxas -arch=sm_90 -v`` and checks registers,
spills, static shared memory and float64 instructions against the block
limits of :mod:`hpcgpu.kernels.launch_limits`. The compilers come from the
``test`` extra's pip wheels (``cuda-toolkit[nvcc]``), so this runs in CI; it
skips only where those wheels are not installed, and fails instead under
``CI``. The simulator tier sets ``NUMBA_ENABLE_CUDASIM``, under which Numba
cannot emit PTX, so the script runs in a subprocess without it.

The table in docs/journal.md ("Compiled for sm_90") is the same report;
regenerate it with ``python -P scripts/compile_table.py --write-docs``.
"""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "compile_table.py"


def _script_module():
    spec = importlib.util.spec_from_file_location("compile_table", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    """The script's JSON report: one row per launch configuration."""
    out = tmp_path_factory.mktemp("compile") / "rows.json"
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    result = subprocess.run([sys.executable, "-P", str(SCRIPT), "--json", str(out)],
                            capture_output=True, text=True, env=env, timeout=1200)
    if result.returncode == 2:
        message = f"CUDA compiler wheels not installed: {result.stderr.strip()}"
        if os.environ.get("CI"):
            pytest.fail(message + " (the test extra must install them in CI)")
        pytest.skip(message)
    assert result.returncode in (0, 1) and out.exists(), result.stdout[-3000:] + result.stderr[-5000:]
    return json.loads(out.read_text())


@pytest.mark.slow
def test_every_launch_compiles_without_spills_or_oversized_blocks(report):
    """No spill, static shared memory within 48 KiB and within what the chooser counts, registers x
    threads within the register file, no unintended float64 in float32 kernels; a refused launch
    really exceeds a limit."""
    failures = [f"{r['backend']} {r['family']} {r['kernel']} {r['dtype']} [{r['launch']}, {r['threads']} threads]: {f}"
                for r in report["rows"] for f in r["failures"]]
    assert not failures, "\n".join(failures)


@pytest.mark.slow
def test_every_chooser_is_covered(report):
    """Both backends of every kernel family, both dtypes, and the launches their tables name."""
    from hpcgpu.kernels.nbody import tiling
    from hpcgpu.kernels.stencil import _cuda, _cupy

    rows = report["rows"]
    seen = {(r["backend"], r["family"], r["dtype"]) for r in rows}
    assert seen == {(b, f, d) for b in ("cuda", "cupy") for f in ("stencil", "nbody", "md", "matrix")
                    for d in ("float32", "float64")}
    stencil_cuda = {(r["dtype"], r["launch"], r["threads"]) for r in rows
                    if r["backend"] == "cuda" and r["kernel"] == "diffuse"}
    for (family, dtype), launch in _cuda.LAUNCH.items():
        for option in (launch, *_cuda.VARIANTS[(family, dtype)]):
            if family == "five_point":
                assert (dtype, f"rows {option.rows}", option.threads) in stencil_cuda
    cupy_stage = {(r["dtype"], r["launch"], r["threads"]) for r in rows
                  if r["backend"] == "cupy" and r["kernel"] == "sw_stage"}
    for (family, dtype), launch in _cupy.LAUNCH.items():
        if family == "stage":
            for option in (launch, *_cupy.VARIANTS[(family, dtype)]):
                for vec in {option.vec, 1}:
                    assert (dtype, f"vec {vec}, rows {option.rows}", option.threads) in cupy_stage
    tiles = {(r["backend"], r["dtype"], r["threads"]) for r in rows if r["kernel"].startswith("direct")}
    for dtype, launch in tiling.LAUNCH.items():
        for option in (launch, *tiling.VARIANTS[dtype]):
            assert {("cuda", dtype, option.threads), ("cupy", dtype, option.threads)} <= tiles
    assert {r["launch"] for r in rows if r["kernel"] == "spmv" and r["backend"] == "cupy"} >= {
        f"{index} indices, {lanes} lanes" for index in ("int32", "int64") for lanes in (1, 2, 4, 8, 16, 32)}


@pytest.mark.slow
def test_the_diffusion_pass_that_crashed_is_refused_and_the_compiler_agrees(report):
    """PassLaunch(8, 128, 256) in float64: 9 x 3 x 256 x 8 = 55,296 B of static shared memory, over
    ptxas's 0xc000; its chooser refuses it, and counts the bytes ptxas reports."""
    rows = [r for r in report["rows"] if r["kernel"] == "diffusion pass" and r["launch"] == "T 8, rows 128"]
    by_dtype = {r["dtype"]: r for r in rows}
    assert by_dtype["float64"]["refused"] and by_dtype["float64"]["shared"] == 55296
    assert by_dtype["float32"]["refused"] == "" and by_dtype["float32"]["shared"] == 27648
    for row in report["rows"]:
        if row["kernel"] == "diffusion pass":
            assert row["shared"] == row["predicted_shared"], row


def test_float64_instructions_are_found_in_ptx():
    """The scan that guards float32 kernels sees conversions and arithmetic, not declarations."""
    ptx = """
    .reg .f64 %fd<4>;
    ld.param.f32 %f1, [p];
    cvt.f64.f32 %fd1, %f1;
    @%p1 fma.rn.f64 %fd2, %fd1, %fd1, %fd1;
    add.f32 %f2, %f1, %f1;
    // add.f64 in a comment
    """
    assert _script_module()._float64_instructions(ptx) == {"cvt.f64.f32": 1, "fma.rn.f64": 1}


def test_occupancy_on_sm90():
    """Registers are allocated per warp in 256s: 55 registers x 128 threads leave room for 9 blocks
    (36 warps, 56%); a 48 KiB block leaves room for 4 blocks of 228 KiB minus 1 KiB each."""
    module = _script_module()
    assert module.occupancy(128, 55, 0) == (9, 36 / 64, "registers")
    assert module.occupancy(256, 32, 0) == (8, 1.0, "")
    assert module.occupancy(64, 16, 48 * 1024) == (4, 8 / 64, "shared")


def test_template_instances_are_named_back_from_ptx():
    module = _script_module()
    assert module._demangle("_Z11spmv_kernelIdxLi256ELi4EEvPKT_PKT0_S5_S2_PS0_S3_") == \
        "spmv_kernel<double,longlong,256,4>"
    assert module._normal("spmv_kernel<double, long long, 256, 4>") == "spmv_kernel<double,longlong,256,4>"
