"""Lennard-Jones kernels for the CPU with ``numba.njit(parallel=True)``: the backend file.

The neighbour build (:func:`build_neighbors`, :func:`build_neighbors_rows`) is
in :mod:`.neighbors_numba` and the per-atom Verlet steps in :mod:`.atoms_numba`;
this module re-exports them beside the forces.

Forces (:func:`forces`): in parallel over atoms, each atom runs over its
own row (a full list: no atomics, no scatter). The loop gathers the
neighbours' coordinates, applies the minimum image (``rint``: one rounding
instruction), evaluates :func:`.physics.lennard_jones` for every listed
neighbour and selects the pairs inside the cutoff; LLVM vectorises it with
gather instructions, the sums kept in vector lanes (``reassoc``). The pair
physics is compiled without ``reassoc``, so only the sums are reordered.
The loop is bound by floating-point instructions, so two of them go:

* when every atom lies in the box ``[0, L)`` (a simulation keeps them
  wrapped; checked per call), an atom at least the cutoff from every face
  has only pairs whose raw difference is their minimum image, so its loop
  skips the image arithmetic (a third of the instructions; 62 % of the
  atoms of a 32,000-atom box). The result is bitwise that of the general
  loop: for the pairs inside the cutoff the minimum image subtracts 0;
* the last ``count % lanes`` neighbours run as one more vector block with
  the unused lanes masked, not as a scalar loop (which cost about 10 %).

(A float32 reciprocal refined by Newton steps in place of the float64
division measured slower: the divider is not the bottleneck.)

Subnormals are flushed inside the parallel loops (:mod:`hpcgpu.kernels.fpenv`).
"""

import numpy as np
from numba import njit, prange

from hpcgpu.kernels.fpenv import flush_subnormals, restore_fp_mode
from hpcgpu.kernels.md.neighbors_numba import (  # noqa: F401 - the builds are this backend's too
    _OPTS,
    _PAIR_OPTS,
    _chunks,
    _separation,
    build_neighbors,
    build_neighbors_rows,
    lennard_jones,
    within,
)
from hpcgpu.kernels.threads import adaptive_threads


# ---- forces -----------------------------------------------------------------------------------

VECTOR_BYTES = 64
"""Pairs are summed in blocks of this many bytes of coordinates (8 float64 or
16 float32: the compiled loop's vector width times its unrolling)."""


@njit(**_PAIR_OPTS)
def _pair(dx, dy, dz, live, cutoff2, sigma2, c4, c24, shift, zero, one, two):
    """``(weight, energy, virial, inside)`` of one listed pair; zeros unless ``live`` and inside the cutoff.

    ``inside`` is ``one`` for a pair that interacts: counted in the float
    lanes of the sums (exact for any row length a list holds).
    """
    r2 = dx * dx + dy * dy + dz * dz
    weight, e, w = lennard_jones(r2, sigma2, c4, c24, shift, one, two)
    inside = one
    if not (live & within(r2, cutoff2)):
        weight = zero
        e = zero
        w = zero
        inside = zero
    return weight, e, w, inside


@njit(inline="always", **_OPTS)
def _atom_sums(x, y, z, row, count, xi, yi, zi, images, lx, ly, lz, ilx, ily, ilz, cutoff2, sigma2, c4,
               c24, shift, zero, one, two):
    """Sums over the listed neighbours of one atom: (sum w dx, sum w dy, sum w dz, energy, virial, pairs).

    ``images`` false skips the minimum image (the caller knows every pair
    inside the cutoff is its own nearest image); inlined, so the branch is
    resolved at compile time. The last ``count % lanes`` neighbours run as
    one more vector block with the unused lanes masked, not as a scalar loop.
    """
    fx = zero
    fy = zero
    fz = zero
    energy = zero
    virial = zero
    pairs = zero
    lanes = VECTOR_BYTES // x.itemsize
    body = count - count % lanes
    for k in range(body):
        # Unsigned: no negative-index wraparound, which would block the gathers.
        j = np.uint32(row[k])
        if images:
            dx = _separation(x[j], xi, lx, ilx)
            dy = _separation(y[j], yi, ly, ily)
            dz = _separation(z[j], zi, lz, ilz)
        else:
            dx = x[j] - xi
            dy = y[j] - yi
            dz = z[j] - zi
        weight, e, w, inside = _pair(dx, dy, dz, True, cutoff2, sigma2, c4, c24, shift, zero, one, two)
        fx += weight * dx
        fy += weight * dy
        fz += weight * dz
        energy += e
        virial += w
        pairs += inside
    if body < count:
        last = count - 1
        for q in range(lanes):
            # Lanes past the count repeat the last neighbour, masked out.
            j = np.uint32(row[min(body + q, last)])
            if images:
                dx = _separation(x[j], xi, lx, ilx)
                dy = _separation(y[j], yi, ly, ily)
                dz = _separation(z[j], zi, lz, ilz)
            else:
                dx = x[j] - xi
                dy = y[j] - yi
                dz = z[j] - zi
            weight, e, w, inside = _pair(dx, dy, dz, body + q < count, cutoff2, sigma2, c4, c24, shift, zero,
                                         one, two)
            fx += weight * dx
            fy += weight * dy
            fz += weight * dz
            energy += e
            virial += w
            pairs += inside
    return fx, fy, fz, energy, virial, pairs


@njit(parallel=True, nogil=True, cache=True)
def _inside_box(x, y, z, lx, ly, lz):
    """Whether every atom lies in ``[0, L)`` along every axis."""
    outside = 0
    for i in prange(x.shape[0]):
        outside += ((x[i] < 0) | (x[i] >= lx) | (y[i] < 0) | (y[i] >= ly) | (z[i] < 0) | (z[i] >= lz))
    return outside == 0


@njit(parallel=True, **_OPTS)
def _forces_kernel(x, y, z, neighbors, counts, lx, ly, lz, ilx, ily, ilz, interior, cutoff2, sigma2, c4,
                   c24, shift, forces_out, energy_out, virial_out, pair_counts_out, n_chunks, zero, one, two,
                   half):
    n = x.shape[0]
    capacity = neighbors.shape[1]
    for chunk in prange(n_chunks):
        fp_mode = flush_subnormals()
        i0 = chunk * n // n_chunks
        i1 = (chunk + 1) * n // n_chunks
        for i in range(i0, i1):
            xi = x[i]
            yi = y[i]
            zi = z[i]
            count = min(counts[i], capacity)
            if (interior <= xi <= lx - interior) & (interior <= yi <= ly - interior) & (
                    interior <= zi <= lz - interior):
                fx, fy, fz, energy, virial, pairs = _atom_sums(
                    x, y, z, neighbors[i], count, xi, yi, zi, False, lx, ly, lz, ilx, ily, ilz, cutoff2,
                    sigma2, c4, c24, shift, zero, one, two)
            else:
                fx, fy, fz, energy, virial, pairs = _atom_sums(
                    x, y, z, neighbors[i], count, xi, yi, zi, True, lx, ly, lz, ilx, ily, ilz, cutoff2,
                    sigma2, c4, c24, shift, zero, one, two)
            forces_out[0, i] = -fx
            forces_out[1, i] = -fy
            forces_out[2, i] = -fz
            energy_out[i] = half * energy
            virial_out[i] = half * virial
            pair_counts_out[i] = np.int32(pairs)
        restore_fp_mode(fp_mode)


@adaptive_threads(key=lambda positions, *rest: positions.shape[1])
def forces(positions, box, neighbors, counts, cutoff2, epsilon, sigma, energy_shift,
           forces_out, energy_out, virial_out, pair_counts_out):
    """Lennard-Jones forces from a full neighbour list; see ``_numpy.forces``."""
    t = positions.dtype.type
    lx, ly, lz = (float(v) for v in box)
    x, y, z = positions
    # With every atom in [0, L), a pair whose atom i lies at least the cutoff
    # from every face is inside the cutoff only as its raw difference: such
    # atoms skip the minimum image. The margin covers the rounding of L.
    interior = np.inf
    if _inside_box(x, y, z, t(lx), t(ly), t(lz)):
        interior = (1.0 + 1e-3) * np.sqrt(cutoff2) + 16 * np.finfo(t).eps * max(lx, ly, lz)
    _forces_kernel(x, y, z, neighbors, counts, t(lx), t(ly), t(lz), t(1.0 / lx), t(1.0 / ly), t(1.0 / lz),
                   t(interior), t(cutoff2), t(sigma * sigma), t(4.0 * epsilon), t(24.0 * epsilon),
                   t(energy_shift), forces_out, energy_out, virial_out, pair_counts_out,
                   _chunks(positions.shape[1]), t(0), t(1), t(2), t(0.5))
    return forces_out


# One-pass per-atom steps of velocity Verlet (kept in their own module).
from hpcgpu.kernels.md.atoms_numba import (  # noqa: E402, F401
    largest_displacement_squared,
    largest_reach_squared,
    verlet_drift,
    verlet_kick,
)
