"""Test tiers and shared fixtures.

One set of tests, three tiers (DESIGN.md):

1. CPU: the ``numpy`` and ``numba`` backends; always runs.
2. CUDA simulator: without a GPU, ``NUMBA_ENABLE_CUDASIM=1`` is set here,
   before Numba is imported, so the ``cuda`` backend's kernels run on the CPU
   at tiny sizes (indexing and logic, not speed). CuPy cannot run there.
3. GPU: ``cuda`` and ``cupy`` on a real device, marked ``gpu``; skipped
   without one, and failing instead when ``HPCGPU_REQUIRE_GPU=1``.
"""

import os

from hpcgpu import _gpu_probe

REQUIRE_GPU = os.environ.get("HPCGPU_REQUIRE_GPU", "0") not in ("", "0")
if not REQUIRE_GPU and not _gpu_probe.probe_driver().loaded:
    os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
from _support import usable_backend  # noqa: E402

from hpcgpu.backends import BACKEND_NAMES  # noqa: E402

SIMULATED = _gpu_probe.simulator_enabled()


def _backend_param(name):
    if name in ("cuda", "cupy") and not (name == "cuda" and SIMULATED):
        return pytest.param(name, marks=pytest.mark.gpu, id=name)
    if name == "cuda":
        return pytest.param(name, marks=pytest.mark.cudasim, id="cuda-sim")
    return pytest.param(name, id=name)


@pytest.fixture(params=[_backend_param(n) for n in BACKEND_NAMES])
def backend(request):
    """Every backend in turn; GPU ones skip (or fail, if required) without a GPU."""
    return usable_backend(request.param)


@pytest.fixture(params=[_backend_param(n) for n in BACKEND_NAMES if n != "numpy"])
def fast_backend(request):
    """Every backend except the numpy reference."""
    return usable_backend(request.param)


@pytest.fixture(params=["float32", "float64"])
def dtype(request):
    return np.dtype(request.param)


@pytest.fixture
def rng():
    """A fresh random generator per test; the seed is printed on failure."""
    seed = int.from_bytes(os.urandom(4), "little")
    print(f"random seed: {seed}")
    return np.random.default_rng(seed)


@pytest.fixture(scope="module")
def client():
    """A real two-process LocalCluster (one single-threaded worker each), one per test module."""
    from hpcgpu.cluster import start_cluster

    client = start_cluster(workers=2, threads_per_worker=1, gpus=False, dashboard_address="127.0.0.1:0", quiet=True)
    yield client
    cluster_object = client.cluster
    client.close()
    cluster_object.close()


def _skip_reason(report):
    """The reason a skipped test report gives (``Skipped: `` and the location dropped)."""
    longrepr = report.longrepr
    reason = longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)
    return reason.removeprefix("Skipped: ")


@pytest.hookimpl(wrapper=True, tryfirst=True)  # the outermost wrapper: after -ra's list, seen last in a log's tail
def pytest_terminal_summary(terminalreporter):
    """Count the skips by reason at the end of the run: what did not run, and why, in a few lines."""
    yield
    skipped = [r for r in terminalreporter.stats.get("skipped", []) if r.skipped]
    if not skipped:
        return
    import collections

    counts = collections.Counter(_skip_reason(report) for report in skipped)
    terminalreporter.write_sep("=", f"{len(skipped)} skipped, by reason")
    for reason, count in counts.most_common():
        terminalreporter.write_line(f"{count:6d}  {reason}")
