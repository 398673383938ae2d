"""A rectilinear 2D grid with Arakawa C-grid staggering.

The grid is geometry only: sizes, spacing, boundaries and the coordinates of
cell centres, faces and corners. Fields are ``(ny, nx)`` arrays with x along
the last axis. The shallow-water model (:mod:`hpcgpu.workloads.weather`)
and the barotropic vorticity model (:mod:`hpcgpu.workloads.vorticity`)
live on it.
"""

from dataclasses import dataclass

import numpy as np

from hpcgpu.kernels.stencil import MIN_POINTS, NAMES, OPEN, WALL, normalize_boundary
from hpcgpu.validation import check_float, check_int

__all__ = ["Grid"]


@dataclass(frozen=True)
class Grid:
    """A uniform rectangular grid of ``nx`` by ``ny`` cells.

    Parameters
    ----------
    nx, ny : int
        Number of cells along x and y (>= 4).
    Lx, Ly : float
        Domain size (m), > 0.
    boundary : str or tuple
        ``"periodic"``, ``"wall"`` or a pair ``(x, y)``; see
        :func:`hpcgpu.kernels.stencil.normalize_boundary`.

    Examples
    --------
    >>> grid = Grid(nx=8, ny=4, Lx=8e3, Ly=4e3, boundary=("periodic", "wall"))
    >>> grid.dx, grid.shape
    (1000.0, (4, 8))
    """

    nx: int
    ny: int
    Lx: float
    Ly: float
    boundary: tuple = ("periodic", "periodic")

    def __post_init__(self):
        object.__setattr__(self, "nx", check_int("nx", self.nx, minimum=MIN_POINTS))
        object.__setattr__(self, "ny", check_int("ny", self.ny, minimum=MIN_POINTS))
        object.__setattr__(self, "Lx", check_float("Lx", self.Lx, minimum=0.0, strict_min=True))
        object.__setattr__(self, "Ly", check_float("Ly", self.Ly, minimum=0.0, strict_min=True))
        codes = normalize_boundary(self.boundary)
        if codes[1] != codes[2]:
            from hpcgpu.errors import ConfigError
            raise ConfigError("a global grid needs the same boundary on its south and north edges; "
                              f"got {self.boundary!r}")
        if codes[1] == OPEN:  # an open edge has no rows beyond it: only a partition's edges, which get halos
            from hpcgpu.errors import ConfigError
            raise ConfigError(f"boundary along y must be 'periodic' or 'wall'; got {self.boundary!r} ('open' is "
                              "only for the south/north edges of a partition)")
        object.__setattr__(self, "boundary", (NAMES[codes[0]], NAMES[codes[1]]))

    @property
    def shape(self):
        """Array shape of a field, ``(ny, nx)``."""
        return (self.ny, self.nx)

    @property
    def dx(self):
        return self.Lx / self.nx

    @property
    def dy(self):
        return self.Ly / self.ny

    @property
    def codes(self):
        """Boundary codes ``(x, south, north)`` for the kernels."""
        return normalize_boundary(self.boundary)

    @property
    def wall_x(self):
        return self.codes[0] == WALL

    @property
    def wall_y(self):
        return self.codes[1] == WALL

    def x_centre(self):
        """x of cell centres (and of v points), shape (nx,)."""
        return (np.arange(self.nx) + 0.5) * self.dx

    def y_centre(self):
        """y of cell centres (and of u points), shape (ny,)."""
        return (np.arange(self.ny) + 0.5) * self.dy

    def x_face(self):
        """x of west faces (u points and corners), shape (nx,)."""
        return np.arange(self.nx) * self.dx

    def y_face(self):
        """y of south faces (v points and corners), shape (ny,)."""
        return np.arange(self.ny) * self.dy

    def y_corner_rows(self):
        """y of corner rows 0..ny (both walls included), shape (ny + 1,)."""
        return np.arange(self.ny + 1) * self.dy

    @property
    def cell_area(self):
        return self.dx * self.dy
