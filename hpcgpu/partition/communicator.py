"""The communicator of a partitioned run: ranks that message each other directly, not through dask's scheduler.

A :class:`Communicator` is what each rank of an SPMD epoch (one pinned task
per worker, see :mod:`hpcgpu.partition.engine`) uses to talk to the others:
its ``rank`` and the ``size`` of the group, tagged non-blocking point-to-point
messages (:meth:`~Communicator.isend`, :meth:`~Communicator.irecv`, each a
:class:`Request` to wait on with a timeout), the collectives a time loop
needs (:meth:`~Communicator.allreduce`, :meth:`~Communicator.allgather`,
:meth:`~Communicator.gather`, :meth:`~Communicator.bcast`,
:meth:`~Communicator.barrier`, and :meth:`~Communicator.exchange` with
neighbours), and :meth:`~Communicator.abort`, which ends the run on every
rank at once.

Semantics (those of MPI where it has them):

- messages from one rank to another with one tag arrive in the order they
  were sent; tags are strings, ints or tuples of them;
- a sent object must not be changed until its send request is complete;
- every wait has a timeout (:data:`DEFAULT_TIMEOUT_S` unless given):
  past it, :class:`~hpcgpu.errors.CommTimeout` names the peer and the tag;
- once any rank aborts (or the cluster loses a worker of the group), every
  wait on every rank raises :class:`~hpcgpu.errors.CommAborted` naming the
  cause, well before its timeout;
- collectives are called by every rank in the same order; each takes
  O(log P) rounds (:mod:`hpcgpu.partition.collectives`: recursive
  doubling, Bruck's allgather, binomial trees, dissemination) under tags
  of its own (``#<name>|<call>``), so consecutive collectives and
  point-to-point messages never mix; one timeout covers a whole
  collective; their results are the same on every rank, bitwise:
  reductions combine the values in a fixed tree order, the same on every
  rank whatever order messages arrive in
  (:func:`~hpcgpu.partition.collectives.tree_reduce`), not left to right.

Every rank counts what it sends: :attr:`~Communicator.counters` (messages,
and bytes of the arrays in them, see
:func:`~hpcgpu.partition.collectives.payload_nbytes`) and
:meth:`~Communicator.counters_by_family` (per tag family, the tag's first
part, e.g. ``"halo"`` for ``("halo", 3, "south")``; a collective's family
also counts its calls and rounds).

Transports implement :meth:`~Communicator._post_send`,
:meth:`~Communicator._post_receive` and :meth:`~Communicator.abort`:
:class:`hpcgpu.partition.dask_communicator.DaskCommunicator` rides on dask's comm
layer (tcp, tls, ucx), :class:`hpcgpu.partition.nccl_communicator.NcclCommunicator`
moves CuPy device buffers with NCCL.

Examples
--------
>>> comm = LoopbackCommunicator()
>>> comm.allreduce(3.0), comm.allgather("x"), comm.exchange({}, ())
(3.0, ['x'], {})
>>> comm.counters
{'messages': 0, 'bytes': 0}
"""

import abc
import operator
import time

import numpy as np

from hpcgpu.errors import CommAborted, CommError, CommTimeout, ConfigError
from hpcgpu.partition.collectives import (allgather_bruck, allreduce_recursive_doubling, barrier_dissemination,
                                          bcast_binomial, gather_binomial, payload_nbytes)

__all__ = ["Communicator", "DEFAULT_TIMEOUT_S", "LoopbackCommunicator", "REDUCTIONS", "Request", "tag_key"]

DEFAULT_TIMEOUT_S = 300.0
"""Longest wait for one message, in seconds: far above any step (and the first
step's JIT compile), so that only a hung or lost peer reaches it."""


def _logical_or(a, b):
    return np.logical_or(a, b) if isinstance(a, np.ndarray) or isinstance(b, np.ndarray) else bool(a or b)


def _logical_and(a, b):
    return np.logical_and(a, b) if isinstance(a, np.ndarray) or isinstance(b, np.ndarray) else bool(a and b)


def _maximum(a, b):
    return np.maximum(a, b) if isinstance(a, np.ndarray) or isinstance(b, np.ndarray) else max(a, b)


def _minimum(a, b):
    return np.minimum(a, b) if isinstance(a, np.ndarray) or isinstance(b, np.ndarray) else min(a, b)


REDUCTIONS = {"sum": operator.add, "max": _maximum, "min": _minimum, "any": _logical_or, "all": _logical_and}
"""The reductions of :meth:`Communicator.allreduce`, by name: ``combine(lower ranks' value, higher ranks' value)``."""


def tag_key(tag):
    """The string a tag travels as: strings and ints as they are, tuples joined by ``|``.

    Examples
    --------
    >>> tag_key(("halo", 3, "south")), tag_key(7)
    ('halo|3|south', '7')
    """
    if isinstance(tag, tuple):
        return "|".join(tag_key(part) for part in tag)
    if isinstance(tag, (str, int, np.integer)) and not isinstance(tag, bool):
        return str(tag)
    raise ConfigError(f"tag must be a str, an int or a tuple of them; got {tag!r}")


class Request:
    """A pending send or receive: :meth:`wait` for it (returns what was received; None for a send).

    Transports subclass it; ``describe`` says what it is in error messages.
    """

    def __init__(self, describe):
        self.describe = describe

    def done(self):  # pragma: no cover - interface
        """True when :meth:`wait` would return at once."""
        raise NotImplementedError

    def wait(self, timeout):  # pragma: no cover - interface
        """The result, waiting at most ``timeout`` seconds (CommTimeout past it, CommAborted on an abort)."""
        raise NotImplementedError


class _Finished(Request):
    def __init__(self, describe, value=None):
        super().__init__(describe)
        self.value = value

    def done(self):
        return True

    def wait(self, timeout):
        return self.value


class _Timed(Request):
    """A transport's request whose waits count towards its communicator's ``wait_seconds``."""

    def __init__(self, request, comm):
        super().__init__(request.describe)
        self.request, self.comm = request, comm

    def done(self):
        return self.request.done()

    def wait(self, timeout):
        started, cpu = time.perf_counter(), time.thread_time()
        # what the rank waits for, for a deadline's report (hpcgpu.partition.rank_activity)
        self.comm.waiting_for = (self.describe, time.monotonic())
        try:
            return self.request.wait(timeout)
        finally:
            self.comm.waiting_for = None
            self.comm.waited_until = time.monotonic()
            self.comm.wait_seconds += time.perf_counter() - started
            self.comm.wait_cpu_seconds += time.thread_time() - cpu


class Communicator(abc.ABC):
    """Rank ``rank`` of a group of ``size`` ranks; see the module doc for the semantics.

    Parameters
    ----------
    rank, size : int
    timeout : float
        Default timeout of every wait, in seconds.
    """

    #: the name this transport reports (``bench comm``, the dashboard)
    transport = "abstract"

    def __init__(self, rank, size, timeout=DEFAULT_TIMEOUT_S):
        if not 0 <= rank < size:
            raise ConfigError(f"rank must be in 0..{size - 1}; got {rank}")
        self.rank = rank
        self.size = size
        self.timeout = float(timeout)
        self._collectives = 0
        self._sent = {}    # tag family -> [messages, bytes] this rank sent
        self._rounds = {}  # collective family -> [calls, rounds] of this rank
        self._closed = False  # set by close(): a later send is an error (see close)
        self.wait_seconds = 0.0  # time this rank spent waiting for messages (the engine's exchange time)
        self.wait_cpu_seconds = 0.0  # CPU time of the waiting thread inside those waits (taking messages in)
        self.waiting_for = None  # (what, since when) during a wait: a deadline's report says it
        self.waited_until = 0.0  # when the last wait ended (time.monotonic())

    # -- what a transport provides --------------------------------------------------------
    @abc.abstractmethod
    def _post_send(self, obj, dest, key):
        """Start sending ``obj`` to rank ``dest`` under the tag key ``key``; a :class:`Request`."""

    @abc.abstractmethod
    def _post_receive(self, source, key):
        """Start receiving from rank ``source`` under ``key``; a :class:`Request`."""

    @abc.abstractmethod
    def abort(self, reason):
        """End the run on every rank: every pending and later wait raises CommAborted with ``reason``."""

    def close(self):
        """Release this rank's connections (the other ranks of its session keep theirs).

        The rank sends nothing more in the session afterwards (a send raises
        CommError): a message on a new connection could overtake one still
        in flight on the closed one. Transports that keep connections
        override this and call it.
        """
        self._closed = True

    # -- point to point -------------------------------------------------------------------
    def _peer(self, name, peer):
        if not isinstance(peer, (int, np.integer)) or isinstance(peer, bool) or not 0 <= peer < self.size:
            raise ConfigError(f"{name} must be a rank in 0..{self.size - 1}; got {peer!r}")
        if peer == self.rank:
            raise ConfigError(f"{name}={peer} is this rank itself; keep local data local")
        return int(peer)

    def isend(self, obj, dest, tag):
        """Send ``obj`` to rank ``dest`` with ``tag``; returns a :class:`Request` (do not change ``obj`` before it is done)."""
        return self._send(obj, self._peer("dest", dest), tag_key(tag))

    def irecv(self, source, tag):
        """Receive the next object rank ``source`` sent with ``tag``; returns a :class:`Request`."""
        return self._receive(self._peer("source", source), tag_key(tag))

    def _send(self, obj, dest, key):
        if self._closed:
            raise CommError(f"rank {self.rank}: send to rank {dest} after close(); a closed rank sends nothing "
                            f"more in its session (open a new communicator)", rank=self.rank)
        request = _Timed(self._post_send(obj, dest, key), self)
        family = key.partition("|")[0]
        counted = self._sent.get(family)
        if counted is None:
            counted = self._sent[family] = [0, 0]
        counted[0] += 1
        counted[1] += payload_nbytes(obj)
        return request

    def _receive(self, source, key):
        return _Timed(self._post_receive(source, key), self)

    def send(self, obj, dest, tag, timeout=None):
        """Send and wait until the send is complete."""
        self.isend(obj, dest, tag).wait(self._timeout(timeout))

    def recv(self, source, tag, timeout=None):
        """Receive, waiting at most ``timeout`` seconds."""
        return self.irecv(source, tag).wait(self._timeout(timeout))

    def _timeout(self, timeout):
        return self.timeout if timeout is None else float(timeout)

    def waitall(self, requests, timeout=None):
        """Wait for every request (one deadline for all); returns their results in order."""
        deadline = time.monotonic() + self._timeout(timeout)
        return [request.wait(max(0.0, deadline - time.monotonic())) for request in requests]

    def exchange(self, sends, sources, tag="exchange", timeout=None):
        """Send ``sends[dest]`` to each ``dest`` and receive from each of ``sources``; ``{source: object}``.

        The sends and receives are all posted before any wait, so neighbours
        that exchange with each other never wait on each other's order.
        """
        receives = {source: self.irecv(source, tag) for source in sources}
        posted = [self.isend(obj, dest, tag) for dest, obj in sends.items()]
        results = dict(zip(receives, self.waitall(list(receives.values()), timeout)))
        self.waitall(posted, timeout)
        return results

    # -- what was sent ----------------------------------------------------------------------
    @property
    def counters(self):
        """``{"messages": int, "bytes": int}``: what this rank sent so far (a snapshot; subtract two for a step).

        Bytes are those of the arrays in the messages
        (:func:`~hpcgpu.partition.collectives.payload_nbytes`), not of their
        pickled envelopes. Collective algorithms' messages are included.
        """
        return {"messages": sum(m for m, _ in self._sent.values()), "bytes": sum(b for _, b in self._sent.values())}

    def counters_by_family(self):
        """What this rank sent, per tag family: ``{family: {"messages": int, "bytes": int}}``.

        A tag's family is its first part (``"halo"`` for ``("halo", 3,
        "south")``); a collective's is ``"#<name>"`` (``"#allreduce"``) and
        also counts ``calls`` and ``rounds`` (this rank's), so that
        ``rounds / calls`` is the rounds per call.

        Examples
        --------
        >>> comm = LoopbackCommunicator()
        >>> comm.allreduce(1.0)
        1.0
        >>> comm.counters_by_family()
        {'#allreduce': {'messages': 0, 'bytes': 0, 'calls': 1, 'rounds': 0}}
        """
        out = {family: {"messages": m, "bytes": b} for family, (m, b) in self._sent.items()}
        for family, (calls, rounds) in self._rounds.items():
            out.setdefault(family, {"messages": 0, "bytes": 0}).update(calls=calls, rounds=rounds)
        return out

    def reset_counters(self):
        """Set every counter back to zero."""
        self._sent, self._rounds = {}, {}

    # -- collectives ----------------------------------------------------------------------
    def _collective(self, name, timeout):
        """The round primitive of one collective call (see :mod:`hpcgpu.partition.collectives`)."""
        self._collectives += 1
        return _Rounds(self, f"#{name}", self._collectives, self._timeout(timeout))

    def _root(self, root):
        if not isinstance(root, (int, np.integer)) or isinstance(root, bool) or not 0 <= root < self.size:
            raise ConfigError(f"root must be a rank in 0..{self.size - 1}; got {root!r}")
        return int(root)

    def allgather(self, value, timeout=None):
        """Every rank's ``value``, in rank order, on every rank (Bruck's algorithm: ``ceil(log2 P)`` rounds)."""
        with self._collective("allgather", timeout) as step:
            return allgather_bruck(self.rank, self.size, value, step)

    def allreduce(self, value, op="sum", timeout=None):
        """``value`` reduced over all ranks with ``op`` (``sum``, ``max``, ``min``, ``any``, ``all``).

        Scalars or NumPy arrays, by recursive doubling (``log2 P`` rounds
        when P is a power of two; the ranks beyond the largest power of two
        fold into it first and get the result back at the end). Every rank
        gets the same result bitwise: the values are combined in a fixed
        tree order (:func:`~hpcgpu.partition.collectives.tree_reduce`),
        whatever order they arrive in.
        """
        if op not in REDUCTIONS:
            raise ConfigError(f"op must be one of {sorted(REDUCTIONS)}; got {op!r}")
        combine = REDUCTIONS[op]
        with self._collective("allreduce", timeout) as step:
            if self.size == 1:
                return combine(value, value) if op in ("any", "all") else value
            return allreduce_recursive_doubling(self.rank, self.size, value, combine, step)

    def gather(self, value, root=0, timeout=None):
        """Every rank's ``value`` in rank order on ``root`` (None on the others), up a binomial tree."""
        root = self._root(root)
        with self._collective("gather", timeout) as step:
            return gather_binomial(self.rank, self.size, value, root, step)

    def bcast(self, value, root=0, timeout=None):
        """``root``'s ``value`` on every rank, down a binomial tree (``value`` is ignored elsewhere)."""
        root = self._root(root)
        with self._collective("bcast", timeout) as step:
            return bcast_binomial(self.rank, self.size, value, root, step)

    def barrier(self, timeout=None):
        """Return once every rank has called it (dissemination: ``ceil(log2 P)`` rounds)."""
        with self._collective("barrier", timeout) as step:
            barrier_dissemination(self.rank, self.size, step)

    def __repr__(self):
        return f"{type(self).__name__}(rank={self.rank}, size={self.size})"


class _Rounds:
    """One collective call's rounds: each posts its receives and sends under the call's key, one deadline for all.

    Used as a context manager: on a normal exit it waits for the call's
    sends (the objects they carry may be the caller's) and counts the
    call and its rounds.
    """

    def __init__(self, comm, family, call, timeout):
        self.comm, self.family, self.call, self.timeout = comm, family, call, timeout
        self.deadline = time.monotonic() + timeout
        self.rounds = 0
        self.sends = []

    def __call__(self, sends, sources):
        comm = self.comm
        # one key for the whole call: no two of its messages go from one rank to the same other rank,
        # and ranks take different numbers of rounds (allreduce's fold), so no round number in it
        key = f"{self.family}|{self.call}"
        self.rounds += 1
        receives = [comm._receive(source, key) for source in sources]
        self.sends.extend(comm._send(obj, dest, key) for dest, obj in sends)
        return [request.wait(self._left()) for request in receives]

    def _left(self):
        return max(0.0, self.deadline - time.monotonic())

    def __enter__(self):
        return self

    def __exit__(self, kind, error, traceback):
        if kind is None:
            for request in self.sends:
                request.wait(self._left())
        counted = self.comm._rounds.setdefault(self.family, [0, 0])
        counted[0] += 1
        counted[1] += self.rounds
        return False


class LoopbackCommunicator(Communicator):
    """The group of one: collectives return this rank's own values (the engine's single-partition case)."""

    transport = "loopback"

    def __init__(self, timeout=DEFAULT_TIMEOUT_S):
        super().__init__(0, 1, timeout)
        self._aborted = None

    def _post_send(self, obj, dest, key):  # pragma: no cover - _peer refuses every dest of a group of one
        raise AssertionError("a group of one has no peers")

    _post_receive = _post_send

    def abort(self, reason):
        self._aborted = reason

    def check(self):
        """Raise CommAborted if this rank aborted."""
        if self._aborted is not None:
            raise CommAborted(f"the run was aborted: {self._aborted}", rank=0)


def raise_timeout(describe, timeout, rank):
    """The CommTimeout of a wait for ``describe`` that took ``timeout`` seconds."""
    raise CommTimeout(f"rank {rank}: no completion of {describe} within {timeout:g} s (a peer hangs, or its "
                      "worker is gone)", rank=rank)
