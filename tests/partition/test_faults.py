"""How the client judges a failing epoch: errors told by type, deadlines from the expected time, and the report."""

import asyncio
import concurrent.futures
import time

import pytest

from hpcgpu.errors import CommAborted, CommTimeout, ConfigError, EpochDeadline, WorkerLost
from hpcgpu.partition import faults
from hpcgpu.partition.rank_activity import activity_here, operations_here, recording


def test_lost_workers_are_told_by_the_type_of_the_error_never_by_its_words():
    pytest.importorskip("distributed")
    from distributed.client import FutureCancelledError
    from distributed.comm.core import CommClosedError, FatalCommClosedError
    from distributed.scheduler import KilledWorker

    class Worker:
        address = "tcp://10.0.0.1:4000"

    lost = [KilledWorker("epoch-1", Worker(), 3), CommClosedError("in <TCP (closed)>"), FatalCommClosedError("x"),
            FutureCancelledError("epoch-1", "lost dependencies"), concurrent.futures.CancelledError(),
            asyncio.CancelledError(), WorkerLost("worker gone")]
    assert all(faults.is_lost_worker(error) for error in lost)
    own = [ValueError("the connection was lost"), RuntimeError("step cancelled: KilledWorker"),
           OSError("worker died, left the cluster without a goodbye"), CommAborted("lost"),
           CommTimeout("worker lost")]
    assert not any(faults.is_lost_worker(error) for error in own)


def test_the_root_cause_is_a_rank_own_error_whatever_its_words_then_a_lost_worker_then_a_timeout():
    own = ValueError("the fluid was lost, the step cancelled")
    assert faults.root_cause([CommAborted("aborted"), own]) == (own, "own")
    lost = WorkerLost("gone")
    assert faults.root_cause([CommAborted("aborted"), lost]) == (lost, "lost")
    timeout = CommTimeout("rank 0: no completion")
    assert faults.root_cause([CommAborted("aborted"), timeout]) == (timeout, "comm")
    aborted = CommAborted("aborted")
    assert faults.root_cause([aborted]) == (aborted, "comm")


def test_an_epoch_may_take_ten_times_its_expected_time_and_never_less_than_the_floor():
    assert faults.epoch_deadline(0.5, 60.0) == 60.0
    assert faults.epoch_deadline(30.0, 60.0) == 30.0 * faults.DEADLINE_SLACK
    assert faults.epoch_deadline(None, 5.0, unmeasured=300.0) == 300.0  # the first epoch compiles
    assert "10 times its expected 30 s" in faults.deadline_why(30.0, 60.0, "the default")
    assert "the floor, set by HPCGPU" in faults.deadline_why(0.5, 60.0, faults.DEADLINE_ENV)


def test_the_deadline_floor_comes_from_the_argument_then_the_environment_then_the_default(monkeypatch):
    monkeypatch.delenv(faults.DEADLINE_ENV, raising=False)
    assert faults.deadline_floor() == faults.DEFAULT_DEADLINE_S
    monkeypatch.setenv(faults.DEADLINE_ENV, "7.5")
    assert faults.deadline_floor() == 7.5
    assert faults.deadline_floor(3) == 3.0
    for bad in (0, -1, float("inf"), float("nan"), "soon", True):
        with pytest.raises(ConfigError, match=r"epoch_deadline must be a positive finite number of seconds"):
            faults.deadline_floor(bad)
    monkeypatch.setenv(faults.DEADLINE_ENV, "-2")
    with pytest.raises(ConfigError, match=rf"{faults.DEADLINE_ENV} must be .*got '-2'"):
        faults.deadline_floor()


class _Comm:
    waiting_for = None
    waited_until = 0.0


def test_a_rank_activity_says_what_it_computes_or_waits_for():
    comm = _Comm()
    with recording("s-activity", 1) as activity:
        activity.comm = comm
        activity.set("epoch 7, advancing steps 400 to 416")
        assert operations_here("s-activity") == {1: 1}
        text = activity_here("s-activity")[1]
        assert text.startswith("epoch 7, advancing steps 400 to 416: computing for ")
        comm.waiting_for = ("a message from rank 0 tagged 'halo|3|south'", time.monotonic() - 2.0)
        text = activity_here("s-activity")[1]
        assert "waiting 2.0 s for a message from rank 0 tagged 'halo|3|south'" in text
    assert activity_here("s-activity") == {} and operations_here("s-activity") == {}


def test_the_deadline_error_names_every_rank_not_done_and_what_it_was_doing():
    owner = ["tcp://a:1", "tcp://b:2", "tcp://b:2"]
    pending = {"tcp://a:1": [0], "tcp://b:2": [1, 2]}
    answers = {"tcp://a:1": OSError("timed out"), "tcp://b:2": {2: "epoch 3, advancing steps 8 to 16: computing "
                                                                   "for 9.0 s"}}
    error = faults.deadline_error("run-a: epoch 3 (steps 8 to 16)", 6.0, "the floor", pending, answers, owner)
    assert isinstance(error, EpochDeadline) and error.ranks == (0, 2) and error.deadline == 6.0
    assert "did not answer" in error.doing[0] and "computing for 9.0 s" in error.doing[2]
    text = str(error)
    assert "run-a: epoch 3 (steps 8 to 16) did not finish within its deadline of 6 s" in text
    assert "rank 2 on tcp://b:2: epoch 3, advancing steps 8 to 16: computing" in text
    import pickle

    again = pickle.loads(pickle.dumps(error))  # dask sends errors between processes
    assert again.ranks == error.ranks and again.doing == error.doing and str(again) == text
