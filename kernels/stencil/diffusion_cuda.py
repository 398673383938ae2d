"""Several explicit diffusion steps per pass over memory on NVIDIA GPUs (temporal blocking).

The one-step kernel of ``_cuda`` reads and writes the whole field once per
step, so it can at best run at the device's copy bandwidth. Here a pass
advances ``steps`` (T) time steps, as ``diffusion_numba`` does on the CPU:

- a block of ``threads`` threads owns ``threads - 2 T`` output columns and a
  strip of ``rows`` output rows. Its threads march northwards together over
  the strip's rows and T halo rows on each side, loading one input row per
  iteration (one column per thread, coalesced) into a shared-memory ring of
  three rows;
- in the same iteration, level t (1..T) computes its next row from the
  three newest rows of level t-1, with ``diffusion_update`` exactly as the
  one-step kernel applies it; a level's valid columns shrink by one on each
  side per step, which is why the block's outer T columns are halo;
- level T's new row is the output.

Each point is then read from DRAM once per T steps (plus ``2 T / rows`` halo
rows and ``2 T / (threads - 2 T)`` halo columns) and written once. The
boundary rules are those of the one-step kernel, level by level: at a wall
the missing neighbour is the point itself (the clamp), across a periodic
edge the columns and rows wrap, beyond a Dirichlet edge it is the boundary
value.

:data:`PASS` picks the pass per dtype for :func:`hpcgpu.kernels.stencil._cuda.diffuse`;
``scripts/gpu_kernel_variants.py`` times the choices against the one-step
kernel. Launch shapes that fit: ``threads - 2 T >= 32`` (one warp of output
columns), the grid at least ``2 T`` points on each side (one wrap of a
periodic edge covers every halo), and the shared ring of ``(T + 1) x 3 x
threads`` values within 48 KiB of static shared memory (T = 8 with 256
threads is 55,296 B in float64: float32 only).
"""

import functools
from typing import NamedTuple

import numba
import numpy as np

from hpcgpu._compat import numpy_aliases_for_numba_cuda

numpy_aliases_for_numba_cuda()

from numba import cuda  # noqa: E402

from hpcgpu.kernels import launch_limits  # noqa: E402
from hpcgpu.kernels.cuda_interop import on_device as _on_device  # noqa: E402
from hpcgpu.kernels.cuda_interop import stream_of as _stream  # noqa: E402
from hpcgpu.kernels.stencil.boundary import DIRICHLET, PERIODIC  # noqa: E402
from hpcgpu.kernels.stencil.device_cuda import _wrap_or_clamp, diffusion_update  # noqa: E402

__all__ = ["PassLaunch", "PASS", "VARIANTS", "fits", "launch_problems", "shared_bytes", "multi_step_pass"]


class PassLaunch(NamedTuple):
    """How a multi-step pass is launched."""

    steps: int
    """Time steps per pass, T."""
    rows: int
    """Output rows per block (the strip the block marches)."""
    threads: int
    """Threads per block along x; ``threads - 2 T`` output columns."""


PASS = {"float32": None, "float64": None}
"""The pass ``_cuda.diffuse`` uses per dtype; None: one step per launch (the
one-step kernel). Stays None until a GPU session has timed the variants
(``scripts/gpu_kernel_variants.py``) against the one-step kernel: written
without a GPU at hand, this kernel is checked bitwise against the one-step
kernel under the CUDA simulator only."""

VARIANTS = (PassLaunch(2, 64, 128), PassLaunch(4, 64, 128), PassLaunch(4, 128, 256), PassLaunch(8, 128, 256))
"""Multi-step passes timed by ``scripts/gpu_kernel_variants.py``."""


def shared_bytes(launch, dtype):
    """Static shared memory of the pass kernel: the ring of ``steps + 1`` levels x 3 rows x ``threads``.

    Examples
    --------
    >>> shared_bytes(PassLaunch(8, 128, 256), "float64"), shared_bytes(PassLaunch(8, 128, 256), "float32")
    (55296, 27648)
    """
    return (launch.steps + 1) * 3 * launch.threads * np.dtype(dtype).itemsize


def launch_problems(launch, dtype):
    """Why ``launch`` can run on no grid in ``dtype`` (a thread block too big, too few output
    columns); empty if it can run on grids of at least ``2 T`` points a side."""
    found = launch_limits.problems(launch.threads, shared_bytes(launch, dtype))
    if launch.steps < 1 or launch.rows < 1:
        found.append(f"steps={launch.steps} and rows={launch.rows} must be at least 1")
    if launch.threads - 2 * launch.steps < 32:
        found.append(f"threads - 2 steps = {launch.threads - 2 * launch.steps} output columns (at least 32)")
    return found


def fits(shape, launch, dtype="float64"):
    """Whether ``launch`` can run on a grid of ``shape`` in ``dtype``.

    The static shared memory (:func:`shared_bytes`) must stay within 48 KiB
    and the block within the register file; ``dtype`` defaults to float64,
    the larger of the two, so a launch that fits it fits float32 too.

    Examples
    --------
    >>> fits((1024, 1024), PassLaunch(8, 128, 256), "float32"), fits((1024, 1024), PassLaunch(8, 128, 256))
    (True, False)
    """
    ny, nx = shape
    return not launch_problems(launch, dtype) and min(ny, nx) >= 2 * launch.steps


@functools.cache
def _pass_kernel(dtype_name, steps, threads):
    """The kernel of T = ``steps`` levels for ``threads`` threads (shared-memory shape at compile time)."""
    value_type = numba.from_dtype(np.dtype(dtype_name))
    levels = steps + 1

    @cuda.jit
    def kernel(src, dst, ny, nx, rows, c_x, c_y, bc_x, bc_s, bc_n, value):
        # ring[t, s, x]: level t (0: the input), ring slot s, thread x.
        ring = cuda.shared.array((levels, 3, threads), value_type)
        x = cuda.threadIdx.x
        width = threads - 2 * steps
        i = cuda.blockIdx.x * width - steps + x  # this thread's logical column
        j0 = cuda.blockIdx.y * rows
        periodic_x = bc_x == PERIODIC
        periodic_y = bc_s == PERIODIC
        column = _wrap_or_clamp(i, nx, periodic_x)
        # Neighbour threads; at a wall (and at the block's own edges, whose
        # columns are halo) the point itself.
        west = x - 1
        east = x + 1
        if x == 0 or (not periodic_x and i <= 0):
            west = x
        if x == threads - 1 or (not periodic_x and i >= nx - 1):
            east = x
        # Beyond a Dirichlet edge the neighbour is the boundary value (columns
        # beyond the grid are halo that no stored point reads).
        fixed_w = bc_x == DIRICHLET and i <= 0
        fixed_e = bc_x == DIRICHLET and i >= nx - 1
        fixed_s = bc_s == DIRICHLET
        fixed_n = bc_n == DIRICHLET
        store = steps <= x < threads - steps and i < nx
        for it in range(rows + 2 * steps):
            r = j0 - steps + it  # input row of this iteration; level t makes row r - t
            new, mid, old = it % 3, (it + 2) % 3, (it + 1) % 3  # newest, one before, two before
            ring[0, new, x] = src[np.uint64(_wrap_or_clamp(r, ny, periodic_y) * nx + column)]
            cuda.syncthreads()
            for t in range(1, levels):
                q = r - t  # the row level t makes now, from level t-1 rows q-1 (old), q (mid), q+1 (new)
                south = old
                north = new
                if not periodic_y:
                    if q <= 0:
                        south = mid
                    if q >= ny - 1:
                        north = mid
                w_value = value if fixed_w else ring[t - 1, mid, west]
                e_value = value if fixed_e else ring[t - 1, mid, east]
                s_value = value if fixed_s and q <= 0 else ring[t - 1, south, x]
                n_value = value if fixed_n and q >= ny - 1 else ring[t - 1, north, x]
                ring[t, new, x] = diffusion_update(ring[t - 1, mid, x], w_value, e_value, s_value, n_value,
                                                   c_x, c_y)
                cuda.syncthreads()
            q = r - steps
            if store and j0 <= q < j0 + rows and q < ny:
                dst[np.uint64(q * nx + i)] = ring[steps, new, x]

    return kernel


def multi_step_pass(src, dst, c_x, c_y, bc_x, bc_s, bc_n, value, launch):
    """T diffusion steps from ``src`` into ``dst`` (flat device views of C-contiguous ``(ny, nx)`` grids);
    ``value`` beyond Dirichlet edges.

    ``src`` and ``dst`` are the arrays (for the shape, dtype and stream);
    the caller checks :func:`fits` first.
    """
    dtype = np.dtype(src.dtype)
    ny, nx = src.shape
    width = launch.threads - 2 * launch.steps
    grid = ((nx + width - 1) // width, (ny + launch.rows - 1) // launch.rows)
    kernel = _pass_kernel(dtype.name, launch.steps, launch.threads)
    t = dtype.type
    kernel[grid, (launch.threads, 1), _stream(src)](
        _on_device(src.reshape(src.size)), _on_device(dst.reshape(dst.size)), ny, nx, launch.rows,
        t(c_x), t(c_y), bc_x, bc_s, bc_n, t(value))
