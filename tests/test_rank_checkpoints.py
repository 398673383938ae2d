"""Grid runs on a cluster: ranks build their own initial blocks and write checkpoint pieces under a manifest."""

import json
import os
import warnings

import numpy as np
import pytest

pytest.importorskip("dask")  # a bare GPU image lacks it: skip there

from hpcgpu import Simulation  # noqa: E402
from hpcgpu.checkpoint import list_checkpoints  # noqa: E402
from hpcgpu.errors import ConfigError  # noqa: E402
from hpcgpu.partition.block_region import BlockRegion  # noqa: E402
from hpcgpu.workloads.weather import ShallowWater  # noqa: E402
from hpcgpu.workloads.weather.cases import CASES  # noqa: E402

STEPS = 12


def _jet():
    return ShallowWater("unstable_jet", nx=32, ny=40, backend="numpy")


def _fields(sim):
    state = sim.state
    return {name: np.asarray(getattr(state, name)) for name in ("u", "v", "h")}


# -- the cases, block by block -------------------------------------------------------------------------------
@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("boundary", [None, "wall", ("wall", "periodic")])
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_every_case_builds_a_block_bitwise_equal_to_the_same_cells_of_the_whole_grid(case, boundary, dtype):
    model = ShallowWater(case, nx=24, ny=20, backend="numpy", dtype=dtype, boundary=boundary)
    whole = model.initial_state()
    for r0, r1, c0, c1 in [(0, 20, 0, 24), (0, 7, 0, 5), (7, 20, 5, 24), (3, 11, 9, 17)]:
        where = BlockRegion(first_row=r0 - 2, first_col=c0 - 1, rows=slice(2, 2 + r1 - r0),
                            cols=slice(1, 1 + c1 - c0), sides=("halo",) * 4, shape=model.shape)
        block = model.initial_block(where)
        for name, got, expected in zip(model.field_names, block.arrays(), whole.arrays()):
            assert got.dtype == expected.dtype
            np.testing.assert_array_equal(got, expected[r0:r1, c0:c1], err_msg=f"{case} {name} {r0}:{r1},{c0}:{c1}")


def test_the_cases_that_build_blocks_alone_are_declared():
    assert {name for name, case in CASES.items() if not case.block_local} == {"turbulence"}


# -- the client builds no state ------------------------------------------------------------------------------
def test_a_grid_run_on_a_cluster_never_builds_the_whole_state_on_the_client(client, monkeypatch):
    model = _jet()
    reference = Simulation(model, stop_steps=STEPS, progress=False).run()
    calls = []  # the shapes of the whole-grid states built in this process (the workers are other processes)
    real = ShallowWater.initial_state
    monkeypatch.setattr(ShallowWater, "initial_state", lambda self: calls.append(self.shape) or real(self))
    sim = Simulation(model, stop_steps=STEPS, progress=False, client=client, partitions=4, grid=(2, 2))
    assert calls == [] and sim.dt == reference.dt  # dt from the ranks' health: bitwise the client's choice
    sim.run()
    assert model.shape not in calls  # warm-up builds a tiny 8x8 model's, no more
    for name, value in _fields(reference).items():
        np.testing.assert_array_equal(_fields(sim)[name], value, err_msg=name)
    sim.close()


def test_a_state_the_user_brings_is_still_split_on_the_client(client):
    model = _jet()
    state = model.initial_state()
    reference = Simulation(model, state, stop_steps=STEPS, progress=False).run()
    sim = Simulation(model, state, stop_steps=STEPS, progress=False, client=client, partitions=2).run()
    np.testing.assert_array_equal(_fields(sim)["h"], _fields(reference)["h"])
    sim.close()


# -- checkpoints of pieces -------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def written(client, tmp_path_factory):
    """A checkpoint written at step 6 by 4 ranks (2 workers, 2x2), and the uninterrupted run's fields."""
    folder = tmp_path_factory.mktemp("pieces")
    model = _jet()
    reference = Simulation(model, stop_steps=STEPS, progress=False).run()
    sim = Simulation(model, stop_steps=STEPS, progress=False, client=client, partitions=4, grid=(2, 2))
    sim.run(steps=6, checkpoint=folder)
    sim.close()
    return folder, _fields(reference), reference.diagnostics


def test_the_ranks_write_one_piece_per_field_and_a_manifest(written):
    folder, _, _ = written
    directory = folder / "step-0000000006"
    manifest = json.loads((directory / "manifest.json").read_text())
    assert manifest["step"] == 6 and manifest["grid_shape"] == [40, 32] and manifest["process_grid"] == [2, 2]
    assert [p["rank"] for p in manifest["pieces"]] == [0, 1, 2, 3]
    assert sorted(os.listdir(directory)) == sorted(
        ["manifest.json", "model.pkl"] + [f"rank-{r:06d}-{f}.npy" for r in range(4) for f in "uvh"])
    cells = sum((p["rows"][1] - p["rows"][0]) * (p["cols"][1] - p["cols"][0]) for p in manifest["pieces"])
    assert cells == 40 * 32 and len(manifest["pieces"][0]["fields"]["h"]["digest"]) >= 32
    assert not (directory / "state.pkl").exists()


@pytest.mark.parametrize("layout", [dict(partitions=2, grid=(1, 2)), dict(partitions=2, grid=(2, 1)),
                                    dict(partitions=3), None], ids=["1x2", "2x1", "3", "local"])
def test_pieces_of_4_ranks_resume_on_any_process_grid_bitwise(client, written, layout):
    folder, expected, diagnostics = written
    options = {} if layout is None else dict(client=client, **layout)
    resumed = Simulation.resume(folder, progress=False, **options)
    assert resumed.step == 6
    resumed.run()
    for name, value in expected.items():
        np.testing.assert_array_equal(_fields(resumed)[name], value, err_msg=name)
    np.testing.assert_array_equal(resumed.diagnostics.energy, diagnostics.energy)
    resumed.close()


def test_a_checkpoint_without_its_manifest_is_ignored(client, tmp_path):
    model = _jet()
    sim = Simulation(model, stop_steps=STEPS, progress=False, client=client, partitions=2)
    sim.run(steps=8, checkpoint=tmp_path, checkpoint_every=4)
    sim.close()
    os.remove(tmp_path / "step-0000000008" / "manifest.json")  # as a crash before the manifest leaves it
    with pytest.warns(RuntimeWarning, match=r"step-0000000008 is unusable .*no manifest.json"):
        resumed = Simulation.resume(tmp_path, progress=False, client=client, partitions=2)
    assert resumed.step == 4
    resumed.close()


def test_a_corrupted_piece_is_a_clear_error_naming_it(client, tmp_path):
    model = _jet()
    sim = Simulation(model, stop_steps=STEPS, progress=False, client=client, partitions=2)
    sim.run(steps=4, checkpoint=tmp_path)
    sim.close()
    piece = tmp_path / "step-0000000004" / "rank-000001-h.npy"
    data = bytearray(piece.read_bytes())
    data[-3] ^= 0xFF
    piece.write_bytes(bytes(data))
    for options in (dict(client=client, partitions=2), {}):
        with pytest.raises(ConfigError, match=r"checkpoint piece .*rank-000001-h.npy is corrupted"):
            Simulation.resume(tmp_path, progress=False, **options)


def test_a_lost_worker_restarts_from_the_pieces(client, tmp_path):
    from hpcgpu.errors import WorkerLost

    model = _jet()
    reference = Simulation(model, stop_steps=STEPS, progress=False).run()
    sim = Simulation(model, stop_steps=STEPS, progress=False, client=client, partitions=2, steps_per_task=2)
    raised = []

    def lose(s):
        if s.step == 6 and not raised:
            raised.append(WorkerLost("a worker was lost during the run (injected)"))
            raise raised[-1]

    sim.add_callback(lose, 2)
    with pytest.warns(RuntimeWarning, match="restarted from the checkpoint at step 4 "):
        sim.run(checkpoint=tmp_path, checkpoint_every=4)
    assert [r["step"] for r in sim.restarts] == [4]
    assert all((tmp_path / os.path.basename(c) / "manifest.json").exists() for c in list_checkpoints(tmp_path))
    np.testing.assert_array_equal(_fields(sim)["h"], _fields(reference)["h"])
    sim.close()


def _drop_snapshot_3(dask_worker, on):
    """On a worker: its ranks' regions of the snapshot at time index 3 never reach the store, once."""
    import hpcgpu.io.rank_zarr as module

    if not on:
        module.write_field_regions = module.original_write_field_regions
        return
    module.original_write_field_regions = write = module.write_field_regions
    dropped = []

    def drop_once(path, index, names, copies):
        if index == 3 and not dropped:
            dropped.append(1)
            return
        write(path, index, names, copies)

    module.write_field_regions = drop_once


def test_a_snapshot_half_written_when_a_worker_is_lost_is_written_again(client, tmp_path):
    """The ranks' regions of the snapshot after the last checkpoint never arrive; the restart writes it again."""
    import xarray as xr

    from hpcgpu import ZarrWriter
    from hpcgpu.errors import WorkerLost
    from hpcgpu.schedules import Every

    model = _jet()
    reference = Simulation(model, stop_steps=STEPS, progress=False)
    reference.add_writer(ZarrWriter(tmp_path / "reference.zarr", Every(2)))
    reference.run()
    sim = Simulation(model, stop_steps=STEPS, progress=False, client=client, partitions=2, steps_per_task=2)
    sim.add_writer(ZarrWriter(tmp_path / "fields.zarr", Every(2)))
    lost = []

    def lose(s):
        if s.step == 8 and not lost:  # callbacks run before the writers and the checkpoint of their step
            lost.append(WorkerLost("a worker was lost while the ranks wrote a snapshot (injected)"))
            raise lost[-1]

    sim.add_callback(lose, 2)
    client.run(_drop_snapshot_3, on=True)
    try:
        with pytest.warns(RuntimeWarning, match="restarted from the checkpoint at step 4 "):
            sim.run(checkpoint=tmp_path / "checkpoints", checkpoint_every=4)
    finally:
        client.run(_drop_snapshot_3, on=False)
    sim.close()
    written, expected = xr.open_zarr(tmp_path / "fields.zarr"), xr.open_zarr(tmp_path / "reference.zarr")
    assert written.step.values.tolist() == expected.step.values.tolist() == [0, 2, 4, 6, 8, 10, 12]
    for name in ("h", "u", "v"):
        np.testing.assert_array_equal(written[name].values, expected[name].values, err_msg=name)


def test_a_store_resumed_on_blocks_across_its_chunks_is_written_by_the_client(client, tmp_path):
    """Written on 2x1 ranks (chunks of 16 columns), resumed on 3x1 (a cut at column 11): no two ranks share a chunk."""
    import xarray as xr

    from hpcgpu import ZarrWriter
    from hpcgpu.schedules import Every

    model = _jet()
    reference = Simulation(model, stop_steps=STEPS, progress=False)
    reference.add_writer(ZarrWriter(tmp_path / "reference.zarr", Every(2)))
    reference.run()
    first = Simulation(model, stop_steps=STEPS, progress=False, client=client, partitions=2, grid=(2, 1))
    first.add_writer(ZarrWriter(tmp_path / "fields.zarr", Every(2)))
    first.run(steps=6, checkpoint=tmp_path / "checkpoints")
    first.close()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the small chunks of the tiny grid
        resumed = Simulation.resume(tmp_path / "checkpoints", progress=False, client=client, partitions=3,
                                    grid=(3, 1))
    resumed.add_writer(ZarrWriter(tmp_path / "fields.zarr", Every(2), append=True))
    with pytest.warns(RuntimeWarning, match="chunks do not align with this run's blocks"):
        resumed.run()
    resumed.close()
    written, expected = xr.open_zarr(tmp_path / "fields.zarr"), xr.open_zarr(tmp_path / "reference.zarr")
    assert written.step.values.tolist() == expected.step.values.tolist()
    for name in ("h", "u", "v"):
        np.testing.assert_array_equal(written[name].values, expected[name].values, err_msg=name)


def test_pieces_written_across_backends_resume_on_another(client, written):
    pytest.importorskip("numba")
    folder, expected, _ = written
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        resumed = Simulation.resume(folder, progress=False, backend="numba").run()
    np.testing.assert_allclose(_fields(resumed)["h"], expected["h"], rtol=1e-12)


def test_a_users_grid_model_builds_and_checkpoints_on_its_ranks_too(client, tmp_path, monkeypatch):
    from _user_models import Heat

    model = Heat(nx=8, ny=24)
    reference = Simulation(model, dt=0.05, stop_steps=STEPS, progress=False).run()
    calls = []
    real = Heat.initial_state
    monkeypatch.setattr(Heat, "initial_state", lambda self: calls.append(self.shape) or real(self))
    sim = Simulation(model, dt=0.05, stop_steps=STEPS, progress=False, client=client, partitions=4, grid=(2, 2))
    sim.run(steps=6, checkpoint=tmp_path)
    sim.close()
    assert calls == []
    assert json.loads((tmp_path / "step-0000000006" / "manifest.json").read_text())["process_grid"] == [2, 2]
    resumed = Simulation.resume(tmp_path, progress=False, client=client, partitions=2, grid=(1, 2)).run()
    assert calls == []
    np.testing.assert_array_equal(np.asarray(resumed.state.T), np.asarray(reference.state.T))
    resumed.close()
