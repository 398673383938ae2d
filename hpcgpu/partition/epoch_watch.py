"""The client's waits on a partitioned run's epochs: deadlines, lost workers, and the root cause of a failure.

:class:`EpochWatch` is the part of :class:`~hpcgpu.partition.engine.PartitionedExecutor`
that waits. While it waits for an epoch's futures it

- raises the root cause of a failed epoch: a rank's own error (once,
  whatever its words), else :class:`~hpcgpu.errors.WorkerLost` when the
  errors say by their types that a worker was lost
  (:func:`~hpcgpu.partition.faults.is_lost_worker`) or when the ranks were
  aborted and a worker of the run is really gone from the scheduler, else
  the communicator's error (a timeout before the aborts it caused);
- checks every :data:`_POLL_S` that the run's workers are still there;
- past the epoch's deadline (:mod:`hpcgpu.partition.faults`) asks every
  worker what its ranks are doing (:mod:`hpcgpu.partition.rank_activity`)
  and raises :class:`~hpcgpu.errors.EpochDeadline` naming them.

Every failure first hands the epochs to ``abandon`` (the executor drops
them and aborts the ranks still running, :meth:`EpochWatch.abort_ranks`),
so that no rank holds its worker after the error.
"""

import threading
import time

from hpcgpu.cluster import worker_info
from hpcgpu.errors import CommAborted, WorkerLost
from hpcgpu.partition.faults import deadline_error, is_lost_worker, root_cause
from hpcgpu.partition.rank_activity import activity_here
from hpcgpu.partition.worker_ranks import abort_session_here

__all__ = ["EpochWatch", "watched_gather"]

ROOT_CAUSE_WAIT_S = 5.0
"""How long the client waits, after a rank aborted, for the rank whose error caused it."""
_POLL_S = 1.0
"""How often the client, waiting for an epoch, checks that the session's workers are alive."""


class EpochWatch:
    """Waits on the epochs of one run (see the module doc).

    Parameters
    ----------
    client : distributed.Client
    session : hpcgpu.partition.dask_communicator.Session
        The run's communicator session.
    owner : sequence of str
        The worker of each rank.
    name : str
        The run's name (it starts every error's message).
    abandon : callable
        ``abandon(futures, reason)``: the run failed; called before any error is raised.
    """

    def __init__(self, client, session, owner, name, abandon):
        self.client, self.session, self.owner, self.name, self.abandon = client, session, list(owner), name, abandon
        self.ranks_of = {}
        for rank, worker in enumerate(owner):
            self.ranks_of.setdefault(worker, []).append(rank)

    def wait(self, futures, deadline=None):
        """Wait for ``futures``, watching the session's workers; translate failures; past ``deadline``, abort."""
        from distributed import wait

        alive_checked = time.monotonic()
        while True:
            pending = [f for f in futures if f.status == "pending"]
            if pending:
                try:  # wakes on the first to finish or fail (dask has no FIRST_EXCEPTION)
                    wait(pending, timeout=_POLL_S, return_when="FIRST_COMPLETED")
                except Exception:  # noqa: BLE001 - a timeout (not done yet) or cancelled futures (seen below)
                    pass
            failed = [f for f in futures if f.status in ("error", "cancelled", "lost")]
            if failed:
                self._fail(failed, futures)
            if all(f.status == "finished" for f in futures):
                return
            if deadline is not None and time.monotonic() >= deadline["at"]:
                self._expire(futures, deadline)
            if time.monotonic() - alive_checked >= _POLL_S:
                alive_checked = time.monotonic()
                missing = set(self.owner) - set(worker_info(self.client))
                if missing:
                    self.abandon(futures, f"{', '.join(sorted(missing))} left the cluster")
                    raise WorkerLost(f"{self.name}: a worker was lost during the run ({', '.join(sorted(missing))} "
                                     "left the cluster); the partitions it held are gone")

    def _expire(self, futures, deadline):
        """``deadline`` passed: ask the ranks what they do, abort them all, raise EpochDeadline naming them."""
        pending = {w: self.ranks_of[w] for w, future in deadline["results"].items() if future.status != "finished"}
        # every worker: a rank of the next epoch may be what holds this one's last task
        error = deadline_error(deadline["what"], deadline["seconds"], deadline["why"], pending,
                               self._ask(self.ranks_of), self.owner)
        self.abandon(futures, f"EpochDeadline: epoch {deadline['epoch']} passed its deadline")
        raise error

    def _ask(self, workers):
        """``{worker: {rank: what it does}}`` of the session's ranks on ``workers`` (an error where one failed)."""
        try:
            return self.client.run(activity_here, self.session.id, workers=list(workers), on_error="return")
        except Exception:  # noqa: BLE001 - a gone worker: its ranks are named without what they did
            return {}

    def abort_ranks(self, reason):
        """Abort the session on its workers (those left): the ranks still running stop at their next wait."""
        alive = sorted(set(self.owner) & set(worker_info(self.client)))
        if alive:
            try:
                self.client.run(abort_session_here, self.session.id, reason, workers=alive, on_error="ignore")
            except Exception:  # noqa: BLE001 - best effort: a gone worker has nothing to abort
                pass

    def _fail(self, failed, futures):
        """Raise the root cause of a failed epoch: a rank's own error before the aborts it caused."""
        from distributed import wait

        errors = self._errors(failed)
        if all(isinstance(e, CommAborted) for e in errors):
            # the aborted ranks may finish before the rank that failed: give it a moment to report
            try:
                wait(futures, timeout=ROOT_CAUSE_WAIT_S)
            except Exception:  # noqa: BLE001 - dask's TimeoutError: report what there is
                pass
            errors = self._errors([f for f in futures if f.status in ("error", "cancelled", "lost")])
        # told by type: a rank's own error whose words say "lost" is still its own, raised once
        error, kind = root_cause(errors)
        missing = sorted(set(self.owner) - set(worker_info(self.client))) if kind == "comm" else []
        self.abandon(futures, f"{type(error).__name__}: {error}")
        if kind == "own":
            raise error
        if kind == "lost":
            raise WorkerLost(f"{self.name}: a worker was lost during the run ({type(error).__name__}: {error}); "
                             "the partitions it held are gone") from error
        if missing:  # the ranks were aborted because a worker of the run left the cluster
            raise WorkerLost(f"{self.name}: a worker was lost during the run ({', '.join(missing)} left the cluster; "
                             f"{type(error).__name__}: {error}); the partitions it held are gone") from error
        raise error

    def _errors(self, failed):
        """The error of each failed future; a cancelled or lost one's is a WorkerLost (its worker took it)."""
        errors = []
        for future in failed:
            if future.status == "error":
                try:
                    errors.append(future.exception(timeout=10))
                except Exception as error:  # noqa: BLE001
                    errors.append(error)
            else:  # its data or its task went with a worker (the client cancels only after a failure)
                errors.append(WorkerLost(f"{self.name}: an epoch task was {future.status} (its worker left, or "
                                         "the data it needs went with one)"))
        return errors

    def gather(self, futures):
        """``client.gather(futures)``, watching the workers (:func:`watched_gather`); a lost worker's error
        becomes WorkerLost, the run abandoned."""

        def lost(why):
            self.abandon(futures, why)
            raise WorkerLost(f"{self.name}: a worker was lost during the run ({why}, while the client "
                             "gathered the ranks' results); the partitions it held are gone")

        try:
            return watched_gather(self.client, futures, self.owner, lost)
        except WorkerLost:
            raise
        except Exception as error:  # noqa: BLE001 - translated when it is a lost worker
            if is_lost_worker(error):
                # the partitions are gone: the run has failed, as on every other lost-worker path
                self.abandon(futures, f"{type(error).__name__}: {error}")
                raise WorkerLost(f"{self.name}: a worker was lost during the run ({type(error).__name__}: "
                                 f"{error}); the partitions it held are gone") from error
            raise


def watched_gather(client, futures, owner, lost):
    """``client.gather(futures)``, or ``lost(why)`` (which raises) when a worker of ``owner`` goes meanwhile.

    Finished futures whose worker dies before their data arrives become
    lost, and their tasks (pinned to that worker) would wait for it
    forever: the gather runs in a thread while this one looks at the
    futures and the workers every ``_POLL_S``; ``lost`` should cancel the
    futures (which ends the gather) and raise.
    """
    outcome = {}

    def fetch():
        try:
            outcome["value"] = client.gather(futures, errors="raise")
        except BaseException as error:  # noqa: BLE001 - handed to the waiting thread
            outcome["error"] = error

    fetching = threading.Thread(target=fetch, name="hpcgpu-gather", daemon=True)
    fetching.start()
    while True:
        fetching.join(_POLL_S)
        if not fetching.is_alive():
            break
        gone = [f for f in futures if f.status in ("lost", "cancelled")]
        missing = sorted(set(owner) - set(worker_info(client)))
        if gone or missing:
            try:
                lost(f"{', '.join(missing)} left the cluster" if missing else
                     f"the data of {len(gone)} task(s) went with a worker")
            finally:
                client.cancel(futures)
                fetching.join(10)
            raise RuntimeError("watched_gather: lost() returned instead of raising")
    if "value" in outcome:
        return outcome["value"]
    raise outcome.get("error", RuntimeError("the gather ended without a result"))
