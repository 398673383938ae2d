"""``hpcgpu bench stencil``: the diffusion lines it records, at a tiny size (no timing asserts)."""

import io
import json

import numpy as np
import pytest

from hpcgpu.backends import get_backend
from hpcgpu.bench import stencil as bench
from hpcgpu.bench.harness import Recorder
from hpcgpu.errors import ConfigError

REQUIRED = {"suite", "case", "backend", "dtype", "size", "metric", "value", "unit", "median_s",
            "repeats", "ratio_to_numpy"}


def _records(cases, dtypes=("float32",)):
    recorder = Recorder("stencil", stream=io.StringIO())
    backends = [get_backend("numba"), get_backend("numpy")]
    bench.run(recorder, backends, sizes=(32,), dtypes=dtypes, steps=3, budget_s=0.05, cases=cases)
    assert not recorder.errors, recorder.errors
    printed = [json.loads(line) for line in recorder.stream.getvalue().splitlines()]
    assert printed == recorder.results
    return recorder.results


def test_diffusion_runs_with_periodic_and_with_dirichlet_edges():
    lines = _records(["diffusion", "diffusion_dirichlet"], dtypes=("float32", "float64"))
    assert [(r["case"], r["backend"], r["dtype"]) for r in lines] == [
        (case, backend, dtype) for dtype in ("float32", "float64") for backend in ("numpy", "numba")
        for case in ("diffusion", "diffusion_dirichlet")]
    for r in lines:
        assert REQUIRED <= set(r) and r["suite"] == "stencil" and r["size"] == 32
        assert r["boundary"] == {"diffusion": "periodic", "diffusion_dirichlet": "dirichlet"}[r["case"]]
        assert r["metric"] == "point_updates_per_s" and r["value"] == pytest.approx(32 * 32 * 3 / r["median_s"])
        assert r["steps_per_call"] == 3 and r["repeats"] >= 2 and r["fraction_of_copy"] > 0
        # each case is compared with numpy's line of the same case
        numpy_line = next(o for o in lines if o["backend"] == "numpy" and o["case"] == r["case"]
                          and o["dtype"] == r["dtype"])
        assert r["ratio_to_numpy"] == pytest.approx(r["value"] / numpy_line["value"])


def test_unknown_case_is_a_clear_error():
    with pytest.raises(ConfigError, match="cases must be among diffusion, diffusion_dirichlet, shallow_water; "
                                          "got 'diffusion_neumann'"):
        _records(["diffusion", "diffusion_neumann"])


def test_default_cases_include_the_dirichlet_edge():
    import inspect

    defaults = inspect.signature(bench.run).parameters["cases"].default
    assert defaults == ("diffusion", "diffusion_dirichlet", "shallow_water")
    assert np.all([case in bench.__doc__ for case in defaults])


def test_shallow_water_times_the_stages_and_the_fused_step_where_the_family_declares_one():
    from hpcgpu.kernels.stencil import FAST_PATHS

    lines = _records(["shallow_water"])
    fused = [r["backend"] for r in lines if r["case"] == "shallow_water_fused_step"]
    assert [r["backend"] for r in lines if r["case"] == "shallow_water"] == ["numpy", "numba"]
    assert fused == [b for b in ("numpy", "numba") if b in FAST_PATHS["shallow_water_rk3_step"]] == ["numba"]
    assert all(r["value"] > 0 and r["fraction_of_copy"] > 0 for r in lines)
