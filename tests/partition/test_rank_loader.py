"""A state the user brings, loaded by each rank (hpcgpu/partition/rank_loader.py): no block through the client."""

import numpy as np
import pytest

from hpcgpu import RankLoader, Simulation
from hpcgpu.errors import ConfigError
from hpcgpu.workloads.weather import ShallowWater

STEPS = 6


def _start(model):
    """A start the model's cases do not make: its jet with a random bump in the depth."""
    state = model.to_host(model.initial_state())
    bump = np.random.default_rng(7).standard_normal(state.h.shape) * 0.5
    return model.state_from_arrays(state.u, state.v, state.h + bump)


def _fields(sim):
    state = sim.state
    return {name: np.asarray(getattr(state, name)) for name in ("u", "v", "h")}


def test_a_loader_in_one_process_runs_as_the_state_it_loads():
    model = ShallowWater("unstable_jet", nx=32, ny=24, backend="numpy")
    start = _start(model)
    loader = RankLoader.from_arrays({"u": start.u, "v": start.v, "h": start.h}, model.state_from_arrays)
    expected = Simulation(model, start, stop_steps=STEPS, progress=False).run()
    loaded = Simulation(model, loader, stop_steps=STEPS, progress=False).run()
    for name, array in _fields(expected).items():
        np.testing.assert_array_equal(_fields(loaded)[name], array, err_msg=name)


def test_ranks_load_their_blocks_from_a_zarr_store_and_match_one_process(client, tmp_path, monkeypatch):
    pytest.importorskip("zarr")
    import dask.array as da
    import xarray as xr

    model = ShallowWater("unstable_jet", nx=32, ny=24, backend="numpy")
    start = _start(model)
    xr.Dataset({name: (("y", "x"), getattr(start, name)) for name in ("u", "v", "h")}).to_zarr(tmp_path / "start.zarr")
    arrays = {name: da.from_zarr(str(tmp_path / "start.zarr"), component=name) for name in ("u", "v", "h")}
    expected = Simulation(model, start, stop_steps=STEPS, progress=False).run()
    scattered, scatter = [], type(client).scatter
    monkeypatch.setattr(type(client), "scatter",
                        lambda self, data, **options: scattered.append(data) or scatter(self, data, **options))
    sim = Simulation(model, RankLoader.from_arrays(arrays, model.state_from_arrays), stop_steps=STEPS,
                     progress=False, client=client, partitions=3, grid=(1, 3))
    sim.run()
    got = _fields(sim)
    sim.close()
    # the layout, once; no block: each was read on its rank's worker
    assert [type(data).__name__ for data in scattered] == ["Spec"]
    for name, array in _fields(expected).items():
        np.testing.assert_array_equal(got[name], array, err_msg=name)


def test_a_loader_that_gives_the_wrong_block_or_is_no_function_is_refused():
    model = ShallowWater("unstable_jet", nx=16, ny=8, backend="numpy")
    with pytest.raises(ConfigError, match="load must be a callable"):
        RankLoader("start.zarr")
    with pytest.raises(ConfigError, match=r"arrays\['h'\] must be 2-D"):
        RankLoader.from_arrays({"h": np.zeros(5)}, model.state_from_arrays)
    wrong = RankLoader(lambda m, rows, cols: m.state_from_arrays(*(np.ones((2, 2)) for _ in range(3)), shape=(2, 2)))
    with pytest.raises(ConfigError, match=r"field 'u' of shape \(2, 2\); expected \(8, 16\)"):
        Simulation(model, wrong, stop_steps=1, progress=False).run()
