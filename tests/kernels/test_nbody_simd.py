"""The explicit float32 N-body sweeps (kernels/nbody/simd.py) and their choice by the autotuner.

Every variant this CPU can run is pinned in turn and held to the numpy
reference on fresh random bodies (sizes that exercise the vector loop, its
scalar tail, and sweeps shorter than one vector), to the partition rule
(a target's sums do not depend on the other targets of the call), to NaN
propagation and to coincident pairs without softening. Variants the CPU
lacks are skipped (they are never offered to the autotuner there).
"""

import json

import numpy as np
import pytest
from _support import tolerance

from hpcgpu import autotune
from hpcgpu.backends import get_backend
from hpcgpu.kernels import nbody
from hpcgpu.kernels.nbody import _numba, simd

SWEEP_KERNEL = "nbody.direct.sweep.float32"
FLOAT32 = np.dtype("float32")


def random_bodies(rng, n):
    positions = rng.standard_normal((3, n)).astype(np.float32)
    masses = rng.uniform(0.5, 1.5, n).astype(np.float32)
    return positions, masses


def relative_error(result, reference):
    assert np.isfinite(result).all()
    return float(np.abs(result.astype(np.float64) - reference).max() / np.abs(reference).max())


@pytest.fixture(params=sorted(_numba.SWEEP_VARIANTS))
def sweep(request):
    """Each float32 sweep this CPU can run, pinned."""
    if request.param not in _numba.sweep_variants_available():
        pytest.skip(f"this CPU cannot run the {request.param} sweep (lanes here: {simd.lanes_available()})")
    with autotune.use(SWEEP_KERNEL, request.param):
        yield request.param


@pytest.mark.parametrize("n", [517, 64, 33, 5])
@pytest.mark.parametrize("softening", [0.05, 0.0], ids=["softened", "unsoftened"])
def test_every_sweep_matches_numpy(sweep, n, softening, rng):
    positions, masses = random_bodies(rng, n)
    for targets in (None, (1, n - 1)):
        kwargs = dict(softening=softening, G=0.7, targets=targets)
        ref_acc, ref_pot = nbody.accelerations(positions, masses, backend="numpy", potential=True, **kwargs)
        acc, pot = nbody.accelerations(positions, masses, backend="numba", potential=True, **kwargs)
        acc_only = nbody.accelerations(positions, masses, backend="numba", **kwargs)
        assert acc.dtype == FLOAT32 and pot.dtype == FLOAT32
        limit = tolerance("numba", FLOAT32)
        assert relative_error(acc, ref_acc) <= limit
        assert relative_error(pot, ref_pot) <= limit
        assert relative_error(acc_only, ref_acc) <= limit


def test_targets_outside_the_sources(sweep, rng):
    """Targets that are not sources (self_offset -1): nothing is left out of their sums."""
    positions, masses = random_bodies(rng, 300)
    targets = (3 * rng.standard_normal((3, 7))).astype(np.float32)
    ref_acc, ref_pot = np.empty((3, 7), np.float32), np.empty(7, np.float32)
    get_backend("numpy").kernels("nbody").direct(targets, positions, masses, 1e-3, 1.0, -1, ref_acc, ref_pot)
    acc, pot = np.empty((3, 7), np.float32), np.empty(7, np.float32)
    get_backend("numba").kernels("nbody").direct(targets, positions, masses, 1e-3, 1.0, -1, acc, pot)
    assert relative_error(acc, ref_acc) <= tolerance("numba", FLOAT32)
    assert relative_error(pot, ref_pot) <= tolerance("numba", FLOAT32)


def test_sub_range_targets_are_bitwise_equal(sweep, rng):
    """A partition's forces equal the same rows of the call for all bodies, bit for bit."""
    n = 300
    positions, masses = random_bodies(rng, n)
    for softening in (0.02, 0.0):
        acc, pot = nbody.accelerations(positions, masses, softening=softening, potential=True, backend="numba")
        for start, stop in [(0, 1), (1, 17), (5, n - 3), (n - 2, n)]:
            part_acc, part_pot = nbody.accelerations(positions, masses, softening=softening, potential=True,
                                                     targets=(start, stop), backend="numba")
            np.testing.assert_array_equal(part_acc, acc[:, start:stop])
            np.testing.assert_array_equal(part_pot, pot[start:stop])


def test_coincident_pairs_without_softening_contribute_nothing(sweep, rng):
    """Bodies in coincident pairs, eps = 0: finite sums equal to the reference, which drops those pairs."""
    half, _ = random_bodies(rng, 40)
    positions = np.concatenate([half, half], axis=1)  # body k and body k + 40 at one point
    masses = rng.uniform(0.5, 1.5, 80).astype(np.float32)
    ref_acc, ref_pot = nbody.accelerations(positions, masses, softening=0.0, potential=True, backend="numpy")
    acc, pot = nbody.accelerations(positions, masses, softening=0.0, potential=True, backend="numba")
    assert relative_error(acc, ref_acc) <= tolerance("numba", FLOAT32)
    assert relative_error(pot, ref_pot) <= tolerance("numba", FLOAT32)


def test_nan_positions_propagate(sweep, rng):
    positions, masses = random_bodies(rng, 50)
    positions[1, 4] = np.nan
    acc, pot = np.empty((3, 50), np.float32), np.empty(50, np.float32)
    for eps2 in (1e-4, 0.0):
        get_backend("numba").kernels("nbody").direct(positions, positions, masses, eps2, 1.0, 0, acc, pot)
        assert np.isnan(acc).all() and np.isnan(pot).all()


@pytest.mark.parametrize("lanes", simd.LANE_WIDTHS)
def test_the_vector_inverse_sqrt_is_within_4_ulp(lanes):
    """The hardware estimate and one Newton step, over float32's normal range."""
    if lanes not in simd.lanes_available():
        pytest.skip(f"no {lanes}-lane sweep on this CPU")
    rng = np.random.default_rng(7)
    values = (10.0 ** rng.uniform(-37, 37, 100_000)).astype(np.float32)
    values = np.concatenate([values, np.array([np.finfo(np.float32).tiny, 1.0, 4.0, 2.0], np.float32)])
    got = simd.inverse_sqrt_of(values, np.empty_like(values), lanes)
    exact = 1 / np.sqrt(values.astype(np.longdouble))
    error = float(np.abs(got.astype(np.longdouble) / exact - 1).max())
    assert error <= 4 * np.finfo(np.float32).eps, error


@pytest.mark.parametrize("features, lanes", [
    ("+avx2,+fma", (8,)),
    ("+avx2,+fma,+avx512f,-prefer-256-bit", (8, 16)),
    ("+avx2,-fma", ()),
    ("+sse4.2", ()),
])
def test_lanes_follow_the_features_numba_compiles_for(monkeypatch, features, lanes):
    """NUMBA_CPU_FEATURES (hpcgpu info --wide-vectors sets it) decides the widths, not the host."""
    import numba

    monkeypatch.setattr(numba.config, "CPU_FEATURES", features)
    simd.lanes_available.cache_clear()
    try:
        assert simd.lanes_available() == lanes
    finally:
        simd.lanes_available.cache_clear()


def test_a_named_cpu_without_features_gets_no_explicit_sweep(monkeypatch):
    import numba

    monkeypatch.setattr(numba.config, "CPU_NAME", "generic")
    monkeypatch.setattr(numba.config, "CPU_FEATURES", None)
    simd.lanes_available.cache_clear()
    try:
        assert simd.lanes_available() == ()
        assert _numba.sweep_variant(np.float32) == _numba.DEFAULT_SWEEP
    finally:
        simd.lanes_available.cache_clear()


@pytest.fixture
def store(tmp_path, monkeypatch):
    """An empty cache folder (so an empty file of choices), and no choices remembered by the process."""
    monkeypatch.setenv("HPCGPU_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv(autotune.AUTOTUNE_ENV, raising=False)
    autotune.forget()
    yield tmp_path / autotune.FILE_NAME
    autotune.forget()


def test_the_float32_sweep_is_tuned_and_listed(store):
    available = _numba.sweep_variants_available()
    variant = nbody.sweep_variant("float32")
    assert variant in available
    if len(available) > 1:
        listed = autotune.choices()["kernels"][SWEEP_KERNEL]
        assert listed["choice"] == variant and set(listed["seconds"]) == set(available)
        assert listed["default"] == _numba.DEFAULT_SWEEP
    assert nbody.sweep_variant("float64") == _numba.DEFAULT_SWEEP


def test_autotune_off_runs_the_compiled_sweep(store, monkeypatch):
    monkeypatch.setenv(autotune.AUTOTUNE_ENV, "0")
    assert nbody.sweep_variant("float32") == _numba.DEFAULT_SWEEP
    assert not store.exists()


def test_an_explicit_sweep_chosen_for_this_machine_is_the_one_run(store, rng):
    """A choice in the file (as a timing that found it fastest leaves there) is what direct runs."""
    explicit = [name for name in _numba.sweep_variants_available() if name != _numba.DEFAULT_SWEEP]
    if not explicit:
        pytest.skip(f"no explicit sweep on this CPU (lanes here: {simd.lanes_available()})")
    chosen = explicit[-1]
    key = autotune.machine_key()
    store.write_text(json.dumps({key: {"kernels": {SWEEP_KERNEL: {"choice": chosen}}}}))
    autotune.forget()
    assert nbody.sweep_variant("float32") == chosen
    positions, masses = random_bodies(rng, 200)
    acc = nbody.accelerations(positions, masses, softening=0.01, backend="numba")
    autotune.forget()
    with autotune.use(SWEEP_KERNEL, chosen):
        pinned = nbody.accelerations(positions, masses, softening=0.01, backend="numba")
    np.testing.assert_array_equal(acc, pinned)
