"""An in-process group of thread ranks for tests: a :class:`~hpcgpu.partition.communicator.Communicator` per thread.

Messages are private copies, delivered at once; the counters of the base
class count them as any transport's do.
"""

import copy
import threading
import time

from hpcgpu.errors import CommAborted
from hpcgpu.partition.communicator import Communicator, Request, raise_timeout


class ThreadGroup:
    """The shared state of a group of thread ranks: queued messages by (dest, source, key), and the abort."""

    def __init__(self):
        self.condition = threading.Condition()
        self.queues = {}
        self.aborted = None


class _Receive(Request):
    def __init__(self, group, rank, source, key):
        super().__init__(f"a message from rank {source} tagged {key!r}")
        self.group, self.rank, self.slot = group, rank, (rank, source, key)

    def done(self):
        with self.group.condition:
            return bool(self.group.queues.get(self.slot)) or self.group.aborted is not None

    def wait(self, timeout):
        deadline = time.monotonic() + timeout
        with self.group.condition:
            while True:
                queue = self.group.queues.get(self.slot)
                if queue:
                    return queue.pop(0)
                if self.group.aborted is not None:
                    raise CommAborted(f"rank {self.rank}: the run was aborted while waiting for {self.describe}: "
                                      f"{self.group.aborted}", rank=self.rank)
                left = deadline - time.monotonic()
                if left <= 0:
                    raise_timeout(self.describe, timeout, self.rank)
                self.group.condition.wait(left)


class _Sent(Request):
    def done(self):
        return True

    def wait(self, timeout):
        return None


class ThreadCommunicator(Communicator):
    """One rank of a group of threads; messages are private copies, delivered at once."""

    transport = "threads"

    def __init__(self, group, rank, size, timeout=10.0):
        super().__init__(rank, size, timeout)
        self.group = group

    def _post_send(self, obj, dest, key):
        with self.group.condition:
            self.group.queues.setdefault((dest, self.rank, key), []).append(copy.deepcopy(obj))
            self.group.condition.notify_all()
        return _Sent(f"a send to rank {dest} tagged {key!r}")

    def _post_receive(self, source, key):
        return _Receive(self.group, self.rank, source, key)

    def abort(self, reason):
        with self.group.condition:
            self.group.aborted = self.group.aborted or f"rank {self.rank} aborted: {reason}"
            self.group.condition.notify_all()


def run_group(size, function, *args, timeout=10.0):
    """``function(comm, *args)`` on every rank of a new group of ``size`` threads; ``(results, comms)``.

    A rank's exception is its result (the test checks it).
    """
    group = ThreadGroup()
    comms = [ThreadCommunicator(group, rank, size, timeout) for rank in range(size)]
    results = [None] * size

    def one(rank):
        try:
            results[rank] = function(comms[rank], *args)
        except Exception as error:  # noqa: BLE001 - the test looks at it
            results[rank] = error

    threads = [threading.Thread(target=one, args=(rank,)) for rank in range(size)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not any(thread.is_alive() for thread in threads), "a rank hangs"
    return results, comms


