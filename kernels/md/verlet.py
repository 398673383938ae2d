"""Velocity-Verlet passes over the atoms and Lennard-Jones forces checked once, for a stepper's hot loop.

:func:`verlet_drift` and :func:`verlet_kick` run on every backend: one fused
pass where the backend has one (:data:`FAST_PATHS`), the NumPy expressions
otherwise, bitwise the same. :class:`PreparedLJForces` checks the
interaction (box, cutoff, epsilon, sigma, shift) once and per call only what
is cheap (shapes, dtypes, the list's size, box and cutoff), then hands raw
arrays to the backend's force kernel; :func:`hpcgpu.kernels.md.lj_forces`
also checks that the positions are finite and sums the totals, which a
stepper does not need every step.
"""

import numpy as np

from hpcgpu.backends import get_backend
from hpcgpu.errors import ConfigError
from hpcgpu.kernels.md.box import check_box
from hpcgpu.validation import check_float

__all__ = ["FAST_PATHS", "PreparedLJForces", "verlet_drift", "verlet_kick", "wrap"]

FAST_PATHS = {"verlet_drift": ("numba",), "verlet_kick": ("numba",), "largest_displacement_squared": ("numba",),
              "largest_reach_squared": ("numba", "cuda")}
"""Per-atom passes with a fused kernel, by name, and the backends that have it
(one parallel loop instead of about 25 NumPy array passes; the same numbers)."""


def _atoms(name, array, n=None, dtype=None):
    """``array`` checked to be ``(3, n)`` of ``dtype``; without ``dtype``, of float32 or float64.

    O(1): these run every step. An integer array would not be refused by the
    arithmetic but truncated by a compiled pass (and not by NumPy).
    """
    if getattr(array, "ndim", None) != 2 or array.shape[0] != 3 or (n is not None and array.shape[1] != n):
        raise ConfigError(f"{name} must have shape (3, {'N' if n is None else n}); got "
                          f"{tuple(array.shape) if hasattr(array, 'shape') else type(array).__name__}")
    if dtype is None and array.dtype.name not in ("float32", "float64"):
        raise ConfigError(f"{name} must have dtype float32 or float64; got {array.dtype}")
    if dtype is not None and array.dtype != dtype:
        raise ConfigError(f"{name} has dtype {array.dtype}; expected {dtype}")
    return array


def wrap(xp, box, positions, images):
    """Wrap positions ``(3, N)`` into ``[0, L)`` in place, adding the images crossed to ``images``.

    Returns ``(positions, images)``; ``positions + images * box`` is unchanged
    (to rounding).

    Parameters
    ----------
    xp : module
        The arrays' module (NumPy or CuPy).
    box : sequence of 3 floats
        The periodic box ``(Lx, Ly, Lz)`` (length), each side finite and > 0.
    positions : array (3, N)
        Wrapped in place.
    images : int64 array (3, N)
        The images crossed so far, updated in place.

    Raises
    ------
    ConfigError
        A box that is not three finite sides > 0 (:func:`.box.check_box`).
    """
    box = check_box(box)  # a side of 0 divides by zero, a negative or inf one wraps into garbage
    for axis, length in enumerate(box):
        x = positions[axis]
        shift = xp.floor(x * (1.0 / length))
        x -= shift * length
        # x just below 0 can round to exactly L
        over = (x >= length).astype(x.dtype)
        x -= over * length
        images[axis] += (shift + over).astype(np.int64)
    return positions, images


def verlet_drift(positions, velocities, forces, images, box, dt, *, backend="auto"):
    """Half kick, drift and wrap of every atom; returns new ``(positions, velocities, images)``.

    ``v' = v + f dt/2``, ``x' = x + v' dt`` wrapped into ``[0, L)`` with the
    images crossed added to ``images`` (the inputs are not modified).

    Parameters
    ----------
    positions, velocities, forces : arrays (3, N)
        One float dtype, on the backend's device (length, length/time, energy/length; unit mass).
    images : int64 array (3, N)
        Box images crossed so far.
    box : sequence of 3 floats
        The periodic box ``(Lx, Ly, Lz)`` (length), each side finite and > 0.
    dt : float
        Time step (time), > 0.
    backend : str or Backend

    Raises
    ------
    ConfigError
        Shapes or dtypes that do not match, a dtype other than float32 and
        float64, a box that is not three finite sides > 0, ``dt <= 0``.

    Examples
    --------
    >>> import numpy as np
    >>> x, v = np.array([[9.5], [0.0], [0.0]]), np.array([[1.0], [0.0], [0.0]])
    >>> p, w, i = verlet_drift(x, v, np.zeros((3, 1)), np.zeros((3, 1), np.int64), (10.0,) * 3, 1.0,
    ...                        backend="numpy")
    >>> float(p[0, 0]), int(i[0, 0])
    (0.5, 1)
    """
    backend = get_backend(backend)
    # Checked here, once for every backend: the Numba pass read a box of two sides beyond its end.
    box = check_box(box)
    dt = check_float("dt", dt, minimum=0.0, strict_min=True)
    n = _atoms("positions", positions).shape[1]
    _atoms("velocities", velocities, n, positions.dtype)
    _atoms("forces", forces, n, positions.dtype)
    _atoms("images", images, n, np.dtype(np.int64))
    if backend.name in FAST_PATHS["verlet_drift"]:
        return backend.kernels("md").verlet_drift(positions, velocities, forces, images, box, dt)
    half = 0.5 * dt
    velocities = velocities + forces * half
    positions = positions + velocities * dt
    positions, images = wrap(backend.xp, box, positions, images.copy())
    return positions, velocities, images


def verlet_kick(velocities, forces, dt, *, backend="auto"):
    """The closing half kick ``v + f dt/2`` as a new array (velocities and forces ``(3, N)``, one dtype).

    Examples
    --------
    >>> import numpy as np
    >>> verlet_kick(np.ones((3, 2)), np.ones((3, 2)), 0.5, backend="numpy")[0].tolist()
    [1.25, 1.25]
    """
    backend = get_backend(backend)
    dt = check_float("dt", dt, minimum=0.0, strict_min=True)
    n = _atoms("velocities", velocities).shape[1]
    _atoms("forces", forces, n, velocities.dtype)
    if backend.name in FAST_PATHS["verlet_kick"]:
        return backend.kernels("md").verlet_kick(velocities, forces, dt)
    return velocities + forces * (0.5 * dt)


class PreparedLJForces:
    """Per-atom Lennard-Jones forces, energies and virials for one interaction, checked once.

    Built by :func:`hpcgpu.kernels.md.prepare_lj_forces`. Calling it with
    positions ``(3, N)`` and a :class:`~hpcgpu.kernels.md.NeighborList`
    returns ``(forces (3, N), energies (N,), virials (N,), pair_counts
    (N,))`` on the backend's device, each pair's energy and virial split
    between its atoms as :func:`~hpcgpu.kernels.md.lj_forces` sums them,
    and each atom's neighbours inside the cutoff (int32). The positions are not
    checked for NaN (a stepper's instability check sees those).
    """

    def __init__(self, backend, box, cutoff, epsilon, sigma, shift_value):
        self.backend = backend
        self.box = box
        self.cutoff = cutoff
        self.epsilon = epsilon
        self.sigma = sigma
        self.shift_value = shift_value
        self._cutoff2 = cutoff**2
        self._kernels = backend.kernels("md")

    def __getstate__(self):
        # the backend file (a module) does not pickle: workers look it up again
        return {key: value for key, value in self.__dict__.items() if key != "_kernels"}

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._kernels = self.backend.kernels("md")

    def __call__(self, positions, neighbor_list):
        n = _atoms("positions", positions).shape[1]
        if positions.dtype.name not in ("float32", "float64"):
            raise ConfigError(f"positions must have dtype float32 or float64; got {positions.dtype}")
        if neighbor_list.size != n:
            raise ConfigError(f"neighbor_list was built for {neighbor_list.size} atoms; positions hold {n}")
        if neighbor_list.box != self.box or neighbor_list.cutoff < self.cutoff:
            raise ConfigError(f"the neighbour list was built for box {neighbor_list.box} and cutoff "
                              f"{neighbor_list.cutoff}; these forces need box {self.box} and cutoff "
                              f">= {self.cutoff}")
        b = self.backend
        forces, energies, virials = b.empty((3, n), positions.dtype), b.empty((n,), positions.dtype), \
            b.empty((n,), positions.dtype)
        pair_counts = b.empty((n,), np.int32)
        self._kernels.forces(positions, self.box, neighbor_list.neighbors, neighbor_list.counts, self._cutoff2,
                             self.epsilon, self.sigma, self.shift_value, forces, energies, virials, pair_counts)
        return forces, energies, virials, pair_counts
