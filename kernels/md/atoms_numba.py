"""Per-atom passes of a velocity-Verlet step in one parallel loop each (Numba, CPU).

The NumPy form of the drift (half kick, drift, wrap into the box with image
counts) and of the rebuild test (largest minimum-image displacement since
the list was built) makes about 25 array passes and temporaries per step; at
32000 atoms that was a quarter of an MD step next to the force kernel. Here
each is one pass over the atoms, on one thread or all, whichever is faster
on the machine as loaded (:func:`hpcgpu.kernels.threads.adaptive_threads`:
with another busy process on two cores, a 2,048-atom drift took 30 us on
two threads at the median but 2.6 ms on average, against 0.1 ms on one).

The arithmetic is the NumPy expressions' own, in the arrays' dtype and in the
same order, without fast-math (no fused multiply-add), so results are bitwise
those of the NumPy form; the tests check that.
"""

import numba
import numpy as np
from numba import njit, prange

from hpcgpu.kernels.threads import adaptive_threads

__all__ = ["verlet_drift", "verlet_kick", "largest_displacement_squared", "largest_reach_squared"]

_OPTS = dict(cache=True, nogil=True, error_model="numpy")


@njit(parallel=True, **_OPTS)
def _drift_kernel(positions, velocities, forces, images, half, dt, lengths, inverse_lengths,
                  positions_out, velocities_out, images_out):
    n = positions.shape[1]
    zero = positions.dtype.type(0.0)
    one = positions.dtype.type(1.0)
    for i in prange(n):
        for axis in range(3):
            v = velocities[axis, i] + forces[axis, i] * half
            x = positions[axis, i] + v * dt
            length = lengths[axis]
            shift = np.floor(x * inverse_lengths[axis])
            x -= shift * length
            # x just below 0 can round to exactly L
            over = one if x >= length else zero
            x -= over * length
            velocities_out[axis, i] = v
            positions_out[axis, i] = x
            images_out[axis, i] = images[axis, i] + np.int64(shift + over)


@adaptive_threads(key=lambda positions, *rest: positions.shape[1])
def verlet_drift(positions, velocities, forces, images, box, dt):
    """Half kick, drift and wrap of every atom; returns new ``(positions, velocities, images)``.

    ``v' = v + f dt/2``, ``x' = x + v' dt`` wrapped into ``[0, L)`` with the
    images crossed added to ``images`` (the inputs are not modified).
    """
    t = positions.dtype.type
    lengths = np.array(box, dtype=positions.dtype)
    inverse = np.array([1.0 / length for length in box], dtype=positions.dtype)
    out = (np.empty_like(positions), np.empty_like(velocities), np.empty_like(images))
    _drift_kernel(positions, velocities, forces, images, t(0.5 * dt), t(dt), lengths, inverse, *out)
    return out


@njit(parallel=True, **_OPTS)
def _kick_kernel(velocities, forces, half, velocities_out):
    n = velocities.shape[1]
    for i in prange(n):
        for axis in range(3):
            velocities_out[axis, i] = velocities[axis, i] + forces[axis, i] * half


@adaptive_threads(key=lambda velocities, *rest: velocities.shape[1])
def verlet_kick(velocities, forces, dt):
    """The closing half kick ``v + f dt/2`` as a new array."""
    out = np.empty_like(velocities)
    _kick_kernel(velocities, forces, velocities.dtype.type(0.5 * dt), out)
    return out


@njit(parallel=True, **_OPTS)
def _largest_kernel(positions, reference, lengths, inverse_lengths, n_chunks, largest):
    n = positions.shape[1]
    for chunk in prange(n_chunks):
        best = positions.dtype.type(0.0)
        for i in range(chunk * n // n_chunks, (chunk + 1) * n // n_chunks):
            total = positions.dtype.type(0.0)
            for axis in range(3):
                d = positions[axis, i] - reference[axis, i]
                d -= lengths[axis] * np.rint(d * inverse_lengths[axis])
                total += d * d
            if total > best:
                best = total
        largest[chunk] = best


@adaptive_threads(key=lambda positions, *rest: positions.shape[1])
def largest_displacement_squared(positions, reference, box):
    """Largest squared minimum-image distance between the columns of ``positions`` and ``reference``."""
    n = positions.shape[1]
    if n == 0:
        return 0.0
    lengths = np.array(box, dtype=positions.dtype)
    inverse = np.array([1.0 / length for length in box], dtype=positions.dtype)
    largest = np.zeros(max(1, min(n // 1024, 4 * numba.get_num_threads())), dtype=positions.dtype)
    _largest_kernel(positions, np.asarray(reference, dtype=positions.dtype), lengths, inverse,
                    len(largest), largest)
    return float(largest.max())


@njit(parallel=True, **_OPTS)
def _reach_kernel(positions, reference, velocities, forces, lengths, ahead_v, ahead_f, n_chunks, moved_out,
                  reach_out):
    n = positions.shape[1]
    for chunk in prange(n_chunks):
        most, furthest = positions.dtype.type(0.0), positions.dtype.type(0.0)
        for i in range(chunk * n // n_chunks, (chunk + 1) * n // n_chunks):
            moved = positions.dtype.type(0.0)
            speed = positions.dtype.type(0.0)
            pull = positions.dtype.type(0.0)
            for axis in range(3):
                d = positions[axis, i] - reference[axis, i]
                d -= lengths[axis] * np.rint(d / lengths[axis])
                moved += d * d
                speed += velocities[axis, i] * velocities[axis, i]
                pull += forces[axis, i] * forces[axis, i]
            reach = np.sqrt(moved) + ahead_v * np.sqrt(speed) + ahead_f * np.sqrt(pull)
            most = max(most, moved)
            furthest = max(furthest, reach * reach)
        moved_out[chunk] = most
        reach_out[chunk] = furthest


@adaptive_threads(key=lambda positions, *rest: positions.shape[1])
def largest_reach_squared(positions, reference, velocities, forces, box, ahead_v, ahead_f):
    """Largest squared displacement and largest squared ``|d| + ahead_v |v| + ahead_f |f|``, in one pass."""
    n = positions.shape[1]
    t = positions.dtype.type
    lengths = np.array(box, dtype=positions.dtype)
    chunks = max(1, min(n // 1024, 4 * numba.get_num_threads()))
    moved, reach = np.zeros(chunks, dtype=positions.dtype), np.zeros(chunks, dtype=positions.dtype)
    _reach_kernel(positions, np.asarray(reference, dtype=positions.dtype), velocities, forces, lengths,
                  t(ahead_v), t(ahead_f), chunks, moved, reach)
    return float(moved.max()), float(reach.max())
