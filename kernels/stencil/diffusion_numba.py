"""Several explicit diffusion steps in one sweep over the grid (Numba, CPU).

One step per sweep reads and writes the whole field every step. Here a
sweep advances ``T`` steps at once: going down the rows, step ``k`` of row
``r - k + 1`` is computed as soon as step ``k - 1`` has rows ``r - k .. r -
k + 2``, and each intermediate step keeps only its last 4 rows, in a ring
that stays in cache. Memory then sees the field read once and written once
per ``T`` steps, and the sweep is bound by arithmetic.

Every point is computed by the operations of the step-by-step kernel, so
results are bitwise the same: on a periodic axis intermediate steps compute
the rows beyond the grid from wrapped inputs (the rows they would compute at
the other side); at a wall or an open edge a row beyond the grid is the
nearest row, and beyond a Dirichlet edge the row of fixed values, as in the
step-by-step kernel. Threads take blocks of rows and recompute ``T - 1``
rows of each intermediate step at their edges.

Examples
--------
>>> import numpy as np
>>> from hpcgpu.kernels.stencil import _numba
>>> field = np.random.default_rng(0).random((32, 16)).astype(np.float32)
>>> one_by_one = field.copy()
>>> for _ in range(4):
...     one_by_one = _numba.diffuse(one_by_one, np.empty_like(field), 0.1, 0.1, 1, 0, 0, 0).copy()
>>> fused = _numba.diffuse(field, np.empty_like(field), 0.1, 0.1, 4, 0, 0, 0)
>>> bool(np.array_equal(fused, one_by_one))
True
"""

import numba
import numpy as np
from numba import njit, prange

from hpcgpu.kernels.fpenv import flush_subnormals, restore_fp_mode
from hpcgpu.kernels.stencil.boundary import DIRICHLET, PERIODIC
from hpcgpu.kernels.stencil.rows_numba import _OPTS, diffuse_row, scalar_row

__all__ = ["RING_BUDGETS", "diffuse_steps", "steps_per_sweep", "tuned_steps_per_sweep"]

RING_BYTES = 1 << 20
"""Cache a sweep's rings may take per thread (within a core's L2 on current x86)."""

RING = 4


# Inlined in Numba's IR: as an LLVM call, choosing among three arrays (with
# their reference counts) cost ~100 ns per row and step, 10-15% of a sweep
# at 4096 columns.
@njit(inline="always", **_OPTS)
def _level_row(levels, src, fixed, k, r, ny, periodic, bc_s, bc_n):
    """Row ``r`` of step ``k`` (0: the input field) as the next step reads it;
    ``fixed`` (the boundary values) beyond a Dirichlet edge."""
    if k == 0:
        rr = scalar_row(r, ny, bc_s, bc_n)
        if rr < 0:
            return fixed
        return src[rr]
    if not periodic:
        if (r < 0 and bc_s == DIRICHLET) or (r >= ny and bc_n == DIRICHLET):
            return fixed
        r = min(max(r, 0), ny - 1)
    return levels[k - 1, r % RING]


@njit(parallel=True, **_OPTS)
def _sweep_kernel(src, dst, cx, cy, steps, bc_x, bc_s, bc_n, value, n_chunks):
    ny, nx = src.shape
    periodic = bc_s == PERIODIC
    fixed = np.full(nx, value, src.dtype)
    for chunk in prange(n_chunks):
        fp_mode = flush_subnormals()
        j0 = chunk * ny // n_chunks
        j1 = (chunk + 1) * ny // n_chunks
        levels = np.empty((steps - 1, RING, nx), src.dtype)
        # at "time" t, step k computes row t - k + 1 (rows of step k: j0 - (steps - k) .. j1 + steps - k - 1)
        for t in range(j0 - steps + 1, j1 + steps):
            for k in range(1, steps + 1):
                r = t - k + 1
                lo = j0 - (steps - k)
                hi = j1 + (steps - k)
                if not periodic:
                    lo, hi = max(lo, 0), min(hi, ny)
                if r < lo or r >= hi:
                    continue
                out = dst[r] if k == steps else levels[k - 1, r % RING]
                diffuse_row(_level_row(levels, src, fixed, k - 1, r, ny, periodic, bc_s, bc_n),
                            _level_row(levels, src, fixed, k - 1, r - 1, ny, periodic, bc_s, bc_n),
                            _level_row(levels, src, fixed, k - 1, r + 1, ny, periodic, bc_s, bc_n),
                            out, cx, cy, bc_x, value)
        restore_fp_mode(fp_mode)


RING_BUDGETS = {"256KiB": 1 << 18, "1MiB": RING_BYTES, "4MiB": 1 << 22}
"""The cache a sweep's rings may take (autotuned ``stencil.diffusion.ring_bytes``): a core's L2 differs
between CPUs (256 KiB to 2 MiB), and the best depth of a sweep with it."""

DEFAULT_RING_BUDGET = "1MiB"


def steps_per_sweep(nx, itemsize, ring_bytes=RING_BYTES):
    """How many steps one sweep takes: as many as fit their rings in ``ring_bytes``, 2 to 16.

    Measured at 4096^2 float32 on 2 cores with 1 MiB: 4 steps 6.1, 8 steps
    7.1, 16 steps 7.8 and 32 steps 7.2 G point-updates/s (one step per
    sweep: 3.9). :func:`tuned_steps_per_sweep` takes the budget this
    machine measured fastest.
    """
    return max(2, min(16, ring_bytes // (RING * nx * itemsize)))


def _tuning_runs(itemsize):
    """Each budget's sweep depth on a 256 x 4096 field of ``itemsize`` (float32 or float64), 16 steps."""
    dtype = np.float32 if itemsize == 4 else np.float64
    state = {}

    def run(budget):
        def sweep():
            if "field" not in state:
                state["field"] = np.random.default_rng(0).random((256, 4096)).astype(dtype)
                state["out"] = np.empty_like(state["field"])
            field, out = state["field"], state["out"]
            per_sweep = steps_per_sweep(field.shape[1], itemsize, RING_BUDGETS[budget])
            done, t = 0, field.dtype.type
            while done < 16:
                chunk = max(2, min(per_sweep, 16 - done))
                diffuse_steps(field, out, t(0.1), t(0.1), chunk, PERIODIC, PERIODIC, PERIODIC, t(0.0))
                done += chunk
        return sweep

    return {name: run(name) for name in RING_BUDGETS}


def tuned_steps_per_sweep(nx, itemsize):
    """:func:`steps_per_sweep` with the ring budget :func:`hpcgpu.autotune.choose` measured fastest here
    (``HPCGPU_AUTOTUNE=0``: 1 MiB). Every step computes every point the same way whatever the depth, so
    the result is bitwise the same with any budget."""
    from hpcgpu import autotune

    name = f"stencil.diffusion.ring_bytes.float{8 * itemsize}"
    budget = autotune.choose(name, _tuning_runs(itemsize), default=DEFAULT_RING_BUDGET)
    return steps_per_sweep(nx, itemsize, RING_BUDGETS[budget])


def diffuse_steps(src, dst, cx, cy, steps, bc_x, bc_s, bc_n, value):
    """``steps`` (>= 2) diffusion steps from ``src`` into ``dst`` in one sweep (no aliasing);
    ``cx``, ``cy`` and ``value`` (beyond Dirichlet edges) in the field's dtype."""
    rows = src.shape[0]
    chunks = max(1, min(rows // (4 * steps), 2 * numba.get_num_threads()))
    _sweep_kernel(src, dst, cx, cy, steps, bc_x, bc_s, bc_n, value, chunks)
