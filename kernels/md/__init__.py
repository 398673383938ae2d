"""Molecular-dynamics kernels: Lennard-Jones forces with cell and Verlet neighbour lists.

Conventions (every backend):

* positions are ``(3, N)`` structure-of-arrays in an orthorhombic periodic box
  ``box = (Lx, Ly, Lz)``; positions need not be wrapped into the box (the
  minimum image is taken for every pair);
* reduced LJ units (``epsilon = sigma = mass = 1`` unless given);
* neighbour lists are *full* lists (each pair appears in both atoms' rows),
  so every atom sums its own force without atomics, on CPU and GPU alike:
  ``neighbors`` is ``(N, capacity)`` int32 (``neighbors[i, k]``: the k-th
  neighbour of atom i), ``counts`` is ``(N,)`` int32, built with radius
  ``cutoff + skin`` from cell lists of side at least ``cutoff + skin``;
* the list's memory layout is the backend's: row-major (C order) on the
  CPU backends, where one thread walks one atom's row; column-major
  (Fortran order: the k-th neighbours of all atoms side by side, as in
  HOOMD-blue and Kokkos LAMMPS) on the GPU backends, where the 32 threads
  of a warp read the k-th neighbour of 32 consecutive atoms in one
  transaction instead of 32 rows ``capacity * 4`` bytes apart. A backend
  file says which with ``NEIGHBOR_ORDER`` ("C" when absent); the build
  allocates that order, :func:`lj_forces` copies a list of another layout
  into it (a list moved between backends), every kernel reads either, and
  ``neighbors[i, k]`` means the same in both;
* a list that would overflow its capacity is rebuilt with a larger one, never
  truncated (the build reports the largest count; the public API grows and
  retries);
* the list stays valid until some atom has moved more than ``skin / 2`` from
  its position at build time (minimum image).

Public functions (validation once, dispatch on ``backend=``; the neighbour
lists are built and checked in :mod:`.neighbor_list`, the forces here):

``build_neighbor_list(positions, box, *, cutoff, skin, capacity=None, backend)``
    -> :class:`NeighborList`

``needs_rebuild(neighbor_list, positions, backend=None)`` -> bool

``largest_displacement_squared(positions, reference, box, backend=None)`` -> float

``largest_reach_squared(positions, reference, velocities, forces, box, steps, dt, margin)``
    -> ``(float, float)``: that and a bound ``steps`` steps on (a rebuild decided late)

``lj_forces(positions, box, neighbor_list, *, cutoff, epsilon=1, sigma=1,
shift=True, backend)`` -> ``(forces (3, N), potential_energy, virial)``

``lj_forces_all_pairs(positions, box, *, cutoff, ...)``: the same without a
    list, O(N^2): the reference.

``cell_order(positions, box, *, radius, backend)`` -> int64 permutation that
    lists the atoms cell by cell (:mod:`.sorting`): a model reorders its
    atoms with it now and then, so that neighbours stay close in memory.

Each backend file (``_numpy``, ``_numba``, ``_cuda``, ``_cupy``) exports::

    build_neighbors(positions, box, radius, neighbors_out, counts_out) -> int
        # fills the full list; returns the largest count (> capacity means
        # the rows were cut and the caller must retry with more capacity)
    forces(positions, box, neighbors, counts, cutoff2, epsilon, sigma,
           energy_shift, forces_out, energy_out, virial_out, pair_counts_out)
        # per-atom arrays: energy_out (N,) holds half of each pair's energy,
        # virial_out (N,) half of each pair's r . f, so sums give the totals;
        # pair_counts_out (N,) int32 the atom's neighbours inside the cutoff
        # (its sum is twice the pairs: the shifted energy's correction needs it)

and may export, where one pass beats the NumPy expressions (Numba)::

    verlet_drift(positions, velocities, forces, images, box, dt)
        -> (positions, velocities, images)   # half kick, drift, wrap; new arrays
    verlet_kick(velocities, forces, dt) -> velocities   # v + f dt/2, a new array
    largest_displacement_squared(positions, reference, box) -> float
"""

import math

import numpy as np

from hpcgpu.backends import get_backend
from hpcgpu.errors import ConfigError
from hpcgpu.kernels.md.box import check_box as _box
from hpcgpu.kernels.md.neighbor_list import (  # noqa: F401 - the family's public names
    CAPACITY_HEADROOM,
    CAPACITY_ROUND,
    NeighborList,
    _cutoff,
    _positions,
    build_neighbor_list,
    largest_displacement_squared,
    largest_reach_squared,
    needs_rebuild,
)
from hpcgpu.kernels.md.sorting import cell_order
from hpcgpu.kernels.md.verlet import FAST_PATHS, PreparedLJForces, verlet_drift, verlet_kick
from hpcgpu.kernels.md.verlet import wrap as wrap_into_box
from hpcgpu.validation import check_float

__all__ = [
    "NeighborList",
    "build_neighbor_list",
    "needs_rebuild",
    "largest_displacement_squared",
    "largest_reach_squared",
    "lj_forces",
    "lj_forces_all_pairs",
    "energy_shift",
    "prepare_lj_forces",
    "PreparedLJForces",
    "verlet_drift",
    "verlet_kick",
    "wrap_into_box",
    "cell_order",
    "FAST_PATHS",
]

def energy_shift(cutoff, *, epsilon=1.0, sigma=1.0):
    """``4 epsilon ((sigma / cutoff)^12 - (sigma / cutoff)^6)``: the pair energy at the cutoff.

    :func:`lj_forces` with ``shift=True`` subtracts it from every pair
    inside the cutoff, so the energy goes continuously to zero there (the
    force is unchanged).

    Examples
    --------
    >>> round(energy_shift(2.5), 8)
    -0.01631689
    """
    cutoff = check_float("cutoff", cutoff, minimum=0.0, strict_min=True)
    epsilon = check_float("epsilon", epsilon, minimum=0.0, strict_min=True)
    sigma = check_float("sigma", sigma, minimum=0.0, strict_min=True)
    s6 = (sigma / cutoff) * (sigma / cutoff)
    s6 = s6 * s6 * s6
    shift = 4.0 * epsilon * (s6 * s6 - s6)
    if not math.isfinite(shift):
        raise ConfigError(f"cutoff={cutoff:g} is too short for sigma={sigma:g}: the pair energy there "
                          "overflows a float (a Lennard-Jones cutoff is normally 2.5-3 sigma)")
    return shift


def _interaction(cutoff, box, epsilon, sigma, shift):
    cutoff = _cutoff(cutoff, box)
    epsilon = check_float("epsilon", epsilon, minimum=0.0, strict_min=True)
    sigma = check_float("sigma", sigma, minimum=0.0, strict_min=True)
    if not isinstance(shift, (bool, np.bool_)):
        raise ConfigError(f"shift must be True or False; got {shift!r}")
    shift_value = energy_shift(cutoff, epsilon=epsilon, sigma=sigma) if shift else 0.0
    return cutoff, epsilon, sigma, shift_value


def _fits(dtype, epsilon, sigma):
    """Refuse ``epsilon`` or ``sigma`` whose ``24 epsilon`` or ``sigma**2`` overflows ``dtype``.

    The kernels take them in the positions' dtype: a float32 inf there made
    every force NaN, reported as overlapping atoms.
    """
    limit = float(np.finfo(dtype).max)
    for name, value, used in (("epsilon", epsilon, 24.0 * epsilon), ("sigma", sigma, sigma * sigma)):
        if used > limit:
            form = "24 * epsilon" if name == "epsilon" else "sigma**2"
            raise ConfigError(f"{name}={value!r} does not fit the positions' dtype {dtype}: {form} must be "
                              f"<= {limit:.4g}")


def lj_forces(positions, box, neighbor_list, *, cutoff, epsilon=1.0, sigma=1.0, shift=True,
              backend="auto"):
    """Lennard-Jones forces, potential energy and virial from a neighbour list.

    ``U = sum_{pairs r < cutoff} 4 epsilon ((sigma/r)^12 - (sigma/r)^6) - shift``
    with minimum-image distances; ``F_i = -dU/dx_i``.

    Parameters
    ----------
    positions : array (3, N)
        x, y, z rows (length), float32 or float64, on the backend's device.
    box : sequence of 3 floats
        The periodic box (length); must be the list's.
    neighbor_list : NeighborList
        Built for these atoms and this box with a cutoff ``>= cutoff``, and
        still valid (``needs_rebuild`` false; that is not checked here).
    cutoff : float
        Interaction cutoff (length), ``0 < cutoff <= min(box) / 2``.
    epsilon, sigma : float
        Well depth (energy) and size (length), > 0.
    shift : bool
        Shift the pair energy to zero at the cutoff (:func:`energy_shift`).
    backend : str or Backend

    Returns
    -------
    forces : array (3, N)
        On the backend's device, in the dtype of ``positions`` (energy/length).
    potential_energy : float
        Total potential energy (energy), summed in float64.
    virial : float
        ``sum over pairs r_ij . F_ij`` (energy), positive when repulsive: the
        pressure is ``(2 K + virial) / (3 V)`` with ``K`` the kinetic energy.

    Raises
    ------
    ConfigError
        Shapes, dtypes, NaN or infinite positions, a bad box or cutoff,
        epsilon or sigma <= 0 or too large for the dtype (``24 epsilon`` or
        ``sigma**2`` beyond its range), a list built for other atoms, another box or
        a smaller cutoff, and atoms so close that the energy or a force is
        not finite (the message names the closest pair).

    Examples
    --------
    >>> import numpy as np
    >>> x = np.array([[0.0, 2.0 ** (1 / 6)], [0.0, 0.0], [0.0, 0.0]])
    >>> box = (10.0, 10.0, 10.0)
    >>> nl = build_neighbor_list(x, box, cutoff=2.5, skin=0.3, backend="numpy")
    >>> f, u, w = lj_forces(x, box, nl, cutoff=2.5, shift=False, backend="numpy")
    >>> round(u, 12), bool(abs(f).max() < 1e-12)
    (-1.0, True)
    """
    backend = get_backend(backend)
    box = _box(box)
    cutoff, epsilon, sigma, shift_value = _interaction(cutoff, box, epsilon, sigma, shift)
    positions = _positions(backend, positions)
    _fits(positions.dtype, epsilon, sigma)
    if not isinstance(neighbor_list, NeighborList):
        raise ConfigError(f"neighbor_list must be a NeighborList; got {type(neighbor_list).__name__}")
    n = positions.shape[1]
    if neighbor_list.size != n:
        raise ConfigError(f"neighbor_list was built for {neighbor_list.size} atoms; positions hold {n}")
    if neighbor_list.box != box:
        raise ConfigError(f"box {box} differs from the neighbour list's {neighbor_list.box}; "
                          "rebuild the list for the new box")
    if cutoff > neighbor_list.cutoff:
        raise ConfigError(f"cutoff={cutoff} exceeds the cutoff the neighbour list was built for "
                          f"({neighbor_list.cutoff}); rebuild it with cutoff={cutoff}")
    kernels = backend.kernels("md")
    neighbors = _in_layout(backend, neighbor_list.neighbors, getattr(kernels, "NEIGHBOR_ORDER", "C"))
    counts = backend.asarray(neighbor_list.counts)
    dtype = positions.dtype
    forces = backend.empty((3, n), dtype)
    energy = backend.empty((n,), dtype)
    virial = backend.empty((n,), dtype)
    kernels.forces(positions, box, neighbors, counts, cutoff * cutoff, epsilon, sigma,
                   shift_value, forces, energy, virial, backend.empty((n,), np.int32))
    potential_energy, total_virial = _totals(backend, positions, box, forces, energy, virial,
                                             neighbors, counts)
    return forces, potential_energy, total_virial


def _in_layout(backend, neighbors, order):
    """The list on the backend in its own layout ``order`` ("C" or "F").

    Every kernel reads either layout, but a list built by another backend,
    or a strided view, is copied into this backend's layout: the numba
    kernel sums a row-major row in SIMD lanes (another order of additions
    than over a strided row), so its results would depend on where the
    list came from.
    """
    neighbors = backend.asarray(neighbors)
    if neighbors.flags.f_contiguous if order == "F" else neighbors.flags.c_contiguous:
        return neighbors
    return backend.xp.asarray(neighbors, order=order)


def lj_forces_all_pairs(positions, box, *, cutoff, epsilon=1.0, sigma=1.0, shift=True, backend="auto"):
    """:func:`lj_forces` without a list: every pair, O(N^2). The reference.

    Runs the array-module generic ``numpy`` kernel on the backend's arrays
    (NumPy, or CuPy on GPU backends). Parameters, returns and errors as in
    :func:`lj_forces`, without the list.

    Examples
    --------
    >>> import numpy as np
    >>> x = np.array([[0.5, 9.5], [0.0, 0.0], [0.0, 0.0]])  # 1 apart through the boundary
    >>> f, u, w = lj_forces_all_pairs(x, (10.0, 10.0, 10.0), cutoff=2.5, shift=False,
    ...                               backend="numpy")
    >>> f[0].tolist(), u, w  # repulsive: each is pushed away from the other's image
    ([24.0, -24.0], 0.0, 24.0)
    """
    from hpcgpu.kernels.md import _numpy

    backend = get_backend(backend)
    box = _box(box)
    cutoff, epsilon, sigma, shift_value = _interaction(cutoff, box, epsilon, sigma, shift)
    positions = _positions(backend, positions)
    _fits(positions.dtype, epsilon, sigma)
    n = positions.shape[1]
    dtype = positions.dtype
    forces = backend.empty((3, n), dtype)
    energy = backend.empty((n,), dtype)
    virial = backend.empty((n,), dtype)
    _numpy.forces_all_pairs(positions, box, cutoff * cutoff, epsilon, sigma, shift_value,
                            forces, energy, virial, backend.empty((n,), np.int32))
    potential_energy, total_virial = _totals(backend, positions, box, forces, energy, virial, None, None)
    return forces, potential_energy, total_virial


def _totals(backend, positions, box, forces, energy, virial, neighbors, counts):
    """Total energy and virial (float64 sums), or a ConfigError naming overlapping atoms.

    One reduction decides: the sum of the energies, virials and forces is
    finite exactly when every term is (an overflowing sum needs terms near
    the dtype's largest number, which is as wrong). Only then are the atoms
    looked for, on the host.
    """
    xp = backend.xp
    sums = xp.stack([energy.sum(dtype=np.float64), virial.sum(dtype=np.float64),
                     forces.sum(dtype=np.float64)])
    potential_energy, total_virial, total_force = (float(v) for v in backend.to_host(sums))
    if math.isfinite(potential_energy + total_virial + total_force):
        return potential_energy, total_virial
    raise _overlap_error(backend, positions, box, forces, energy, virial, neighbors, counts)


def _overlap_error(backend, positions, box, forces, energy, virial, neighbors, counts):
    host = backend.to_host
    x = host(positions).astype(np.float64)
    bad = ~(np.isfinite(host(energy)) & np.isfinite(host(virial)) & np.isfinite(host(forces)).all(axis=0))
    i = int(np.flatnonzero(bad)[0]) if bad.any() else 0
    if neighbors is None:
        others = np.delete(np.arange(x.shape[1]), i)
    else:
        others = host(neighbors)[i, :int(host(counts)[i])].astype(np.int64)
    if others.size == 0:
        return ConfigError(f"the Lennard-Jones forces are not finite at atom {i}")
    d = x[:, others] - x[:, i:i + 1]
    lengths = np.array(box)[:, None]
    d -= lengths * np.rint(d / lengths)
    r = np.sqrt((d * d).sum(axis=0))
    k = int(np.argmin(r))
    return ConfigError(f"atoms {i} and {int(others[k])} overlap (r = {r[k]:.3g}): the Lennard-Jones "
                       f"energy or force is not finite in {positions.dtype}; separate them (or start "
                       "from a lattice) before computing forces")


def prepare_lj_forces(box, *, cutoff, epsilon=1.0, sigma=1.0, shift=True, backend="auto"):
    """Per-atom Lennard-Jones forces for one box and interaction, checked once (for a stepper's hot loop).

    Calling the returned :class:`PreparedLJForces` with ``(positions,
    neighbor_list)`` returns ``(forces (3, N), energies (N,), virials
    (N,), pair_counts (N,))`` on the backend's device: the per-atom terms that
    :func:`lj_forces` sums, and each atom's neighbours inside the cutoff
    (int32; their sum is twice the interacting pairs), from the backend's
    kernel on raw arrays. Each
    call checks shapes, the dtype and that the list is for these atoms, box
    and cutoff; not that the positions are finite.

    Parameters
    ----------
    box, cutoff, epsilon, sigma, shift, backend
        As for :func:`lj_forces`.

    Examples
    --------
    >>> x = np.array([[0.0, 2.0 ** (1 / 6)], [0.0, 0.0], [0.0, 0.0]])
    >>> box = (10.0, 10.0, 10.0)
    >>> nl = build_neighbor_list(x, box, cutoff=2.5, skin=0.3, backend="numpy")
    >>> forces, energies, virials, pair_counts = prepare_lj_forces(box, cutoff=2.5, shift=False,
    ...                                                            backend="numpy")(x, nl)
    >>> round(float(energies.sum()), 12), pair_counts.tolist()
    (-1.0, [1, 1])
    """
    backend = get_backend(backend)
    box = _box(box)
    cutoff, epsilon, sigma, shift_value = _interaction(cutoff, box, epsilon, sigma, shift)
    return PreparedLJForces(backend, box, cutoff, epsilon, sigma, shift_value)
