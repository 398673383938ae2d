"""``NcclCommunicator``: the communicator's NCCL transport, CuPy device buffers GPU to GPU, the rest on dask.

:class:`NcclCommunicator` wraps a
:class:`~hpcgpu.partition.dask_communicator.DaskCommunicator` (the *base*). The
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
until the caller receives them). A device send larger than NCCL's buffers
completes once its receiver has entered the communicator; until then its
NCCL kernel waits on the sender's GPU. A smaller one may complete at once,
as an MPI eager send does (512 KiB did over NCCL's socket transport). A rank that never waits on the communicator holds its
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
copies. ``allreduce`` of device arrays combines the gathered values on
every rank with CuPy, in the generic allreduce's fixed tree order
(:func:`~hpcgpu.partition.collectives.tree_reduce`): bitwise the same on
every rank, and what the generic reduction gives. With ``ordered=False``,
arrays of one shape and dtype are reduced by ncclAllReduce (sum, max,
min): NCCL computes each element once and copies it to every rank (ring
and tree algorithms), so the ranks agree with each other, but the order of
the additions is NCCL's: not bitwise the generic sum for floats. Scalars
and host values are gathered over the base and combined in the same tree
order. ``gather``, ``bcast``, ``exchange`` and ``barrier``
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
  the others in it (the client still sees the lost worker, and the first
  epoch's deadline ends the run, naming the ranks still in it).
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
and kept on the worker for the next ones
(:func:`~hpcgpu.partition.nccl_sessions.release` ends them).

Beside this module (:class:`NcclCommunicator`, :func:`attach`):
:mod:`~hpcgpu.partition.nccl_sessions` (the state kept per session),
:mod:`~hpcgpu.partition.nccl_messages`, :mod:`~hpcgpu.partition.nccl_device`
and :mod:`~hpcgpu.partition.communicator_choice` (when NCCL serves); all
build on :mod:`hpcgpu.partition.dask_communicator`, which knows none of them.

Examples
--------
>>> from hpcgpu.partition.communicator_choice import choose_communicator
>>> def epoch(session, rank):  # doctest: +SKIP
...     comm = choose_communicator(session, rank)   # NCCL on GPU workers, dask elsewhere
...     halo = comm.exchange({1 - rank: cupy.arange(4.0) + rank}, [1 - rank])
...     return comm.transport, float(halo[1 - rank][0])
"""

import time

import numpy as np

from hpcgpu.errors import CommAborted, CommError, CommTimeout, ConfigError
from hpcgpu.partition.collectives import tree_reduce
from hpcgpu.partition.communicator import REDUCTIONS, Communicator, Request, raise_timeout
from hpcgpu.partition.nccl_device import NAP_S, NcclDevice
from hpcgpu.partition.nccl_messages import DeviceArrayShape, Envelope, Header, join_device_arrays, split_device_arrays
from hpcgpu.partition.nccl_sessions import RankState, bootstraps, rank_states, registry_lock, release

__all__ = ["NcclCommunicator", "attach"]

_CONTROL_KEY = "#nccl-header"
_ALIGN = 256        # bytes: each rank's slot in a gathered buffer starts aligned for any dtype
_SLICE_S = 0.002    # a blocked wait on the base wakes this often to post its peers' receives
_SPIN_S = 2e-4      # event polls spin this long before sleeping
_HEALTH_S = 0.5     # how often a long wait asks NCCL for asynchronous errors


# -- the communicator ---------------------------------------------------------------------------------
class NcclCommunicator(Communicator):
    """A rank whose device arrays travel through NCCL and everything else through ``base``.

    Made by :func:`attach`, through
    :func:`~hpcgpu.partition.communicator_choice.choose_communicator`; see the
    module doc for the protocol and its semantics.

    Parameters
    ----------
    base : DaskCommunicator
        This rank's communicator of the session (every non-device message,
        abort and timeout goes through it).
    state : RankState
        The session's NCCL communicators on this worker (kept between epochs).
    ordered : bool
        ``allreduce`` of device arrays in the generic allreduce's fixed
        tree order (True, bitwise the generic result) or by ncclAllReduce (False; see the module doc).
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
        super().close()
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
        skeleton, arrays = split_device_arrays(obj, state.device.array_type)
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
        requests = [self.base._post_send(Header(tuple(header)), dest, _CONTROL_KEY)] if header else []
        requests.append(self.base._post_send(Envelope(skeleton, tuple(items)), dest, key))
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
                nap = min(2 * nap, NAP_S)
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
            nap = min(2 * nap, NAP_S)
        array, event = state.inbound.pop((source, seq))
        self._wait_events([event], deadline, timeout, describe)
        return array

    # -- collectives ---------------------------------------------------------------------------------------
    def _describe(self, value, timeout):
        """Every rank's value, a bare device array standing as its :class:`DeviceArrayShape` (one round over the base)."""
        device = self._live().device
        mine = None
        if isinstance(value, device.array_type):
            mine = device.contiguous(value)
            value = DeviceArrayShape(tuple(mine.shape), mine.dtype.str, int(mine.nbytes))
        return mine, Communicator.allgather(self, value, timeout)

    def _assemble(self, value, mine, parts, deadline, timeout):
        """The allgather's result: the ranks' device arrays fetched by one ncclAllGather of their bytes."""
        shapes = [p for p in parts if isinstance(p, DeviceArrayShape)]
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
            elif isinstance(part, DeviceArrayShape):
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
            if not self.ordered and all(isinstance(p, DeviceArrayShape) for p in parts) and \
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
        return tree_reduce(values, combine)  # the generic allreduce's order: bitwise its result

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
            if not isinstance(self.message, Envelope):
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
        if not isinstance(self.message, Envelope):
            self.result = self.message
            return self.result
        state = self.comm._live()
        arrays = [state.device.empty(shape, dtype) if seq is None
                  else self.comm._take(self.source, seq, deadline, timeout, self.describe)
                  for seq, shape, dtype in self.message.items]
        self.result = join_device_arrays(self.message.skeleton, arrays)
        return self.result


# -- making one -------------------------------------------------------------------------------------------
def attach(base, make_device=None, ordered=True):
    """The NcclCommunicator of ``base``'s rank, bootstrapping its session's NCCL communicators on first use."""
    session, rank = base.session, base.rank
    key = (session.id, rank)
    with registry_lock:
        state = rank_states.get(key)
    if state is None:
        make = NcclDevice.bootstrap if make_device is None else make_device
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
        state = RankState(device, rank, session.size)
        with registry_lock:
            rank_states[key] = state
            bootstraps[session.id] += 1
    return NcclCommunicator(base, state, ordered)

