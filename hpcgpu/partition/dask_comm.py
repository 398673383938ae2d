"""A communicator on dask's own comm layer: worker to worker, never through the scheduler.

Each worker gets a :class:`CommExtension` (installed by :class:`CommWorkerPlugin`
when a session opens). A rank sends to a peer over one long-lived stream per
session and direction, opened on the first send with dask's ``connect`` and
the worker's own connection arguments, so it works over whatever the
cluster speaks (tcp, tls with the cluster's certificates, ucx). The peer's
handler (``hpcgpu_comm_stream``, on its event loop) only files each
incoming message in its session's mailbox and wakes the rank waiting for
it; objects travel with dask's serialization (NumPy arrays as raw frames,
CuPy arrays as device frames where the protocol carries them). This is
how dask's P2P shuffle moves data without the scheduler: a message costs
one trip over an open connection, not a scheduler round trip.

Faults, so that no rank ever hangs:

- :meth:`DaskCommunicator.abort` tells every peer directly; their waits
  raise :class:`~hpcgpu.errors.CommAborted` naming the rank and the reason;
- a peer's stream that closes without saying goodbye (its worker died)
  aborts the session on the receiving worker;
- the scheduler plugin (:mod:`hpcgpu.partition.dask_session`) hooks the scheduler's
  ``remove_worker`` (as the P2P shuffle's does) and tells the remaining
  workers of every session the lost worker belonged to;
- every wait has a timeout.

A session is the communicator group of one simulation (raft-dask's
``Comms``): :func:`hpcgpu.partition.dask_session.open_session` on the client
registers it and installs the plugins; ranks attach to it on their workers
with :func:`communicator` (epoch after epoch: the streams stay open);
:func:`hpcgpu.partition.dask_session.close_session` ends it.

Examples
--------
>>> from hpcgpu.cluster import start_cluster  # doctest: +SKIP
>>> from hpcgpu.partition.dask_session import open_session  # doctest: +SKIP
>>> client = start_cluster(workers=2, quiet=True)  # doctest: +SKIP
>>> session = open_session(client, sorted(client.scheduler_info()["workers"]))  # doctest: +SKIP
>>> def ring(session, rank):  # doctest: +SKIP
...     comm = communicator(session, rank)
...     return comm.allreduce(rank + 1)
>>> [client.submit(ring, session, r, workers=[w]).result()  # doctest: +SKIP
...  for r, w in enumerate(session.addresses)]
[3, 3]
"""

import asyncio
import collections
import copy
import logging
import math
import os
import threading
import time
from dataclasses import dataclass

from hpcgpu.errors import ClusterError, CommAborted, CommError, ConfigError
from hpcgpu.partition.communicator import DEFAULT_TIMEOUT_S, Communicator, Request, _Finished, raise_timeout

__all__ = ["CommExtension", "DaskCommunicator", "POLL_ENV", "POLL_SECONDS", "Session", "abort_session",
           "communicator", "poll_seconds"]

logger = logging.getLogger(__name__)

EXTENSION = "hpcgpu-comm"
STREAM_OP = "hpcgpu_comm_stream"
ABORT_OP = "hpcgpu-comm-abort"
# seconds an abort or a goodbye may take to reach a peer (best effort: the peer has its own timeout)
_NOTIFY_TIMEOUT_S = 5.0
# closed sessions a worker remembers, so that a late message, goodbye or abort of one does not make its
# mailbox again (a few KiB per thousand; the oldest are dropped first)
_CLOSED_SESSIONS_KEPT = 1024

POLL_SECONDS = 0.001
"""How long a rank polls for a message, yielding its core between looks, before it sleeps on the mailbox.

A rank that sleeps is woken by the receiving thread through the kernel
scheduler, and on a busy node that wake-up comes late (MPI libraries poll
for the same reason). A millisecond covers a typical wait of an MD step:
6,912 atoms a slab on 2 workers here, 6.77 against 7.49 ms a step, faster
in 8 of 8 alternated rounds (0.3 ms: 6 of 6; 3 ms: 3 of 6, a long poll
keeps a core from the other rank's helpers); weather at K = 16 and N-body
unchanged (docs/benchmarks.md). The core is given up at every look
(``sched_yield``), so the thread that delivers the message, or any other
on that core, runs at once. See :data:`POLL_ENV`."""

POLL_ENV = "HPCGPU_COMM_POLL_S"
"""Environment variable (on the workers): seconds a rank polls before it sleeps (``0``: sleep at once, for
nodes with more ranks than cores)."""

_yield_core = getattr(os, "sched_yield", lambda: time.sleep(0))  # releases the GIL either way


def poll_seconds():
    """Seconds a waiting rank polls: :data:`POLL_ENV` if set, else :data:`POLL_SECONDS`.

    Raises
    ------
    ConfigError
        :data:`POLL_ENV` is not a number of seconds between 0 and 1.

    Examples
    --------
    >>> poll_seconds() == POLL_SECONDS or POLL_ENV in os.environ
    True
    """
    text = os.environ.get(POLL_ENV)
    if text is None:
        return POLL_SECONDS
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0.0 <= value <= 1.0:
        raise ConfigError(f"{POLL_ENV} must be a number of seconds between 0 and 1 (0: never poll); got {text!r}")
    return value


@dataclass(frozen=True)
class Session:
    """A communicator group: its id and the address of each rank's worker (rank order)."""

    id: str
    addresses: tuple
    timeout: float = DEFAULT_TIMEOUT_S
    direct: tuple = ()  # each rank's worker's direct listener ("host:port"), or None: the dask path

    @property
    def size(self):
        return len(self.addresses)


class _Mailbox:
    """Messages of one session that reached this worker, by (destination rank, source rank, tag), and its abort state.

    Several ranks of a session may live on one worker (more partitions than
    workers): each takes only the messages addressed to it.
    """

    def __init__(self, poll=None):
        self.condition = threading.Condition()
        self.queues = collections.defaultdict(collections.deque)
        self.aborted = None   # the reason, once aborted
        self.finished = set()  # peers that said goodbye
        if poll is None:
            try:
                poll = poll_seconds()
            except ConfigError:  # the rank's communicator() reports it; a message's thread must not
                poll = POLL_SECONDS
        self.poll = poll

    def put(self, dest, source, key, obj):
        with self.condition:
            self.queues[dest, source, key].append(obj)
            self.condition.notify_all()

    def abort(self, reason):
        with self.condition:
            if self.aborted is None:
                self.aborted = reason
            self.condition.notify_all()

    def ready(self, dest, source, key):
        with self.condition:
            return bool(self.queues.get((dest, source, key))) or self.aborted is not None

    def take(self, dest, source, key, timeout, describe):
        deadline = time.monotonic() + timeout
        rank = dest
        if self.poll > 0:
            self._poll(dest, source, key, min(self.poll, timeout))
        with self.condition:
            while True:
                queue = self.queues.get((dest, source, key))
                if queue:
                    obj = queue.popleft()
                    if not queue:
                        del self.queues[dest, source, key]
                    return obj
                if self.aborted is not None:
                    raise CommAborted(f"rank {rank}: the run was aborted while waiting for {describe}: "
                                      f"{self.aborted}", rank=rank)
                left = deadline - time.monotonic()
                if left <= 0:
                    raise_timeout(describe, timeout, rank)
                self.condition.wait(left)

    def _poll(self, dest, source, key, seconds):
        """Look for the message (or an abort) until it is there or ``seconds`` have passed, yielding the core."""
        end = time.perf_counter() + seconds
        queues = self.queues
        # unlocked looks: a dict lookup and a deque's length are atomic; take() checks again under the lock
        while not queues.get((dest, source, key)) and self.aborted is None and time.perf_counter() < end:
            _yield_core()


class _MailboxReceive(Request):
    def __init__(self, mailbox, source, key, rank):
        super().__init__(f"a message from rank {source} tagged {key!r}")
        self.mailbox, self.source, self.key, self.rank = mailbox, source, key, rank

    def done(self):
        return self.mailbox.ready(self.rank, self.source, self.key)

    def wait(self, timeout):
        return self.mailbox.take(self.rank, self.source, self.key, timeout, self.describe)


class _Send(Request):
    def __init__(self, future, mailbox, dest, key, rank):
        super().__init__(f"a send to rank {dest} tagged {key!r}")
        self.future, self.mailbox, self.rank = future, mailbox, rank

    def done(self):
        return self.future.done()

    def wait(self, timeout):
        import concurrent.futures

        try:
            self.future.result(timeout)
        except concurrent.futures.TimeoutError:
            if self.mailbox.aborted is not None:
                raise CommAborted(f"rank {self.rank}: the run was aborted during {self.describe}: "
                                  f"{self.mailbox.aborted}", rank=self.rank) from None
            raise_timeout(self.describe, timeout, self.rank)
        except CommAborted:
            raise
        except Exception as error:  # noqa: BLE001 - a closed or refused connection: the peer is gone
            reason = f"rank {self.rank} could not complete {self.describe}: {type(error).__name__}: {error}"
            self.mailbox.abort(reason)
            raise CommAborted(reason, rank=self.rank) from error


class _Outbound:
    """This worker's open stream to one peer for one session, and the order of the writes on it.

    Writes go out in the order they were posted: each waits for the one
    before it (``tail``). A lock alone does not keep that order: the write
    that opens the stream queues behind the writes that waited for the
    opening, and one tag's messages would overtake each other.
    """

    def __init__(self):
        self.comm = None
        self.tail = None  # the asyncio future of the last write posted

    async def in_turn(self, write):
        """Await ``write()`` after every write posted before it (call without awaiting anything first)."""
        before, mine = self.tail, asyncio.get_running_loop().create_future()
        self.tail = mine
        try:
            if before is not None:
                await asyncio.shield(before)
            return await write()
        finally:
            mine.set_result(None)


class CommExtension:
    """The communicator's side on one worker: mailboxes of the sessions, streams to the peers."""

    def __init__(self, worker):
        self.worker = worker
        self._lock = threading.Lock()
        self._mailboxes = {}
        self._outbound = {}
        self._links = {}
        self._link_locks = {}  # one per link key: two threads of a rank connect to a peer once
        self._listener = None
        self._sessions = {}  # the Session of each id a communicator was made for here: whom to tell of an abort
        self._unspread = {}  # (source, reason) of aborts found before a communicator of their session was made
        self._closed = collections.OrderedDict()  # ids of sessions closed here, oldest first
        worker.handlers[STREAM_OP] = self.serve_stream
        worker.stream_handlers[ABORT_OP] = self.abort_from_scheduler

    # -- mailboxes --------------------------------------------------------------------------
    def mailbox(self, session_id):
        """The mailbox of ``session_id`` on this worker (made on first use, by a message or a rank).

        A session closed here gets a mailbox of its own, aborted and kept
        nowhere: a rank made too late fails at once, and nothing stays
        behind on the worker.
        """
        box = self._live_mailbox(session_id)
        if box is None:
            box = _Mailbox(poll=0.0)
            box.abort(f"session {session_id} was closed on this worker")
        return box

    def _live_mailbox(self, session_id):
        """The mailbox of ``session_id`` (made on first use), or None once the session was closed here.

        The hooks of incoming messages, goodbyes and aborts use this: what
        comes after a session's close (a peer's goodbye, a late message, the
        scheduler's abort) must not make its mailbox again.
        """
        with self._lock:
            if session_id in self._closed:
                return None
            box = self._mailboxes.get(session_id)
            if box is None:
                box = self._mailboxes[session_id] = _Mailbox()
            return box

    def remember(self, session):
        """Note ``session``'s workers (a communicator of it is made here): whom :meth:`spread_abort` tells."""
        with self._lock:
            if session.id in self._closed or session.id in self._sessions:
                return
            self._sessions[session.id] = session
            pending = self._unspread.pop(session.id, None)
        if pending is not None:
            self._notify_peers(session, *pending)

    def forget(self, session_id):
        """Drop what this worker keeps of a closed session, and ignore whatever of it comes later."""
        with self._lock:
            self._mailboxes.pop(session_id, None)
            self._sessions.pop(session_id, None)
            self._unspread.pop(session_id, None)
            self._closed[session_id] = None
            while len(self._closed) > _CLOSED_SESSIONS_KEPT:
                self._closed.popitem(last=False)

    def spread_abort(self, session_id, source, reason):
        """Abort ``session_id`` here and tell its other workers, without waiting (any thread).

        For failures found on this worker that the other ranks would
        otherwise only learn from their timeouts: a message that cannot be
        rebuilt, a send that failed half way. ``source`` is the rank of this
        worker the notice goes out as.
        """
        box = self._live_mailbox(session_id)
        if box is None:
            return
        box.abort(reason)
        with self._lock:
            session = self._sessions.get(session_id)
            if session is None:  # no communicator of it made here yet: the first one made tells the peers
                self._unspread.setdefault(session_id, (source, reason))
                return
        self._notify_peers(session, source, reason)

    def _notify_peers(self, session, source, reason):
        """Post an abort to ``session``'s other workers (fire and forget: a stopped peer must not hold us)."""
        session_id = session.id
        peers = sorted({a for a in session.addresses if a != self.worker.address})
        if peers:
            try:
                self.post(self.notify(session_id, source, peers, {"abort": reason}))
            except RuntimeError as error:  # the worker's loop is closing: nobody is left to tell
                logger.debug("hpcgpu comm: abort of %s not spread: %s", session_id, error)

    def sessions(self):
        with self._lock:
            return list(self._mailboxes)

    # -- the direct path (hpcgpu.partition.direct_comm) ----------------------------------------
    def listener(self):
        """This worker's direct listener (started on first use), or None where the fast path is off."""
        from hpcgpu.partition.direct_comm import Listener, direct_enabled

        with self._lock:
            if self._listener is None and direct_enabled(self.worker.address):
                self._listener = Listener(self.worker, self._deliver, self._abort, self._finished,
                                          lambda session, dest, reason: self.spread_abort(session, dest, reason))
            return self._listener

    # the listener's hooks (its threads): a session closed here takes nothing more
    def _deliver(self, session, dest, source, key, obj):
        box = self._live_mailbox(session)
        if box is not None:
            box.put(dest, source, key, obj)

    def _abort(self, session, reason):
        box = self._live_mailbox(session)
        if box is not None:
            box.abort(reason)

    def _finished(self, session, source):
        box = self._live_mailbox(session)
        if box is not None:
            with box.condition:
                box.finished.add(source)

    def link(self, session, source, address):
        """The connection of rank ``source`` of ``session`` to the listener at ``address`` (made on first use)."""
        from hpcgpu.partition.direct_comm import Link

        key = (session, source, address)
        with self._lock:
            link = self._links.get(key)
            if link is not None:
                return link
            connecting = self._link_locks.setdefault(key, threading.Lock())
        # connect once: a second connection made meanwhile by another thread of the rank would be
        # dropped, and its end without a goodbye would abort the session on the peer
        with connecting:
            with self._lock:
                link = self._links.get(key)
            if link is None:
                listener = self.listener()
                link = Link(address, session, source, None if listener is None else listener.client_ssl)
                with self._lock:
                    self._links[key] = link
        return link

    def close_links(self, session, source=None):
        """Say goodbye on the links of ``session`` from this worker (only rank ``source``'s, if given)."""
        with self._lock:
            keys = [k for k in self._links if k[0] == session and source in (None, k[1])]
            links = [self._links.pop(k) for k in keys]
            for k in keys:
                self._link_locks.pop(k, None)
        for link in links:
            link.close()

    def abort_from_scheduler(self, session=None, reason=None, **_):
        """Stream handler: the scheduler says a worker of ``session`` left the cluster."""
        self._abort(session, reason)

    # -- the event loop's side ------------------------------------------------------------------
    async def serve_stream(self, comm, session=None, source=None):
        """Handler of a peer's stream: file every message in the session's mailbox until it closes."""
        from distributed.comm import CommClosedError
        from distributed.core import Status

        # a session closed here: read its stream to the end, file nothing (no mailbox made again)
        box = self._live_mailbox(session) or _Mailbox(poll=0.0)
        # the data is rebuilt here, message by message, so that one that cannot be names its sender and tag
        # and the stream goes on (a failure inside read() would end the handler, and the rest would be lost)
        comm.deserialize = False
        try:
            while True:
                message = await comm.read()
                if "data" in message:
                    try:
                        obj = _rebuilt(message["data"])
                    except Exception as error:  # noqa: BLE001 - any failure of the sender's object
                        dest, tag = message["dest"], message["tag"]
                        self.spread_abort(session, dest, f"rank {dest} cannot rebuild the message rank {source} "
                                                         f"sent tagged {tag!r}: {type(error).__name__}: {error}")
                        continue
                    box.put(message["dest"], source, message["tag"], obj)
                elif "abort" in message:
                    box.abort(message["abort"])
                elif message.get("bye"):
                    with box.condition:
                        box.finished.add(source)
                    break
        except (CommClosedError, OSError) as error:
            with box.condition:
                said_goodbye = source in box.finished
            if not said_goodbye:
                box.abort(f"rank {source}'s connection closed without a goodbye ({type(error).__name__}): its "
                          "worker was lost or it stopped")
        return Status.dont_reply

    def _loop(self):
        return self.worker.loop.asyncio_loop

    def post(self, coroutine):
        """Run ``coroutine`` on the worker's event loop from a task's thread; a concurrent future."""
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop())

    def _outbound_to(self, session, source, address):
        key = (session, source, address)
        outbound = self._outbound.get(key)
        if outbound is None:
            outbound = self._outbound[key] = _Outbound()
        return outbound

    async def _write(self, session, source, address, outbound, message):
        """Write ``message`` on ``outbound``, opening the stream first if it is not open (its turn is held)."""
        from distributed.comm import connect

        if outbound.comm is None or outbound.comm.closed():
            comm = await connect(address, **self.worker.connection_args)
            await comm.write({"op": STREAM_OP, "session": session, "source": source, "reply": False})
            outbound.comm = comm
        await outbound.comm.write(message)

    async def send(self, session, source, dest, address, key, obj):
        from distributed.protocol import to_serialize

        # no await before in_turn takes its place: the posting order is the order on the wire
        outbound = self._outbound_to(session, source, address)
        message = {"tag": key, "dest": dest, "data": to_serialize(obj)}
        await outbound.in_turn(lambda: self._write(session, source, address, outbound, message))

    async def notify(self, session, source, addresses, message):
        """Send ``message`` (an abort or a goodbye) to every address, best effort, each within a few seconds."""

        async def one(address):
            outbound = self._outbound_to(session, source, address)
            try:
                await asyncio.wait_for(outbound.in_turn(lambda: self._write(session, source, address, outbound,
                                                                             message)), _NOTIFY_TIMEOUT_S)
            except Exception as error:  # noqa: BLE001 - a peer that is gone needs no message
                logger.debug("hpcgpu comm: %s not delivered to %s: %s", message, address, error)

        await asyncio.gather(*(one(address) for address in addresses))

    async def close_streams(self, session, source=None):
        """Say goodbye on the streams of ``session`` from this worker (only rank ``source``'s, if given); close them."""
        for key in [k for k in self._outbound if k[0] == session and source in (None, k[1])]:
            outbound = self._outbound.pop(key)
            if outbound.comm is None or outbound.comm.closed():
                continue
            try:
                await asyncio.wait_for(outbound.in_turn(lambda: outbound.comm.write({"bye": True})),
                                       _NOTIFY_TIMEOUT_S)
                await outbound.comm.close()
            except Exception as error:  # noqa: BLE001 - a peer that is gone needs no goodbye
                logger.debug("hpcgpu comm: no goodbye to %s: %s", key[2], error)


class DaskCommunicator(Communicator):
    """Rank ``rank`` of ``session`` on this dask worker (made by :func:`communicator`)."""

    def __init__(self, session, rank, extension):
        super().__init__(rank, session.size, session.timeout)
        self.session = session
        self._extension = extension
        self._mailbox = extension.mailbox(session.id)
        extension.remember(session)

    def _aborted_reason(self):
        return self._mailbox.aborted

    def _post_send(self, obj, dest, key):
        address = self.session.addresses[dest]
        if address == self._extension.worker.address:
            # a rank on this same worker: a private copy into the mailbox, as the other paths deliver (the
            # send is complete at once, so the sender may reuse obj; neither rank may see the other's writes)
            self._mailbox.put(dest, self.rank, key, copy.deepcopy(obj))
            return _Finished(f"a send to rank {dest} tagged {key!r}")
        direct = self.session.direct[dest] if self.session.direct else None
        if direct is not None:
            # from this thread, on its own socket: no event loop in between (direct_comm)
            try:
                self._extension.link(self.session.id, self.rank, direct).send(dest, key, obj, self.timeout,
                                                                              self._aborted_reason)
            except CommAborted:
                raise
            except CommError as error:
                # an object no pickler takes, or a peer that took no data within the timeout: the peers
                # must not wait for this message until their own timeouts
                self._extension.spread_abort(self.session.id, self.rank, str(error))
                raise
            except OSError as error:
                reason = f"rank {self.rank} could not send to rank {dest} ({type(error).__name__}: {error})"
                self._extension.spread_abort(self.session.id, self.rank, reason)
                raise CommAborted(reason, rank=self.rank) from error
            self.check()
            return _Finished(f"a send to rank {dest} tagged {key!r}")
        future = self._extension.post(self._extension.send(self.session.id, self.rank, dest, address, key, obj))
        return _Send(future, self._mailbox, dest, key, self.rank)

    def _post_receive(self, source, key):
        return _MailboxReceive(self._mailbox, source, key, self.rank)

    @property
    def transport(self):
        """``"direct"`` (sockets from the rank's thread) or ``"dask"`` (dask's comm layer)."""
        return "direct" if self.session.direct else "dask"

    def _peer_addresses(self):
        """The other workers of the session, each once (ranks on this worker share its mailbox)."""
        own = self._extension.worker.address
        return sorted({a for a in self.session.addresses if a != own})

    @property
    def aborted(self):
        """The reason this session was aborted, or None."""
        return self._mailbox.aborted

    def check(self):
        """Raise CommAborted if the session was aborted (cheap: call it between steps)."""
        if self._mailbox.aborted is not None:
            raise CommAborted(f"rank {self.rank}: the run was aborted: {self._mailbox.aborted}", rank=self.rank)

    def abort(self, reason):
        reason = f"rank {self.rank} aborted: {reason}"
        self._mailbox.abort(reason)
        peers = self._peer_addresses()
        future = self._extension.post(self._extension.notify(self.session.id, self.rank, peers, {"abort": reason}))
        try:
            future.result(2 * _NOTIFY_TIMEOUT_S)
        except Exception:  # noqa: BLE001 - the peers also learn it from their own timeouts
            pass

    def close(self):
        """Say goodbye on this rank's connections of the session and close them (the end of its part in it).

        Other ranks of the session on this worker keep theirs. A rank does
        not send again in the session after ``close()``: a message on a new
        connection could overtake one still in flight on the closed one.
        """
        super().close()
        self._extension.close_links(self.session.id, self.rank)
        try:
            self._extension.post(self._extension.close_streams(self.session.id, self.rank)).result(
                2 * _NOTIFY_TIMEOUT_S)
        except Exception:  # noqa: BLE001 - closing is best effort
            pass


def _rebuilt(data):
    """The object of a message's ``data`` read without deserialization (see ``serve_stream``)."""
    from distributed.protocol.serialize import Serialize, Serialized, merge_and_deserialize

    if isinstance(data, Serialize):  # in-process comms pass the object itself
        return data.data
    if not isinstance(data, Serialized):
        return data
    frames = data.frames
    if "compression" in data.header:
        from distributed.protocol.compression import decompress

        frames = decompress(data.header, frames)
    return merge_and_deserialize(data.header, frames)


def _extension(worker):
    extension = worker.extensions.get(EXTENSION)
    if extension is None:
        extension = worker.extensions[EXTENSION] = CommExtension(worker)
    return extension


def _current_worker(worker):
    if worker is not None:
        return worker
    from distributed import get_worker

    try:
        return get_worker()
    except ValueError as error:
        raise ClusterError("communicator() runs inside a task on a dask worker (or is given the worker)") from error


def communicator(session, rank, worker=None):
    """This worker's :class:`DaskCommunicator` for ``rank`` of ``session``.

    Call it inside a task, or pass the task's ``worker`` (``get_worker()``)
    from threads the task started.

    Raises
    ------
    ClusterError
        Called outside a dask worker, or on a worker that is not ``rank``'s.
    ConfigError
        The worker's :data:`POLL_ENV` is not a number of seconds between 0 and 1.
    """
    poll_seconds()  # a bad setting stops the rank here, with its name, not a mailbox made by a message
    worker = _current_worker(worker)
    if worker.address != session.addresses[rank]:
        raise ClusterError(f"rank {rank} of session {session.id} belongs to {session.addresses[rank]}, not to "
                           f"this worker {worker.address}: epoch tasks must be pinned to their worker")
    return DaskCommunicator(session, rank, _extension(worker))


def abort_session(session, rank, reason, worker=None):
    """Abort ``session`` from ``rank`` without a communicator object (a rank that failed to make one)."""
    DaskCommunicator(session, rank, _extension(_current_worker(worker))).abort(reason)
