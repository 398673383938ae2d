"""Matrix kernels for NVIDIA GPUs with Numba-CUDA.

GEMM (``C = A B``, row-major): the classic two-level tiling. A block of
``(block_m / thread_m) * (block_n / thread_n)`` threads computes a
``block_m x block_n`` tile of C; it walks the inner dimension in steps of
``block_k``, loading an A tile (stored transposed, padded by one column
against bank conflicts) and a B tile into shared memory, with consecutive
threads reading consecutive addresses of global memory. Each thread keeps a
``thread_m x thread_n`` register tile of C and, per step of k, reads
``thread_m`` values of A and ``thread_n`` of B from shared memory for
``thread_m * thread_n`` multiply-adds (the register tiling that lifts a
shared-memory GEMM from bandwidth bound towards arithmetic bound). A thread's
rows and columns are strided by the number of thread rows and columns, so
its shared-memory reads are broadcasts or consecutive words, and a warp's
stores to C are consecutive. Loads outside the matrices read as zero and
stores outside are skipped, so any shape works (odd, tall, wide, smaller
than a tile); tiles wholly inside both matrices (all but the edge tiles)
load without those checks. Indices are unsigned (Numba adds a negative-index
wraparound to every signed one), and the inner loop takes two steps of k a
trip; on sm_90 the 8 x 8 float32 tile then issues about 63 % of an interior
tile's instructions as FMAs (the 4 x 4 tile with signed indices: 27 %).
Rows of tiles go along the grid's x (up to 2**31 - 1), columns along y (at
most 65535 tiles). :data:`LAUNCH` is the launch per dtype; :data:`VARIANTS`
are alternatives to time on a GPU or to cross many tiles at sizes the CUDA
simulator runs. No fast-math: the kernel contracts ``a * b + c`` into fused
multiply-adds as NVVM does by default, nothing else; each output sums its
products in the order of k, so every tile size gives the same bits.

SpMV: one thread per row. hpcgpu's sparse matrices are discretised PDE
operators with a handful of values per row (5 for the 2-D Poisson matrix):
one warp per row would leave most of its 32 lanes idle, while 32 threads on
32 consecutive rows read 32 consecutive short runs of ``data`` and
``indices`` that share cache lines. Rows of hundreds of values would favour
a warp per row; the ``cupy`` backend sizes a group of threads per row from
the mean row length.

``dot``: a grid-stride loop accumulating float64 products per thread, a
shared-memory tree per block, one partial sum per block added up by CuPy
(a fixed number of blocks for a given length: the same sum every run).
``axpy``: one thread per element.

Arrays stay CuPy arrays (one memory pool with CuPy); each call wraps them
for Numba without a host sync (wrappers cached: :mod:`..cuda_interop`) and
launches on CuPy's current stream. Under the CUDA simulator they are NumPy
arrays and pass through.
"""

import functools
from typing import NamedTuple

import numba
import numpy as np

from hpcgpu._compat import numpy_aliases_for_numba_cuda
from hpcgpu.errors import ConfigError

numpy_aliases_for_numba_cuda()

from numba import cuda  # noqa: E402

from hpcgpu.kernels import launch_limits  # noqa: E402
from hpcgpu.kernels.cuda_interop import array_module as _xp  # noqa: E402
from hpcgpu.kernels.cuda_interop import on_device as _on_device  # noqa: E402
from hpcgpu.kernels.cuda_interop import stream_of as _stream  # noqa: E402


class GemmLaunch(NamedTuple):
    """Tile sizes of the GEMM kernel (compile-time constants)."""

    block_m: int
    """Rows of C per block."""
    block_n: int
    """Columns of C per block."""
    block_k: int
    """Step along the inner dimension: the depth of the shared-memory tiles."""
    thread_m: int
    """Rows of C per thread (register tile)."""
    thread_n: int
    """Columns of C per thread (register tile)."""

    @property
    def threads(self):
        return (self.block_m // self.thread_m) * (self.block_n // self.thread_n)


LAUNCH = {
    "float32": GemmLaunch(128, 128, 8, 8, 8),
    "float64": GemmLaunch(64, 64, 8, 4, 4),
}
"""The GEMM launch per dtype, 256 threads each. float32: 64 outputs per thread,
16 shared loads per 64 FMAs (0.25 a FMA; the 4 x 4 tile's 0.5 capped it at half
the FP32 rate, the rate of shared loads), 128 registers on sm_90 (CUDA 13): two
blocks an SM, at the edge (129 would leave one; a register cap made ptxas spill).
float64: 16 outputs per thread; FP64 runs at half the FP32 rate, so 0.5 shared
loads a FMA already keeps up, and 72 registers give three blocks an SM."""

VARIANTS = (GemmLaunch(64, 64, 8, 4, 4), GemmLaunch(128, 64, 8, 8, 4), GemmLaunch(64, 64, 16, 4, 4),
            GemmLaunch(16, 16, 4, 2, 2), GemmLaunch(8, 16, 4, 2, 4))
"""Other launches: the previous float32 tile and others to time on a GPU
(``hpcgpu bench matrix``'s ``gemm_tiles``), and small ones that cross several
tiles in every direction at sizes the simulator runs. Every launch sums each
output's products in the order of k, one fused multiply-add at a time, so all
give the same bits."""

THREADS = 256
"""Threads per block of the SpMV, dot and axpy kernels."""

DOT_BLOCKS = 1024
"""Most blocks of the dot kernel (each leaves one partial sum)."""


@functools.cache
def _gemm_kernel(dtype_name, launch):
    """The tiled GEMM kernel for one dtype and launch."""
    value_type = numba.from_dtype(np.dtype(dtype_name))
    bm, bn, bk, tm, tn = launch
    thread_rows = bm // tm
    thread_cols = bn // tn
    threads = launch.threads
    loads_a = -(-bm * bk // threads)
    loads_b = -(-bk * bn // threads)
    # Shared and local array shapes must be compile-time constants: closure ints are.
    a_tile_rows = bm + 1  # padded: the transposed stores spread over the banks
    # Two k-steps per trip of the inner loop: half the loop overhead, and the
    # second step's shared loads issue while the first step's FMAs run.
    unroll = 2 if bk % 2 == 0 else 1
    trips = bk // unroll
    index = np.uint64  # every index is >= 0: unsigned skips Numba's negative-index wraparound

    @cuda.jit
    def kernel(a, b, c, zero):
        m = a.shape[0]
        k = a.shape[1]
        n = b.shape[1]
        t = cuda.threadIdx.x
        tx = t % thread_cols
        ty = t // thread_cols
        row0 = cuda.blockIdx.x * bm
        col0 = cuda.blockIdx.y * bn
        a_tile = cuda.shared.array((bk, a_tile_rows), value_type)
        b_tile = cuda.shared.array((bk, bn), value_type)
        acc = cuda.local.array((tm, tn), value_type)
        a_reg = cuda.local.array((unroll, tm), value_type)
        b_reg = cuda.local.array((unroll, tn), value_type)
        for i in range(tm):
            for j in range(tn):
                acc[i, j] = zero
        inside_mn = row0 + bm <= m and col0 + bn <= n
        for p0 in range(0, k, bk):
            # Every thread loads its share and meets both barriers, inside C or not.
            if inside_mn and p0 + bk <= k:
                # A tile wholly inside both matrices (all but the edge tiles): no bounds checks.
                for load in range(loads_a):
                    e = t + load * threads
                    if e < bm * bk:
                        r = e // bk
                        q = e - r * bk
                        a_tile[index(q), index(r)] = a[index(row0 + r), index(p0 + q)]
                for load in range(loads_b):
                    e = t + load * threads
                    if e < bk * bn:
                        q = e // bn
                        s = e - q * bn
                        b_tile[index(q), index(s)] = b[index(p0 + q), index(col0 + s)]
            else:
                for load in range(loads_a):
                    e = t + load * threads
                    if e < bm * bk:
                        r = e // bk
                        q = e - r * bk
                        value = zero
                        if row0 + r < m and p0 + q < k:
                            value = a[index(row0 + r), index(p0 + q)]
                        a_tile[index(q), index(r)] = value
                for load in range(loads_b):
                    e = t + load * threads
                    if e < bk * bn:
                        q = e // bn
                        s = e - q * bn
                        value = zero
                        if p0 + q < k and col0 + s < n:
                            value = b[index(p0 + q), index(col0 + s)]
                        b_tile[index(q), index(s)] = value
            cuda.syncthreads()
            for trip in range(trips):
                for u in range(unroll):
                    q = index(trip * unroll + u)
                    for i in range(tm):
                        a_reg[u, i] = a_tile[q, index(ty + i * thread_rows)]
                    for j in range(tn):
                        b_reg[u, j] = b_tile[q, index(tx + j * thread_cols)]
                # Each output still sums its products in the order of k.
                for u in range(unroll):
                    for i in range(tm):
                        for j in range(tn):
                            acc[i, j] += a_reg[u, i] * b_reg[u, j]
            cuda.syncthreads()
        for i in range(tm):
            r = row0 + ty + i * thread_rows
            if r < m:
                for j in range(tn):
                    s = col0 + tx + j * thread_cols
                    if s < n:
                        c[index(r), index(s)] = acc[i, j]

    return kernel


@cuda.jit
def _spmv_kernel(data, indices, indptr, x, out, zero):
    i = cuda.grid(1)
    if i < out.shape[0]:
        total = zero
        for e in range(indptr[i], indptr[i + 1]):
            total += data[e] * x[indices[e]]
        out[i] = total


@cuda.jit
def _dot_kernel(x, y, partial):
    cache = cuda.shared.array(THREADS, numba.float64)
    t = cuda.threadIdx.x
    i = cuda.blockIdx.x * THREADS + t
    stride = THREADS * cuda.gridDim.x
    n = x.shape[0]
    total = 0.0
    while i < n:
        total += numba.float64(x[i]) * numba.float64(y[i])
        i += stride
    cache[t] = total
    cuda.syncthreads()
    half = THREADS // 2
    while half > 0:
        if t < half:
            cache[t] += cache[t + half]
        cuda.syncthreads()
        half //= 2
    if t == 0:
        partial[cuda.blockIdx.x] = cache[0]


@cuda.jit
def _axpy_kernel(alpha, x, y, out):
    i = cuda.grid(1)
    if i < out.shape[0]:
        out[i] = alpha * x[i] + y[i]


def _blocks(n, threads):
    return max(1, -(-n // threads))


def gemm_shared_bytes(launch, dtype):
    """Static shared memory of the GEMM kernel: the A tile (transposed, padded) and the B tile.

    Examples
    --------
    >>> gemm_shared_bytes(GemmLaunch(64, 64, 8, 4, 4), "float64")
    8256
    """
    bm, bn, bk = launch.block_m, launch.block_n, launch.block_k
    return (bk * (bm + 1) + bk * bn) * np.dtype(dtype).itemsize


def check_gemm(launch, dtype):
    """Raise :class:`ConfigError` unless ``launch`` tiles C exactly and its block fits the GPU."""
    if launch.block_m % launch.thread_m or launch.block_n % launch.thread_n or min(launch) < 1:
        raise ConfigError(f"GEMM launch={launch!r}: thread_m and thread_n must divide block_m and "
                          "block_n (all at least 1)")
    launch_limits.check("matrix gemm kernel", launch, launch.threads, gemm_shared_bytes(launch, dtype))


def _vector_blocks(kernel, n, shared_bytes=0):
    """Blocks of :data:`THREADS` covering ``n`` items, once the block is checked against the GPU."""
    launch_limits.check(f"matrix {kernel} kernel", THREADS, THREADS, shared_bytes)
    return _blocks(n, THREADS)


def gemm(a, b, out, launch):
    """``out = a @ b`` with the tiled kernel and tile sizes ``launch``."""
    dtype = np.dtype(a.dtype)
    check_gemm(launch, dtype)
    m, n = out.shape
    grid = (_blocks(m, launch.block_m), _blocks(n, launch.block_n))
    if grid[1] > 65535:
        raise ConfigError(f"matmul on the cuda backend takes b with at most {65535 * launch.block_n} "
                          f"columns (65535 tiles of {launch.block_n}); got {n}: split the product "
                          "by columns, or use backend='cupy'")
    _gemm_kernel(dtype.name, launch)[grid, launch.threads, _stream(a)](
        _on_device(a), _on_device(b), _on_device(out), dtype.type(0))
    return out


def matmul(a, b, out, allow_tf32):
    """``out = a @ b`` by hpcgpu's tiled kernel (``allow_tf32`` ignored: CUDA cores, full precision)."""
    return gemm(a, b, out, LAUNCH[np.dtype(a.dtype).name])


def spmv(data, indices, indptr, x, out):
    """``out = A x`` for the CSR arrays of ``A``, one thread per row."""
    n_rows = out.shape[0]
    _spmv_kernel[_vector_blocks("spmv", n_rows), THREADS, _stream(data)](
        _on_device(data), _on_device(indices), _on_device(indptr), _on_device(x), _on_device(out),
        np.dtype(data.dtype).type(0))
    return out


def dot(x, y):
    """``sum x * y`` accumulated in float64, as a float (waits for the device)."""
    blocks = min(DOT_BLOCKS, _vector_blocks("dot", x.shape[0], THREADS * 8))
    partial = _xp(x).empty(blocks, np.float64)
    _dot_kernel[blocks, THREADS, _stream(x)](_on_device(x), _on_device(y), _on_device(partial))
    return float(partial.sum())


def axpy(alpha, x, y, out):
    """``out = alpha * x + y`` (``out`` may be ``x`` or ``y``)."""
    _axpy_kernel[_vector_blocks("axpy", x.shape[0]), THREADS, _stream(x)](
        alpha, _on_device(x), _on_device(y), _on_device(out))
    return out
