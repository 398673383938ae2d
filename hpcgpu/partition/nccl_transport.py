"""The NCCL transport: :class:`NcclCommunicator`, its requests, and its per-session state on a worker.

The protocol (matching as in MPI, eager receives, streams and completion,
collectives, faults) is described in :mod:`hpcgpu.partition.nccl_comm`,
which chooses this transport where it can serve. Built on the base
communicator of :mod:`hpcgpu.partition.dask_comm`, the messages of
:mod:`~hpcgpu.partition.nccl_messages` and the device layer of
:mod:`~hpcgpu.partition.nccl_device`. A session's NCCL communicators are
made in its first epoch (:func:`_attach`) and kept on the worker until
:func:`release`, which the base calls as the session closes there.
"""

import collections
import threading
import time

import numpy as np

from hpcgpu.errors import CommAborted, CommError, CommTimeout, ConfigError
from hpcgpu.partition.collectives import tree_reduce
from hpcgpu.partition.communicator import REDUCTIONS, Communicator, Request, raise_timeout
from hpcgpu.partition.dask_session import on_session_close
from hpcgpu.partition.nccl_device import _NAP_S, _NcclDevice
from hpcgpu.partition.nccl_messages import _Envelope, _Header, _Shape, _join, _split

__all__ = ["NcclCommunicator", "release"]

_CONTROL_KEY = "#nccl-header"
_ALIGN = 256        # bytes: each rank's slot in a gathered buffer starts aligned for any dtype
_SLICE_S = 0.002    # a blocked wait on the base wakes this often to post its peers' receives
_SPIN_S = 2e-4      # event polls spin this long before sleeping
_HEALTH_S = 0.5     # how often a long wait asks NCCL for asynchronous errors


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


on_session_close(release)
