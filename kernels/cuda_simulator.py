"""Keep Numba's CUDA simulator out of a GIL convoy (tests and the device-check rehearsal only).

The simulator (``NUMBA_ENABLE_CUDASIM=1``) runs every GPU thread of a
block as a Python thread while the main thread polls them in a loop that
never blocks: it keeps the GIL until the interpreter forces a switch (every
5 ms). numba-cuda's simulator (0.30, the GPU image's) also takes a lock per
module around every device-function call. A thread that holds that lock
and waits for the GIL makes every other thread wait for it too, and each
hand-over then costs a whole switch interval: the same 32 x 16
shallow-water stage launch took either 0.13 s or 8-100 s (measured
2026-12-01, numba-cuda 0.30.4, Python 3.12, quiet machine). The
device-check rehearsal's stages overran their limits on it.

:func:`yield_while_polling` makes the poll give the GIL away at each check
of a thread (``time.sleep(0)`` releases it), so a thread that holds the lock
runs at once: the same launch then takes 0.14-0.52 s every time. The
simulated kernels compute exactly what they did; only the order in which
the simulator's threads get the GIL changes, which a correct kernel cannot
depend on (its threads synchronise through ``syncthreads``, which the
simulator keeps).

Examples
--------
>>> from hpcgpu.kernels.cuda_simulator import yield_while_polling
>>> yield_while_polling()  # doctest: +SKIP
True
"""

import threading
import time

__all__ = ["yield_while_polling"]

_PATCHED = "_hpcgpu_yields_gil"


def yield_while_polling():
    """Make the simulator's block poll release the GIL at each thread it checks (once per process).

    Returns
    -------
    bool
        True when the simulator's block threads now yield (or already did),
        False when this Numba has no simulator thread class to adjust (the
        poll is then left as it is).
    """
    try:
        from numba.cuda.simulator import kernel
    except ImportError:  # pragma: no cover - a Numba without the simulator
        return False
    block_thread = getattr(kernel, "BlockThread", None)
    if block_thread is None or not issubclass(block_thread, threading.Thread):
        return False
    if getattr(block_thread, _PATCHED, False):
        return True
    is_alive = block_thread.is_alive

    def is_alive_yielding(self):
        # the block manager's poll calls this for every live thread on every pass
        time.sleep(0)
        return is_alive(self)

    block_thread.is_alive = is_alive_yielding
    setattr(block_thread, _PATCHED, True)
    return True
