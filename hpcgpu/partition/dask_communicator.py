"""``DaskCommunicator``: a communicator on dask's own comm layer, worker to worker, never through the scheduler.

Each worker gets a :class:`~hpcgpu.partition.comm_extension.CommExtension`
(installed by :class:`~hpcgpu.partition.dask_session.CommWorkerPlugin` when
a session opens), which files what reaches the worker in the
:class:`~hpcgpu.partition.mailbox.Mailbox` of its session. A rank sends to a peer over one long-lived stream per
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
- a peer that falls silent (a stopped or cut-off worker keeps its TCP
  connections open) is found by heartbeats within seconds
  (:mod:`hpcgpu.partition.heartbeats`): the waits raise
  :class:`~hpcgpu.errors.PeerLost`;
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

import copy
from dataclasses import dataclass, field

from hpcgpu.errors import ClusterError, CommAborted, CommError
from hpcgpu.partition.comm_extension import NOTIFY_TIMEOUT_S, worker_extension
from hpcgpu.partition.communicator import DEFAULT_TIMEOUT_S, Communicator, Request, _Finished, raise_timeout
from hpcgpu.partition.heartbeats import silence_seconds
from hpcgpu.partition.mailbox import MailboxReceive, poll_seconds

__all__ = ["DaskCommunicator", "SendRequest", "Session", "abort_session", "communicator", "current_worker"]


@dataclass(frozen=True)
class Session:
    """A communicator group: its id and the address of each rank's worker (rank order).

    ``secret`` (made by :func:`~hpcgpu.partition.dask_session.open_session`,
    it travels to the workers with the session through dask's comm) is what
    a rank proves at the direct listeners of its peers
    (:mod:`hpcgpu.partition.direct_comm`); it is never printed.
    """

    id: str
    addresses: tuple
    timeout: float = DEFAULT_TIMEOUT_S
    direct: tuple = ()  # each rank's worker's direct listener ("host:port"), or None: the dask path
    secret: bytes = field(default=b"", repr=False)

    @property
    def size(self):
        return len(self.addresses)


class SendRequest(Request):
    """A send posted to the worker's event loop (dask's comm path): ``future`` completes when it is written."""

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
                raise self.mailbox.failure(self.rank, f" during {self.describe}") from None
            raise_timeout(self.describe, timeout, self.rank)
        except CommAborted:
            raise
        except Exception as error:  # noqa: BLE001 - a closed or refused connection: the peer is gone
            reason = f"rank {self.rank} could not complete {self.describe}: {type(error).__name__}: {error}"
            self.mailbox.abort(reason)
            raise CommAborted(reason, rank=self.rank) from error


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
                self.check()  # PeerLost when a peer's silence aborted the session
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
        return SendRequest(future, self._mailbox, dest, key, self.rank)

    def _post_receive(self, source, key):
        return MailboxReceive(self._mailbox, source, key, self.rank)

    @property
    def extension(self):
        """The worker's :class:`~hpcgpu.partition.comm_extension.CommExtension` this rank's messages go through."""
        return self._extension

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
        """Raise CommAborted (PeerLost after a peer's silence) if the session was aborted (cheap: between steps)."""
        if self._mailbox.aborted is not None:
            raise self._mailbox.failure(self.rank)

    def abort(self, reason):
        reason = f"rank {self.rank} aborted: {reason}"
        self._mailbox.abort(reason)
        peers = self._peer_addresses()
        future = self._extension.post(self._extension.notify(self.session.id, self.rank, peers, {"abort": reason}))
        try:
            future.result(2 * NOTIFY_TIMEOUT_S)
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
                2 * NOTIFY_TIMEOUT_S)
        except Exception:  # noqa: BLE001 - closing is best effort
            pass


def current_worker(worker=None):
    """``worker``, or the dask worker running this task; ClusterError outside one."""
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
        The worker's :data:`POLL_ENV` is not a number of seconds between 0 and 1, or its
        :data:`~hpcgpu.partition.heartbeats.SILENCE_ENV` is out of range.
    """
    poll_seconds()  # a bad setting stops the rank here, with its name, not a mailbox made by a message
    silence_seconds()  # the heartbeat thread only logs it
    worker = current_worker(worker)
    if worker.address != session.addresses[rank]:
        raise ClusterError(f"rank {rank} of session {session.id} belongs to {session.addresses[rank]}, not to "
                           f"this worker {worker.address}: epoch tasks must be pinned to their worker")
    return DaskCommunicator(session, rank, worker_extension(worker))


def abort_session(session, rank, reason, worker=None):
    """Abort ``session`` from ``rank`` without a communicator object (a rank that failed to make one)."""
    DaskCommunicator(session, rank, worker_extension(current_worker(worker))).abort(reason)
