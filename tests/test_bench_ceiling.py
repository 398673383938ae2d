"""The contention ceiling of weak scaling: one rank's kernels in plain processes side by side."""

import statistics

import pytest

from hpcgpu.bench.ceiling import contention_efficiency
from hpcgpu.errors import ConfigError


@pytest.mark.parametrize("backend", ["numba", "numpy"])
def test_side_by_side_rates_are_measured_for_every_process(backend):
    result = contention_efficiency(2, per_worker=48, seconds=0.3, backend=backend)
    rates = result["side_by_side_steps_per_s"]
    assert len(rates) == 2 and all(rate > 0 for rate in rates) and result["alone_steps_per_s"] > 0
    # two processes on two cores: neither can be much faster than one alone (noise allowed), and a
    # ratio near zero would mean a process never ran
    assert 0.05 < result["efficiency"] < 1.6
    assert result["efficiency"] == pytest.approx(min(rates) / result["alone_steps_per_s"])
    assert result["median_efficiency"] == pytest.approx(statistics.median(rates) / result["alone_steps_per_s"])
    assert result["efficiency"] <= result["median_efficiency"]


@pytest.mark.parametrize("kwargs, match", [
    (dict(processes=1), "processes"), (dict(per_worker=8), "per_worker"), (dict(seconds=0), "seconds"),
    (dict(dtype="float16"), "dtype"), (dict(backend="cupy"), "CPU backend"),
])
def test_bad_parameters_name_themselves(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        contention_efficiency(**{"processes": 2, **kwargs})


def test_the_bystanders_are_the_client_and_nannies_never_a_worker(client):
    """``bench scaling``'s ``bystander_cpu_s``: CPU time of everything of the cluster but the ranks."""
    import os
    import time

    from hpcgpu.bench.scaling import _BystanderCPU

    bystanders = _BystanderCPU(client)
    pids = {p.pid for p in bystanders.processes}
    workers = set(client.run(os.getpid).values())
    assert os.getpid() in pids and not pids & workers
    # a local cluster's scheduler and nannies are objects in this process; its other children
    # (multiprocessing's helpers) count too
    before = bystanders.seconds()
    deadline = time.process_time() + 0.2
    while time.process_time() < deadline:  # burn CPU in this process: it must be counted
        pass
    assert bystanders.seconds() - before >= 0.15
