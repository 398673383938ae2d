"""The Numba one-pass drift and rebuild test are bitwise the NumPy expressions they replace."""

import numpy as np
import pytest

from hpcgpu.kernels import md
from hpcgpu.kernels.md import atoms_numba

BOX = (7.0, 9.5, 11.25)


def _atoms(rng, n, dtype):
    box = np.array(BOX)[:, None]
    positions = (rng.random((3, n)) * box).astype(dtype)
    positions[:, :4] = np.array([0.0, 1e-12, 6.999999, 7.0])[None, :]  # on and next to the faces
    velocities = (3.0 * rng.standard_normal((3, n))).astype(dtype)
    forces = (50.0 * rng.standard_normal((3, n))).astype(dtype)
    images = rng.integers(-3, 4, (3, n)).astype(np.int64)
    return positions, velocities, forces, images


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_verlet_drift_is_the_numpy_half_kick_drift_and_wrap_bitwise(dtype, rng):
    positions, velocities, forces, images = _atoms(rng, 3000, dtype)
    before = [a.copy() for a in (positions, velocities, forces, images)]
    dt = 0.3  # large: many atoms cross a face, some by more than one box
    got = atoms_numba.verlet_drift(positions, velocities, forces, images, BOX, dt)
    half = 0.5 * dt
    v = velocities + forces * half
    x, im = md.wrap_into_box(np, BOX, positions + v * dt, images.copy())
    for name, a, b in zip(("positions", "velocities", "images"), got, (x, v, im)):
        assert a.dtype == b.dtype
        np.testing.assert_array_equal(a, b, err_msg=name)
    assert np.all((got[0] >= 0) & (got[0] < np.array(BOX, dtype)[:, None]))
    assert (got[2] != images).any()
    for a, b in zip((positions, velocities, forces, images), before):
        np.testing.assert_array_equal(a, b)  # inputs untouched


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_largest_displacement_is_the_same_on_numba_and_numpy(dtype, rng):
    reference = (rng.random((3, 5000)) * np.array(BOX)[:, None]).astype(dtype)
    moved = reference[:, :4000] + (0.4 * rng.standard_normal((3, 4000))).astype(dtype)
    moved = moved % np.array(BOX, dtype)[:, None]  # wrapped: minimum image must undo it
    numpy_answer = md.largest_displacement_squared(moved, reference, BOX)
    numba_answer = md.largest_displacement_squared(moved, reference, BOX, backend="numba")
    assert numba_answer == numpy_answer
    d = (moved - reference[:, :4000]).astype(np.float64)
    d -= np.array(BOX)[:, None] * np.rint(d / np.array(BOX)[:, None])
    assert numpy_answer == pytest.approx(float((d * d).sum(axis=0).max()), rel=1e-5)
    assert numpy_answer < 3 * 0.4 ** 2 * 30  # the wrap did not count as a move


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_verlet_kick_is_the_numpy_half_kick_bitwise(dtype, rng):
    _, velocities, forces, _ = _atoms(rng, 2000, dtype)
    got = atoms_numba.verlet_kick(velocities, forces[:, :2000], 0.005)
    np.testing.assert_array_equal(got, velocities + forces * (0.5 * 0.005))
    assert got.dtype == dtype
    # a column slice (a domain's own atoms out of the forces on atoms and ghosts)
    wide = np.concatenate([forces, forces], axis=1)
    np.testing.assert_array_equal(atoms_numba.verlet_kick(velocities, wide[:, :2000], 0.005), got)
