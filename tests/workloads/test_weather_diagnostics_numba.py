"""The fused Numba pass of the weather diagnostics gives the array path's exact partials, partial for partial.

:func:`hpcgpu.workloads.weather.diagnostics.reference_block_sums` (array
operations, the NumPy backend's path) is the reference: every block of
every split, every kind of side (halo, wrap, wall), both dtypes, the
energy budget, and fields with NaN, infinities, zeros, subnormals and
negative depths must give equal :class:`~hpcgpu.exact_sums.ExactPartial`
(same exact sum, same counts of elements, NaN and infinities).
"""

import numpy as np
import pytest

from hpcgpu.partition.block_region import BlockRegion, whole_grid
from hpcgpu.partition.grid import GridDecomposition
from hpcgpu.workloads.weather import ShallowWater
from hpcgpu.workloads.weather import diagnostics
from hpcgpu.workloads.weather.diagnostics_numba import frame_maps, fused_block_sums

CASES = {"jet": ("unstable_jet", {}), "periodic": ("turbulence", {}),
         "walled": ("turbulence", {"boundary": ("wall", "wall")})}


def _framed_blocks(model, state, x_bounds, y_bounds, frame=1):
    """``(framed state, region)`` of every block, framed as the distributed grid's halo exchange frames it."""
    layout = GridDecomposition((len(x_bounds), len(y_bounds)), tuple(x_bounds), tuple(y_bounds), (frame,) * 4, 1,
                               model.periodic, (), 1.0)
    ny, nx = model.shape
    for rank in range(len(x_bounds) * len(y_bounds)):
        where = layout.region(rank)
        rows, cols = layout.framed_shape(rank)
        row_index = np.arange(where.first_row, where.first_row + rows) % ny
        col_index = np.arange(where.first_col, where.first_col + cols) % nx
        yield type(state)(*(a[row_index][:, col_index] for a in state.arrays())), where


def _assert_fused_equals_reference(model, state, where):
    with np.errstate(all="ignore"):  # blown-up fields divide by zero depths in the reference
        reference = diagnostics.reference_block_sums(model, state, where)
    fused = fused_block_sums(model, state, where)
    assert fused.keys() == reference.keys()
    for key in reference:
        assert fused[key] == reference[key], key


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("split", [([(0, 40)], [(0, 24)]), ([(0, 13), (13, 40)], [(0, 1), (1, 9), (9, 24)]),
                                   ([(0, 1), (1, 39), (39, 40)], [(0, 12), (12, 24)])],
                         ids=["whole", "thin-rows", "thin-columns"])
def test_every_block_of_a_split_gives_the_reference_partials(case, dtype, split):
    name, options = CASES[case]
    model = ShallowWater(name, nx=40, ny=24, backend="numba", dtype=dtype, energy_budget=True, **options)
    state = model.initial_state()
    state = model.step(state, model.suggested_dt(state), 3)
    for framed, where in _framed_blocks(model, state, *split, frame=2):
        _assert_fused_equals_reference(model, framed, where)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("sides", [("wall", "wall", "wall", "wall"), ("wrap", "wrap", "wrap", "wrap"),
                                   ("halo", "halo", "halo", "halo"), ("wall", "halo", "halo", "wall"),
                                   ("halo", "wall", "wall", "halo"), ("wrap", "wrap", "wall", "halo")])
def test_wild_fields_give_the_reference_partials_on_every_kind_of_side(dtype, sides, rng):
    model = ShallowWater("turbulence", nx=9, ny=7, backend="numba", dtype=np.dtype(dtype).name)
    shape = (7 + 2, 9 + 2)
    tiny = np.finfo(dtype).smallest_subnormal
    pool = np.array([0.0, -0.0, tiny, -tiny, 1e-30, -3.0, 1000.0, 1e30, np.nan, np.inf, -np.inf], dtype)
    fields = [np.where(rng.random(shape) < 0.3, rng.choice(pool, shape),
                       (rng.standard_normal(shape) * 10.0 ** rng.integers(-5, 5, shape)).astype(dtype))
              for _ in range(3)]
    state = model.state_type(*fields)  # unchecked: a blown-up block still sums
    west, _, south, _ = sides
    rows = slice(1 if south == "halo" else 0, 8 if south == "halo" else 7)
    cols = slice(1 if west == "halo" else 0, 10 if west == "halo" else 9)
    where = BlockRegion(first_row=-rows.start, first_col=-cols.start, rows=rows, cols=cols, sides=sides,
                        shape=(7, 9))
    _assert_fused_equals_reference(model, state, where)


def test_a_one_row_block_between_two_walls_halves_its_corners_twice_as_the_reference_does():
    model = ShallowWater("turbulence", nx=8, ny=4, backend="numba", boundary=("periodic", "wall"))
    state = type(model.initial_state())(*(a[1:2] for a in model.initial_state().arrays()))
    where = BlockRegion(first_row=0, first_col=0, rows=slice(0, 1), cols=slice(0, 8),
                        sides=("wrap", "wrap", "wall", "wall"), shape=(1, 8))
    _assert_fused_equals_reference(model, state, where)


def test_the_frame_maps_name_the_cells_beyond_each_side():
    halo = BlockRegion(first_row=-1, first_col=-1, rows=slice(1, 4), cols=slice(1, 5),
                       sides=("halo", "halo", "halo", "halo"), shape=(9, 9))
    rows, zero_v, west, zero_u = frame_maps(halo)
    assert rows.tolist() == [0, 1, 2, 3] and not zero_v.any() and west == 0 and not zero_u
    walls = BlockRegion(first_row=0, first_col=0, rows=slice(0, 3), cols=slice(0, 4),
                        sides=("wall", "wall", "wall", "wall"), shape=(3, 4))
    rows, zero_v, west, zero_u = frame_maps(walls)
    assert rows.tolist() == [0, 0, 1, 2, 2] and zero_v.tolist() == [True, False, False, False, True]
    assert west == 0 and zero_u
    wrap = BlockRegion(first_row=0, first_col=0, rows=slice(0, 3), cols=slice(0, 4),
                       sides=("wrap", "wrap", "wrap", "halo"), shape=(3, 4))
    rows, zero_v, west, zero_u = frame_maps(wrap)
    assert rows.tolist() == [2, 0, 1, 2] and not zero_v.any() and west == 3 and not zero_u


def test_only_the_numba_backend_takes_the_fused_pass(monkeypatch):
    calls = []
    monkeypatch.setattr("hpcgpu.workloads.weather.diagnostics_numba.fused_block_sums",
                        lambda *args: calls.append(args) or {})
    for backend in ("numpy", "numba"):
        model = ShallowWater("unstable_jet", nx=8, ny=8, backend=backend)
        model.block_sums(model.initial_state(), whole_grid(model.shape, model.periodic))
    assert len(calls) == 1 and calls[0][0].backend.name == "numba"
    assert diagnostics.uses_fused_sums(calls[0][0])


def test_the_numba_and_numpy_backends_give_the_same_diagnostics_of_a_state_bitwise():
    reference = ShallowWater("unstable_jet", nx=32, ny=16, backend="numpy", dtype="float32", energy_budget=True)
    state = reference.initial_state()
    state = reference.step(state, reference.suggested_dt(state), 2)
    model = ShallowWater("unstable_jet", nx=32, ny=16, backend="numba", dtype="float32", energy_budget=True)
    assert model.diagnostics(state) == reference.diagnostics(state)
