"""The Numba backend's fused sweeps (an SSP-RK3 step; many diffusion steps) are bitwise the calls they replace."""

import itertools

import numpy as np
import pytest

from hpcgpu.kernels.stencil import SSP_RK3_STAGES
from hpcgpu.kernels.stencil import _numba as kernels
from hpcgpu.kernels.stencil.boundary import DIRICHLET, OPEN, PERIODIC, WALL

BOUNDARIES = [(PERIODIC, PERIODIC, PERIODIC), (WALL, WALL, WALL), (PERIODIC, WALL, WALL), (WALL, PERIODIC, PERIODIC),
              (WALL, OPEN, OPEN), (PERIODIC, OPEN, WALL), (PERIODIC, WALL, OPEN), (PERIODIC, OPEN, OPEN)]
# Diffusion also takes Dirichlet edges (the shallow-water kernels do not).
DIFFUSION_BOUNDARIES = BOUNDARIES + [(DIRICHLET, DIRICHLET, DIRICHLET), (DIRICHLET, PERIODIC, PERIODIC),
                                     (PERIODIC, DIRICHLET, WALL), (WALL, OPEN, DIRICHLET)]


def _stage_by_stage(y0, f_corner, physics, dt, boundary):
    first, second, out = ([np.full_like(a, np.nan) for a in y0] for _ in range(3))
    for (a, b, c), src, dst in zip(SSP_RK3_STAGES, (y0, first, second), (first, second, out)):
        kernels.shallow_water_stage(*y0, *src, *dst, f_corner, *physics, a, b, c * dt, *boundary)
    return out


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("boundary", BOUNDARIES, ids=str)
def test_fused_step_equals_three_stages_bitwise(dtype, boundary, rng):
    for (ny, nx), viscosity in itertools.product([(37, 21), (8, 6), (120, 16)], [0.0, 3.0]):
        u, v = (rng.standard_normal((ny, nx)).astype(dtype) for _ in range(2))
        h = (100 + rng.standard_normal((ny, nx))).astype(dtype)
        f_corner = (1e-4 + 1e-5 * rng.standard_normal(ny + 1)).astype(dtype)
        physics = (9.81, 1 / 1000.0, 1 / 1100.0, viscosity)
        expected = _stage_by_stage((u, v, h), f_corner, physics, 5.0, boundary)
        out = [np.full_like(a, np.nan) for a in (u, v, h)]
        kernels.shallow_water_rk3_step(u, v, h, *out, f_corner, *physics, 5.0, SSP_RK3_STAGES, *boundary)
        # rows within 6 south / 3 north of an open edge are not valid in either
        lo, hi = (6 if boundary[1] == OPEN else 0), ny - (3 if boundary[2] == OPEN else 0)
        for name, got, want in zip("uvh", out, expected):
            np.testing.assert_array_equal(got[lo:hi], want[lo:hi], err_msg=f"{name} {ny}x{nx} nu={viscosity}")


def test_fused_step_leaves_its_input_alone(rng):
    y0 = [rng.standard_normal((40, 24)) for _ in range(3)]
    y0[2] += 50
    before = [a.copy() for a in y0]
    out = [np.empty_like(a) for a in y0]
    kernels.shallow_water_rk3_step(*y0, *out, np.full(41, 1e-4), 9.81, 1e-3, 1e-3, 0.0, 1.0, SSP_RK3_STAGES,
                                   PERIODIC, PERIODIC, PERIODIC)
    for a, b in zip(y0, before):
        np.testing.assert_array_equal(a, b)
    assert all(np.isfinite(a).all() for a in out)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("boundary", DIFFUSION_BOUNDARIES, ids=str)
def test_diffusion_sweeps_of_many_steps_equal_single_steps_bitwise(dtype, boundary, rng):
    for (ny, nx), steps in itertools.product([(37, 21), (4, 5), (130, 16)], [2, 13, 40]):
        field = rng.random((ny, nx)).astype(dtype)
        value = rng.uniform(-1.0, 2.0)
        expected = field.copy()
        for _ in range(steps):
            out = np.empty_like(expected)
            kernels._diffuse_kernel(expected, out, dtype(0.11), dtype(0.13), *boundary, dtype(value))
            expected = out
        got = kernels.diffuse(field.copy(), np.empty_like(field), 0.11, 0.13, steps, *boundary, value)
        np.testing.assert_array_equal(got, expected, err_msg=f"{ny}x{nx}, {steps} steps")


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_every_ring_budget_gives_the_step_by_step_result_bitwise(rng, dtype, monkeypatch, tmp_path):
    from hpcgpu import autotune
    from hpcgpu.kernels.stencil.diffusion_numba import RING_BUDGETS

    monkeypatch.setenv("HPCGPU_CACHE_DIR", str(tmp_path))
    field = rng.random((40, 4096)).astype(dtype)
    expected = field.copy()
    for _ in range(11):
        out = np.empty_like(expected)
        kernels._diffuse_kernel(expected, out, dtype(0.11), dtype(0.13), PERIODIC, PERIODIC, PERIODIC, dtype(0.0))
        expected = out
    name = f"stencil.diffusion.ring_bytes.float{8 * np.dtype(dtype).itemsize}"
    for budget in RING_BUDGETS:
        with autotune.use(name, budget):
            got = kernels.diffuse(field.copy(), np.empty_like(field), 0.11, 0.13, 11, PERIODIC, PERIODIC, PERIODIC, 0.0)
        np.testing.assert_array_equal(got, expected, err_msg=budget)
    autotune.forget()
    assert autotune.choose(name, {b: (lambda: None) for b in RING_BUDGETS}, default="1MiB") in RING_BUDGETS


def test_a_sweep_takes_as_many_steps_as_its_rings_fit_in_cache():
    from hpcgpu.kernels.stencil.diffusion_numba import steps_per_sweep

    assert steps_per_sweep(4096, 4) == 16
    assert steps_per_sweep(8192, 4) == 8
    assert steps_per_sweep(1 << 20, 8) == 2
    assert steps_per_sweep(16, 4) == 16


@pytest.mark.parametrize("module", ["hpcgpu.kernels.stencil.fused_rk3_numba", "hpcgpu.kernels.stencil.diffusion_numba",
                                    "hpcgpu.kernels.md.atoms_numba"])
def test_each_fused_kernel_module_imports_first_on_its_own(module):
    import subprocess
    import sys

    result = subprocess.run([sys.executable, "-P", "-c", f"import {module}"], capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr
