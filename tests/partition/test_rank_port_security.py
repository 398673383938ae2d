"""The rank port (the direct listener of :mod:`hpcgpu.partition.direct_comm`) against peers that do not belong.

A real two-worker ``tcp://`` cluster: an intruder who reaches a worker's
rank port must not run code there (nothing it sends is unpickled before it
has proven the session's secret), must not grow the worker's memory with
junk session ids, and must not hold a thread by sending slowly; a peer with
the wrong secret, or a TLS certificate of another authority, is refused;
the port closes with the worker's last session; and a normal run works
after all of it.
"""

import pickle
import socket
import struct
import time

import pytest

from hpcgpu.cluster import worker_info
from hpcgpu.partition import direct_comm
from hpcgpu.partition.comm_extension import EXTENSION
from hpcgpu.partition.dask_communicator import communicator
from hpcgpu.partition.dask_session import close_session, open_session


class _MakesAFile:
    """Unpickling this creates ``path``: the proof that a byte of the intruder was unpickled."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def _host_port(address):
    host, _, port = address.rpartition(":")
    return host, int(port)


def _send_and_wait_for_close(address, payload, timeout=15.0):
    """Send ``payload`` to the rank port and read until the listener closes; the seconds that took."""
    started = time.monotonic()
    try:
        with socket.create_connection(_host_port(address), timeout=timeout) as sock:
            sock.sendall(payload)
            while sock.recv(4096):
                pass
    except OSError:  # reset: the listener closed with our bytes unread
        pass
    return time.monotonic() - started


def _pad(payload):
    # longer than any hello, so that a refusal comes from what was read, not from the handshake's deadline
    return payload + b"\0" * 512


def _intruder_payloads(session_id, path):
    evil = pickle.dumps(_MakesAFile(path))
    old_hello = struct.pack("!I", len(evil)) + evil                                   # the former hello: a pickle
    good_old_hello = pickle.dumps((session_id, 0))
    old_data = b"D" + struct.pack("!II", len(evil), len(evil)) + evil + evil         # former header and payload
    fair_header = pickle.dumps((0, "tag", []))
    old_payload = b"D" + struct.pack("!II", len(fair_header), len(evil)) + fair_header + evil  # former payload
    sid = session_id.encode()
    forged = struct.pack("!4sHI32s", b"HGR1", len(sid), 0, b"\0" * 32) + sid          # right shape, wrong MAC
    junk_id = b"f" * 32
    junk = struct.pack("!4sHI32s", b"HGR1", len(junk_id), 0, b"\0" * 32) + junk_id
    new_data = b"D" + struct.pack("!IIIH", 0, len(evil), len(evil), 0) + evil + evil
    abort = b"A" + struct.pack("!I", len(evil)) + evil
    payloads = {
        "a pickle as the first bytes": evil,
        "a pickled hello (the former protocol)": old_hello,
        "the former hello, header and payload": struct.pack("!I", len(good_old_hello)) + good_old_hello + old_data,
        "the former hello and header, then a pickled payload": (struct.pack("!I", len(good_old_hello))
                                                                + good_old_hello + old_payload),
        "a data frame without hello": new_data,
        "an abort frame without hello": abort,
        "a goodbye without hello": b"B" + evil,
    }
    for name, hello in (("a wrong MAC", forged), ("a session never opened", junk)):
        for kind, frame in (("data", new_data), ("abort", abort), ("goodbye", b"B")):
            payloads[f"{name}, then a {kind} frame"] = hello + frame
    return {name: _pad(payload) for name, payload in payloads.items()}


def _ring(comm):
    other = 1 - comm.rank
    comm.send([comm.rank] * 3, other, "ring")
    return comm.recv(other, "ring"), comm.allreduce(comm.rank + 1)


def _run(client, session, function):
    futures = [client.submit(lambda s, r: function(communicator(s, r)), session, rank, workers=[address],
                             pure=False, allow_other_workers=False)
               for rank, address in enumerate(session.addresses)]
    return client.gather(futures)


def _state(dask_worker=None):
    extension = dask_worker.extensions[EXTENSION]
    listener = extension._listener
    return {"sessions": sorted(extension.sessions()), "open": sorted(extension._secrets),
            "connections": None if listener is None else listener.connections()}


def _set_limit(name, value, dask_worker=None):
    old = getattr(direct_comm, name)
    setattr(direct_comm, name, value)
    return old


@pytest.fixture
def direct_session(client):
    session = open_session(client, sorted(worker_info(client)), timeout=30, direct=True)
    assert session.direct and all(session.direct), "a tcp cluster gets the direct path"
    yield session
    close_session(client, session)


def test_nothing_an_intruder_sends_is_unpickled_and_the_worker_keeps_working(client, direct_session, tmp_path):
    path = tmp_path / "intruded"
    before = client.run(_state)
    for name, payload in _intruder_payloads(direct_session.id, str(path)).items():
        for address in direct_session.direct:
            took = _send_and_wait_for_close(address, payload)
            assert took < 5.0, f"{name}: refused after {took:.1f} s, not at once"
            assert not path.exists(), f"{name}: the intruder's pickle ran on the worker"
    time.sleep(0.5)
    assert not path.exists()
    after = client.run(_state)
    assert {w: s["sessions"] for w, s in after.items()} == {w: s["sessions"] for w, s in before.items()}
    assert all(s["connections"] == (0, 0) for s in after.values()), after
    assert _run(client, direct_session, _ring) == [([1] * 3, 3), ([0] * 3, 3)]


def test_a_peer_with_the_wrong_secret_is_refused_and_the_right_one_admitted(client, direct_session):
    address = direct_session.direct[1]
    with pytest.raises(ConnectionRefusedError, match="refused rank 0"):
        direct_comm.Link(address, direct_session.id, 0, secret=b"x" * 32)
    with pytest.raises(ConnectionRefusedError, match="refused rank 0"):
        direct_comm.Link(address, "0" * 32, 0, secret=direct_session.secret)  # a session not open there
    link = direct_comm.Link(address, direct_session.id, 5, secret=direct_session.secret)  # 5: no rank of the run
    link.close()
    assert "secret" not in repr(direct_session) and direct_session.secret.hex() not in repr(direct_session)


def test_junk_session_ids_make_no_mailbox(client, direct_session):
    before = client.run(_state)
    for k in range(50):
        sid = f"{k:032x}".encode()
        hello = struct.pack("!4sHI32s", b"HGR1", len(sid), 0, b"\0" * 32) + sid
        _send_and_wait_for_close(direct_session.direct[k % 2], hello + b"B")

    def scheduler_aborts(dask_worker=None):
        for k in range(50):  # what the scheduler or a peer's dask stream would file for unknown ids
            dask_worker.extensions[EXTENSION].abort_from_scheduler(session=f"junk{k}", reason="junk")

    client.run(scheduler_aborts)
    after = client.run(_state)
    assert after == before, (before, after)


def test_a_slow_peer_is_cut_at_the_handshake_deadline(client, direct_session):
    assert direct_comm.HANDSHAKE_TIMEOUT_S <= 10.0
    old = client.run(_set_limit, "HANDSHAKE_TIMEOUT_S", 1.5)
    try:
        started = time.monotonic()
        closed = None
        with socket.create_connection(_host_port(direct_session.direct[0]), timeout=10) as sock:
            try:
                for _ in range(60):  # a byte of a valid-looking hello every 0.2 s: 12 s in all if never cut
                    sock.sendall(b"H")
                    time.sleep(0.2)
            except OSError:
                closed = time.monotonic() - started
            if closed is None:
                sock.settimeout(1.0)
                try:
                    while sock.recv(4096):
                        pass
                    closed = time.monotonic() - started
                except OSError:
                    closed = time.monotonic() - started
        assert closed is not None and closed < 5.0, closed
        time.sleep(0.3)
        assert all(s["connections"] == (0, 0) for s in client.run(_state).values())
    finally:
        client.run(_set_limit, "HANDSHAKE_TIMEOUT_S", next(iter(old.values())))


def test_connections_are_bounded(client, direct_session):
    old = client.run(_set_limit, "MAX_HANDSHAKES", 3)
    socks = []
    try:
        for _ in range(6):
            sock = socket.create_connection(_host_port(direct_session.direct[0]), timeout=5)
            socks.append(sock)
            time.sleep(0.1)
        nonces = []
        for sock in socks:
            try:
                nonces.append(len(sock.recv(64)))
            except OSError:
                nonces.append(0)
        assert nonces == [32, 32, 32, 0, 0, 0], nonces  # the first three shake hands, the rest are closed
    finally:
        for sock in socks:
            sock.close()
        client.run(_set_limit, "MAX_HANDSHAKES", next(iter(old.values())))
    time.sleep(0.3)
    assert _run(client, direct_session, _ring) == [([1] * 3, 3), ([0] * 3, 3)]


def test_the_port_closes_with_the_last_session_and_opens_with_the_next(client):
    first = open_session(client, sorted(worker_info(client)), timeout=30, direct=True)
    second = open_session(client, sorted(worker_info(client)), timeout=30, direct=True)
    assert first.direct == second.direct  # one listener a worker, shared by its sessions
    close_session(client, first)
    assert _run(client, second, _ring) == [([1] * 3, 3), ([0] * 3, 3)]  # still open for the second
    close_session(client, second)
    for address in second.direct:
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(_host_port(address), timeout=5).close()
    assert all(s["connections"] is None and s["open"] == [] for s in client.run(_state).values())
    third = open_session(client, sorted(worker_info(client)), timeout=30, direct=True)
    try:
        assert all(third.direct)
        assert _run(client, third, _ring) == [([1] * 3, 3), ([0] * 3, 3)]
    finally:
        close_session(client, third)


def test_on_tls_a_certificate_of_another_authority_is_refused(tmp_path):
    pytest.importorskip("cryptography")
    import ssl

    from distributed import Security

    from hpcgpu.cluster import start_cluster

    tls_client = start_cluster(workers=2, threads_per_worker=1, gpus=False, dashboard_address="127.0.0.1:0",
                               tls=True, quiet=True)
    try:
        session = open_session(tls_client, sorted(worker_info(tls_client)), timeout=30, direct=True)
        try:
            assert all(session.direct)
            stranger = Security.temporary().get_connection_args("worker")["ssl_context"]
            with pytest.raises((ssl.SSLError, ConnectionError, OSError)):
                direct_comm.Link(session.direct[0], session.id, 0, stranger, timeout=5, secret=session.secret)
            path = tmp_path / "intruded"
            payload = _intruder_payloads(session.id, str(path))["a pickle as the first bytes"]
            assert _send_and_wait_for_close(session.direct[0], payload) < 5.0  # plaintext on a tls port
            assert not path.exists()
            assert _run(tls_client, session, _ring) == [([1] * 3, 3), ([0] * 3, 3)]
        finally:
            close_session(tls_client, session)
    finally:
        local = tls_client.cluster
        tls_client.close()
        local.close()
