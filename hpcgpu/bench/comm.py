"""``hpcgpu bench comm``: the communicator's round trip, bandwidth and collectives, per worker pair.

The partitioned engine's ranks message each other through a communicator
(:mod:`hpcgpu.partition.dask_communicator`: worker to worker over dask's comm layer,
never through the scheduler). This suite measures it on a local cluster of
``workers`` single-threaded CPU workers, or on the workers of a running
scheduler, with one session of one rank per worker (one pinned task each,
as an epoch runs):

* case ``round_trip``, for every ordered pair (source, destination) and
  every size: the source sends a NumPy array of ``size`` bytes (``uint8``)
  and waits for the destination to send it back (ping-pong, after a
  warm-up that also opens the streams); ``value`` is the median round trip
  (s), ``p90_s`` its 90th percentile. The source posts the send and waits
  for the reply, as :meth:`~hpcgpu.partition.communicator.Communicator.exchange`
  does; send completions are collected outside the timed region;
* case ``bandwidth``, from the same round trips: one-way throughput,
  ``2 * size`` over the median round trip (B/s). Large messages repeat
  fewer times: at most ``repeats``, about :data:`TRAFFIC_BYTES` per size
  and pair, and at least 3;
* case ``allreduce`` (a float64 scalar, ``sum``) and case ``barrier``, over
  all ranks: per repeat, the slowest rank's time; ``value`` is the median;
* case ``allreduce_shared_ranks``: the same allreduce on a session of
  :data:`SHARED_RANKS` ranks spread round-robin over the workers (the ranks
  of one worker are threads of one task, as an epoch runs them), the
  log-P algorithm at a size two workers cannot give it otherwise; with
  ``ranks``, ``rounds_per_rank`` (the most rounds a rank took per call,
  from the communicator's counters: ``log2 P`` for a power of two),
  ``rounds_by_rank`` and ``messages_by_rank`` (sent per call);
* case ``task_round_trip``, for comparison, per ordered pair: the same
  round trip of the smallest size through dask tasks, what the engine paid
  per dependent level before it had a communicator
  (:func:`task_round_trips`), with
  ``ratio_to_communicator``, its round trip over the communicator's.

Every line has ``suite`` ("comm"), ``case``, ``workers`` (the pair, or all
workers for a collective), ``size`` (bytes), ``metric``, ``value``,
``unit``, ``median_s``, ``p90_s``, ``repeats``, ``transport`` (the
communicator's: "direct", sockets from the ranks' threads on tcp and tls,
or "dask", dask's comm layer),
``protocol`` (tcp, tls or ucx, from the scheduler's address) and ``path``
("communicator", or "tasks" for ``task_round_trip``); ``backend`` and
``ratio_to_numpy`` are null (no compute backend is involved).

Examples
--------
>>> from hpcgpu.bench.harness import Recorder  # doctest: +SKIP
>>> from hpcgpu.cluster import start_cluster  # doctest: +SKIP
>>> client = start_cluster(workers=2, threads_per_worker=1, gpus=False, quiet=True)  # doctest: +SKIP
>>> lines = run(Recorder("comm"), client, sizes=(4096,), repeats=50)  # doctest: +SKIP
>>> sorted({r["case"] for r in lines})  # doctest: +SKIP
['allreduce', 'allreduce_shared_ranks', 'bandwidth', 'barrier', 'round_trip', 'task_round_trip']
"""

import sys
import time
import uuid

import numpy as np

from hpcgpu.errors import ClusterError, ConfigError
from hpcgpu.validation import check_int

__all__ = ["run", "measure", "check_arguments", "protocol_of", "DEFAULT_SIZES", "DEFAULT_REPEATS",
           "DEFAULT_WORKERS", "SHARED_RANKS", "TRAFFIC_BYTES", "measure_shared_allreduce", "task_round_trips"]

DEFAULT_SIZES = (4096, 2**20, 64 * 2**20)
"""Message sizes (bytes): a small message (latency), and two large ones (bandwidth)."""

DEFAULT_REPEATS = 100
"""Timed round trips per pair and size (fewer for large messages, see :data:`TRAFFIC_BYTES`)."""

DEFAULT_WORKERS = 2

SHARED_RANKS = 8
"""Ranks of the case ``allreduce_shared_ranks``, spread round-robin over the measured workers."""

TRAFFIC_BYTES = 2**31
"""About this many bytes per size and pair, both ways together, cap a large message's repeats."""

SMALL_BYTES = 2**16
"""Messages up to this size warm up with :data:`_SMALL_WARMUP` round trips, larger ones with one."""

_SMALL_WARMUP = 10
_TASK_ROUND_TRIPS = 10  # per timed chain of the task path: shares its one client round trip
_TASK_REPEATS = 20
_SESSION_TIMEOUT_S = 120.0


def _payload(nbytes):
    return np.ones(max(1, nbytes // 8))


def _forward(array):
    # a result of its own on this worker: the next task of the chain, on the other worker, must fetch it
    return array


def task_round_trips(client, source, destination, nbytes, repeats=5, round_trips=10):
    """Seconds per round trip of an array of ``nbytes`` through dask tasks, ``repeats`` times.

    The task path the partitioned engine took before its communicator: an
    array made on ``source``, then a chain of ``2 * round_trips`` tasks
    alternately on ``destination`` and ``source``, each needing the result
    of the one before (a dependent level: the scheduler learns that a task
    finished, assigns the next, whose worker fetches the array from its
    peer). The whole chain is submitted at once and timed from submission
    to its end, so the one client round trip is shared by all its levels;
    each repeat gives its time over ``round_trips``.

    Examples
    --------
    >>> task_round_trips(client, a, b, 4096, repeats=3)  # doctest: +SKIP
    [0.0151, 0.0149, 0.0162]
    """
    from distributed import wait

    pinned = dict(allow_other_workers=False, pure=False)
    out = []
    for _ in range(repeats):
        made = client.submit(_payload, nbytes, workers=[source], key=f"acceptance-payload-{uuid.uuid4().hex[:8]}",
                             **pinned)
        wait(made)
        start = time.perf_counter()
        chain = [made]
        for level in range(2 * round_trips):
            worker = destination if level % 2 == 0 else source
            chain.append(client.submit(_forward, chain[-1], workers=[worker], **pinned,
                                       key=f"acceptance-round-trip-{uuid.uuid4().hex[:8]}"))
        wait(chain[-1])
        out.append((time.perf_counter() - start) / round_trips)
        del made, chain
    return out


def check_arguments(sizes=DEFAULT_SIZES, workers=DEFAULT_WORKERS, repeats=DEFAULT_REPEATS):
    """Check the suite's arguments; ConfigError naming the first one out of range.

    Examples
    --------
    >>> check_arguments((4096,), 2, 10)
    >>> check_arguments((0,), 2, 10)
    Traceback (most recent call last):
    ...
    hpcgpu.errors.ConfigError: size must be >= 1, got 0
    """
    for size in sizes:
        check_int("size", size, minimum=1)
    if workers is not None:
        check_int("workers", workers, minimum=2)
    check_int("repeats", repeats, minimum=1)


def protocol_of(address):
    """The protocol of a dask address: ``tcp``, ``tls``, ``ucx``, ``inproc``, ...

    Examples
    --------
    >>> protocol_of("tcp://127.0.0.1:8786"), protocol_of("ucx://10.0.0.2:1234")
    ('tcp', 'ucx')
    """
    return address.split("://", 1)[0] if "://" in address else "tcp"


def _repeats_for(size, repeats, traffic_bytes=TRAFFIC_BYTES):
    capped = traffic_bytes // (2 * size)
    return max(min(3, repeats), min(repeats, capped))


def _warmup_for(size):
    return _SMALL_WARMUP if size <= SMALL_BYTES else 1


def _ping_pong(comm, source, destination, size, warmup, repeats):
    """The source's round trips (s), timed; the destination echoes; other ranks have nothing to do."""
    durations = []
    if comm.rank == source:
        payload = np.ones(size, dtype=np.uint8)
        for k in range(warmup + repeats):
            start = time.perf_counter()
            sent = comm.isend(payload, destination, "ping")
            comm.recv(destination, "pong")
            elapsed = time.perf_counter() - start
            sent.wait(comm.timeout)
            if k >= warmup:
                durations.append(elapsed)
    elif comm.rank == destination:
        pending = None
        for _ in range(warmup + repeats):
            echo = comm.recv(source, "ping")
            if pending is not None:
                pending.wait(comm.timeout)
            pending = comm.isend(echo, source, "pong")
        pending.wait(comm.timeout)
    return durations


def _collective(call, warmup, repeats):
    durations = []
    for k in range(warmup + repeats):
        start = time.perf_counter()
        call()
        if k >= warmup:
            durations.append(time.perf_counter() - start)
    return durations


def _rank_program(session, rank, plan, collective_repeats):
    """One rank's part of the whole plan (a task pinned to its worker); ``{key: durations}``."""
    from hpcgpu.partition.dask_communicator import communicator

    comm = communicator(session, rank)
    out = {}
    try:
        for source, destination, size, warmup, repeats in plan:
            durations = _ping_pong(comm, source, destination, size, warmup, repeats)
            if durations:
                out[("pair", source, destination, size)] = durations
            # pairs one at a time: no other traffic meets the pair being timed
            comm.barrier()
        if collective_repeats:
            out[("allreduce",)] = _collective(lambda: comm.allreduce(1.0), _SMALL_WARMUP, collective_repeats)
            out[("barrier",)] = _collective(comm.barrier, _SMALL_WARMUP, collective_repeats)
        return out
    except BaseException as error:
        # the other ranks stop waiting for this one at once, not at their timeout
        comm.abort(f"bench comm failed: {type(error).__name__}: {error}")
        raise


def _shared_allreduce(session, ranks, warmup, repeats):
    """The allreduce timed on ``session``'s ranks ``ranks`` of this worker, a thread each.

    ``{rank: (durations, rounds per call, messages sent per call)}``.
    """
    from distributed import get_worker

    from hpcgpu.partition.dask_communicator import communicator
    from hpcgpu.partition.worker_ranks import aborting_on_failure, run_ranks

    worker = get_worker()  # the rank threads are not task threads: they get it from here

    def one(k):
        comm = None
        # a rank that fails aborts the session: the others stop waiting for it at once, not at their timeout
        with aborting_on_failure(session, ranks[k], worker, lambda: comm):
            comm = communicator(session, ranks[k], worker)
            comm.barrier()  # every rank there (and every stream open) before the warm-up
            durations = _collective(lambda: comm.allreduce(1.0), warmup, repeats)
            counted = comm.counters_by_family()["#allreduce"]
            return durations, counted["rounds"] / counted["calls"], counted["messages"] / counted["calls"]

    # the root cause first if a rank fails: the other ranks' CommAborted follow from it
    return dict(zip(ranks, run_ranks(ranks, one, name="hpcgpu-bench-rank")))


def measure_shared_allreduce(client, workers, ranks=SHARED_RANKS, repeats=DEFAULT_REPEATS):
    """The allreduce of a float64 scalar on ``ranks`` ranks spread round-robin over ``workers``.

    Parameters
    ----------
    client : distributed.Client
    workers : sequence of str
        Worker addresses; rank ``r`` runs on ``workers[r % len(workers)]``.
    ranks : int
        Ranks of the session (at least 2).
    repeats : int
        Timed allreduces (after :data:`_SMALL_WARMUP` untimed ones).

    Returns
    -------
    dict
        ``{"durations": [s, ...], "rounds": [per rank], "messages": [per rank], "addresses": [per rank]}``:
        the slowest rank's time of each repeat, and each rank's rounds and
        messages sent per allreduce.

    Examples
    --------
    >>> measure_shared_allreduce(client, addresses, ranks=8, repeats=20)["rounds"]  # doctest: +SKIP
    [3.0, 3.0, 3.0, 3.0, 3.0, 3.0, 3.0, 3.0]
    """
    from hpcgpu.partition.dask_session import close_session, open_session

    check_int("ranks", ranks, minimum=2)
    workers = list(workers)
    addresses = [workers[rank % len(workers)] for rank in range(ranks)]
    session = open_session(client, addresses, timeout=_SESSION_TIMEOUT_S)
    try:
        futures = [client.submit(_shared_allreduce, session, [r for r, a in enumerate(addresses) if a == w],
                                 _SMALL_WARMUP, repeats, workers=[w], allow_other_workers=False, pure=False,
                                 key=f"hpcgpu-bench-comm-shared-{session.id}-{w}")
                   for w in sorted(set(addresses))]
        by_rank = {}
        for part in client.gather(futures):
            by_rank.update(part)
    finally:
        close_session(client, session)
    return {"durations": [float(max(column)) for column in zip(*(by_rank[r][0] for r in range(ranks)))],
            "rounds": [by_rank[r][1] for r in range(ranks)], "messages": [by_rank[r][2] for r in range(ranks)],
            "addresses": addresses}


def measure(client, workers, sizes=DEFAULT_SIZES, repeats=DEFAULT_REPEATS, collectives=True,
            traffic_bytes=TRAFFIC_BYTES):
    """The communicator's round trips over every ordered pair of ``workers``, and its collectives.

    Parameters
    ----------
    client : distributed.Client
    workers : sequence of str
        Worker addresses, one rank each (rank order), at least 2.
    sizes : sequence of int
        Message sizes (bytes).
    repeats : int
        Timed round trips per pair and size (fewer for large messages, see
        :data:`TRAFFIC_BYTES`) and timed collectives.
    collectives : bool
        Also time ``allreduce`` and ``barrier`` over all ranks.
    traffic_bytes : int
        Bytes per size and pair (both ways) that cap a large message's
        repeats (at least 3 are kept).

    Returns
    -------
    dict
        ``{"pairs": {(source, destination): {size: [s, ...]}}, "allreduce": [s, ...], "barrier": [s, ...]}``,
        source and destination as addresses; a collective's list holds the
        slowest rank's time of each repeat (absent without ``collectives``).

    Raises
    ------
    ClusterError
        Fewer than two distinct workers.
    CommError
        A rank failed (every rank stops; the error names the rank).
    """
    from hpcgpu.partition.dask_session import close_session, open_session

    workers = list(workers)
    if len(set(workers)) < 2 or len(set(workers)) != len(workers):
        raise ClusterError(f"bench comm needs two or more distinct workers, one rank each; got {workers}")
    plan = [(i, j, size, _warmup_for(size), _repeats_for(size, repeats, traffic_bytes))
            for i in range(len(workers)) for j in range(len(workers)) if i != j for size in sizes]
    session = open_session(client, workers, timeout=_SESSION_TIMEOUT_S)
    try:
        futures = [client.submit(_rank_program, session, rank, plan, repeats if collectives else 0,
                                 workers=[address], allow_other_workers=False, pure=False,
                                 key=f"hpcgpu-bench-comm-{session.id}-{rank}")
                   for rank, address in enumerate(workers)]
        ranks = client.gather(futures)
    finally:
        close_session(client, session)
    pairs = {}
    for rank_result in ranks:
        for key, durations in rank_result.items():
            if key[0] == "pair":
                _, i, j, size = key
                pairs.setdefault((workers[i], workers[j]), {})[size] = durations
    out = {"pairs": pairs, "transport": "direct" if session.direct else "dask"}
    if collectives:
        for name in ("allreduce", "barrier"):
            out[name] = [float(max(column)) for column in zip(*(r[(name,)] for r in ranks))]
    return out


def _p90(durations):
    return float(np.percentile(durations, 90))


def run(recorder, client, *, workers=None, sizes=DEFAULT_SIZES, repeats=DEFAULT_REPEATS, stream=sys.stderr):
    """Run the comm suite on ``client``'s workers; results go to ``recorder`` (one JSON line each).

    Parameters
    ----------
    recorder : hpcgpu.bench.harness.Recorder
    client : distributed.Client
    workers : int, optional
        Measure the first ``workers`` workers (sorted by address); default all.
    sizes : sequence of int
        Message sizes (bytes); the smallest is also sent through tasks.
    repeats : int
        Timed round trips per pair and size, and timed collectives.
    stream : file, optional
        Where progress goes (default stderr; None for none).

    Returns
    -------
    list of dict
        The recorder's results.

    Raises
    ------
    ConfigError
        A size below 1 byte or above a quarter of the smallest worker memory
        limit, fewer than 2 workers or fewer than 1 repeat.
    ClusterError
        The cluster has fewer workers than asked for, or fewer than 2.
    """
    from hpcgpu.cluster import worker_info

    sizes = sorted(set(sizes))
    check_arguments(sizes, workers, repeats)
    info = worker_info(client)
    addresses = sorted(info)
    wanted = len(addresses) if workers is None else workers
    if len(addresses) < max(2, wanted):
        raise ClusterError(f"bench comm needs {max(2, wanted)} workers; the cluster at {client.scheduler.address} "
                           f"has {len(addresses)}")
    addresses = addresses[:wanted]
    # a rank holds a message, its echo and their buffers at once: a size beyond a quarter of a worker's
    # memory limit ends in a MemoryError (or a paused worker) deep inside a rank, not in a clear error
    limits = [info[a].get("memory_limit") or 0 for a in addresses]
    room = min((limit for limit in limits if limit > 0), default=None)
    if room is not None and sizes[-1] > room // 4:
        raise ConfigError(f"size must be <= {room // 4} bytes on this cluster (a quarter of its smallest worker "
                          f"memory limit, {room} bytes); got {sizes[-1]}")
    hosts = {a: info[a].get("host", a) for a in addresses}
    common = dict(protocol=protocol_of(client.scheduler.address), path="communicator")
    if stream is not None:
        print(f"hpcgpu bench comm: {len(addresses)} workers ({common['protocol']}), "
              f"{len(addresses) * (len(addresses) - 1)} ordered pairs, sizes {sizes} bytes", file=stream)
    measured = measure(client, addresses, sizes, repeats)
    common["transport"] = measured["transport"]
    for (source, destination), by_size in measured["pairs"].items():
        pair = dict(workers=[source, destination], source=source, destination=destination,
                    same_host=hosts[source] == hosts[destination], **common)
        for size in sizes:
            durations = by_size[size]
            median = float(np.median(durations))
            recorder.add(case="round_trip", backend=None, dtype="uint8", size=size, metric="round_trip_s",
                         value=median, unit="s", durations=durations, p90_s=_p90(durations), **pair)
            recorder.add(case="bandwidth", backend=None, dtype="uint8", size=size, metric="bandwidth_bytes_per_s",
                         value=2 * size / median, unit="B/s", durations=durations, p90_s=_p90(durations),
                         note="one way: 2 * size over the median ping-pong round trip", **pair)
    every = dict(workers=addresses, ranks=len(addresses), **common)
    recorder.add(case="allreduce", backend=None, dtype="float64", size=8, metric="latency_s",
                 value=float(np.median(measured["allreduce"])), unit="s", durations=measured["allreduce"],
                 p90_s=_p90(measured["allreduce"]), op="sum", note="a scalar; the slowest rank's time per repeat",
                 **every)
    recorder.add(case="barrier", backend=None, dtype="none", size=0, metric="latency_s",
                 value=float(np.median(measured["barrier"])), unit="s", durations=measured["barrier"],
                 p90_s=_p90(measured["barrier"]), note="the slowest rank's time per repeat", **every)
    shared = measure_shared_allreduce(client, addresses, SHARED_RANKS, repeats)
    recorder.add(case="allreduce_shared_ranks", backend=None, dtype="float64", size=8, metric="latency_s",
                 value=float(np.median(shared["durations"])), unit="s", durations=shared["durations"],
                 p90_s=_p90(shared["durations"]), op="sum", workers=addresses, ranks=SHARED_RANKS,
                 rounds_per_rank=max(shared["rounds"]), rounds_by_rank=shared["rounds"],
                 messages_by_rank=shared["messages"], **common,
                 note=f"a scalar on {SHARED_RANKS} ranks round-robin over the workers (a worker's ranks are "
                      "threads of one task); the slowest rank's time per repeat")
    small = sizes[0]
    for (source, destination), by_size in measured["pairs"].items():
        durations = task_round_trips(client, source, destination, small, repeats=min(repeats, _TASK_REPEATS),
                                     round_trips=_TASK_ROUND_TRIPS)
        median = float(np.median(durations))
        recorder.add(case="task_round_trip", backend=None, dtype="float64", size=small, metric="round_trip_s",
                     value=median, unit="s", durations=durations, p90_s=_p90(durations),
                     workers=[source, destination], source=source, destination=destination,
                     same_host=hosts[source] == hosts[destination], **{**common, "path": "tasks", "transport": "dask"},
                     payload_bytes=8 * max(1, small // 8),
                     round_trips_per_chain=_TASK_ROUND_TRIPS,
                     ratio_to_communicator=median / float(np.median(by_size[small])),
                     note="a chain of dependent tasks alternately on the two workers, submitted at once; "
                          "each repeat is the chain's time over its round trips")
    return recorder.results
