"""``hpcgpu bench comm``: a message too large for the workers is refused before any rank runs."""

import io
import types

import pytest

import hpcgpu.cluster
from hpcgpu.bench import comm
from hpcgpu.bench.harness import Recorder
from hpcgpu.errors import ConfigError


def test_a_size_beyond_the_workers_memory_is_a_config_error_naming_the_limit(monkeypatch):
    workers = {f"tcp://127.0.0.1:{port}": {"host": "127.0.0.1", "memory_limit": 2**30} for port in (1, 2)}
    monkeypatch.setattr(hpcgpu.cluster, "worker_info", lambda client: workers)
    monkeypatch.setattr(comm, "measure", lambda *a, **k: pytest.fail("measured a message that cannot fit"))
    client = types.SimpleNamespace(scheduler=types.SimpleNamespace(address="tcp://127.0.0.1:8786"))
    with pytest.raises(ConfigError, match=rf"size must be <= {2**28} bytes .*got {10**12}"):
        comm.run(Recorder("comm", stream=io.StringIO()), client, sizes=(4096, 10**12), repeats=3, stream=None)
