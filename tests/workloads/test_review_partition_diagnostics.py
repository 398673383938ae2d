"""Diagnostics reduced from blocks, as a partitioned run reduces them, equal the one-block ones bitwise.

The fields of a weather or N-body run on P workers equal the one-process
run bitwise; the diagnostics written beside them (the ``diagnostics``
group of the Zarr output, the summary's conservation errors) must too,
whatever the split. These reduce the blocks in this process exactly as
:meth:`hpcgpu.partition.grid.GridDecomposition.block_sums` and
:meth:`hpcgpu.partition.all_pairs.AllPairsDecomposition.block_sums` do on
the ranks, without a cluster.
"""

import math

import numpy as np
import pytest

from hpcgpu.workloads.astro import NBody
from hpcgpu.workloads.astro.diagnostics import exact_parts
from hpcgpu.workloads.weather import ShallowWater

SPLITS = ([(0, 33), (33, 64)], [(0, 10), (10, 37), (37, 64)], [(0, 5), (5, 6), (6, 64)])
# the reductions run where the arrays are: a GPU's row sums must not depend on the block's rows either
BACKENDS = ["numpy", "numba", pytest.param("cuda", marks=pytest.mark.gpu), pytest.param("cupy", marks=pytest.mark.gpu)]


def _usable(name):
    from _support import usable_backend

    from hpcgpu import _gpu_probe

    if name == "cuda" and _gpu_probe.simulator_enabled():
        pytest.skip("Numba's CUDA simulator is not a GPU (and too slow for these grids)")
    return usable_backend(name).name


def _weather_blocks(model, state, x_bounds, y_bounds):
    """Combined block sums of the blocks ``x_bounds x y_bounds``, each framed with its neighbours' cells as the
    distributed grid's halo exchange frames it (wrapped where periodic)."""
    from hpcgpu.partition.grid import GridDecomposition

    layout = GridDecomposition((len(x_bounds), len(y_bounds)), tuple(x_bounds), tuple(y_bounds), (1, 1, 1, 1), 1,
                               model.periodic, (), 1.0)
    ny, nx = model.shape
    xp = model.backend.xp
    parts = []
    for rank in range(len(x_bounds) * len(y_bounds)):
        where = layout.region(rank)
        rows, cols = layout.framed_shape(rank)
        row_index = xp.arange(where.first_row, where.first_row + rows) % ny
        col_index = xp.arange(where.first_col, where.first_col + cols) % nx
        framed = type(state)(*(a[row_index][:, col_index] for a in state.arrays()))
        parts.append(model.block_sums(framed, where))
    return model.combine_sums(parts)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", ["unstable_jet", "turbulence", "walled"])
@pytest.mark.parametrize("bounds", SPLITS, ids=["2", "3", "thin"])
@pytest.mark.parametrize("columns", [[(0, 64)], [(0, 30), (30, 64)], [(0, 1), (1, 50), (50, 64)]],
                         ids=["1", "2", "thin"])
def test_weather_diagnostics_of_any_block_split_equal_one_block_bitwise(case, bounds, columns, backend):
    walls = {"boundary": ("wall", "wall")} if case == "walled" else {}
    model = ShallowWater("turbulence" if case == "walled" else case, nx=64, ny=64, backend=_usable(backend), **walls)
    state = model.initial_state()
    state = model.step(state, model.suggested_dt(state), 5)
    whole = model.diagnostics(state)
    split = _weather_blocks(model, state, columns, bounds)
    assert {k: split[k] for k in split} == {k: whole[k] for k in split}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("integrator", ["kdk", "dkd"])
@pytest.mark.parametrize("bounds", [[(0, 150), (150, 301)], [(0, 7), (7, 200), (200, 301)]], ids=["2", "3"])
def test_nbody_diagnostics_of_any_body_split_equal_one_block_bitwise(integrator, bounds, backend):
    model = NBody("galaxy_collision", n=301, backend=_usable(backend), dtype="float64", integrator=integrator)
    state = model.step(model.initial_state(), 0.01, 3)
    whole = model.diagnostics(state)
    blocks = [model.take_block(state, a, b) for a, b in bounds]
    extra = [model.block_positions(b) for b in blocks] if model.sums_need_positions else None
    split = model.combine_sums([model.block_sums(b, a, extra) for b, (a, _) in zip(blocks, bounds)])
    assert split == whole


def test_exact_parts_sum_to_the_correctly_rounded_total_per_group():
    rng = np.random.default_rng(3)
    values = rng.standard_normal(5000) * 10.0 ** rng.integers(-12, 12, 5000)
    groups = rng.integers(0, 7, 5000)
    for group in range(7):
        ids, parts = exact_parts(np, values, groups)
        assert math.fsum(parts[ids == group]) == math.fsum(values[groups == group])
    ids, parts = exact_parts(np, np.array([1.0, np.nan, 2.0]))
    assert np.isnan(math.fsum(parts))
