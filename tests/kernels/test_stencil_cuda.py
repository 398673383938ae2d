"""Numba-CUDA stencil kernels at the edges of their blocks and strips.

Each thread walks a strip of ``rows`` rows of one column, in blocks of
``threads`` threads along x. The shared tests in ``test_stencil.py`` use
grids narrower than one block under the simulator; these use grids one point
larger than a block and a strip (so halos cross block and strip boundaries
and the last ones are mostly padding), grids shorter than one strip, and the
smallest grid accepted, for every boundary combination.
"""

import itertools

import numpy as np
import pytest
from _support import simulated, tolerance, usable_backend

from hpcgpu.kernels import stencil

BOUNDARIES = [(x, *y) for x, y in itertools.product(
    ("periodic", "wall"),
    (("periodic", "periodic"), ("wall", "wall"), ("wall", "open"), ("open", "wall"), ("open", "open")))]
# The five-point kernels also take Dirichlet edges: on x, on y, on one edge.
FIVE_POINT_BOUNDARIES = BOUNDARIES + [
    ("dirichlet", "dirichlet", "dirichlet"), ("dirichlet", "periodic", "periodic"),
    ("periodic", "dirichlet", "wall"), ("wall", "open", "dirichlet"), ("dirichlet", "wall", "wall")]


@pytest.fixture(params=[pytest.param("cuda", marks=pytest.mark.cudasim if simulated() else pytest.mark.gpu,
                                     id="cuda-sim" if simulated() else "cuda")])
def cuda_backend(request):
    return usable_backend(request.param)


def _launch(family):
    from hpcgpu.kernels.stencil import _cuda
    return _cuda.LAUNCH[(family, "float64")]


SIZES = ["block+1", "short", "minimum"]


def _shape(family, size):
    launch = _launch(family)
    return {"block+1": (launch.rows + 1, launch.threads + 1),
            "short": (launch.rows - 3, 9),
            "minimum": (stencil.MIN_POINTS, stencil.MIN_POINTS)}[size]


def _dtypes():
    """float64 only under the simulator, which is slow and does not type kernels."""
    return [np.dtype(np.float64)] if simulated() else [np.dtype(np.float32), np.dtype(np.float64)]


def _random_state(rng, shape, dtype, bc):
    h = (1.0 + 0.2 * rng.random(shape)).astype(dtype)
    u = rng.standard_normal(shape).astype(dtype)
    v = rng.standard_normal(shape).astype(dtype)
    if bc[0] == 1:
        u[:, 0] = 0
    if bc[1] == 1:
        v[0, :] = 0
    return u, v, h


def _assert_close(backend, got, ref, dtype, factor):
    got = backend.to_host(got).astype(np.float64)
    assert np.isfinite(got).all()
    err = float(np.abs(got - ref).max() / np.abs(ref).max())
    assert err <= tolerance(backend, dtype) * factor + 1e-15, err


@pytest.mark.parametrize("boundary", BOUNDARIES, ids=str)
@pytest.mark.parametrize("size", SIZES)
def test_stage_matches_numpy_across_blocks_and_strips(cuda_backend, boundary, size, rng):
    shape = _shape("stage", size)
    bc = stencil.normalize_boundary(boundary)
    for dtype in _dtypes():
        state0 = _random_state(rng, shape, dtype, bc)
        state = _random_state(rng, shape, dtype, bc)
        f_corner = rng.uniform(0.5, 2.0, shape[0] + 1).astype(dtype)
        kwargs = dict(a=0.75, b=0.25, c=0.3, f_corner=f_corner, g=2.0, dx=0.7, dy=1.3,
                      viscosity=0.05, boundary=boundary)
        ref = tuple(np.empty(shape, dtype) for _ in range(3))
        stencil.shallow_water_stage(state0, state, ref, backend="numpy", **kwargs)
        dev = cuda_backend.asarray
        out = tuple(cuda_backend.empty(shape, dtype) for _ in range(3))
        stencil.shallow_water_stage(tuple(map(dev, state0)), tuple(map(dev, state)), out,
                                    backend=cuda_backend, **kwargs)
        for got, want in zip(out, ref):
            _assert_close(cuda_backend, got, want, dtype, 50)


@pytest.mark.parametrize("boundary", FIVE_POINT_BOUNDARIES, ids=str)
def test_laplacian_and_diffuse_match_numpy_across_blocks_and_strips(cuda_backend, boundary, rng):
    for shape in (_shape("five_point", size) for size in SIZES):
        for dtype in _dtypes():
            field = rng.standard_normal(shape).astype(dtype)
            value = float(rng.standard_normal())
            lap_kwargs = dict(dx=0.5, dy=0.25, boundary=boundary, boundary_value=value)
            ref = stencil.laplacian(field, backend="numpy", **lap_kwargs)
            got = stencil.laplacian(cuda_backend.asarray(field), backend=cuda_backend, **lap_kwargs)
            _assert_close(cuda_backend, got, ref, dtype, 8)
            diff_kwargs = dict(diffusivity=0.3, dt=0.2, steps=2, dx=1.0, dy=0.8, boundary=boundary,
                               boundary_value=value)
            ref = stencil.diffuse(field, backend="numpy", **diff_kwargs)
            got = stencil.diffuse(cuda_backend.asarray(field), backend=cuda_backend, **diff_kwargs)
            _assert_close(cuda_backend, got, ref, dtype, 8)


def _launch_cases(family):
    from hpcgpu.kernels.stencil import _cuda
    return [pytest.param(launch, id=f"rows{launch.rows}-threads{launch.threads}")
            for launch in dict.fromkeys((_cuda.LAUNCH[(family, "float64")],
                                         *_cuda.VARIANTS[(family, "float64")]))]


@pytest.mark.parametrize("boundary", ["periodic", ("wall", "open", "wall"), ("dirichlet", "wall", "dirichlet")],
                         ids=str)
@pytest.mark.parametrize("launch", _launch_cases("five_point"))
def test_every_five_point_launch_matches_numpy(cuda_backend, launch, boundary, rng):
    from hpcgpu.kernels.stencil import _cuda
    bc = stencil.normalize_boundary(boundary, allow_dirichlet=True)
    for dtype in _dtypes():
        # A strip and a half of rows; one column over a block.
        shape = (launch.rows + launch.rows // 2 + 1, launch.threads + 1)
        field = rng.standard_normal(shape).astype(dtype)
        value = float(rng.standard_normal())
        ref_lap = stencil.laplacian(field, dx=0.5, dy=0.25, boundary=boundary, boundary_value=value,
                                    backend="numpy")
        ref_diff = stencil.diffuse(field, diffusivity=0.3, dt=0.2, dx=1.0, dy=0.8,
                                   boundary=boundary, boundary_value=value, backend="numpy")
        for diffuse, c_x, c_y, ref in ((False, 4.0, 16.0, ref_lap),
                                       (True, 0.3 * 0.2, 0.3 * 0.2 / 0.64, ref_diff)):
            src = cuda_backend.asarray(field)
            out = cuda_backend.empty(shape, dtype)
            _cuda._five_point(src, out, c_x, c_y, *bc, diffuse=diffuse, launch=launch, value=value)
            _assert_close(cuda_backend, out, ref, dtype, 8)


@pytest.mark.parametrize("launch", _launch_cases("stage"))
def test_every_stage_launch_matches_numpy(cuda_backend, launch, rng):
    from hpcgpu.kernels.stencil import _cuda
    boundary = ("periodic", "wall", "open")
    bc = stencil.normalize_boundary(boundary)
    for dtype in _dtypes():
        shape = (launch.rows + 5, 11)
        state0 = _random_state(rng, shape, dtype, bc)
        state = _random_state(rng, shape, dtype, bc)
        f_corner = rng.uniform(0.5, 2.0, shape[0] + 1).astype(dtype)
        ref = tuple(np.empty(shape, dtype) for _ in range(3))
        stencil.shallow_water_stage(state0, state, ref, a=0.75, b=0.25, c=0.3, f_corner=f_corner,
                                    g=2.0, dx=0.7, dy=1.3, viscosity=0.05, boundary=boundary,
                                    backend="numpy")
        dev = cuda_backend.asarray
        out = tuple(cuda_backend.empty(shape, dtype) for _ in range(3))
        _cuda._stage(*map(dev, state0), *map(dev, state), *out, dev(f_corner), 2.0, 1 / 0.7, 1 / 1.3,
                     0.05, 0.75, 0.25, 0.3, *bc, launch=launch)
        for got, want in zip(out, ref):
            _assert_close(cuda_backend, got, want, dtype, 50)


def test_strided_arrays_are_read_and_written_correctly(cuda_backend, rng):
    """The kernels index flat C-contiguous views; other views go through copies, both ways."""
    from hpcgpu.kernels.stencil import _cuda
    bc = stencil.normalize_boundary(("periodic", "wall"))
    for dtype in _dtypes():
        big = rng.standard_normal((3, 20, 30)).astype(dtype)
        u, v = big[0, ::2, ::2], big[1, ::2, :15]
        h = np.asfortranarray(1.5 + 0.2 * big[2, :10, :15])
        f_corner = np.linspace(-1.0, 1.0, 11).astype(dtype)
        params = (f_corner, 2.0, 1.0, 1.0, 0.01, 0.5, 0.5, 0.1, *bc)
        out_ref = tuple(np.empty((10, 15), dtype) for _ in range(3))
        from hpcgpu.kernels.stencil import _numpy
        _numpy.shallow_water_stage(u, v, h, u, v, h, *out_ref, *params)
        holder = cuda_backend.asarray(np.full((3, 10, 30), np.nan, dtype))
        out = tuple(holder[k, :, ::2] for k in range(3))
        dev = cuda_backend.asarray
        _cuda.shallow_water_stage(dev(u), dev(v), dev(h), dev(u), dev(v), dev(h), *out,
                                  dev(f_corner), *params[1:])
        for got, ref in zip(out, out_ref):
            _assert_close(cuda_backend, got, ref, dtype, 50)
        assert np.isnan(cuda_backend.to_host(holder)[:, :, 1::2]).all()

        field = np.asfortranarray(big[0, :10, :15])
        ref = _numpy.laplacian(field, np.empty((10, 15), dtype), 1.0, 1.0, *bc)
        lap = holder[0, :, 1::2]
        assert _cuda.laplacian(dev(field), lap, 1.0, 1.0, *bc) is lap
        _assert_close(cuda_backend, lap, ref, dtype, 8)
        for steps in (1, 2):
            ref = _numpy.diffuse(field.copy(), np.empty((10, 15), dtype), 0.2, 0.2, steps, *bc)
            src, work = dev(np.asfortranarray(field)), holder[2, :, 1::2]
            got = _cuda.diffuse(src, work, 0.2, 0.2, steps, *bc)
            assert got is src or got is work
            _assert_close(cuda_backend, got, ref, dtype, 8)


@pytest.mark.parametrize("boundary, steps_per_pass", [
    (("periodic", "periodic", "periodic"), 2), (("wall", "wall", "wall"), 4),
    (("periodic", "wall", "open"), 4), (("wall", "periodic", "periodic"), 2),
    (("dirichlet", "dirichlet", "dirichlet"), 4), (("periodic", "dirichlet", "wall"), 2),
    (("dirichlet", "periodic", "periodic"), 2)],
    ids=["periodic", "walls", "periodic-x", "periodic-y", "dirichlet", "dirichlet-south", "dirichlet-x"])
def test_multi_step_diffusion_pass_equals_one_step_launches(cuda_backend, boundary, steps_per_pass, rng):
    """T steps per pass over memory (temporal blocking), bitwise the T one-step launches (simulator).

    Blocks of 2 T + 32 threads give 32 output columns; the grid is wider than
    one block and taller than one strip, so halos cross block and strip
    edges, and 5 steps run passes and a remainder of one-step launches.
    """
    from hpcgpu.kernels.stencil import _cuda, diffusion_cuda, _numpy

    bc = stencil.normalize_boundary(boundary, allow_dirichlet=True)
    field = rng.random((2 * steps_per_pass + 1, 37))
    value = float(rng.uniform(-2.0, 2.0))
    launch = diffusion_cuda.PassLaunch(steps_per_pass, steps_per_pass, 2 * steps_per_pass + 32)
    assert diffusion_cuda.fits(field.shape, launch)

    def run(multi_step):
        return cuda_backend.to_host(_cuda.diffuse(cuda_backend.asarray(field.copy()),
                                                  cuda_backend.empty(field.shape, field.dtype), 0.2, 0.15, 5, *bc,
                                                  value, multi_step=multi_step)).copy()

    one = run(None)
    if simulated():
        np.testing.assert_array_equal(run(launch), one)
    else:  # the GPU compiler may contract a * b + c differently in the two kernels
        np.testing.assert_allclose(run(launch), one, rtol=1e-14, atol=1e-15)
    ref = _numpy.diffuse(field.copy(), np.empty_like(field), 0.2, 0.15, 5, *bc, value)
    np.testing.assert_allclose(one, ref, rtol=1e-12, atol=1e-14)
    assert not diffusion_cuda.fits((13, 41), diffusion_cuda.PassLaunch(8, 8, 64))  # fewer than 2 T rows
