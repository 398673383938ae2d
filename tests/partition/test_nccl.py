"""The communicator contract on device arrays: the NCCL transport (hpcgpu/partition/nccl_communicator.py).

Every contract test runs twice:

- ``fake``, everywhere: the protocol of :class:`NcclCommunicator`
  (headers, envelopes, tags, eager receives, collectives, aborts,
  timeouts) over a host stand-in for CuPy and NCCL (:class:`FakeDevice`):
  "device arrays" are a NumPy subclass, their bytes ride on the base under
  hidden keys, and a send completes only once its receive is posted, as an
  NCCL send may;
- ``nccl``, marked ``gpu``: CuPy arrays through ``cupy.cuda.nccl``, on a
  two-process LocalCluster. NCCL takes one rank per GPU: with two GPUs or
  more each worker gets its own (``CUDA_VISIBLE_DEVICES``); with one, the
  workers get distinct ``NCCL_HOSTID`` values, which NCCL uses as the host
  of its duplicate-GPU check, so that it sees two hosts and connects them
  over its socket transport. Where NCCL still refuses (its user guide does
  not support two ranks on one device), the two-rank cases skip with its
  error, and the one-rank case still runs NCCL's collectives on the GPU.

The base contract is in tests/partition/test_communicator.py.
"""

import collections
import operator
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from _support import REQUIRE_GPU, usable_backend

wait = pytest.importorskip("distributed").wait  # a bare GPU image lacks it: skip there

from hpcgpu import _gpu_probe
from hpcgpu.cluster import worker_info
from hpcgpu.errors import CommAborted, CommError, CommTimeout
from hpcgpu.partition import communicator_choice, nccl_sessions
from hpcgpu.partition.dask_communicator import communicator
from hpcgpu.partition.dask_session import close_session, open_session
from hpcgpu.partition.nccl_communicator import attach
from hpcgpu.partition.nccl_messages import join_device_arrays, split_device_arrays


# -- a host stand-in for CuPy and NCCL -------------------------------------------------------------------
class FakeArray(np.ndarray):
    """A host array playing a device array (the fake transport's ``array_type``)."""


class FakeEvent:
    def __init__(self, check):
        self._check, self._done = check, False

    @property
    def done(self):
        if not self._done:
            try:
                self._done = bool(self._check())
            except CommError:  # the session was aborted: the communicator's own checks report it
                return False
        return self._done


class FakeDevice:
    """The device layer of :mod:`hpcgpu.partition.nccl_device` on the host, with NCCL's rendezvous.

    A send's bytes travel at once under ``#fake|seq`` (per direction), but
    its event is done only when the receiver has posted the receive (its
    ack under ``#fake-ack|seq``); a receive is done when the bytes are here.
    """

    array_type = FakeArray

    def __init__(self, base, rank, size):
        self.base, self.rank, self.size = base, rank, size
        self.sent, self.received = collections.Counter(), collections.Counter()
        self.gathers = 0
        self.aborted = False
        self.in_flight = []

    @classmethod
    def bootstrap(cls, base, rank, size, timeout):
        root = base.bcast("fake-root-id" if rank == 0 else None, root=0, timeout=timeout)
        ids = base.allgather({peer: f"{rank}->{peer}" for peer in range(size) if peer != rank}, timeout)
        assert root == "fake-root-id" and all(ids[s][d] == f"{s}->{d}" for s in range(size) for d in ids[s])
        return cls(base, rank, size)

    def contiguous(self, array):
        return np.ascontiguousarray(array).reshape(array.shape).view(FakeArray)

    def empty(self, shape, dtype):
        return np.empty(shape, dtype).view(FakeArray)

    def asarray(self, value):
        return np.asarray(value).view(FakeArray)

    def as_bytes(self, array):
        return array.reshape(-1).view(np.uint8)

    def reductions(self):
        return {"sum": operator.add, "max": np.maximum, "min": np.minimum, "any": np.logical_or,
                "all": np.logical_and}

    def send(self, dest, array):
        seq = self.sent[dest]
        self.sent[dest] += 1
        self.in_flight.append(self.base._post_send(np.array(array).view(np.ndarray), dest, f"#fake|{seq}"))
        ack = self.base._post_receive(dest, f"#fake-ack|{seq}")
        return FakeEvent(lambda: not self.aborted and ack.done() and ack.wait(0))

    def recv(self, source, array):
        seq = self.received[source]
        self.received[source] += 1
        self.in_flight.append(self.base._post_send(True, source, f"#fake-ack|{seq}"))
        data = self.base._post_receive(source, f"#fake|{seq}")

        def check():
            if self.aborted or not data.done():
                return False
            array[...] = data.wait(0)
            return True

        return FakeEvent(check)

    def _gather(self, chunk):
        key = f"#fake-gather|{self.gathers}"
        self.gathers += 1
        peers = [p for p in range(self.size) if p != self.rank]
        for peer in peers:
            self.in_flight.append(self.base._post_send(np.array(chunk).view(np.ndarray), peer, key))
        requests = {peer: self.base._post_receive(peer, key) for peer in peers}
        parts = {self.rank: np.array(chunk)}

        def check():
            if self.aborted or not all(r.done() for r in requests.values()):
                return False
            parts.update({peer: r.wait(0) for peer, r in requests.items()})
            return True

        return parts, check

    def allgather(self, chunk):
        parts, ready = self._gather(chunk)
        out = self.empty((self.size * chunk.size,), np.uint8)

        def check():
            if not ready():
                return False
            out[...] = np.concatenate([parts[r] for r in range(self.size)])
            return True

        return out, FakeEvent(check)

    def can_allreduce(self, dtype, op):
        return op in ("sum", "max", "min") and np.dtype(dtype).kind in "fiu"

    def allreduce(self, array, op):
        parts, ready = self._gather(array)
        out = self.empty(array.shape, array.dtype)

        def check():
            if not ready():
                return False
            # not rank order, as NCCL's ring is not
            values = [parts[r] for r in reversed(range(self.size))]
            out[...] = values[0]
            for value in values[1:]:
                out[...] = self.reductions()[op](out, value)
            return True

        return out, FakeEvent(check)

    def check(self):
        pass

    def abort(self):
        self.aborted = True


# -- running a function on every rank ----------------------------------------------------------------------
def _make(session, rank, kind, ordered=True):
    if kind == "fake":
        return attach(communicator(session, rank), FakeDevice.bootstrap, ordered)
    return communicator_choice.nccl_communicator(session, rank, ordered=ordered)


def _rank_task(session, rank, kind, function, *args, ordered=True):
    return function(_make(session, rank, kind, ordered), kind, *args)


def _submit(client, session, kind, function, *args, ordered=True):
    return [client.submit(_rank_task, session, rank, kind, function, *args, ordered=ordered, workers=[address],
                          allow_other_workers=False, pure=False)
            for rank, address in enumerate(session.addresses)]


def _on_ranks(client, session, kind, function, *args, ordered=True):
    return client.gather(_submit(client, session, kind, function, *args, ordered=ordered))


def _dev(kind, array):
    """``array`` on the device of ``kind`` (a fresh copy)."""
    if kind == "fake":
        return np.array(array).view(FakeArray)
    import cupy

    return cupy.asarray(array)


def _host(value):
    """Device arrays (also in lists, dicts, halos) back on the host as ``(where, NumPy array)`` pairs."""
    if isinstance(value, FakeArray):
        return ("device", np.array(value).view(np.ndarray))
    if type(value).__module__.startswith("cupy"):
        return ("device", value.get())
    if isinstance(value, np.ndarray):
        return ("host", value)
    if isinstance(value, (list, tuple)):
        return type(value)(_host(v) for v in value)
    if isinstance(value, dict):
        return {k: _host(v) for k, v in value.items()}
    if isinstance(value, _Halo):
        return _Halo(_host(value.h), _host(value.u), value.label)
    return value


def _same(a, b):
    if isinstance(a, tuple) and len(a) == 2 and a[0] in ("device", "host") and isinstance(a[1], np.ndarray):
        return a[0] == b[0] and a[1].dtype == b[1].dtype and a[1].shape == b[1].shape and np.array_equal(a[1], b[1])
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, _Halo):
        return _same(a.h, b.h) and _same(a.u, b.u) and a.label == b.label
    return a == b


@dataclass(frozen=True)
class _Halo:
    """A model block's rows, as the engine sends them: device arrays inside a frozen dataclass."""

    h: object
    u: object
    label: str


# -- clusters ---------------------------------------------------------------------------------------------------
ROOT = str(Path(__file__).resolve().parents[2])


def _importable_on(client):
    """Let the workers import this module by its name (``tests.partition.test_nccl``) for the functions sent there.

    Workers of a ``python -P`` run (the device check, where the source tree
    must not shadow the installed package) lack the repository root: it is
    appended, so installed packages still come first.
    """
    client.run(exec, f"import sys\nif {ROOT!r} not in sys.path:\n    sys.path.append({ROOT!r})", {})


def _require_nccl():
    usable_backend("cupy")
    try:
        from cupy.cuda import nccl

        ok, detail = nccl.available, "cupy.cuda.nccl is not available (no NCCL library found by CuPy)"
        if ok and min(nccl.get_version(), nccl.get_build_version()) < 2700:
            ok, detail = False, f"NCCL {nccl.get_version()} has no send/recv (needs 2.7)"
    except Exception as error:  # noqa: BLE001
        ok, detail = False, f"cupy.cuda.nccl does not import: {error}"
    if not ok:
        if REQUIRE_GPU:
            pytest.fail(f"HPCGPU_REQUIRE_GPU=1 but NCCL is unusable: {detail}")
        pytest.skip(detail)


def _pin_worker(index, devices):
    """Give worker ``index`` a GPU of its own, or (one GPU) a host id of its own for NCCL (before CUDA starts)."""
    os.environ["NCCL_DEBUG"] = os.environ.get("NCCL_DEBUG", "WARN")
    if devices >= 2:
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        choices = visible.split(",") if visible else [str(d) for d in range(devices)]
        os.environ["CUDA_VISIBLE_DEVICES"] = choices[index % len(choices)]
        return "own GPU"
    os.environ["NCCL_HOSTID"] = f"hpcgpu-test-{index}-{os.getpid()}"
    return "shared GPU"


_PROBE_S = 90


def _probe(comm, kind):
    return comm.allgather(comm.rank)


@pytest.fixture(scope="module")
def gpu_cluster():
    """``(client, refusal)``: two worker processes pinned for NCCL (module doc); ``refusal`` is NCCL's error, if any."""
    _require_nccl()
    from hpcgpu.cluster import close_client, start_cluster

    devices = len(_gpu_probe.probe_driver().devices)
    client = start_cluster(workers=2, threads_per_worker=1, gpus=False, dashboard_address="127.0.0.1:0", quiet=True)
    try:
        _importable_on(client)
        for index, address in enumerate(sorted(worker_info(client))):
            client.run(_pin_worker, index, devices, workers=[address])
        session = open_session(client, sorted(worker_info(client)), timeout=60)
        refusal, futures = None, _submit(client, session, "nccl", _probe)
        try:
            try:
                wait(futures, timeout=_PROBE_S)  # ncclCommInitRank has no timeout: a hang is NCCL's answer too
            except TimeoutError:
                refusal = f"the NCCL bootstrap of two ranks did not finish within {_PROBE_S} s"
            else:
                assert client.gather(futures) == [[0, 1], [0, 1]]
        except Exception as error:  # noqa: BLE001 - NCCL's refusal of two ranks on one GPU, reported as a skip
            refusal = f"{type(error).__name__}: {error}"
        finally:
            close_session(client, session)
        if refusal is not None and devices >= 2:
            pytest.fail(f"NCCL does not run two ranks on two GPUs: {refusal}")
        if refusal is None:
            client.run(nccl_sessions.release, session.id)
        yield client, refusal
    finally:
        close_client(client)


@pytest.fixture
def gpu_client(gpu_cluster):
    """The pinned cluster, where NCCL runs two ranks on it (else the test skips with NCCL's reason)."""
    client, refusal = gpu_cluster
    if refusal is not None:
        pytest.skip(f"NCCL does not run two ranks on this machine's one GPU ({refusal}); the two-rank NCCL cases "
                    "need two GPUs")
    return client


@pytest.fixture(params=["fake", pytest.param("nccl", marks=pytest.mark.gpu)])
def kind(request):
    if request.param == "nccl":
        _require_nccl()
    return request.param


@pytest.fixture
def ranks(kind, request):
    """``(client, session, kind)``: a fresh session of the two workers, on the fake or the NCCL transport."""
    client = request.getfixturevalue("client" if kind == "fake" else "gpu_client")
    _importable_on(client)
    session = open_session(client, sorted(worker_info(client)), timeout=30)
    yield client, session, kind
    close_session(client, session)
    client.run(nccl_sessions.release, session.id)


# -- point to point --------------------------------------------------------------------------------------------
def _payloads(kind, seed):
    rng = np.random.default_rng(seed)
    out = [_dev(kind, rng.standard_normal(size).astype(dtype)) for dtype in ("float32", "float64")
           for size in (0, 1, 1000)]
    out += [_dev(kind, rng.integers(-5, 5, (3, 7)).astype(dtype)) for dtype in ("int32", "int64", "uint8")]
    out += [_dev(kind, rng.random(5) > 0.5), _dev(kind, rng.random(4) + 1j * rng.random(4)),
            _dev(kind, np.float64(2.5)),                   # a 0-d array
            _dev(kind, rng.random((4, 5)))[:, 1::2],        # not contiguous
            _dev(kind, rng.random(1 << 20)),
            _Halo(_dev(kind, rng.random((2, 8)).astype(np.float32)), rng.random((2, 8)), "north"),
            {"x": [_dev(kind, np.arange(3)), None, 1.5], "n": rng.integers(0, 9, 4)},
            rng.random((3, 3)), {"plain": "python", "k": 7}]
    return out


def _round_trip(comm, kind, seed):
    other = 1 - comm.rank
    payloads = _payloads(kind, seed)
    if comm.rank == 0:
        for k, payload in enumerate(payloads):
            comm.send(payload, other, k)
        back = [comm.recv(other, ("back", k)) for k in range(len(payloads))]
        return _host(payloads), _host(back)
    for k in range(len(payloads)):
        comm.send(comm.recv(other, k), other, ("back", k))
    return None


def test_device_arrays_of_every_dtype_shape_and_container_arrive_unchanged(ranks):
    client, session, kind = ranks
    sent, back = _on_ranks(client, session, kind, _round_trip, 11)[0]
    assert len(sent) == len(back)
    for k, (a, b) in enumerate(zip(sent, back)):
        assert _same(a, b), f"payload {k}: sent {a!r}, got {b!r}"
    assert sent[-2][0] == "host" and back[-2][0] == "host"  # a NumPy array stays on the host


def _out_of_order(comm, kind):
    if comm.rank == 0:
        requests = [comm.isend(_dev(kind, np.full(3 + k, k + (0.5 if tag == "b" else 0.0))), 1, tag)
                    for k in range(12) for tag in ("a", "b")]
        comm.waitall(requests)
        return None
    b_first = [comm.recv(0, "b") for _ in range(12)]  # every "a" is posted and waiting meanwhile
    a_later = [comm.recv(0, "a") for _ in range(12)]
    return [_host(x)[1].tolist() for x in b_first], [_host(x)[1].tolist() for x in a_later]


def test_device_tags_are_matched_and_each_tag_keeps_its_order(ranks):
    client, session, kind = ranks
    b_first, a_later = _on_ranks(client, session, kind, _out_of_order)[1]
    assert b_first == [[k + 0.5] * (3 + k) for k in range(12)]
    assert a_later == [[float(k)] * (3 + k) for k in range(12)]


def _mixed_on_one_tag(comm, kind):
    if comm.rank == 0:
        for k in range(10):
            comm.send(_dev(kind, np.full(2, k)) if k % 2 else {"k": k}, 1, "mix")
        return None
    return [_host(comm.recv(0, "mix")) for _ in range(10)]


def test_host_and_device_messages_on_one_tag_keep_their_order(ranks):
    client, session, kind = ranks
    got = _on_ranks(client, session, kind, _mixed_on_one_tag)[1]
    for k, value in enumerate(got):
        if k % 2:
            assert value[0] == "device" and value[1].tolist() == [k, k]
        else:
            assert value == {"k": k}


def _both_send_first(comm, kind, size):
    other = 1 - comm.rank
    for k in range(3):  # blocking sends on both ranks before either receives: eager receives keep it moving
        comm.send(_dev(kind, np.full(size, 10 * comm.rank + k, dtype=np.float32)), other, ("first", k))
    return [float(_host(comm.recv(other, ("first", k)))[1][-1]) for k in range(3)]


def test_ranks_that_both_send_before_receiving_do_not_wait_on_each_other(ranks):
    client, session, kind = ranks
    assert _on_ranks(client, session, kind, _both_send_first, 1 << 18) == [[10.0, 11.0, 12.0], [0.0, 1.0, 2.0]]


def _nonblocking(comm, kind):
    other = 1 - comm.rank
    receive = comm.irecv(other, "late")
    early = receive.done()
    comm.barrier()
    send = comm.isend(_dev(kind, np.arange(4.0) + comm.rank), other, "late")
    value = receive.wait(10)
    send.wait(10)
    return early, _host(value)[1].tolist()


def test_a_receive_is_pending_until_its_device_message_arrives(ranks):
    client, session, kind = ranks
    assert _on_ranks(client, session, kind, _nonblocking) == [(False, [1.0, 2.0, 3.0, 4.0]),
                                                              (False, [0.0, 1.0, 2.0, 3.0])]


def _halo_exchange(comm, kind, steps):
    other = 1 - comm.rank
    got = []
    for step in range(steps):
        block = _Halo(_dev(kind, np.full((2, 5), 100 * comm.rank + step)), _dev(kind, np.arange(3.0)), f"s{step}")
        received = comm.exchange({other: block}, [other], tag=("halo", step))[other]
        got.append((float(_host(received.h)[1][0, 0]), received.label))
    return got


def test_neighbours_exchange_device_halos_step_after_step(ranks):
    client, session, kind = ranks
    results = _on_ranks(client, session, kind, _halo_exchange, 20)
    assert results[0] == [(100.0 + s, f"s{s}") for s in range(20)]
    assert results[1] == [(float(s), f"s{s}") for s in range(20)]


# -- collectives --------------------------------------------------------------------------------------------------
def _collectives(comm, kind, seed):
    rng = np.random.default_rng(seed + comm.rank)
    mine = rng.standard_normal(1000) * 1e8 + 0.1
    out = {"mine": mine}
    for dtype in ("float32", "float64", "int64"):
        out[f"sum-{dtype}"] = _host(comm.allreduce(_dev(kind, mine.astype(dtype)), "sum"))[1]
    out["max"] = _host(comm.allreduce(_dev(kind, mine), "max"))[1]
    out["min"] = _host(comm.allreduce(_dev(kind, mine), "min"))[1]
    out["any"] = _host(comm.allreduce(_dev(kind, mine > 1e8), "any"))[1]
    out["all"] = _host(comm.allreduce(_dev(kind, mine > -1e9), "all"))[1]
    ragged = _dev(kind, np.arange(3 + 4 * comm.rank, dtype=np.float32).reshape(-1, 1) * (comm.rank + 1))
    out["allgather"] = [_host(x) for x in comm.allgather(ragged)]
    empty = _dev(kind, np.zeros((0, 3), np.int32))
    out["allgather-empty"] = [_host(x) for x in comm.allgather(empty)]
    mixed = _dev(kind, np.arange(2.0)) if comm.rank == 0 else np.arange(3)
    out["allgather-mixed"] = [_host(x) for x in comm.allgather(mixed)]
    out["scalar"] = comm.allreduce(float(mine[0]), "sum")
    out["bcast"] = _host(comm.bcast(_dev(kind, np.arange(4.0)) if comm.rank == 0 else None))
    out["gather"] = comm.gather(_dev(kind, np.full(2, comm.rank)))
    out["gather"] = None if out["gather"] is None else [_host(x) for x in out["gather"]]
    comm.barrier()
    return out


def test_device_collectives_agree_on_every_rank_and_with_numpy_in_rank_order(ranks):
    client, session, kind = ranks
    results = _on_ranks(client, session, kind, _collectives, 5)
    v0, v1 = results[0]["mine"], results[1]["mine"]
    for rank, out in enumerate(results):
        for dtype in ("float32", "float64", "int64"):
            expected = v0.astype(dtype) + v1.astype(dtype)  # rank order: bitwise what the generic reduction gives
            assert out[f"sum-{dtype}"].dtype == np.dtype(dtype)
            np.testing.assert_array_equal(out[f"sum-{dtype}"], expected)
        np.testing.assert_array_equal(out["max"], np.maximum(v0, v1))
        np.testing.assert_array_equal(out["min"], np.minimum(v0, v1))
        np.testing.assert_array_equal(out["any"], (v0 > 1e8) | (v1 > 1e8))
        np.testing.assert_array_equal(out["all"], (v0 > -1e9) & (v1 > -1e9))
        gathered = out["allgather"]
        assert [g[0] for g in gathered] == ["device", "device"]
        np.testing.assert_array_equal(gathered[0][1], np.arange(3, dtype=np.float32).reshape(-1, 1))
        np.testing.assert_array_equal(gathered[1][1], 2 * np.arange(7, dtype=np.float32).reshape(-1, 1))
        assert all(g[0] == "device" and g[1].shape == (0, 3) and g[1].dtype == np.int32
                   for g in out["allgather-empty"])
        mixed = out["allgather-mixed"]
        assert mixed[0][0] == "device" and mixed[0][1].tolist() == [0.0, 1.0]
        assert mixed[1][0] == "host" and mixed[1][1].tolist() == [0, 1, 2]
        assert out["scalar"] == v0[0] + v1[0]
        assert out["bcast"][0] == "device" and out["bcast"][1].tolist() == [0.0, 1.0, 2.0, 3.0]
        if rank == 0:
            assert _same(out["gather"], [("device", np.array([0, 0])), ("device", np.array([1, 1]))])
        else:
            assert out["gather"] is None
    for key in ("sum-float32", "sum-float64", "max", "allgather"):
        assert _same(_host(results[0][key]), _host(results[1][key]))


def _unordered_sum(comm, kind):
    values = np.random.default_rng(comm.rank).standard_normal(4096) * 1e6
    total = comm.allreduce(_dev(kind, values), "sum")
    # dtypes differ: NCCL cannot reduce them together, the rank-order path does
    mixed = comm.allreduce(_dev(kind, np.full(3, 1.5 + comm.rank, dtype=np.float64 if comm.rank else np.float32)),
                           "max")
    return values, _host(total)[1], _host(mixed)[1].tolist()


def test_an_unordered_allreduce_agrees_across_ranks_and_is_close_to_numpy(ranks):
    client, session, kind = ranks
    results = _on_ranks(client, session, kind, _unordered_sum, ordered=False)
    (v0, t0, r0), (v1, t1, r1) = results
    np.testing.assert_array_equal(t0, t1)  # every rank the same bits
    np.testing.assert_allclose(t0, v0 + v1, rtol=1e-12, atol=1e-6)
    assert r0 == r1 == [2.5, 2.5, 2.5]


# -- faults ---------------------------------------------------------------------------------------------------------
# Elements of a float64 send that must wait for its receive: NCCL completes a send that fits its buffers
# before the receive is posted (its socket transport between two workers on one GPU did with 512 KiB on an
# H100), as MPI completes an eager send; 256 MiB is far beyond them. The fake device never buffers.
_UNBUFFERED = {"nccl": 1 << 25, "fake": 1 << 16}


def _abort_while_waiting(comm, kind, what):
    if comm.rank == 1:
        time.sleep(0.5)
        comm.abort("ValueError: rank 1 broke")
        return None
    started = time.monotonic()
    try:
        if what == "receive":
            comm.recv(1, "never")  # the session's timeout is 30 s
        else:
            comm.isend(_dev(kind, np.ones(_UNBUFFERED[kind])), 1, "unread").wait(20)  # rank 1 never receives it
    except CommAborted as error:
        return str(error), time.monotonic() - started, comm.state.dead is not None
    return None, time.monotonic() - started, None


@pytest.mark.parametrize("what", ["receive", "send"])
def test_an_abort_releases_a_rank_waiting_for_device_data(ranks, what):
    client, session, kind = ranks
    message, waited, stopped = _on_ranks(client, session, kind, _abort_while_waiting, what)[0]
    assert message is not None and "rank 1 aborted: ValueError: rank 1 broke" in message
    assert waited < 5, f"rank 0 waited {waited:.1f} s (its timeout is 30 s)"
    assert stopped, "rank 0's NCCL communicators were not aborted"


def _unreceived_send(comm, kind):
    if comm.rank == 1:
        time.sleep(2.0)  # never receives; then finds the session aborted by rank 0's timeout
        try:
            comm.recv(0, "anything", timeout=10)
        except CommAborted as error:
            return "aborted", str(error)
        return "received", None
    started = time.monotonic()
    send = comm.isend(_dev(kind, np.ones(_UNBUFFERED[kind])), 1, "unread")
    try:
        send.wait(0.5)
    except CommTimeout as error:
        return str(error), time.monotonic() - started
    return None, time.monotonic() - started


def test_a_device_send_past_its_timeout_aborts_nccl_and_the_session(ranks):
    client, session, kind = ranks
    (message, waited), (outcome, detail) = _on_ranks(client, session, kind, _unreceived_send)
    assert message is not None and "NCCL did not complete a send to rank 1 tagged 'unread'" in message
    assert 0.5 <= waited < 5
    assert outcome == "aborted" and "rank 0 aborted" in detail


def _wait_for_nothing(comm, kind):
    started = time.monotonic()
    try:
        comm.recv(1 - comm.rank, "never", timeout=0.3)
    except CommTimeout as error:
        return str(error), time.monotonic() - started
    return None, time.monotonic() - started


def test_a_receive_past_its_timeout_names_the_peer_and_the_tag(ranks):
    client, session, kind = ranks
    for rank, (message, waited) in enumerate(_on_ranks(client, session, kind, _wait_for_nothing)):
        assert message is not None and f"rank {rank}" in message and f"rank {1 - rank}" in message
        assert "'never'" in message and 0.3 <= waited < 5


# -- epochs ----------------------------------------------------------------------------------------------------------
def _epoch_one(comm, kind):
    if comm.rank == 0:
        first, _ = [comm.isend(_dev(kind, np.full(4, k)), 1, "across") for k in range(2)]
        first.wait(10)  # the second is received in the next epoch: its send stays posted meanwhile
        return None
    return _host(comm.recv(0, "across"))[1].tolist()


def _epoch_two(comm, kind):
    if comm.rank == 0:
        return _host(comm.recv(1, "reply"))[1].tolist()
    left = _host(comm.recv(0, "across"))[1].tolist()
    comm.send(_dev(kind, np.full(2, 7.0)), 0, "reply")
    return left


def _bootstraps(session_id):
    return nccl_sessions.bootstraps[session_id]


def test_epochs_reuse_the_sessions_nccl_communicators_and_their_order(ranks):
    client, session, kind = ranks
    assert _on_ranks(client, session, kind, _epoch_one) == [None, [0, 0, 0, 0]]
    assert _on_ranks(client, session, kind, _epoch_two) == [[7.0, 7.0], [1, 1, 1, 1]]
    assert set(client.run(_bootstraps, session.id).values()) == {1}


def _nccl_states(session_id):
    return sorted(rank for sid, rank in nccl_sessions.rank_states if sid == session_id)


def test_closing_the_session_ends_its_nccl_communicators_on_every_worker(ranks):
    # dask_communicator knows no NCCL: the transport registers its release with the base (on_session_close)
    client, session, kind = ranks
    _on_ranks(client, session, kind, _epoch_one)
    assert sorted(r for v in client.run(_nccl_states, session.id).values() for r in v) == [0, 1]
    close_session(client, session)
    assert list(client.run(_nccl_states, session.id).values()) == [[], []]


def _dead_states(session_id):
    return sorted(rank for (sid, rank), state in nccl_sessions.rank_states.items()
                  if sid == session_id and state.dead is not None and getattr(state.device, "aborted", True))


def test_an_abort_from_the_client_ends_the_sessions_nccl_communicators_on_every_worker(ranks):
    # a rank stuck in an NCCL operation or a device synchronisation never looks at its mailbox:
    # the client's abort (an epoch past its deadline, a failed or closed run) ncclCommAborts it
    from hpcgpu.partition.worker_ranks import abort_session_here

    client, session, kind = ranks
    _on_ranks(client, session, kind, _epoch_one)
    assert list(client.run(_dead_states, session.id).values()) == [[], []]
    client.run(abort_session_here, session.id, "stopped by the client")
    assert sorted(r for v in client.run(_dead_states, session.id).values() for r in v) == [0, 1]


# -- choosing the transport -------------------------------------------------------------------------------------
def _chosen(session, rank):
    comm = communicator_choice.choose_communicator(session, rank)
    return type(comm).__name__, comm.transport, comm.allreduce(rank + 1.0), communicator_choice.nccl_identity()


def test_choose_communicator_keeps_dask_where_ranks_have_no_gpu_of_their_own(client):
    """Here: no CuPy (or, on a GPU machine, two CPU workers that see the same GPU): the base communicator."""
    _importable_on(client)
    session = open_session(client, sorted(worker_info(client)), timeout=30)
    try:
        futures = [client.submit(_chosen, session, rank, workers=[address], pure=False)
                   for rank, address in enumerate(session.addresses)]
        results = client.gather(futures)
    finally:
        close_session(client, session)
    assert [r[:3] for r in results] == [("DaskCommunicator", "direct", 3.0)] * 2
    identities = [r[3] for r in results]
    assert None in identities or identities[0] == identities[1]


@pytest.mark.gpu
def test_choose_communicator_takes_nccl_on_workers_with_gpus_of_their_own(gpu_client):
    session = open_session(gpu_client, sorted(worker_info(gpu_client)), timeout=30)
    try:
        futures = [gpu_client.submit(_chosen, session, rank, workers=[address], pure=False)
                   for rank, address in enumerate(session.addresses)]
        results = gpu_client.gather(futures)
    finally:
        close_session(gpu_client, session)
        gpu_client.run(nccl_sessions.release, session.id)
    assert [r[:3] for r in results] == [("NcclCommunicator", "nccl", 3.0)] * 2


def _one_rank(session, rank):
    import cupy

    comm = communicator_choice.nccl_communicator(session, rank)
    device = comm.state.device
    values = cupy.arange(6, dtype=cupy.float64)
    chunk = device.as_bytes(values)
    gathered, event = device.allgather(chunk)
    reduced, done = device.allreduce(values, "sum")
    event.synchronize()
    done.synchronize()
    out = (cupy.asnumpy(gathered.view(cupy.float64)).tolist(), cupy.asnumpy(reduced).tolist(),
           cupy.asnumpy(comm.allreduce(values, "max")).tolist(), len(comm.allgather(values)))
    nccl_sessions.release(session.id)
    return out


@pytest.mark.gpu
def test_a_group_of_one_runs_nccls_collectives_on_its_gpu(gpu_cluster):
    gpu_client, _ = gpu_cluster
    address = sorted(worker_info(gpu_client))[0]
    session = open_session(gpu_client, [address], timeout=30)
    try:
        gathered, reduced, largest, count = gpu_client.submit(_one_rank, session, 0, workers=[address],
                                                                  pure=False).result()
    finally:
        close_session(gpu_client, session)
    assert gathered == reduced == largest == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0] and count == 1


# -- without a GPU ----------------------------------------------------------------------------------------------
def test_the_transport_imports_without_cupy_and_hpcgpu_stays_free_of_it():
    code = ("import sys, hpcgpu, hpcgpu.partition.communicator_choice, hpcgpu.partition.nccl_communicator as m; "
            "assert 'cupy' not in sys.modules, 'cupy imported'; print(m.NcclCommunicator.transport)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == "nccl"


def test_nccl_needs_every_rank_on_a_gpu_of_its_own():
    a, b = ("node1", "0000:1a:00.0"), ("node1", "0000:1b:00.0")
    assert communicator_choice.use_nccl([a, b]) and communicator_choice.use_nccl([a, ("node2", a[1])])
    assert not communicator_choice.use_nccl([a, a])               # two ranks on one GPU: NCCL refuses
    assert not communicator_choice.use_nccl([a, None])            # a rank without CuPy, NCCL or a GPU
    assert not communicator_choice.use_nccl([a])                  # nothing to send to
    assert not communicator_choice.use_nccl([("n", str(k)) for k in range(communicator_choice.MAX_RANKS + 1)])


def test_the_nccl_transport_can_be_turned_off(monkeypatch):
    monkeypatch.setenv(communicator_choice.NCCL_ENV, "0")
    assert communicator_choice.nccl_identity() is None


def test_device_arrays_are_split_from_the_rest_of_a_message_and_put_back():
    state = _Halo(np.arange(3.0).view(FakeArray), np.ones(2), "south")
    skeleton, arrays = split_device_arrays({"state": state, "n": [1, state.h]}, FakeArray)
    assert len(arrays) == 2 and all(isinstance(a, FakeArray) for a in arrays)
    back = join_device_arrays(skeleton, [a * 2 for a in arrays])
    assert back["state"].label == "south" and back["state"].h.tolist() == [0.0, 2.0, 4.0]
    assert back["state"].u.tolist() == [1.0, 1.0] and back["n"][1].tolist() == [0.0, 2.0, 4.0]
    bare = np.zeros(2).view(FakeArray)
    assert split_device_arrays(bare, FakeArray) == (None, [bare])
    for host in (np.zeros(3), {"a": np.zeros(3)}, "text", 4, None, (lambda: 1)):
        assert split_device_arrays(host, FakeArray) == (None, None)


def test_a_blocking_nccl_setup_call_ends_at_its_deadline_and_passes_errors_on():
    """ncclCommInitRank has no timeout: the bootstrap bounds it (here with a call that never returns)."""
    import threading
    import time

    from hpcgpu.errors import CommTimeout
    from hpcgpu.partition.nccl_device import call_within

    never = threading.Event()
    start = time.monotonic()
    with pytest.raises(CommTimeout, match=r"rank 3: NCCL init did not finish within 0.2 s") as caught:
        call_within(never.wait, 0.2, "rank 3: NCCL init", 3)
    assert time.monotonic() - start < 5 and caught.value.rank == 3
    never.set()
    with pytest.raises(ZeroDivisionError):
        call_within(lambda: 1 / 0, 1.0, "a failing call")
