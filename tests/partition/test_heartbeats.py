"""Heartbeats: a worker that falls silent (SIGSTOP keeps its connections open) is found within seconds.

The judgement itself runs on a fake clock; the cluster tests stop a real
worker process with SIGSTOP (its kernel still acknowledges every packet,
so only its silence shows it) on both paths of the communicator, and in
the middle of a partitioned weather run, which must recover from its last
checkpoint on the worker left.

Run as a script, this module times the detection on a larger grid (the
figure in docs/journal.md)::

    python tests/partition/test_heartbeats.py 1024
"""

import json
import os
import pickle
import re
import signal
import sys
import time
import warnings
from types import SimpleNamespace

import numpy as np
import pytest

dask = pytest.importorskip("dask")  # a bare GPU image lacks it: skip there

from hpcgpu import Simulation  # noqa: E402
from hpcgpu.cluster import worker_info  # noqa: E402
from hpcgpu.errors import CommAborted, CommError, ConfigError, PeerLost, WorkerLost  # noqa: E402
from hpcgpu.partition.heartbeats import SILENCE_ENV, SILENCE_S, Heartbeats, silence_seconds  # noqa: E402
from hpcgpu.partition.mailbox import Mailbox  # noqa: E402
from hpcgpu.workloads.weather import ShallowWater  # noqa: E402


# -- the judgement, on a fake clock ---------------------------------------------------------------------
def _beats(boxes, silence=5.0, loop_answers=True):
    found, now = [], [0.0]
    extension = SimpleNamespace(
        live_mailboxes=lambda: list(boxes.items()),
        send_heartbeats=lambda answer: answer() if loop_answers else None,
        peer_silent=lambda *args: found.append(args))
    return Heartbeats(extension, silence=silence, clock=lambda: now[0]), found, now


def _run(beats, now, times):
    for now[0] in times:
        beats.tick()


def test_a_peer_silent_past_the_limit_is_reported_once_and_not_before():
    box = Mailbox(poll=0.0)
    box.heard[1] = 0.0
    beats, found, now = _beats({"s": box})
    _run(beats, now, [1.0, 2.0, 3.0, 4.0, 5.0])
    assert found == []  # 5 s is the limit, not past it
    _run(beats, now, [6.0])
    assert found == [("s", 1, 6.0, 5.0)]
    box.abort("aborted", lost=1)  # what peer_silent does: an aborted session is not judged again
    _run(beats, now, [7.0, 8.0])
    assert len(found) == 1


def test_a_peer_heard_again_in_time_is_not_reported():
    box = Mailbox(poll=0.0)
    beats, found, now = _beats({"s": box})
    for t in range(1, 30):
        box.heard[0] = t - 0.5  # a heartbeat every second
        _run(beats, now, [float(t)])
    assert found == []


def test_a_peer_that_said_goodbye_or_was_never_heard_is_not_watched():
    box = Mailbox(poll=0.0)
    box.heard[1] = 0.0
    box.finished.add(1)
    beats, found, now = _beats({"s": box, "t": Mailbox(poll=0.0)})
    _run(beats, now, [float(t) for t in range(1, 20)])
    assert found == []


def test_this_process_coming_late_gives_every_peer_a_fresh_limit():
    box = Mailbox(poll=0.0)
    box.heard[1] = 0.0
    beats, found, now = _beats({"s": box})
    _run(beats, now, [1.0, 9.0])  # this worker itself was stopped 8 s: what it did not read is not rank 1's fault
    assert found == []
    _run(beats, now, [10.0, 11.0, 12.0, 13.0, 14.0])
    assert found == []
    _run(beats, now, [15.0])
    assert found == [("s", 1, 15.0, 5.0)]


def test_an_event_loop_that_does_not_answer_holds_the_judgement():
    box = Mailbox(poll=0.0)
    box.heard[1] = 0.0
    beats, found, now = _beats({"s": box}, loop_answers=False)  # dask's streams are read on that loop
    _run(beats, now, [float(t) for t in range(1, 30)])
    assert found == []


def test_a_limit_of_zero_judges_nobody():
    box = Mailbox(poll=0.0)
    box.heard[1] = 0.0
    beats, found, now = _beats({"s": box}, silence=0.0)
    _run(beats, now, [float(t) for t in range(1, 30)])
    assert found == []


def test_the_silence_limit_setting_is_checked(monkeypatch):
    monkeypatch.delenv(SILENCE_ENV, raising=False)
    assert silence_seconds() == SILENCE_S
    for text, value in (("0", 0.0), ("12.5", 12.5)):
        monkeypatch.setenv(SILENCE_ENV, text)
        assert silence_seconds() == value
    for text in ("1", "-5", "abc", "1e9"):
        monkeypatch.setenv(SILENCE_ENV, text)
        with pytest.raises(ConfigError, match=rf"{SILENCE_ENV} must be 0 \(off\) or a number of seconds from 3 to "
                                              rf"3600; got '{re.escape(text)}'"):
            silence_seconds()


def test_a_silence_abort_raises_peer_lost_a_lost_worker_that_pickles():
    box = Mailbox(poll=0.0)
    box.abort("worker w heard nothing from rank 1", lost=1)
    with pytest.raises(PeerLost, match="rank 0: the run was aborted while waiting for a halo: worker w heard") as info:
        box.take(0, 1, "halo", timeout=5.0, describe="a halo")
    error = pickle.loads(pickle.dumps(info.value))  # as dask brings it to the client
    assert type(error) is PeerLost and error.rank == 0
    assert isinstance(error, WorkerLost) and isinstance(error, CommError) and not isinstance(error, CommAborted)
    other = Mailbox(poll=0.0)
    other.abort("rank 1 failed")
    assert type(other.failure(0)) is CommAborted


# -- a stopped worker on a real cluster ---------------------------------------------------------------
def _stop_worker(client, address):
    pid = client.run(os.getpid, workers=[address])[address]
    os.kill(pid, signal.SIGSTOP)
    return pid, time.monotonic()


def _bury(client, pid):
    """SIGKILL the stopped worker (its nanny starts a new one) and wait for two workers again."""
    os.kill(pid, signal.SIGKILL)
    with dask.config.set({"distributed.deploy.lost-worker-timeout": "1h"}):
        client.wait_for_workers(2, timeout=90)
    deadline = time.monotonic() + 30
    while len(worker_info(client)) < 2 and time.monotonic() < deadline:
        time.sleep(0.2)


def _wait_for_the_stopped(session, rank):
    from hpcgpu.partition.dask_communicator import communicator

    comm = communicator(session, rank)
    comm.barrier()  # both ways connected: each worker has heard the other
    if rank == 1:
        time.sleep(120)  # stopped in here
        return None
    started = time.monotonic()
    try:
        comm.recv(1, "never")
    except CommError as error:
        return type(error).__name__, str(error), time.monotonic() - started
    return None


@pytest.mark.parametrize("direct", [True, False], ids=["direct", "dask"])
def test_a_stopped_worker_is_found_within_seconds_and_removed_by_the_scheduler(client, direct):
    from hpcgpu.partition.dask_session import close_session, open_session

    addresses = sorted(worker_info(client))
    session = open_session(client, addresses, timeout=120, direct=direct)
    assert bool(session.direct) == direct
    futures = [client.submit(_wait_for_the_stopped, session, rank, workers=[address], allow_other_workers=False,
                             pure=False) for rank, address in enumerate(addresses)]
    pid = None
    try:
        time.sleep(2.0)  # the barrier is done and a few heartbeats went both ways
        pid, stopped_at = _stop_worker(client, addresses[1])
        kind, message, waited = futures[0].result(timeout=60)
        found_after = time.monotonic() - stopped_at
        assert kind == "PeerLost", message
        assert f"heard nothing from rank 1 (worker {addresses[1]})" in message and "taken as lost" in message
        assert found_after < 10, f"found {found_after:.1f} s after the stop (the rank timeout is 120 s)"
        deadline = time.monotonic() + 10
        while addresses[1] in worker_info(client) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert addresses[1] not in worker_info(client), "the scheduler kept the stopped worker"
    finally:
        futures[1].cancel()
        if pid is not None:
            _bury(client, pid)
        close_session(client, session)


def _quiet_then_send(session, rank, quiet):
    from hpcgpu.partition.dask_communicator import communicator

    comm = communicator(session, rank)
    comm.barrier()
    if rank == 1:
        time.sleep(quiet)  # alive, just sending nothing (the GIL released, as in a GPU wait or I/O)
        comm.send("late", 0, "late")
        return None
    return comm.recv(1, "late")


@pytest.mark.parametrize("direct", [True, False], ids=["direct", "dask"])
def test_a_live_peer_that_sends_nothing_for_longer_than_the_limit_is_not_taken_for_lost(client, direct):
    from hpcgpu.partition.dask_session import close_session, open_session

    addresses = sorted(worker_info(client))
    session = open_session(client, addresses, timeout=60, direct=direct)
    try:
        futures = [client.submit(_quiet_then_send, session, rank, 2 * SILENCE_S, workers=[address],
                                 allow_other_workers=False, pure=False) for rank, address in enumerate(addresses)]
        assert client.gather(futures) == ["late", None]  # the heartbeats spoke for rank 1 meanwhile
    finally:
        close_session(client, session)


def test_the_scheduler_keeps_a_worker_it_still_hears_from(client):
    from hpcgpu.partition.dask_session import close_session, open_session

    addresses = sorted(worker_info(client))
    session = open_session(client, addresses, timeout=60)  # installs the scheduler plugin
    try:
        # a network split between the workers only: one says the other is silent, the scheduler hears both
        answer = client.sync(client.scheduler.hpcgpu_comm_silent, reporter=addresses[0], silent=addresses[1],
                             seconds=6.0, session=session.id)
        assert answer == "kept"
        assert sorted(worker_info(client)) == addresses
    finally:
        close_session(client, session)


# -- a stopped worker in the middle of a partitioned run --------------------------------------------------
def freeze_and_recover(client, n, steps, stop_at, checkpoint_every, folder):
    """Run weather ``n`` x ``n`` on 2 workers, SIGSTOP one at step ``stop_at``; seconds to detect, and the run."""
    model = ShallowWater("unstable_jet", nx=n, ny=n, backend="numba")
    sim = Simulation(model, stop_steps=steps, progress=False, client=client, partitions=2)
    stopped, recovered = {}, {}

    def stop_one(simulation):
        if simulation.step == stop_at and not stopped:
            address = sorted(worker_info(client))[-1]
            stopped["pid"], stopped["at"] = _stop_worker(client, address)

    recover = type(sim)._recover

    def timed_recover(self, error, max_restarts):
        recovered.setdefault("at", time.monotonic())
        recovered.setdefault("error", f"{type(error).__name__}: {error}")
        return recover(self, error, max_restarts)

    sim._recover = timed_recover.__get__(sim)
    sim.add_callback(stop_one, checkpoint_every // 2)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            sim.run(checkpoint=folder, checkpoint_every=checkpoint_every)
    finally:
        if "pid" in stopped:
            _bury(client, stopped["pid"])
    restarted = [str(w.message) for w in caught if "restarted from the checkpoint" in str(w.message)]
    detected = recovered["at"] - stopped["at"] if "at" in recovered else None
    return sim, detected, restarted, recovered.get("error")


def test_a_worker_stopped_mid_run_is_found_within_10_s_and_the_run_recovers_on_the_worker_left(client, tmp_path):
    n, steps = 64, 400
    reference = Simulation(ShallowWater("unstable_jet", nx=n, ny=n, backend="numba"), stop_steps=steps,
                           progress=False).run()
    sim, detected, restarted, error = freeze_and_recover(client, n, steps, stop_at=250, checkpoint_every=100,
                                                         folder=tmp_path)
    try:
        assert detected is not None and detected < 10, f"detected after {detected} s: {error}"
        assert error.startswith("WorkerLost"), error  # the engine's words: the peer's PeerLost, or the removal
        assert len(restarted) == 1 and "restarted from the checkpoint at step 200 on 1 worker(s)" in restarted[0]
        assert sim.step == steps and sim.restarts[0]["workers"] == 1
        np.testing.assert_array_equal(sim.state.h, reference.state.h)  # rows: bitwise on any count
        np.testing.assert_array_equal(sim.state.u, reference.state.u)
    finally:
        sim.close()


if __name__ == "__main__":  # the timing of docs/journal.md: python tests/partition/test_heartbeats.py 1024
    import tempfile

    from hpcgpu.cluster import start_cluster

    size = int(sys.argv[1]) if len(sys.argv) > 1 else 1024
    cluster_client = start_cluster(workers=2, threads_per_worker=1, gpus=False, quiet=True)
    with tempfile.TemporaryDirectory() as scratch:
        started = time.perf_counter()
        run, seconds, restarts, cause = freeze_and_recover(cluster_client, size, 200, 125, 50, scratch)
        print(json.dumps({"case": f"weather {size}x{size}, 2 workers, SIGSTOP at step 125", "detected_s":
                          round(seconds, 2), "restarts": len(restarts), "steps": run.step,
                          "wall_s": round(time.perf_counter() - started, 1), "cause": cause[:200]}))
        run.close()
    cluster_client.close()
