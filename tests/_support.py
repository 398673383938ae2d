"""Helpers shared by the tests (tolerances, tier detection, sizes)."""

import os

import numpy as np
import pytest

from hpcgpu import _gpu_probe
from hpcgpu.backends import backend_status, get_backend

REQUIRE_GPU = os.environ.get("HPCGPU_REQUIRE_GPU", "0") not in ("", "0")

# Largest relative difference from the numpy reference (max |diff| / max |ref|),
# keyed by backend and dtype. Compiled backends reorder and contract
# operations, so they differ from NumPy by rounding only.
TOLERANCE = {
    ("numpy", "float64"): 0.0,
    ("numpy", "float32"): 0.0,
    ("numba", "float64"): 1e-12,
    ("numba", "float32"): 2e-5,
    ("cuda", "float64"): 1e-12,
    ("cuda", "float32"): 2e-5,
    ("cupy", "float64"): 1e-12,
    ("cupy", "float32"): 2e-5,
}


# Boundary combinations every stencil backend is checked on: all kinds per
# axis, walls on one side only, and the open edges of partitions.
BOUNDARIES = [
    "periodic",
    "wall",
    ("periodic", "wall"),
    ("wall", "periodic"),
    ("periodic", "open", "open"),
    ("periodic", "wall", "open"),
    ("wall", "open", "wall"),
]

# The scalar kernels (laplacian, diffuse) also take Dirichlet edges, which the
# shallow-water kernels refuse: everywhere, on one axis next to a periodic or
# wall axis, on one edge facing a wall or an open edge.
SCALAR_BOUNDARIES = BOUNDARIES + [
    "dirichlet",
    ("dirichlet", "periodic"),
    ("periodic", "dirichlet"),
    ("wall", "dirichlet"),
    ("periodic", "dirichlet", "wall"),
    ("dirichlet", "open", "dirichlet"),
    ("wall", "wall", "dirichlet"),
]


def simulated():
    return _gpu_probe.simulator_enabled()


def tolerance(backend, dtype):
    """Relative tolerance of ``backend`` against numpy for ``dtype``."""
    name = backend if isinstance(backend, str) else backend.name
    return TOLERANCE[(name, np.dtype(dtype).name)]


def usable_backend(name):
    """The Backend ``name``, or skip (fail under HPCGPU_REQUIRE_GPU=1) if unusable."""
    status = backend_status(name)
    if not status.usable:
        if REQUIRE_GPU:
            pytest.fail(f"HPCGPU_REQUIRE_GPU=1 but backend {name!r} is unusable: {status.detail}")
        pytest.skip(f"backend {name!r} unusable here: {status.detail}")
    return get_backend(name)


def small(backend, full, tiny):
    """Problem size: ``tiny`` under the CUDA simulator, else ``full``."""
    return tiny if backend.simulated else full


class interrupted_after_one_step:
    """Within the block, ``sim``'s next advance takes one step, gets a SIGINT (as Ctrl-C in a notebook,
    between two steps), then takes the rest; the executor's own advance comes back on exit."""

    def __init__(self, sim):
        self.sim = sim

    def __enter__(self):
        import signal

        advance = self.advance = self.sim._executor.advance

        def interrupted(steps):
            advance(1)
            os.kill(os.getpid(), signal.SIGINT)
            advance(steps - 1)

        self.sim._executor.advance = interrupted
        return self

    def __exit__(self, *exc):
        self.sim._executor.advance = self.advance
        return False
