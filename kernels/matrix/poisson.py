"""The five-point Poisson operator on a 2D grid, matrix-free, with an FFT solver.

:class:`PoissonOperator` is ``A = -lap_h``, the negative five-point
Laplacian, which is symmetric positive definite with a wall on either axis
and positive semi-definite (constants span its null space) when both axes
are periodic. It follows the operator protocol of
:func:`hpcgpu.kernels.matrix.conjugate_gradient` (``matvec``, ``diagonal``,
``project``) and also solves ``lap_h psi = f`` directly by FFT, with the
operator's exact discrete eigenvalues, so the two solvers agree to the CG
tolerance.

Grid convention (as for the corner points of the C-grid,
:class:`hpcgpu.workloads.weather.grid.Grid`): fields are ``(ny, nx)``
arrays, x along the last axis. Along a periodic axis index ``n`` wraps to
0. Along a ``"wall"`` axis index 0 *is* the wall and the
opposite wall lies one spacing beyond the last index; the field is zero on
both walls (homogeneous Dirichlet), so only indices ``1 .. n-1`` are
unknowns. Index 0 of a wall axis is decoupled in ``matvec`` (a positive
multiple of the identity, keeping ``A`` SPD) and zeroed by ``project``.

Examples
--------
>>> import numpy as np
>>> op = PoissonOperator((8, 8), dx=1.0, dy=1.0, boundary="periodic", backend="numpy")
>>> x = np.random.default_rng(0).standard_normal((8, 8))
>>> psi = op.solve_fft(x)              # lap_h psi = x - mean(x)
>>> bool(np.allclose(-op.matvec(psi), x - x.mean()))
True
"""

import numpy as np

from hpcgpu.backends import get_backend
from hpcgpu.errors import ConfigError
from hpcgpu.kernels.stencil import MIN_POINTS, normalize_boundary
from hpcgpu.kernels.stencil.boundary import NAMES, OPEN, PERIODIC, WALL
from hpcgpu.kernels.stencil.fields import _spacing
from hpcgpu.validation import check_dtype, check_int

__all__ = ["PoissonOperator"]


class PoissonOperator:
    """Matrix-free ``A = -lap_h`` (five-point) on an ``(ny, nx)`` grid.

    Parameters
    ----------
    grid_shape : tuple of int
        ``(ny, nx)``, each at least 4.
    dx, dy : float
        Grid spacing (> 0), in the domain's length unit.
    boundary : str or tuple
        ``"periodic"``, ``"wall"`` (zero Dirichlet) or a pair ``(x, y)``.
    dtype : str
        ``"float32"`` or ``"float64"``.
    backend : str or Backend

    Attributes
    ----------
    shape : tuple
        ``(n, n)`` with ``n = ny * nx``: the operator acts on fields of
        ``grid_shape`` (or flat vectors of ``n`` entries).
    singular : bool
        True when both axes are periodic: ``A`` then maps onto mean-zero
        fields, and :meth:`project` removes the mean (the gauge of the
        doubly periodic problem).

    Examples
    --------
    >>> op = PoissonOperator((6, 4), dx=2.0, dy=1.0, boundary=("periodic", "wall"), backend="numpy")
    >>> op.shape, op.singular, float(op.diagonal()[0, 0])
    ((24, 24), False, 2.5)
    """

    def __init__(self, grid_shape, *, dx=1.0, dy=1.0, boundary="periodic", dtype="float64", backend="auto"):
        if not isinstance(grid_shape, (tuple, list)) or len(grid_shape) != 2:
            raise ConfigError(f"grid_shape must be a pair (ny, nx); got {grid_shape!r}")
        ny = check_int("ny (grid_shape[0])", grid_shape[0], minimum=MIN_POINTS)
        nx = check_int("nx (grid_shape[1])", grid_shape[1], minimum=MIN_POINTS)
        self.grid_shape = (ny, nx)
        # the stencil family's check: 1/dx**2 is taken below and must be a finite nonzero float
        self.dx, self.dy = _spacing(dx, dy)
        bc_x, bc_s, bc_n = normalize_boundary(boundary)
        if OPEN in (bc_s, bc_n) or bc_s != bc_n:
            raise ConfigError(f"boundary must be 'periodic', 'wall' or a pair of them; got {boundary!r}")
        self.codes = (bc_x, bc_s)
        self.boundary = (NAMES[bc_x], NAMES[bc_s])
        self.dtype = check_dtype("dtype", dtype)
        self.backend = get_backend(backend)
        self.shape = (ny * nx, ny * nx)
        self.singular = bc_x == PERIODIC and bc_s == PERIODIC
        self._rdx2, self._rdy2 = 1.0 / self.dx**2, 1.0 / self.dy**2
        self._inverse_symbol = None

    # -- the operator protocol ------------------------------------------------------
    def matvec(self, x):
        """``-lap_h x`` (wall indices: ``diagonal * x``), shaped like ``x``."""
        field = self._field("x", x)
        xp = self.backend.xp
        if self.singular:
            # Doubly periodic: the stencil family's compiled Laplacian, scaled by -1.
            out = xp.empty_like(field)
            t = field.dtype.type
            self.backend.kernels("stencil").laplacian(
                field, out, t(-self._rdx2), t(-self._rdy2), PERIODIC, PERIODIC, PERIODIC)
            return out.reshape(x.shape)
        out = -self._dirichlet_laplacian(field)
        diagonal = 2 * self._rdx2 + 2 * self._rdy2
        if self.codes[0] == WALL:
            out[:, 0] = diagonal * field[:, 0]
        if self.codes[1] == WALL:
            out[0, :] = diagonal * field[0, :]
        return out.reshape(x.shape)

    def diagonal(self):
        """The diagonal of ``A``: ``2/dx**2 + 2/dy**2`` everywhere, shape ``grid_shape``."""
        return self.backend.xp.full(self.grid_shape, 2 * self._rdx2 + 2 * self._rdy2, dtype=self.dtype)

    def project(self, x):
        """Orthogonal projection onto the range of ``A`` (a new array shaped like ``x``).

        Removes the mean on a doubly periodic grid and zeroes the wall
        indices; otherwise a copy.
        """
        field = self._field("x", x).copy()
        if self.singular:
            field -= field.mean()
        if self.codes[0] == WALL:
            field[:, 0] = 0
        if self.codes[1] == WALL:
            field[0, :] = 0
        return field.reshape(x.shape)

    # -- the Laplacian and a direct solver ---------------------------------------------
    def laplacian(self, x):
        """``lap_h x`` with this operator's boundaries (zero on wall indices)."""
        if self.singular:
            return -self.matvec(x)
        field = self._field("x", x)
        out = self._dirichlet_laplacian(field)
        if self.codes[0] == WALL:
            out[:, 0] = 0
        if self.codes[1] == WALL:
            out[0, :] = 0
        return out.reshape(x.shape)

    def solve_fft(self, rhs):
        """Solve ``lap_h psi = rhs`` exactly (to rounding) by FFT.

        The right-hand side is projected first (see :meth:`project`); the
        result has zero mean on a doubly periodic grid and is zero on walls.
        Wall axes use the odd extension to twice the length (a sine
        transform), with the same discrete eigenvalues as :meth:`matvec`.

        Parameters
        ----------
        rhs : array (ny, nx)

        Returns
        -------
        array (ny, nx)
            On the operator's backend, in its dtype.
        """
        xp = self.backend.xp
        field = self.project(self._field("rhs", rhs))
        extended = field
        if self.codes[1] == WALL:
            extended = _odd_extension(extended, 0, xp)
        if self.codes[0] == WALL:
            extended = _odd_extension(extended, 1, xp)
        spectrum = xp.fft.rfft2(extended)
        spectrum *= self._inverse(extended.shape)
        psi = xp.fft.irfft2(spectrum, s=extended.shape)[:self.grid_shape[0], :self.grid_shape[1]]
        return self.project(xp.ascontiguousarray(psi, dtype=self.dtype))

    def _inverse(self, shape):
        """``1 / lambda`` of ``lap_h`` per rfft2 mode (0 for the mean mode), cached on device."""
        if self._inverse_symbol is None or self._inverse_symbol[0] != shape:
            ny, nx = shape
            sy = np.sin(np.pi * np.arange(ny) / ny)[:, None] ** 2
            sx = np.sin(np.pi * np.arange(nx // 2 + 1) / nx)[None, :] ** 2
            symbol = -4.0 * (self._rdx2 * sx + self._rdy2 * sy)
            symbol[0, 0] = 1.0
            inverse = 1.0 / symbol
            inverse[0, 0] = 0.0
            self._inverse_symbol = (shape, self.backend.asarray(inverse))
        return self._inverse_symbol[1]

    def _dirichlet_laplacian(self, field):
        """Five-point Laplacian with zero values on and beyond walls, wrapping periodic axes."""
        xp = self.backend.xp
        masked = field
        if WALL in self.codes:
            masked = field.copy()
            if self.codes[0] == WALL:
                masked[:, 0] = 0
            if self.codes[1] == WALL:
                masked[0, :] = 0
        mode_x = "wrap" if self.codes[0] == PERIODIC else "constant"
        mode_y = "wrap" if self.codes[1] == PERIODIC else "constant"
        p = xp.pad(xp.pad(masked, ((0, 0), (1, 1)), mode=mode_x), ((1, 1), (0, 0)), mode=mode_y)
        return ((p[1:-1, :-2] + p[1:-1, 2:] - 2 * masked) * self._rdx2
                + (p[:-2, 1:-1] + p[2:, 1:-1] - 2 * masked) * self._rdy2)

    def _field(self, name, x):
        # not getattr(x, "dtype", None) != self.dtype: np.dtype("float64") == None is True
        if not hasattr(x, "dtype") or x.dtype != self.dtype:
            raise ConfigError(f"{name} must be an array of dtype {self.dtype} (the operator's); "
                              f"got {getattr(x, 'dtype', type(x).__name__)}")
        if x.size != self.shape[0]:
            raise ConfigError(f"{name} must have shape {self.grid_shape} (or {self.shape[0]} entries); "
                              f"got shape {x.shape}")
        return self.backend.asarray(x).reshape(self.grid_shape)

    def __getstate__(self):
        state = self.__dict__.copy()
        state["_inverse_symbol"] = None  # device arrays stay on their device
        return state

    def __repr__(self):
        return (f"PoissonOperator(grid_shape={self.grid_shape}, dx={self.dx:g}, dy={self.dy:g}, "
                f"boundary={self.boundary}, dtype={self.dtype.name!r}, backend={self.backend.name!r})")


def _odd_extension(field, axis, xp):
    """``[f_0=0, f_1 .. f_{n-1}, 0, -f_{n-1} .. -f_1]`` along ``axis`` (length 2n)."""
    field = xp.moveaxis(field, axis, 0)
    zero = xp.zeros_like(field[:1])
    out = xp.concatenate([zero, field[1:], zero, -field[:0:-1]], axis=0)
    return xp.moveaxis(out, 0, axis)
