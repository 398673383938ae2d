"""Review defects at the kernels' public entry points: the MD box, zero N-body bodies, step counts.

* The per-step MD functions (:func:`verlet_drift`, :func:`wrap_into_box`,
  :func:`largest_displacement_squared`) took any ``box``: a side of 0
  divided by zero, a negative, infinite or NaN side gave NaN or silently
  wrong positions, a box of two sides was read beyond its end by the Numba
  pass and one of four had its fourth side ignored. They now check it, in
  :func:`hpcgpu.kernels.md.box.check_box` (the one check every entry point
  and so every backend goes through).
* ``PreparedGravity`` with no bodies raised ZeroDivisionError on the numpy
  backend where numba and cuda returned empty arrays; now every backend does.
* ``diffuse(steps=2**70)`` was accepted (and never finished); counts that
  reach the kernels are now refused beyond their integer type, with the range.
"""

import math

import numpy as np
import pytest

from hpcgpu.errors import ConfigError
from hpcgpu.kernels import md, nbody, stencil
from hpcgpu.kernels.md.box import check_box

INT64_MAX = 2**63 - 1
INT32_MAX = 2**31 - 1

BAD_BOXES = {
    "negative side": ((10.0, -10.0, 10.0), r"box side Ly must be a finite number > 0; got -10.0"),
    "zero side": ((10.0, 10.0, 0.0), r"box side Lz must be a finite number > 0; got 0.0"),
    "nan side": ((math.nan, 10.0, 10.0), r"box side Lx must be a finite number > 0; got nan"),
    "inf side": ((10.0, math.inf, 10.0), r"box side Ly must be a finite number > 0; got inf"),
    "two sides": ((10.0, 10.0), r"box must be three side lengths \(Lx, Ly, Lz\), each a finite number > 0"),
    "four sides": ((10.0,) * 4, r"box must be three side lengths"),
    "a string": ("123", r"box must be three side lengths"),
    "a column": (np.full((3, 1), 10.0), r"box must be three side lengths"),
    "a bool side": ((True, 10.0, 10.0), r"box must be three side lengths"),
    "None": (None, r"box must be three side lengths"),
}


def _atoms(n=8, side=10.0, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.uniform(0.0, side, (3, n))
    return x, rng.normal(size=(3, n)), rng.normal(size=(3, n)), np.zeros((3, n), np.int64)


# -- 1. the box of the per-step MD kernels --------------------------------------------------------


@pytest.mark.parametrize("box, message", BAD_BOXES.values(), ids=BAD_BOXES.keys())
def test_per_step_md_kernels_refuse_a_bad_box_on_every_backend(backend, box, message):
    # before: accepted on numba and cuda (NaN or wrapped garbage, a two-side box read beyond its
    # end), ZeroDivisionError / TypeError / IndexError elsewhere, never an error naming the box
    x, v, f, images = (backend.asarray(a) for a in _atoms())
    with pytest.raises(ConfigError, match=message) as drift:
        md.verlet_drift(x, v, f, images, box, 0.01, backend=backend)
    assert isinstance(drift.value, ValueError)
    with pytest.raises(ConfigError, match=message):
        md.largest_displacement_squared(x, x + 0.1, box, backend=backend)
    with pytest.raises(ConfigError, match=message):
        md.wrap_into_box(backend.xp, box, x.copy(), images.copy())
    with pytest.raises(ConfigError, match=message):
        md.cell_order(backend.asarray(x), box, radius=2.8, backend=backend)


def test_the_other_md_entry_points_share_the_box_check():
    # the same messages from the entry points that already checked (one function does it for all)
    x, _, _, _ = _atoms()
    for box, message in BAD_BOXES.values():
        for call in (lambda: md.build_neighbor_list(x, box, cutoff=2.5, skin=0.3, backend="numpy"),
                     lambda: md.lj_forces_all_pairs(x, box, cutoff=2.5, backend="numpy"),
                     lambda: md.prepare_lj_forces(box, cutoff=2.5, backend="numpy")):
            with pytest.raises(ConfigError, match=message):
                call()


def test_a_good_box_in_any_form_gives_the_same_step(backend):
    x, v, f, images = (backend.asarray(a) for a in _atoms())
    want = md.verlet_drift(x, v, f, images, (10.0, 10.0, 10.0), 0.01, backend=backend)
    for box in ([10, 10, 10], np.array([10.0, 10.0, 10.0]), (np.float32(10.0), 10, 10.0)):
        got = md.verlet_drift(x, v, f, images, box, 0.01, backend=backend)
        for a, b in zip(got, want):
            np.testing.assert_array_equal(backend.to_host(a), backend.to_host(b))
    assert md.largest_displacement_squared(x, x - 0.1, [10, 10, 10], backend=backend) == pytest.approx(0.03)


def test_the_checked_box_passes_through_without_conversion():
    # The per-step check is a few scalar comparisons on the tuple a model holds: no copy, no
    # conversion; it returns the very object.
    box = check_box([6.5, 7, np.float64(8.0)])
    assert box == (6.5, 7.0, 8.0) and all(type(side) is float for side in box)
    assert check_box(box) is box


def test_a_box_between_twice_the_cutoff_and_twice_the_list_radius_is_valid(backend):
    """Not a defect: the minimum image needs ``cutoff <= min(box) / 2``, not ``cutoff + skin``.

    The list holds every pair whose minimum image is within ``cutoff + skin``,
    so it still holds every pair that can come within the cutoff before a
    rebuild; the forces from it are those of all pairs on every backend.
    """
    box = (5.2, 8.0, 5.2)  # cutoff 2.5 <= 2.6 = min(box) / 2 < cutoff + skin = 3.5 (1 or 2 cells per side)
    counts = np.array([4, 6, 2])
    grid = np.stack(np.meshgrid(*(np.arange(c) for c in counts), indexing="ij")).reshape(3, -1)
    rng = np.random.default_rng(3)
    x = (grid + 0.5) * (np.array(box) / counts)[:, None] + rng.uniform(-0.1, 0.1, grid.shape)
    neighbors = md.build_neighbor_list(backend.asarray(x), box, cutoff=2.5, skin=1.0, backend=backend)
    for _ in range(3):
        step = rng.normal(size=x.shape)
        moved = x + step * (0.49 * rng.uniform(size=x.shape[1]) / np.linalg.norm(step, axis=0))  # < skin / 2
        assert not md.needs_rebuild(neighbors, backend.asarray(moved))
        forces, energy, virial = md.lj_forces(backend.asarray(moved), box, neighbors, cutoff=2.5, backend=backend)
        ref_forces, ref_energy, ref_virial = md.lj_forces_all_pairs(moved, box, cutoff=2.5, backend="numpy")
        np.testing.assert_allclose(backend.to_host(forces), ref_forces, rtol=0, atol=1e-9 * abs(ref_forces).max())
        assert energy == pytest.approx(ref_energy, rel=1e-12)
        assert virial == pytest.approx(ref_virial, rel=1e-12)


# -- 2. PreparedGravity with zero bodies ----------------------------------------------------------


@pytest.mark.parametrize("method", nbody.METHODS)
def test_prepared_gravity_with_no_bodies_is_empty_on_every_backend(backend, method, dtype):
    # before: ZeroDivisionError on numpy "direct" (numba and cuda returned empty arrays)
    gravity = nbody.prepare_gravity(dtype, softening=0.1, method=method, backend=backend)
    acc, pot = gravity(backend.empty((3, 0), dtype), backend.empty((0,), dtype))
    assert acc.shape == (3, 0) and pot.shape == (0,)
    assert acc.dtype == dtype and pot.dtype == dtype
    assert type(acc) is type(backend.empty((1,), dtype))
    # an empty range of some bodies (a partition without bodies) is the same
    positions = backend.asarray(np.arange(12.0, dtype=dtype).reshape(3, 4))
    acc, pot = gravity(positions, backend.asarray(np.ones(4, dtype)), 2, 2)
    assert acc.shape == (3, 0) and pot.shape == (0,) and acc.dtype == dtype


def test_the_numpy_direct_kernel_takes_no_sources():
    # the reference kernel itself: its chunk size divided by the number of sources
    from hpcgpu.kernels.nbody import _numpy

    acc, pot = np.empty((3, 0)), np.empty(0)
    assert _numpy.direct(np.empty((3, 0)), np.empty((3, 0)), np.empty(0), 0.01, 1.0, 0, acc, pot) is acc
    assert _numpy.chunk_size(0, 8) >= 1


def test_accelerations_still_refuses_fewer_than_two_bodies():
    # the checking entry point keeps its documented minimum (MIN_BODIES); only the prepared one,
    # which serves partitions, takes none
    with pytest.raises(ConfigError, match="at least 2 bodies; got N=0"):
        nbody.accelerations(np.empty((3, 0)), np.empty(0), softening=0.1, backend="numpy")


# -- 3. counts that do not fit the kernels' integer types -----------------------------------------


@pytest.fixture
def no_diffusion_kernel(backend, monkeypatch):
    """The backend's diffusion kernel replaced by one that fails: a count must be refused before it."""
    def reached(*args, **kwargs):
        raise AssertionError(f"steps={args[4]} reached the {backend.name} diffusion kernel")

    monkeypatch.setattr(stencil.raw_kernels(backend), "diffuse", reached)
    return backend


@pytest.mark.parametrize("steps", [2**70, 2**63, INT64_MAX + 1])
def test_diffuse_refuses_steps_beyond_int64_on_every_backend(no_diffusion_kernel, steps):
    # before: accepted and handed to the kernels, which then ran for ever
    backend = no_diffusion_kernel
    field = backend.asarray(np.ones((8, 8)))
    with pytest.raises(ConfigError, match=rf"steps={steps} does not fit an int64: steps must be an integer in "
                                          rf"1\.\.{INT64_MAX}"):
        stencil.diffuse(field, diffusivity=0.1, dt=1.0, steps=steps, backend=backend)


def test_diffuse_keeps_its_lower_bound_and_takes_the_largest_int64(no_diffusion_kernel):
    backend = no_diffusion_kernel
    field = backend.asarray(np.ones((8, 8)))
    with pytest.raises(ConfigError, match="steps must be >= 1, got 0"):
        stencil.diffuse(field, diffusivity=0.1, dt=1.0, steps=0, backend=backend)
    with pytest.raises(AssertionError, match=f"steps={INT64_MAX} reached"):
        stencil.diffuse(field, diffusivity=0.1, dt=1.0, steps=INT64_MAX, backend=backend)


def test_diffuse_steps_in_range_still_run(backend):
    field = np.zeros((8, 8))
    field[4, 4] = 1.0
    out = stencil.diffuse(backend.asarray(field), diffusivity=0.1, dt=1.0, steps=3, backend=backend)
    assert float(backend.to_host(out).sum()) == pytest.approx(1.0, rel=1e-12)


@pytest.mark.parametrize("width", [2**63, 2**70])
def test_pad_refuses_a_width_beyond_int64(width):
    # before: TypeError "`pad_width` must be of integral type" from inside numpy.pad
    with pytest.raises(ConfigError, match=rf"width={width} does not fit an int64: width must be an integer in "
                                          rf"1\.\.{INT64_MAX}"):
        stencil.pad(np.ones((4, 4)), "periodic", width=width)


@pytest.mark.parametrize("capacity", [2**70, 2**63])
def test_neighbor_list_capacity_must_fit_int32(backend, capacity):
    # before: ValueError "Maximum allowed dimension exceeded" from numpy.empty, naming nothing
    x = backend.asarray(np.array([[0.0, 1.0, 5.0], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]]))
    with pytest.raises(ConfigError, match=rf"capacity={capacity} does not fit an int32: capacity must be an "
                                          rf"integer in 1\.\.{INT32_MAX}"):
        md.build_neighbor_list(x, (10.0,) * 3, cutoff=2.5, skin=0.3, capacity=capacity, backend=backend)


def test_a_neighbor_list_with_a_capacity_beyond_int32_is_refused():
    # the CUDA C kernel takes the capacity as an int and the counts are int32: 2**31 columns cannot be read
    nl = md.build_neighbor_list(np.array([[0.0, 1.0, 5.0], [0.0] * 3, [0.0] * 3]), (10.0,) * 3, cutoff=2.5,
                                skin=0.3, backend="numpy")
    with pytest.raises(ConfigError, match=rf"capacity={INT32_MAX + 1} does not fit an int32"):
        md.NeighborList(nl.neighbors, nl.counts, nl.reference_positions, nl.box, nl.cutoff, nl.skin,
                        INT32_MAX + 1)
