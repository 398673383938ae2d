"""The checks every stencil entry point shares: boundaries, fields, grid spacing, boundary values.

:func:`normalize_boundary` turns a user's boundary (a name or a tuple) into
kernel codes and names; ``_fields`` brings arrays onto a backend with one
shape and dtype checked once; ``_spacing`` and ``_boundary_value`` check
the grid spacing and a Dirichlet value. Every message names the parameter
and its valid range. The public names are re-exported by
:mod:`hpcgpu.kernels.stencil`.

Examples
--------
>>> from hpcgpu.kernels.stencil import NAMES, normalize_boundary
>>> codes = normalize_boundary(("periodic", "wall"))
>>> [NAMES[code] for code in codes]  # x, south, north
['periodic', 'wall', 'wall']
"""

import math

import numpy as np

from hpcgpu.errors import ConfigError
from hpcgpu.kernels.stencil.boundary import CODES, DIRICHLET, NAMES, PERIODIC
from hpcgpu.validation import check_float

__all__ = ["MIN_POINTS", "normalize_boundary"]

MIN_POINTS = 4
"""Smallest number of points along each axis that every kernel accepts."""



def normalize_boundary(boundary, *, allow_dirichlet=False):
    """Return boundary codes ``(x, south, north)`` for a boundary spec.

    Parameters
    ----------
    boundary : str or tuple
        ``"periodic"``, ``"wall"``, a pair ``(x, y)`` or a triple
        ``(x, south, north)``; ``"open"`` (the edge of a partition whose
        frame continues beyond it) is allowed for south, north and x (both
        x edges: the west and east ends of a column window).
    allow_dirichlet : bool
        Accept ``"dirichlet"`` on any edge: only callers that apply a fixed
        value (the scalar kernels :func:`laplacian` and :func:`diffuse`) set
        it, so the shallow-water kernels and the Poisson operator refuse it.

    Raises
    ------
    ConfigError
        Unknown kind, a half-periodic axis, or ``"dirichlet"`` where it is
        not allowed.

    Examples
    --------
    >>> normalize_boundary(("periodic", "wall"))
    (0, 1, 1)
    >>> normalize_boundary(("wall", "dirichlet", "wall"), allow_dirichlet=True)
    (1, 3, 1)
    """
    if isinstance(boundary, str):
        parts = (boundary, boundary, boundary)
    elif isinstance(boundary, (tuple, list)) and len(boundary) == 2:
        parts = (boundary[0], boundary[1], boundary[1])
    elif isinstance(boundary, (tuple, list)) and len(boundary) == 3:
        parts = tuple(boundary)
    else:
        raise ConfigError(
            "boundary must be 'periodic', 'wall'" + (", 'dirichlet'" if allow_dirichlet else "")
            + f", a pair (x, y) or a triple (x, south, north); got {boundary!r}")
    kinds = [name for name, code in CODES.items() if allow_dirichlet or code != DIRICHLET]
    for label, part in zip(("x", "south", "north"), parts):
        if part == "dirichlet" and not allow_dirichlet:
            raise ConfigError(
                f"boundary ({label}) 'dirichlet' is only for the scalar kernels (laplacian, "
                f"diffuse); here it must be one of {', '.join(map(repr, kinds))}")
        if part not in kinds:
            raise ConfigError(
                f"boundary ({label}) must be one of {', '.join(map(repr, kinds))}; got {part!r}")
    x, south, north = (CODES[p] for p in parts)
    if (south == PERIODIC) != (north == PERIODIC):
        raise ConfigError(
            f"boundary in y is periodic on one edge only ({NAMES[south]!r} south, "
            f"{NAMES[north]!r} north); periodic must hold on both edges")
    return x, south, north


def _fields(backend, names, arrays, dtype=None):
    """Move arrays to the backend and check they are matching 2D float grids."""
    out = []
    shape = None
    for name, array in zip(names, arrays):
        if array is None:
            raise ConfigError(f"{name} must be a 2D array, got None")
        array = backend.asarray(array)
        if array.ndim != 2:
            raise ConfigError(f"{name} must be a 2D array (ny, nx); got shape {array.shape}")
        if array.dtype.name not in ("float32", "float64"):
            raise ConfigError(f"{name} must have dtype float32 or float64; got {array.dtype}")
        if dtype is None:
            dtype = array.dtype
        elif array.dtype != dtype:
            raise ConfigError(f"{name} has dtype {array.dtype} but {names[0]} has {dtype}; "
                              "all fields of one call must share a dtype")
        if shape is None:
            shape = array.shape
            if min(shape) < MIN_POINTS:
                raise ConfigError(f"{name} must be at least {MIN_POINTS}x{MIN_POINTS} points; "
                                  f"got shape {shape}")
        elif array.shape != shape:
            raise ConfigError(f"{name} has shape {array.shape} but {names[0]} has {shape}")
        out.append(array)
    return out


def _spacing(dx, dy):
    """``dx`` and ``dy`` checked: > 0, and with ``1 / spacing**2`` a finite nonzero float.

    The kernels take ``1 / dx**2``: a spacing below about 1e-154 (or above
    1e154) squares to 0 (or inf) and would divide by zero or zero the stencil.
    """
    spacings = []
    for name, value in (("dx", dx), ("dy", dy)):
        value = check_float(name, value, minimum=0.0, strict_min=True)
        square = value * value
        if not (square > 0.0 and math.isfinite(square) and math.isfinite(1.0 / square)):
            raise ConfigError(f"{name}={value!r} is out of range: {name}**2 and 1/{name}**2 must be finite "
                              f"nonzero floats ({_SPACING_MIN:.3g} < {name} < {_SPACING_MAX:.3g})")
        spacings.append(value)
    return tuple(spacings)


_SPACING_MIN = math.sqrt(np.finfo(np.float64).tiny)
_SPACING_MAX = math.sqrt(np.finfo(np.float64).max)


def _boundary_value(value, dtype):
    """``boundary_value`` checked: finite, and within the range of the field's dtype."""
    value = check_float("boundary_value", value)
    limit = float(np.finfo(dtype).max)
    if abs(value) > limit:
        raise ConfigError(f"boundary_value={value!r} does not fit the field's dtype {dtype} "
                          f"(|boundary_value| <= {limit:.4g})")
    return value
