"""Lennard-Jones MD kernels: every backend against the numpy reference, and the physics.

Configurations are jittered fcc lattices at liquid density with atoms moved
onto the box faces (and out of the box: positions need not be wrapped) and
pairs moved to just inside and just outside the cutoff and the list radius,
by margins well above the rounding of the dtype (so that every backend
agrees on which side a pair lies). Forces are compared by the shared
tolerance table of ``_support`` (max |difference| / max |reference|).
"""

import pickle

import numpy as np
import pytest
from _support import small, tolerance

from hpcgpu.errors import ConfigError
from hpcgpu.kernels import md
from hpcgpu.kernels.md import cells

DENSITY = 0.8442
LATTICE = (4 / DENSITY) ** (1 / 3)  # fcc cube side at that density
EPS = {np.dtype("float32"): float(np.finfo(np.float32).eps),
       np.dtype("float64"): float(np.finfo(np.float64).eps)}
# Pairs are placed this far (relative) inside or outside a radius: many ulps.
MARGIN = {np.dtype("float32"): 2e-5, np.dtype("float64"): 1e-9}


def fcc(cells, rng, jitter=0.05):
    """Positions (3, 4 cells^3) of a jittered fcc lattice and its cubic box side."""
    basis = np.array([[0, 0, 0], [0.5, 0.5, 0], [0.5, 0, 0.5], [0, 0.5, 0.5]])
    grid = np.stack(np.meshgrid(*(np.arange(cells),) * 3, indexing="ij"), axis=-1).reshape(-1, 1, 3)
    x = ((grid + basis) * LATTICE).reshape(-1, 3).T
    return x + rng.normal(0.0, jitter, x.shape), cells * LATTICE


def separation(x, i, j, box):
    d = x[:, j] - x[:, i]
    lengths = np.array(box)
    return d - lengths * np.rint(d / lengths)


def place_pair(x, i, j, distance, box):
    """Move atom j along the i-j direction to ``distance`` from atom i."""
    d = separation(x, i, j, box)
    x[:, j] = x[:, i] + d * (distance / np.sqrt(d @ d))


def configuration(rng, cells, dtype, cutoff, skin, box_scale=(1.0, 1.0, 1.0)):
    """A liquid-like configuration with the edge cases above; returns (positions, box)."""
    x, side = fcc(cells, rng)
    box = tuple(side * s for s in box_scale)
    x *= np.array(box_scale)[:, None]
    n = x.shape[1]
    margin = MARGIN[np.dtype(dtype)]
    # Pairs just inside / outside the cutoff and the list radius: pick pairs
    # whose distance is already near it, so nothing else gets too close.
    d = np.stack([separation(x, 0, j, box) for j in range(n)], axis=1)
    r = np.sqrt((d * d).sum(axis=0))
    used = {0}
    for target, sign in ((cutoff, -1), (cutoff, 1), (cutoff + skin, -1), (cutoff + skin, 1)):
        candidates = [j for j in np.argsort(np.abs(r - target)) if j not in used]
        j = int(candidates[0])
        used.add(j)
        place_pair(x, 0, j, target * (1 + sign * margin), box)
    # Atoms on the faces of the box, and images outside it.
    x[0, 1] = 0.0
    x[1, 2] = box[1] * (1 - 1e-7)
    x[2, 3] = -1e-7
    x[:, 4] += np.array(box) * np.array([1, -2, 3])
    x[:, 5] -= np.array(box)
    return x.astype(dtype), box


def pair_set(neighbor_list):
    neighbors = np.asarray(_host(neighbor_list.neighbors))
    counts = np.asarray(_host(neighbor_list.counts))
    return [set(neighbors[i, :counts[i]].tolist()) for i in range(counts.shape[0])]


def _host(array):
    return array.get() if hasattr(array, "get") else np.asarray(array)


def brute_force_sets(x, box, radius):
    """Pairs within ``radius`` in float64 from the same (rounded) positions, and
    the pairs within rounding of it (either answer is right for those)."""
    x = x.astype(np.float64)
    n = x.shape[1]
    inside, unsure = [], []
    for i in range(n):
        d = x - x[:, i:i + 1]
        d -= np.array(box)[:, None] * np.rint(d / np.array(box)[:, None])
        r = np.sqrt((d * d).sum(axis=0))
        r[i] = np.inf
        inside.append(set(np.flatnonzero(r < radius).tolist()))
        unsure.append(set(np.flatnonzero(np.abs(r - radius) < 1e-5 * radius).tolist()))
    return inside, unsure


def assert_same_pairs(got, expected, unsure):
    for i, (a, b, u) in enumerate(zip(got, expected, unsure)):
        assert a - u == b - u, f"atom {i}: extra {sorted(a - b - u)}, missing {sorted(b - a - u)}"


def relative(result, reference):
    result = np.asarray(_host(result), dtype=np.float64)
    assert np.isfinite(result).all()
    return float(np.abs(result - reference).max() / np.abs(reference).max())


# Boxes: cells of the list radius per side for the configuration sizes used.
CASES = {
    # cells, cutoff, box scale: 1 cell per side (CPU minimum-image path, all cells once)
    "one-cell": (3, 2.5, (1.0, 1.0, 1.0)),
    # 3 cells per side at radius 1.5: the smallest stencil of distinct cells
    "three-cells": (3, 1.2, (1.0, 1.0, 1.0)),
    # 2 cells along y, 4 along x and z, not cubic
    "mixed": (3, 1.0, (1.5, 0.75, 1.2)),
}
BIG_CASES = {
    # 3 cells per side at radius 2.8: the CPU's shifted-image path
    "big": (6, 2.5, (1.0, 1.0, 1.0)),
    "big-box": (5, 2.5, (1.0, 1.3, 0.9)),
}


def _cases(backend):
    return list(CASES.items()) if backend.simulated else list({**CASES, **BIG_CASES}.items())


def test_forces_match_numpy(fast_backend, dtype, rng):
    for name, (cells, cutoff, scale) in _cases(fast_backend):
        x, box = configuration(rng, cells, dtype, cutoff, 0.3, scale)
        ref = md.lj_forces_all_pairs(x, box, cutoff=cutoff, backend="numpy")
        ref_list = md.build_neighbor_list(x, box, cutoff=cutoff, skin=0.3, backend="numpy")
        listed = md.lj_forces(x, box, ref_list, cutoff=cutoff, backend="numpy")
        nl = md.build_neighbor_list(fast_backend.asarray(x), box, cutoff=cutoff, skin=0.3,
                                    backend=fast_backend)
        forces, energy, virial = md.lj_forces(fast_backend.asarray(x), box, nl, cutoff=cutoff,
                                              backend=fast_backend)
        assert forces.dtype == dtype and forces.shape == x.shape
        limit = tolerance(fast_backend, dtype)
        # The numpy list and all pairs agree to the rounding of the sums' order.
        assert relative(listed[0], ref[0]) <= max(limit, 64 * EPS[dtype]), name
        assert relative(forces, ref[0]) <= limit, name
        # Totals: relative to the sum of magnitudes (the virial nearly cancels).
        scale_e, scale_w = _magnitudes(x, box, cutoff)
        assert abs(energy - ref[1]) <= limit * scale_e, name
        assert abs(virial - ref[2]) <= limit * scale_w, name


def _magnitudes(x, box, cutoff):
    """Sum over pairs of |energy| and |virial| (float64), the scale of the totals' rounding."""
    x = x.astype(np.float64)
    d = x[:, None, :] - x[:, :, None]
    d -= np.array(box)[:, None, None] * np.rint(d / np.array(box)[:, None, None])
    r2 = (d * d).sum(axis=0)
    np.fill_diagonal(r2, np.inf)
    s6 = np.where(r2 < cutoff**2, r2**-3, 0.0)
    return 0.5 * float(np.abs(4 * (s6 * s6 - s6)).sum()), 0.5 * float(np.abs(24 * (2 * s6 * s6 - s6)).sum())


@pytest.mark.parametrize("order", ["C", "F"], ids=["row-major", "column-major"])
def test_backend_kernels_match_numpy_per_atom(fast_backend, dtype, order, rng):
    """Per-atom forces, half energies and half virials from one list, with a list
    that has spare capacity and entries past the counts (they must be ignored), in
    either layout (each kernel reads both)."""
    from hpcgpu.kernels.md import _numpy
    x, box = configuration(rng, 3, dtype, 1.2, 0.3)
    n = x.shape[1]
    radius = 1.5
    neighbors = np.full((n, 40), -7, np.int32)  # garbage past the counts, never read
    counts = np.empty(n, np.int32)
    assert _numpy.build_neighbors(x, box, radius, neighbors, counts) <= 40
    args = (box, 1.2**2, 0.9, 1.1, -0.05)
    ref = [np.empty((3, n), dtype), np.empty(n, dtype), np.empty(n, dtype), np.empty(n, np.int32)]
    _numpy.forces(x, *args[:1], neighbors, counts, *args[1:], *ref)
    dev = fast_backend.asarray
    out = [fast_backend.empty((3, n), dtype), fast_backend.empty((n,), dtype), fast_backend.empty((n,), dtype),
           fast_backend.empty((n,), np.int32)]
    listed = dev(np.asarray(neighbors, order=order))
    assert listed.flags.f_contiguous if order == "F" else listed.flags.c_contiguous
    fast_backend.kernels("md").forces(dev(x), box, listed, dev(counts), *args[1:], *out)
    for got, expected in zip(out[:3], ref[:3]):
        assert relative(got, expected.astype(np.float64)) <= tolerance(fast_backend, dtype)
    # the pairs inside the cutoff, counted where the energies are summed: exactly the reference's
    np.testing.assert_array_equal(_host(out[3]), ref[3])
    assert 0 < ref[3].sum() < counts.sum()  # the list's skin holds pairs outside the cutoff


def test_list_layout_is_the_backends_and_results_do_not_depend_on_it(backend, rng):
    """GPU backends build column-major lists, CPU backends row-major; ``neighbors[i, k]``
    means the same in both, and every backend's forces from a list of either layout (or a
    strided view: lj_forces copies it into the backend's layout) agree to the bit."""
    x, box = configuration(rng, 3, np.float64, 1.2, 0.3)
    nl = md.build_neighbor_list(backend.asarray(x), box, cutoff=1.2, skin=0.3, backend=backend)
    expected_order = getattr(backend.kernels("md"), "NEIGHBOR_ORDER", "C")
    assert expected_order == ("F" if backend.on_gpu else "C")
    flag = "f_contiguous" if expected_order == "F" else "c_contiguous"
    assert getattr(nl.neighbors.flags, flag)
    reference = md.build_neighbor_list(x, box, cutoff=1.2, skin=0.3, backend="numpy")
    assert pair_set(nl) == pair_set(reference)
    host = _host(nl.neighbors)
    wide = np.full((host.shape[0], nl.capacity + 3), -7, np.int32)
    wide[:, :nl.capacity] = host
    results = []
    for neighbors in (np.ascontiguousarray(host), np.asfortranarray(host), wide[:, :nl.capacity]):
        relisted = md.NeighborList(backend.asarray(neighbors), nl.counts, nl.reference_positions, box,
                                   1.2, 0.3, nl.capacity)
        forces, energy, virial = md.lj_forces(backend.asarray(x), box, relisted, cutoff=1.2, backend=backend)
        results.append((_host(forces), energy, virial))
    for forces, energy, virial in results[1:]:
        np.testing.assert_array_equal(forces, results[0][0])
        assert (energy, virial) == results[0][1:]


def test_neighbor_list_is_the_brute_force_set(backend, dtype, rng):
    for name, (cells, cutoff, scale) in _cases(backend):
        x, box = configuration(rng, cells, dtype, cutoff, 0.3, scale)
        nl = md.build_neighbor_list(backend.asarray(x), box, cutoff=cutoff, skin=0.3, backend=backend)
        inside, unsure = brute_force_sets(x, box, cutoff + 0.3)
        got = pair_set(nl)
        assert_same_pairs(got, inside, unsure)
        counts = _host(nl.counts)
        assert counts.dtype == np.int32 and _host(nl.neighbors).dtype == np.int32
        assert counts.max() <= nl.capacity == _host(nl.neighbors).shape[1], name
        assert [len(s) for s in got] == counts.tolist(), "a row lists an atom twice"
        # Every pair appears in both rows (a full list).
        assert all(i in got[j] for i in range(len(got)) for j in got[i]), name


def test_numba_cells_both_paths_and_grids():
    """The numba build scans shifted images in boxes of 3+ cells per side and the
    minimum image below; both give the brute-force set, for every grid shape."""
    rng = np.random.default_rng(11)
    for box, radius in [((10.0, 10.0, 10.0), 3.2), ((10.0, 10.0, 10.0), 2.0), ((12.0, 4.0, 7.0), 1.9),
                        ((3.1, 9.0, 20.0), 1.5), ((6.0, 6.0, 6.0), 2.99)]:
        n = 300
        x = rng.random((3, n)) * np.array(box)[:, None] - 0.5 * np.array(box)[:, None]
        nl = md.build_neighbor_list(x, box, cutoff=radius - 0.25, skin=0.25, backend="numba")
        inside, unsure = brute_force_sets(x, box, radius)
        assert_same_pairs(pair_set(nl), inside, unsure)


def test_overflow_grows_the_capacity(backend, dtype, rng):
    x, box = configuration(rng, 3, dtype, 2.5, 0.3)
    full = md.build_neighbor_list(backend.asarray(x), box, cutoff=2.5, skin=0.3, backend=backend)
    grown = md.build_neighbor_list(backend.asarray(x), box, cutoff=2.5, skin=0.3, capacity=1,
                                   backend=backend)
    largest = int(_host(grown.counts).max())
    assert largest > 1 and grown.capacity >= largest
    assert pair_set(grown) == pair_set(full)
    f_full = md.lj_forces(backend.asarray(x), box, full, cutoff=2.5, backend=backend)
    f_grown = md.lj_forces(backend.asarray(x), box, grown, cutoff=2.5, backend=backend)
    np.testing.assert_array_equal(_host(f_grown[0]), _host(f_full[0]))
    assert f_grown[1:] == f_full[1:]


def test_two_atoms_match_the_analytic_force(backend, dtype):
    """F = 24 eps (2 (s/r)^12 - (s/r)^6) / r along the pair, also across the boundary."""
    epsilon, sigma, cutoff = 1.3, 0.9, 2.4
    box = (6.0, 7.0, 8.0)
    direction = np.array([2.0, -1.0, 2.0]) / 3.0
    for start in (np.array([1.0, 2.0, 3.0]), np.array([5.9, 0.1, 7.5])):  # inside, across faces
        for r in (0.95, 1.3, 2.2):
            x = np.stack([start, start + r * direction], axis=1).astype(dtype)
            nl = md.build_neighbor_list(backend.asarray(x), box, cutoff=cutoff, skin=0.3, backend=backend)
            for shift in (False, True):
                forces, energy, virial = md.lj_forces(backend.asarray(x), box, nl, cutoff=cutoff,
                                                      epsilon=epsilon, sigma=sigma, shift=shift,
                                                      backend=backend)
                d = separation(x.astype(np.float64), 0, 1, box)  # as rounded to the dtype
                r_actual = np.sqrt(d @ d)
                sr6 = (sigma / r_actual) ** 6
                magnitude = 24 * epsilon * (2 * sr6 * sr6 - sr6) / r_actual
                expected_energy = 4 * epsilon * (sr6 * sr6 - sr6)
                if shift:
                    expected_energy -= md.energy_shift(cutoff, epsilon=epsilon, sigma=sigma)
                forces = _host(forces)
                rtol = 64 * EPS[np.dtype(dtype)]
                np.testing.assert_allclose(forces[:, 1], magnitude * d / r_actual, rtol=rtol,
                                           atol=rtol * abs(magnitude))
                np.testing.assert_allclose(forces[:, 0], -forces[:, 1], rtol=0, atol=rtol * abs(magnitude))
                assert energy == pytest.approx(expected_energy, rel=rtol, abs=rtol * 4 * epsilon)
                assert virial == pytest.approx(magnitude * r_actual, rel=rtol, abs=rtol * abs(magnitude))


def test_pairs_at_and_beyond_the_cutoff_do_not_interact(backend):
    box = (10.0, 10.0, 10.0)
    x = np.array([[1.0, 1.0 + 2.5, 1.0 - 2.5 * (1 + 1e-9)], [5.0, 5.0, 5.0], [5.0, 5.0, 5.0]])
    nl = md.build_neighbor_list(backend.asarray(x), box, cutoff=2.5, skin=0.3, backend=backend)
    forces, energy, virial = md.lj_forces(backend.asarray(x), box, nl, cutoff=2.5, backend=backend)
    assert not np.any(_host(forces)) and energy == 0.0 and virial == 0.0
    assert pair_set(nl)[0] == {1, 2}  # in the list (within cutoff + skin) all the same


def test_newtons_third_law(backend, dtype, rng):
    x, box = configuration(rng, small(backend, 5, 3), dtype, 2.5, 0.3)
    nl = md.build_neighbor_list(backend.asarray(x), box, cutoff=2.5, skin=0.3, backend=backend)
    forces, _, _ = md.lj_forces(backend.asarray(x), box, nl, cutoff=2.5, backend=backend)
    forces = _host(forces).astype(np.float64)
    # measured: below 1e-3 of this bound
    assert np.abs(forces.sum(axis=1)).max() <= 64 * EPS[np.dtype(dtype)] * np.abs(forces).sum(axis=1).max()


def test_the_energy_shift(backend):
    """Shifting subtracts the pair energy at the cutoff from every pair inside it."""
    assert md.energy_shift(2.5) == pytest.approx(4 * (2.5**-12 - 2.5**-6), rel=1e-15)
    assert md.energy_shift(3.0, epsilon=2.0, sigma=1.5) == pytest.approx(8 * (0.5**12 - 0.5**6), rel=1e-15)
    rng = np.random.default_rng(5)
    x, box = configuration(rng, 3, np.float64, 2.5, 0.3)
    nl = md.build_neighbor_list(backend.asarray(x), box, cutoff=2.5, skin=0.3, backend=backend)
    f0, u0, w0 = md.lj_forces(backend.asarray(x), box, nl, cutoff=2.5, shift=False, backend=backend)
    f1, u1, w1 = md.lj_forces(backend.asarray(x), box, nl, cutoff=2.5, shift=True, backend=backend)
    inside, _ = brute_force_sets(x, box, 2.5)
    pairs = sum(len(s) for s in inside) // 2
    assert u1 == pytest.approx(u0 - pairs * md.energy_shift(2.5), rel=1e-12)
    np.testing.assert_array_equal(_host(f0), _host(f1))
    assert w0 == w1
    # A pair just inside the cutoff has (nearly) zero shifted energy.
    two = np.array([[0.0, 2.5 - 1e-9], [0.0, 0.0], [0.0, 0.0]])
    nl2 = md.build_neighbor_list(backend.asarray(two), box, cutoff=2.5, skin=0.3, backend=backend)
    assert abs(md.lj_forces(backend.asarray(two), box, nl2, cutoff=2.5, backend=backend)[1]) < 1e-9


def test_needs_rebuild_after_half_the_skin(backend, dtype):
    rng = np.random.default_rng(3)
    x, box = configuration(rng, 3, dtype, 2.5, 0.3)
    skin = 0.3
    nl = md.build_neighbor_list(backend.asarray(x), box, cutoff=2.5, skin=skin, backend=backend)
    assert not md.needs_rebuild(nl, backend.asarray(x))
    direction = np.array([1.0, 2.0, -2.0]) / 3.0
    for fraction, expected in ((0.49, False), (0.51, True)):
        moved = x.copy()
        moved[:, 7] += (fraction * skin * direction).astype(dtype)
        assert md.needs_rebuild(nl, backend.asarray(moved)) is expected, fraction
    # Whole box lengths are no displacement (positions may be wrapped).
    wrapped = x.copy()
    wrapped[:, :10] += np.array(box, dtype)[:, None]
    assert not md.needs_rebuild(nl, backend.asarray(wrapped))


def test_positions_in_any_image_give_the_same_forces(backend, rng):
    x, box = configuration(rng, 3, np.float64, 2.5, 0.3)
    shifted = x + np.array(box)[:, None] * rng.integers(-3, 4, x.shape)
    results = []
    for positions in (x, shifted):
        nl = md.build_neighbor_list(backend.asarray(positions), box, cutoff=2.5, skin=0.3, backend=backend)
        results.append(md.lj_forces(backend.asarray(positions), box, nl, cutoff=2.5, backend=backend))
    scale = np.abs(_host(results[0][0])).max()
    assert np.abs(_host(results[1][0]) - _host(results[0][0])).max() <= 1e-10 * scale
    assert results[1][1] == pytest.approx(results[0][1], rel=1e-10)


def test_neighbor_lists_are_deterministic(backend, rng):
    x, box = configuration(rng, 3, np.float32, 1.2, 0.3)
    a = md.build_neighbor_list(backend.asarray(x), box, cutoff=1.2, skin=0.3, backend=backend)
    b = md.build_neighbor_list(backend.asarray(x), box, cutoff=1.2, skin=0.3, backend=backend)
    counts = _host(a.counts)
    np.testing.assert_array_equal(counts, _host(b.counts))
    na, nb = _host(a.neighbors), _host(b.neighbors)
    for i, c in enumerate(counts):
        np.testing.assert_array_equal(na[i, :c], nb[i, :c])


def test_overlapping_atoms_are_an_error_naming_them(backend, dtype):
    x = np.array([[0.0, 1.0, 1.0, 3.0], [0.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]], dtype)
    box = (10.0, 10.0, 10.0)
    nl = md.build_neighbor_list(backend.asarray(x), box, cutoff=2.5, skin=0.3, backend=backend)
    with pytest.raises(ConfigError, match=r"atoms [12] and [12] overlap \(r = 0\)"):
        md.lj_forces(backend.asarray(x), box, nl, cutoff=2.5, backend=backend)
    with pytest.raises(ConfigError, match=r"atoms [12] and [12] overlap"):
        md.lj_forces_all_pairs(backend.asarray(x), box, cutoff=2.5, backend=backend)


def test_all_pairs_agrees_with_the_list(backend, rng):
    x, box = configuration(rng, 3, np.float64, 2.5, 0.3)
    dev = backend.asarray(x)
    nl = md.build_neighbor_list(dev, box, cutoff=2.5, skin=0.3, backend=backend)
    listed = md.lj_forces(dev, box, nl, cutoff=2.0, epsilon=0.7, sigma=1.1, backend=backend)
    direct = md.lj_forces_all_pairs(dev, box, cutoff=2.0, epsilon=0.7, sigma=1.1, backend=backend)
    assert type(direct[0]) is type(listed[0])
    assert relative(listed[0], _host(direct[0])) <= 1e-12
    assert listed[1] == pytest.approx(direct[1], rel=1e-12)
    assert listed[2] == pytest.approx(direct[2], rel=1e-12, abs=1e-9)


def test_neighbor_list_is_a_checked_frozen_value():
    x = np.array([[0.0, 1.0, 5.0], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    nl = md.build_neighbor_list(x, [10, 10, 10], cutoff=2.5, skin=0.3, backend="numpy")
    assert nl.box == (10.0, 10.0, 10.0) and nl.radius == pytest.approx(2.8) and nl.size == 3
    with pytest.raises(AttributeError):
        nl.capacity = 5
    again = pickle.loads(pickle.dumps(nl))
    np.testing.assert_array_equal(again.neighbors, nl.neighbors)
    with pytest.raises(ConfigError, match="capacity must be >= 1, got 0"):
        md.NeighborList(nl.neighbors[:, :0], nl.counts, x, nl.box, 2.5, 0.3, 0)
    cut = np.zeros((3, 1), np.int32)
    with pytest.raises(ConfigError, match="counts must lie in 0..capacity=1; the largest is 2"):
        md.NeighborList(cut, np.array([2, 1, 0], np.int32), x, nl.box, 2.5, 0.3, 1)
    with pytest.raises(ConfigError, match=r"neighbors must be an int32 array of shape \(3, 4\)"):
        md.NeighborList(cut, nl.counts, x, nl.box, 2.5, 0.3, 4)


def test_bad_input_names_the_parameter():
    x = np.array([[0.0, 1.0, 5.0], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    box = (10.0, 10.0, 10.0)
    build = md.build_neighbor_list
    nl = build(x, box, cutoff=2.5, skin=0.3, backend="numpy")
    with pytest.raises(ConfigError, match=r"cutoff=5.5 must be <= half the smallest box side \(min\(box\) / 2 = 5.0\)"):
        build(x, box, cutoff=5.5, skin=0.3, backend="numpy")
    with pytest.raises(ConfigError, match="cutoff must be > 0"):
        build(x, box, cutoff=0.0, skin=0.3, backend="numpy")
    with pytest.raises(ConfigError, match="skin must be > 0"):
        build(x, box, cutoff=2.5, skin=-0.1, backend="numpy")
    with pytest.raises(ConfigError, match="box side Ly must be a finite number > 0; got 0.0"):
        build(x, (10.0, 0.0, 10.0), cutoff=2.5, skin=0.3, backend="numpy")
    with pytest.raises(ConfigError, match=r"box must be three side lengths"):
        build(x, (10.0, 10.0), cutoff=2.5, skin=0.3, backend="numpy")
    with pytest.raises(ConfigError, match="capacity must be >= 1"):
        build(x, box, cutoff=2.5, skin=0.3, capacity=0, backend="numpy")
    bad = x.copy()
    bad[1, 2] = np.nan
    with pytest.raises(ConfigError, match="positions holds 1 non-finite"):
        build(bad, box, cutoff=2.5, skin=0.3, backend="numpy")
    with pytest.raises(ConfigError, match="positions holds 1 non-finite"):
        md.lj_forces(bad, box, nl, cutoff=2.5, backend="numpy")
    with pytest.raises(ConfigError, match=r"positions must have shape \(3, N\)"):
        build(x[:, :2].T, box, cutoff=2.5, skin=0.3, backend="numpy")
    with pytest.raises(ConfigError, match="float32 or float64"):
        build(x.astype(np.int64), box, cutoff=2.5, skin=0.3, backend="numpy")
    with pytest.raises(ConfigError, match="built for 3 atoms; positions hold 2"):
        md.lj_forces(x[:, :2], box, nl, cutoff=2.5, backend="numpy")
    with pytest.raises(ConfigError, match="differs from the neighbour list's"):
        md.lj_forces(x, (11.0, 10.0, 10.0), nl, cutoff=2.5, backend="numpy")
    with pytest.raises(ConfigError, match=r"cutoff=3.0 exceeds the cutoff the neighbour list was built for \(2.5\)"):
        md.lj_forces(x, box, nl, cutoff=3.0, backend="numpy")
    with pytest.raises(ConfigError, match="epsilon must be > 0"):
        md.lj_forces(x, box, nl, cutoff=2.5, epsilon=0.0, backend="numpy")
    with pytest.raises(ConfigError, match="sigma must be > 0"):
        md.lj_forces_all_pairs(x, box, cutoff=2.5, sigma=-1.0, backend="numpy")
    with pytest.raises(ConfigError, match="shift must be True or False"):
        md.lj_forces(x, box, nl, cutoff=2.5, shift="yes", backend="numpy")
    with pytest.raises(ConfigError, match="neighbor_list must be a NeighborList"):
        md.lj_forces(x, box, (nl.neighbors, nl.counts), cutoff=2.5, backend="numpy")
    with pytest.raises(ConfigError, match=r"positions must have the shape of the list's reference positions \(3, 3\)"):
        md.needs_rebuild(nl, x[:, :2])


def test_cell_grid():
    assert cells.grid((33.6, 33.6, 33.6), 2.8, 32000) == (11, 11, 11)
    assert cells.grid((5.0, 9.0, 30.0), 2.8, 100) == (1, 3, 10)
    # A dilute gas in a huge box gets at most 2 cells per atom (>= 27).
    nx, ny, nz = cells.grid((1000.0, 1000.0, 1000.0), 1.0, 50)
    assert nx * ny * nz <= 100 and min(nx, ny, nz) >= 1
    for x, expected in ((-0.5, 3), (10.0, 0), (7.4, 2), (-1e-17, 3), (9.999999999999998, 3)):
        assert cells.cell_coordinate(x, 10.0, 4) == expected


@pytest.mark.parametrize("name", ["numpy", "numba"])
def test_a_list_of_the_first_rows_equals_the_full_list_with_the_other_rows_empty(name, rng):
    """A slab builds rows for its own atoms only; its ghosts still appear in those rows."""
    from hpcgpu.kernels import md as kernels

    box = (9.0, 9.5, 10.0)
    x = rng.random((3, 400)) * np.array(box)[:, None]
    full = kernels.build_neighbor_list(x, box, cutoff=2.0, skin=0.3, backend=name)
    part = kernels.build_neighbor_list(x, box, cutoff=2.0, skin=0.3, rows=250, backend=name)
    counts = np.asarray(part.counts)
    np.testing.assert_array_equal(counts[:250], np.asarray(full.counts)[:250])
    assert not counts[250:].any() and (np.asarray(full.counts)[250:] > 0).all()
    for i in range(250):
        np.testing.assert_array_equal(np.sort(np.asarray(part.neighbors)[i, :counts[i]]),
                                      np.sort(np.asarray(full.neighbors)[i, :counts[i]]))
    with pytest.raises(ConfigError, match="rows must be <= 400"):
        kernels.build_neighbor_list(x, box, cutoff=2.0, skin=0.3, rows=401, backend=name)


def test_cell_order_lists_the_atoms_cell_by_cell(backend, dtype, rng):
    x, box = configuration(rng, 3, dtype, 1.2, 0.3)
    radius = 1.5
    order = _host(md.cell_order(backend.asarray(x), box, radius=radius, backend=backend))
    n = x.shape[1]
    assert order.dtype == np.int64 and sorted(order.tolist()) == list(range(n))
    nx, ny, nz = cells.grid(box, radius, n)
    cell = [cells.cell_coordinate(float(x[0, i]), box[0], nx)
            + nx * (cells.cell_coordinate(float(x[1, i]), box[1], ny)
                    + ny * cells.cell_coordinate(float(x[2, i]), box[2], nz)) for i in range(n)]
    # cell by cell, and within a cell in increasing index (stable)
    keys = [(cell[i], i) for i in order.tolist()]
    assert keys == sorted(keys)
    # the forces of the reordered atoms are the forces of the atoms, reordered (to rounding)
    nl = md.build_neighbor_list(x, box, cutoff=1.2, skin=0.3, backend="numpy")
    reference = md.lj_forces(x, box, nl, cutoff=1.2, backend="numpy")[0]
    sorted_x = np.ascontiguousarray(x[:, order])
    sorted_nl = md.build_neighbor_list(sorted_x, box, cutoff=1.2, skin=0.3, backend="numpy")
    forces = md.lj_forces(sorted_x, box, sorted_nl, cutoff=1.2, backend="numpy")[0]
    # another order of summation: the tolerance of a backend that sums in its own order
    assert relative(forces, reference[:, order].astype(np.float64)) <= tolerance("numba", dtype)
    # sorting sorted atoms changes nothing
    again = _host(md.cell_order(backend.asarray(sorted_x), box, radius=radius, backend=backend))
    assert again.tolist() == list(range(n))


def test_cell_order_names_bad_input():
    x = np.zeros((3, 4))
    with pytest.raises(ConfigError, match="radius"):
        md.cell_order(x, (5.0, 5.0, 5.0), radius=0.0, backend="numpy")
    with pytest.raises(ConfigError, match="box"):
        md.cell_order(x, (5.0, 5.0), radius=1.0, backend="numpy")
    with pytest.raises(ConfigError, match="box side Ly"):
        md.cell_order(x, (5.0, -1.0, 5.0), radius=1.0, backend="numpy")
    with pytest.raises(ConfigError, match=r"shape \(3, N\)"):
        md.cell_order(np.zeros((2, 4)), (5.0, 5.0, 5.0), radius=1.0, backend="numpy")
    with pytest.raises(ConfigError, match="positions"):
        md.cell_order(np.full((3, 4), np.nan), (5.0, 5.0, 5.0), radius=1.0, backend="numpy")
