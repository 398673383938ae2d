"""Zarr snapshots of a partitioned grid run are written by the ranks, region by region (hpcgpu.io.rank_zarr)."""

import os

import numpy as np
import pytest

pytest.importorskip("dask")  # a bare GPU image lacks it: skip there
xr = pytest.importorskip("xarray")
pytest.importorskip("zarr")

from hpcgpu import Simulation  # noqa: E402
from hpcgpu.io import ZarrWriter  # noqa: E402
from hpcgpu.io.rank_zarr import chunk_size  # noqa: E402
from hpcgpu.io.writer_threads import BackgroundWrites  # noqa: E402
from hpcgpu.partition.engine import PartitionedExecutor  # noqa: E402
from hpcgpu.schedules import Every  # noqa: E402
from hpcgpu.workloads.weather import ShallowWater  # noqa: E402

STEPS = 6


def _run(model, path, **cluster):
    sim = Simulation(model, stop_steps=STEPS, progress=False, **cluster)
    sim.add_writer(ZarrWriter(path, Every(2)))
    sim.run()
    return sim


def _assert_same_store(got, expected):
    got, expected = xr.open_zarr(got).load(), xr.open_zarr(expected).load()
    xr.testing.assert_identical(got, expected)  # values (bitwise: == on floats), dims, coords, attrs
    for name in expected.variables:
        np.testing.assert_array_equal(got[name].values, expected[name].values, err_msg=name)
        assert got[name].dtype == expected[name].dtype, name


# -- without a cluster -------------------------------------------------------------------------------------------
def test_chunks_divide_every_block_so_no_two_ranks_share_one():
    assert chunk_size([(0, 32), (32, 64)]) == 32
    assert chunk_size([(0, 12), (12, 20)]) == 4
    assert chunk_size([(0, 7), (7, 13)]) == 1


@pytest.mark.parametrize("boundary", [None, "wall", "periodic", ("wall", "periodic")])
def test_derived_vorticity_of_any_block_is_bitwise_the_whole_grids(boundary):
    model = ShallowWater("unstable_jet", nx=24, ny=20, backend="numpy", boundary=boundary)
    state = model.initial_state()
    state = type(state)(*(a + 0.01 * np.arange(a.size).reshape(a.shape) for a in state.arrays()))  # no symmetry
    whole = model.vorticity(state).astype(model.dtype)

    def read(field, rows, cols):
        return getattr(state, field)[np.ix_(rows, cols)]

    for r0, r1, c0, c1 in [(0, 20, 0, 24), (0, 7, 0, 5), (7, 20, 5, 24), (3, 11, 9, 17)]:
        got = model.derived_output_block(read, range(r0, r1), range(c0, c1))["vorticity"]
        np.testing.assert_array_equal(got, whole[r0:r1, c0:c1], err_msg=f"{boundary} {r0}:{r1},{c0}:{c1}")


def test_the_one_process_dataset_is_unchanged_by_the_output_description():
    model = ShallowWater("unstable_jet", nx=16, ny=8, backend="numpy")
    ds = model.to_dataset(model.initial_state(), time=0.0)
    assert list(ds.data_vars) == list(model.output_variables()) == ["u", "v", "h", "vorticity"]
    assert ds["vorticity"].dims == ("time", "y_face", "x_face") and ds["u"].attrs["units"] == "m s-1"


# -- on a cluster: 2 workers, 2x2 ranks ---------------------------------------------------------------------------
@pytest.mark.parametrize("boundary", [None, "wall"])
def test_ranks_write_a_store_bitwise_equal_to_the_one_process_runs_and_the_client_gathers_nothing(
        client, tmp_path, monkeypatch, boundary):
    model = ShallowWater("unstable_jet", nx=32, ny=24, backend="numpy", boundary=boundary)
    _run(model, tmp_path / "one.zarr")
    gathers = []
    real = PartitionedExecutor.global_state
    monkeypatch.setattr(PartitionedExecutor, "global_state", lambda self: gathers.append(1) or real(self))
    sim = _run(model, tmp_path / "ranks.zarr", client=client, partitions=4, grid=(2, 2))
    assert gathers == []  # no snapshot gathered the state to the client
    _assert_same_store(tmp_path / "ranks.zarr", tmp_path / "one.zarr")
    stored = xr.open_zarr(tmp_path / "ranks.zarr")
    assert list(stored["step"].values) == [0, 2, 4, 6]
    layout = sim.executor.decomposition  # chunks divide every block: no two ranks write one chunk
    chunks = (1, chunk_size(layout.y_bounds), chunk_size(layout.x_bounds))
    assert stored["h"].encoding["chunks"] == chunks
    assert xr.open_zarr(tmp_path / "ranks.zarr", group="diagnostics").sizes["time"] > 0
    sim.close()


def test_uneven_blocks_and_a_field_selection(client, tmp_path):
    model = ShallowWater("gravity_wave", nx=30, ny=20, backend="numpy")
    for path, cluster in [("one.zarr", {}), ("ranks.zarr", dict(client=client, partitions=3, grid=(3, 1)))]:
        sim = Simulation(model, stop_steps=2, progress=False, **cluster)
        sim.add_writer(ZarrWriter(tmp_path / path, 1, fields=["h", "vorticity"]))
        sim.run()
        sim.close()
    _assert_same_store(tmp_path / "ranks.zarr", tmp_path / "one.zarr")
    assert list(xr.open_zarr(tmp_path / "ranks.zarr").data_vars) == ["h", "vorticity"]


def test_a_rank_whose_write_fails_fails_the_run_with_its_error(client, tmp_path):
    model = ShallowWater("unstable_jet", nx=32, ny=24, backend="numpy")
    path = tmp_path / "ranks.zarr"
    sim = Simulation(model, stop_steps=STEPS, progress=False, client=client, partitions=4, grid=(2, 2))
    sim.add_writer(ZarrWriter(path, Every(2)))
    sim.run(steps=1)  # step 0 written
    # a file where a chunk folder of the next snapshot must go: that rank's write fails
    blocker = path / "h" / "c" / "1"
    assert not blocker.exists()
    blocker.write_text("not a folder")
    with pytest.raises(Exception, match="c/1|Not a directory|FileExists|exists") as failure:
        sim.run(steps=2)  # raised by the run that queued the write: at its end, once the ranks' threads ran
    print("the write's error:", type(failure.value).__name__, failure.value)
    assert os.path.isfile(blocker)
    sim.close()



def test_background_writes_run_in_order_and_report_a_failure_once():
    writes, done = BackgroundWrites(depth=1), []
    for n in range(5):  # more than the queue holds: submit waits for room
        writes.submit(lambda n=n: done.append(n))
    writes.submit(lambda: 1 / 0)
    writes.submit(lambda: done.append("after"))
    with pytest.raises(ZeroDivisionError):
        writes.wait()
    assert done == [0, 1, 2, 3, 4, "after"]
    writes.wait()  # reported once
    writes.stop()


def test_a_checkpoint_waits_for_the_snapshots_the_ranks_still_write(client, tmp_path, monkeypatch):
    from hpcgpu.io import rank_zarr

    model = ShallowWater("unstable_jet", nx=32, ny=24, backend="numpy")
    finished = []
    real = rank_zarr.RankSnapshots.finish
    monkeypatch.setattr(rank_zarr.RankSnapshots, "finish", lambda self, ex: finished.append(1) or real(self, ex))
    sim = Simulation(model, stop_steps=4, progress=False, client=client, partitions=4, grid=(2, 2))
    sim.add_writer(ZarrWriter(tmp_path / "ranks.zarr", Every(2)))
    sim.run(checkpoint=tmp_path / "checkpoints", checkpoint_every=2)
    assert len(finished) >= 2  # at the checkpoints (steps 2, 4), not only at the end
    # every snapshot up to the last checkpoint is whole: no unwritten chunk reads as NaN
    stored = xr.open_zarr(tmp_path / "ranks.zarr").load()
    assert list(stored["step"].values) == [0, 2, 4]
    for name in stored.data_vars:
        assert np.isfinite(stored[name].values).all(), name
    sim.close()


def test_blocks_without_a_common_divisor_warn_of_small_chunks():
    from types import SimpleNamespace

    from hpcgpu.io.rank_zarr import template

    model = ShallowWater("unstable_jet", nx=26, ny=13, backend="numpy")
    uneven = SimpleNamespace(y_bounds=((0, 7), (7, 13)), x_bounds=((0, 13), (13, 26)))
    with pytest.warns(RuntimeWarning, match="chunks of 1 x 13 cells"):
        ds = template(model, uneven, 0.0, 0, ["h"], {})
    assert ds["h"].chunks == ((1,), (1,) * 13, (13, 13))
    even = SimpleNamespace(y_bounds=((0, 13),), x_bounds=((0, 13), (13, 26)))
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert template(model, even, 0.0, 0, ["h", "vorticity"], {})["vorticity"].chunks == ((1,), (13,), (13, 13))


def test_inner_chunks_divide_the_shard_and_thin_ones_are_left_whole():
    from hpcgpu.io.rank_zarr import inner_chunks

    assert inner_chunks((1, 2048, 4096)) == (1, 512, 512)
    assert inner_chunks((1, 1536, 300)) == (1, 512, 300)
    assert inner_chunks((1, 2 * 1031, 64)) == (1, 2 * 1031, 64)  # 2 is its largest divisor up to 512: thin
    assert inner_chunks((1, 12, 16), most=8) == (1, 6, 8)


def test_a_store_of_blocks_larger_than_the_inner_chunk_is_sharded_one_shard_per_block(client, tmp_path, monkeypatch):
    """Each rank writes whole shards (its block); readers see the same values and the inner chunks."""
    import zarr

    from hpcgpu.io import rank_zarr

    monkeypatch.setattr(rank_zarr, "INNER_CHUNK", 8)  # the client sets the store's layout: 32 x 16 blocks shard
    model = ShallowWater("unstable_jet", nx=32, ny=32, backend="numpy")
    _run(model, tmp_path / "one.zarr")
    sim = _run(model, tmp_path / "ranks.zarr", client=client, partitions=2, grid=(2, 1))
    _assert_same_store(tmp_path / "ranks.zarr", tmp_path / "one.zarr")
    for name in ("h", "u", "vorticity"):
        array = zarr.open_group(tmp_path / "ranks.zarr", mode="r")[name]
        assert array.shards == (1, 32, 16) and array.chunks == (1, 8, 8), name
        # one object per shard: 4 time indices x 2 blocks, each written whole by its rank
        files = [f for f in (tmp_path / "ranks.zarr" / name / "c").rglob("*") if f.is_file()]
        assert len(files) == 4 * 2, (name, len(files))
    sim.close()


def test_derived_variables_take_the_blocks_own_cells_from_its_copy_and_only_the_rest_from_the_store(tmp_path):
    """The store holds NaN in the block: a vorticity equal to the whole grid's proves no own cell was read back."""
    import zarr

    from hpcgpu.io.rank_zarr import write_derived_regions

    model = ShallowWater("unstable_jet", nx=24, ny=20, backend="numpy", boundary="periodic")
    state = model.initial_state()
    state = type(state)(*(a + 0.01 * np.arange(a.size).reshape(a.shape) for a in state.arrays()))
    group = zarr.open_group(tmp_path / "s.zarr", mode="w")
    rows, cols = slice(5, 15), slice(8, 20)
    for name in ("u", "v", "h", "vorticity"):
        values = getattr(state, name, np.zeros_like(state.h)).copy()
        values[rows, cols] = np.nan  # the block's own cells: never to be read from here
        group.create_array(name, shape=(1, 20, 24), chunks=(1, 5, 4), dtype=values.dtype)[0] = values
    own = type(state)(*(a[rows, cols].copy() for a in state.arrays()))
    write_derived_regions(model, str(tmp_path / "s.zarr"), 0, ["vorticity"], [(rows, cols)], [own])
    got = group["vorticity"][0, rows, cols]
    np.testing.assert_array_equal(got, model.vorticity(state).astype(model.dtype)[rows, cols])


@pytest.mark.skipif(not hasattr(os, "setpriority"), reason="per-thread priorities are a Linux feature")
def test_the_writer_thread_runs_at_a_lower_priority_than_its_caller():
    import threading

    from hpcgpu.io.writer_threads import WRITER_NICENESS

    def niceness():
        return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())

    writes, seen = BackgroundWrites(), []
    writes.submit(lambda: seen.append(niceness()))
    writes.wait()
    writes.stop()
    assert seen == [min(19, niceness() + WRITER_NICENESS)]


@pytest.mark.parametrize("text", ["-1", "20", "ten"])
def test_a_bad_writer_niceness_names_the_variable_and_its_range(monkeypatch, text):
    from hpcgpu.errors import ConfigError
    from hpcgpu.io.writer_threads import NICENESS_ENV, writer_niceness

    monkeypatch.setenv(NICENESS_ENV, text)
    with pytest.raises(ConfigError, match=f"{NICENESS_ENV} must be an int from 0 .* to 19; got '{text}'"):
        writer_niceness()
    monkeypatch.setenv(NICENESS_ENV, "0")
    assert writer_niceness() == 0


def test_a_host_copy_reuses_a_spare_state_of_the_same_shapes_and_never_aliases_the_live_block():
    from hpcgpu.io.rank_zarr import _host_copy

    model = ShallowWater("unstable_jet", nx=16, ny=8, backend="numpy")
    live = model.initial_state()
    spare = _host_copy(model, live)
    assert all(not np.shares_memory(c, a) for c, a in zip(spare.arrays(), live.arrays()))
    later = type(live)(*(a + 1.0 for a in live.arrays()))
    copy = _host_copy(model, later, spare)
    for name in model.field_names:
        assert getattr(copy, name) is getattr(spare, name), name  # copied into the spare's array
        np.testing.assert_array_equal(getattr(copy, name), getattr(later, name))
    other = ShallowWater("unstable_jet", nx=8, ny=8, backend="numpy")
    fresh = _host_copy(other, other.initial_state(), spare)  # other shapes: new arrays, the spare untouched
    assert all(f is not s for f, s in zip(fresh.arrays(), spare.arrays()))
