"""The plain Numba kernels bench holds hpcgpu's CPU kernels to: they compute the same job, and the
bench and acceptance lines carry the ratio (no timing asserts: the machine is shared)."""

import io
import json

import numpy as np
import pytest

from hpcgpu.backends import get_backend
from hpcgpu.bench import acceptance, plain
from hpcgpu.bench.harness import Recorder
from hpcgpu.bench.report import Thresholds
from hpcgpu.kernels import md, nbody, stencil


def test_plain_nbody_matches_the_numpy_reference(dtype):
    rng = np.random.default_rng(1)
    n = 300
    positions = rng.standard_normal((3, n)).astype(dtype)
    masses = rng.uniform(0.5, 1.5, n).astype(dtype)
    expected = nbody.accelerations(positions, masses, softening=0.1, backend="numpy")
    out = [np.empty(n, dtype) for _ in range(3)]
    t = dtype.type
    plain.nbody_accelerations(*positions, masses, t(0.01), t(1), *out)
    got = np.stack(out)
    assert np.abs(got - expected).max() / np.abs(expected).max() < (1e-5 if dtype == np.float32 else 1e-12)


def test_plain_diffusion_step_matches_one_periodic_step():
    field = np.random.default_rng(2).random((40, 36))
    expected = stencil.diffuse(field, diffusivity=0.2, dt=1.0, steps=1, backend="numpy")
    got = np.empty_like(field)
    plain.diffusion_step(field, got, 0.2, 0.2)
    np.testing.assert_allclose(got, expected, rtol=1e-13, atol=1e-13)


def test_plain_cell_list_forces_match_the_neighbour_list_forces():
    from hpcgpu.bench.probes import _liquid  # noqa: PLC2701 - the acceptance probe's own test liquid

    positions, box = _liquid(4, np.random.default_rng(3))
    listed = md.build_neighbor_list(positions, box, cutoff=2.5, skin=0.3, backend="numpy")
    expected = md.lj_forces(positions, box, listed, cutoff=2.5, backend="numpy")[0]
    got = plain.lj_forces(np.ascontiguousarray(positions), box, 2.5, np.empty_like(positions))
    np.testing.assert_allclose(got, expected, rtol=1e-9, atol=1e-9 * np.abs(expected).max())


def test_plain_spmv_and_triad():
    from hpcgpu.bench.matrix import poisson_matrix

    A = poisson_matrix(np, 20, np.float64)
    x = np.random.default_rng(4).standard_normal(400)
    out = np.empty(400)
    plain.csr_spmv(A.data, A.indices, A.indptr, x, out, 0.0)
    np.testing.assert_allclose(out, A.to_dense() @ x, rtol=1e-13, atol=1e-13)
    a, b, c = np.zeros(1000, np.float32), np.ones(1000, np.float32), np.full(1000, 2, np.float32)
    plain.triad(a, b, c, np.float32(3))
    assert np.all(a == 7)
    assert plain.triad_bandwidth(1 << 20) > 0


def _lines(module, **kwargs):
    recorder = Recorder(module.__name__.rsplit(".", 1)[-1], stream=io.StringIO())
    module.run(recorder, [get_backend("numba")], budget_s=0.05, **kwargs)
    assert not recorder.errors, recorder.errors
    assert [json.loads(line) for line in recorder.stream.getvalue().splitlines()] == recorder.results
    return recorder.results


def _assert_ratio(line, plain_field):
    assert line["ratio_to_plain"] > 0 and line[plain_field] > 0 and line["plain_kernel"]


def test_nbody_line_carries_the_ratio_and_the_chosen_variants():
    from hpcgpu.bench import nbody as bench

    for line in _lines(bench, sizes=(64,), dtypes=("float32", "float64"), steps=1):
        _assert_ratio(line, "plain_interactions_per_s")
        assert line["inverse_sqrt"] in ("bit_trick", "divide")
        assert line["sweep"] in ("auto_vectorized", "explicit_avx2", "explicit_avx512")


def test_stencil_periodic_diffusion_line_carries_the_ratio():
    from hpcgpu.bench import stencil as bench

    lines = _lines(bench, sizes=(32,), steps=3, cases=("diffusion",))
    _assert_ratio(lines[0], "plain_point_updates_per_s")


def test_spmv_line_carries_the_ratio_the_triad_and_the_bytes_moved():
    from hpcgpu.bench import matrix as bench

    (line,) = _lines(bench, sizes=(200,), dtypes=("float32",), steps=2, cases=("spmv",))
    _assert_ratio(line, "plain_gb_per_s")
    assert line["fraction_of_triad"] == pytest.approx(line["value"] / (line["triad_gb_per_s"] * 1e9))
    assert line["spmv_variant"] in ("banded", "csr")
    if line["spmv_variant"] == "banded":
        rows = 200 * 200
        assert 28 * (198 * 198) < line["bytes_moved_per_product"] < line["bytes_per_product"]
        assert line["bytes_moved_per_product"] < 28 * rows + 40 * 4 * 200


def test_md_line_carries_the_ratio():
    from hpcgpu.bench import md as bench

    (line,) = _lines(bench, sizes=(256,), steps=2)
    _assert_ratio(line, "plain_seconds_per_step")


def _kernel_record(ratio):
    return [{"kind": "inventory", "worker": "a", "device": "cpu"},
            {"kind": "kernel", "worker": "a", "family": "nbody/direct", "rate": 1.0, "passed": True,
             "max_relative_error": 0.0, "tolerance": 1e-12, "ratio_to_plain": ratio}]


@pytest.mark.parametrize("ratio, passed", [(1.3, True), (0.62, False)])
def test_acceptance_flags_a_kernel_below_its_plain_counterpart(ratio, passed):
    verdicts = acceptance.judge(_kernel_record(ratio), Thresholds(), ["a"])
    (verdict,) = [v for v in verdicts if v.get("check") == "nbody/direct vs plain Numba"]
    assert verdict["passed"] is passed and f"{ratio:.2f}x" in verdict["detail"]
    summary = verdicts[-1]
    assert summary["passed"] is passed
    lenient = acceptance.judge(_kernel_record(ratio), Thresholds(plain_ratio=0.5), ["a"])
    assert lenient[-1]["passed"] is True
