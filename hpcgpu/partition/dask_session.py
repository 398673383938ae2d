"""Sessions of the dask communicator: opened and closed from the client, with their plugins.

:func:`open_session` makes a :class:`~hpcgpu.partition.dask_communicator.Session`
(the communicator group of one simulation, raft-dask's ``Comms``): it
installs :class:`CommWorkerPlugin` (the communicator's extension on every
worker, those that join later included) and :class:`CommSchedulerPlugin`
(which hooks the scheduler's ``remove_worker``, as dask's P2P shuffle does,
and tells the remaining workers of every session a lost worker belonged
to), and opens the session on each of its workers with a fresh secret
(sent through dask, never over the rank port it protects: see
:mod:`hpcgpu.partition.direct_comm`), which starts their direct listeners. :func:`close_session` has
every rank say goodbye and close its streams, and the scheduler forget the
session. A session whose workers cannot all open their rank port (a
``--contact-address`` that is not the worker's own and a listen address
that cannot be bound either, ...) runs on dask's comm layer, and
:func:`open_session` says so once, naming the worker and the reason. When
a worker's heartbeats find a peer silent
(:mod:`hpcgpu.partition.heartbeats`), the scheduler plugin removes that
peer if the scheduler has not heard from it for :data:`SCHEDULER_SILENCE_S`
either, so that the run restarts on the workers left. Transports built on
the communicator (NCCL's) end their own per-session state through
:func:`on_session_close`.

Examples
--------
>>> from hpcgpu.cluster import start_cluster  # doctest: +SKIP
>>> from hpcgpu.partition.dask_communicator import communicator  # doctest: +SKIP
>>> client = start_cluster(workers=2, quiet=True)  # doctest: +SKIP
>>> session = open_session(client, sorted(client.scheduler_info()["workers"]))  # doctest: +SKIP
>>> def total(session, rank):  # doctest: +SKIP
...     return communicator(session, rank).allreduce(rank + 1)
>>> [client.submit(total, session, r, workers=[w]).result()  # doctest: +SKIP
...  for r, w in enumerate(session.addresses)]
[3, 3]
>>> close_session(client, session)  # doctest: +SKIP
"""

import logging
import uuid

from hpcgpu.partition.communicator import DEFAULT_TIMEOUT_S
from hpcgpu.partition.comm_extension import ABORT_OP, NOTIFY_TIMEOUT_S, SILENT_OP, worker_extension
from hpcgpu.partition.dask_communicator import Session
from hpcgpu.partition.direct_comm import new_secret

__all__ = ["CommSchedulerPlugin", "CommWorkerPlugin", "SCHEDULER_SILENCE_S", "close_session", "on_session_close",
           "open_session"]

logger = logging.getLogger(__name__)

SCHEDULER_SILENCE_S = 2.0
"""Seconds without a heartbeat to the scheduler (at least four of dask's intervals) after which a worker that its
peers find silent is removed; one the scheduler still hears from is not (a network split between workers only)."""

REGISTER_OP = "hpcgpu_comm_register"
FORGET_OP = "hpcgpu_comm_forget"

_session_closers = []


def on_session_close(release):
    """Have ``release(session_id)`` called on each worker as a session closes there.

    For transports built on this communicator (the NCCL one of
    :mod:`hpcgpu.partition.nccl_sessions` registers its per-session state
    when it is imported): they end what they keep per session without this
    module knowing them. Registering one function twice registers it once.
    """
    if release not in _session_closers:
        _session_closers.append(release)


def _close_worker(session):
    from distributed import get_worker

    from hpcgpu.partition.decomposition import forget_rank_caches

    extension = worker_extension(get_worker())
    # every rank's connections on this worker, not one rank's (DaskCommunicator.close)
    extension.close_links(session.id)
    try:
        extension.post(extension.close_streams(session.id)).result(2 * NOTIFY_TIMEOUT_S)
    except Exception:  # noqa: BLE001 - closing is best effort
        pass
    extension.forget(session.id)
    # the work buffers of the session's ranks here: the client's own copy of this call frees only its own
    forget_rank_caches(session.id)
    for release in list(_session_closers):
        release(session.id)


# -- plugins --------------------------------------------------------------------------------------
try:
    from distributed.diagnostics.plugin import SchedulerPlugin, WorkerPlugin
except ImportError:  # pragma: no cover - dask is a dependency
    SchedulerPlugin = WorkerPlugin = object


class CommWorkerPlugin(WorkerPlugin):
    """Installs the :class:`CommExtension` on every worker, those that join later included."""

    name = "hpcgpu-comm"
    idempotent = True

    def setup(self, worker):
        worker_extension(worker)


class CommSchedulerPlugin(SchedulerPlugin):
    """Knows each session's workers and, when one leaves the cluster, aborts the session on the others."""

    name = "hpcgpu-comm"
    idempotent = True

    def __init__(self):
        self.sessions = {}

    async def start(self, scheduler):
        self.scheduler = scheduler
        scheduler.handlers[REGISTER_OP] = self.register
        scheduler.handlers[FORGET_OP] = self.forget
        scheduler.handlers[SILENT_OP] = self.silent

    async def silent(self, reporter=None, silent=None, seconds=None, session=None):
        """Handler: ``reporter`` heard nothing from ``silent`` for ``seconds``; remove it if silent here too."""
        from distributed.metrics import time
        from distributed.scheduler import heartbeat_interval

        state = self.scheduler.workers.get(silent)
        if state is None:
            return
        quiet = time() - state.last_seen
        limit = max(SCHEDULER_SILENCE_S, 4 * heartbeat_interval(len(self.scheduler.workers)))
        if quiet < limit:
            logger.warning("hpcgpu comm: %s found %s silent for %.1f s in session %s, but the scheduler heard from it "
                           "%.1f s ago: not removed", reporter, silent, seconds, session, quiet)
            return "kept"
        logger.warning("hpcgpu comm: removing worker %s: silent to its peer %s for %.1f s and to the scheduler for "
                       "%.1f s (stopped, cut off or frozen)", silent, reporter, seconds, quiet)
        await self.scheduler.remove_worker(silent, stimulus_id=f"hpcgpu-silent-{time()}", close=True)
        return "removed"

    def register(self, session=None, workers=None):
        self.sessions[session] = set(workers)
        return "OK"

    def forget(self, session=None):
        self.sessions.pop(session, None)
        return "OK"

    def remove_worker(self, scheduler, worker, **kwargs):
        for session, members in list(self.sessions.items()):
            if worker not in members:
                continue
            reason = f"worker {worker} left the cluster"
            messages = {w: [{"op": ABORT_OP, "session": session, "reason": reason}]
                        for w in members if w != worker and w in scheduler.workers}
            scheduler.send_all({}, messages)
            del self.sessions[session]


def _open_on_worker(session_id, secret, direct, dask_worker=None):
    """Open the session on this worker (its messages are taken from now on).

    Returns ``(its direct listener or None, why the rank port could not open or None)``.
    """
    extension = worker_extension(dask_worker)
    address = extension.open(session_id, secret, direct)
    return address, (extension.listener_problem if direct and address is None else None)


def open_session(client, addresses, timeout=DEFAULT_TIMEOUT_S, direct=True):
    """A new :class:`Session` of the workers at ``addresses`` (rank order), plugins installed.

    ``direct=False`` keeps every message on dask's comm layer (the direct
    socket path of :mod:`hpcgpu.partition.direct_comm` is used otherwise
    wherever the workers speak tcp or tls). Where a worker's rank port
    cannot open, the whole session uses dask's comm layer, with a
    RuntimeWarning that names the worker and the reason.

    The scheduler plugin needs hpcgpu importable on the scheduler; without
    it lost workers are still noticed (closed streams, timeouts) and a
    warning says what is missing.
    """
    client.register_plugin(CommWorkerPlugin())
    # the secret goes to the workers through dask's comm, never over the rank port it protects
    session_id, secret = uuid.uuid4().hex, new_secret()
    opened = client.run(_open_on_worker, session_id, secret, direct, workers=sorted(set(addresses)))
    problems = {worker: problem for worker, (_, problem) in opened.items() if problem is not None}
    direct = () if problems else tuple(opened[a][0] if a in opened else None for a in addresses)
    if problems:
        import warnings

        said = "; ".join(f"{worker}: {problem}" for worker, problem in sorted(problems.items()))
        warnings.warn(f"hpcgpu: the rank port cannot open on {len(problems)} worker(s) ({said}); session "
                      f"{session_id} runs on dask's comm layer instead", RuntimeWarning, stacklevel=2)
    session = Session(session_id, tuple(addresses), float(timeout),
                      direct if any(d is not None for d in direct) else (), secret)
    try:
        client.register_plugin(CommSchedulerPlugin())
        client.sync(client.scheduler.hpcgpu_comm_register, session=session.id, workers=list(session.addresses))
    except Exception as error:  # noqa: BLE001 - a scheduler without hpcgpu: degrade, say so
        import warnings

        warnings.warn(f"hpcgpu: the scheduler could not take the communicator's plugin ({error}); lost workers "
                      "are noticed from closed connections and timeouts only", RuntimeWarning, stacklevel=2)
    return session


def close_session(client, session):
    """End ``session``: its ranks say goodbye and close their streams; the scheduler forgets it."""
    from distributed import wait

    from hpcgpu.cluster import worker_info

    alive = set(worker_info(client))
    futures = [client.submit(_close_worker, session, workers=[address], allow_other_workers=False, pure=False,
                             key=f"hpcgpu-comm-close-{session.id}-{k}")
               for k, address in enumerate(sorted(set(session.addresses) & alive))]

    try:
        wait(futures, timeout=3 * NOTIFY_TIMEOUT_S)
    except Exception:  # noqa: BLE001 - a worker that is gone has nothing to close
        pass
    for future in futures:
        future.cancel()
    try:
        client.sync(client.scheduler.hpcgpu_comm_forget, session=session.id)
    except Exception:  # noqa: BLE001 - no scheduler plugin, nothing to forget
        pass
