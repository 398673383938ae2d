"""``hpcgpu bench soak``: its killer kills a worker on the worker's own host, never a local pid."""

import random
import threading

import pytest

pytest.importorskip("dask")  # a bare GPU image lacks it: skip there (hpcgpu.bench.soak imports it)

from hpcgpu.bench import soak  # noqa: E402


class _RemoteClient:
    """A client of a cluster on other hosts: its workers' pids are not processes of this machine."""

    def __init__(self, stop):
        self.stop, self.calls, self.asked = stop, [], 0

    def run(self, function, *args, workers=None, wait=True, **kwargs):
        if function is soak.os.getpid:
            if self.asked:
                self.stop.set()  # a second round: stop at the next wait whatever the first did
            self.asked += 1
            return {"tcp://node1:4000": 4242, "tcp://node2:4000": 4343}
        self.calls.append((function, workers, wait))
        self.stop.set()  # one kill is enough


def test_the_killer_asks_the_chosen_worker_to_kill_itself(monkeypatch):
    local = []
    monkeypatch.setattr(soak.os, "kill", lambda pid, sig: local.append(pid))
    stop, killed = threading.Event(), []
    client = _RemoteClient(stop)
    soak._killer(client, 0.01, stop, killed, random.Random(0))
    # not os.kill(4242) here: on this host that pid is some unrelated process, or none
    assert local == []
    [(function, workers, wait)] = client.calls
    assert function is soak._kill_this_process and wait is False
    assert workers == [killed[0]["address"]] and killed[0]["address"] in ("tcp://node1:4000", "tcp://node2:4000")
