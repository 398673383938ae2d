"""The CUDA simulator's block poll yields the GIL (``kernels/cuda_simulator.py``).

Under the simulator the fix must be in place as soon as a ``cuda`` backend
file is imported, be made once however often it is asked for, leave
``is_alive`` telling the truth, and keep kernels exact: a block whose
threads call a device function and meet at barriers sums the same as NumPy.
"""

import os
import threading

import numpy as np
import pytest
from numba import cuda  # a global: the simulator swaps a kernel's module globals, not its closure

pytestmark = pytest.mark.skipif(os.environ.get("NUMBA_ENABLE_CUDASIM", "0") in ("", "0"),
                                reason="only under Numba's CUDA simulator (NUMBA_ENABLE_CUDASIM=1)")


def test_importing_the_cuda_helpers_makes_the_poll_yield():
    from numba.cuda.simulator import kernel

    from hpcgpu.kernels import cuda_interop  # noqa: F401 - importing it is what installs the fix
    from hpcgpu.kernels.cuda_simulator import yield_while_polling

    patched = kernel.BlockThread.is_alive
    assert patched is not threading.Thread.is_alive
    assert yield_while_polling() is True
    assert kernel.BlockThread.is_alive is patched  # asked again: not wrapped twice


def test_is_alive_still_tells_a_finished_thread_from_a_running_one():
    from numba.cuda.simulator import kernel

    from hpcgpu.kernels.cuda_simulator import yield_while_polling

    yield_while_polling()
    release = threading.Event()
    thread = kernel.BlockThread(release.wait, manager=_Manager(), blockIdx=(0, 0, 0), threadIdx=(0, 0, 0),
                                debug=False)
    thread.start()
    assert thread.is_alive()
    release.set()
    thread.join(10)
    assert not thread.is_alive()


class _Manager:
    _block_dim = (1, 1, 1)


def test_a_block_with_device_calls_and_barriers_sums_exactly(rng):
    from hpcgpu.kernels.cuda_simulator import yield_while_polling

    yield_while_polling()

    @cuda.jit(device=True)
    def twice(x):
        return 2 * x

    @cuda.jit
    def block_sum(values, out):
        shared = cuda.shared.array(64, dtype=np.int64)
        t = cuda.threadIdx.x
        shared[t] = twice(values[t])
        cuda.syncthreads()
        step = 32
        while step > 0:
            if t < step:
                shared[t] += shared[t + step]
            cuda.syncthreads()
            step //= 2
        if t == 0:
            out[0] = shared[0]

    values = rng.integers(-1000, 1000, 64).astype(np.int64)
    out = np.zeros(1, np.int64)
    block_sum[1, 64](values, out)
    assert out[0] == 2 * values.sum()
