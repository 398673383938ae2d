"""Diagnostics reduced from blocks, as a partitioned run reduces them, equal the one-block ones bitwise.

The fields of a weather or N-body run on P workers equal the one-process
run bitwise; the diagnostics written beside them (the ``diagnostics``
group of the Zarr output, the summary's conservation errors) must too,
whatever the split. These reduce the blocks in this process exactly as
:meth:`hpcgpu.partition.rows.RowDecomposition.block_sums` and
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


def _weather_blocks(model, state, bounds):
    """Combined block sums of ``bounds``: each block gets its south neighbour's last row (wrapped if periodic)."""
    parts = []
    for a, b in bounds:
        if a > 0:
            south = model.take_block(state, a - 1, a)
        elif not model.grid.wall_y:
            south = model.take_block(state, model.grid.ny - 1, model.grid.ny)
        else:
            south = None
        parts.append(model.block_sums(model.take_block(state, a, b), a, south))
    return model.combine_sums(parts)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", ["unstable_jet", "turbulence"])
@pytest.mark.parametrize("bounds", SPLITS, ids=["2", "3", "thin"])
def test_weather_diagnostics_of_any_row_split_equal_one_block_bitwise(case, bounds, backend):
    model = ShallowWater(case, nx=64, ny=64, backend=_usable(backend))
    state = model.initial_state()
    state = model.step(state, model.suggested_dt(state), 5)
    whole = model.diagnostics(state)
    split = _weather_blocks(model, state, bounds)
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
