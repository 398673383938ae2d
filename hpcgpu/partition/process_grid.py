"""Process grids: how P ranks are laid out over the axes of a domain (px x py, or px x py x pz).

A decomposition that belongs to the data splits every axis it can: a 2-D
grid into ``px x py`` blocks, a periodic box into ``px x py x pz`` bricks.
:func:`choose_process_grid` picks the layout with the least halo surface
per rank (the bytes a rank exchanges, and for K-step halos the rows it
recomputes), among those whose blocks still hold the halo;
:func:`parse_grid` reads the ``--grid 4x2`` of the command lines and
:func:`check_grid` a ``grid=(4, 2)`` given in Python.

Axes are in ``(x, y[, z])`` order everywhere in hpcgpu: ``grid=(4, 2)``
is 4 ranks along x times 2 along y. The 1-D decompositions of earlier
releases are the cases ``(1, P)`` (grid rows) and ``(1, 1, P)`` (slabs).

Examples
--------
>>> choose_process_grid(16, (1024, 1024))
(4, 4)
>>> choose_process_grid(8, (4096, 512))
(8, 1)
>>> choose_process_grid(16, (33.6, 33.6, 33.6), halo=(3, 3, 3), tie="first")
(4, 4, 1)
>>> parse_grid("4x2")
(4, 2)
"""

import math

from hpcgpu.errors import ConfigError

__all__ = ["check_grid", "choose_process_grid", "factorizations", "halo_surface", "parse_grid"]


def factorizations(count, axes):
    """Every ordered tuple of ``axes`` positive ints whose product is ``count``.

    Examples
    --------
    >>> factorizations(4, 2)
    [(1, 4), (2, 2), (4, 1)]
    """
    if axes == 1:
        return [(count,)]
    found = []
    for first in range(1, count + 1):
        if count % first == 0:
            found.extend((first, *rest) for rest in factorizations(count // first, axes - 1))
    return found


def halo_surface(grid, extents, halo=None):
    """Halo items one rank exchanges per exchange on ``grid`` (the largest block; both sides of every split axis).

    ``halo[a]`` is the halo width along axis ``a`` (default 1). An axis
    not split (``grid[a] == 1``) has no halo. Corners are counted with the
    faces they ride along with (a staged exchange sends them inside the
    later axes' faces).
    """
    halo = (1,) * len(extents) if halo is None else tuple(halo)
    block = [math.ceil(e / p) for e, p in zip(extents, grid)]
    padded = list(block)
    surface = 0.0
    for axis, parts in enumerate(grid):
        if parts == 1:
            continue
        others = math.prod(padded[:axis] + padded[axis + 1:])
        surface += 2 * halo[axis] * others
        padded[axis] = block[axis] + 2 * halo[axis]  # later faces carry this axis' halo (edges, corners)
    return surface


def choose_process_grid(partitions, extents, *, halo=None, minimum=None, tie="last"):
    """The process grid for ``partitions`` ranks over a domain of ``extents``, least halo surface first.

    Parameters
    ----------
    partitions : int
        Ranks P (>= 1).
    extents : sequence of float
        Size of the domain along each axis, ``(nx, ny)`` or box sides ``(Lx, Ly, Lz)``.
    halo : sequence of float, optional
        Halo width along each axis (default 1 each).
    minimum : sequence of float, optional
        Smallest block extent along each axis (a block must hold its
        neighbour's halo); grids that break it are not considered.
    tie : {"last", "first"}
        Among grids of equal surface, the one that splits the last axis
        most (rows of a row-major grid stay contiguous) or the first.

    Returns
    -------
    tuple of int
        Ranks along each axis, product ``partitions``.

    Raises
    ------
    ConfigError
        No grid of ``partitions`` ranks has blocks of at least ``minimum``.
    """
    if not isinstance(partitions, int) or partitions < 1:
        raise ConfigError(f"partitions must be an int >= 1; got {partitions!r}")
    if tie not in ("first", "last"):
        raise ConfigError(f"tie must be 'first' or 'last'; got {tie!r}")
    extents = tuple(float(e) for e in extents)
    minimum = (0.0,) * len(extents) if minimum is None else tuple(float(m) for m in minimum)
    fits = [g for g in factorizations(partitions, len(extents))
            if all(p == 1 or e / p >= m for p, e, m in zip(g, extents, minimum))]
    if not fits:
        most = [max(1, int(e // m)) if m > 0 else int(e) for e, m in zip(extents, minimum)]
        raise ConfigError(f"partitions={partitions} cannot be laid out over a domain of {_fmt(extents)} with blocks "
                          f"of at least {_fmt(minimum)} (the halo); at most {math.prod(most)} ranks fit "
                          f"({'x'.join(map(str, most))}): use fewer partitions or a bigger domain")
    order = (lambda g: tuple(reversed(g))) if tie == "last" else (lambda g: g)
    best = min(halo_surface(g, extents, halo) for g in fits)
    tied = [g for g in fits if halo_surface(g, extents, halo) <= best * (1 + 1e-12)]
    return max(tied, key=order)


def _fmt(values):
    return " x ".join(f"{v:g}" for v in values)


def parse_grid(text):
    """``"4x2"`` (or ``"4,2"``, ``"2x2x2"``) as a tuple of positive ints.

    Raises
    ------
    ConfigError
        Not two or three positive integers joined by ``x``.
    """
    parts = str(text).lower().replace(",", "x").split("x")
    try:
        values = tuple(int(p) for p in parts)
    except ValueError:
        values = ()
    if len(values) not in (2, 3) or any(v < 1 for v in values):
        raise ConfigError(f"grid must be two or three positive integers joined by 'x' (4x2, 2x2x2); got {text!r}")
    return values


def check_grid(grid, axes, partitions=None):
    """``grid`` as a tuple of ``axes`` positive ints whose product is ``partitions`` (when given).

    Raises
    ------
    ConfigError
        Wrong length, a value that is not a positive int, or a product other than ``partitions``.
    """
    if isinstance(grid, str):
        grid = parse_grid(grid)
    try:
        values = tuple(grid)
    except TypeError:
        values = None
    if (values is None or len(values) != axes
            or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in values)):
        example = {1: "(4,)", 2: "(4, 2)"}.get(axes, "(2, 2, 2)")
        raise ConfigError(f"grid must be a tuple of {axes} positive ints (ranks along {'x, y, z'[:3 * axes - 2]}), "
                          f"e.g. {example}; got {grid!r}")
    if partitions is not None and math.prod(values) != partitions:
        raise ConfigError(f"grid={'x'.join(map(str, values))} holds {math.prod(values)} ranks but partitions="
                          f"{partitions}; give partitions={math.prod(values)} or leave it out")
    return values

