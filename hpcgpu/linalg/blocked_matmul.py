"""Blocked matrix multiply on a dask cluster, for matrices larger than any one worker's memory.

:func:`matmul` multiplies matrices held as blocks on the workers: every
task multiplies one pair of square tiles with the backend's GEMM (BLAS,
cuBLAS or the hand-written kernels of :mod:`hpcgpu.kernels.matrix`), and a
tree of additions sums the tiles along the inner dimension
(``dask.array.blockwise`` then ``sum(split_every=...)``, the formulation
``dask.array.matmul`` uses). The tile size comes from the workers' count
and memory (:func:`choose_tile`): as large as a task's three tiles fit in a
quarter of a worker thread's share of memory, and small enough that there
are at least two output tiles per worker.

Examples
--------
>>> import numpy as np  # doctest: +SKIP
>>> c = matmul(np.ones((4000, 3000)), np.ones((3000, 5000)), client=client)  # doctest: +SKIP
>>> float(c[0, 0].compute())  # doctest: +SKIP
3000.0
"""

import math

import numpy as np

from hpcgpu.cluster import worker_info
from hpcgpu.errors import ConfigError
from hpcgpu.validation import check_int

__all__ = ["matmul", "choose_tile", "worker_memory"]

MIN_TILE = 256
"""Smallest tile worth a task (below it scheduler overhead beats BLAS)."""
MEMORY_FRACTION = 0.25
"""Share of a worker thread's memory one task's tiles may use (dask keeps results, spills, copies)."""


def choose_tile(shape_a, shape_b, itemsize, workers, memory_per_thread):
    """Square tile size for a blocked product of ``(m, k) @ (k, n)``.

    Parameters
    ----------
    shape_a, shape_b : (int, int)
    itemsize : int
        Bytes per element.
    workers : int
        Worker threads that run tasks at once.
    memory_per_thread : float
        Bytes of memory one worker thread may use.

    Returns
    -------
    int
        The tile side: three tiles (two operands and a partial product) fit
        in ``MEMORY_FRACTION`` of ``memory_per_thread``, and, where the
        matrix allows tiles of at least :data:`MIN_TILE`, there are at least
        two output tiles per worker thread.

    Raises
    ------
    ConfigError
        When not even a :data:`MIN_TILE` tile fits in a worker's memory.

    Examples
    --------
    >>> choose_tile((8192, 8192), (8192, 8192), 8, workers=2, memory_per_thread=4e9)
    4096
    >>> choose_tile((8192, 8192), (8192, 8192), 8, workers=2, memory_per_thread=64e6)
    512
    """
    m, k = shape_a
    n = shape_b[1]
    fits = int(math.sqrt(MEMORY_FRACTION * memory_per_thread / (3 * itemsize)))
    if fits < MIN_TILE:
        raise ConfigError(
            f"memory per worker thread ({memory_per_thread / 2**20:.0f} MiB) cannot hold three "
            f"{MIN_TILE}x{MIN_TILE} tiles; give the workers more memory or fewer threads")
    tile = 1 << int(math.log2(fits))  # powers of two suit BLAS and GPU tiles
    tile = min(tile, max(MIN_TILE, 1 << int(math.ceil(math.log2(max(m, n, k, 1))))))
    while tile > MIN_TILE and math.ceil(m / tile) * math.ceil(n / tile) < 2 * workers:
        tile //= 2
    return tile


def worker_memory(client):
    """``(threads, bytes per thread)`` of the smallest worker of a cluster."""
    workers = worker_info(client).values()
    if not workers:
        from hpcgpu.errors import ClusterError

        raise ClusterError("the dask cluster has no workers")
    per_thread = min(w["memory_limit"] / max(1, w["nthreads"]) for w in workers)
    return sum(w["nthreads"] for w in workers), float(per_thread)


def _tile_product(a, b, backend, allow_tf32):
    from hpcgpu.kernels import matrix

    a, b = np.ascontiguousarray(a), np.ascontiguousarray(b)
    return matrix.matmul(a, b, backend=backend, allow_tf32=allow_tf32)[..., None]


def matmul(a, b, *, client, backend="auto", tile=None, memory_per_thread=None, allow_tf32=False):
    """``a @ b`` for matrices spread over the workers of ``client``, as a persisted dask array.

    Parameters
    ----------
    a, b : numpy or dask arrays, 2-D, one float dtype (float32 or float64)
        Dask arrays (e.g. read from Zarr on the workers) are rechunked into
        tiles without passing through the client.
    client : distributed.Client
    backend : str
        The backend of each tile product (``"auto"`` resolves on each worker).
    tile : int, optional
        Tile side; by default :func:`choose_tile` from the workers' count and memory.
    memory_per_thread : float, optional
        Bytes a worker thread may use (default: the smallest worker's memory
        limit over its threads).
    allow_tf32 : bool
        Let the ``cupy`` backend use TF32 tensor cores (about 1e-3 relative error).

    Returns
    -------
    dask.array.Array
        The product, computed and held on the workers (``.compute()`` brings it home).

    Raises
    ------
    ConfigError
        Not 2-D, inner dimensions that differ, mixed or non-float dtypes, a bad tile.
    """
    import dask.array as da

    arrays = []
    for name, x in (("a", a), ("b", b)):
        if getattr(x, "ndim", None) != 2:
            raise ConfigError(f"{name} must be a 2-D array; got shape {getattr(x, 'shape', None)}")
        if np.dtype(x.dtype).name not in ("float32", "float64"):
            raise ConfigError(f"{name} must have dtype float32 or float64; got {x.dtype}")
        arrays.append(x)
    if a.shape[1] != b.shape[0]:
        raise ConfigError(f"inner dimensions must agree: a is {a.shape}, b is {b.shape} ({a.shape[1]} != {b.shape[0]})")
    if a.dtype != b.dtype:
        raise ConfigError(f"a and b must share one dtype; got {a.dtype} and {b.dtype} (convert one explicitly)")
    threads, per_thread = worker_memory(client)
    if memory_per_thread is not None:
        per_thread = float(memory_per_thread)
    if tile is None:
        tile = choose_tile(a.shape, b.shape, a.dtype.itemsize, threads, per_thread)
    tile = check_int("tile", tile, minimum=1)
    a, b = (da.asarray(x).rechunk((tile, tile)) for x in arrays)
    name = backend if isinstance(backend, str) else backend.name
    partial = da.blockwise(_tile_product, "ijk", a, "ik", b, "kj", dtype=a.dtype, adjust_chunks={"k": 1},
                           backend=name, allow_tf32=allow_tf32, name="hpcgpu-matmul-tile")
    product = partial.sum(axis=-1, split_every=4, dtype=a.dtype)
    return client.persist(product)
