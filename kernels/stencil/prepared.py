"""Shallow-water stages and SSP-RK3 steps checked once, for a stepper's hot loop.

:func:`hpcgpu.kernels.stencil.shallow_water_stage` checks every argument on
every call (dtypes, shapes, overlap of outputs and inputs, boundary names):
right for a single call, a measurable share of a small grid's step in a loop
of thousands. :class:`PreparedShallowWater` checks the parameters that do not
change (physics, spacing, boundary, Coriolis row, dtype, width) once, and per
call only what is cheap (the arrays' dtype and shape), then hands raw arrays
to the backend's kernels.
"""

import numpy as np

from hpcgpu.errors import ConfigError
from hpcgpu.kernels.stencil.boundary import CODES, NAMES

__all__ = ["FAST_PATHS", "PreparedShallowWater"]

FAST_PATHS = {"shallow_water_rk3_step": ("numba",)}
"""Optional fused kernels of the family, by name, and the backends that have
them. ``shallow_water_rk3_step`` does the three SSP-RK3 stages in one sweep
over memory, bitwise the same as three :func:`shallow_water_stage` calls;
:meth:`PreparedShallowWater.rk3_step` uses it where the backend has it."""


class PreparedShallowWater:
    """Shallow-water stages and SSP-RK3 steps on ``(rows, nx)`` fields of one dtype.

    Built by :func:`hpcgpu.kernels.stencil.prepare_shallow_water`, which
    checks its parameters once.

    Attributes
    ----------
    fused : bool
        Whether :meth:`rk3_step` runs the backend's fused kernel (see
        :data:`FAST_PATHS`); without it, it runs three stages.
    """

    def __init__(self, backend, nx, dtype, f_corner, physics, boundary):
        self.backend = backend
        self.nx = nx
        self.dtype = dtype
        self.f_corner = f_corner
        self.physics = physics
        self.boundary = boundary
        self._kernels = backend.kernels("stencil")
        self.fused = backend.name in FAST_PATHS["shallow_water_rk3_step"]

    def __getstate__(self):
        # the backend file (a module) does not pickle: workers look it up again
        return {key: value for key, value in self.__dict__.items() if key != "_kernels"}

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._kernels = self.backend.kernels("stencil")

    def _window(self, arrays, rows, cols):
        """The rows ``lo:hi`` of each array (and of the Coriolis corners), checked; ``cols`` checked too."""
        if cols is not None and not 0 <= cols[0] < cols[1] <= self.nx:
            raise ConfigError(f"cols must be (lo, hi) with 0 <= lo < hi <= {self.nx} (the fields' width); "
                              f"got {tuple(cols)}")
        lo, hi = rows
        window = (slice(lo, hi),)
        out = []
        for array in arrays:
            if array.dtype != self.dtype or array.ndim != 2 or array.shape[1] != self.nx:
                raise ConfigError(f"fields must be 2D {self.dtype} arrays of width {self.nx}; got "
                                  f"{array.dtype} of shape {tuple(array.shape)}")
            out.append(array[window])
        corners = self.f_corner[lo:hi + 1]
        if corners.shape[0] != out[0].shape[0] + 1:
            raise ConfigError(f"rows {lo}:{hi} reach beyond the {self.f_corner.shape[0]} Coriolis corner rows")
        return out, corners

    def stage(self, state0, state, out, *, a, b, c, rows, cols=None):
        """``out = a*state0 + b*state + c*tendency(state)`` on rows ``lo:hi`` (see ``shallow_water_stage``).

        ``c`` carries the time step; ``rows`` is ``(lo, hi)``. ``cols``, a
        column window ``(lo, hi)`` (default: every column), steps only those
        columns as if they were the whole grid (the x boundary at their
        edges); the columns outside are neither read nor written.
        """
        arrays, corners = self._window((*state0, *state, *out), rows, cols)
        self._kernels.shallow_water_stage(*arrays, corners, *self.physics, a, b, c, *self.boundary, cols=cols)

    def viscous_energy_tendency(self, state, *, rows, cols=None):
        """:func:`~hpcgpu.kernels.stencil.viscous_energy_tendency` of ``state`` (u, v, h) on the window
        :meth:`stage` steps (rows ``lo:hi``, ``cols``), with its boundary: float64 ``(hi - lo, columns)``.

        Array-module generic (the NumPy reference's expressions on this
        backend's arrays). Cells within the stencil reach of an open edge
        are not valid, as for a stage.
        """
        from hpcgpu.kernels.stencil import _numpy

        arrays, _ = self._window(state, rows, cols)
        if cols is not None:
            arrays = [a[:, cols[0]:cols[1]] for a in arrays]
        _, rdx, rdy, nu = self.physics
        return _numpy.viscous_energy_tendency(*arrays, nu, rdx, rdy, *self.boundary)

    def rk3_step(self, state0, out, dt, stages, *, rows, cols=None):
        """One fused SSP-RK3 step from ``state0`` into ``out`` on rows ``lo:hi`` (only where ``fused``).

        ``stages`` are the ``(a, b, c)`` of :data:`SSP_RK3_STAGES`; ``cols``
        as for :meth:`stage` (all three stages step the same columns).
        """
        if not self.fused:
            raise ConfigError(f"backend {self.backend.name!r} has no fused shallow_water_rk3_step (those "
                              f"that do: {', '.join(FAST_PATHS['shallow_water_rk3_step'])}); use stage()")
        arrays, corners = self._window((*state0, *out), rows, cols)
        self._kernels.shallow_water_rk3_step(*arrays, corners, *self.physics, dt, stages, *self.boundary,
                                             cols=cols)


def boundary_names(boundary):
    """Boundary kinds as names: kernel codes ``(x, south, north)`` are turned into their names."""
    if isinstance(boundary, (tuple, list)) and all(isinstance(b, (int, np.integer)) for b in boundary):
        unknown = [b for b in boundary if b not in NAMES]
        if unknown:
            raise ConfigError(f"boundary codes must be among {sorted(CODES.values())}; got {tuple(boundary)}")
        return tuple(NAMES[int(b)] for b in boundary)
    return boundary
