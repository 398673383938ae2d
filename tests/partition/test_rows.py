"""Blocks of grid rows (:mod:`hpcgpu.partition.rows`): a row model's methods, the row layout and its weights.

The weather model runs on the distributed grid (tests/partition/test_grid.py);
these keep the row decomposition a user's own RowModel may still choose."""

import time

import numpy as np
import pytest

from hpcgpu import Simulation
from hpcgpu._gpu_probe import simulator_enabled
from hpcgpu.errors import ConfigError
from hpcgpu.partition.layout import split_rows
from hpcgpu.partition.rows import (SLOWDOWN_ENV, RowDecomposition, auto_steps_per_task, emulate_slowdown,
                                   halo_balanced_weights, weights_from_rates)
from hpcgpu.workloads.weather import ShallowWater


def _reference(model, state, dt, steps):
    return Simulation(model, state, dt=dt, stop_steps=steps, progress=False).run()


def _assert_same(result, reference):
    for name in ("u", "v", "h"):
        np.testing.assert_array_equal(getattr(result.state, name), getattr(reference.state, name), err_msg=name)


def _supersteps(model, state, bounds, steps, blocks=None, caches=None):
    """One superstep of every row block in this process, as the ranks do it (periodic rows)."""
    blocks = blocks or [model.take_block(state, a, b) for a, b in bounds]
    caches = caches if caches is not None else [{} for _ in bounds]
    south_width, north_width = model.halo_rows(steps)
    count = len(blocks)
    out = []
    for p, block in enumerate(blocks):
        south_block, north_block = blocks[(p - 1) % count], blocks[(p + 1) % count]
        rows_south = south_block.h.shape[0]
        south = model.row_view(south_block, rows_south - south_width, rows_south)
        north = model.row_view(north_block, 0, north_width)
        assembled = model.assemble_rows(model.take_block(south, 0, south_width), block,
                                        model.take_block(north, 0, north_width))
        result = model.advance_rows(assembled, 30.0, steps, bounds[p][0] - south_width, True, True,
                                    cache=caches[p], fresh=True)
        out.append(model.row_view(result, south_width, south_width + block.h.shape[0]))
    return out


# -- the model's row methods, as a rank uses them --------------------------------------------------
@pytest.mark.parametrize("backend", ["numpy", "numba"])
def test_resident_blocks_take_their_halos_in_place_and_match_one_block(backend):
    model = ShallowWater("turbulence", nx=24, ny=40, backend=backend)
    state = model.initial_state()
    bounds = [(0, 17), (17, 40)]
    first = _supersteps(model, state, bounds, 2)
    # a superstep's result keeps spare rows for the next halos: assembling
    # writes them there instead of copying the block
    below, above = model.halo_rows(2)
    south, north = model.take_block(first[1], 23 - below, 23), model.take_block(first[1], 0, above)
    assembled = model.assemble_rows(south, first[0], north)
    assert assembled.h.shape == (below + 17 + above, 24)
    assert all(np.shares_memory(a, b) for a, b in zip(assembled.arrays(), first[0].arrays()))
    np.testing.assert_array_equal(assembled.h[:below], south.h)
    np.testing.assert_array_equal(assembled.h[below:below + 17], first[0].h)
    # other halo widths do not fit the spare rows: new arrays
    assert not np.shares_memory(model.assemble_rows(south, first[0], None).h, first[0].h)
    # a block without spare rows (as after a transfer) is concatenated into new arrays
    compact = model.take_block(first[0], 0, 17)
    copied = model.assemble_rows(south, compact, north)
    assert not np.shares_memory(copied.h, compact.h)
    np.testing.assert_array_equal(copied.h, assembled.h)
    second = _supersteps(model, state, bounds, 2, blocks=first)
    reference = model.step(state, 30.0, steps=4)
    np.testing.assert_array_equal(np.concatenate([b.h for b in second]), model.backend.to_host(reference.h))
    np.testing.assert_array_equal(np.concatenate([b.u for b in second]), model.backend.to_host(reference.u))


def test_released_results_are_reused_and_held_ones_never_overwritten():
    import weakref

    model = ShallowWater("turbulence", nx=24, ny=40, backend="numpy")
    state = model.initial_state()
    bounds = [(0, 17), (17, 40)]
    caches = [{}, {}]
    blocks = _supersteps(model, state, bounds, 2, caches=caches)
    held = blocks[0].h  # a view still in use (a halo in flight): its arrays must never be handed out again
    kept = held.copy()
    generations = []
    for _ in range(4):
        blocks = _supersteps(model, state, bounds, 2, blocks=blocks, caches=caches)
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
    from hpcgpu.workloads.weather import STAGE_REACH

    model = ShallowWater("turbulence", nx=16, ny=48, backend="numpy")
    state = model.initial_state()
    calls = []
    kernels = model.backend.kernels("stencil")
    original = kernels.shallow_water_stage

    def recording(*args):
        calls.append(args[0].shape[0])
        return original(*args)

    kernels.shallow_water_stage = recording
    try:
        model.advance_rows(state, 30.0, 2, 0, south_open=True, north_open=True)
        model.advance_rows(state, 30.0, 1, 0, south_open=False, north_open=False)
    finally:
        kernels.shallow_water_stage = original
    shrink = sum(STAGE_REACH)
    assert calls == [48 - shrink * s for s in range(6)] + [48, 48, 48]


# -- runs on the engine ---------------------------------------------------------------------------------
def test_halos_overlap_the_block_only_when_asked(monkeypatch):
    from hpcgpu.partition.rows import OVERLAP_ENV, _overlap_default

    monkeypatch.delenv(OVERLAP_ENV, raising=False)
    assert not any(_overlap_default(k) for k in (1, 2, 4, 16))
    monkeypatch.setenv(OVERLAP_ENV, "1")
    assert all(_overlap_default(k) for k in (1, 2, 4, 16))
    monkeypatch.setenv(OVERLAP_ENV, "0")
    assert not _overlap_default(1)


# -- layout ----------------------------------------------------------------------------------------------
def test_weighted_partitions_follow_the_weights():
    assert split_rows(101, [3, 1]) == [(0, 76), (76, 101)]
    # a block too small for the halo is raised to it; the others keep their proportions
    assert split_rows(100, [1, 50, 50], minimum=10) == [(0, 10), (10, 55), (55, 100)]
    for rows in (100, 101, 257):
        (a, b), (c, d) = split_rows(rows, [3.0, 1.0])
        assert abs((b - a) - 3 * (d - c)) <= 4  # within one row of 3:1 each
        assert abs((b - a) - 0.75 * rows) <= 1


def test_default_blocks_of_a_channel_balance_their_halo_work_and_a_periodic_grid_splits_evenly():
    channel = ShallowWater("unstable_jet", nx=16, ny=1000, backend="numpy")
    south, north = channel.halo_rows(16)
    layout = RowDecomposition.build(channel, 30.0, 4, 16, None, calibrated=False)
    rows = [b - a for a, b in layout.bounds]
    # each block's own rows plus half the halo rows of its open edges: equal to within rounding
    work = [r + (south * (p > 0) + north * (p < 3)) / 2 for p, r in enumerate(rows)]
    assert sum(rows) == 1000 and max(work) - min(work) <= 1
    assert rows[1] < rows[0] and rows[2] < rows[3]  # inner blocks step two halos
    assert layout.weights == (1.0, 1.0, 1.0, 1.0)  # what the user asked for: equal work
    # given weights are taken as they are
    given = RowDecomposition.build(channel, 30.0, 2, 16, [1, 1], calibrated=False)
    assert [b - a for a, b in given.bounds] == [500, 500]
    periodic = ShallowWater("turbulence", nx=16, ny=1000, backend="numpy")
    even = RowDecomposition.build(periodic, 30.0, 4, 16, None, calibrated=False)
    assert [b - a for a, b in even.bounds] == [250] * 4


def test_calibrated_rates_leave_room_for_the_halo_work_of_each_block():
    model = ShallowWater("unstable_jet", nx=40, ny=400, backend="numpy")
    weights = weights_from_rates(model, 4, [2.0, 1.0])
    extra = sum(model.halo_rows(4)) / 2
    # each block's stepped rows (its own plus half its halo) follow the rates
    assert sum(weights) == pytest.approx(400)
    assert (weights[0] + extra) / (weights[1] + extra) == pytest.approx(2.0)
    assert weights[0] / weights[1] > 2.0
    assert weights_from_rates(model, 4, [1.0, 1.0, 1.0]) == pytest.approx([400 / 3] * 3)
    layout = RowDecomposition.build(model, 30.0, 2, 4, [2.0, 1.0], calibrated=True)
    assert layout.bounds[0][1] == round(weights[0]) and layout.neighbours(0) == (None, 1)


def test_an_emulated_slow_worker_sleeps_in_proportion(monkeypatch):
    monkeypatch.setenv(SLOWDOWN_ENV, "3")
    started = time.perf_counter()
    time.sleep(0.02)
    emulate_slowdown(started)
    assert time.perf_counter() - started >= 3 * 0.02
    monkeypatch.setenv(SLOWDOWN_ENV, "1")
    started = time.perf_counter()
    emulate_slowdown(started)
    assert time.perf_counter() - started < 0.01


def test_blocks_that_cannot_hold_their_halo_never_suggest_zero_partitions():
    with pytest.raises(ConfigError, match=r"needs at least 768 rows \(384 per block for the halo\) but the grid has "
                                          r"128; use fewer steps_per_task \(a narrower halo\) or a bigger grid"):
        split_rows(128, [1, 1], minimum=384)
    with pytest.raises(ConfigError, match="use at most 3 partitions or fewer steps_per_task"):
        split_rows(100, [1] * 4, minimum=30)


def test_finite_weights_whose_sum_overflows_still_place_every_row():
    assert split_rows(40, [1e308, 1e308], minimum=6) == [(0, 20), (20, 40)]
    assert split_rows(40, [1e308, 1e307], minimum=6) == [(0, 34), (34, 40)]
    assert split_rows(40, [1e-300, 3e-300]) == [(0, 10), (10, 40)]

