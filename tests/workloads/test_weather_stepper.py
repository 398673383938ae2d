"""The shallow-water stepper on framed blocks (:mod:`hpcgpu.workloads.weather.stepper`,
``ShallowWater.advance_rows``): open edges step only the valid rows and columns, and results come in pooled
arrays."""

import weakref

import numpy as np
import pytest

from hpcgpu.workloads.weather import STAGE_REACH, ShallowWater


def _blocks(state, bounds):
    """Rows ``a:b`` of ``state`` for each ``(a, b)`` of ``bounds``, as independent arrays."""
    return [type(state)(*(array[a:b].copy() for array in state.arrays())) for a, b in bounds]


def _supersteps(model, bounds, steps, blocks, caches):
    """One superstep of every block in this process, as ranks on a periodic 1 x P grid do it: each block
    framed by its neighbours' edge rows, stepped with open edges, and cut to the rows that stayed valid."""
    _, _, south, north = model.reach(steps)
    count = len(blocks)
    out = []
    for p, block in enumerate(blocks):
        below, above = blocks[(p - 1) % count], blocks[(p + 1) % count]
        framed = type(block)(*(np.concatenate([s[-south:], own, n[:north]])
                               for s, own, n in zip(below.arrays(), block.arrays(), above.arrays())))
        result = model.advance_rows(framed, 30.0, steps, bounds[p][0] - south, south_open=True, north_open=True,
                                    cache=caches[p], fresh=True)
        rows = block.h.shape[0]
        out.append(type(block)(*(array[south:south + rows] for array in result.arrays())))
    return out


def test_released_results_are_reused_and_held_ones_never_overwritten():
    model = ShallowWater("turbulence", nx=24, ny=40, backend="numpy")
    state = model.initial_state()
    bounds = [(0, 17), (17, 40)]
    caches = [{}, {}]
    blocks = _supersteps(model, bounds, 2, _blocks(state, bounds), caches)
    held = blocks[0].h  # a view still in use (a halo in flight): its arrays must never be handed out again
    kept = held.copy()
    generations = []
    for _ in range(4):
        blocks = _supersteps(model, bounds, 2, blocks, caches)
        generations.append([weakref.ref(a.base) for b in blocks for a in b.arrays()])
    np.testing.assert_array_equal(held, kept)
    # superstep n writes into the arrays of superstep n - 2, released by then
    assert all(ref() is not None for ref in generations[0])
    assert {id(ref()) for ref in generations[2]} == {id(ref()) for ref in generations[0]}
    assert all(ref() is not held.base for generation in generations for ref in generation)
    reference = model.step(state, 30.0, steps=10)
    for name in ("h", "u", "v"):
        np.testing.assert_array_equal(np.concatenate([getattr(b, name) for b in blocks]), getattr(reference, name))


def test_open_edges_step_only_the_rows_that_stay_valid():
    model = ShallowWater("turbulence", nx=16, ny=48, backend="numpy")
    state = model.initial_state()
    calls = []
    kernels = model.backend.kernels("stencil")
    original = kernels.shallow_water_stage

    def recording(*args, cols=None):
        calls.append(args[0].shape[0])
        return original(*args, cols=cols)

    kernels.shallow_water_stage = recording
    try:
        model.advance_rows(state, 30.0, 2, 0, south_open=True, north_open=True)
        model.advance_rows(state, 30.0, 1, 0, south_open=False, north_open=False)
    finally:
        kernels.shallow_water_stage = original
    shrink = sum(STAGE_REACH)
    assert calls == [48 - shrink * s for s in range(6)] + [48, 48, 48]


@pytest.mark.parametrize("west, east", [(True, True), (True, False), (False, True), (False, False)])
def test_open_sides_step_only_the_columns_that_stay_valid(west, east):
    model = ShallowWater("turbulence", nx=40, ny=16, backend="numpy")
    state = model.initial_state()
    windows = []
    kernels = model.backend.kernels("stencil")
    original = kernels.shallow_water_stage

    def recording(*args, cols=None):
        windows.append(cols)
        return original(*args, cols=cols)

    kernels.shallow_water_stage = recording
    try:
        model.advance_rows(state, 30.0, 2, 0, south_open=False, north_open=False, west_open=west, east_open=east)
    finally:
        kernels.shallow_water_stage = original
    if not (west or east):
        assert windows == [None] * 6  # whole rows, as before windows existed
    else:
        assert windows == [(STAGE_REACH[0] * s * west, 40 - STAGE_REACH[1] * s * east) for s in range(6)]


def _framed(state, rows, cols, frame):
    """The block ``rows`` x ``cols`` of a periodic ``state`` with ``frame = (west, east, south, north)`` cells of
    its neighbours around it, as the distributed grid's exchange leaves it."""
    west, east, south, north = frame
    ny, nx = state.h.shape
    r = np.arange(rows[0] - south, rows[1] + north) % ny
    c = np.arange(cols[0] - west, cols[1] + east) % nx
    return type(state)(*(a[np.ix_(r, c)] for a in state.arrays()))


@pytest.mark.parametrize("backend", ["numpy", "numba"])  # three stage calls; the fused step
def test_two_by_two_framed_blocks_with_shrinking_windows_equal_the_whole_grid_bitwise(backend):
    model = ShallowWater("turbulence", nx=44, ny=46, backend=backend)
    state = model.initial_state()
    steps = 2
    frame = model.reach(steps)
    west, _, south, _ = frame
    reference = model.step(state, 30.0, steps=steps)
    got = {name: np.full(state.h.shape, np.nan) for name in ("u", "v", "h")}
    for rows in ((0, 21), (21, 46)):
        for cols in ((0, 25), (25, 44)):
            result = model.advance_rows(_framed(state, rows, cols, frame), 30.0, steps, rows[0] - south,
                                        south_open=True, north_open=True, west_open=True, east_open=True)
            for name in got:
                block = getattr(result, name)[south:south + rows[1] - rows[0], west:west + cols[1] - cols[0]]
                got[name][rows[0]:rows[1], cols[0]:cols[1]] = block
    for name in got:
        np.testing.assert_array_equal(got[name], getattr(reference, name), err_msg=name)
