"""How the GPU kernels (``_cuda``, ``_cupy``) split the work of a direct sum.

Both run the classic tiled kernel (Nyland, Harris and Prins, GPU Gems 3,
ch. 31): a block of ``threads`` threads holds ``threads`` targets, one per
thread, and walks the sources in tiles of ``threads`` bodies that the block
loads together into shared memory. One target per thread alone leaves a big
GPU idle at these sizes (16384 bodies in blocks of 256 fill 64 of an
H200's 132 multiprocessors), so the sources are also cut into *slices*
(the grid's y dimension): each block sums one slice for its targets into a
partial sum, and a second kernel adds a target's partial sums in slice
order and applies ``G``.

The slices depend on the number of sources and the launch only, never on the
targets: a target's sums are bitwise the same whichever targets share the
call (a partition asking for its own bodies gets the values of one call for
all of them).
"""

from typing import NamedTuple

import numpy as np

from hpcgpu.kernels import launch_limits


class DirectSumLaunch(NamedTuple):
    """How the direct-sum kernel is launched for one dtype."""

    threads: int
    """Threads per block: targets per block and sources per shared-memory tile."""
    min_tiles: int
    """Fewest tiles in a slice: the partial sums stay a small overhead."""
    max_slices: int
    """Most slices: caps the partial sums at ``4 * max_slices`` values per target."""


LAUNCH = {
    "float32": DirectSumLaunch(threads=256, min_tiles=2, max_slices=32),
    "float64": DirectSumLaunch(threads=256, min_tiles=2, max_slices=32),
}
"""The launch of the direct-sum kernel per dtype."""

VARIANTS = {
    "float32": (DirectSumLaunch(128, 4, 32), DirectSumLaunch(64, 1, 64), DirectSumLaunch(32, 1, 4)),
    "float64": (DirectSumLaunch(128, 4, 32), DirectSumLaunch(64, 1, 64), DirectSumLaunch(32, 1, 4)),
}
"""Alternative launches: timed on a GPU, and small ones that make the tests
cross blocks, tiles and slices at sizes the emulators run."""

FINALIZE_THREADS = 256
"""Threads per block of the kernel that adds the partial sums."""


def slices(n_sources, launch):
    """``(slice_length, n_slices)``: sources per slice (whole tiles) and slices.

    Examples
    --------
    >>> slices(16384, DirectSumLaunch(256, 2, 32))
    (512, 32)
    >>> slices(100, DirectSumLaunch(256, 2, 32))
    (512, 1)
    """
    tile = launch.threads
    tiles = -(-n_sources // tile)
    per_slice = max(launch.min_tiles, -(-tiles // launch.max_slices))
    length = per_slice * tile
    return length, -(-n_sources // length)


def shared_bytes(launch, dtype):
    """Static shared memory of the direct-sum kernel: a tile of ``threads`` bodies (x, y, z, m).

    Examples
    --------
    >>> shared_bytes(DirectSumLaunch(256, 2, 32), "float64")
    8192
    """
    return launch.threads * 4 * np.dtype(dtype).itemsize


def check(launch, dtype):
    """Raise :class:`~hpcgpu.errors.ConfigError` unless both kernels' blocks fit the GPU
    (:mod:`..launch_limits`): the direct sum's with its shared tile, and the finaliser's."""
    launch_limits.check("nbody direct_kernel", launch, launch.threads, shared_bytes(launch, dtype))
    launch_limits.check("nbody finalize_kernel", FINALIZE_THREADS, FINALIZE_THREADS)
    if launch.min_tiles < 1 or launch.max_slices < 1:
        from hpcgpu.errors import ConfigError
        raise ConfigError(f"nbody launch={launch!r}: min_tiles and max_slices must be at least 1")


def blocks(n, threads):
    """Blocks of ``threads`` that cover ``n`` items (at least one)."""
    return max(1, -(-n // threads))
