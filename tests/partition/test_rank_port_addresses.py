"""Where the rank port listens and what it advertises, and the dask path where it cannot open.

A worker started with dask's ``--contact-address`` (behind NAT, in a
container) is reached at a host that is not its own: its rank port binds
to its listen address and advertises the contact host. A worker whose
rank port cannot open at all sends its session down dask's comm layer,
and the client is told once per session, with the worker and the reason.
"""

import logging
import time
from types import SimpleNamespace

import numpy as np
import pytest

from hpcgpu.cluster import worker_info
from hpcgpu.partition.comm_extension import CommExtension
from hpcgpu.partition.direct_comm import Link, Listener, new_secret, rank_port_hosts

UNREACHABLE = "203.0.113.7"  # TEST-NET-3 (RFC 5737): never an address of this machine


def _worker(address, listen_address=None):
    return SimpleNamespace(address=address, listen_address=listen_address or address, handlers={},
                           stream_handlers={})


def test_the_port_binds_the_listen_host_and_advertises_the_contact_host():
    assert rank_port_hosts(_worker("tcp://127.0.0.1:9000")) == (("127.0.0.1",), "127.0.0.1")
    assert rank_port_hosts(_worker(f"tcp://{UNREACHABLE}:9000", "tcp://10.0.0.5:9000")) == (("10.0.0.5",),
                                                                                         UNREACHABLE)
    # a wildcard listen address: the contact host first (no more interfaces than the peers use), then all
    assert rank_port_hosts(_worker(f"tcp://{UNREACHABLE}:9000", "tcp://0.0.0.0:9000")) == ((UNREACHABLE, "0.0.0.0"),
                                                                                        UNREACHABLE)
    assert rank_port_hosts(_worker("tls://[2001:db8::5]:9000", "tls://[::]:9000")) == (("2001:db8::5", "::"),
                                                                                      "2001:db8::5")
    assert rank_port_hosts(SimpleNamespace(address="tcp://10.1.2.3:9000")) == (("10.1.2.3",), "10.1.2.3")


def test_a_wildcard_listen_address_binds_the_contact_host_when_it_is_this_machines_else_every_interface():
    own = Listener(_worker("tcp://127.0.0.1:9000", "tcp://0.0.0.0:9000"), None, None, None, None,
                   secret_of=lambda session: None)
    nat = Listener(_worker(f"tcp://{UNREACHABLE}:9000", "tcp://0.0.0.0:9000"), None, None, None, None,
                   secret_of=lambda session: None)
    try:
        assert own.bound_host == "127.0.0.1" and own.address.startswith("127.0.0.1:")
        assert nat.bound_host == "0.0.0.0" and nat.address.startswith(f"{UNREACHABLE}:")
    finally:
        own.close()
        nat.close()


def test_a_worker_with_a_contact_address_not_its_own_opens_its_port_and_is_reached_through_it():
    secret, got = new_secret(), []
    listener = Listener(_worker(f"tcp://{UNREACHABLE}:9000", "tcp://127.0.0.1:9000"),
                        deliver=lambda *message: got.append(message), abort=None, finished=lambda *a: None,
                        fail=None, secret_of=lambda session: secret if session == "s1" else None)
    try:
        host, port = listener.address.rsplit(":", 1)
        assert host == UNREACHABLE  # what its peers are told (a NAT forwards it here)
        link = Link(f"127.0.0.1:{port}", "s1", 1, secret=secret)  # where the NAT would deliver
        link.send(0, "halo", np.arange(3.0))
        link.close()
        deadline = time.monotonic() + 10
        while not got and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(got) == 1 and got[0][:4] == ("s1", 0, 1, "halo")
        np.testing.assert_array_equal(got[0][4], [0.0, 1.0, 2.0])
    finally:
        listener.close()


def test_a_port_that_cannot_bind_is_an_os_error_and_the_worker_says_so_once(caplog):
    worker = _worker(f"tcp://{UNREACHABLE}:9000")  # listen address = contact address, not this machine's
    with pytest.raises(OSError):
        Listener(worker, None, None, None, None, secret_of=lambda session: None)
    extension = CommExtension(worker)
    try:
        with caplog.at_level(logging.WARNING, logger="hpcgpu.partition.comm_extension"):
            assert extension.open("s1", new_secret()) is None
            assert extension.open("s2", new_secret()) is None
        assert "OSError" in extension.listener_problem
        said = [r.getMessage() for r in caplog.records if "rank port" in r.getMessage()]
        assert len(said) == 1, said
        assert f"the rank port of worker tcp://{UNREACHABLE}:9000 cannot open (OSError" in said[0]
        assert "use dask's comm layer" in said[0]
    finally:
        extension.heartbeats.stop()
        extension.forget("s1")
        extension.forget("s2")


# -- on a cluster: the session falls back to dask's comm layer ------------------------------------------
class _Unbindable:
    def __init__(self, *args, **kwargs):
        raise OSError(99, "Cannot assign requested address")


def _break_rank_port():
    from hpcgpu.partition import direct_comm

    direct_comm.RealListener = direct_comm.Listener
    direct_comm.Listener = _Unbindable


def _mend_rank_port():
    from hpcgpu.partition import direct_comm

    direct_comm.Listener = direct_comm.RealListener


def _ping(session, rank):
    from hpcgpu.partition.dask_communicator import communicator

    comm = communicator(session, rank)
    return comm.transport, comm.allreduce(np.full(2, rank + 1.0)).tolist()


def test_a_session_whose_rank_port_cannot_open_runs_on_dask_and_says_so(client):
    from hpcgpu.partition.dask_session import close_session, open_session

    addresses = sorted(worker_info(client))
    client.run(_break_rank_port, workers=[addresses[1]])
    try:
        with pytest.warns(RuntimeWarning, match=rf"the rank port cannot open on 1 worker\(s\) \({addresses[1]}: "
                                                r"OSError: \[Errno 99\] Cannot assign requested address\); session "
                                                r"\w+ runs on dask's comm layer instead"):
            session = open_session(client, addresses, timeout=60)
        assert session.direct == ()
        results = client.gather([client.submit(_ping, session, rank, workers=[address], allow_other_workers=False,
                                               pure=False) for rank, address in enumerate(addresses)])
        assert results == [("dask", [3.0, 3.0])] * 2
        close_session(client, session)
    finally:
        client.run(_mend_rank_port, workers=[addresses[1]])
    session = open_session(client, addresses, timeout=60)  # the port opens again: the direct path
    assert all(session.direct)
    close_session(client, session)
