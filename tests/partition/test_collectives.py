"""The collectives of the communicator (hpcgpu/partition/collectives.py) on groups of 1 to 9 ranks.

The ranks are threads of this process, messaging through queues
(:class:`ThreadCommunicator`, a complete transport of the Communicator
interface), so every group size, powers of two or not, runs in
milliseconds. Each collective is checked for its result (against NumPy
and :func:`tree_reduce`), for the same bits on every rank, for its rounds
and messages per rank (the communicator's own counters), and for the
contract of the module doc of hpcgpu/partition/communicator.py: tags of
its own, timeouts and aborts. One test runs them over dask's comm layer,
on five ranks that share two workers; the rest of the dask contract is in
tests/partition/test_communicator.py.
"""

import math
import threading
import time
from dataclasses import dataclass

import numpy as np
import pytest

from _thread_comm import ThreadCommunicator, ThreadGroup, run_group

from hpcgpu.errors import CommAborted, CommTimeout, ConfigError
from hpcgpu.partition.collectives import allreduce_recursive_doubling, payload_nbytes, tree_reduce
from hpcgpu.partition.communicator import REDUCTIONS, LoopbackCommunicator

SIZES = range(1, 10)




def _log2_ceil(size):
    return math.ceil(math.log2(size)) if size > 1 else 0


def _same_bits(a, b):
    a, b = np.asarray(a), np.asarray(b)
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


# -- allreduce ------------------------------------------------------------------------------------------
def _values(size, kind, op):
    rng = np.random.default_rng(1000 * size + len(op))
    if op in ("any", "all"):
        flags = rng.random((size, 6)) < (0.2 if op == "any" else 0.8)
        return [bool(f[0]) for f in flags] if kind == "scalar" else list(flags)
    values = rng.standard_normal((size, 6)) * 10.0 ** rng.integers(-8, 9, (size, 6))  # sums that round
    return [float(v[0]) for v in values] if kind == "scalar" else list(values)


def _reference(values, op):
    stack = np.array(values)
    return {"sum": stack.sum(axis=0), "max": stack.max(axis=0), "min": stack.min(axis=0),
            "any": stack.any(axis=0), "all": stack.all(axis=0)}[op]


@pytest.mark.parametrize("kind", ["scalar", "array"])
@pytest.mark.parametrize("op", sorted(REDUCTIONS))
@pytest.mark.parametrize("size", SIZES)
def test_allreduce_gives_every_rank_the_same_bits_in_the_tree_order(size, op, kind):
    values = _values(size, kind, op)
    results, _ = run_group(size, lambda comm: comm.allreduce(values[comm.rank], op))
    expected = tree_reduce(values, REDUCTIONS[op]) if size > 1 else REDUCTIONS[op](values[0], values[0]) \
        if op in ("any", "all") else values[0]
    for result in results:
        assert _same_bits(result, expected), (result, expected)
        assert type(result) is type(expected)
    if op == "sum":
        np.testing.assert_allclose(results[0], _reference(values, op), rtol=1e-12, atol=1e-300)
    else:
        np.testing.assert_array_equal(results[0], _reference(values, op))


@pytest.mark.parametrize("size", SIZES)
def test_allreduce_combines_the_lower_ranks_first_in_every_round(size):
    # an order-revealing "combine": the bracketing itself, the same string on every rank
    def bracket(a, b):
        return f"({a} {b})"

    def program(comm):
        def step(sends, sources):
            key = ("bracket", comm.rank)  # any tag of the test's own
            receives = [comm.irecv(source, ("bracket", source)) for source in sources]
            for dest, obj in sends:
                comm.isend(obj, dest, key).wait(5)
            return [r.wait(5) for r in receives]
        return allreduce_recursive_doubling(comm.rank, comm.size, str(comm.rank), bracket, step)

    results, _ = run_group(size, program)
    assert results == [tree_reduce([str(r) for r in range(size)], bracket)] * size
    if size == 5:
        assert results[0] == "(((0 1) 2) (3 4))"


def test_tree_reduce_is_rank_order_with_a_fixed_bracketing():
    def bracket(a, b):
        return f"({a}{b})"

    assert tree_reduce("a", bracket) == "a"
    assert tree_reduce("ab", bracket) == "(ab)"
    assert tree_reduce("abcd", bracket) == "((ab)(cd))"
    assert tree_reduce("abcdefg", bracket) == "(((ab)(cd))((ef)g))"
    assert tree_reduce("abcdefghi", bracket) == "((((ab)c)(de))((fg)(hi)))"


def test_allreduce_of_mixed_scalars_and_arrays_and_integer_sums_is_exact():
    results, _ = run_group(6, lambda comm: (comm.allreduce(np.int64(comm.rank) if comm.rank % 2 else comm.rank),
                                            comm.allreduce(np.full(3, comm.rank) if comm.rank else 7, "max")))
    for total, largest in results:
        assert total == 15
        assert largest.tolist() == [7, 7, 7]


def test_allreduce_does_not_change_the_callers_array():
    mine = [np.full(4, float(r)) for r in range(5)]
    results, _ = run_group(5, lambda comm: comm.allreduce(mine[comm.rank]))
    assert [m.tolist() for m in mine] == [[float(r)] * 4 for r in range(5)]
    assert all(r.tolist() == [10.0] * 4 for r in results)


# -- rounds and messages per rank -----------------------------------------------------------------------
def _rounds_and_messages(comm, family):
    counted = comm.counters_by_family()[family]
    return counted["rounds"] / counted["calls"], counted["messages"] / counted["calls"]


@pytest.mark.parametrize("size", SIZES)
def test_allreduce_takes_log2_p_rounds_and_at_most_ceil_log2_p_sends_per_rank(size):
    def program(comm):
        for k in range(3):
            comm.allreduce(np.arange(4.0) + k)
        return _rounds_and_messages(comm, "#allreduce")

    results, _ = run_group(size, program)
    rounds = [r for r, _ in results]
    messages = [m for _, m in results]
    power_of_two = size & (size - 1) == 0
    if power_of_two:
        assert rounds == [math.log2(size)] * size
    else:  # the fold and the unfold: one round each for the ranks that carry a folded one
        assert max(rounds) == math.floor(math.log2(size)) + 2
    assert max(messages) <= _log2_ceil(size)


@pytest.mark.parametrize("size", SIZES)
def test_allgather_and_barrier_take_ceil_log2_p_rounds_one_message_each(size):
    def program(comm):
        gathered = comm.allgather(("rank", comm.rank, np.full(2, comm.rank)))
        comm.barrier()
        return gathered, _rounds_and_messages(comm, "#allgather"), _rounds_and_messages(comm, "#barrier")

    results, _ = run_group(size, program)
    for gathered, allgather, barrier in results:
        assert [g[1] for g in gathered] == list(range(size))
        assert all(g[2].tolist() == [r, r] for r, g in enumerate(gathered))
        assert allgather == barrier == (_log2_ceil(size), _log2_ceil(size))


@pytest.mark.parametrize("size", SIZES)
def test_allgather_sends_each_value_once_per_rank(size):
    def program(comm):
        comm.allgather(np.zeros(10))
        return comm.counters_by_family()["#allgather"]["bytes"]

    results, _ = run_group(size, program)
    assert results == [80 * (size - 1)] * size


@pytest.mark.parametrize("size", SIZES)
def test_bcast_and_gather_from_every_root_down_and_up_binomial_trees(size):
    def program(comm):
        out = []
        for root in range(comm.size):
            value = comm.bcast({"from": root, "data": np.arange(3) + root} if comm.rank == root else None, root)
            gathered = comm.gather((comm.rank, root), root)
            out.append((value["from"], value["data"].tolist(), gathered))
        return out, comm.counters_by_family()

    results, _ = run_group(size, program)
    for rank, (out, counted) in enumerate(results):
        for root, (source, data, gathered) in enumerate(out):
            assert source == root and data == [root, root + 1, root + 2]
            assert gathered == ([(r, root) for r in range(size)] if rank == root else None)
        if size > 1:
            # a gather: every rank but the root sends once; a bcast: P - 1 messages in all, each rank got one
            assert counted["#gather"]["messages"] == size - 1
            assert counted["#gather"]["rounds"] <= size * (1 + _log2_ceil(size))
    bcast_sent = [counted["#bcast"]["messages"] for _, counted in results]
    assert sum(bcast_sent) == size * (size - 1)  # over the size roots
    assert max(bcast_sent) <= size * _log2_ceil(size)


def test_a_barrier_waits_for_the_last_rank():
    entered = []

    def program(comm):
        if comm.rank == 4:
            time.sleep(0.3)
        entered.append(comm.rank)
        comm.barrier()
        return len(entered)

    results, _ = run_group(7, program)
    assert results == [7] * 7


# -- the contract: tags, timeouts, aborts, bad input ----------------------------------------------------------
def test_consecutive_collectives_and_point_to_point_messages_never_mix():
    def program(comm):
        rng = np.random.default_rng(comm.rank)
        nxt, prv = (comm.rank + 1) % comm.size, (comm.rank - 1) % comm.size
        out = []
        for k in range(20):
            time.sleep(rng.random() * 1e-3)  # ranks run ahead of each other
            sent = comm.isend(("p2p", k), nxt, ("ring", k))
            out.append(comm.allreduce(k + comm.rank))
            out.append(comm.allgather(k * comm.rank))
            out.append(comm.bcast(k if comm.rank == k % comm.size else None, root=k % comm.size))
            out.append(comm.recv(prv, ("ring", k)))
            sent.wait(5)
        return out

    size = 6
    results, _ = run_group(size, program)
    for out in results:
        for k in range(20):
            assert out[4 * k:4 * k + 4] == [size * k + 15, [k * r for r in range(size)], k, ("p2p", k)]


def test_a_rank_that_never_joins_times_the_collective_out_naming_peer_and_tag():
    def program(comm):
        if comm.rank == 2:
            return "absent"
        started = time.monotonic()
        try:
            comm.allreduce(1.0, timeout=0.5)
        except CommTimeout as error:
            return str(error), time.monotonic() - started
        return "no timeout"

    results, _ = run_group(5, program)
    assert results[2] == "absent"
    # the ranks whose messages all depend on rank 2 time out; each wait names its peer and tag
    timed_out = [r for r in results if isinstance(r, tuple)]
    assert timed_out, results
    for message, seconds in timed_out:
        assert "#allreduce|1" in message and "from rank" in message
        assert seconds < 3.0


def test_an_abort_ends_every_ranks_collective_at_once():
    def program(comm):
        if comm.rank == 0:
            time.sleep(0.2)
            comm.abort("ValueError: rank 0 broke")
            return "aborted"
        started = time.monotonic()
        try:
            comm.allgather(comm.rank, timeout=30)
        except CommAborted as error:
            return str(error), time.monotonic() - started
        return "finished"

    results, _ = run_group(7, program)
    assert results[0] == "aborted"
    for message, seconds in results[1:]:
        assert "rank 0 broke" in message and seconds < 5.0


def test_bad_ops_and_roots_name_the_parameter():
    comm = ThreadCommunicator(ThreadGroup(), 0, 3)
    with pytest.raises(ConfigError, match="op must be one of"):
        comm.allreduce(1.0, "mean")
    for bad in (3, -1, "0", True):
        with pytest.raises(ConfigError, match="root must be a rank in 0..2"):
            comm.bcast(1, root=bad)
        with pytest.raises(ConfigError, match="root must be a rank in 0..2"):
            comm.gather(1, root=bad)


def test_a_group_of_one_returns_its_own_values_without_messages():
    comm = LoopbackCommunicator()
    assert comm.allreduce(2.5, "max") == 2.5 and comm.allreduce(1, "any") is True
    assert comm.allgather("x") == ["x"] and comm.gather(4) == [4] and comm.bcast("y") == "y"
    comm.barrier()
    assert comm.counters == {"messages": 0, "bytes": 0}
    assert comm.counters_by_family()["#barrier"] == {"messages": 0, "bytes": 0, "calls": 1, "rounds": 0}


# -- counters -------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Block:
    u: np.ndarray
    label: str
    extra: tuple


def test_payload_bytes_are_those_of_the_arrays_anywhere_in_a_message():
    block = _Block(np.zeros((4, 4)), "north", (np.zeros(3, np.float32), [np.int64(1)]))
    assert payload_nbytes(block) == 128 + 12 + 8
    assert payload_nbytes({"a": block, "b": [1.0, "x", None], "c": b"abcd"}) == 148 + 4
    assert payload_nbytes(3.0) == payload_nbytes("text") == payload_nbytes(object()) == 0
    assert payload_nbytes(np.zeros(0)) == 0


def test_counters_count_messages_and_bytes_per_tag_family_and_reset():
    def program(comm):
        other = 1 - comm.rank
        for step in range(3):
            comm.exchange({other: (np.zeros(10), np.zeros(5, np.float32))}, [other], tag=("halo", step, "east"))
        comm.send(np.zeros(2), other, 7)
        before = comm.counters
        comm.allreduce(np.zeros(4))
        after = comm.counters
        families = comm.counters_by_family()
        comm.reset_counters()
        return before, after, families, comm.counters, comm.counters_by_family()

    results, _ = run_group(2, program)
    for before, after, families, reset, reset_families in results:
        assert before == {"messages": 4, "bytes": 3 * 100 + 16}
        assert after == {"messages": 5, "bytes": 3 * 100 + 16 + 32}
        assert families["halo"] == {"messages": 3, "bytes": 300}
        assert families["7"] == {"messages": 1, "bytes": 16}
        assert families["#allreduce"] == {"messages": 1, "bytes": 32, "calls": 1, "rounds": 1}
        assert reset == {"messages": 0, "bytes": 0} and reset_families == {}


# -- the same over dask's comm layer: ranks that share workers, not a power of two ----------------------------------
def _worker_ranks(session, ranks, function, *args):
    """The ranks ``ranks`` of ``session`` on this worker, a thread each (as an epoch runs them); ``{rank: result}``."""
    from distributed import get_worker

    from hpcgpu.partition.dask_communicator import communicator

    worker, results = get_worker(), {}

    def one(rank):
        try:
            results[rank] = function(communicator(session, rank, worker), *args)
        except Exception as error:  # noqa: BLE001 - reported to the test
            results[rank] = f"{type(error).__name__}: {error}"

    threads = [threading.Thread(target=one, args=(rank,)) for rank in ranks]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results


def _every_collective(comm, values):
    out = {"sum": comm.allreduce(values[comm.rank]), "max": comm.allreduce(values[comm.rank], "max")}
    out["allgather"] = comm.allgather((comm.rank, np.full(2, comm.rank)))
    out["bcast"] = comm.bcast(np.arange(3.0) if comm.rank == 3 else None, root=3)
    out["gather"] = comm.gather(comm.rank, root=4)
    comm.barrier()
    counted = comm.counters_by_family()
    out["rounds"] = {name: counted[f"#{name}"]["rounds"] for name in ("allgather", "barrier")}
    return out


def test_five_ranks_over_two_dask_workers_agree_bitwise(client):
    from hpcgpu.cluster import worker_info
    from hpcgpu.partition.dask_session import close_session, open_session

    workers = sorted(worker_info(client))
    addresses = [workers[r % 2] for r in range(5)]
    session = open_session(client, addresses, timeout=30)
    values = [np.random.default_rng(r).standard_normal(16) * 10.0 ** (4 * r - 8) for r in range(5)]
    try:
        futures = [client.submit(_worker_ranks, session, [r for r, a in enumerate(addresses) if a == w],
                                 _every_collective, values, workers=[w], allow_other_workers=False, pure=False)
                   for w in workers]
        results = {}
        for part in client.gather(futures):
            results.update(part)
    finally:
        close_session(client, session)
    total = tree_reduce(values, REDUCTIONS["sum"])
    for rank in range(5):
        out = results[rank]
        assert isinstance(out, dict), out
        assert out["sum"].tobytes() == total.tobytes()  # the same bits on every rank: the fixed tree order
        np.testing.assert_array_equal(out["max"], np.max(values, axis=0))
        assert [(r, g.tolist()) for r, g in out["allgather"]] == [(r, [r, r]) for r in range(5)]
        assert out["bcast"].tolist() == [0.0, 1.0, 2.0]
        assert out["gather"] == (list(range(5)) if rank == 4 else None)
        assert out["rounds"] == {"allgather": 3, "barrier": 3}  # ceil(log2 5)
