"""Zarr snapshots of a partitioned particle run are written by the ranks, by id (hpcgpu.io.particle_zarr)."""

import numpy as np
import pytest

pytest.importorskip("dask")  # a bare GPU image lacks it: skip there
xr = pytest.importorskip("xarray")
zarr = pytest.importorskip("zarr")

from hpcgpu import Simulation  # noqa: E402
from hpcgpu.errors import ConfigError  # noqa: E402
from hpcgpu.io import ZarrWriter  # noqa: E402
from hpcgpu.io.particle_zarr import chunk_length, writer_ranges  # noqa: E402
from hpcgpu.partition.brick_geometry import Bricks  # noqa: E402
from hpcgpu.partition.engine import PartitionedExecutor  # noqa: E402
from hpcgpu.schedules import Every  # noqa: E402
from hpcgpu.workloads.astro import NBody  # noqa: E402
from hpcgpu.workloads.md import LennardJones  # noqa: E402


class GatheringZarrWriter(ZarrWriter):
    """The writer as it was: the state gathered to the client and written there (the reference)."""

    def _write_particles_by_ranks(self, simulation):
        return False


def _assert_same_store(got, expected):
    got, expected = xr.open_zarr(got).load(), xr.open_zarr(expected).load()
    xr.testing.assert_identical(got, expected)  # values (== on floats), dims, coords, attrs
    for name in expected.variables:
        np.testing.assert_array_equal(got[name].values, expected[name].values, err_msg=name)
        assert got[name].dtype == expected[name].dtype, name


def _run_both(tmp_path, model, state=None, steps=40, every=10, fields=None, **cluster):
    """One partitioned run with a rank-written store and a gathered one on the same schedule; the sim, gathers."""
    sim = Simulation(model, state, dt=0.005 if isinstance(model, LennardJones) else 0.01, stop_steps=steps,
                     progress=False, **cluster)
    sim.add_writer(ZarrWriter(tmp_path / "ranks.zarr", Every(every), fields=fields))
    sim.add_writer(GatheringZarrWriter(tmp_path / "gathered.zarr", Every(every), fields=fields))
    sim.run()
    return sim


# -- without a cluster -------------------------------------------------------------------------------------------
def test_each_rank_writes_whole_chunks_and_every_particle_once():
    for total, ranks in [(1000, 4), (5, 3), (2, 3), (101, 3), (3 * (1 << 20) + 7, 2)]:
        chunk = chunk_length(total, ranks)
        ranges = writer_ranges(total, chunk, ranks)
        assert len(ranges) == ranks and ranges[0][0] == 0 and ranges[-1][1] == total
        for (_, stop), (first, _) in zip(ranges, ranges[1:]):
            assert stop == first  # contiguous: every id written once
        for first, stop in ranges:
            assert first % chunk == 0 and (stop % chunk == 0 or stop == total)  # whole chunks: no chunk shared
    assert chunk_length(10 ** 9, 4) == 1 << 20  # chunks stay bounded on big runs


# -- on a cluster: 2 workers, 2 and 3 ranks ---------------------------------------------------------------------
@pytest.mark.parametrize("partitions", [2, 3])
def test_md_bricks_write_the_store_the_gathered_state_writes_with_atoms_migrating(client, tmp_path, monkeypatch,
                                                                                 partitions):
    model = LennardJones(6 if partitions == 3 else 5, temperature=2.0, backend="numpy", seed=4)
    state = model.step(model.initial_state(), 0.005, 20)  # off the lattice: atoms near every face
    gathers = []
    real = PartitionedExecutor.global_state
    monkeypatch.setattr(PartitionedExecutor, "global_state", lambda self: gathers.append(1) or real(self))
    sim = _run_both(tmp_path, model, state, client=client, partitions=partitions)
    assert len(gathers) == 5  # the gathering writer's 5 snapshots; the ranks' writer gathered nothing
    _assert_same_store(tmp_path / "ranks.zarr", tmp_path / "gathered.zarr")
    stored = xr.open_zarr(tmp_path / "ranks.zarr")
    assert list(stored["step"].values) == [0, 10, 20, 30, 40] and stored.sizes["atom"] == model.n
    assert stored["positions"].encoding["chunks"] == (1, 3, chunk_length(model.n, partitions))
    # atoms crossed brick faces between the snapshots: the ranks exchanged different atoms each time
    summary = sim.summary()
    bricks = Bricks(tuple(tuple(e) for e in summary["brick_edges"]), model.box)
    first, last = stored["positions"].isel(time=0).values, stored["positions"].isel(time=-1).values
    layers = [np.array([bricks.index(np, p[axis], axis) for axis in range(3)]) for p in (first, last)]
    assert (layers[0] != layers[1]).any(axis=0).sum() > 0
    sim.close()


@pytest.mark.parametrize("partitions, weights, dtype", [(2, [1.0, 3.0], "float64"), (3, [2.0, 1.0, 3.0], "float64"),
                                                       (2, [3.0, 1.0], "float32")])
def test_nbody_ranks_write_the_store_the_gathered_state_writes(client, tmp_path, monkeypatch, partitions, weights,
                                                               dtype):
    model = NBody("plummer", n=97, backend="numpy", seed=5, dtype=dtype)
    gathers = []
    real = PartitionedExecutor.global_state
    monkeypatch.setattr(PartitionedExecutor, "global_state", lambda self: gathers.append(1) or real(self))
    sim = _run_both(tmp_path, model, steps=20, every=5, client=client, partitions=partitions, weights=weights)
    assert len(gathers) == 5
    _assert_same_store(tmp_path / "ranks.zarr", tmp_path / "gathered.zarr")
    assert xr.open_zarr(tmp_path / "ranks.zarr")["positions"].dtype == np.dtype(dtype)
    # uneven blocks: the ranks' blocks are not the writers' chunks, the exchange moved bodies
    assert [b - a for a, b in sim.executor.bounds] != [b - a for a, b in writer_ranges(
        model.n, chunk_length(model.n, partitions), partitions)]
    sim.close()


def test_a_field_selection_and_a_bad_field(client, tmp_path):
    model = NBody("plummer", n=40, backend="numpy", seed=2)
    _run_both(tmp_path, model, steps=4, every=2, fields=["positions", "masses"], client=client, partitions=2)
    _assert_same_store(tmp_path / "ranks.zarr", tmp_path / "gathered.zarr")
    assert set(xr.open_zarr(tmp_path / "ranks.zarr").data_vars) == {"positions", "masses"}
    sim = Simulation(model, dt=0.01, stop_steps=2, progress=False, client=client, partitions=2)
    sim.add_writer(ZarrWriter(tmp_path / "bad.zarr", 1, fields=["density"]))
    with pytest.raises(ConfigError, match=r"fields \['density'\] are not outputs"):
        sim.run()
    sim.close()


def test_a_rank_whose_write_fails_fails_the_run_with_its_error(client, tmp_path, monkeypatch):
    model = NBody("plummer", n=40, backend="numpy", seed=2)
    sim = Simulation(model, dt=0.01, stop_steps=6, progress=False, client=client, partitions=2)
    sim.add_writer(ZarrWriter(tmp_path / "run.zarr", 2))

    def swap(dask_worker, broken):
        import hpcgpu.io.particle_zarr as module

        def fail(*args):
            raise OSError("disk full (test)")

        if broken:
            module.original_write_chunks = module._write_chunks
            module._write_chunks = fail
        else:
            module._write_chunks = module.original_write_chunks

    client.run(swap, broken=True)
    try:
        with pytest.raises(OSError, match="disk full"):
            sim.run()
    finally:
        client.run(swap, broken=False)
    sim.close()


def test_a_resumed_md_run_appends_the_snapshots_the_uninterrupted_run_writes(client, tmp_path):
    model = LennardJones(5, temperature=2.0, backend="numpy", seed=4)
    state = model.step(model.initial_state(), 0.005, 20)
    whole = Simulation(model, state, dt=0.005, stop_steps=20, progress=False, client=client, partitions=2)
    whole.add_writer(GatheringZarrWriter(tmp_path / "whole.zarr", Every(5)))
    whole.run()
    whole.close()
    first = Simulation(model, state, dt=0.005, stop_steps=10, progress=False, client=client, partitions=2)
    first.add_writer(ZarrWriter(tmp_path / "parts.zarr", Every(5)))
    first.run(checkpoint=tmp_path / "checkpoints")
    first.close()
    resumed = Simulation.resume(tmp_path / "checkpoints", client=client, partitions=2, stop_steps=20)
    resumed.add_writer(ZarrWriter(tmp_path / "parts.zarr", Every(5), append=True))
    resumed.run()
    resumed.close()
    _assert_same_store(tmp_path / "parts.zarr", tmp_path / "whole.zarr")
    assert list(xr.open_zarr(tmp_path / "parts.zarr")["step"].values) == [0, 5, 10, 15, 20]


def test_snapshots_lost_with_a_worker_are_written_again_after_the_restart(client, tmp_path):
    from hpcgpu.errors import WorkerLost

    model = LennardJones(5, temperature=2.0, backend="numpy", seed=4)
    state = model.step(model.initial_state(), 0.005, 20)
    whole = Simulation(model, state, dt=0.005, stop_steps=20, progress=False, client=client, partitions=2)
    whole.add_writer(GatheringZarrWriter(tmp_path / "whole.zarr", Every(5)))
    whole.run()
    whole.close()

    def lose_snapshot_3(dask_worker, on):
        import hpcgpu.io.particle_zarr as module

        if not on:
            module._write_chunks = module.original_write_chunks
            return
        module.original_write_chunks = write = module._write_chunks
        lost = []

        def lose_once(snapshot, *args):
            if snapshot.index == 3 and not lost:  # the step-15 snapshot, as if its worker died before writing it
                lost.append(1)
                return
            write(snapshot, *args)

        module._write_chunks = lose_once

    raised = []

    def lose_a_worker(sim):
        if sim.step == 17 and not raised:
            raised.append(1)
            raise WorkerLost(f"{sim.name}: a worker was lost during the run (injected)")

    sim = Simulation(model, state, dt=0.005, stop_steps=20, progress=False, client=client, partitions=2)
    sim.add_writer(ZarrWriter(tmp_path / "ranks.zarr", Every(5)))
    sim.add_callback(lose_a_worker, Every(1))
    client.run(lose_snapshot_3, on=True)
    try:
        sim.run(checkpoint=tmp_path / "checkpoints", checkpoint_every=10)
    finally:
        client.run(lose_snapshot_3, on=False)
    assert raised and [r["step"] for r in sim.restarts] == [10]
    sim.close()
    _assert_same_store(tmp_path / "ranks.zarr", tmp_path / "whole.zarr")
