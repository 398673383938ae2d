"""The late rebuild's bound on an atom's displacement: the one-pass kernels against the NumPy expressions."""

import numpy as np
import pytest
from _support import small

from hpcgpu.kernels import md as md_kernels


def test_the_bound_is_the_displacement_plus_the_motion_of_speed_and_force():
    box = (10.0, 10.0, 10.0)
    positions = np.array([[9.9, 1.0], [0.0, 1.0], [0.0, 1.0]])
    velocities = np.array([[0.0, 3.0], [2.0, 0.0], [0.0, 4.0]])  # speeds 2 and 5
    forces = np.array([[0.0, 0.0], [0.0, 0.0], [10.0, 0.0]])
    now, ahead = md_kernels.largest_reach_squared(positions, np.zeros((3, 2)), velocities,
                                                  forces, box, 2, 0.01, 1.5)
    # atom 0: |d| 0.1 (through the periodic face) + 1.5 (2 x 0.01 x 2 + 0.01^2 x 3 x 10); atom 1: |d| = sqrt 3
    assert now == pytest.approx(3.0)
    first = 0.1 + 1.5 * (2 * 0.01 * 2 + 1e-4 * 3 * 10)
    second = np.sqrt(3.0) + 1.5 * (2 * 0.01 * 5)
    assert ahead == pytest.approx(max(first, second) ** 2)
    assert md_kernels.largest_reach_squared(positions, np.zeros((3, 2)), velocities, forces, box, 0, 0.01) == \
        pytest.approx((3.0, 3.0))


def test_every_backend_bounds_as_the_numpy_expressions(fast_backend):
    rng = np.random.default_rng(5)
    n, box = small(fast_backend, 5000, 300), (7.0, 8.0, 9.0)
    reference = rng.uniform(0.0, 1.0, (3, n + 7)) * np.asarray(box)[:, None]
    positions = (reference[:, :n] + rng.normal(0.0, 0.1, (3, n))) % np.asarray(box)[:, None]
    velocities, forces = rng.normal(0.0, 1.5, (3, n)), rng.normal(0.0, 20.0, (3, n))
    expected = md_kernels.largest_reach_squared(positions, reference, velocities, forces, box, 3, 0.005, 1.5)
    device = [fast_backend.asarray(a) for a in (positions, reference, velocities, forces)]
    got = md_kernels.largest_reach_squared(*device, box, 3, 0.005, 1.5, backend=fast_backend)
    np.testing.assert_allclose(got, expected, rtol=1e-12)
