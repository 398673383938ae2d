"""Stencil kernels: every backend against the numpy reference, and their properties."""

import numpy as np
import pytest
from _support import BOUNDARIES, SCALAR_BOUNDARIES, small, tolerance

from hpcgpu.errors import ConfigError
from hpcgpu.kernels import stencil
from hpcgpu.kernels.stencil import _numpy, physics


def relative_error(result, reference, backend):
    result = backend.to_host(result)
    scale = np.abs(reference).max()
    assert np.isfinite(result).all()
    return float(np.abs(result.astype(np.float64) - reference).max() / scale)


def random_state(rng, shape, dtype, boundary):
    """Random u, v, h with wall-normal velocities zeroed as the grid requires."""
    bc = stencil.normalize_boundary(boundary)
    h = (1.0 + 0.2 * rng.random(shape)).astype(dtype)
    u = rng.standard_normal(shape).astype(dtype)
    v = rng.standard_normal(shape).astype(dtype)
    if bc[0] == 1:
        u[:, 0] = 0
    if bc[1] == 1:
        v[0, :] = 0
    return u, v, h


@pytest.mark.parametrize("boundary", SCALAR_BOUNDARIES, ids=str)
def test_laplacian_matches_numpy(fast_backend, dtype, boundary, rng):
    shape = small(fast_backend, (37, 50), (9, 12))
    field = rng.standard_normal(shape).astype(dtype)
    kwargs = dict(dx=0.5, dy=0.25, boundary=boundary, boundary_value=float(rng.standard_normal()))
    ref = stencil.laplacian(field, backend="numpy", **kwargs)
    got = stencil.laplacian(fast_backend.asarray(field), backend=fast_backend, **kwargs)
    assert got.dtype == dtype
    assert relative_error(got, ref, fast_backend) <= max(tolerance(fast_backend, dtype), 1e-15) * 8


@pytest.mark.parametrize("boundary", SCALAR_BOUNDARIES, ids=str)
def test_diffuse_matches_numpy(fast_backend, dtype, boundary, rng):
    shape = small(fast_backend, (40, 33), (8, 11))
    field = rng.standard_normal(shape).astype(dtype)
    kwargs = dict(diffusivity=0.3, dt=0.2, steps=small(fast_backend, 7, 3), dx=1.0, dy=0.8,
                  boundary=boundary, boundary_value=float(rng.standard_normal()))
    ref = stencil.diffuse(field, backend="numpy", **kwargs)
    got = stencil.diffuse(fast_backend.asarray(field), backend=fast_backend, **kwargs)
    assert relative_error(got, ref, fast_backend) <= max(tolerance(fast_backend, dtype), 1e-15) * 8
    # the input is left untouched
    np.testing.assert_array_equal(fast_backend.to_host(fast_backend.asarray(field)), field)


@pytest.mark.parametrize("kind, pad_args", [("periodic", dict(mode="wrap")), ("wall", dict(mode="edge")),
                                             ("dirichlet", dict(mode="constant", constant_values=1.75))])
def test_numpy_diffusion_step_is_the_physics_update_operation_by_operation(dtype, kind, pad_args, rng):
    """The reference evaluates ``physics.diffusion_update`` (what the compiled backends
    run) term by term in its order, bitwise: the form that keeps the total."""
    field = rng.random((13, 10)).astype(dtype)
    padded = np.pad(field, 1, **pad_args)
    cx, cy = dtype.type(0.2), dtype.type(0.15)
    expected = physics.diffusion_update(field, padded[1:-1, :-2], padded[1:-1, 2:], padded[:-2, 1:-1],
                                         padded[2:, 1:-1], cx, cy)
    bc = stencil.normalize_boundary(kind, allow_dirichlet=True)
    got = _numpy.diffuse(field.copy(), np.empty_like(field), 0.2, 0.15, 1, *bc, 1.75)
    np.testing.assert_array_equal(got, expected)


def test_diffusion_conserves_the_total_over_thousands_of_float32_steps(backend, rng, monkeypatch):
    """Periodic diffusion only moves heat around: 5000 float32 steps keep the total to rounding.

    The bound, 4e-9 per step, is what unbiased rounding leaves with margin
    (numpy, numba: at most 3.6e-6 over 5000 steps on 256**2, 29 seeds).
    Scaling the field by the separately rounded coefficients ``1 - 4C`` and
    ``C`` (in float32 at C = 0.2 they sum to 1 + 1.5e-8) drifts by
    +9.5e-5 over the same run, and by +3.9e-6 over the simulator's 200 steps.
    """
    if backend.simulated:
        from hpcgpu.kernels.stencil import _cuda
        # One block of 16 threads: the simulator runs every thread in Python.
        monkeypatch.setitem(_cuda.LAUNCH, ("five_point", "float32"), _cuda.StencilCudaLaunch(rows=8, threads=16))
    shape, steps = small(backend, ((256, 256), 5000), ((8, 16), 200))
    field = (1.0 + rng.random(shape)).astype(np.float32)
    total = field.sum(dtype=np.float64)
    got = backend.to_host(stencil.diffuse(backend.asarray(field), diffusivity=0.2, dt=1.0, steps=steps,
                                          backend=backend))
    assert got.dtype == np.float32
    drift = abs(got.sum(dtype=np.float64) - total) / total
    assert drift <= 4e-9 * steps, f"relative change of the total after {steps} steps: {drift:.3g}"
    if backend.simulated:
        # The simulator runs the kernel's float32 operations one by one, as NumPy does.
        ref = stencil.diffuse(field, diffusivity=0.2, dt=1.0, steps=steps, backend="numpy")
        np.testing.assert_array_equal(got, ref)


def _eigenpair(kind, n, k):
    """Mode ``k`` of the 1D second difference on ``n`` points with a ``kind`` edge
    at both ends, and ``lam`` with ``second_difference(mode) = -lam * mode``."""
    idx = np.arange(n)
    if kind == "dirichlet":  # zero one spacing beyond each end: nodes 1..n of 0..n+1
        return np.sin(np.pi * k * (idx + 1) / (n + 1)), 4 * np.sin(np.pi * k / (2 * (n + 1))) ** 2
    if kind == "wall":  # zero gradient across the cell faces at -1/2 and n-1/2
        return np.cos(np.pi * k * (idx + 0.5) / n), 4 * np.sin(np.pi * k / (2 * n)) ** 2
    return np.cos(2 * np.pi * k * idx / n), 4 * np.sin(np.pi * k / n) ** 2


@pytest.mark.parametrize("x_kind, y_kind, kx, ky", [
    ("dirichlet", "dirichlet", 1, 1), ("dirichlet", "dirichlet", 3, 2),
    ("periodic", "dirichlet", 2, 1), ("dirichlet", "wall", 1, 2)],
    ids=["fundamental", "higher-mode", "periodic-x", "wall-y"])
def test_heat_equation_with_dirichlet_edges_decays_each_mode_by_its_eigenvalue(backend, x_kind, y_kind, kx, ky):
    """The textbook problem: zero outside the grid, so ``sin(pi i/(n+1)) sin(pi j/(m+1))``
    is an eigenmode and each step multiplies it by ``1 - cx lam_x - cy lam_y``
    (``lam = 4 sin(pi/(2(n+1)))**2`` on a Dirichlet axis)."""
    ny, nx = small(backend, (23, 30), (9, 6))
    dx, dy, diffusivity, dt = 0.7, 1.1, 0.3, 0.5
    steps = small(backend, 40, 4)
    mode_x, lam_x = _eigenpair(x_kind, nx, kx)
    mode_y, lam_y = _eigenpair(y_kind, ny, ky)
    mode = np.outer(mode_y, mode_x)
    cx, cy = diffusivity * dt / dx**2, diffusivity * dt / dy**2
    boundary = (x_kind, y_kind)
    lap = backend.to_host(stencil.laplacian(backend.asarray(mode), dx=dx, dy=dy, boundary=boundary,
                                            backend=backend))
    np.testing.assert_allclose(lap, -(lam_x / dx**2 + lam_y / dy**2) * mode, rtol=0, atol=1e-13)
    got = backend.to_host(stencil.diffuse(backend.asarray(mode), diffusivity=diffusivity, dt=dt, steps=steps,
                                          dx=dx, dy=dy, boundary=boundary, backend=backend))
    factor = 1 - cx * lam_x - cy * lam_y
    assert 0 < factor < 1
    np.testing.assert_allclose(got, factor**steps * mode, rtol=0, atol=1e-14 * steps)


@pytest.mark.parametrize("boundary", ["dirichlet", ("dirichlet", "wall"), ("periodic", "dirichlet"),
                                      ("wall", "open", "dirichlet")], ids=str)
def test_a_field_at_the_dirichlet_value_stays_there(backend, dtype, boundary, rng):
    """A steady state between a boundary value and itself: no change at all, in any dtype."""
    value = float(dtype.type(rng.uniform(-50.0, 50.0)))
    field = backend.xp.full(small(backend, (12, 10), (6, 5)), value, dtype=dtype)
    lap = backend.to_host(stencil.laplacian(field, dx=0.3, boundary=boundary, boundary_value=value,
                                            backend=backend))
    assert (lap == 0).all()
    got = backend.to_host(stencil.diffuse(field, diffusivity=1.0, dt=0.02, steps=small(backend, 25, 3),
                                          dx=0.3, boundary=boundary, boundary_value=value, backend=backend))
    assert (got == value).all()
    # and a different value pulls the edges, and only the edges, after one step
    cooled = backend.to_host(stencil.diffuse(field, diffusivity=1.0, dt=0.02, dx=0.3, boundary=boundary,
                                             boundary_value=value - 1.0, backend=backend))
    bc = stencil.normalize_boundary(boundary, allow_dirichlet=True)
    edge = np.zeros(cooled.shape, bool)
    edge[:, [0, -1]] |= bc[0] == 3
    edge[0, :] |= bc[1] == 3
    edge[-1, :] |= bc[2] == 3
    assert (cooled[edge] < value).all() and (cooled[~edge] == value).all()


@pytest.mark.parametrize("boundary", BOUNDARIES, ids=str)
@pytest.mark.parametrize("shape", [(16, 24), (17, 13)], ids=["even", "odd"])
def test_shallow_water_tendency_matches_numpy(fast_backend, dtype, boundary, shape, rng):
    if fast_backend.simulated:
        shape = (shape[0] // 2 + 1, shape[1] // 2 + 2)
    u, v, h = random_state(rng, shape, dtype, boundary)
    f_corner = rng.uniform(0.5, 2.0, shape[0] + 1).astype(dtype)
    kwargs = dict(f_corner=f_corner, g=9.81, dx=0.7, dy=1.3, viscosity=0.05, boundary=boundary)
    reference = stencil.shallow_water_tendency(u, v, h, backend="numpy", **kwargs)
    result = stencil.shallow_water_tendency(*(fast_backend.asarray(x) for x in (u, v, h)),
                                            backend=fast_backend, **kwargs)
    for name, got, ref in zip("uvh", result, reference):
        err = relative_error(got, ref, fast_backend)
        assert err <= tolerance(fast_backend, dtype) * 50 + 1e-15, f"d{name}: {err}"


@pytest.mark.parametrize("coefficients", [(0.0, 1.0, 0.3), (0.75, 0.25, 0.075)], ids=["first", "later"])
def test_shallow_water_stage_matches_numpy(fast_backend, dtype, coefficients, rng):
    shape = small(fast_backend, (24, 20), (9, 10))
    boundary = ("periodic", "wall")
    state0 = random_state(rng, shape, dtype, boundary)
    state = random_state(rng, shape, dtype, boundary)
    a, b, c = coefficients
    kwargs = dict(a=a, b=b, c=c, f_corner=1.5, g=2.0, dx=1.0, dy=1.0, viscosity=0.01,
                  boundary=boundary)
    out_ref = tuple(np.empty(shape, dtype) for _ in range(3))
    stencil.shallow_water_stage(state0, state, out_ref, backend="numpy", **kwargs)
    dev = fast_backend.asarray
    out = tuple(fast_backend.empty(shape, dtype) for _ in range(3))
    stencil.shallow_water_stage(tuple(map(dev, state0)), tuple(map(dev, state)), out,
                                backend=fast_backend, **kwargs)
    for got, ref in zip(out, out_ref):
        assert relative_error(got, ref, fast_backend) <= tolerance(fast_backend, dtype) * 50 + 1e-15


def test_rest_state_has_no_tendency(backend, dtype):
    """A flat layer at rest stays at rest on every backend and boundary."""
    shape = small(backend, (12, 10), (6, 5))
    for boundary in ("periodic", "wall"):
        zeros = backend.zeros(shape, dtype)
        h = backend.xp.full(shape, 3.0, dtype=dtype)
        du, dv, dh = stencil.shallow_water_tendency(zeros, zeros, h, f_corner=1e-4, g=9.81,
                                                    dx=10.0, dy=10.0, viscosity=1.0,
                                                    boundary=boundary, backend=backend)
        for d in (du, dv, dh):
            assert float(abs(backend.to_host(d)).max()) == 0.0


def test_tendency_conserves_mass_exactly(dtype, rng):
    """The height tendency is a flux divergence: it sums to zero."""
    u, v, h = random_state(rng, (20, 30), dtype, ("periodic", "wall"))
    _, _, dh = stencil.shallow_water_tendency(u, v, h, f_corner=1.0, g=1.0, dx=1.0, dy=1.0,
                                              boundary=("periodic", "wall"), backend="numpy")
    assert abs(float(dh.astype(np.float64).sum())) <= 1e-4 * float(abs(dh).sum()) * np.finfo(dtype).eps * 1e3


def _energy(u, v, h, g, bc):
    hx = 0.5 * (h + np.roll(h, 1, axis=1))
    hy = 0.5 * (h + np.roll(h, 1, axis=0))
    return float((0.5 * hx * u * u + 0.5 * hy * v * v + 0.5 * g * h * h).sum())


def _enstrophy(u, v, h, f):
    zeta = (v - np.roll(v, 1, axis=1)) - (u - np.roll(u, 1, axis=0))
    hq = 0.25 * (h + np.roll(h, 1, 1) + np.roll(h, 1, 0) + np.roll(np.roll(h, 1, 0), 1, 1))
    q = (f + zeta) / hq
    return float((0.5 * hq * q * q).sum())


@pytest.mark.parametrize("dx,dy", [(1.0, 1.0), (0.6, 1.4)], ids=["square", "rectangular"])
def test_semi_discrete_energy_and_enstrophy_conservation(dx, dy, rng):
    """The rate of change of energy and potential enstrophy is zero (Arakawa-Lamb).

    Checked through the directional derivative along the tendency, which is
    exact for the semi-discrete scheme (no time-stepping error).
    """
    shape = (18, 22)
    u, v, h = random_state(rng, shape, np.float64, "periodic")
    f = 3.0
    du, dv, dh = stencil.shallow_water_tendency(u, v, h, f_corner=f, g=2.0, dx=dx, dy=dy,
                                                boundary="periodic", backend="numpy")
    eps = 1e-6

    def rate(quantity):
        plus = quantity(u + eps * du, v + eps * dv, h + eps * dh)
        minus = quantity(u - eps * du, v - eps * dv, h - eps * dh)
        return (plus - minus) / (2 * eps)

    def enstrophy(uu, vv, hh):
        zeta = (vv - np.roll(vv, 1, axis=1)) / dx - (uu - np.roll(uu, 1, axis=0)) / dy
        hq = 0.25 * (hh + np.roll(hh, 1, 1) + np.roll(hh, 1, 0) + np.roll(np.roll(hh, 1, 0), 1, 1))
        q = (f + zeta) / hq
        return float((0.5 * hq * q * q).sum())

    def energy(uu, vv, hh):
        return _energy(uu, vv, hh, 2.0, None)

    # scale: the rate each quantity would have from one term alone
    energy_scale = float(np.abs(u * du).sum() + np.abs(h * dh).sum() * 2.0)
    enstrophy_scale = abs(enstrophy(u, v, h))
    assert abs(rate(energy)) <= 1e-8 * energy_scale
    assert abs(rate(enstrophy)) <= 1e-8 * enstrophy_scale


def test_bad_input_names_the_parameter():
    good = np.ones((8, 8))
    with pytest.raises(ConfigError, match="dx"):
        stencil.laplacian(good, dx=0.0, backend="numpy")
    with pytest.raises(ConfigError, match="at least 4x4"):
        stencil.laplacian(np.ones((2, 8)), backend="numpy")
    with pytest.raises(ConfigError, match="2D"):
        stencil.laplacian(np.ones(8), backend="numpy")
    with pytest.raises(ConfigError, match="float32 or float64"):
        stencil.laplacian(np.ones((8, 8), dtype=np.int64), backend="numpy")
    with pytest.raises(ConfigError, match="boundary"):
        stencil.laplacian(good, boundary="sticky", backend="numpy")
    with pytest.raises(ConfigError, match="periodic on one edge"):
        stencil.laplacian(good, boundary=("wall", "periodic", "wall"), backend="numpy")
    with pytest.raises(ConfigError, match="periodic on one edge"):
        stencil.diffuse(good, diffusivity=0.1, dt=0.1, boundary=("wall", "dirichlet", "periodic"),
                        backend="numpy")
    with pytest.raises(ConfigError, match=r"boundary \(x\) must be one of"):
        stencil.laplacian(good, boundary=("sticky", "dirichlet"), backend="numpy")
    for bad in (float("nan"), float("inf"), "0", None):
        with pytest.raises(ConfigError, match="boundary_value"):
            stencil.diffuse(good, diffusivity=0.1, dt=0.1, boundary="dirichlet", boundary_value=bad,
                            backend="numpy")
    with pytest.raises(ConfigError, match="boundary_value=1e.40 does not fit the field's dtype float32"):
        stencil.laplacian(good.astype(np.float32), boundary="dirichlet", boundary_value=1e40, backend="numpy")
    # float64 holds it: the corner sees it beyond two edges
    assert stencil.laplacian(good, boundary="dirichlet", boundary_value=1e40, backend="numpy")[0, 0] == 2e40
    # Dirichlet edges are for the scalar kernels: the shallow-water kernels refuse them.
    with pytest.raises(ConfigError, match=r"boundary \(north\) 'dirichlet' is only for the scalar kernels"):
        stencil.shallow_water_tendency(good, good, good, f_corner=0.0, g=1.0, dx=1.0, dy=1.0,
                                       boundary=("periodic", "wall", "dirichlet"), backend="numpy")
    with pytest.raises(ConfigError, match=r"boundary \(x\) 'dirichlet' is only for the scalar kernels"):
        stencil.shallow_water_stage((good, good, good), (good, good, good),
                                    tuple(np.empty((8, 8)) for _ in range(3)), a=0, b=1, c=1, f_corner=0.0,
                                    g=1.0, dx=1.0, dy=1.0, boundary="dirichlet", backend="numpy")
    with pytest.raises(ConfigError, match="'dirichlet' is only for the scalar kernels"):
        stencil.normalize_boundary("dirichlet")
    with pytest.raises(ConfigError, match="stability limit"):
        stencil.diffuse(good, diffusivity=1.0, dt=1.0, backend="numpy")
    with pytest.raises(ConfigError, match="steps"):
        stencil.diffuse(good, diffusivity=0.1, dt=0.1, steps=0, backend="numpy")
    with pytest.raises(ConfigError, match="h has dtype float32"):
        stencil.shallow_water_tendency(good, good, good.astype(np.float32), f_corner=0.0, g=1.0,
                                       dx=1.0, dy=1.0, backend="numpy")
    with pytest.raises(ConfigError, match="f_corner"):
        stencil.shallow_water_tendency(good, good, good, f_corner=np.zeros(3), g=1.0,
                                       dx=1.0, dy=1.0, backend="numpy")
    with pytest.raises(ConfigError, match="shares memory"):
        stencil.shallow_water_stage((good, good, good), (good, good, good), (good, np.ones((8, 8)), np.ones((8, 8))),
                                    a=0, b=1, c=1, f_corner=0.0, g=1.0, dx=1.0, dy=1.0, backend="numpy")


def arakawa_reference(psi, zeta, dx, dy, wall_y):
    """Arakawa's (1966) J written point by point from eq. 46 (float64; zero beyond a wall)."""
    ny, nx = psi.shape

    def at(f, j, i):
        if wall_y and not 0 <= j < ny:
            return 0.0
        return float(f[j % ny, i % nx])

    out = np.empty((ny, nx))
    for j in range(ny):
        for i in range(nx):
            p = lambda dj, di: at(psi, j + dj, i + di)  # noqa: E731
            z = lambda dj, di: at(zeta, j + dj, i + di)  # noqa: E731
            j_pp = (p(0, 1) - p(0, -1)) * (z(1, 0) - z(-1, 0)) - (p(1, 0) - p(-1, 0)) * (z(0, 1) - z(0, -1))
            j_px = (p(0, 1) * (z(1, 1) - z(-1, 1)) - p(0, -1) * (z(1, -1) - z(-1, -1))
                    - p(1, 0) * (z(1, 1) - z(1, -1)) + p(-1, 0) * (z(-1, 1) - z(-1, -1)))
            j_xp = (z(1, 0) * (p(1, 1) - p(1, -1)) - z(-1, 0) * (p(-1, 1) - p(-1, -1))
                    - z(0, 1) * (p(1, 1) - p(-1, 1)) + z(0, -1) * (p(1, -1) - p(-1, -1)))
            out[j, i] = (j_pp + j_px + j_xp) / (12.0 * dx * dy)
    return out


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("boundary", ["periodic", ("periodic", "dirichlet")])
def test_arakawa_jacobian_matches_the_pointwise_formula(backend, dtype, boundary, rng):
    psi, zeta = (rng.standard_normal((12, 10)).astype(dtype) for _ in range(2))
    expected = arakawa_reference(psi, zeta, 2.0, 3.0, wall_y=boundary != "periodic")
    result = stencil.arakawa_jacobian(backend.asarray(psi), backend.asarray(zeta), dx=2.0, dy=3.0,
                                      boundary=boundary, backend=backend)
    # the pointwise formula sums in another order (and in float64): rounding apart
    assert relative_error(result, expected, backend) <= {"float32": 1e-5, "float64": 1e-13}[dtype]


def test_arakawa_jacobian_is_the_same_on_every_backend_bitwise(backend, rng):
    psi, zeta = rng.standard_normal((8, 8)), rng.standard_normal((8, 8))
    reference = stencil.arakawa_jacobian(psi, zeta, dx=1.0, dy=1.0, scale=-1.0, backend="numpy")
    result = stencil.arakawa_jacobian(backend.asarray(psi), backend.asarray(zeta), dx=1.0, dy=1.0, scale=-1.0,
                                      backend=backend)
    np.testing.assert_array_equal(backend.to_host(result), reference)


def test_arakawa_jacobian_conserves_the_sums_of_zeta_and_its_square(rng):
    # sum J = 0 and sum zeta J = 0 on a periodic grid (Arakawa 1966): no spurious source of enstrophy
    psi, zeta = rng.standard_normal((16, 16)), rng.standard_normal((16, 16))
    jac = stencil.arakawa_jacobian(psi, zeta, dx=1.0, dy=1.0, backend="numpy")
    scale = np.abs(jac).sum()
    assert abs(jac.sum()) < 1e-12 * scale
    assert abs((zeta * jac).sum()) < 1e-12 * scale * np.abs(zeta).max()
    assert abs((psi * jac).sum()) < 1e-12 * scale * np.abs(psi).max()


def test_arakawa_jacobian_refuses_a_wall_or_an_open_edge():
    with pytest.raises(ConfigError, match=r"boundary \(south\) of the Arakawa Jacobian"):
        stencil.arakawa_jacobian(np.zeros((8, 8)), np.zeros((8, 8)), dx=1.0, dy=1.0, boundary=("periodic", "wall"),
                                 backend="numpy")
