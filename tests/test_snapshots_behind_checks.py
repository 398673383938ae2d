"""Snapshots the ranks write run behind their step's health check: the driver does not wait for the check first.

A partitioned run's Zarr snapshots are queued inside the epoch, after the
check of their step (:meth:`hpcgpu.io.ZarrWriter.writes_behind_checks`),
so the queue of epochs flows on through a snapshot; a check that fails
stops the ranks before the snapshot, and the writer cuts it from the store
(:meth:`hpcgpu.io.ZarrWriter.discard_from`).
"""

import uuid

import numpy as np
import pytest

pytest.importorskip("dask")  # a bare GPU image lacks it: skip there
xr = pytest.importorskip("xarray")
pytest.importorskip("zarr")

from _faulty_models import PoisonedRows  # noqa: E402

from hpcgpu import Simulation  # noqa: E402
from hpcgpu.errors import UnstableSimulation  # noqa: E402
from hpcgpu.io import ZarrWriter  # noqa: E402
from hpcgpu.partition.engine import PartitionedExecutor  # noqa: E402
from hpcgpu.workloads.weather import ShallowWater  # noqa: E402


def _blocking_collects(monkeypatch):
    """The executor's step at each collect(block=True): each one empties the queue of epochs."""
    steps = []
    real = PartitionedExecutor.collect

    def collect(self, block=False):
        if block:
            steps.append(self.step)
        return real(self, block)

    monkeypatch.setattr(PartitionedExecutor, "collect", collect)
    return steps


def test_rank_written_snapshots_leave_the_epochs_flowing_and_a_callback_does_not(client, tmp_path, monkeypatch):
    model = ShallowWater("unstable_jet", nx=32, ny=24, backend="numpy")
    blocking = _blocking_collects(monkeypatch)
    sim = Simulation(model, stop_steps=6, progress=False, client=client, partitions=2)
    sim.add_writer(ZarrWriter(tmp_path / "ranks.zarr", 2))
    sim.run()
    assert blocking == [6]  # only the run's end waited: not the snapshots at steps 0, 2 and 4
    assert list(xr.open_zarr(tmp_path / "ranks.zarr")["step"].values) == [0, 2, 4, 6]
    sim.close()

    blocking.clear()
    sim = Simulation(model, stop_steps=6, progress=False, client=client, partitions=2)
    sim.add_callback(lambda s: None, 2)  # a callback sees the state: every check before it must pass first
    sim.run()
    assert blocking[:3] == [0, 2, 4] and blocking[-1] == 6
    sim.close()


@pytest.mark.filterwarnings("ignore:Zarr output.*many small chunks:RuntimeWarning")  # the rows split 18 + 14
def test_a_failed_check_cuts_the_snapshots_queued_behind_it_and_finishes_the_ones_before(client, tmp_path):
    model = PoisonedRows("unstable_jet", nx=32, ny=32, backend="numpy", poison_at=5, token=uuid.uuid4().hex)
    path = tmp_path / "ranks.zarr"
    sim = Simulation(model, dt=100.0, progress=False, client=client, partitions=2, steps_per_task=2)
    sim.add_writer(ZarrWriter(path, 1))  # a snapshot every step: some queued past the failing one
    with pytest.raises(UnstableSimulation) as caught:
        sim.run(steps=40)
    failing = caught.value.step
    assert 0 < failing < 40
    stored = xr.open_zarr(path).load()
    # the snapshots before the failed check, every one whole (derived vorticity included), none after it
    assert list(stored["step"].values) == list(range(failing))
    for name in ("u", "v", "h", "vorticity"):
        assert np.isfinite(stored[name].values).all(), name
    sim.close()

    # the same run in one process writes the same store up to the failing step
    one = PoisonedRows("unstable_jet", nx=32, ny=32, backend="numpy", poison_at=5, token=uuid.uuid4().hex)
    local = Simulation(one.with_backend("numpy"), dt=100.0, progress=False)
    local.add_writer(ZarrWriter(tmp_path / "one.zarr", 1))
    local.run(steps=failing - 1)
    local.close()
    expected = xr.open_zarr(tmp_path / "one.zarr").load()
    for name in ("u", "v", "h", "vorticity"):
        np.testing.assert_array_equal(stored[name].values, expected[name].values, err_msg=name)
