"""Subnormal floats are flushed inside the Numba kernels, and only there."""

import platform

import numpy as np
import pytest
from numba import njit, prange

from hpcgpu.kernels import fpenv, stencil

pytestmark = pytest.mark.skipif(not fpenv._X86_64, reason=f"MXCSR is x86-64 only; this is {platform.machine()}")


@njit
def _mode():
    return fpenv._read_mxcsr()


@njit(parallel=True)
def _modes_in_pool(count):
    out = np.zeros(count, np.uint32)
    for i in prange(count):
        out[i] = fpenv._read_mxcsr()
    return out


def test_flush_and_restore_round_trip():
    before = _mode()
    previous = fpenv.flush_subnormals()
    assert previous == before
    assert _mode() & fpenv.FLUSH_BITS == fpenv.FLUSH_BITS
    fpenv.restore_fp_mode(previous)
    assert _mode() == before


def test_kernels_leave_the_threads_mode_as_they_found_it(rng):
    before = _modes_in_pool(64) & np.uint32(fpenv.FLUSH_BITS)
    u, v, h = (rng.standard_normal((32, 32)) for _ in range(3))
    h = 10.0 + np.abs(h)
    stencil.shallow_water_tendency(u, v, h, f_corner=1.0, g=1.0, dx=1.0, dy=1.0, backend="numba")
    stencil.diffuse(u, diffusivity=0.1, dt=1.0, steps=3, backend="numba")
    after = _modes_in_pool(64) & np.uint32(fpenv.FLUSH_BITS)
    np.testing.assert_array_equal(after, before)


def test_subnormal_inputs_give_the_reference_answer(rng):
    """Flushing changes values below 1e-38 only: far below any tolerance."""
    shape = (24, 20)
    u = (rng.standard_normal(shape) * 1e-39).astype(np.float32)
    u[::3] = rng.standard_normal(u[::3].shape).astype(np.float32)
    v = (rng.standard_normal(shape) * 1e-40).astype(np.float32)
    h = (1.0 + rng.random(shape)).astype(np.float32)
    kwargs = dict(f_corner=1e-4, g=9.81, dx=1.0, dy=1.0, viscosity=0.1, boundary=("periodic", "wall"))
    reference = stencil.shallow_water_tendency(u, v, h, backend="numpy", **kwargs)
    result = stencil.shallow_water_tendency(u, v, h, backend="numba", **kwargs)
    for got, ref in zip(result, reference):
        assert np.abs(got.astype(float) - ref).max() <= 2e-5 * np.abs(ref).max()
