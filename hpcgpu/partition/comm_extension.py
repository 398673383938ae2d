"""The communicator's side on one dask worker: the mailboxes of its sessions and the streams to its peers.

:class:`CommExtension` (one per worker, :func:`worker_extension`) files the
messages that reach the worker in the :class:`~hpcgpu.partition.mailbox.Mailbox`
of their session, whichever way they come:

- dask's comm layer: a peer opens one long-lived stream per session and
  direction (``hpcgpu_comm_stream``, served by :meth:`CommExtension.serve_stream`
  on the worker's event loop), and this worker's sends go out in posting
  order on its own streams (:class:`Outbound`);
- the direct path (:mod:`hpcgpu.partition.direct_comm`): a listener's
  threads hand over what they read (``_deliver``, ``_abort``, ``_finished``);
- the scheduler: an abort when a worker of the session left the cluster
  (``hpcgpu-comm-abort``, :mod:`hpcgpu.partition.dask_session`).

Every frame from a peer is noted in its mailbox; the worker's
:class:`~hpcgpu.partition.heartbeats.Heartbeats` beat on the idle
connections and abort a session whose peer fell silent
(:meth:`CommExtension.peer_silent`).

Messages make a mailbox only for a session opened on the worker
(:meth:`CommExtension.open`, called by ``open_session`` with the session's
secret before any rank runs) or by one of its own ranks: junk session ids
make nothing. It also spreads an abort found on this worker to the
session's other workers, and forgets a closed session so that nothing of
it comes back (the direct listener closes with the last one).
:class:`~hpcgpu.partition.dask_communicator.DaskCommunicator` is the rank's
side.

Examples
--------
>>> from types import SimpleNamespace
>>> from hpcgpu.partition.comm_extension import CommExtension
>>> worker = SimpleNamespace(address="tcp://127.0.0.1:1", handlers={}, stream_handlers={})
>>> extension = CommExtension(worker)
>>> extension.mailbox("s1").put(0, 1, "halo", "ghosts")
>>> extension.sessions()
['s1']
>>> extension.forget("s1")
>>> extension.sessions()
[]
"""

import asyncio
import collections
import logging
import threading

from hpcgpu.partition.heartbeats import HEARTBEAT_S, SILENCE_ENV, Heartbeats
from hpcgpu.partition.mailbox import Mailbox

__all__ = ["ABORT_OP", "CLOSED_SESSIONS_KEPT", "CommExtension", "EXTENSION", "NOTIFY_TIMEOUT_S", "Outbound",
           "SILENT_OP", "STREAM_OP", "worker_extension"]

logger = logging.getLogger(__name__)

EXTENSION = "hpcgpu-comm"
STREAM_OP = "hpcgpu_comm_stream"
ABORT_OP = "hpcgpu-comm-abort"
SILENT_OP = "hpcgpu_comm_silent"  # worker -> scheduler (rpc): a peer of a session fell silent
# seconds an abort or a goodbye may take to reach a peer (best effort: the peer has its own timeout)
NOTIFY_TIMEOUT_S = 5.0
# closed sessions a worker remembers, so that a late message, goodbye or abort of one does not make its
# mailbox again (a few KiB per thousand; the oldest are dropped first)
CLOSED_SESSIONS_KEPT = 1024


class Outbound:
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
        self._secrets = {}  # the secret of each session opened here: the only ids messages may make mailboxes for
        self._sessions = {}  # the Session of each id a communicator was made for here: whom to tell of an abort
        self._unspread = {}  # (source, reason) of aborts found before a communicator of their session was made
        self._closed = collections.OrderedDict()  # ids of sessions closed here, oldest first
        self.listener_problem, self._problem_logged = None, False  # why the rank port could not open here
        self.heartbeats = Heartbeats(self)
        worker.handlers[STREAM_OP] = self.serve_stream
        worker.stream_handlers[ABORT_OP] = self.abort_from_scheduler

    # -- mailboxes --------------------------------------------------------------------------
    def mailbox(self, session_id):
        """The mailbox of ``session_id`` on this worker (made on first use by a rank, which holds the session).

        A session closed here gets a mailbox of its own, aborted and kept
        nowhere: a rank made too late fails at once, and nothing stays
        behind on the worker.
        """
        box = self._live_mailbox(session_id, make=True)
        if box is None:
            box = Mailbox(poll=0.0)
            box.abort(f"session {session_id} was closed on this worker")
        return box

    def _live_mailbox(self, session_id, make=False):
        """The mailbox of ``session_id``, or None once the session was closed here or was never opened.

        The hooks of incoming messages, goodbyes and aborts use this: what
        comes after a session's close (a peer's goodbye, a late message, the
        scheduler's abort) must not make its mailbox again, and neither may
        an id this worker never opened (junk ids would grow its memory).
        ``make=True`` (a rank's own call) makes it for any id not closed.
        """
        with self._lock:
            if session_id in self._closed:
                return None
            box = self._mailboxes.get(session_id)
            if box is None and (make or session_id in self._secrets):
                box = self._mailboxes[session_id] = Mailbox()
            return box

    def open(self, session_id, secret, direct=True):
        """Open ``session_id`` here with its ``secret``: its messages are taken from now on.

        Returns this worker's direct listener address ("host:port", started
        if it is not running) when ``direct`` and the fast path is on, else
        None (:attr:`listener_problem` then says why, if the port could not
        open). :func:`~hpcgpu.partition.dask_session.open_session` calls it
        on every worker of a session before any rank runs. The heartbeats
        run from now on while a session is open here.
        """
        with self._lock:
            if session_id not in self._closed:
                self._secrets.setdefault(session_id, secret)
        self.heartbeats.start()
        listener = self.listener() if direct else None
        return None if listener is None else listener.address

    def secret_of(self, session_id):
        """The secret of ``session_id`` if it is open here, else None (the listener refuses its peers)."""
        with self._lock:
            return self._secrets.get(session_id)

    def remember(self, session):
        """Note ``session``'s workers (a communicator of it is made here): whom :meth:`spread_abort` tells."""
        with self._lock:
            if session.id in self._closed or session.id in self._sessions:
                return
            if session.secret:
                self._secrets.setdefault(session.id, session.secret)
            self._sessions[session.id] = session
            pending = self._unspread.pop(session.id, None)
        if pending is not None:
            self._notify_peers(session, *pending)

    def forget(self, session_id):
        """Drop what this worker keeps of a closed session, and ignore whatever of it comes later.

        The direct listener closes with the last session open here (its port
        is open only while a session needs it; the next session opens one).
        """
        listener = None
        with self._lock:
            self._mailboxes.pop(session_id, None)
            self._sessions.pop(session_id, None)
            self._unspread.pop(session_id, None)
            self._secrets.pop(session_id, None)
            self._closed[session_id] = None
            while len(self._closed) > CLOSED_SESSIONS_KEPT:
                self._closed.popitem(last=False)
            idle = not self._secrets
            if idle and self._listener is not None:
                listener, self._listener = self._listener, None
        if idle:
            self.heartbeats.stop()
        if listener is not None:
            listener.close()

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

    def live_mailboxes(self):
        with self._lock:  # for the heartbeats: [(session id, mailbox)] of the sessions open here
            return list(self._mailboxes.items())

    # -- heartbeats (hpcgpu.partition.heartbeats) ------------------------------------------------
    def send_heartbeats(self, answer):
        """Beat on every idle connection of this worker; the event loop calls ``answer()`` when it gets to it."""
        for link in list(self._links.values()):  # a copy in one C call: safe against the ranks' inserts
            link.heartbeat()
        self._post_if_running(self._beat_streams(answer))

    async def _beat_streams(self, answer):
        answer()
        idle = [o for o in self._outbound.values() if o.comm is not None and not o.comm.closed()
                and (o.tail is None or o.tail.done())]  # a stream busy writing needs no heartbeat

        async def beat(outbound, comm):
            try:
                await outbound.in_turn(lambda: comm.write({"hb": True}))
            except Exception as error:  # noqa: BLE001 - a broken stream: the next data write reports it
                logger.debug("hpcgpu comm: no heartbeat on %s: %s", comm, error)

        await asyncio.gather(*(beat(o, o.comm) for o in idle))

    def peer_silent(self, session_id, source, seconds, limit):
        """Rank ``source`` was silent ``seconds``: waits raise PeerLost, peers are told, the scheduler is asked."""
        box = self._live_mailbox(session_id)
        if box is None or box.aborted is not None:
            return
        with self._lock:
            session = self._sessions.get(session_id)
        address = session.addresses[source] if session is not None else None
        reason = (f"worker {self.worker.address} heard nothing from rank {source} (worker {address or 'unknown'}) "
                  f"for {seconds:.1f} s (heartbeats every {HEARTBEAT_S:g} s, limit {limit:g} s): its worker is "
                  f"stopped, cut off or frozen, and taken as lost ({SILENCE_ENV} sets the limit)")
        logger.warning("hpcgpu comm: %s", reason)
        # posted before the ranks wake: it reaches the scheduler well before their task's error reaches the client
        report = None if address is None else self._post_if_running(self._report_silent(session_id, address, seconds))
        box.abort(reason, lost=source)  # before the scheduler's own abort for the removal comes back
        if session is not None:
            own = [r for r, a in enumerate(session.addresses) if a == self.worker.address]
            self._notify_peers(session, own[0] if own else source, reason)
        try:
            if report is not None:
                report.result(NOTIFY_TIMEOUT_S)
        except Exception as error:  # noqa: BLE001 - no plugin there, or no answer: the ranks' error still comes
            logger.warning("hpcgpu comm: the scheduler did not take the report on %s: %s", address, error)

    async def _report_silent(self, session_id, address, seconds):
        # an rpc: an op unknown to the scheduler (no plugin) on the worker's stream would end it, and drop us
        await getattr(self.worker.scheduler, SILENT_OP)(reporter=self.worker.address, silent=address,
                                                        seconds=seconds, session=session_id)

    # -- the direct path (hpcgpu.partition.direct_comm) ----------------------------------------
    def listener(self):
        """This worker's direct listener (started on first use), or None where the fast path is off."""
        from hpcgpu.partition.direct_comm import Listener, direct_enabled

        with self._lock:
            if self._listener is None and direct_enabled(self.worker.address):
                try:
                    self._listener = Listener(self.worker, self._deliver, self._abort, self._finished,
                                              lambda session, dest, reason: self.spread_abort(session, dest, reason),
                                              secret_of=self.secret_of, heard=self._heard)
                    self.listener_problem = None
                except OSError as error:  # a contact address not its own, no free port: dask's comm layer
                    self.listener_problem = f"{type(error).__name__}: {error}"
                    if not self._problem_logged:  # once per worker: every session would say it again
                        self._problem_logged = True
                        logger.warning("hpcgpu comm: the rank port of worker %s cannot open (%s); its sessions "
                                       "use dask's comm layer", self.worker.address, self.listener_problem)
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

    def _heard(self, session, source):
        box = self._live_mailbox(session)
        if box is not None:
            box.hear(source)

    def _finished(self, session, source):
        box = self._live_mailbox(session)
        if box is not None:
            with box.condition:
                box.finished.add(source)

    def link(self, session, source, address):
        """The connection of rank ``source`` of ``session`` to the listener at ``address`` (made on first use)."""
        from hpcgpu.partition.direct_comm import Link

        secret = self.secret_of(session)
        if not secret:
            raise ConnectionRefusedError(f"session {session} is not open on this worker: no secret to connect with")
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
                link = Link(address, session, source, None if listener is None else listener.client_ssl,
                            secret=secret)
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
        box = self._live_mailbox(session) or Mailbox(poll=0.0)
        # the data is rebuilt here, message by message, so that one that cannot be names its sender and tag
        # and the stream goes on (a failure inside read() would end the handler, and the rest would be lost)
        comm.deserialize = False
        try:
            while True:
                box.hear(source)
                message = await comm.read()
                if "hb" in message:
                    continue
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

    def _post_if_running(self, coroutine):
        """Post ``coroutine`` from a background thread if the worker's loop runs (its future; else None, unrun)."""
        loop = getattr(getattr(self.worker, "loop", None), "asyncio_loop", None)
        try:
            if loop is None or loop.is_closed():
                raise RuntimeError("no event loop")
            return asyncio.run_coroutine_threadsafe(coroutine, loop)
        except RuntimeError:  # the worker is closing: nobody is left to beat to or to tell
            coroutine.close()
            return None

    def _outbound_to(self, session, source, address):
        key = (session, source, address)
        outbound = self._outbound.get(key)
        if outbound is None:
            outbound = self._outbound[key] = Outbound()
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
                                                                             message)), NOTIFY_TIMEOUT_S)
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
                                       NOTIFY_TIMEOUT_S)
                await outbound.comm.close()
            except Exception as error:  # noqa: BLE001 - a peer that is gone needs no goodbye
                logger.debug("hpcgpu comm: no goodbye to %s: %s", key[2], error)


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


def worker_extension(worker):
    """The :class:`CommExtension` of ``worker`` (installed on first use)."""
    extension = worker.extensions.get(EXTENSION)
    if extension is None:
        extension = worker.extensions[EXTENSION] = CommExtension(worker)
    return extension
