"""Bad input at the public kernel entry points: a ConfigError naming the parameter, never a deep traceback.

Each test is a defect found by calling the families' public functions
directly with input a user could pass: a grid spacing whose square
underflows, a float32 ``G`` or ``alpha`` beyond the dtype's range, a
complex or NaN Coriolis array, integer atom arrays (truncated by the Numba
pass only), a displacement reference shorter than the positions (read
beyond its end by the Numba pass), tuples of the wrong length, dtype names.
"""

import numpy as np
import pytest

from hpcgpu.errors import ConfigError
from hpcgpu.kernels import matrix, md, nbody, stencil

FC = np.full(7, 1e-4)  # Coriolis on the 7 corner rows of a 6-row grid


def _sw_fields(rng, dtype="float64"):
    u, v, h = rng.standard_normal((3, 6, 7)).astype(dtype)
    return u, v, h + 10


# -- stencil ------------------------------------------------------------------------------------


@pytest.mark.parametrize("dx", [1e-200, 1e-160, 1e200])
def test_spacing_whose_square_leaves_the_float_range_is_refused(dx):
    # before: ZeroDivisionError (1 / dx**2 with dx**2 == 0) or a silently zeroed stencil
    field = np.ones((5, 5))
    with pytest.raises(ConfigError, match=r"dx=.* out of range"):
        stencil.laplacian(field, dx=dx, backend="numpy")
    with pytest.raises(ConfigError, match=r"dy=.* out of range"):
        stencil.diffuse(field, diffusivity=0.1, dt=1.0, dy=dx, backend="numpy")
    with pytest.raises(ConfigError, match=r"dx=.* out of range"):
        matrix.PoissonOperator((8, 8), dx=dx, backend="numpy")


def test_spacing_in_range_still_works():
    lap = stencil.laplacian(np.ones((5, 5)), dx=1e-100, dy=1e100, backend="numpy")
    assert float(abs(lap).max()) == 0.0


def test_coriolis_array_must_be_real_and_finite(rng):
    u, v, h = _sw_fields(rng)
    kwargs = dict(g=9.81, dx=1e3, dy=1e3, backend="numpy")
    with pytest.raises(ConfigError, match="f_corner holds 1 non-finite"):
        bad = FC.copy()
        bad[3] = np.nan
        stencil.shallow_water_tendency(u, v, h, f_corner=bad, **kwargs)
    with pytest.raises(ConfigError, match="f_corner must hold real numbers"):
        stencil.shallow_water_tendency(u, v, h, f_corner=FC * 1j, **kwargs)  # was cast, imaginary part lost
    out = tuple(np.empty_like(h) for _ in range(3))
    with pytest.raises(ConfigError, match="f_corner holds"):
        stencil.shallow_water_stage((u, v, h), (u, v, h), out, a=0.0, b=1.0, c=1.0, f_corner=FC * np.inf,
                                    **kwargs)
    with pytest.raises(ConfigError, match="f_corner holds"):
        stencil.prepare_shallow_water(7, "float64", f_corner=FC * np.nan, g=9.81, dx=1e3, dy=1e3,
                                      backend="numpy")
    # a list of real numbers is still fine
    du, _, _ = stencil.shallow_water_tendency(u, v, h, f_corner=list(FC), **kwargs)
    ref, _, _ = stencil.shallow_water_tendency(u, v, h, f_corner=FC, **kwargs)
    np.testing.assert_array_equal(du, ref)


def test_stage_states_must_be_triples(rng):
    u, v, h = _sw_fields(rng)
    out = tuple(np.empty_like(h) for _ in range(3))
    kwargs = dict(a=0.0, b=1.0, c=1.0, f_corner=FC, g=9.81, dx=1e3, dy=1e3, backend="numpy")
    # before: TypeError from the backend (missing 'bc_n'), or the arrays silently taking other roles
    with pytest.raises(ConfigError, match=r"state0 must be a tuple \(u, v, h\).*length 2"):
        stencil.shallow_water_stage((u, v), (u, v, h), out, **kwargs)
    with pytest.raises(ConfigError, match=r"state0 must be a tuple \(u, v, h\).*NoneType"):
        stencil.shallow_water_stage(None, (u, v, h), out, **kwargs)
    with pytest.raises(ConfigError, match=r"out must be a tuple \(u, v, h\).*length 4"):
        stencil.shallow_water_stage((u, v, h), (u, v, h), out + (out[0],), **kwargs)


@pytest.mark.parametrize("dtype", ["bogus", [1]])
def test_prepare_shallow_water_dtype_is_checked(dtype):
    # before: TypeError from np.dtype for a name NumPy does not know
    with pytest.raises(ConfigError, match="dtype must be one of float32, float64"):
        stencil.prepare_shallow_water(7, dtype, f_corner=FC, g=9.81, dx=1e3, dy=1e3, backend="numpy")


# -- matrix -------------------------------------------------------------------------------------


def test_axpy_alpha_beyond_the_dtype_is_refused(backend):
    x = backend.asarray(np.ones(4, np.float32))
    # before: alpha cast to float32 inf, a result of inf with a RuntimeWarning at most
    with pytest.raises(ConfigError, match=r"alpha=1e\+300 does not fit the vectors' dtype float32"):
        matrix.axpy(1e300, x, x, backend=backend)
    np.testing.assert_allclose(backend.to_host(matrix.axpy(2.0, x, x, backend=backend)), 3.0)


def test_poisson_operator_refuses_a_list():
    op = matrix.PoissonOperator((4, 4), backend="numpy")
    # before: AttributeError ('list' has no 'size'): np.dtype("float64") == None is True
    with pytest.raises(ConfigError, match="x must be an array of dtype float64"):
        op.matvec([[1.0] * 4] * 4)


def test_cg_on_an_empty_system_with_jacobi():
    # before: ValueError from min() of the empty diagonal; without a preconditioner it already worked
    result = matrix.conjugate_gradient(np.zeros((0, 0)), np.zeros(0))
    assert result.converged and result.x.shape == (0,)


# -- nbody --------------------------------------------------------------------------------------


@pytest.mark.parametrize("G", [1e300, 1e-300])
def test_gravitational_constant_beyond_float32_is_refused(backend, G):
    x = backend.asarray(np.array([[0.0, 1.0], [0.0, 0.0], [0.0, 0.0]], np.float32))
    m = backend.asarray(np.ones(2, np.float32))
    # before: G cast to float32 inf or 0: accelerations of inf or 0 and no error
    with pytest.raises(ConfigError, match="G=.* outside the normal range of float32"):
        nbody.accelerations(x, m, softening=0.0, G=G, backend=backend)
    with pytest.raises(ConfigError, match="G=.* outside the normal range of float32"):
        nbody.prepare_gravity("float32", softening=0.0, G=G, backend=backend)
    with pytest.raises(ConfigError, match="G=.* outside the normal range of float32"):
        nbody.prepare_direct_accelerations(x, m, softening=0.0, G=G, backend=backend)
    # float64 holds it
    acc = nbody.accelerations(backend.asarray(x.astype(np.float64)), backend.asarray(m.astype(np.float64)),
                              softening=0.0, G=G, backend=backend)
    assert np.isfinite(backend.to_host(acc)).all()


def test_softening_squared_takes_dtype_names_and_refuses_integers():
    # before: AttributeError for "float32", ValueError from np.finfo for an integer dtype
    assert nbody.softening_squared(0.5, "float32") == 0.25
    with pytest.raises(ConfigError, match="dtype must be one of float32, float64"):
        nbody.softening_squared(0.5, np.dtype(np.int64))


# -- md -----------------------------------------------------------------------------------------


def test_verlet_passes_refuse_integer_atoms(backend):
    ints = backend.asarray(np.ones((3, 4), np.int64))
    # before: numba truncated v + f dt/2 to integers, numpy returned floats: no error on either
    with pytest.raises(ConfigError, match="positions must have dtype float32 or float64; got int64"):
        md.verlet_drift(ints, ints, ints, ints, (10.0,) * 3, 0.01, backend=backend)
    with pytest.raises(ConfigError, match="velocities must have dtype float32 or float64; got int64"):
        md.verlet_kick(ints, ints, 0.01, backend=backend)


def test_verlet_passes_refuse_lists():
    x = np.array([[0.0, 1.2], [0.0, 0.0], [0.0, 0.0]])
    # before: AttributeError ('list' object has no attribute 'ndim')
    with pytest.raises(ConfigError, match=r"positions must have shape \(3, N\); got list"):
        md.verlet_drift(x.tolist(), x, x, np.zeros((3, 2), np.int64), (10.0,) * 3, 0.01, backend="numpy")
    prepared = md.prepare_lj_forces((10.0,) * 3, cutoff=2.5, backend="numpy")
    nl = md.build_neighbor_list(x, (10.0,) * 3, cutoff=2.5, skin=0.3, backend="numpy")
    with pytest.raises(ConfigError, match=r"positions must have shape \(3, N\); got list"):
        prepared(x.tolist(), nl)


def test_largest_displacement_needs_a_reference_as_long_as_the_positions(backend):
    x = backend.asarray(np.zeros((3, 64)))
    short = backend.asarray(np.zeros((3, 3)))
    # before: numba read beyond the end of the reference (an answer of garbage), numpy failed to broadcast
    with pytest.raises(ConfigError, match="reference must have at least the 64 columns of positions"):
        md.largest_displacement_squared(x, short, (10.0,) * 3, backend=backend)
    with pytest.raises(ConfigError, match=r"positions must have shape \(3, N\); got list"):
        md.largest_displacement_squared([[0.0]] * 3, x, (10.0,) * 3, backend=backend)
    longer = backend.asarray(np.full((3, 70), 0.1))
    assert md.largest_displacement_squared(x, longer, (10.0,) * 3, backend=backend) == pytest.approx(0.03)


def test_laplacian_spacing_too_small_for_float32_is_refused():
    # before: 1/dx**2 = 1e60 cast to float32 inf: a field of inf and NaN, with a RuntimeWarning at most
    field = np.ones((5, 5), np.float32)
    with pytest.raises(ConfigError, match=r"dx=1e-30 is too small for a float32 field"):
        stencil.laplacian(field, dx=1e-30, backend="numpy")
    lap = stencil.laplacian(field.astype(np.float64), dx=1e-30, backend="numpy")  # float64 holds 1e60
    assert float(abs(lap).max()) == 0.0


def test_lj_epsilon_beyond_float32_is_refused_not_reported_as_overlap():
    x = np.array([[0.0, 1.3], [0.0, 0.0], [0.0, 0.0]], np.float32)
    box = (10.0,) * 3
    nl = md.build_neighbor_list(x, box, cutoff=2.5, skin=0.3, backend="numpy")
    # before: 24 epsilon cast to float32 inf, NaN forces, and "atoms 0 and 1 overlap (r = 1.3)"
    with pytest.raises(ConfigError, match=r"epsilon=1e\+300 does not fit the positions' dtype float32"):
        md.lj_forces(x, box, nl, cutoff=2.5, epsilon=1e300, backend="numpy")
    with pytest.raises(ConfigError, match=r"epsilon=1e\+300 does not fit the positions' dtype float32"):
        md.lj_forces_all_pairs(x, box, cutoff=2.5, epsilon=1e300, backend="numpy")
    _, u, _ = md.lj_forces(x.astype(np.float64), box, md.build_neighbor_list(
        x.astype(np.float64), box, cutoff=2.5, skin=0.3, backend="numpy"), cutoff=2.5, epsilon=1e300,
        backend="numpy")
    assert np.isfinite(u)


def test_prepared_gravity_takes_fortran_ordered_and_strided_bodies(backend):
    rng = np.random.default_rng(7)
    x, m = rng.standard_normal((3, 6)), rng.random(6)
    gravity = nbody.prepare_gravity("float64", softening=0.1, backend=backend)
    want_acc, want_pot = (backend.to_host(a) for a in gravity(backend.asarray(x), backend.asarray(m), 1, 4))
    # before, on cuda: ValueError "non-contiguous buffer" from Numba's host-to-device copy
    for positions in (np.asfortranarray(x), np.repeat(x, 2, axis=1)[:, ::2]):
        acc, pot = gravity(backend.asarray(positions), backend.asarray(m), 1, 4)
        np.testing.assert_array_equal(backend.to_host(acc), want_acc)
        np.testing.assert_array_equal(backend.to_host(pot), want_pot)
