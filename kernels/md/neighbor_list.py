"""Verlet neighbour lists of the MD family: :class:`NeighborList`, its build, and when to rebuild it.

The list conventions (full lists, the backends' memory layouts, capacity
that grows and never truncates, valid until an atom moves ``skin / 2``)
are the family's, stated in :mod:`hpcgpu.kernels.md`; this module builds
and checks lists. The public names are re-exported there.

Examples
--------
>>> import numpy as np
>>> from hpcgpu.kernels.md import build_neighbor_list, needs_rebuild
>>> x = np.array([[0.0, 1.0, 5.0], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
>>> nl = build_neighbor_list(x, (10.0, 10.0, 10.0), cutoff=2.5, skin=0.3, backend="numpy")
>>> nl.counts.tolist(), needs_rebuild(nl, x + 0.1)
([1, 1, 0], True)
"""

import math
from dataclasses import dataclass

import numpy as np

from hpcgpu.backends import get_backend
from hpcgpu.errors import ConfigError
from hpcgpu.kernels.md.box import check_box as _box
from hpcgpu.kernels.md.verlet import FAST_PATHS
from hpcgpu.validation import check_count, check_finite_array, check_float, check_int

__all__ = ["CAPACITY_HEADROOM", "CAPACITY_ROUND", "NeighborList", "build_neighbor_list", "largest_displacement_squared",
           "largest_reach_squared", "needs_rebuild"]


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
        capacity = check_count("capacity", self.capacity, dtype="int32")
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
        Columns to start with, ``1 <= capacity <= 2**31 - 1`` (the kernels'
        int32 counts); default: the mean number of neighbours
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
        ``skin <= 0``, ``cutoff > min(box) / 2``, a capacity outside
        ``1..2**31 - 1``.

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
        # the kernels count neighbours in int32 (and the CUDA C kernel takes the capacity as an int)
        capacity = check_count("capacity", capacity, dtype="int32")
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

    Parameters
    ----------
    positions : array (3, N)
        Current positions (length).
    reference : array (3, M), M >= N
        Positions to measure from (length), e.g. a list's reference positions.
    box : sequence of 3 floats
        The periodic box ``(Lx, Ly, Lz)`` (length), each side finite and > 0.
    backend : str or Backend, optional
        Whose one-pass kernel to use where it has one (Numba); the answer is
        the same.

    Returns
    -------
    float
        Squared length (length**2).

    Raises
    ------
    ConfigError
        Arrays not ``(3, N)``, a shorter reference, a box that is not three
        finite sides > 0.

    Examples
    --------
    >>> x = np.array([[0.1, 9.9], [0.0, 0.0], [0.0, 0.0]])
    >>> round(largest_displacement_squared(x, np.zeros((3, 2)), (10.0, 10.0, 10.0)), 12)
    0.01
    """
    # O(1) (this runs every step): a shorter reference would be read beyond its end by the Numba pass,
    # and so would a box of two sides; a side of 0, inf or NaN made the answer NaN or 0 (no rebuild)
    box = _box(box)
    for name, array in (("positions", positions), ("reference", reference)):
        if getattr(array, "ndim", None) != 2 or array.shape[0] != 3:
            raise ConfigError(f"{name} must have shape (3, N); got "
                              f"{tuple(array.shape) if hasattr(array, 'shape') else type(array).__name__}")
    n = positions.shape[1]
    if reference.shape[1] < n:
        raise ConfigError(f"reference must have at least the {n} columns of positions; "
                          f"got shape {tuple(reference.shape)}")
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


def largest_reach_squared(positions, reference, velocities, forces, box, steps, dt, margin=1.0, *, backend=None):
    """The largest squared displacement since ``reference``, and the largest squared bound on it ``steps`` on.

    An atom at ``x_n`` with the half-step velocity ``v`` (velocity Verlet,
    unit mass, after the drift) is ``steps`` steps later within
    ``steps dt |v| + dt^2 steps (steps + 1) / 2 max|f|`` of ``x_n``. The bound per atom is its
    minimum-image displacement ``|d|`` plus ``margin`` times that motion
    with the current force ``|f|`` standing for the largest on the way
    (``margin`` > 1 leaves room for forces that grow). A decomposition
    that decides a rebuild ``steps`` steps late triggers on it.

    Parameters
    ----------
    positions, velocities, forces : arrays (3, N)
        Positions (length), velocities (length/time), forces (force; mass 1).
    reference : array (3, M), M >= N
        Positions at the last build (length); the first N are used.
    box : sequence of 3 floats
        The periodic box (length).
    steps : int
        How many steps ahead (>= 0); 0 gives ``|d|`` itself.
    dt : float
        Time step (time).
    margin : float
        Factor on the motion term.
    backend : str or Backend, optional
        Whose one-pass kernel to use where it has one (Numba, Numba-CUDA);
        the same answer to rounding.

    Returns
    -------
    (float, float)
        ``max |d|^2`` and ``max (|d| + margin motion)^2`` (length**2); one host transfer.

    Examples
    --------
    >>> x = np.array([[0.1, 9.9], [0.0, 0.0], [0.0, 0.0]])
    >>> v = np.array([[0.0, 0.0], [2.0, 0.0], [0.0, 0.0]])
    >>> now, ahead = largest_reach_squared(x, np.zeros((3, 2)), v, np.zeros((3, 2)), (10.0,) * 3, 3, 0.01)
    >>> round(now, 12), round(ahead, 12)
    (0.01, 0.0256)
    """
    box = _box(box)
    n = positions.shape[1]
    if n == 0:
        return 0.0, 0.0
    ahead_v, ahead_f = margin * steps * dt, margin * dt * dt * steps * (steps + 1) / 2
    if backend is not None and get_backend(backend).name in FAST_PATHS["largest_reach_squared"]:
        return get_backend(backend).kernels("md").largest_reach_squared(positions, reference, velocities, forces,
                                                                        box, ahead_v, ahead_f)
    xp = _array_module(positions)
    # whole (3, N) expressions: about 20 kernels on a GPU (each a launch), not 3 x that axis by axis
    lengths = xp.asarray(np.asarray(box, dtype=positions.dtype)[:, None])
    d = positions - reference[:, :n]
    d -= lengths * xp.rint(d / lengths)
    moved = (d * d).sum(axis=0)
    speed = xp.sqrt((velocities * velocities).sum(axis=0))
    pull = xp.sqrt((forces * forces).sum(axis=0))
    reach = xp.sqrt(moved) + ahead_v * speed + ahead_f * pull
    both = xp.stack([moved.max(), (reach * reach).max()])
    now, ahead = (float(v) for v in (both.get() if hasattr(both, "get") else both))
    return now, ahead
