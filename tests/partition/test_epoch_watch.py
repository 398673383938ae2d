"""The client's waits on a run's epochs: a deadline on each, errors told by type, no rank left running."""

import time
import uuid

import pytest

dask = pytest.importorskip("dask")  # a bare GPU image lacks it: skip there

from hpcgpu import Simulation  # noqa: E402
from hpcgpu.errors import ClusterError, CommAborted, EpochDeadline, WorkerLost  # noqa: E402
from hpcgpu.partition import epoch_watch  # noqa: E402
from hpcgpu.partition.engine import PartitionedExecutor  # noqa: E402
from hpcgpu.partition.faults import DEADLINE_ENV  # noqa: E402
from hpcgpu.partition.worker_ranks import abort_session_here  # noqa: E402


def _executing(dask_worker):
    return dask_worker.state.executing_count  # cancelled tasks still running included (the scheduler forgot them)


def _idle_within(client, seconds):
    """Whether no task runs on any worker within ``seconds``."""
    deadline = time.monotonic() + seconds
    while any(client.run(_executing).values()) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not any(client.run(_executing).values())


def test_a_rank_stuck_in_compute_ends_the_run_at_its_deadline_naming_what_each_rank_did(client, tmp_path,
                                                                                        monkeypatch):
    from _faulty_models import StuckRows

    floor = 3.0
    monkeypatch.setenv(DEADLINE_ENV, str(floor))  # the client's setting
    release = tmp_path / "release"
    # rank 1 (rows 20 to 39) hangs in its 40th block advance, well after the first epoch measured the speed
    model = StuckRows("unstable_jet", nx=16, ny=40, backend="numpy", stuck_row=30, stuck_at=40,
                      release=str(release), token=uuid.uuid4().hex)
    sim = Simulation(model, dt=100.0, stop_steps=100_000, progress=False, client=client, partitions=2,
                     steps_per_task=2)
    try:
        started = time.monotonic()
        with pytest.raises(EpochDeadline) as info:
            sim.run()
        took = time.monotonic() - started
        error = info.value
        # the floor, or ten times the epoch's expected time (epochs of about half a second: a few seconds)
        assert floor <= error.deadline < 30 and took < error.deadline + 8, f"detected after {took:.1f} s"
        assert error.ranks == (0, 1)
        assert "computing for" in error.doing[1], error.doing
        assert "waiting" in error.doing[0] and "from rank 1" in error.doing[0], error.doing
        assert "advancing steps" in error.doing[1]
        assert f"did not finish within its deadline of {error.deadline:.3g} s" in str(error)
        assert DEADLINE_ENV in str(error)
        assert not sim.restarts  # a stuck rank is not a lost worker: nothing restarts from it
        # rank 0 was released by the abort at once; rank 1 runs until its kernel returns
        time.sleep(1.0)
        running = client.run(_executing)
        assert [running[worker] for worker in sim._executor.owner] == [0, 1]
    finally:
        release.touch()
        sim.close()
    assert _idle_within(client, 10), "the stuck rank still runs after its release"


def test_a_rank_error_whose_words_say_lost_is_raised_once_as_its_own(client, tmp_path):
    from _faulty_models import LostWordsRows

    attempts = tmp_path / "attempts"
    model = LostWordsRows("unstable_jet", nx=16, ny=40, backend="numpy", fail_row=30, fail_after=30,
                          attempts=str(attempts))
    sim = Simulation(model, dt=100.0, stop_steps=2000, progress=False, client=client, partitions=2,
                     steps_per_task=2)
    try:
        with pytest.raises(ValueError, match="the mass of the lost fluid is not conserved: step cancelled"):
            sim.run(checkpoint=tmp_path / "checkpoints", checkpoint_every=20)  # a WorkerLost would restart
    finally:
        sim.close()
    assert len(attempts.read_text().splitlines()) == 1  # raised once, never retried from the checkpoint
    assert not sim.restarts


def _aborted_run(client, monkeypatch, gone):
    from _faulty_models import SlowRows

    model = SlowRows("unstable_jet", nx=16, ny=40, backend="numpy", pause=0.02)
    executor = PartitionedExecutor(client, model, model.initial_state(), 100.0, partitions=2, steps_per_task=2)
    monkeypatch.setattr(epoch_watch, "ROOT_CAUSE_WAIT_S", 0.2)
    executor.advance(2000)  # 1000 block advances: 20 s a rank
    executor.collect()
    time.sleep(0.2)
    # every rank aborted (as the scheduler plugin does for a lost worker), no rank's own error behind it
    client.run(abort_session_here, executor.session.id, "aborted by the test", workers=executor.owner)
    if gone:  # and the scheduler no longer lists the second worker
        monkeypatch.setattr(epoch_watch, "worker_info", lambda c: {executor.owner[0]: {}})
    return executor


def test_ranks_aborted_with_no_worker_gone_are_not_a_lost_worker(client, monkeypatch):
    executor = _aborted_run(client, monkeypatch, gone=False)
    with pytest.raises(CommAborted, match="aborted by the test") as info:
        executor.synchronize()
    assert not isinstance(info.value, WorkerLost)
    assert not executor.usable
    executor.close()


def test_ranks_aborted_because_a_worker_left_are_a_lost_worker(client, monkeypatch):
    executor = _aborted_run(client, monkeypatch, gone=True)
    with pytest.raises(WorkerLost, match=f"{executor.owner[1]} left the cluster.*CommAborted"):
        executor.synchronize()
    executor.close()


def test_closing_a_failed_run_aborts_the_ranks_it_left_running(client, monkeypatch):
    from _faulty_models import SlowRows

    model = SlowRows("unstable_jet", nx=16, ny=40, backend="numpy", pause=0.02)
    executor = PartitionedExecutor(client, model, model.initial_state(), 100.0, partitions=2, steps_per_task=2)
    monkeypatch.setattr(epoch_watch, "_POLL_S", 0.05)
    executor.advance(2000)  # 20 s a rank
    executor.collect()
    time.sleep(0.2)
    # the client sees the second worker gone: the run fails, and only the first worker is aborted
    monkeypatch.setattr(epoch_watch, "worker_info", lambda c: {executor.owner[0]: {}})
    with pytest.raises(WorkerLost, match="left the cluster"):
        executor.synchronize()
    monkeypatch.undo()
    assert client.run(_executing)[executor.owner[1]] == 1, "the second worker's rank should still run here"
    started = time.monotonic()
    executor.close()
    assert _idle_within(client, 5), "a rank of the failed run still runs after close"
    assert time.monotonic() - started < 8
    with pytest.raises(ClusterError, match="after the run was closed"):
        executor.advance(2)


def test_a_worker_killed_after_its_task_finished_ends_the_gather_as_a_lost_worker(client):
    """Finished results on a worker that dies are lost, and their pinned task would wait for it forever."""
    import os
    import signal

    from hpcgpu.cluster import worker_info

    victim = sorted(worker_info(client))[1]
    future = client.submit(lambda: list(range(1000)), workers=[victim], allow_other_workers=False, pure=False)
    future.result(timeout=30)
    abandoned = []
    watch = epoch_watch.EpochWatch(client, None, [victim], "gather-test",
                                   lambda futures, reason: (abandoned.append(reason), client.cancel(futures)))
    pid = client.run(os.getpid, workers=[victim])[victim]
    try:
        os.kill(pid, signal.SIGKILL)
        started = time.monotonic()
        with pytest.raises(WorkerLost, match="gather-test: a worker was lost during the run"):
            watch.gather([future])
        assert time.monotonic() - started < 30 and abandoned
    finally:
        client.wait_for_workers(2, timeout=60)
