"""The column window of the shallow-water kernels: a stage or a step on columns ``lo:hi`` of wider arrays.

A partition's block carries a frame of its neighbours' columns, and the
weather stepper steps a column window that shrinks towards an open side
stage by stage. Every backend must step the window as if it were the whole
grid (the x rule at its edges), leave the other columns alone, and give
the cells beyond the stencil's reach of an open window edge bitwise what
stepping the whole block gives. Tiny grids: the CUDA simulator runs them
thread by thread.
"""

import numpy as np
import pytest
from _support import tolerance

from hpcgpu.backends import get_backend
from hpcgpu.errors import ConfigError
from hpcgpu.kernels import stencil
from hpcgpu.workloads.weather import STAGE_REACH

NY, NX = 11, 22
SENTINEL = 7.0


def _state(rng, shape=(NY, NX), dtype=np.float64):
    h = (1.0 + 0.2 * rng.random(shape)).astype(dtype)
    u, v = (rng.standard_normal(shape).astype(dtype) for _ in range(2))
    return u, v, h


def _prepared(backend, nx, f_corner, boundary):
    return stencil.prepare_shallow_water(nx, f_corner.dtype, f_corner=backend.asarray(f_corner), g=2.0, dx=0.7,
                                         dy=1.3, viscosity=0.05, boundary=boundary, backend=backend)


def _device(backend, arrays):
    return tuple(backend.asarray(a) for a in arrays)


def _filled(backend, shape, dtype=np.float64):
    return tuple(backend.asarray(np.full(shape, SENTINEL, dtype)) for _ in range(3))


def _host(backend, arrays):
    return [backend.to_host(a) for a in arrays]


def _step(prepared, y0, work, out, dt, rows, cols, shrink):
    """One SSP-RK3 step as the weather stepper takes it: the fused step where the backend has one, else
    three stages whose column window shrinks by ``shrink = (west, east)`` a stage."""
    if prepared.fused:
        prepared.rk3_step(y0, out, dt, stencil.SSP_RK3_STAGES, rows=rows, cols=cols)
        return
    west, east = cols
    for (a, b, c), src, dst in zip(stencil.SSP_RK3_STAGES, (y0, work[0], work[1]), (work[0], work[1], out)):
        prepared.stage(y0, src, dst, a=a, b=b, c=c * dt, rows=rows, cols=(west, east))
        west, east = west + shrink[0], east - shrink[1]


@pytest.mark.parametrize("boundary", [("open", "open", "open"), ("periodic", "wall", "open"),
                                      ("wall", "periodic", "periodic")], ids=str)
@pytest.mark.parametrize("cols", [(3, 17), (0, 9), (6, NX)], ids=str)
def test_a_window_is_stepped_as_if_it_were_the_whole_grid_and_nothing_else_is_touched(backend, boundary, cols, rng):
    lo, hi = cols
    state0, state = _state(rng), _state(rng)
    f_corner = rng.uniform(0.5, 2.0, NY + 1)
    out = _filled(backend, (NY, NX))
    _prepared(backend, NX, f_corner, boundary).stage(_device(backend, state0), _device(backend, state), out,
                                                     a=0.75, b=0.25, c=0.3, rows=(0, NY), cols=cols)
    # the same backend on copies of the window's columns alone
    alone = _filled(backend, (NY, hi - lo))
    cut = [np.ascontiguousarray(a[:, lo:hi]) for a in (*state0, *state)]
    _prepared(backend, hi - lo, f_corner, boundary).stage(_device(backend, cut[:3]), _device(backend, cut[3:]),
                                                          alone, a=0.75, b=0.25, c=0.3, rows=(0, NY))
    reference = tuple(np.empty((NY, hi - lo)) for _ in range(3))
    stencil.shallow_water_stage(tuple(cut[:3]), tuple(cut[3:]), reference, a=0.75, b=0.25, c=0.3,
                                f_corner=f_corner, g=2.0, dx=0.7, dy=1.3, viscosity=0.05, boundary=boundary,
                                backend="numpy")
    for name, got, want, ref in zip("uvh", _host(backend, out), _host(backend, alone), reference):
        np.testing.assert_array_equal(got[:, lo:hi], want, err_msg=name)
        assert (got[:, :lo] == SENTINEL).all() and (got[:, hi:] == SENTINEL).all(), name
        err = float(np.abs(got[:, lo:hi] - ref).max() / np.abs(ref).max())
        assert err <= tolerance(backend, np.float64) * 50 + 1e-15, (name, err)


# (x rule of the whole block, x rule of the window, window, columns valid after one step)
STEPS = [("periodic", "open", (4, 19), (4 + 3 * STAGE_REACH[0], 19 - 3 * STAGE_REACH[1])),
         ("wall", "wall", (0, 15), (0, 15 - 3 * STAGE_REACH[1])),  # a wall west, a neighbour east
         ("wall", "wall", (5, NX), (5 + 3 * STAGE_REACH[0], NX))]  # a neighbour west, a wall east


@pytest.mark.parametrize("whole_x, window_x, cols, valid", STEPS, ids=[f"{s[0]}-{s[1]}-{s[2]}" for s in STEPS])
def test_cells_beyond_the_reach_of_an_open_window_edge_equal_the_whole_block_bitwise(backend, whole_x, window_x,
                                                                                     cols, valid, rng):
    y0 = _state(rng)
    f_corner = rng.uniform(0.5, 2.0, NY + 1)
    shrink = tuple(reach if edge else 0 for reach, edge in zip(STAGE_REACH, (cols[0] > 0, cols[1] < NX)))
    whole, windowed = _filled(backend, (NY, NX)), _filled(backend, (NY, NX))
    prepared = _prepared(backend, NX, f_corner, (whole_x, "wall", "wall"))
    _step(prepared, _device(backend, y0), [_filled(backend, (NY, NX)) for _ in range(2)], whole, 0.05,
          (0, NY), (0, NX), (0, 0))
    prepared = _prepared(backend, NX, f_corner, (window_x, "wall", "wall"))
    _step(prepared, _device(backend, y0), [_filled(backend, (NY, NX)) for _ in range(2)], windowed, 0.05,
          (0, NY), cols, shrink)
    lo, hi = valid
    for name, got, want in zip("uvh", _host(backend, windowed), _host(backend, whole)):
        np.testing.assert_array_equal(got[:, lo:hi], want[:, lo:hi], err_msg=name)
        assert (got[:, :cols[0]] == SENTINEL).all() and (got[:, cols[1]:] == SENTINEL).all(), name


def test_a_window_outside_the_fields_is_a_config_error():
    f_corner = np.full(NY + 1, 1e-4)
    prepared = _prepared(get_backend("numpy"), NX, f_corner, "periodic")
    state = tuple(np.ones((NY, NX)) for _ in range(3))
    out = tuple(np.empty((NY, NX)) for _ in range(3))
    for bad in ((0, NX + 1), (5, 5), (-1, 4)):
        with pytest.raises(ConfigError, match=rf"cols must be \(lo, hi\) with 0 <= lo < hi <= {NX}"):
            prepared.stage(state, state, out, a=0.0, b=1.0, c=1.0, rows=(0, NY), cols=bad)


def test_open_is_a_rule_for_both_x_edges():
    assert stencil.normalize_boundary(("open", "wall")) == (stencil.OPEN, stencil.WALL, stencil.WALL)
    # a clamp, as on the south and north: the Laplacian of a ramp sees no neighbour beyond the last column
    ramp = np.tile(np.arange(6.0), (6, 1))
    lap = stencil.laplacian(ramp, boundary=("open", "periodic"), backend="numpy")
    assert lap[:, 0].tolist() == [1.0] * 6 and lap[:, -1].tolist() == [-1.0] * 6
