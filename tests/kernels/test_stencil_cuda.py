"""Numba-CUDA stencil kernels at the edges of their thread-block tiles.

The shared tests in ``test_stencil.py`` use grids smaller than one tile along
x under the simulator; these use grids one point larger than a tile in both
directions (so halos cross tile boundaries and the last tiles are mostly
padding) and the smallest grid accepted, for every boundary combination.
"""

import itertools

import numpy as np
import pytest
from _support import simulated, tolerance, usable_backend

from hpcgpu.kernels import stencil

BOUNDARIES = [(x, *y) for x, y in itertools.product(
    ("periodic", "wall"),
    (("periodic", "periodic"), ("wall", "wall"), ("wall", "open"), ("open", "wall"), ("open", "open")))]


@pytest.fixture(params=[pytest.param("cuda", marks=pytest.mark.cudasim if simulated() else pytest.mark.gpu,
                                     id="cuda-sim" if simulated() else "cuda")])
def cuda_backend(request):
    return usable_backend(request.param)


def _tile():
    from hpcgpu.kernels.stencil import _cuda
    return _cuda.TY, _cuda.TX


def _shapes():
    ty, tx = _tile()
    return [(ty + 1, tx + 1), (stencil.MIN_POINTS, stencil.MIN_POINTS)]


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
@pytest.mark.parametrize("size", ["tile+1", "minimum"])
def test_stage_matches_numpy_across_tiles(cuda_backend, boundary, size, rng):
    shape = _shapes()[["tile+1", "minimum"].index(size)]
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


@pytest.mark.parametrize("boundary", BOUNDARIES, ids=str)
def test_laplacian_and_diffuse_match_numpy_across_tiles(cuda_backend, boundary, rng):
    for shape in _shapes():
        for dtype in _dtypes():
            field = rng.standard_normal(shape).astype(dtype)
            lap_kwargs = dict(dx=0.5, dy=0.25, boundary=boundary)
            ref = stencil.laplacian(field, backend="numpy", **lap_kwargs)
            got = stencil.laplacian(cuda_backend.asarray(field), backend=cuda_backend, **lap_kwargs)
            _assert_close(cuda_backend, got, ref, dtype, 8)
            diff_kwargs = dict(diffusivity=0.3, dt=0.2, steps=2, dx=1.0, dy=0.8, boundary=boundary)
            ref = stencil.diffuse(field, backend="numpy", **diff_kwargs)
            got = stencil.diffuse(cuda_backend.asarray(field), backend=cuda_backend, **diff_kwargs)
            _assert_close(cuda_backend, got, ref, dtype, 8)
