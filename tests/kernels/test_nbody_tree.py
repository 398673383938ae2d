"""Barnes-Hut tree gravity: accuracy against direct summation, determinism,
edge cases and input checks of ``hpcgpu.kernels.nbody.tree.tree``."""

import importlib

import numpy as np
import pytest

# The package namespace may hold other objects named ``tree``: take the module.
tree_module = importlib.import_module("hpcgpu.kernels.nbody.tree")
tree = tree_module.tree

EPS = 0.01  # softening of the accuracy tests (Henon units)
N_PLUMMER = 20000
N_CHECKED = 1500  # targets checked against direct summation


def plummer_sphere(n, rng):
    """Positions and masses of a Plummer sphere (Aarseth, Henon & Wielen 1974),
    Henon units: total mass 1, G = 1, virial radius 1 (scale length 3 pi / 16).
    Radii beyond 10 scale lengths are drawn again, as in the paper."""
    radii = np.empty(0)
    while radii.size < n:
        u = rng.random(n)
        r = 1.0 / np.sqrt(u ** (-2.0 / 3.0) - 1.0)
        radii = np.concatenate([radii, r[r < 10.0]])
    radii = radii[:n] * (3.0 * np.pi / 16.0)
    cos_t = rng.uniform(-1.0, 1.0, n)
    sin_t = np.sqrt(1.0 - cos_t ** 2)
    phi = rng.uniform(0.0, 2.0 * np.pi, n)
    positions = radii * np.stack([sin_t * np.cos(phi), sin_t * np.sin(phi), cos_t])
    return positions, np.full(n, 1.0 / n)


def direct_sum(targets, sources, masses, eps2, self_index=None, G=1.0, chunk=128):
    """Float64 NumPy reference: accelerations and potentials on ``targets``
    (``self_index[i]``: the source that target i is, left out of the
    potential; coincident unsoftened pairs contribute nothing)."""
    n = targets.shape[1]
    acc = np.zeros((3, n))
    pot = np.zeros(n)
    for a in range(0, n, chunk):
        b = min(a + chunk, n)
        d = sources[:, None, :] - targets[:, a:b, None]
        r2 = np.einsum("kij,kij->ij", d, d) + eps2
        inv = np.zeros_like(r2)
        np.divide(1.0, np.sqrt(r2), out=inv, where=r2 > 0)
        if self_index is not None:
            inv[np.arange(b - a), self_index[a:b]] = 0.0
        acc[:, a:b] = G * np.einsum("kij,ij->ki", d, masses * inv ** 3)
        pot[a:b] = -G * (inv @ masses)
    return acc, pot


def run_tree(targets, sources, masses, eps2, self_offset, theta, G=1.0, potential=True,
             **options):
    dtype = sources.dtype
    acc = np.full((3, targets.shape[1]), np.nan, dtype)
    pot = np.full(targets.shape[1], np.nan, dtype) if potential else None
    tree(targets, sources, masses, eps2, G, self_offset, theta, acc, pot, **options)
    return acc, pot


@pytest.fixture(scope="module")
def plummer():
    """A Plummer sphere, the targets checked and their direct-sum forces."""
    rng = np.random.default_rng(20240611)
    positions, masses = plummer_sphere(N_PLUMMER, rng)
    checked = np.sort(rng.choice(N_PLUMMER, N_CHECKED, replace=False))
    acc, pot = direct_sum(positions[:, checked], positions, masses, EPS ** 2, checked)
    return positions, masses, checked, acc, pot


def tree_errors(plummer, theta, dtype=np.float64):
    positions, masses, checked, acc_ref, pot_ref = plummer
    acc, pot = run_tree(positions.astype(dtype), positions.astype(dtype), masses.astype(dtype),
                        EPS ** 2, 0, theta)
    force = (np.linalg.norm(acc[:, checked] - acc_ref, axis=0)
             / np.linalg.norm(acc_ref, axis=0))
    potential = np.abs(pot[checked] - pot_ref) / np.abs(pot_ref)
    return force, potential


# ---------------------------------------------------------------- accuracy

@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["float64", "float32"])
def test_plummer_sphere_forces_match_direct_summation(plummer, dtype):
    force, potential = tree_errors(plummer, 0.5, dtype)
    assert np.median(force) <= 1e-3
    assert np.percentile(force, 99) <= 5e-3
    assert np.median(potential) <= 1e-4
    assert np.percentile(potential, 99) <= 1e-3


def test_error_falls_as_theta_falls(plummer):
    errors = [tree_errors(plummer, theta) for theta in (0.7, 0.5, 0.3)]
    for (force_wide, pot_wide), (force_narrow, pot_narrow) in zip(errors, errors[1:]):
        assert np.median(force_narrow) < np.median(force_wide)
        assert np.percentile(force_narrow, 99) < np.percentile(force_wide, 99)
        assert np.median(pot_narrow) < np.median(pot_wide)


def test_newtons_third_law_holds_to_the_tree_error(plummer):
    positions, masses = plummer[:2]
    acc, _ = run_tree(positions, positions, masses, EPS ** 2, 0, 0.5, potential=False)
    net = np.linalg.norm((masses * acc).sum(axis=1))
    assert net <= 1e-4 * (masses * np.linalg.norm(acc, axis=0)).sum()


@pytest.mark.parametrize("G", [1.0, 6.674e-11])
def test_targets_outside_the_sources(rng, G):
    sources, masses = plummer_sphere(3000, rng)
    masses = masses * rng.uniform(0.5, 1.5, masses.shape)
    # some inside the sphere, some far outside its bounding cube
    targets = np.concatenate([plummer_sphere(400, rng)[0],
                              rng.normal(size=(3, 100)) * 20.0], axis=1)
    acc, pot = run_tree(targets, sources, masses, 1e-4, -1, 0.5, G=G)
    acc_ref, pot_ref = direct_sum(targets, sources, masses, 1e-4, G=G)
    force = np.linalg.norm(acc - acc_ref, axis=0) / np.linalg.norm(acc_ref, axis=0)
    assert np.median(force) <= 1e-3
    assert np.abs(pot - pot_ref).max() <= 1e-3 * np.abs(pot_ref).max()


# ---------------------------------------------------------------- determinism

@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["float64", "float32"])
def test_sub_ranges_equal_the_full_call_bitwise(rng, dtype):
    positions, masses = (a.astype(dtype) for a in plummer_sphere(5000, rng))
    full_acc, full_pot = run_tree(positions, positions, masses, 1e-4, 0, 0.6)
    for start, stop in [(0, 1), (0, 2500), (1234, 1301), (2500, 5000), (4999, 5000), (17, 4983)]:
        acc, pot = run_tree(positions[:, start:stop], positions, masses, 1e-4, start, 0.6)
        np.testing.assert_array_equal(acc, full_acc[:, start:stop])
        np.testing.assert_array_equal(pot, full_pot[start:stop])


def test_external_targets_do_not_depend_on_their_company(rng):
    sources, masses = plummer_sphere(4000, rng)
    targets = plummer_sphere(1000, rng)[0] * 1.5
    full_acc, full_pot = run_tree(targets, sources, masses, 1e-4, -1, 0.6)
    shuffle = rng.permutation(1000)[:357]
    acc, pot = run_tree(targets[:, shuffle], sources, masses, 1e-4, -1, 0.6)
    np.testing.assert_array_equal(acc, full_acc[:, shuffle])
    np.testing.assert_array_equal(pot, full_pot[shuffle])


def test_repeated_calls_are_identical(rng):
    positions, masses = plummer_sphere(3000, rng)
    first = run_tree(positions, positions, masses, 1e-4, 0, 0.5)
    second = run_tree(positions, positions, masses, 1e-4, 0, 0.5)
    for a, b in zip(first, second):
        np.testing.assert_array_equal(a, b)


# ---------------------------------------------------------------- edge cases

def test_coincident_bodies_are_finite_with_softening(rng):
    positions, masses = plummer_sphere(2000, rng)
    positions[:, 500:800] = positions[:, 500:501]  # 300 bodies at one point
    acc, pot = run_tree(positions, positions, masses, 1e-4, 0, 0.5)
    acc_ref, pot_ref = direct_sum(positions, positions, masses, 1e-4, np.arange(2000))
    assert np.isfinite(acc).all() and np.isfinite(pot).all()
    force = np.linalg.norm(acc - acc_ref, axis=0) / np.linalg.norm(acc_ref, axis=0)
    assert np.median(force) <= 1e-3
    np.testing.assert_allclose(pot, pot_ref, rtol=1e-3)


def test_coincident_bodies_without_softening_contribute_nothing(rng):
    positions, masses = plummer_sphere(1000, rng)
    positions[:, 100:200] = positions[:, 100:101]
    acc, pot = run_tree(positions, positions, masses, 0.0, 0, 0.5)
    acc_ref, pot_ref = direct_sum(positions, positions, masses, 0.0, np.arange(1000))
    assert np.isfinite(acc).all() and np.isfinite(pot).all()
    force = np.linalg.norm(acc - acc_ref, axis=0) / np.linalg.norm(acc_ref, axis=0)
    assert np.median(force) <= 1e-3
    np.testing.assert_allclose(pot, pot_ref, rtol=1e-3)


def test_a_pile_of_coincident_bodies():
    positions = np.ones((3, 40))
    masses = np.full(40, 0.5)
    acc, pot = run_tree(positions, positions, masses, 0.0, 0, 0.5)
    assert (acc == 0).all() and (pot == 0).all()
    acc, pot = run_tree(positions, positions, masses, 0.25, 0, 0.5)
    assert (acc == 0).all()
    np.testing.assert_allclose(pot, -39 * 0.5 / 0.5, rtol=1e-14)


def test_a_far_away_body_keeps_the_forces_right(rng):
    positions, masses = plummer_sphere(3000, rng)
    positions[:, 7] = [1e7, -3e6, 2e6]  # 10^7 virial radii away: 2^-21 of the cube is ~5
    acc, pot = run_tree(positions, positions, masses, 1e-4, 0, 0.5)
    acc_ref, pot_ref = direct_sum(positions, positions, masses, 1e-4, np.arange(3000))
    force = np.linalg.norm(acc - acc_ref, axis=0) / np.linalg.norm(acc_ref, axis=0)
    assert np.median(force) <= 1e-3
    assert force[7] <= 1e-6  # the whole sphere is one far node or its bodies
    np.testing.assert_allclose(pot, pot_ref, rtol=1e-3)


def test_massless_bodies_feel_forces_and_exert_none(rng):
    positions, masses = plummer_sphere(2000, rng)
    masses[::3] = 0.0
    acc, pot = run_tree(positions, positions, masses, 1e-4, 0, 0.5)
    heavy = masses > 0
    acc_heavy, pot_heavy = run_tree(positions, positions[:, heavy], masses[heavy], 1e-4, -1, 0.5)
    acc_ref, _ = direct_sum(positions, positions, masses, 1e-4, np.arange(2000))
    force = np.linalg.norm(acc - acc_ref, axis=0) / np.linalg.norm(acc_ref, axis=0)
    assert np.median(force) <= 1e-3
    np.testing.assert_allclose(acc, acc_heavy, rtol=1e-2, atol=1e-3 * np.abs(acc).max())
    # as external targets, the heavy bodies also feel themselves: -m / eps
    np.testing.assert_allclose(pot, pot_heavy + masses / 1e-2, rtol=1e-3)
    all_massless = run_tree(positions, positions, np.zeros(2000), 1e-4, 0, 0.5)
    assert all((a == 0).all() for a in all_massless)


@pytest.mark.parametrize("n", [1, 2, 3, 17])
def test_few_bodies_are_summed_exactly(rng, n):
    positions = rng.normal(size=(3, n))
    masses = rng.random(n)
    acc, pot = run_tree(positions, positions, masses, 0.0, 0, 0.5)
    acc_ref, pot_ref = direct_sum(positions, positions, masses, 0.0, np.arange(n))
    np.testing.assert_allclose(acc, acc_ref, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(pot, pot_ref, rtol=1e-12, atol=1e-14)


def test_no_targets_and_no_sources():
    positions = np.zeros((3, 5))
    acc, pot = run_tree(positions[:, :0], positions, np.ones(5), 0.0, 0, 0.5)
    assert acc.shape == (3, 0) and pot.shape == (0,)
    acc, pot = run_tree(positions, positions[:, :0], np.ones(0), 0.0, -1, 0.5)
    assert (acc == 0).all() and (pot == 0).all()


def test_float32_input_gives_float32_close_to_float64(rng):
    positions, masses = plummer_sphere(3000, rng)
    acc64, pot64 = run_tree(positions, positions, masses, 1e-4, 0, 0.5)
    acc32, pot32 = run_tree(positions.astype(np.float32), positions.astype(np.float32),
                            masses.astype(np.float32), 1e-4, 0, 0.5)
    assert acc32.dtype == np.float32 and pot32.dtype == np.float32
    scale = np.linalg.norm(acc64, axis=0)
    assert np.median(np.linalg.norm(acc32 - acc64, axis=0) / scale) <= 1e-5
    np.testing.assert_allclose(pot32, pot64, rtol=1e-4)


@pytest.mark.parametrize("leaf_size, group_size", [(1, 1), (1, 200), (64, 8), (16, 4096)])
def test_tree_shape_options_change_cost_not_answers(rng, leaf_size, group_size):
    positions, masses = plummer_sphere(2000, rng)
    acc, pot = run_tree(positions, positions, masses, 1e-4, 0, 0.4,
                        leaf_size=leaf_size, group_size=group_size)
    acc_ref, pot_ref = direct_sum(positions, positions, masses, 1e-4, np.arange(2000))
    force = np.linalg.norm(acc - acc_ref, axis=0) / np.linalg.norm(acc_ref, axis=0)
    assert np.median(force) <= 1e-3
    np.testing.assert_allclose(pot, pot_ref, rtol=1e-3)


# ---------------------------------------------------------------- input checks

def _call(**changes):
    positions = np.random.default_rng(0).random((3, 20))
    args = dict(target_positions=positions, source_positions=positions,
                source_masses=np.ones(20), eps2=1e-4, G=1.0, self_offset=0, theta=0.5,
                acc_out=np.empty((3, 20)), pot_out=np.empty(20))
    args.update(changes)
    tree(**args)


@pytest.mark.parametrize("changes", [
    dict(theta=0.0), dict(theta=-0.5), dict(theta=np.nan), dict(theta=np.inf),
    dict(eps2=-1e-4), dict(eps2=np.nan), dict(G=np.inf),
    dict(leaf_size=0), dict(group_size=0), dict(leaf_size=2.5),
    dict(self_offset=1), dict(self_offset=-2),
    dict(source_masses=-np.ones(20)), dict(source_masses=np.full(20, np.nan)),
    dict(source_masses=np.ones(19)),
    dict(source_positions=np.full((3, 20), np.inf)),
    dict(target_positions=np.full((3, 20), np.nan)),
    dict(acc_out=np.empty((3, 19))), dict(pot_out=np.empty(21)),
    dict(source_positions=np.zeros((2, 20))),
], ids=lambda c: ",".join(f"{k}={v if np.ndim(v) == 0 else np.shape(v)}" for k, v in c.items()))
def test_bad_input_is_rejected(changes):
    with pytest.raises(ValueError):
        _call(**changes)
