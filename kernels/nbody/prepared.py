"""Gravity checked once, for a stepper's hot loop.

:func:`hpcgpu.kernels.nbody.accelerations` checks every call's bodies (finite
positions and masses, no negative mass: reductions, and a device
synchronisation on a GPU). :class:`PreparedGravity` checks the softening, G,
method and dtype once, and per call only the shapes and dtypes.
"""

import numpy as np

from hpcgpu.errors import ConfigError

__all__ = ["PreparedGravity"]


class PreparedGravity:
    """Accelerations and potentials of bodies ``start:stop`` from all bodies, checked once.

    Built by :func:`hpcgpu.kernels.nbody.prepare_gravity`. Calling it with
    positions ``(3, N)``, masses ``(N,)`` and a target range returns
    ``(acc (3, M), pot (M,))`` on the backend's device, as
    ``accelerations(..., targets=(start, stop), potential=True)`` does.

    Unlike :func:`~hpcgpu.kernels.nbody.accelerations`, it takes any number
    of bodies, none included, and an empty target range ``start == stop``
    (a partition without bodies): that returns empty ``(3, 0)`` and
    ``(0,)`` arrays of the dtype on every backend, without a kernel launch.
    """

    def __init__(self, backend, dtype, eps2, G, method, theta):
        self.backend = backend
        self.dtype = dtype
        self.eps2 = eps2
        self.G = G
        self.method = method
        self.theta = theta

    def __call__(self, positions, masses, start=0, stop=None):
        n = masses.shape[0] if masses.ndim == 1 else -1
        if positions.ndim != 2 or positions.shape[0] != 3 or positions.shape[1] != n:
            raise ConfigError(f"positions (3, N) and masses (N,) do not match: {tuple(positions.shape)} and "
                              f"{tuple(masses.shape)}")
        if positions.dtype != self.dtype or masses.dtype != self.dtype:
            raise ConfigError(f"positions and masses must be {self.dtype}; got {positions.dtype} and "
                              f"{masses.dtype}")
        stop = n if stop is None else stop
        if not 0 <= start <= stop <= n:
            raise ConfigError(f"targets must be a range 0 <= start <= stop <= N={n}; got ({start}, {stop})")
        return gravity(self.backend, positions, masses, self.eps2, self.G, start, stop, self.method,
                       self.theta)


def gravity(backend, positions, masses, eps2, G, start, stop, method, theta):
    """``(acc, pot)`` of bodies ``start:stop`` on checked, C-contiguous arrays."""
    xp = backend.xp
    if stop == start:
        # Nothing to compute: no launch, whose grid would have no slices of sources on a GPU
        # (the NumPy kernel divided by the number of sources), the same empty result everywhere.
        return backend.empty((3, 0), positions.dtype), backend.empty((0,), positions.dtype)
    # a no-op on the C-contiguous arrays of a model; a Fortran-ordered or strided one would be
    # refused by the CUDA kernel's transfer ("non-contiguous buffer") deep inside Numba
    positions, masses = xp.ascontiguousarray(positions), xp.ascontiguousarray(masses)
    targets = xp.ascontiguousarray(positions[:, start:stop])
    if method == "direct":
        acc = xp.empty((3, stop - start), dtype=positions.dtype)
        pot = xp.empty(stop - start, dtype=positions.dtype)
        backend.kernels("nbody").direct(targets, positions, masses, eps2, G, start, acc, pot)
        return acc, pot
    from hpcgpu.kernels.nbody.tree import tree

    host = backend.to_host
    dtype = positions.dtype
    acc, pot = np.empty((3, stop - start), dtype), np.empty(stop - start, dtype)
    tree(np.ascontiguousarray(host(targets)), np.ascontiguousarray(host(positions)), host(masses), eps2, G,
         start, theta, acc, pot)
    return backend.asarray(acc), backend.asarray(pot)
