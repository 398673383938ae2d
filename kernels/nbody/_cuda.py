"""Direct-summation N-body kernel for NVIDIA GPUs with Numba-CUDA.

The classic shared-memory tiled kernel, with the sources cut into slices
(:mod:`.tiling`): one thread per target, blocks of ``threads`` targets; the
block loads a tile of ``threads`` sources (x, y, z, m) into shared memory,
every thread sums the whole tile for its target, and the block moves to the
next tile of its slice. Partial sums go to a ``(slices, 3 or 4, targets)``
array that a second kernel adds up in slice order, times ``G``.

The pair interaction is ``physics``, compiled here as device functions;
``1/sqrt`` is libdevice's ``rsqrtf`` / ``rsqrt`` (one multi-function-unit
instruction in float32; under the simulator, ``physics.inverse_sqrt``).
float32 kernels are compiled with ``fastmath`` (approximate division and
square root, flush-to-zero), float64 kernels without. Kernels are built per
dtype, launch and whether the potential is wanted.

Arrays stay CuPy arrays, so CuPy and Numba share one memory pool; each call
wraps them with ``cuda.as_cuda_array(..., sync=False)`` and launches on
CuPy's current stream (Numba's default import of a CuPy array synchronises
the host with that stream). Under the CUDA simulator the arrays are NumPy
arrays and pass through.
"""

import functools
import math

import numba
import numpy as np

from hpcgpu import _gpu_probe
from hpcgpu._compat import numpy_aliases_for_numba_cuda

numpy_aliases_for_numba_cuda()

from numba import cuda  # noqa: E402

from hpcgpu.kernels.cuda_interop import array_module as _xp  # noqa: E402
from hpcgpu.kernels.cuda_interop import on_device as _on_device  # noqa: E402
from hpcgpu.kernels.cuda_interop import stream_of as _stream  # noqa: E402

from hpcgpu.kernels.nbody import physics  # noqa: E402
from hpcgpu.kernels.nbody.tiling import FINALIZE_THREADS, LAUNCH, blocks, check, slices  # noqa: E402

_device_function = cuda.jit(device=True)
distance_squared = _device_function(physics.distance_squared)
exclude_coincident = _device_function(physics.exclude_coincident)
pair_weights = _device_function(physics.pair_weights)

if _gpu_probe.simulator_enabled():
    @cuda.jit(device=True)
    def _simulated_inverse_sqrt(r2, one):
        # NumPy scalars warn on 1/0; the kernel zeroes this pair anyway.
        if r2 == one - one:
            return r2
        return one / math.sqrt(r2)

    _INVERSE_SQRT = {"float32": _simulated_inverse_sqrt, "float64": _simulated_inverse_sqrt}
else:
    from numba.cuda import libdevice

    @cuda.jit(device=True)
    def _inverse_sqrt_float32(r2, one):
        return libdevice.rsqrtf(r2)

    @cuda.jit(device=True)
    def _inverse_sqrt_float64(r2, one):
        return libdevice.rsqrt(r2)

    _INVERSE_SQRT = {"float32": _inverse_sqrt_float32, "float64": _inverse_sqrt_float64}


@functools.cache
def _direct_kernel(dtype_name, threads, potential):
    """The tiled kernel for one dtype, block size and potential flag (all
    compile-time constants: the shared tile's shape and type need them)."""
    value_type = numba.from_dtype(np.dtype(dtype_name))
    inverse_sqrt = _INVERSE_SQRT[dtype_name]

    @cuda.jit(device=True)
    def sum_tile(tile, count, x, y, z, eps2, self_k, ax, ay, az, phi, zero, one):
        # Every thread reads the same tile entry at once: a shared-memory broadcast.
        for k in range(count):
            dx = tile[k, 0] - x
            dy = tile[k, 1] - y
            dz = tile[k, 2] - z
            r2 = distance_squared(dx, dy, dz, eps2)
            inv_r = exclude_coincident(inverse_sqrt(r2, one), r2, zero)
            if potential and k == self_k:
                inv_r = zero
            weight, m_inv_r = pair_weights(tile[k, 3], inv_r)
            ax += weight * dx
            ay += weight * dy
            az += weight * dz
            if potential:
                phi += m_inv_r
        return ax, ay, az, phi

    @cuda.jit(fastmath=dtype_name == "float32")
    def kernel(tx, ty, tz, sx, sy, sz, sm, eps2, self_offset, slice_length, partial, zero, one):
        n_targets = tx.shape[0]
        n_sources = sx.shape[0]
        t = cuda.threadIdx.x
        i = cuda.blockIdx.x * threads + t
        s = cuda.blockIdx.y
        tile = cuda.shared.array((threads, 4), value_type)
        # Threads past the last target still load tiles and meet every
        # barrier; they only skip the final store.
        x = zero
        y = zero
        z = zero
        if i < n_targets:
            x = tx[i]
            y = ty[i]
            z = tz[i]
        me = -1  # this target's index among the sources, if it is one
        if self_offset >= 0:
            me = i + self_offset
        j0 = s * slice_length
        j1 = j0 + slice_length
        if j1 > n_sources:
            j1 = n_sources
        ax = zero
        ay = zero
        az = zero
        phi = zero
        for start in range(j0, j1, threads):
            j = start + t
            if j < j1:
                tile[t, 0] = sx[j]
                tile[t, 1] = sy[j]
                tile[t, 2] = sz[j]
                tile[t, 3] = sm[j]
            cuda.syncthreads()
            count = j1 - start
            # A full tile has a constant trip count, which unrolls.
            if count >= threads:
                ax, ay, az, phi = sum_tile(tile, threads, x, y, z, eps2, me - start,
                                           ax, ay, az, phi, zero, one)
            else:
                ax, ay, az, phi = sum_tile(tile, count, x, y, z, eps2, me - start,
                                           ax, ay, az, phi, zero, one)
            cuda.syncthreads()
        if i < n_targets:
            partial[s, 0, i] = ax
            partial[s, 1, i] = ay
            partial[s, 2, i] = az
            if potential:
                partial[s, 3, i] = phi

    return kernel


@cuda.jit
def _finalize_kernel(partial, G, acc_out, pot_out):
    """acc = G * (sum of the slices), pot = -G * (sum), slices added in order."""
    i = cuda.grid(1)
    if i >= acc_out.shape[1]:
        return
    n_slices = partial.shape[0]
    for c in range(partial.shape[1]):
        total = partial[0, c, i]
        for s in range(1, n_slices):
            total += partial[s, c, i]
        if c < 3:
            acc_out[c, i] = G * total
        else:
            pot_out[i] = -(G * total)


def _direct(target_positions, source_positions, source_masses, eps2, G, self_offset,
            acc_out, pot_out, launch):
    dtype = np.dtype(source_positions.dtype)
    t = dtype.type
    xp = _xp(source_positions)
    n_targets = target_positions.shape[1]
    check(launch, dtype)
    slice_length, n_slices = slices(source_positions.shape[1], launch)
    potential = pot_out is not None
    partial = xp.empty((n_slices, 4 if potential else 3, n_targets), dtype)
    stream = _stream(source_positions)
    kernel = _direct_kernel(dtype.name, launch.threads, potential)
    kernel[(blocks(n_targets, launch.threads), n_slices), launch.threads, stream](
        *(_on_device(target_positions[k]) for k in range(3)),
        *(_on_device(source_positions[k]) for k in range(3)), _on_device(source_masses),
        t(eps2), int(self_offset), slice_length, _on_device(partial), t(0), t(1))
    pot = pot_out if potential else xp.empty(1, dtype)  # not written; any valid array
    _finalize_kernel[blocks(n_targets, FINALIZE_THREADS), FINALIZE_THREADS, stream](
        _on_device(partial), t(G), _on_device(acc_out), _on_device(pot))
    return acc_out


def direct(target_positions, source_positions, source_masses, eps2, G, self_offset, acc_out, pot_out):
    """Softened accelerations (and potentials) on the targets; see ``_numpy.direct``."""
    dtype = np.dtype(source_positions.dtype)
    return _direct(target_positions, source_positions, source_masses, eps2, G, self_offset,
                   acc_out, pot_out, LAUNCH[dtype.name])
