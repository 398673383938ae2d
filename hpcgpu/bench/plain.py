"""The plain Numba kernels ``hpcgpu bench`` holds each CPU kernel to, and a STREAM triad roof.

What a user would write in ten minutes for the same job, with every easy
switch on (``parallel=True``, ``fastmath=True``, ``prange`` over the
outputs): if hpcgpu's kernel is not faster than this, it has no reason to
exist on that CPU. Each takes the same inputs as the case it is compared
with, and :func:`paired_seconds` times the two in turns in the same run, so
both see the same load. ``ratio_to_plain`` in a bench line is hpcgpu's
rate over the plain kernel's (above 1: hpcgpu is faster); the acceptance
suite flags a kernel below 1.0.

- :func:`nbody_accelerations`: ``prange`` over targets, all sources,
  ``1 / sqrt(r2)`` (softened, no coincidence test: ``eps2 > 0``).
- :func:`diffusion_step`: one periodic 5-point update, ``prange`` over rows.
- :func:`lj_cell_forces`: Lennard-Jones forces by a cell list built each
  call (:func:`bin_atoms`), all 27 neighbouring cells, minimum image.
- :func:`csr_spmv`: ``prange`` over rows, a dot product per row.
- :func:`triad`: ``a = b + s c`` on all of Numba's threads, the STREAM
  kernel; :func:`triad_bandwidth` is its rate counted as STREAM does (three
  arrays' bytes per sweep), the memory roof beside the copy of
  :func:`hpcgpu.bench.harness.copy_bandwidth`.

All are ``nogil=True`` (a worker's heartbeat thread must run meanwhile).
"""

import math
import time

import numpy as np
from numba import njit, prange

from hpcgpu import _jit_cache

_jit_cache.install()  # before the cached functions below are defined

__all__ = ["nbody_accelerations", "diffusion_step", "bin_atoms", "lj_cell_forces", "csr_spmv", "triad",
           "triad_bandwidth", "paired_seconds", "PAIRED_ROUNDS"]

PAIRED_ROUNDS = 5
"""Calls of each kernel in :func:`paired_seconds` (in turns, after one warm-up call of each)."""

_PLAIN = dict(parallel=True, fastmath=True, nogil=True, cache=True)


@njit(**_PLAIN)
def nbody_accelerations(x, y, z, m, eps2, one, ax, ay, az):
    """Softened accelerations (G = 1) of all bodies from all bodies."""
    n = x.shape[0]
    for i in prange(n):
        sx, sy, sz = one - one, one - one, one - one
        for j in range(n):
            dx, dy, dz = x[j] - x[i], y[j] - y[i], z[j] - z[i]
            r2 = dx * dx + dy * dy + dz * dz + eps2
            inv_r = one / math.sqrt(r2)
            w = m[j] * inv_r * inv_r * inv_r
            sx += w * dx
            sy += w * dy
            sz += w * dz
        ax[i], ay[i], az[i] = sx, sy, sz


@njit(**_PLAIN)
def diffusion_step(u, out, cx, cy):
    """``out = u + cx (E - 2 C + W) + cy (N - 2 C + S)`` with periodic edges."""
    ny, nx = u.shape
    for i in prange(ny):
        up = i - 1 if i > 0 else ny - 1
        down = i + 1 if i < ny - 1 else 0
        for j in range(nx):
            left = j - 1 if j > 0 else nx - 1
            right = j + 1 if j < nx - 1 else 0
            c = u[i, j]
            out[i, j] = c + cx * (u[i, left] - 2 * c + u[i, right]) + cy * (u[up, j] - 2 * c + u[down, j])


@njit(nogil=True, cache=True)
def bin_atoms(positions, sides, cells):
    """Cell of every atom and the atoms sorted by cell: ``(first, order)``, ``first`` of length
    ``cells**3 + 1``; ``cells`` per side of the box (lengths ``sides``), each at least the cutoff wide."""
    n = positions.shape[1]
    cell = np.empty(n, np.int64)
    for i in range(n):
        c = 0
        for d in range(3):
            k = int(positions[d, i] / sides[d] * cells)
            k = min(max(k, 0), cells - 1)
            c = c * cells + k
        cell[i] = c
    first = np.zeros(cells**3 + 1, np.int64)
    for i in range(n):
        first[cell[i] + 1] += 1
    for c in range(cells**3):
        first[c + 1] += first[c]
    fill = first[:-1].copy()
    order = np.empty(n, np.int64)
    for i in range(n):
        order[fill[cell[i]]] = i
        fill[cell[i]] += 1
    return first, order


@njit(**_PLAIN)
def lj_cell_forces(positions, sides, cells, radius, first, order, forces):
    """Lennard-Jones forces (epsilon = sigma = 1) within ``radius`` (the cutoff) in a periodic box of
    side lengths ``sides``, each atom over its 27 cells."""
    n = positions.shape[1]
    rc2 = radius * radius
    for i in prange(n):
        xi, yi, zi = positions[0, i], positions[1, i], positions[2, i]
        ci = min(max(int(xi / sides[0] * cells), 0), cells - 1)
        cj = min(max(int(yi / sides[1] * cells), 0), cells - 1)
        ck = min(max(int(zi / sides[2] * cells), 0), cells - 1)
        fx = fy = fz = 0.0
        for a in range(ci - 1, ci + 2):
            for b in range(cj - 1, cj + 2):
                for c in range(ck - 1, ck + 2):
                    cell = ((a % cells) * cells + b % cells) * cells + c % cells
                    for p in range(first[cell], first[cell + 1]):
                        j = order[p]
                        if j == i:
                            continue
                        dx = xi - positions[0, j]
                        dy = yi - positions[1, j]
                        dz = zi - positions[2, j]
                        dx -= sides[0] * np.rint(dx / sides[0])
                        dy -= sides[1] * np.rint(dy / sides[1])
                        dz -= sides[2] * np.rint(dz / sides[2])
                        r2 = dx * dx + dy * dy + dz * dz
                        if r2 < rc2:
                            inv2 = 1.0 / r2
                            inv6 = inv2 * inv2 * inv2
                            f = 24.0 * inv2 * inv6 * (2.0 * inv6 - 1.0)
                            fx += f * dx
                            fy += f * dy
                            fz += f * dz
        forces[0, i], forces[1, i], forces[2, i] = fx, fy, fz


def lj_forces(positions, sides, radius, forces):
    """The plain cell-list force evaluation, binning included: what a user's step would call."""
    sides = np.asarray(sides, np.float64)
    cells = max(3, int(min(sides) / radius))
    first, order = bin_atoms(positions, sides, cells)
    lj_cell_forces(positions, sides, cells, radius, first, order, forces)
    return forces


@njit(**_PLAIN)
def csr_spmv(data, indices, indptr, x, out, zero):
    """``out = A x``, one row per iteration of a ``prange`` (``zero`` in the dtype of ``data``)."""
    for i in prange(out.shape[0]):
        total = zero
        for e in range(indptr[i], indptr[i + 1]):
            total += data[e] * x[indices[e]]
        out[i] = total


@njit(**_PLAIN)
def triad(a, b, c, scalar):
    """STREAM triad ``a = b + scalar * c``: 64 contiguous chunks over the threads."""
    n = a.shape[0]
    for chunk in prange(64):
        start, stop = chunk * n // 64, (chunk + 1) * n // 64
        aa, bb, cc = a[start:stop], b[start:stop], c[start:stop]
        for k in range(stop - start):
            aa[k] = bb[k] + scalar * cc[k]


def triad_bandwidth(nbytes, repeats=7):
    """STREAM triad bandwidth on all of Numba's threads: bytes of the three float32 arrays per
    sweep over the median time. Sized like the working set it is compared with (``nbytes`` in all)."""
    elements = max(1024, int(nbytes // 3 // 4))
    a = np.zeros(elements, np.float32)
    b = np.ones(elements, np.float32)
    c = np.ones(elements, np.float32)
    scalar = np.float32(3.0)
    triad(a, b, c, scalar)
    durations = []
    for _ in range(repeats):
        start = time.perf_counter()
        triad(a, b, c, scalar)
        durations.append(time.perf_counter() - start)
    return 3 * a.nbytes / float(np.median(durations))


def paired_seconds(ours, plain, *, synchronize=lambda: None, rounds=PAIRED_ROUNDS):
    """Median seconds of ``ours()`` and of ``plain()``, called in turns (one warm-up call each).

    Turns, not one after the other: on a shared machine a slow spell then
    falls on both.
    """
    for function in (ours, plain):
        function()
        synchronize()
    times = ([], [])
    for _ in range(rounds):
        for function, spent in zip((ours, plain), times):
            start = time.perf_counter()
            function()
            synchronize()
            spent.append(time.perf_counter() - start)
    return float(np.median(times[0])), float(np.median(times[1]))
