"""The communicator's NCCL transport: CuPy device buffers move GPU to GPU, everything else rides on dask.

:class:`NcclCommunicator` wraps a
:class:`~hpcgpu.partition.dask_comm.DaskCommunicator` (the *base*). The
device buffers of a message (a bare ``cupy.ndarray``, or the CuPy arrays
inside any picklable object: a model's state dataclass, a tuple, a dict)
travel through NCCL (``cupy.cuda.nccl``); the rest of the message,
everything else (Python objects, NumPy arrays, scalars), every abort and
every timeout go through the base. :func:`choose_communicator` gives the
engine this transport where every rank has a GPU of its own, else the
base.

Matching, as in MPI
-------------------
A send posts the NCCL sends of its device buffers at once (each in C
order: a non-contiguous array is copied first), then sends
two small messages over the base: a *header* on the direction's control
key (sequence number, shape, dtype of each buffer) and the *envelope*
under the caller's tag (the object with a placeholder for each buffer).
The base matches tags and keeps the order per (source, tag) exactly as for
host objects, so one tag may carry host and device messages in any mix;
the receiver posts NCCL receives in the order of the headers, which is the
sender's order, so NCCL's order-matched point-to-point operations never
cross two messages. The receiver does not need to know shapes or dtypes.

An NCCL send may wait until its receive is posted (NVIDIA/nccl#783).
Receives are therefore posted *eagerly*: whenever a rank waits for
anything on this communicator, it reads the headers that reached it from
every peer and posts their receives (into new arrays, which wait there
until the caller receives them). A device send completes once its
receiver has entered the communicator; until then its NCCL kernel waits on
the sender's GPU. A rank that never waits on the communicator holds its
peers' device sends (until their timeout), as an MPI rank that never makes
progress does.

Why one NCCL communicator per direction
---------------------------------------
NCCL runs the operations of one communicator one after the other
(NVIDIA/nccl#574): two ranks that both send before receiving, as every
halo exchange does, would deadlock on one communicator. So each ordered
pair (i -> j) has a two-rank communicator that carries only i's sends to
j, in order; a main communicator of all ranks carries the collectives.
NCCL connects two ranks at their first send/receive, blocking the host
until the peer joins (NVIDIA/nccl#783), so the bootstrap connects every
direction while all ranks are there, in one global order (which cannot
deadlock). That is P(P-1) + 1 communicators for P ranks:
:func:`choose_communicator` keeps the base beyond :data:`MAX_RANKS`.

Streams and completion
----------------------
Each NCCL communicator has its own non-blocking stream (no implicit
synchronisation with the legacy default stream where CuPy launches
kernels). An NCCL operation first waits on an event recorded on the
caller's current stream (the data to send is written; a receive buffer's
memory is no longer read there), and a request completes when the event
recorded after the operation is done, polled against the wait's timeout.

Collectives
-----------
``allgather`` of bare device arrays exchanges small descriptors over the
base first (every rank then takes the same path), then runs one
ncclAllGather of the bytes, each rank's padded to the longest: exact
copies. ``allreduce`` of device arrays combines the gathered values in
rank order on every rank with CuPy: bitwise the same on every rank, and
what the generic rank-order reduction gives. With ``ordered=False``,
arrays of one shape and dtype are reduced by ncclAllReduce (sum, max,
min): NCCL computes each element once and copies it to every rank (ring
and tree algorithms), so the ranks agree with each other, but the order of
the additions is NCCL's, not rank order: not bitwise the rank-order sum
for floats. Scalars and host values take the base path (the generic
rank-order reduction). ``gather``, ``bcast``, ``exchange`` and ``barrier``
are the generic ones on the point-to-point path above.

Faults
------
An abort by any rank (the base's) aborts this rank's NCCL communicators
(ncclCommAbort: kernels waiting for a peer stop) and its waits raise
:class:`~hpcgpu.errors.CommAborted`. An NCCL operation past its wait's
timeout aborts the NCCL communicators and the session, then raises
:class:`~hpcgpu.errors.CommTimeout`. Either way the session's NCCL
transport is gone; later calls raise CommAborted.

Limits (NCCL's)
---------------
- Ranks must be on distinct GPUs: NCCL does not support two ranks of one
  communicator on one device (NCCL user guide, "Creating a Communicator")
  and refuses it at init since NCCL 2.5 ("Duplicate GPU detected",
  NVIDIA/nccl#418). NCCL tells devices apart by host and PCI bus id, the
  host being ``NCCL_HOSTID`` where set; :func:`choose_communicator` uses
  the same rule.
- ncclCommInitRank has no timeout: a rank lost during the bootstrap leaves
  the others in it (the client still sees the lost worker).
- Several NCCL communicators run their kernels concurrently, which needs
  the GPU to hold them all (NCCL user guide, "Using multiple NCCL
  communicators concurrently"); these kernels are small.
- A device-wide synchronisation (``cudaDeviceSynchronize``, a
  ``cudaFree``) while a device send waits for its receiver waits for that
  receiver, without a timeout: wait for device sends before synchronising
  the device, and receive a device message in the epoch that sent it (the
  engine synchronises the device at the end of an epoch; its
  decompositions receive every halo in the step that sends it).
- A receive waits for the work queued before it on the caller's stream
  (its buffer is allocated there), and eagerly posted receives are
  allocated as their headers arrive.

The NCCL communicators are created inside the first epoch of a session
and kept on the worker for the next ones (:func:`release` ends them).

Examples
--------
>>> def epoch(session, rank):  # doctest: +SKIP
...     comm = choose_communicator(session, rank)   # NCCL on GPU workers, dask elsewhere
...     halo = comm.exchange({1 - rank: cupy.arange(4.0) + rank}, [1 - rank])
...     return comm.transport, float(halo[1 - rank][0])
"""

import collections
import ctypes
import functools
import io
import os
import pickle
import socket
import threading
import time
from dataclasses import dataclass

import numpy as np

from hpcgpu.errors import CommAborted, CommError, CommTimeout, ConfigError
from hpcgpu.partition.communicator import REDUCTIONS, Communicator, Request, raise_timeout

__all__ = ["MAX_RANKS", "NCCL_ENV", "NcclCommunicator", "choose_communicator", "nccl_communicator",
           "nccl_identity", "release", "use_nccl"]

NCCL_ENV = "HPCGPU_COMM_NCCL"
"""Environment variable: ``0`` keeps device arrays on the base communicator (dask's comm layer)."""

MAX_RANKS = 8
"""Most ranks :func:`choose_communicator` gives NCCL: each rank holds 2(P-1) + 1 NCCL communicators, each
with its connection buffers and proxy thread (measure before raising it)."""

_CONTROL_KEY = "#nccl-header"
_ALIGN = 256        # bytes: each rank's slot in a gathered buffer starts aligned for any dtype
_SLICE_S = 0.002    # a blocked wait on the base wakes this often to post its peers' receives
_SPIN_S = 2e-4      # event polls spin this long before sleeping
_NAP_S = 1e-3       # longest sleep between polls
_HEALTH_S = 0.5     # how often a long wait asks NCCL for asynchronous errors
_WARM_UP_BYTES = 1 << 23  # the largest message of the bootstrap's connection warm-up


# -- messages over the base ------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Header:
    """On the control key: the buffers of one message, ``((seq, shape, dtype), ...)`` in send order."""

    items: tuple


@dataclass(frozen=True)
class _Envelope:
    """Under the caller's tag: the object (None: a bare array) and ``(seq or None, shape, dtype)`` per buffer."""

    skeleton: bytes
    items: tuple


@dataclass(frozen=True)
class _Shape:
    """A bare device array in a collective's descriptor exchange."""

    shape: tuple
    dtype: str
    nbytes: int


_PLAIN = (str, bytes, int, float, complex, bool, np.ndarray, np.generic)
_TAG = "hpcgpu-device-array"


class _Splitter(pickle.Pickler):
    def __init__(self, file, array_type, buffer_callback=None):
        super().__init__(file, protocol=5, buffer_callback=buffer_callback)
        self.array_type = array_type
        self.arrays = []

    def persistent_id(self, obj):
        if isinstance(obj, self.array_type):
            self.arrays.append(obj)
            return (_TAG, len(self.arrays) - 1)
        return None


class _Joiner(pickle.Unpickler):
    def __init__(self, file, arrays):
        super().__init__(file)
        self.arrays = arrays

    def persistent_load(self, pid):
        return self.arrays[pid[1]]


def _split(obj, array_type):
    """``(skeleton, arrays)``: the device arrays in ``obj`` and the rest of it (pickled with placeholders).

    A bare array gives ``(None, [obj])``; an object without device arrays
    (or one that cannot be pickled: the base decides) gives ``(None, None)``.

    Examples
    --------
    >>> skeleton, arrays = _split({"h": np.zeros(2), "n": 3}, np.ndarray)
    >>> len(arrays), _join(skeleton, [np.ones(2)])["h"].tolist()
    (1, [1.0, 1.0])
    """
    if isinstance(obj, array_type):
        return None, [obj]
    if obj is None or isinstance(obj, _PLAIN):
        return None, None
    try:
        # a look first, host buffers out of band (not copied); most messages hold no device array
        probe = _Splitter(io.BytesIO(), array_type, buffer_callback=lambda buffer: False)
        probe.dump(obj)
    except Exception:  # noqa: BLE001 - not picklable here: the base's serialisation decides
        return None, None
    if not probe.arrays:
        return None, None
    out = io.BytesIO()
    splitter = _Splitter(out, array_type)
    splitter.dump(obj)
    return out.getvalue(), splitter.arrays


def _join(skeleton, arrays):
    """The object :func:`_split` gave ``skeleton`` for, with ``arrays`` in place of its device arrays."""
    if skeleton is None:
        return arrays[0]
    return _Joiner(io.BytesIO(skeleton), arrays).load()


# -- the device layer: CuPy and NCCL ----------------------------------------------------------------------
_NCCL_DTYPES = {("f", 2): "NCCL_FLOAT16", ("f", 4): "NCCL_FLOAT32", ("f", 8): "NCCL_FLOAT64",
                ("i", 1): "NCCL_INT8", ("i", 4): "NCCL_INT32", ("i", 8): "NCCL_INT64",
                ("u", 1): "NCCL_UINT8", ("u", 4): "NCCL_UINT32", ("u", 8): "NCCL_UINT64"}
_NCCL_OPS = {"sum": "NCCL_SUM", "max": "NCCL_MAX", "min": "NCCL_MIN"}


class _NcclDevice:
    """One rank's NCCL communicators and streams, and the CuPy calls the protocol needs.

    Every NCCL call here is one of ``cupy.cuda.nccl``: ``get_unique_id``,
    ``NcclCommunicator(ndev, commId, rank)``, its ``send``/``recv``
    (NCCL >= 2.7), ``allGather``, ``allReduce``, ``check_async_error`` and
    ``abort`` (ncclCommAbort).
    """

    def __init__(self, rank, size, main, main_stream, outgoing, incoming):
        import cupy
        from cupy.cuda import nccl

        self.cupy, self.nccl = cupy, nccl
        self.array_type = cupy.ndarray
        self.rank, self.size = rank, size
        self.main, self.main_stream = main, main_stream
        self.outgoing, self.incoming = outgoing, incoming  # peer -> (communicator, stream)

    @classmethod
    def bootstrap(cls, base, rank, size, timeout):
        """Make every NCCL communicator of this rank (a collective of all ranks, over ``base``)."""
        import cupy
        from cupy.cuda import nccl

        made = []
        try:
            root_id = base.bcast(nccl.get_unique_id() if rank == 0 else None, root=0, timeout=timeout)
            # each rank makes the ids of its own directions (rank -> peer)
            ids = base.allgather({peer: nccl.get_unique_id() for peer in range(size) if peer != rank}, timeout)
            main = nccl.NcclCommunicator(size, root_id, rank)
            made.append(main)
            main_stream = cupy.cuda.Stream(non_blocking=True)
            outgoing, incoming = {}, {}
            probe = cupy.zeros(_WARM_UP_BYTES, cupy.uint8)
            deadline = time.monotonic() + timeout
            for source in range(size):
                for dest in range(size):
                    if source == dest or rank not in (source, dest):
                        continue
                    comm = nccl.NcclCommunicator(2, ids[source][dest], 0 if rank == source else 1)
                    made.append(comm)
                    stream = cupy.cuda.Stream(non_blocking=True)
                    # connect now, while every rank is here (a first send/recv blocks until the peer joins);
                    # a small and a large message, in case NCCL gives larger ones more channels
                    for count in (1, probe.size):
                        if rank == source:
                            comm.send(probe.data.ptr, count, nccl.NCCL_UINT8, 1, stream.ptr)
                        else:
                            comm.recv(probe.data.ptr, count, nccl.NCCL_UINT8, 0, stream.ptr)
                    if rank == source:
                        outgoing[dest] = (comm, stream)
                    else:
                        incoming[source] = (comm, stream)
                    event = stream.record()
                    while not event.done:
                        if time.monotonic() > deadline:
                            raise CommTimeout(f"rank {rank}: NCCL could not connect {source} -> {dest} within "
                                              f"{timeout:g} s", rank=rank)
                        time.sleep(_NAP_S)
            return cls(rank, size, main, main_stream, outgoing, incoming)
        except BaseException:
            for comm in made:
                _quietly(comm.abort)
            raise

    def contiguous(self, array):
        # ascontiguousarray makes a 0-d array 1-d, as NumPy's does: keep the shape
        return self.cupy.ascontiguousarray(array).reshape(array.shape)

    def empty(self, shape, dtype):
        return self.cupy.empty(shape, dtype)

    def asarray(self, value):
        return self.cupy.asarray(value)

    def as_bytes(self, array):
        """A contiguous array's bytes as a 1-D uint8 view."""
        return array.reshape(-1).view(self.cupy.uint8)

    def reductions(self):
        cupy = self.cupy
        return {"sum": lambda a, b: a + b, "max": cupy.maximum, "min": cupy.minimum, "any": cupy.logical_or,
                "all": cupy.logical_and}

    def _after_current(self, stream):
        event = self.cupy.cuda.Event(disable_timing=True)
        event.record(self.cupy.cuda.get_current_stream())
        stream.wait_event(event)

    def _finished(self, stream):
        event = self.cupy.cuda.Event(disable_timing=True)
        event.record(stream)
        return event

    def send(self, dest, array):
        """Post an NCCL send of ``array`` (contiguous) to ``dest``; an event with ``done``."""
        comm, stream = self.outgoing[dest]
        self._after_current(stream)
        comm.send(array.data.ptr, array.nbytes, self.nccl.NCCL_UINT8, 1, stream.ptr)
        return self._finished(stream)

    def recv(self, source, array):
        """Post an NCCL receive into ``array`` (contiguous) from ``source``; an event with ``done``."""
        comm, stream = self.incoming[source]
        self._after_current(stream)
        comm.recv(array.data.ptr, array.nbytes, self.nccl.NCCL_UINT8, 0, stream.ptr)
        return self._finished(stream)

    def allgather(self, chunk):
        """Every rank's ``chunk`` (1-D uint8, one length) end to end: ``(array, event)``."""
        out = self.cupy.empty(self.size * chunk.size, self.cupy.uint8)
        self._after_current(self.main_stream)
        self.main.allGather(chunk.data.ptr, out.data.ptr, chunk.size, self.nccl.NCCL_UINT8, self.main_stream.ptr)
        return out, self._finished(self.main_stream)

    def can_allreduce(self, dtype, op):
        dtype = np.dtype(dtype)
        return op in _NCCL_OPS and (dtype.kind, dtype.itemsize) in _NCCL_DTYPES

    def allreduce(self, array, op):
        """ncclAllReduce of ``array`` (contiguous): ``(array, event)``."""
        kind = _NCCL_DTYPES[array.dtype.kind, array.dtype.itemsize]
        out = self.cupy.empty_like(array)
        self._after_current(self.main_stream)
        self.main.allReduce(array.data.ptr, out.data.ptr, array.size, getattr(self.nccl, kind),
                            getattr(self.nccl, _NCCL_OPS[op]), self.main_stream.ptr)
        return out, self._finished(self.main_stream)

    def _communicators(self):
        return [self.main] + [c for c, _ in self.outgoing.values()] + [c for c, _ in self.incoming.values()]

    def check(self):
        """Raise NCCL's asynchronous error of any communicator (a peer's connection broke)."""
        for comm in self._communicators():
            comm.check_async_error()

    def abort(self):
        """ncclCommAbort every communicator: frees them and stops their kernels (never raises)."""
        for comm in self._communicators():
            _quietly(comm.abort)


def _quietly(call):
    try:
        call()
    except Exception:  # noqa: BLE001 - tearing down: nothing left to tell
        pass


# -- the per-session state on a worker -----------------------------------------------------------------
class _State:
    """What outlives an epoch: the device layer, sequence numbers, receives posted and not yet taken."""

    def __init__(self, device, rank, size):
        self.device = device
        self.rank, self.size = rank, size
        self.sent = collections.Counter()      # dest -> next sequence number
        self.posted = collections.Counter()    # source -> next sequence number to post
        self.inbound = {}                      # (source, seq) -> (array, event)
        self.pending = []                      # (events, buffers) of sends still on the wire
        self.dead = None                       # why the NCCL transport is gone
        self.lock = threading.Lock()

    def kill(self, reason):
        with self.lock:
            if self.dead is not None:
                return
            self.dead = reason
        self.device.abort()
        self.inbound.clear()
        self.pending.clear()


_states = {}
_decisions = {}
_registry_lock = threading.Lock()
_bootstraps = collections.Counter()
"""Bootstraps this worker ran, by session id (the tests check that epochs reuse one)."""


def release(session_id):
    """End this worker's NCCL communicators of ``session_id`` (ncclCommAbort; nothing waits for peers)."""
    with _registry_lock:
        states = [_states.pop(k) for k in [k for k in _states if k[0] == session_id]]
        for key in [k for k in _decisions if k[0] == session_id]:
            del _decisions[key]
    for state in states:
        state.kill(f"session {session_id} was released")


def _sweep(base):
    """Release the states of sessions this worker has forgotten (closed by ``close_session``)."""
    try:
        alive = set(base._extension.sessions())
    except AttributeError:
        return
    with _registry_lock:
        gone = {k[0] for k in list(_states) + list(_decisions) if k[0] not in alive}
    for session_id in gone:
        release(session_id)


# -- the communicator ---------------------------------------------------------------------------------
class NcclCommunicator(Communicator):
    """A rank whose device arrays travel through NCCL and everything else through ``base``.

    Made by :func:`nccl_communicator` or :func:`choose_communicator`; see the
    module doc for the protocol and its semantics.

    Parameters
    ----------
    base : DaskCommunicator
        This rank's communicator of the session (every non-device message,
        abort and timeout goes through it).
    state : _State
        The session's NCCL communicators on this worker (kept between epochs).
    ordered : bool
        ``allreduce`` of device arrays in rank order (True, bitwise the
        generic result) or by ncclAllReduce (False; see the module doc).
    """

    transport = "nccl"

    def __init__(self, base, state, ordered=True):
        super().__init__(base.rank, base.size, base.timeout)
        self.base = base
        self.state = state
        self.ordered = bool(ordered)
        self._health_checked = time.monotonic()

    # -- what the engine uses beside the interface ------------------------------------------------------
    @property
    def session(self):
        return self.base.session

    @property
    def aborted(self):
        """The reason this session was aborted, or None."""
        return self.base.aborted or self.state.dead

    def check(self):
        """Raise CommAborted if the session or its NCCL transport was aborted."""
        self.base.check()
        self._live()

    def abort(self, reason):
        self.base.abort(reason)
        self.state.kill(f"rank {self.rank} aborted: {reason}")

    def close(self):
        """End the session on this rank: the base's goodbyes, and this worker's NCCL communicators."""
        release(self.base.session.id)
        self.base.close()

    # -- point to point -------------------------------------------------------------------------------------
    def _live(self):
        if self.state.dead is not None:
            raise CommAborted(f"rank {self.rank}: the NCCL transport of this session is gone: {self.state.dead}",
                              rank=self.rank)
        return self.state

    def _post_send(self, obj, dest, key):
        state = self._live()
        skeleton, arrays = _split(obj, state.device.array_type)
        if arrays is None:
            return _Pending(self, f"a send to rank {dest} tagged {key!r}", [self.base._post_send(obj, dest, key)])
        items, header, events, buffers = [], [], [], []
        for array in arrays:
            array = state.device.contiguous(array)
            if array.nbytes == 0:
                items.append((None, array.shape, array.dtype.str))
                continue
            seq = state.sent[dest]
            state.sent[dest] += 1
            events.append(state.device.send(dest, array))
            buffers.append(array)
            items.append((seq, array.shape, array.dtype.str))
            header.append(items[-1])
        # the NCCL sends are posted first: a receive posted from the header always has its send
        requests = [self.base._post_send(_Header(tuple(header)), dest, _CONTROL_KEY)] if header else []
        requests.append(self.base._post_send(_Envelope(skeleton, tuple(items)), dest, key))
        if events:
            state.pending.append((events, buffers))
        return _Pending(self, f"a send to rank {dest} tagged {key!r}", requests, events)

    def _post_receive(self, source, key):
        return _NcclReceive(self, source, key)

    # -- progress: receives posted as headers arrive -------------------------------------------------------
    def _drain(self, source):
        """Post the receives of every header from ``source`` that is here (never blocks)."""
        state = self.state
        request = self.base._post_receive(source, _CONTROL_KEY)
        while request.done():
            header = request.wait(0)
            for seq, shape, dtype in header.items:
                if seq != state.posted[source]:  # pragma: no cover - the base keeps order per key
                    raise CommError(f"rank {self.rank}: NCCL header {seq} from rank {source} out of order "
                                    f"(expected {state.posted[source]})", rank=self.rank)
                array = state.device.empty(shape, dtype)
                state.inbound[source, seq] = (array, state.device.recv(source, array))
                state.posted[source] = seq + 1

    def _progress(self):
        """Post every receive whose header is here, forget finished sends, watch for aborts and NCCL errors."""
        state = self._live()
        if self.base.aborted is not None:
            self._stop(self.base.aborted)
        try:
            for source in range(self.size):
                if source != self.rank:
                    self._drain(source)
        except CommAborted:
            state.kill(self.base.aborted or "the session was aborted")
            raise
        if state.pending:
            state.pending = [(events, buffers) for events, buffers in state.pending
                             if not all(e.done for e in events)]
        now = time.monotonic()
        if now - self._health_checked > _HEALTH_S:
            self._health_checked = now
            try:
                state.device.check()
            except Exception as error:  # noqa: BLE001 - an NCCL error: the transport is broken
                reason = f"rank {self.rank}: NCCL reported {type(error).__name__}: {error}"
                state.kill(reason)
                self.base.abort(reason)
                raise CommAborted(reason, rank=self.rank) from error

    def _stop(self, reason, describe=None):
        """The session was aborted: stop this rank's NCCL kernels, raise CommAborted."""
        self.state.kill(reason)
        during = "" if describe is None else f" while waiting for {describe}"
        raise CommAborted(f"rank {self.rank}: the run was aborted{during}: {reason}", rank=self.rank)

    def _wait_base(self, request, deadline, timeout, describe):
        """Wait for a base request, posting peers' receives every :data:`_SLICE_S` meanwhile."""
        while True:
            left = deadline - time.monotonic()
            try:
                return request.wait(max(0.0, min(_SLICE_S, left)))
            except CommTimeout:
                if time.monotonic() >= deadline:
                    raise_timeout(describe, timeout, self.rank)
                self._progress()
            except CommAborted:
                self.state.kill(self.base.aborted or "the session was aborted")
                raise

    def _wait_events(self, events, deadline, timeout, describe):
        """Poll NCCL events until done; past the deadline abort NCCL and the session, raise CommTimeout."""
        started = spin_until = time.monotonic()
        spin_until += _SPIN_S
        nap = 1e-5
        while not all(e.done for e in events):
            self._progress()
            now = time.monotonic()
            if now >= deadline:
                reason = (f"rank {self.rank}: NCCL did not complete {describe} within {timeout:g} s (a peer hangs, "
                          "or its worker is gone); its NCCL communicators were aborted")
                self.state.kill(reason)
                self.base.abort(reason)
                raise CommTimeout(reason, rank=self.rank)
            if now < spin_until:
                time.sleep(0)
            else:
                time.sleep(min(nap, max(0.0, deadline - now)))
                nap = min(2 * nap, _NAP_S)
        return time.monotonic() - started

    def _take(self, source, seq, deadline, timeout, describe):
        """The array of transfer ``seq`` from ``source`` once received (its header read and posted if need be)."""
        state = self.state
        nap = 1e-5
        while state.posted[source] <= seq:
            self._progress()
            if state.posted[source] > seq:
                break
            now = time.monotonic()
            if now >= deadline:
                raise_timeout(describe, timeout, self.rank)
            time.sleep(min(nap, deadline - now))
            nap = min(2 * nap, _NAP_S)
        array, event = state.inbound.pop((source, seq))
        self._wait_events([event], deadline, timeout, describe)
        return array

    # -- collectives ---------------------------------------------------------------------------------------
    def _describe(self, value, timeout):
        """Every rank's value, a bare device array standing as its :class:`_Shape` (one round over the base)."""
        device = self._live().device
        mine = None
        if isinstance(value, device.array_type):
            mine = device.contiguous(value)
            value = _Shape(tuple(mine.shape), mine.dtype.str, int(mine.nbytes))
        return mine, Communicator.allgather(self, value, timeout)

    def _assemble(self, value, mine, parts, deadline, timeout):
        """The allgather's result: the ranks' device arrays fetched by one ncclAllGather of their bytes."""
        shapes = [p for p in parts if isinstance(p, _Shape)]
        if not shapes:
            return parts
        device = self.state.device
        longest = max(s.nbytes for s in shapes)
        width = -(-longest // _ALIGN) * _ALIGN
        gathered = None
        if width:
            chunk = device.empty((width,), np.uint8)
            if mine is not None and mine.nbytes:
                chunk[:mine.nbytes] = device.as_bytes(mine)
            gathered, event = device.allgather(chunk)
            self.wait_seconds += self._wait_events([event], deadline, timeout, "an NCCL allgather")
        out = []
        for rank, part in enumerate(parts):
            if rank == self.rank:
                out.append(value)
            elif isinstance(part, _Shape):
                raw = gathered[rank * width:rank * width + part.nbytes] if part.nbytes else device.empty((0,), np.uint8)
                out.append(raw.view(np.dtype(part.dtype)).reshape(part.shape))
            else:
                out.append(part)
        return out

    def allgather(self, value, timeout=None):
        """Every rank's ``value`` in rank order; bare device arrays through one ncclAllGather (see the module doc)."""
        if self.size == 1:
            return [value]
        timeout = self._timeout(timeout)
        deadline = time.monotonic() + timeout
        mine, parts = self._describe(value, timeout)
        return self._assemble(value, mine, parts, deadline, timeout)

    def allreduce(self, value, op="sum", timeout=None):
        """``value`` reduced over all ranks: in rank order, or by ncclAllReduce with ``ordered=False`` (module doc)."""
        if op not in REDUCTIONS:
            raise ConfigError(f"op must be one of {sorted(REDUCTIONS)}; got {op!r}")
        device = self._live().device
        if self.size == 1:
            values = [value]
        else:
            timeout = self._timeout(timeout)
            deadline = time.monotonic() + timeout
            mine, parts = self._describe(value, timeout)
            if not self.ordered and all(isinstance(p, _Shape) for p in parts) and \
                    len({(p.shape, p.dtype) for p in parts}) == 1 and device.can_allreduce(parts[0].dtype, op):
                result, event = device.allreduce(mine, op)
                self.wait_seconds += self._wait_events([event], deadline, timeout, "an NCCL allreduce")
                return result
            values = self._assemble(value, mine, parts, deadline, timeout)
        if any(isinstance(v, device.array_type) for v in values):
            combine = device.reductions()[op]
            values = [v if isinstance(v, device.array_type) else device.asarray(v) for v in values]
        else:
            combine = REDUCTIONS[op]
        if len(values) == 1 and op in ("any", "all"):
            return combine(values[0], values[0])
        return functools.reduce(combine, values)

    def __repr__(self):
        return f"NcclCommunicator(rank={self.rank}, size={self.size})"


class _Pending(Request):
    """A send: its base messages and its NCCL events."""

    def __init__(self, comm, describe, requests, events=()):
        super().__init__(describe)
        self.comm, self.requests, self.events = comm, requests, list(events)

    def done(self):
        return all(r.done() for r in self.requests) and all(e.done for e in self.events)

    def wait(self, timeout):
        deadline = time.monotonic() + timeout
        for request in self.requests:
            self.comm._wait_base(request, deadline, timeout, self.describe)
        if self.events:
            self.comm._wait_events(self.events, deadline, timeout, self.describe)


_NOTHING = object()


class _NcclReceive(Request):
    """A receive: the envelope (or host object) under the tag, then the NCCL receives of its buffers."""

    def __init__(self, comm, source, key):
        super().__init__(f"a message from rank {source} tagged {key!r}")
        self.comm, self.source, self.key = comm, source, key
        self.request = comm.base._post_receive(source, key)
        self.message = _NOTHING
        self.result = _NOTHING

    def done(self):
        if self.result is not _NOTHING:
            return True
        try:
            if self.message is _NOTHING:
                if not self.request.done():
                    self.comm._progress()
                    return False
                self.message = self.request.wait(0)
            if not isinstance(self.message, _Envelope):
                self.result = self.message
                return True
            self.comm._progress()
        except CommError:
            return True  # wait raises it
        state = self.comm.state
        return all(seq is None or (state.posted[self.source] > seq and state.inbound[self.source, seq][1].done)
                   for seq, _, _ in self.message.items)

    def wait(self, timeout):
        if self.result is not _NOTHING:
            return self.result
        deadline = time.monotonic() + timeout
        if self.message is _NOTHING:
            self.message = self.comm._wait_base(self.request, deadline, timeout, self.describe)
        if not isinstance(self.message, _Envelope):
            self.result = self.message
            return self.result
        state = self.comm._live()
        arrays = [state.device.empty(shape, dtype) if seq is None
                  else self.comm._take(self.source, seq, deadline, timeout, self.describe)
                  for seq, shape, dtype in self.message.items]
        self.result = _join(self.message.skeleton, arrays)
        return self.result


# -- making one -------------------------------------------------------------------------------------------
def _attach(base, make_device=None, ordered=True):
    """The NcclCommunicator of ``base``'s rank, bootstrapping its session's NCCL communicators on first use."""
    session, rank = base.session, base.rank
    key = (session.id, rank)
    with _registry_lock:
        state = _states.get(key)
    if state is None:
        make = _NcclDevice.bootstrap if make_device is None else make_device
        try:
            device = make(base, rank, session.size, session.timeout)
        except CommAborted:
            raise
        except Exception as error:
            # the engine aborts the session only for errors that are not CommErrors: here, so the peers stop
            reason = f"rank {rank}: the NCCL bootstrap failed: {type(error).__name__}: {error}"
            base.abort(reason)
            if isinstance(error, CommError):
                raise
            raise CommError(reason, rank=rank) from error
        state = _State(device, rank, session.size)
        with _registry_lock:
            _states[key] = state
            _bootstraps[session.id] += 1
    return NcclCommunicator(base, state, ordered)


def nccl_communicator(session, rank, worker=None, ordered=True):
    """This worker's :class:`NcclCommunicator` for ``rank`` of ``session``, NCCL without asking (see below).

    The first call of a session on every rank bootstraps its NCCL
    communicators (a collective: every rank calls it together, as the
    first epoch does); later calls reuse them. The engine calls
    :func:`choose_communicator`, which checks first that NCCL can serve.

    Raises
    ------
    ClusterError
        Called outside a dask worker, or on a worker that is not ``rank``'s.
    CommError
        The bootstrap failed (NCCL's error in the message).
    """
    from hpcgpu.partition.dask_comm import communicator

    return _attach(communicator(session, rank, worker), ordered=ordered)


def nccl_identity():
    """``(host, PCI bus id)`` of this process's current GPU as NCCL tells devices apart, or None.

    None where NCCL cannot serve this rank: :data:`NCCL_ENV` is ``0``, no
    CuPy, no NCCL (2.7 or later, with ``send``/``recv``) in CuPy, or no GPU.
    Asks the CUDA driver, creating no CUDA context.

    Examples
    --------
    >>> identity = nccl_identity()
    >>> identity is None or len(identity) == 2
    True
    """
    if os.environ.get(NCCL_ENV, "1").strip().lower() in ("0", "false", "no"):
        return None
    try:
        import cupy
        from cupy.cuda import nccl
    except Exception:  # noqa: BLE001 - no CuPy, or a CuPy that cannot load: the base serves
        return None
    try:
        if not nccl.available or min(nccl.get_version(), nccl.get_build_version()) < 2700:
            return None
        ordinal = cupy.cuda.runtime.getDevice()
        bus = _pci_bus_id(ordinal)
    except Exception:  # noqa: BLE001 - no GPU or no driver
        return None
    if bus is None:
        return None
    host = os.environ.get("NCCL_HOSTID") or socket.gethostname()
    return host, bus


def _pci_bus_id(ordinal):
    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None
    device = ctypes.c_int(0)
    text = ctypes.create_string_buffer(64)
    if lib.cuInit(0) != 0 or lib.cuDeviceGet(ctypes.byref(device), int(ordinal)) != 0 or \
            lib.cuDeviceGetPCIBusId(text, 64, device) != 0:
        return None
    return text.value.decode().lower()


def use_nccl(identities):
    """Whether a group whose ranks have these :func:`nccl_identity` values can run on NCCL.

    Every rank needs one, all distinct (NCCL takes one rank per GPU), and
    at most :data:`MAX_RANKS` ranks, at least 2.

    Examples
    --------
    >>> use_nccl([("n1", "0000:1a:00.0"), ("n1", "0000:1b:00.0")])
    True
    >>> use_nccl([("n1", "0000:1a:00.0"), ("n1", "0000:1a:00.0")]), use_nccl([("n1", "0000:1a:00.0"), None])
    (False, False)
    """
    identities = list(identities)
    return (2 <= len(identities) <= MAX_RANKS and all(i is not None for i in identities)
            and len(set(identities)) == len(identities))


def choose_communicator(session, rank, worker=None):
    """The communicator for ``rank`` of ``session`` on this worker: NCCL where it can serve, else dask's.

    NCCL (:class:`NcclCommunicator`) when every rank's worker has a GPU of
    its own (distinct by host and PCI bus id), CuPy with NCCL >= 2.7 imports
    there, :data:`NCCL_ENV` is not ``0``, and the session has 2 to
    :data:`MAX_RANKS` ranks; else the base
    :class:`~hpcgpu.partition.dask_comm.DaskCommunicator`. The first call of
    a session decides, on every rank at once (one allgather over the base)
    and bootstraps NCCL; later calls (epochs) reuse both.

    Parameters
    ----------
    session : Session
    rank : int
    worker : distributed.Worker, optional
        The task's worker, for threads the task started.

    Raises
    ------
    ClusterError
        Called outside a dask worker, or on a worker that is not ``rank``'s.
    """
    from hpcgpu.partition.dask_comm import communicator

    base = communicator(session, rank, worker)
    if session.size < 2:
        return base
    key = (session.id, rank)
    with _registry_lock:
        decided = _decisions.get(key)
    if decided is None:
        _sweep(base)
        decided = use_nccl(base.allgather(nccl_identity()))
        with _registry_lock:
            _decisions[key] = decided
    return _attach(base) if decided else base
