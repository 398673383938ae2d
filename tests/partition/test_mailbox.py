"""The mailbox a rank waits on: it polls for a message before it sleeps, and the poll keeps every wait's promises."""

import threading
import time

import pytest

from hpcgpu.errors import CommAborted, CommTimeout, ConfigError
from hpcgpu.partition.mailbox import POLL_ENV, POLL_SECONDS, Mailbox, poll_seconds


def _later(seconds, action):
    thread = threading.Thread(target=lambda: (time.sleep(seconds), action()), daemon=True)
    thread.start()
    return thread


def test_a_polling_rank_sees_a_message_that_arrives_without_a_wake_up():
    # filed without notify: only the poll can see it (a sleeping rank would wait for its timeout)
    box = Mailbox(poll=2.0)
    _later(0.05, lambda: box.queues[0, 1, "halo"].append("ghosts"))
    started = time.perf_counter()
    assert box.take(0, 1, "halo", timeout=10.0, describe="a message") == "ghosts"
    assert time.perf_counter() - started < 1.5


def test_a_rank_that_does_not_poll_sleeps_until_it_is_woken():
    box = Mailbox(poll=0.0)
    _later(0.05, lambda: box.queues[0, 1, "halo"].append("ghosts"))
    started = time.perf_counter()
    # it looks again only when its wait ends: at the deadline, where it finds the message
    assert box.take(0, 1, "halo", timeout=0.4, describe="a message") == "ghosts"
    assert time.perf_counter() - started >= 0.39


def test_a_woken_rank_takes_its_message_after_the_poll_ran_out():
    box = Mailbox(poll=0.01)
    _later(0.1, lambda: box.put(0, 1, "halo", "ghosts"))
    assert box.take(0, 1, "halo", timeout=10.0, describe="a message") == "ghosts"


def test_an_abort_ends_the_poll_at_once():
    box = Mailbox(poll=5.0)
    _later(0.05, lambda: setattr(box, "aborted", "rank 1 failed"))
    started = time.perf_counter()
    with pytest.raises(CommAborted, match="rank 1 failed"):
        box.take(0, 1, "halo", timeout=30.0, describe="a message")
    assert time.perf_counter() - started < 2.0


def test_the_poll_never_outlasts_the_timeout():
    box = Mailbox(poll=5.0)
    started = time.perf_counter()
    with pytest.raises(CommTimeout):
        box.take(0, 1, "halo", timeout=0.1, describe="a message")
    assert time.perf_counter() - started < 2.0


def test_poll_seconds_come_from_the_environment_or_the_default(monkeypatch):
    monkeypatch.delenv(POLL_ENV, raising=False)
    assert poll_seconds() == POLL_SECONDS
    assert Mailbox().poll == POLL_SECONDS
    monkeypatch.setenv(POLL_ENV, "0.0025")
    assert poll_seconds() == 0.0025
    monkeypatch.setenv(POLL_ENV, "0")
    assert Mailbox().poll == 0.0


@pytest.mark.parametrize("text", ["soon", "-0.001", "2", "nan", ""])
def test_a_bad_poll_setting_is_a_config_error_that_names_it(monkeypatch, text):
    monkeypatch.setenv(POLL_ENV, text)
    with pytest.raises(ConfigError, match=f"{POLL_ENV} must be a number of seconds between 0 and 1"):
        poll_seconds()


def test_a_bad_poll_setting_stops_the_rank_with_its_name_and_never_a_delivery(monkeypatch):
    from hpcgpu.partition.dask_communicator import Session, communicator

    monkeypatch.setenv(POLL_ENV, "forever")
    # a message's thread makes mailboxes too: it must not raise, the rank does
    assert Mailbox().poll == POLL_SECONDS
    session = Session("s", ("tcp://127.0.0.1:1",))
    with pytest.raises(ConfigError, match=POLL_ENV):
        communicator(session, 0)


def _extension():
    from types import SimpleNamespace

    from hpcgpu.partition.comm_extension import CommExtension

    return CommExtension(SimpleNamespace(address="tcp://127.0.0.1:1", handlers={}, stream_handlers={}))


def test_what_reaches_a_closed_session_makes_no_mailbox_and_the_memory_of_closes_is_bounded(monkeypatch):
    from hpcgpu.partition import comm_extension

    monkeypatch.setattr(comm_extension, "CLOSED_SESSIONS_KEPT", 3)
    extension = _extension()
    extension.mailbox("old").put(0, 1, "t", "x")
    extension.forget("old")
    extension.abort_from_scheduler(session="old", reason="a worker left")
    extension._deliver("old", 0, 1, "late", "message")
    extension._finished("old", 1)
    extension.spread_abort("old", 0, "bad message")
    assert extension.sessions() == []
    with pytest.raises(CommAborted, match="session old was closed"):
        extension.mailbox("old").take(0, 1, "t", timeout=5, describe="a message")
    for k in range(5):
        extension.forget(f"s{k}")
    assert list(extension._closed) == ["s2", "s3", "s4"]


def test_encode_keeps_byte_order_layout_and_takes_what_only_cloudpickle_can():
    import numpy as np

    from hpcgpu.partition.direct_comm import decode, encode

    def round_trip(obj):
        data, buffers = encode(obj)
        return decode(data, [bytearray(b) for b in buffers])

    big_endian = np.arange(12.0).astype(">f8").reshape(3, 4)
    for array in (big_endian[:, ::2], big_endian[::2], np.asfortranarray(big_endian), big_endian.T[::2]):
        back = round_trip({"a": (array, 1)})["a"][0]
        assert back.dtype == array.dtype and back.shape == array.shape and np.array_equal(back, array)
    assert round_trip(lambda x: x * 3)(2) == 6
