"""The checked-once kernels for hot loops (``prepare_*``) and the public Verlet passes: the same
numbers as the public functions they stand for, on every backend, and the checks they keep."""

import pickle

import numpy as np
import pytest

from hpcgpu.errors import ConfigError
from hpcgpu.kernels import md, nbody, stencil


def test_prepared_shallow_water_steps_as_three_public_stages(backend, rng):
    ny, nx, dt = 12, 16, 30.0
    y0 = (rng.standard_normal((ny, nx)), rng.standard_normal((ny, nx)), 1000.0 + rng.random((ny, nx)))
    y0 = tuple(backend.asarray(a) for a in y0)
    f = backend.asarray(np.full(ny + 1, 1e-4))
    options = dict(f_corner=f, g=9.81, dx=1e4, dy=1e4, viscosity=5.0, boundary=("periodic", "wall"), backend=backend)
    prepared = stencil.prepare_shallow_water(nx, "float64", **options)
    work = [tuple(backend.empty((ny, nx), np.float64) for _ in range(3)) for _ in range(3)]
    if prepared.fused:
        prepared.rk3_step(y0, work[2], dt, stencil.SSP_RK3_STAGES, rows=(0, ny))
    else:
        for (a, b, c), src, dst in zip(stencil.SSP_RK3_STAGES, (y0, work[0], work[1]), work):
            prepared.stage(y0, src, dst, a=a, b=b, c=c * dt, rows=(0, ny))
    expected, state = None, y0
    for a, b, c in stencil.SSP_RK3_STAGES:
        state = stencil.shallow_water_stage(y0, state, tuple(backend.empty((ny, nx), np.float64) for _ in range(3)),
                                            a=a, b=b, c=c * dt, **options)
    expected = state
    for got, want in zip(work[2], expected):
        np.testing.assert_array_equal(backend.to_host(got), backend.to_host(want))
    assert prepared.fused == (backend.name in stencil.FAST_PATHS["shallow_water_rk3_step"])
    assert pickle.loads(pickle.dumps(prepared)).fused == prepared.fused


def test_prepared_shallow_water_checks_once_and_per_call_the_width_and_dtype():
    f = np.full(9, 1e-4)
    with pytest.raises(ConfigError, match="dtype must be one of float32, float64"):
        stencil.prepare_shallow_water(8, "int32", f_corner=f, g=9.81, dx=1.0, dy=1.0, backend="numpy")
    with pytest.raises(ConfigError, match="g must be"):
        stencil.prepare_shallow_water(8, "float64", f_corner=f, g=-1.0, dx=1.0, dy=1.0, backend="numpy")
    prepared = stencil.prepare_shallow_water(8, "float64", f_corner=f, g=9.81, dx=1.0, dy=1.0, backend="numpy")
    wrong = tuple(np.zeros((8, 9)) for _ in range(3))
    with pytest.raises(ConfigError, match="width 8"):
        prepared.stage(wrong, wrong, wrong, a=0.0, b=1.0, c=1.0, rows=(0, 8))
    with pytest.raises(ConfigError, match="no fused shallow_water_rk3_step"):
        prepared.rk3_step(wrong, wrong, 1.0, stencil.SSP_RK3_STAGES, rows=(0, 8))


def test_verlet_passes_are_the_numpy_expressions_bitwise(backend, rng):
    n, box, dt = 50, (5.0, 6.0, 7.0), 0.005
    x = backend.asarray(rng.random((3, n)) * np.array(box)[:, None])
    v, f = backend.asarray(rng.standard_normal((3, n))), backend.asarray(rng.standard_normal((3, n)) * 100)
    images = backend.asarray(np.zeros((3, n), np.int64))
    positions, velocities, new_images = md.verlet_drift(x, v, f, images, box, dt, backend=backend)
    want_v = v + f * (0.5 * dt)
    want_x, want_images = md.verlet.wrap(backend.xp, box, x + want_v * dt, images.copy())
    for got, want in ((positions, want_x), (velocities, want_v), (new_images, want_images)):
        np.testing.assert_array_equal(backend.to_host(got), backend.to_host(want))
    kicked = md.verlet_kick(v, f, dt, backend=backend)
    np.testing.assert_array_equal(backend.to_host(kicked), backend.to_host(v + f * (0.5 * dt)))
    with pytest.raises(ConfigError, match=r"forces must have shape \(3, 50\)"):
        md.verlet_kick(v, f[:, :10], dt, backend=backend)


def test_prepared_lj_forces_are_the_terms_lj_forces_sums(backend, rng):
    box = (6.0, 6.0, 6.0)
    grid = np.stack(np.meshgrid(*(np.arange(4) * 1.5,) * 3, indexing="ij")).reshape(3, -1)
    x = backend.asarray(grid + 0.05 * rng.standard_normal(grid.shape))
    nl = md.build_neighbor_list(x, box, cutoff=2.5, skin=0.3, backend=backend)
    forces, energy, virial = md.lj_forces(x, box, nl, cutoff=2.5, backend=backend)
    prepared = md.prepare_lj_forces(box, cutoff=2.5, backend=backend)
    f, energies, virials, pair_counts = pickle.loads(pickle.dumps(prepared))(x, nl)
    np.testing.assert_array_equal(backend.to_host(f), backend.to_host(forces))
    assert float(backend.to_host(energies).sum(dtype=np.float64)) == pytest.approx(energy, rel=1e-12)
    assert float(backend.to_host(virials).sum(dtype=np.float64)) == pytest.approx(virial, rel=1e-12)
    # the pair counts: the shifted energies miss exactly u(cutoff) per counted pair
    unshifted = md.prepare_lj_forces(box, cutoff=2.5, shift=False, backend=backend)(x, nl)[1]
    pairs = int(backend.to_host(pair_counts).sum()) // 2
    assert pairs > 0 and float(backend.to_host(unshifted).sum(dtype=np.float64)) == pytest.approx(
        float(backend.to_host(energies).sum(dtype=np.float64)) + pairs * md.energy_shift(2.5), rel=1e-12)
    with pytest.raises(ConfigError, match="built for 64 atoms"):
        prepared(x[:, :10], nl)


def test_prepared_gravity_is_accelerations_with_potentials(backend, rng):
    x = backend.asarray(rng.standard_normal((3, 40)))
    m = backend.asarray(rng.random(40))
    for method in ("direct", "tree"):
        gravity = nbody.prepare_gravity("float64", softening=0.1, method=method, backend=backend)
        acc, pot = gravity(x, m, 10, 30)
        want_acc, want_pot = nbody.accelerations(x, m, softening=0.1, targets=(10, 30), potential=True,
                                                 method=method, backend=backend)
        np.testing.assert_array_equal(backend.to_host(acc), backend.to_host(want_acc))
        np.testing.assert_array_equal(backend.to_host(pot), backend.to_host(want_pot))
    with pytest.raises(ConfigError, match="softening"):
        nbody.prepare_gravity("float32", softening=1e30, backend=backend)
    with pytest.raises(ConfigError, match="do not match"):
        gravity(x, m[:5])
