"""The communicator contract: what every transport must do, run here on dask's comm layer.

Each test runs a function on every rank of a session (one pinned task per
rank, as an epoch does) on a real two-worker LocalCluster, and checks what
the ranks saw. The NCCL transport takes the same contract in the GPU tier
(tests/partition/test_nccl.py).
"""

import os
import signal
import time
from dataclasses import dataclass

import numpy as np
import pytest

from hpcgpu.cluster import worker_info
from hpcgpu.errors import CommAborted, CommTimeout, ConfigError
from hpcgpu.partition.communicator import LoopbackCommunicator, tag_key
from hpcgpu.partition.dask_communicator import communicator
from hpcgpu.partition.dask_session import close_session, open_session


def _on_ranks(client, session, function, *args, timeout=120):
    """Run ``function(comm, *args)`` on every rank (a task each, pinned to its worker); results in rank order."""
    futures = [client.submit(_rank_task, session, rank, function, *args, workers=[address],
                             allow_other_workers=False, pure=False)
               for rank, address in enumerate(session.addresses)]
    return client.gather(futures), futures


def _rank_task(session, rank, function, *args):
    if sum(1 for a in session.addresses if a == session.addresses[rank]) > 1:
        raise AssertionError("use _on_shared_ranks for several ranks on one worker")
    return function(communicator(session, rank), *args)


@pytest.fixture(params=["direct", "dask"])
def session(client, request):
    """A session on each path: the direct sockets (tcp/tls clusters) and dask's comm layer (all others)."""
    session = open_session(client, sorted(worker_info(client)), timeout=30, direct=request.param == "direct")
    assert bool(session.direct) == (request.param == "direct")
    yield session
    close_session(client, session)


# -- point to point --------------------------------------------------------------------------------
def _ping_pong(comm, rounds):
    other = 1 - comm.rank
    got = []
    for k in range(rounds):
        if comm.rank == 0:
            comm.send(np.full(3, k), other, ("ping", k))
            got.append(comm.recv(other, ("pong", k)).tolist())
        else:
            value = comm.recv(other, ("ping", k))
            comm.send(value * 10, other, ("pong", k))
            got.append(value.tolist())
    return comm.rank, comm.size, got


def test_ranks_message_each_other_directly(client, session):
    results, _ = _on_ranks(client, session, _ping_pong, 5)
    assert [r[:2] for r in results] == [(0, 2), (1, 2)]
    assert results[0][2] == [[10 * k] * 3 for k in range(5)]
    assert results[1][2] == [[k] * 3 for k in range(5)]


def _out_of_order(comm):
    if comm.rank == 0:
        requests = [comm.isend(f"{tag}-{k}", 1, tag) for k in range(20) for tag in ("a", "b")]
        comm.waitall(requests)
        return None
    b_first = [comm.recv(0, "b") for _ in range(20)]  # every "a" is waiting meanwhile
    return b_first, [comm.recv(0, "a") for _ in range(20)]


def test_tags_are_matched_and_each_tag_keeps_its_order(client, session):
    results, _ = _on_ranks(client, session, _out_of_order)
    b_first, a_later = results[1]
    assert b_first == [f"b-{k}" for k in range(20)] and a_later == [f"a-{k}" for k in range(20)]


def _burst(comm, count):
    if comm.rank == 0:
        comm.waitall([comm.isend(k, 1, "burst") for k in range(count)])
        return None
    return [comm.recv(0, "burst") for _ in range(count)]


@pytest.mark.parametrize("direct", [False, True], ids=["dask", "direct"])
def test_a_burst_on_fresh_streams_arrives_in_order(client, direct):
    """The first sends of a session race the opening of its stream: none may overtake another."""
    for _ in range(4):
        session = open_session(client, sorted(worker_info(client)), timeout=30, direct=direct)
        try:
            results, _ = _on_ranks(client, session, _burst, 200)
        finally:
            close_session(client, session)
        assert results[1] == list(range(200))


@dataclass(frozen=True)
class _Payload:
    name: str
    values: object


def _round_trip(comm, payloads):
    other = 1 - comm.rank
    if comm.rank == 0:
        for k, payload in enumerate(payloads):
            comm.send(payload, other, k)
        return [comm.recv(other, ("back", k)) for k in range(len(payloads))]
    for k in range(len(payloads)):
        comm.send(comm.recv(other, k), other, ("back", k))
    return None


def test_arrays_of_every_dtype_and_size_and_objects_arrive_unchanged(client, session, rng):
    payloads = [rng.standard_normal(size).astype(dtype) for dtype in ("float32", "float64") for size in (0, 1, 1000)]
    payloads += [rng.integers(-5, 5, (3, 7)).astype(np.int64), rng.random((4, 5))[:, 1::2],
                 rng.random(1 << 20), _Payload("state", rng.random((3, 11))), {"n": 3, "x": [1.5, None]}]
    results, _ = _on_ranks(client, session, _round_trip, payloads)
    for sent, back in zip(payloads, results[0]):
        if isinstance(sent, np.ndarray):
            assert back.dtype == sent.dtype and back.shape == sent.shape and np.array_equal(back, sent)
        elif isinstance(sent, _Payload):
            assert back.name == sent.name and np.array_equal(back.values, sent.values)
        else:
            assert back == sent


def _nonblocking(comm):
    other = 1 - comm.rank
    receive = comm.irecv(other, "late")
    early = receive.done()
    comm.barrier()
    send = comm.isend(comm.rank, other, "late")
    value = receive.wait(10)
    send.wait(10)
    return early, value


def test_a_receive_is_pending_until_its_message_arrives(client, session):
    results, _ = _on_ranks(client, session, _nonblocking)
    assert results == [(False, 1), (False, 0)]


# -- collectives -------------------------------------------------------------------------------------------
def _collectives(comm, values):
    mine = values[comm.rank]
    out = {op: comm.allreduce(mine, op) for op in ("sum", "max", "min")}
    out["any"] = comm.allreduce(comm.rank == 1, "any")
    out["all"] = comm.allreduce(comm.rank == 1, "all")
    out["array"] = comm.allreduce(np.array([mine, -mine]), "sum")
    out["allgather"] = comm.allgather((comm.rank, mine))
    out["gather"] = comm.gather(comm.rank * 2)
    out["bcast"] = comm.bcast("from root" if comm.rank == 0 else None)
    comm.barrier()
    return out


def test_collectives_give_every_rank_the_same_result_combined_in_rank_order(client, session, rng):
    values = [float(v) for v in rng.standard_normal(2) * 1e8 + 0.1]
    results, _ = _on_ranks(client, session, _collectives, values)
    total = values[0] + values[1]
    for rank, out in enumerate(results):
        assert out["sum"] == total and out["max"] == max(values) and out["min"] == min(values)
        assert out["any"] is True and out["all"] is False
        np.testing.assert_array_equal(out["array"], [total, -total])
        assert out["allgather"] == [(0, values[0]), (1, values[1])]
        assert out["gather"] == ([0, 2] if rank == 0 else None)
        assert out["bcast"] == "from root"


def _neighbour_exchange(comm):
    left, right = (comm.rank - 1) % comm.size, (comm.rank + 1) % comm.size
    sends = {right: f"{comm.rank}->{right}"} if left == right else {left: f"{comm.rank}->{left}",
                                                                      right: f"{comm.rank}->{right}"}
    return comm.exchange(sends, sorted({left, right}))


def test_neighbours_exchange_without_waiting_on_each_others_order(client, session):
    results, _ = _on_ranks(client, session, _neighbour_exchange)
    assert results == [{1: "1->0"}, {0: "0->1"}]


def test_a_group_of_one_keeps_its_own_values():
    comm = LoopbackCommunicator()
    assert comm.allreduce(2.5, "max") == 2.5 and comm.allgather([1]) == [[1]] and comm.gather(4) == [4]
    assert comm.bcast("x") == "x" and comm.allreduce(True, "all") is True
    comm.barrier()
    with pytest.raises(ConfigError, match="dest must be a rank in 0..0"):
        comm.isend(1, 1, "t")
    comm.abort("stop")
    with pytest.raises(CommAborted, match="stop"):
        comm.check()


# -- several ranks on one worker ----------------------------------------------------------------------
def _allgather_and_allreduce(comm):
    return comm.allgather(comm.rank), comm.allreduce(comm.rank, "sum")


def test_ranks_that_share_a_worker_message_each_other_and_the_others(client):
    workers = sorted(worker_info(client))
    addresses = [workers[0], workers[1], workers[0]]  # ranks 0 and 2 on one worker
    session = open_session(client, addresses, timeout=30)
    try:
        assert _on_shared_ranks(client, session, _allgather_and_allreduce) == {r: ([0, 1, 2], 3) for r in range(3)}
    finally:
        close_session(client, session)


# -- faults: timeouts, aborts, lost workers --------------------------------------------------------
def _wait_for_nothing(comm, timeout):
    started = time.monotonic()
    try:
        comm.recv(1 - comm.rank, "never", timeout=timeout)
    except CommTimeout as error:
        return str(error), time.monotonic() - started
    return None, time.monotonic() - started


def test_a_wait_past_its_timeout_names_the_peer_and_the_tag(client, session):
    results, _ = _on_ranks(client, session, _wait_for_nothing, 0.3)
    for rank, (message, waited) in enumerate(results):
        assert message is not None and f"rank {rank}" in message and f"rank {1 - rank}" in message
        assert "'never'" in message and 0.3 <= waited < 5


def _one_rank_fails(comm):
    if comm.rank == 1:
        time.sleep(0.5)
        comm.abort("ValueError: rank 1 broke")
        raise ValueError("rank 1 broke")
    started = time.monotonic()
    try:
        comm.recv(1, "never")  # the session's timeout is 30 s
    except CommAborted as error:
        return str(error), time.monotonic() - started
    return None, time.monotonic() - started


def test_an_abort_ends_every_ranks_wait_at_once_and_names_the_cause(client, session):
    _, futures = _on_ranks_quiet(client, session, _one_rank_fails)
    message, waited = futures[0].result(timeout=60)
    assert "rank 1 aborted: ValueError: rank 1 broke" in message
    assert waited < 5, f"rank 0 waited {waited:.1f} s (its timeout is 30 s)"
    with pytest.raises(ValueError, match="rank 1 broke"):
        futures[1].result(timeout=60)


def _on_ranks_quiet(client, session, function, *args):
    futures = [client.submit(_rank_task, session, rank, function, *args, workers=[address],
                             allow_other_workers=False, pure=False)
               for rank, address in enumerate(session.addresses)]
    return None, futures


def _wait_for_the_lost(comm):
    if comm.rank == 1:
        time.sleep(60)  # killed before this ends
        return None
    started = time.monotonic()
    try:
        comm.recv(1, "never")
    except CommAborted as error:
        return str(error), time.monotonic() - started
    return None, time.monotonic() - started


def test_a_lost_worker_aborts_the_ranks_that_wait_for_it(client, session):
    _, futures = _on_ranks_quiet(client, session, _wait_for_the_lost)
    time.sleep(1.0)
    pid = client.run(os.getpid, workers=[session.addresses[1]])[session.addresses[1]]
    os.kill(pid, signal.SIGKILL)
    message, waited = futures[0].result(timeout=60)
    assert message is not None and ("left the cluster" in message or "without a goodbye" in message), message
    assert waited < 20, f"rank 0 waited {waited:.1f} s (its timeout is 30 s)"
    futures[1].cancel()
    client.wait_for_workers(2, timeout=60)


# -- bad input -----------------------------------------------------------------------------------------
def _bad_calls(comm):
    errors = []
    for call in (lambda: comm.isend(1, 5, "t"), lambda: comm.isend(1, comm.rank, "t"),
                 lambda: comm.irecv(-1, "t"), lambda: comm.isend(1, 1 - comm.rank, 2.5),
                 lambda: comm.allreduce(1, "mean")):
        try:
            call()
        except ConfigError as error:
            errors.append(str(error))
    comm.barrier()
    return errors


def test_bad_arguments_are_config_errors_that_name_them(client, session):
    results, _ = _on_ranks(client, session, _bad_calls)
    errors = results[0]
    assert len(errors) == 5
    assert "dest must be a rank in 0..1; got 5" in errors[0] and "is this rank itself" in errors[1]
    assert "source must be a rank" in errors[2] and "tag must be a str" in errors[3] and "op must be" in errors[4]


def test_tags_travel_as_strings():
    assert tag_key(("halo", 2)) == "halo|2" and tag_key("x") == "x"
    with pytest.raises(ConfigError):
        tag_key(None)


def test_a_tls_cluster_talks_over_its_own_certificates():
    """On tls:// the direct path wraps its sockets with the cluster's TLS contexts; the dask path is TLS anyway."""
    from hpcgpu.cluster import close_client, start_cluster

    client = start_cluster(workers=2, threads_per_worker=1, gpus=False, dashboard_address="127.0.0.1:0", tls=True,
                     quiet=True)
    try:
        for direct in (True, False):
            session = open_session(client, sorted(worker_info(client)), timeout=30, direct=direct)
            try:
                assert all(session.addresses) and bool(session.direct) == direct
                results, _ = _on_ranks(client, session, _ping_pong, 3)
                assert results[0][2] == [[10 * k] * 3 for k in range(3)]
            finally:
                close_session(client, session)
    finally:
        close_client(client)


def _messages_of(session_id, dask_worker=None):
    from hpcgpu.partition.comm_extension import EXTENSION

    box = dask_worker.extensions[EXTENSION].mailbox(session_id)
    return sum(len(q) for q in box.queues.values()), box.aborted


def test_the_direct_path_refuses_a_plain_connection_on_tls():
    """A frame sent in the clear to a tls:// worker's direct listener is never delivered."""
    import pickle
    import socket
    import struct

    from hpcgpu.cluster import close_client, start_cluster
    from hpcgpu.partition.direct_comm import encode

    def _direct_listener(dask_worker=None):
        from hpcgpu.partition.comm_extension import worker_extension

        return worker_extension(dask_worker).listener().address

    secure = start_cluster(workers=1, threads_per_worker=1, gpus=False, dashboard_address="127.0.0.1:0", tls=True,
                     quiet=True)
    try:
        (address,) = secure.run(_direct_listener).values()
        host, port = address.rsplit(":", 1)
        hello = pickle.dumps(("intruder-session", 1))
        data, _ = encode("forged")
        header = pickle.dumps((0, "tag", []))
        frame = (struct.pack("!I", len(hello)) + hello + b"D" + struct.pack("!II", len(header), len(data))
                 + header + data)
        with socket.create_connection((host, int(port)), timeout=5) as plain:
            try:
                plain.sendall(frame)
                plain.settimeout(5)
                plain.recv(100)
            except OSError:
                pass  # reset by the TLS handshake's failure
        time.sleep(0.5)
        (count, _), = secure.run(_messages_of, "intruder-session").values()
        assert count == 0
    finally:
        close_client(secure)


# -- review fixes: copies, leaks, races, bad messages, stuck peers, byte order, close -----------------------
def _on_shared_ranks(client, session, function, *args):
    """Run ``function(comm, *args)`` on every rank, the ranks of one worker as threads of one task; by rank."""
    workers = sorted(set(session.addresses))
    futures = [client.submit(_shared_ranks_task, session, [r for r, a in enumerate(session.addresses) if a == w],
                             function, *args, workers=[w], allow_other_workers=False, pure=False) for w in workers]
    results = {}
    for part in client.gather(futures):
        results.update(part)
    return results


def _shared_ranks_task(session, ranks, function, *args):
    import threading

    from distributed import get_worker

    worker = get_worker()
    results = {}

    def one(rank):
        try:
            results[rank] = function(communicator(session, rank, worker), *args)
        except Exception as error:  # noqa: BLE001 - reported to the test
            results[rank] = f"{type(error).__name__}: {error}"

    threads = [threading.Thread(target=one, args=(r,)) for r in ranks]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results


def _reuse_after_send(comm):
    if comm.rank == 0:
        buffer = np.zeros(4)
        comm.isend(buffer, 1, "halo").wait(5)
        buffer[:] = 99.0  # complete: the sender may reuse its buffer (MPI)
        comm.barrier()
        comm.barrier()
        return buffer.tolist()
    comm.barrier()
    got = comm.recv(0, "halo", timeout=5)
    seen = got.tolist()
    got[0] = -1.0  # the receiver's own copy
    comm.barrier()
    return seen


def test_ranks_on_one_worker_get_a_private_copy_of_what_was_sent(client):
    worker = sorted(worker_info(client))[0]
    session = open_session(client, [worker, worker], timeout=30)
    try:
        results = _on_shared_ranks(client, session, _reuse_after_send)
    finally:
        close_session(client, session)
    assert results == {0: [99.0] * 4, 1: [0.0] * 4}


def _use_a_cache(comm):
    from hpcgpu.partition.decomposition import rank_cache

    rank_cache(comm.session.id, comm.rank)["work"] = np.zeros(1000)
    return comm.allreduce(comm.rank)


def _after_close(session_id, dask_worker=None):
    from hpcgpu.partition import decomposition
    from hpcgpu.partition.comm_extension import EXTENSION

    extension = dask_worker.extensions[EXTENSION]
    # what may reach a worker after its close: the scheduler's abort, a peer's late message and goodbye
    extension.abort_from_scheduler(session=session_id, reason="a worker left")
    listener = extension.listener()
    if listener is not None:
        listener._deliver(session_id, 0, 1, "late", "message")
        listener._finished(session_id, 1)
    late = extension.mailbox(session_id)  # a rank made too late
    return (session_id in extension.sessions(), any(k[0] == session_id for k in decomposition._rank_caches),
            late.aborted is not None)


def test_a_closed_session_leaves_no_mailbox_or_rank_cache_on_its_workers(client, session):
    results, _ = _on_ranks(client, session, _use_a_cache)
    assert results == [1, 1]
    close_session(client, session)
    left = client.run(_after_close, session.id)
    assert sorted(left.values()) == [(False, False, True)] * 2, left


def _make_fake_extension():
    from types import SimpleNamespace

    from hpcgpu.partition.comm_extension import CommExtension

    return CommExtension(SimpleNamespace(address="tcp://127.0.0.1:1", handlers={}, stream_handlers={}))


def test_two_threads_of_a_rank_connect_to_a_peer_once(monkeypatch):
    import gc
    import threading

    from hpcgpu.partition import direct_comm

    extension = _make_fake_extension()
    listener = extension.listener()
    extension.open("s", b"k" * 32)
    made = []

    class SlowLink(direct_comm.Link):
        def __init__(self, *args, **kwargs):
            made.append(self)
            time.sleep(0.2)  # both threads are inside link() meanwhile
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(direct_comm, "Link", SlowLink)
    links = []
    threads = [threading.Thread(target=lambda: links.append(extension.link("s", 0, listener.address)))
               for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    gc.collect()  # a dropped second link would close here, without a goodbye
    time.sleep(0.3)
    try:
        assert len(made) == 1 and links[0] is links[1]
        assert extension.mailbox("s").aborted is None
    finally:
        extension.close_links("s")
        listener.close()


def _explode():
    raise RuntimeError("cannot rebuild this object here")


class _Fragile:
    """Pickles, but cannot be rebuilt (like an object whose class the receiver cannot import)."""

    def __reduce__(self):
        return (_explode, ())


def _send_fragile(comm):
    started = time.monotonic()
    try:
        if comm.rank == 0:
            comm.send(_Fragile(), 1, "obj")
            comm.recv(1, "reply", timeout=8)
        else:
            comm.recv(0, "obj", timeout=8)
    except CommAborted as error:
        return str(error), time.monotonic() - started
    return None, time.monotonic() - started


def test_a_message_that_cannot_be_rebuilt_aborts_every_rank_naming_it(client, session):
    results, _ = _on_ranks(client, session, _send_fragile)
    for rank, (message, waited) in enumerate(results):
        assert message is not None and waited < 5, (rank, message, waited)
        assert "cannot rebuild the message rank 0 sent tagged 'obj'" in message
        assert "RuntimeError: cannot rebuild this object here" in message


def _send_unpicklables(comm):
    import threading

    if comm.rank == 0:
        comm.send(lambda x: x + 1, 1, "function")
        # the abort below may overtake the function on its way (it travels on another connection):
        # send the lock only once rank 1 has the function
        comm.recv(1, "got it", timeout=10)
        try:
            comm.send(threading.Lock(), 1, "lock")
        except Exception as error:  # noqa: BLE001 - reported to the test
            return type(error).__name__, str(error)
        return None
    increment = comm.recv(0, "function", timeout=5)
    comm.send(None, 0, "got it")
    started = time.monotonic()
    try:
        comm.recv(0, "lock", timeout=8)
    except CommAborted as error:
        return increment(1), str(error), time.monotonic() - started
    return increment(1), None, time.monotonic() - started


def test_the_direct_path_sends_what_cloudpickle_takes_and_aborts_on_the_rest(client):
    session = open_session(client, sorted(worker_info(client)), timeout=30, direct=True)
    try:
        results, _ = _on_ranks(client, session, _send_unpicklables)
    finally:
        close_session(client, session)
    kind, message = results[0]
    assert kind == "CommError" and "_thread.lock" in message and "'lock'" in message
    increment, aborted, waited = results[1]
    assert increment == 2 and aborted is not None and "'lock'" in aborted and waited < 5


def _gather_big_endian_views(comm):
    mine = (np.arange(10.0) + comm.rank).astype(">f8")[::2]
    return [(part.dtype.str, part.tolist()) for part in comm.allgather(mine)]


def test_strided_big_endian_arrays_keep_their_byte_order(client, session):
    results, _ = _on_ranks(client, session, _gather_big_endian_views)
    expected = [(">f8", [float(v) for v in np.arange(10.0)[::2] + r]) for r in range(2)]
    assert results == [expected, expected]


def _links_after_a_neighbours_close(comm):
    import tempfile

    from hpcgpu.errors import CommError

    # rank 0 closes, so it may not send again: it tells rank 2 (same worker) it has looked through a file
    looked = os.path.join(tempfile.gettempdir(), f"hpcgpu-test-looked-{comm.session.id}")
    if comm.rank == 2:
        comm.send("first", 1, "t")
        comm.barrier()
        deadline = time.monotonic() + 10
        while not os.path.exists(looked) and time.monotonic() < deadline:
            time.sleep(0.01)
        os.remove(looked)
        comm.send("second", 1, "t")
        return None
    comm.barrier()
    if comm.rank == 1:
        return [comm.recv(2, "t", timeout=5) for _ in range(2)]
    comm.close()
    extension = comm._extension
    left = sorted({k[1] for k in [*extension._links, *extension._outbound] if k[0] == comm.session.id})
    try:
        comm.send(None, 1, "late")
        refused = None
    except CommError as error:
        refused = str(error)
    open(looked, "w").close()
    return left, refused


def test_a_ranks_close_leaves_the_connections_of_the_others_on_its_worker(client, session):
    workers = sorted(worker_info(client))
    shared = open_session(client, [workers[0], workers[1], workers[0]], timeout=30, direct=bool(session.direct))
    try:
        results = _on_shared_ranks(client, shared, _links_after_a_neighbours_close)
    finally:
        close_session(client, shared)
    assert results[1] == ["first", "second"]
    left, refused = results[0]
    assert left == [2], results  # rank 0's close() left rank 2's connection to rank 1 open
    # and rank 0 may not send again: a new connection could overtake what is still in flight on the old one
    assert refused == ("rank 0: send to rank 1 after close(); a closed rank sends nothing more in its session "
                       "(open a new communicator)")


@pytest.fixture(params=["plain", "tls"])
def deaf_peer(request):
    """``(address, client_ssl)`` of a listener that accepts (and shakes hands) but never reads after the hello."""
    import socket
    import threading

    server_ssl = client_ssl = None
    if request.param == "tls":
        pytest.importorskip("cryptography")
        from distributed import Security

        security = Security.temporary()
        server_ssl = security.get_listen_args("worker")["ssl_context"]
        client_ssl = security.get_connection_args("worker")["ssl_context"]
    server = socket.create_server(("127.0.0.1", 0))
    accepted = []

    def accept():
        connection, _ = server.accept()
        connection.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        if server_ssl is not None:
            connection = server_ssl.wrap_socket(connection, server_side=True)
        # the listener's side of the handshake (any hello accepted), then nothing more is read
        connection.sendall(b"n" * 32)
        connection.recv(4096)
        connection.sendall(b"K")
        accepted.append(connection)

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield f"127.0.0.1:{server.getsockname()[1]}", client_ssl
    thread.join(5)
    for connection in accepted:
        connection.close()
    server.close()


def test_a_send_to_a_peer_that_takes_nothing_times_out(deaf_peer):
    from hpcgpu.partition.direct_comm import Link

    address, client_ssl = deaf_peer
    link = Link(address, "s", 0, client_ssl)
    started = time.monotonic()
    with pytest.raises(CommTimeout, match="took no data"):
        link.send(1, "big", np.ones(8 << 20), timeout=0.5, aborted=lambda: None)  # 64 MiB: more than buffers hold
    assert 0.5 <= time.monotonic() - started < 3.0
    assert link.closed  # half a message went out: nothing may follow it


def test_an_abort_ends_a_send_stuck_on_a_full_buffer(deaf_peer):
    from hpcgpu.partition.direct_comm import Link

    address, client_ssl = deaf_peer
    link = Link(address, "s", 0, client_ssl)
    abort_at = time.monotonic() + 0.3
    started = time.monotonic()
    with pytest.raises(CommAborted, match="rank 1 failed"):
        link.send(1, "big", np.ones(8 << 20), timeout=30.0,
                  aborted=lambda: "rank 1 failed" if time.monotonic() > abort_at else None)
    assert time.monotonic() - started < 2.0
