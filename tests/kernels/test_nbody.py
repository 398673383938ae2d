"""N-body kernels: every backend against the numpy reference, and the physics.

Tolerances are the shared table of ``_support`` as they stand: measured
differences from numpy (max |difference| / max |reference|) are below 5e-7
in float32, fast reciprocal square roots included, and 1.5e-15 in float64,
40 and 700 times inside the table, so the family needs no entry of its own.
The analytic checks compare with closed forms at a few ulp of the dtype.
"""

import numpy as np
import pytest
from _support import simulated, small, tolerance, usable_backend

from hpcgpu.errors import ConfigError
from hpcgpu.kernels import nbody
from hpcgpu.kernels.nbody import _numba, tiling

EPS = {np.dtype("float32"): np.finfo(np.float32).eps, np.dtype("float64"): np.finfo(np.float64).eps}


def relative_error(result, reference, backend):
    result = backend.to_host(result)
    assert np.isfinite(result).all()
    return float(np.abs(result.astype(np.float64) - reference).max() / np.abs(reference).max())


def random_bodies(rng, n, dtype):
    positions = rng.standard_normal((3, n)).astype(dtype)
    masses = rng.uniform(0.5, 1.5, n).astype(dtype)
    return positions, masses


def accelerations(backend, positions, masses, **kwargs):
    """``nbody.accelerations`` on ``backend`` with host arrays in and out."""
    result = nbody.accelerations(backend.asarray(positions), backend.asarray(masses),
                                 backend=backend, **kwargs)
    if isinstance(result, tuple):
        return tuple(backend.to_host(r) for r in result)
    return backend.to_host(result)


@pytest.mark.parametrize("softening", [0.05, 0.0], ids=["softened", "unsoftened"])
def test_direct_matches_numpy(fast_backend, dtype, softening, rng):
    n = small(fast_backend, 517, 45)
    positions, masses = random_bodies(rng, n, dtype)
    for targets in (None, (3, n - 5)):
        kwargs = dict(softening=softening, G=0.7, targets=targets, potential=True)
        ref_acc, ref_pot = nbody.accelerations(positions, masses, backend="numpy", **kwargs)
        acc, pot = nbody.accelerations(fast_backend.asarray(positions), fast_backend.asarray(masses),
                                       backend=fast_backend, **kwargs)
        assert acc.dtype == dtype and pot.dtype == dtype
        assert acc.shape == ref_acc.shape and pot.shape == ref_pot.shape
        assert relative_error(acc, ref_acc, fast_backend) <= tolerance(fast_backend, dtype)
        assert relative_error(pot, ref_pot, fast_backend) <= tolerance(fast_backend, dtype)
        acc_only = nbody.accelerations(fast_backend.asarray(positions), fast_backend.asarray(masses),
                                       backend=fast_backend, softening=softening, G=0.7, targets=targets)
        assert relative_error(acc_only, ref_acc, fast_backend) <= tolerance(fast_backend, dtype)


def test_targets_outside_the_sources_match_numpy(fast_backend, dtype, rng):
    """The backend entry point with targets that are not sources (self_offset = -1)."""
    positions, masses = random_bodies(rng, small(fast_backend, 300, 40), dtype)
    targets = (3 * rng.standard_normal((3, 7))).astype(dtype)
    ref_acc, ref_pot = np.empty((3, 7), dtype), np.empty(7, dtype)
    usable_backend("numpy").kernels("nbody").direct(targets, positions, masses, 1e-3, 1.0, -1,
                                                     ref_acc, ref_pot)
    dev = fast_backend.asarray
    acc, pot = fast_backend.empty((3, 7), dtype), fast_backend.empty(7, dtype)
    fast_backend.kernels("nbody").direct(dev(targets), dev(positions), dev(masses), 1e-3, 1.0, -1, acc, pot)
    assert relative_error(acc, ref_acc, fast_backend) <= tolerance(fast_backend, dtype)
    assert relative_error(pot, ref_pot, fast_backend) <= tolerance(fast_backend, dtype)


def test_close_and_coincident_pairs_with_softening(backend, dtype, rng):
    """Softened pairs at tiny or zero separation give finite, right values."""
    n = small(backend, 64, 16)
    positions, masses = random_bodies(rng, n, dtype)
    positions[:, 1] = positions[:, 0]  # coincident
    positions[:, 3] = positions[:, 2] + np.array([1e-6, -2e-6, 0.5e-6], dtype)  # very close
    positions[:, 5] = positions[:, 4] + np.array([0.0, 0.0, 1e-3], dtype)
    softening = 1e-2
    acc, pot = accelerations(backend, positions, masses, softening=softening, potential=True)
    assert np.isfinite(acc).all() and np.isfinite(pot).all()
    # Reference in float64 from the same (rounded) inputs.
    ref_acc, ref_pot = nbody.accelerations(positions.astype(np.float64), masses.astype(np.float64),
                                           softening=softening, potential=True, backend="numpy")
    # The table's tolerance, or 64 ulp for numpy's own float32 rounding.
    limit = max(tolerance(backend, dtype), 64 * EPS[dtype])
    assert np.abs(acc - ref_acc).max() / np.abs(ref_acc).max() <= limit
    assert np.abs(pot - ref_pot).max() / np.abs(ref_pot).max() <= limit
    # The coincident pair pulls neither body: both feel the same acceleration
    # (to rounding: each leaves itself out of a different split of the sum).
    np.testing.assert_allclose(acc[:, 0], acc[:, 1], rtol=0,
                               atol=16 * EPS[dtype] * np.abs(acc).max())


def test_coincident_bodies_without_softening_contribute_nothing(backend, dtype):
    # Bodies 0 and 1 at the origin, body 2 at (0, 2, 0).
    positions = np.array([[0.0, 0.0, 0.0], [0.0, 0.0, 2.0], [0.0, 0.0, 0.0]], dtype)
    masses = np.array([1.0, 2.0, 4.0], dtype)
    acc, pot = accelerations(backend, positions, masses, softening=0.0, G=2.0, potential=True)
    expected_acc = np.array([[0.0, 0.0, 0.0], [2.0, 2.0, -1.5], [0.0, 0.0, 0.0]])
    expected_pot = np.array([-4.0, -4.0, -3.0])
    np.testing.assert_allclose(acc, expected_acc, rtol=8 * EPS[dtype], atol=0)
    np.testing.assert_allclose(pot, expected_pot, rtol=8 * EPS[dtype], atol=0)


def test_two_bodies_match_the_analytic_force(backend, dtype):
    """a = G m r / (r^2 + eps^2)^(3/2) along the separation, phi = -G m / sqrt(r^2 + eps^2)."""
    r, eps, G = 1.5, 0.4, 3.0
    direction = np.array([2.0, -1.0, 2.0]) / 3.0
    positions = np.stack([np.zeros(3), r * direction], axis=1).astype(dtype)
    masses = np.array([2.0, 5.0], dtype)
    acc, pot = accelerations(backend, positions, masses, softening=eps, G=G, potential=True)
    d = positions[:, 1].astype(np.float64) - positions[:, 0]  # as rounded to the dtype
    d2 = float((d**2).sum())
    expected_acc = G * np.outer(d, [5.0, -2.0]) / (d2 + eps**2) ** 1.5
    expected_pot = -G * np.array([5.0, 2.0]) / np.sqrt(d2 + eps**2)
    # a few rounding steps: ~4 ulp of the inputs' dtype
    np.testing.assert_allclose(acc, expected_acc, rtol=8 * EPS[dtype])
    np.testing.assert_allclose(pot, expected_pot, rtol=8 * EPS[dtype])


def test_newtons_third_law(backend, dtype, rng):
    """sum_i m_i a_i = 0: internal forces cancel in pairs."""
    positions, masses = random_bodies(rng, small(backend, 400, 30), dtype)
    acc = accelerations(backend, positions, masses, softening=0.01)
    force = masses.astype(np.float64) * acc.astype(np.float64)
    # measured: 0.1 eps on the CPU
    assert np.abs(force.sum(axis=1)).max() <= 16 * EPS[dtype] * np.abs(force).sum(axis=1).max()


@pytest.mark.parametrize("shift", [0.0, 1000.0], ids=["origin", "far"])
def test_translation_invariance(fast_backend, shift, rng):
    """Moving the whole system leaves the accelerations unchanged (to the precision
    of the positions): the sweep must not reassociate x_j - x_i away."""
    dtype = np.dtype("float64")
    positions, masses = random_bodies(rng, small(fast_backend, 200, 24), dtype)
    reference = accelerations(fast_backend, positions, masses, softening=0.01)
    moved = accelerations(fast_backend, positions + np.array([[shift], [-shift], [2 * shift]]), masses,
                          softening=0.01)
    scale = np.abs(reference).max()
    assert np.abs(moved - reference).max() <= (shift + 10) * 1e-13 * scale


def test_uniform_sphere_potential_energy(backend, dtype):
    """W = 1/2 sum m_i phi_i of a uniform ball is -3 G M^2 / (5 R).

    Bodies on a cubic lattice inside the ball; the discrete sum differs from
    the continuum by O(h / R) (lattice spacing h): 0.5 % here.
    """
    if backend.simulated:
        pytest.skip("thousands of bodies: too slow for the CUDA simulator (its tests check indexing)")
    h = 0.1
    axis = np.arange(-1.0 + h / 2, 1.0, h)
    grid = np.stack(np.meshgrid(axis, axis, axis, indexing="ij")).reshape(3, -1)
    positions = grid[:, (grid**2).sum(axis=0) <= 1.0].astype(dtype)
    n = positions.shape[1]
    total_mass, G = 3.0, 2.0
    masses = np.full(n, total_mass / n, dtype)
    _, pot = accelerations(backend, positions, masses, softening=0.0, G=G, potential=True)
    energy = 0.5 * float((masses.astype(np.float64) * pot).sum())
    # The lattice points fill a ball of the same volume: radius (3 n h^3 / 4 pi)^(1/3).
    radius = (3 * n * h**3 / (4 * np.pi)) ** (1 / 3)
    expected = -3 * G * total_mass**2 / (5 * radius)
    assert abs(energy / expected - 1) < 0.02


def test_sub_range_targets_are_bitwise_equal(backend, dtype, rng):
    """A target's result does not depend on which other targets are computed with it
    (a partition's forces equal the same rows of the single-partition call)."""
    n = small(backend, 300, 37)
    positions, masses = random_bodies(rng, n, dtype)
    for softening in (0.02, 0.0):
        acc, pot = accelerations(backend, positions, masses, softening=softening, potential=True)
        for start, stop in [(0, 1), (1, 17), (5, n - 3), (n - 2, n)]:
            part_acc, part_pot = accelerations(backend, positions, masses, softening=softening,
                                               potential=True, targets=(start, stop))
            np.testing.assert_array_equal(part_acc, acc[:, start:stop])
            np.testing.assert_array_equal(part_pot, pot[start:stop])
        acc_only = accelerations(backend, positions, masses, softening=softening)
        part_acc = accelerations(backend, positions, masses, softening=softening, targets=(2, 9))
        np.testing.assert_array_equal(part_acc, acc_only[:, 2:9])


def test_nan_positions_propagate(fast_backend, dtype, rng):
    """The kernels keep NaN (no 'no-NaNs' fast-math): a bad body shows up in the result."""
    positions, masses = random_bodies(rng, small(fast_backend, 50, 12), dtype)
    positions[1, 4] = np.nan
    n = positions.shape[1]
    acc, pot = fast_backend.empty((3, n), dtype), fast_backend.empty(n, dtype)
    dev = fast_backend.asarray
    for eps2 in (1e-4, 0.0):
        fast_backend.kernels("nbody").direct(dev(positions), dev(positions), dev(masses), eps2, 1.0, 0,
                                             acc, pot)
        assert np.isnan(fast_backend.to_host(acc)).all(axis=0).all()
        assert np.isnan(fast_backend.to_host(pot)).all()


def test_inputs_are_not_modified(backend, rng):
    positions, masses = random_bodies(rng, small(backend, 40, 10), np.float64)
    p, m = backend.asarray(positions), backend.asarray(masses)
    nbody.accelerations(p, m, softening=0.1, potential=True, backend=backend)
    np.testing.assert_array_equal(backend.to_host(p), positions)
    np.testing.assert_array_equal(backend.to_host(m), masses)


def test_strided_inputs(fast_backend, rng):
    """(N, 3) arrays passed transposed, and masses with a stride."""
    n = small(fast_backend, 120, 20)
    xyz = rng.standard_normal((n, 3))
    masses = rng.uniform(0.5, 1.0, 2 * n)[::2]
    ref = nbody.accelerations(np.ascontiguousarray(xyz.T), np.ascontiguousarray(masses),
                              softening=0.1, backend="numpy")
    got = nbody.accelerations(fast_backend.asarray(xyz).T, fast_backend.asarray(masses),
                              softening=0.1, backend=fast_backend)
    assert relative_error(got, ref, fast_backend) <= tolerance(fast_backend, "float64")


@pytest.mark.parametrize("variant", sorted(_numba.INVERSE_SQRT_VARIANTS))
def test_every_inverse_sqrt_variant_matches_numpy(fast_backend, dtype, variant, rng):
    """Each float64 variant the autotuner may pick, pinned, against the reference (the other
    backends ignore the pin: they must match in every case)."""
    from hpcgpu import autotune

    n = small(fast_backend, 333, 40)
    positions, masses = random_bodies(rng, n, dtype)
    kwargs = dict(softening=0.05, G=0.7, potential=True)
    ref_acc, ref_pot = nbody.accelerations(positions, masses, backend="numpy", **kwargs)
    with autotune.use("nbody.direct.inverse_sqrt.float64", variant):
        acc, pot = nbody.accelerations(fast_backend.asarray(positions), fast_backend.asarray(masses),
                                       backend=fast_backend, **kwargs)
        acc_only = nbody.accelerations(fast_backend.asarray(positions), fast_backend.asarray(masses),
                                       backend=fast_backend, softening=0.05, G=0.7)
    assert relative_error(acc, ref_acc, fast_backend) <= tolerance(fast_backend, dtype)
    assert relative_error(pot, ref_pot, fast_backend) <= tolerance(fast_backend, dtype)
    assert relative_error(acc_only, ref_acc, fast_backend) <= tolerance(fast_backend, dtype)


def test_the_divide_inverse_sqrt_is_within_its_stated_accuracy():
    """sqrt plus a division, each correctly rounded: within 1.5 ulp (2 allowed for the ratio)."""
    rng = np.random.default_rng(8)
    for dtype, low, high in ((np.float64, -307, 307), (np.float32, -37, 37)):
        values = (10.0 ** rng.uniform(low, high, 100_000)).astype(dtype)
        got = _numba.inverse_sqrt_of(values, np.empty_like(values), dtype(1), True)
        exact = 1 / np.sqrt(values.astype(np.longdouble))
        error = np.abs(got.astype(np.longdouble) / exact - 1).max()
        assert error <= 2 * np.finfo(dtype).eps, (dtype, float(error))


def test_fast_inverse_sqrt_of_the_numba_kernel():
    """The float64 bit-trick estimate plus refinement is within 4 ulp over the normal range;
    float32's vrsqrtps plus a Newton step within 4 ulp."""
    rng = np.random.default_rng(7)
    for dtype, low, high in ((np.float64, -307, 307), (np.float32, -37, 37)):
        values = (10.0 ** rng.uniform(low, high, 200_000)).astype(dtype)
        values = np.concatenate([values, np.array([np.finfo(dtype).tiny, 1.0, 4.0, 2.0], dtype)])
        got = _numba.inverse_sqrt_of(values, np.empty_like(values), dtype(1))
        exact = 1 / np.sqrt(values.astype(np.longdouble))
        error = np.abs(got.astype(np.longdouble) / exact - 1).max()
        assert error <= 4 * np.finfo(dtype).eps, (dtype, float(error))


@pytest.fixture(params=[pytest.param("cuda", marks=pytest.mark.cudasim if simulated() else pytest.mark.gpu,
                                     id="cuda-sim" if simulated() else "cuda")])
def cuda_backend(request):
    return usable_backend(request.param)


@pytest.mark.parametrize("launch", [pytest.param(v, id=f"threads{v.threads}-tiles{v.min_tiles}-"
                                                          f"slices{v.max_slices}")
                                    for v in tiling.VARIANTS["float64"]])
def test_every_cuda_launch_matches_numpy(cuda_backend, launch, rng):
    """Targets over more than one block, a partial last tile, several slices."""
    from hpcgpu.kernels.nbody import _cuda, _numpy
    dtypes = [np.dtype("float64")] if simulated() else [np.dtype("float32"), np.dtype("float64")]
    length, _ = tiling.slices(1, launch)
    # Under the simulator at most 150 bodies (it runs every thread in Python).
    n = min(launch.threads + length + launch.threads // 2 + 3, 150) if simulated() else 5000
    for dtype in dtypes:
        positions, masses = random_bodies(rng, n, dtype)
        for potential in (False, True):
            ref_acc = np.empty((3, n - 4), dtype)
            ref_pot = np.empty(n - 4, dtype) if potential else None
            _numpy.direct(positions[:, 4:], positions, masses, 1e-3, 1.5, 4, ref_acc, ref_pot)
            dev = cuda_backend.asarray
            acc = cuda_backend.empty((3, n - 4), dtype)
            pot = cuda_backend.empty(n - 4, dtype) if potential else None
            _cuda._direct(dev(positions)[:, 4:], dev(positions), dev(masses), 1e-3, 1.5, 4, acc, pot, launch)
            assert relative_error(acc, ref_acc, cuda_backend) <= tolerance(cuda_backend, dtype)
            if potential:
                assert relative_error(pot, ref_pot, cuda_backend) <= tolerance(cuda_backend, dtype)


def _tree_available():
    try:
        from hpcgpu.kernels.nbody import tree  # noqa: F401
    except ImportError as error:
        return str(error)
    return ""


def test_tree_method_agrees_with_direct(backend, rng):
    missing = _tree_available()
    if missing:
        pytest.skip(f"hpcgpu.kernels.nbody.tree is not there yet ({missing})")
    positions, masses = random_bodies(rng, 600, np.float64)
    direct_acc, direct_pot = nbody.accelerations(positions, masses, softening=0.01, potential=True,
                                                 backend="numpy")
    acc, pot = nbody.accelerations(backend.asarray(positions), backend.asarray(masses), softening=0.01,
                                   potential=True, method="tree", theta=0.3, backend=backend)
    assert type(acc) is type(backend.asarray(positions))
    assert relative_error(acc, direct_acc, backend) < 1e-2
    assert relative_error(pot, direct_pot, backend) < 1e-3
    part = nbody.accelerations(backend.asarray(positions), backend.asarray(masses), softening=0.01,
                               targets=(10, 20), method="tree", theta=0.3, backend=backend)
    np.testing.assert_allclose(backend.to_host(part), backend.to_host(acc)[:, 10:20], rtol=1e-12,
                               atol=1e-12 * np.abs(direct_acc).max())


def test_bad_input_names_the_parameter():
    good = np.ones((3, 4)) * np.arange(4)
    masses = np.ones(4)
    call = nbody.accelerations
    with pytest.raises(ConfigError, match="at least 2 bodies"):
        call(good[:, :1], masses[:1], softening=0.1, backend="numpy")
    with pytest.raises(ConfigError, match="softening must be >= 0"):
        call(good, masses, softening=-0.1, backend="numpy")
    with pytest.raises(ConfigError, match="softening=1e-30 squared"):
        call(good.astype(np.float32), masses.astype(np.float32), softening=1e-30, backend="numpy")
    with pytest.raises(ConfigError, match="masses must be >= 0"):
        call(good, -masses, softening=0.1, backend="numpy")
    with pytest.raises(ConfigError, match="masses holds 1 non-finite"):
        call(good, np.array([1.0, np.inf, 1.0, 1.0]), softening=0.1, backend="numpy")
    bad = good.copy()
    bad[2, 1] = np.nan
    with pytest.raises(ConfigError, match="positions holds 1 non-finite"):
        call(bad, masses, softening=0.1, backend="numpy")
    with pytest.raises(ConfigError, match=r"positions must have shape \(3, N\)"):
        call(good.T, masses, softening=0.1, backend="numpy")
    with pytest.raises(ConfigError, match=r"masses must have shape \(4,\)"):
        call(good, masses[:3], softening=0.1, backend="numpy")
    with pytest.raises(ConfigError, match="masses has dtype float32 but positions has float64"):
        call(good, masses.astype(np.float32), softening=0.1, backend="numpy")
    with pytest.raises(ConfigError, match="float32 or float64"):
        call(good.astype(np.int64), masses.astype(np.int64), softening=0.1, backend="numpy")
    with pytest.raises(ConfigError, match="targets stop must be <= 4"):
        call(good, masses, softening=0.1, targets=(0, 5), backend="numpy")
    with pytest.raises(ConfigError, match="targets start must be >= 0"):
        call(good, masses, softening=0.1, targets=(-1, 2), backend="numpy")
    with pytest.raises(ConfigError, match="non-empty range"):
        call(good, masses, softening=0.1, targets=(2, 2), backend="numpy")
    with pytest.raises(ConfigError, match="targets must be None or a pair"):
        call(good, masses, softening=0.1, targets=3, backend="numpy")
    with pytest.raises(ConfigError, match="method must be one of 'direct', 'tree'; got 'fmm'"):
        call(good, masses, softening=0.1, method="fmm", backend="numpy")
    with pytest.raises(ConfigError, match="theta must be > 0"):
        call(good, masses, softening=0.1, method="tree", theta=0.0, backend="numpy")
    with pytest.raises(ConfigError, match="G must be > 0"):
        call(good, masses, softening=0.1, G=-1.0, backend="numpy")
    with pytest.raises(ConfigError, match="potential must be True or False"):
        call(good, masses, softening=0.1, potential="yes", backend="numpy")
