"""Gravitational N-body kernels: softened accelerations and potentials.

Bodies are stored structure-of-arrays: ``positions`` is ``(3, N)`` (x, y, z
rows), ``masses`` is ``(N,)``; the same layout on every backend, so that a
vector lane (CPU) or a thread (GPU) reads consecutive bodies.

Accelerations on *target* bodies from all *source* bodies, with Plummer
softening ``eps``::

    a_i   =  G sum_j m_j (x_j - x_i) / (|x_j - x_i|^2 + eps^2)^(3/2)
    phi_i = -G sum_{j != i} m_j / (|x_j - x_i|^2 + eps^2)^(1/2)

A pair at zero separation with zero softening contributes nothing (rather
than infinity); with ``eps > 0`` every pair is finite. Targets are a
contiguous range of the sources (``targets=(start, stop)``), which is how a
partition of the bodies asks for the forces on its own bodies.

Methods: ``"direct"`` sums all pairs (every backend); ``"tree"`` is a
Barnes-Hut octree with quadrupole moments and opening angle ``theta`` (see
:mod:`hpcgpu.kernels.nbody.tree`).

Each backend file (``_numpy``, ``_numba``, ``_cuda``, ``_cupy``) exports::

    direct(target_positions, source_positions, source_masses, eps2, G,
           self_offset, acc_out, pot_out)

with ``self_offset`` the index in the sources of target 0 (or -1 when the
targets are not among the sources: no self term to remove) and ``pot_out``
None when the potential is not wanted. Arrays arrive validated, on the
backend's device, in one dtype.
"""

import numpy as np

from hpcgpu.backends import get_backend
from hpcgpu.errors import ConfigError
from hpcgpu.kernels.nbody.prepared import PreparedGravity
from hpcgpu.validation import check_choice, check_dtype, check_finite_array, check_float, check_int

__all__ = ["METHODS", "MIN_BODIES", "accelerations", "inverse_sqrt_variant", "softening_squared", "prepare_gravity", "PreparedGravity",
           "prepare_direct_accelerations", "sweep_variant"]

METHODS = ("direct", "tree")
"""Force methods: all-pairs summation, or a Barnes-Hut octree."""

MIN_BODIES = 2
"""Fewest bodies :func:`accelerations` accepts."""


def _bodies(backend, positions, masses):
    """Positions (3, N) and masses (N,) on the backend, checked and C-contiguous."""
    if positions is None or masses is None:
        raise ConfigError("positions and masses must be arrays, got None")
    positions = backend.asarray(positions)
    masses = backend.asarray(masses)
    if positions.ndim != 2 or positions.shape[0] != 3:
        raise ConfigError(f"positions must have shape (3, N) (x, y, z rows); got shape {positions.shape}")
    if positions.dtype.name not in ("float32", "float64"):
        raise ConfigError(f"positions must have dtype float32 or float64; got {positions.dtype}")
    n = positions.shape[1]
    if n < MIN_BODIES:
        raise ConfigError(f"positions must hold at least {MIN_BODIES} bodies; got N={n}")
    if masses.shape != (n,):
        raise ConfigError(f"masses must have shape ({n},) (one per body); got shape {masses.shape}")
    if masses.dtype != positions.dtype:
        raise ConfigError(f"masses has dtype {masses.dtype} but positions has {positions.dtype}; "
                          "both must share one dtype")
    check_finite_array("positions", positions)
    check_finite_array("masses", masses)
    if bool((masses < 0).any()):
        raise ConfigError(f"masses must be >= 0; got {int((masses < 0).sum())} negative value(s), "
                          f"the smallest {float(masses.min())}")
    xp = backend.xp
    return xp.ascontiguousarray(positions), xp.ascontiguousarray(masses)


def softening_squared(softening, dtype):
    """``softening**2`` as a float, checked to be 0 or a normal number of ``dtype``.

    Parameters
    ----------
    softening : float
        Plummer softening length, >= 0.
    dtype : str or dtype
        float32 or float64: the dtype the kernels compute in.

    Raises
    ------
    ConfigError
        ``softening < 0``, its square outside the normal range of ``dtype``,
        or a ``dtype`` other than float32 and float64.

    Examples
    --------
    >>> softening_squared(0.5, np.dtype("float32"))
    0.25
    """
    dtype = check_dtype("dtype", dtype)  # a name too, and a clear error for an integer dtype
    softening = check_float("softening", softening, minimum=0.0)
    eps2 = softening * softening
    info = np.finfo(dtype)
    if eps2 > 0 and not info.tiny <= dtype.type(eps2) <= info.max:
        raise ConfigError(
            f"softening={softening} squared is outside the normal range of {dtype.name} "
            f"({float(np.sqrt(info.tiny)):.3g} to {float(np.sqrt(info.max)):.3g}); "
            "use 0 for no softening or a value in that range")
    return eps2


def _gravitational_constant(G, dtype):
    """``G`` checked: > 0, and a normal number of ``dtype``, in which the kernels multiply by it.

    A float32 ``G`` of 1e39 would be inf and one of 1e-39 zero (or subnormal):
    accelerations of inf or 0 with no error.
    """
    G = check_float("G", G, minimum=0.0, strict_min=True)
    info = np.finfo(dtype)
    if not float(info.tiny) <= G <= float(info.max):
        raise ConfigError(f"G={G!r} is outside the normal range of {dtype.name} "
                          f"({float(info.tiny):.3g} to {float(info.max):.3g}); use units in which it fits")
    return G


def _targets(targets, n):
    if targets is None:
        return 0, n
    if not isinstance(targets, (tuple, list)) or len(targets) != 2:
        raise ConfigError(f"targets must be None or a pair (start, stop); got {targets!r}")
    start = check_int("targets start", targets[0], minimum=0)
    stop = check_int("targets stop", targets[1], maximum=n)
    if start >= stop:
        raise ConfigError(f"targets must be a non-empty range 0 <= start < stop <= N={n}; "
                          f"got ({start}, {stop})")
    return start, stop


def accelerations(positions, masses, *, softening, G=1.0, targets=None, potential=False,
                  method="direct", theta=0.5, backend="auto"):
    """Softened gravitational accelerations (and potentials) of a set of bodies.

    ``a_i = G sum_j m_j (x_j - x_i) / (|x_j - x_i|^2 + eps^2)^(3/2)`` and
    ``phi_i = -G sum_{j != i} m_j / (|x_j - x_i|^2 + eps^2)^(1/2)`` on the
    bodies ``targets`` from all bodies (Plummer softening ``eps``).

    Parameters
    ----------
    positions : array (3, N)
        x, y, z rows (length), float32 or float64; NumPy, or CuPy for GPU
        backends.
    masses : array (N,)
        Masses (mass), >= 0, same dtype as ``positions``.
    softening : float
        Plummer softening length ``eps`` (length), >= 0. With 0, a pair at
        zero separation contributes nothing.
    G : float
        Gravitational constant in the units of the inputs (> 0, a normal
        number of the dtype of ``positions``).
    targets : (int, int), optional
        Bodies ``start:stop`` to compute the accelerations on (default: all).
    potential : bool
        Also return the potential ``phi`` of each target.
    method : str
        ``"direct"`` (all pairs, every backend) or ``"tree"`` (Barnes-Hut on
        the host; GPU arrays go there and back).
    theta : float
        Opening angle of ``"tree"`` (> 0; smaller is more accurate).
    backend : str or Backend

    Returns
    -------
    acc : array (3, M)
        Accelerations (length / time**2 in units where ``G`` is given), on the
        backend's device, in the dtype of ``positions``; ``M = stop - start``.
    pot : array (M,)
        Only with ``potential=True``: ``(acc, pot)``, potential per unit mass.

    Raises
    ------
    ConfigError
        Shapes, dtypes, fewer than 2 bodies, NaN or infinite positions or
        masses, negative masses or softening, ``G`` or ``softening**2``
        outside the normal range of the dtype, a bad target range, an
        unknown method or ``theta <= 0``.

    Examples
    --------
    >>> import numpy as np
    >>> x = np.array([[0.0, 2.0], [0.0, 0.0], [0.0, 0.0]])
    >>> acc, pot = accelerations(x, np.array([1.0, 3.0]), softening=0.0, potential=True,
    ...                          backend="numpy")
    >>> acc[0].tolist(), pot.tolist()
    ([0.75, -0.25], [-1.5, -0.5])
    """
    backend = get_backend(backend)
    method = check_choice("method", method, METHODS)
    theta = check_float("theta", theta, minimum=0.0, strict_min=True)
    G = check_float("G", G, minimum=0.0, strict_min=True)
    if not isinstance(potential, (bool, np.bool_)):
        raise ConfigError(f"potential must be True or False; got {potential!r}")
    positions, masses = _bodies(backend, positions, masses)
    G = _gravitational_constant(G, positions.dtype)
    eps2 = softening_squared(softening, positions.dtype)
    start, stop = _targets(targets, positions.shape[1])
    dtype = positions.dtype
    if method == "tree":
        return _tree_method(backend, positions, masses, eps2, G, start, stop, theta, potential)
    acc = backend.empty((3, stop - start), dtype)
    pot = backend.empty((stop - start,), dtype) if potential else None
    backend.kernels("nbody").direct(positions[:, start:stop], positions, masses, eps2, G, start,
                                    acc, pot)
    return (acc, pot) if potential else acc


def _tree_method(backend, positions, masses, eps2, G, start, stop, theta, potential):
    """The Barnes-Hut method, on the host whatever the backend."""
    from hpcgpu.kernels.nbody.tree import tree

    host_positions = backend.to_host(positions)
    host_masses = backend.to_host(masses)
    dtype = host_positions.dtype
    acc = np.empty((3, stop - start), dtype)
    pot = np.empty(stop - start, dtype) if potential else None
    tree(host_positions[:, start:stop], host_positions, host_masses, eps2, G, start, theta, acc, pot)
    if potential:
        return backend.asarray(acc), backend.asarray(pot)
    return backend.asarray(acc)


def prepare_gravity(dtype, *, softening, G=1.0, method="direct", theta=0.5, backend="auto"):
    """Accelerations and potentials of bodies of ``dtype``, with the parameters checked once.

    For a stepper's hot loop: each call of the returned
    :class:`PreparedGravity` ``(positions, masses, start=0, stop=None)``
    checks only shapes, dtypes and the target range (not finiteness nor the
    sign of the masses, which :func:`accelerations` checks every call) and
    returns ``(acc, pot)`` as ``accelerations(..., targets=(start, stop),
    potential=True)`` does.

    Parameters
    ----------
    dtype : str or dtype
        float32 or float64.
    softening, G, method, theta, backend
        As for :func:`accelerations`.

    Examples
    --------
    >>> gravity = prepare_gravity("float64", softening=0.0, backend="numpy")
    >>> x = np.array([[0.0, 2.0], [0.0, 0.0], [0.0, 0.0]])
    >>> acc, pot = gravity(x, np.array([1.0, 3.0]))
    >>> acc[0].tolist(), pot.tolist()
    ([0.75, -0.25], [-1.5, -0.5])
    """
    backend = get_backend(backend)
    dtype = check_dtype("dtype", dtype)
    method = check_choice("method", method, METHODS)
    theta = check_float("theta", theta, minimum=0.0, strict_min=True)
    G = _gravitational_constant(G, dtype)
    return PreparedGravity(backend, dtype, softening_squared(softening, dtype), G, method, theta)


def prepare_direct_accelerations(positions, masses, *, softening, G=1.0, targets=None, backend="auto"):
    """The direct sum over fixed bodies as a call without arguments: the fast path a benchmark times.

    The bodies, softening, G and target range are checked (as by
    :func:`accelerations`) and put on the device once; each call of the
    returned function sums all pairs by ``"direct"`` into the same ``(3, M)``
    array (no potential, no allocation) and returns it, with the numbers
    :func:`accelerations` gives.

    Examples
    --------
    >>> x = np.array([[0.0, 2.0], [0.0, 0.0], [0.0, 0.0]])
    >>> evaluate = prepare_direct_accelerations(x, np.array([1.0, 3.0]), softening=0.0, backend="numpy")
    >>> evaluate()[0].tolist()
    [0.75, -0.25]
    """
    backend = get_backend(backend)
    G = check_float("G", G, minimum=0.0, strict_min=True)
    positions, masses = _bodies(backend, positions, masses)
    G = _gravitational_constant(G, positions.dtype)
    eps2 = softening_squared(softening, positions.dtype)
    start, stop = _targets(targets, positions.shape[1])
    target_positions = backend.xp.ascontiguousarray(positions[:, start:stop])
    acc = backend.empty((3, stop - start), positions.dtype)
    direct = backend.kernels("nbody").direct

    def evaluate():
        direct(target_positions, positions, masses, eps2, G, start, acc, None)
        return acc

    return evaluate


def inverse_sqrt_variant(dtype):
    """The float64 inverse square root the ``numba`` backend runs on this machine.

    ``"bit_trick"`` or ``"divide"``, timed once per machine by
    :mod:`hpcgpu.autotune` (float32 and ``HPCGPU_AUTOTUNE=0``: ``"bit_trick"``).

    Examples
    --------
    >>> inverse_sqrt_variant("float32")
    'bit_trick'
    """
    return get_backend("numba").kernels("nbody").inverse_sqrt_variant(np.dtype(dtype))


def sweep_variant(dtype):
    """The float32 direct-sum sweep the ``numba`` backend runs on this machine.

    ``"auto_vectorized"`` (the compiler's), ``"explicit_avx2"`` or
    ``"explicit_avx512"`` (:mod:`hpcgpu.kernels.nbody.simd`), timed once per
    machine by :mod:`hpcgpu.autotune` among those the CPU has (float64 and
    ``HPCGPU_AUTOTUNE=0``: ``"auto_vectorized"``).

    Examples
    --------
    >>> sweep_variant("float64")
    'auto_vectorized'
    """
    return get_backend("numba").kernels("nbody").sweep_variant(np.dtype(dtype))
