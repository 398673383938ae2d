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

Public functions (validation once, dispatch on ``backend=``):

``build_neighbor_list(positions, box, *, cutoff, skin, capacity=None, backend)``
    -> :class:`NeighborList`
``needs_rebuild(neighbor_list, positions, backend=None)`` -> bool
``largest_displacement_squared(positions, reference, box, backend=None)`` -> float
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
           energy_shift, forces_out, energy_out, virial_out)
        # per-atom arrays: energy_out (N,) holds half of each pair's energy,
        # virial_out (N,) half of each pair's r . f, so sums give the totals

and may export, where one pass beats the NumPy expressions (Numba)::

    verlet_drift(positions, velocities, forces, images, box, dt)
        -> (positions, velocities, images)   # half kick, drift, wrap; new arrays
    verlet_kick(velocities, forces, dt) -> velocities   # v + f dt/2, a new array
    largest_displacement_squared(positions, reference, box) -> float
"""

import math
from dataclasses import dataclass

import numpy as np

from hpcgpu.backends import get_backend
from hpcgpu.errors import ConfigError
from hpcgpu.kernels.md.box import check_box as _box
from hpcgpu.kernels.md.sorting import cell_order
from hpcgpu.kernels.md.verlet import FAST_PATHS, PreparedLJForces, verlet_drift, verlet_kick
from hpcgpu.kernels.md.verlet import wrap as wrap_into_box
from hpcgpu.validation import check_finite_array, check_float, check_int

__all__ = [
    "NeighborList",
    "build_neighbor_list",
    "needs_rebuild",
    "largest_displacement_squared",
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

CAPACITY_HEADROOM = 1.2
"""A list that overflowed is rebuilt with room for this many times the largest
count (plus :data:`CAPACITY_ROUND`), so that the next builds of a running
simulation, whose counts fluctuate, do not overflow again."""

CAPACITY_ROUND = 8
"""Capacities are rounded up to a multiple of this (aligned rows)."""


@dataclass(frozen=True, eq=False)
class NeighborList:
    """A full Verlet neighbour list and what it was built for.

    Build it with :func:`build_neighbor_list`; it is valid (checked) as soon
    as it is constructed, pickles to dask workers, and is never modified:
    a rebuild makes a new one.

    Attributes
    ----------
    neighbors : int32 array (N, capacity)
        Row ``i`` lists, in its first ``counts[i]`` entries, every atom
        closer to atom ``i`` than ``cutoff + skin`` (minimum image) at build
        time; each pair appears in both rows. The order within a row is
        deterministic (backend-specific); entries past the count are unused.
        C-ordered when built by a CPU backend, Fortran-ordered (column-major)
        by a GPU backend; any layout is accepted.
    counts : int32 array (N,)
        Neighbours of each atom, all ``<= capacity``.
    reference_positions : array (3, N)
        A copy of the positions the list was built from (for
        :func:`needs_rebuild`).
    box : tuple of 3 floats
        The orthorhombic periodic box ``(Lx, Ly, Lz)`` (length).
    cutoff : float
        The interaction cutoff the list serves (length).
    skin : float
        Extra radius (length): the list stays valid until an atom has moved
        more than ``skin / 2``.
    capacity : int
        Columns of ``neighbors``.
    """

    neighbors: object
    counts: object
    reference_positions: object
    box: tuple
    cutoff: float
    skin: float
    capacity: int

    def __post_init__(self):
        box = _box(self.box)
        object.__setattr__(self, "box", box)
        object.__setattr__(self, "cutoff", _cutoff(self.cutoff, box))
        object.__setattr__(self, "skin", check_float("skin", self.skin, minimum=0.0, strict_min=True))
        capacity = check_int("capacity", self.capacity, minimum=1)
        object.__setattr__(self, "capacity", capacity)
        n = self.counts.shape[0] if getattr(self.counts, "ndim", 0) == 1 else -1
        if n < 1 or self.counts.dtype != np.int32:
            raise ConfigError(f"counts must be an int32 array of shape (N,) with N >= 1; got "
                              f"{getattr(self.counts, 'dtype', type(self.counts))} of shape "
                              f"{getattr(self.counts, 'shape', None)}")
        if self.neighbors.shape != (n, capacity) or self.neighbors.dtype != np.int32:
            raise ConfigError(f"neighbors must be an int32 array of shape ({n}, {capacity}) "
                              f"(atoms, capacity); got {self.neighbors.dtype} of shape "
                              f"{self.neighbors.shape}")
        if getattr(self.reference_positions, "shape", None) != (3, n):
            raise ConfigError(f"reference_positions must have shape (3, {n}); got "
                              f"{getattr(self.reference_positions, 'shape', None)}")
        largest = int(self.counts.max())
        if largest > capacity or int(self.counts.min()) < 0:
            raise ConfigError(f"counts must lie in 0..capacity={capacity}; the largest is {largest}: "
                              "an overflowed list would drop pairs (build_neighbor_list grows it)")

    @property
    def radius(self):
        """``cutoff + skin``: the radius the list was built with (length)."""
        return self.cutoff + self.skin

    @property
    def size(self):
        """Number of atoms N."""
        return self.counts.shape[0]


def _cutoff(cutoff, box):
    cutoff = check_float("cutoff", cutoff, minimum=0.0, strict_min=True)
    if cutoff > min(box) / 2:
        raise ConfigError(f"cutoff={cutoff} must be <= half the smallest box side "
                          f"(min(box) / 2 = {min(box) / 2}): the minimum image would miss pairs; "
                          "use a bigger box or a smaller cutoff")
    return cutoff


def _positions(backend, positions, name="positions"):
    """Positions (3, N) on the backend, checked, C-contiguous."""
    if positions is None:
        raise ConfigError(f"{name} must be an array of shape (3, N), got None")
    positions = backend.asarray(positions)
    if positions.ndim != 2 or positions.shape[0] != 3 or positions.shape[1] < 1:
        raise ConfigError(f"{name} must have shape (3, N) (x, y, z rows) with N >= 1; "
                          f"got shape {positions.shape}")
    if positions.dtype.name not in ("float32", "float64"):
        raise ConfigError(f"{name} must have dtype float32 or float64; got {positions.dtype}")
    check_finite_array(name, positions)
    return backend.xp.ascontiguousarray(positions)


def _round_capacity(capacity, n):
    """``capacity`` rounded up to :data:`CAPACITY_ROUND`, at most the N - 1 possible neighbours."""
    capacity = -(-int(capacity) // CAPACITY_ROUND) * CAPACITY_ROUND
    return max(1, min(capacity, n - 1))


def _estimated_capacity(n, box, radius):
    """Room for the neighbours of an atom at the mean density, with headroom."""
    expected = n / (box[0] * box[1] * box[2]) * 4.0 / 3.0 * math.pi * radius**3
    return _round_capacity(math.ceil(1.3 * expected) + 2 * CAPACITY_ROUND, n)


def build_neighbor_list(positions, box, *, cutoff, skin, capacity=None, rows=None, backend="auto"):
    """Full neighbour list of every atom within ``cutoff + skin`` (minimum image).

    Built from cell lists (brute force on the ``numpy`` reference). A row
    that would overflow ``capacity`` makes the list be rebuilt with more room
    (:data:`CAPACITY_HEADROOM` times the largest count): pairs are never
    dropped.

    Parameters
    ----------
    positions : array (3, N)
        x, y, z rows (length), float32 or float64, on the backend's device;
        any periodic image (need not be wrapped into the box).
    box : sequence of 3 floats
        Orthorhombic periodic box ``(Lx, Ly, Lz)`` (length).
    cutoff : float
        Interaction cutoff (length), ``0 < cutoff <= min(box) / 2``.
    skin : float
        Verlet skin (length), > 0: the list holds pairs closer than
        ``cutoff + skin`` and stays valid until an atom has moved more than
        ``skin / 2`` (see :func:`needs_rebuild`).
    capacity : int, optional
        Columns to start with (>= 1); default: the mean number of neighbours
        at this density with 30 % headroom. Pass the previous list's
        ``capacity`` when rebuilding in a simulation.
    rows : int, optional
        Build the rows of the first ``rows`` atoms only (``0 <= rows <= N``);
        the others come back empty (count 0) but still appear in those
        rows: a slab's ghost atoms, whose own forces nobody needs. Default:
        every atom. Backends with a row-limited kernel (Numba) skip the
        work; the others build every row and empty the rest.
    backend : str or Backend

    Returns
    -------
    NeighborList
        Arrays on the backend's device; ``capacity`` is the one it ended with.

    Raises
    ------
    ConfigError
        Shapes, dtypes, NaN or infinite positions, a bad box, ``cutoff`` or
        ``skin <= 0``, ``cutoff > min(box) / 2``, ``capacity < 1``.

    Examples
    --------
    >>> import numpy as np
    >>> x = np.array([[0.0, 1.0, 5.0], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    >>> nl = build_neighbor_list(x, (10.0, 10.0, 10.0), cutoff=2.5, skin=0.3, backend="numpy")
    >>> nl.counts.tolist(), nl.neighbors[0, :1].tolist()
    ([1, 1, 0], [1])
    """
    backend = get_backend(backend)
    box = _box(box)
    cutoff = _cutoff(cutoff, box)
    skin = check_float("skin", skin, minimum=0.0, strict_min=True)
    positions = _positions(backend, positions)
    n = positions.shape[1]
    rows = n if rows is None else check_int("rows", rows, minimum=0, maximum=n)
    radius = cutoff + skin
    if capacity is None:
        capacity = _estimated_capacity(n, box, radius)
    else:
        capacity = check_int("capacity", capacity, minimum=1)
    kernels = backend.kernels("md")
    order = getattr(kernels, "NEIGHBOR_ORDER", "C")
    limited = getattr(kernels, "build_neighbors_rows", None)
    counts = backend.empty((n,), np.int32)
    while True:
        neighbors = backend.xp.empty((n, capacity), np.int32, order=order)
        if limited is not None and rows < n:
            largest = int(limited(positions, box, radius, neighbors, counts, rows))
        else:
            largest = int(kernels.build_neighbors(positions, box, radius, neighbors, counts))
            counts[rows:] = 0
        if largest <= capacity:
            break
        capacity = _round_capacity(math.ceil(CAPACITY_HEADROOM * largest) + CAPACITY_ROUND, n)
    return NeighborList(neighbors, counts, positions.copy(), box, cutoff, skin, capacity)


def needs_rebuild(neighbor_list, positions, backend=None):
    """Whether some atom has moved more than ``skin / 2`` since the list was built.

    The displacement is the minimum image of ``positions - reference``, so
    wrapping positions into the box does not trigger a rebuild. Runs where
    the arrays are (NumPy or CuPy; one reduction, one host sync).

    Parameters
    ----------
    neighbor_list : NeighborList
    positions : array (3, N)
        Current positions, same shape as the list's reference positions.
    backend : str or Backend, optional
        Whose one-pass kernel to use where it has one (Numba); the answer
        is the same.

    Returns
    -------
    bool

    Raises
    ------
    ConfigError
        Not a NeighborList, or positions of another shape.
    """
    if not isinstance(neighbor_list, NeighborList):
        raise ConfigError(f"neighbor_list must be a NeighborList; got {type(neighbor_list).__name__}")
    reference = neighbor_list.reference_positions
    if getattr(positions, "shape", None) != reference.shape:
        raise ConfigError(f"positions must have the shape of the list's reference positions "
                          f"{reference.shape}; got {getattr(positions, 'shape', None)}")
    limit = 0.5 * neighbor_list.skin
    largest = largest_displacement_squared(positions, reference, neighbor_list.box, backend=backend)
    return largest > limit * limit


def largest_displacement_squared(positions, reference, box, *, backend=None):
    """Largest squared minimum-image distance between matching columns of two ``(3, N)`` arrays.

    ``reference`` may have more columns; its first N are used. Computed in
    the positions' dtype (the same roundings on every backend).

    Examples
    --------
    >>> x = np.array([[0.1, 9.9], [0.0, 0.0], [0.0, 0.0]])
    >>> round(largest_displacement_squared(x, np.zeros((3, 2)), (10.0, 10.0, 10.0)), 12)
    0.01
    """
    n = positions.shape[1]
    if n == 0:
        return 0.0
    reference = reference[:, :n]
    if backend is not None and get_backend(backend).name in FAST_PATHS["largest_displacement_squared"]:
        return get_backend(backend).kernels("md").largest_displacement_squared(positions, reference, box)
    xp = _array_module(positions)
    largest = 0.0
    for axis in range(3):
        length = box[axis]
        d = positions[axis] - xp.asarray(reference[axis])
        d -= length * xp.rint(d * (1.0 / length))
        largest = largest + d * d
    return float(largest.max())


def _array_module(array):
    if type(array).__module__.split(".")[0] == "cupy":
        import cupy
        return cupy
    return np


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
        epsilon or sigma <= 0, a list built for other atoms, another box or
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
                   shift_value, forces, energy, virial)
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
    n = positions.shape[1]
    dtype = positions.dtype
    forces = backend.empty((3, n), dtype)
    energy = backend.empty((n,), dtype)
    virial = backend.empty((n,), dtype)
    _numpy.forces_all_pairs(positions, box, cutoff * cutoff, epsilon, sigma, shift_value,
                            forces, energy, virial)
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
    (N,))`` on the backend's device: the per-atom terms that
    :func:`lj_forces` sums, from the backend's kernel on raw arrays. Each
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
    >>> forces, energies, virials = prepare_lj_forces(box, cutoff=2.5, shift=False, backend="numpy")(x, nl)
    >>> round(float(energies.sum()), 12)
    -1.0
    """
    backend = get_backend(backend)
    box = _box(box)
    cutoff, epsilon, sigma, shift_value = _interaction(cutoff, box, epsilon, sigma, shift)
    return PreparedLJForces(backend, box, cutoff, epsilon, sigma, shift_value)
