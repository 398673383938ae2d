"""How far K steps of the shallow-water model read each field beyond a block: the declared widths are
exactly the dependency cone of the owned cells, field by field and side by side."""

from dataclasses import fields

import numpy as np
import pytest

from hpcgpu.kernels.stencil import shallow_water_tendency, viscous_energy_tendency
from hpcgpu.partition.grid import GridDecomposition, state_arrays
from hpcgpu.workloads.weather import ShallowWater
from hpcgpu.workloads.weather.grid_blocks import shallow_water_field_reach
from hpcgpu.workloads.weather.stepper import BUDGET_READS, STAGE_READS, STAGE_REACH

SIDES = ("west", "east", "south", "north")


def _reads_of_one_poisoned_cell(outputs, n=24):
    """``{(output, input): (west, east, south, north)}``: the cells of each input field that each output reads,
    found by making one input cell NaN and seeing which output cells turn NaN."""
    rng = np.random.default_rng(3)
    base = {"u": rng.random((n, n)), "v": rng.random((n, n)), "h": 1.0 + rng.random((n, n))}
    reads = {}
    for source in "uvh":
        poisoned = {name: array.copy() for name, array in base.items()}
        poisoned[source][n // 2, n // 2] = np.nan
        for output, result in zip(outputs, outputs_of(poisoned)):
            rows, cols = np.nonzero(np.isnan(result))
            if len(rows):
                di, dj = n // 2 - cols, n // 2 - rows  # where the input lies from each output cell that read it
                reads[output, source] = (max(0, -di.min()), max(0, di.max()), max(0, -dj.min()), max(0, dj.max()))
    return reads


def outputs_of(fields_):
    """The tendencies and the viscous energy rate of a periodic grid (the NumPy reference kernels)."""
    options = dict(dx=1.0, dy=1.0, viscosity=0.1, boundary="periodic", backend="numpy")
    du, dv, dh = shallow_water_tendency(fields_["u"], fields_["v"], fields_["h"], f_corner=1e-4, g=9.81, **options)
    rate = viscous_energy_tendency(fields_["u"], fields_["v"], fields_["h"], **options)
    return du, dv, dh, rate


def test_the_stage_reads_are_what_the_reference_kernels_read():
    reads = _reads_of_one_poisoned_cell(("u", "v", "h", "viscous_energy"))
    declared = {**STAGE_READS, **{pair: (r,) * 4 if isinstance(r, int) else r for pair, r in BUDGET_READS.items()
                                  if pair[1] != "viscous_energy"}}
    assert reads == declared
    # the uniform reach of a stage is the widest of them
    widest = tuple(max(r[side] for r in STAGE_READS.values()) for side in range(4))
    assert widest == (STAGE_REACH[0], STAGE_REACH[1], STAGE_REACH[0], STAGE_REACH[1])


def test_each_field_reads_about_half_the_frame_on_the_wide_sides():
    model = ShallowWater("turbulence", nx=16, ny=16, backend="numpy")
    assert model.reach(16) == (96, 48, 96, 48)
    assert model.field_reach(16) == {"u": (48, 48, 49, 48), "v": (49, 48, 48, 48), "h": (49, 48, 49, 48)}
    assert shallow_water_field_reach(1, energy_budget=True)["viscous_energy"] == (0, 0, 0, 0)


def _centre_block(model, steps):
    """The layout of a 3 x 3 periodic grid (the centre rank has a neighbour on every side) and rank 4's region."""
    layout = GridDecomposition.build(model, 1.0, 9, steps, None, False, grid=(3, 3))
    return layout, layout.region(4)


def _framed(model, state, layout, where):
    """Rank 4's framed host arrays, every frame cell from the whole grid (wrapped)."""
    ny, nx = model.shape
    height, width = layout.framed_shape(4)
    rows = (where.first_row + np.arange(height)) % ny
    cols = (where.first_col + np.arange(width)) % nx
    return [model.backend.to_host(a)[np.ix_(rows, cols)].copy() for a in state_arrays(state)]


def _poison_beyond(arrays, where, widths):
    """NaN in every frame cell of each array outside its ``(west, east, south, north)`` widths."""
    rows, cols = where.rows, where.cols
    for array, (w, e, s, n) in zip(arrays, widths):
        keep = np.zeros(array.shape, bool)
        keep[rows.start - s:rows.stop + n, cols.start - w:cols.stop + e] = True
        array[~keep] = np.nan
    return arrays


def _step_owned(model, state, arrays, dt, steps, where):
    block = type(state)(*(model.backend.asarray(a) for a in arrays))
    stepped = model.step_block(block, dt, steps, where)
    return [where.interior(model.backend.to_host(a)) for a in state_arrays(stepped)]


def _model(backend, budget=False):
    return ShallowWater("turbulence", nx=42, ny=45, Lx=4.2e5, Ly=4.5e5, backend=backend, energy_budget=budget)


@pytest.mark.parametrize("budget", [False, True], ids=["fields", "budget"])
@pytest.mark.parametrize("steps", [1, 2])
def test_frames_poisoned_beyond_each_fields_reach_leave_the_owned_cells_bitwise(backend, steps, budget):
    model = _model(backend, budget)
    state = model.initial_state()
    dt = model.suggested_dt(state)
    state = model.stepper(dt).advance(state, 2)  # a budget that is not zero
    layout, where = _centre_block(model, steps)
    names = [f.name for f in fields(state)]
    widths = layout.field_widths(4, names)
    assert all(side == "halo" for side in where.sides)
    whole = model.stepper(dt).advance(state, steps)
    rows, cols = where.owned_rows, where.owned_cols
    expected = [model.backend.to_host(a)[rows.start:rows.stop, cols.start:cols.stop] for a in state_arrays(whole)]
    clean = _step_owned(model, state, _framed(model, state, layout, where), dt, steps, where)
    poisoned = _step_owned(model, state, _poison_beyond(_framed(model, state, layout, where), where, widths),
                           dt, steps, where)
    for name, got, full, want in zip(names, poisoned, clean, expected):
        assert np.isfinite(got).all(), name
        np.testing.assert_array_equal(full, want, err_msg=name)
        np.testing.assert_array_equal(got, want, err_msg=name)


@pytest.mark.parametrize("backend_name", ["numpy", "numba"])
def test_one_cell_less_of_any_field_on_any_side_reaches_the_owned_cells(backend_name):
    model = _model(backend_name)
    state = model.initial_state()
    dt = model.suggested_dt(state)
    steps = 2
    layout, where = _centre_block(model, steps)
    names = [f.name for f in fields(state)]
    widths = layout.field_widths(4, names)
    for field, field_widths in enumerate(widths):
        for side in range(4):
            narrower = [list(w) for w in widths]
            narrower[field][side] -= 1
            arrays = _poison_beyond(_framed(model, state, layout, where), where, narrower)
            owned = _step_owned(model, state, arrays, dt, steps, where)
            assert any(np.isnan(a).any() for a in owned), (names[field], SIDES[side], field_widths[side])
