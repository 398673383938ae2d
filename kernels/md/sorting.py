"""Atoms in cell order: the permutation that keeps neighbours close in memory.

A simulation's atoms start in lattice order, where an atom's neighbours sit
near it in the arrays, and diffuse out of it: after some thousands of steps
in a liquid, the neighbours of consecutive atoms are scattered over the
whole position array, and every gather of a neighbour's position misses
the caches (the L1 of a GPU's SM, a CPU core's L2). Molecular-dynamics codes
therefore reorder their atoms now and then (LAMMPS ``atom_modify sort``,
HOOMD-blue's ``ParticleSorter``): :func:`cell_order` gives that order, the
atoms listed cell by cell in the numbering of :mod:`.cells` (x fastest),
in increasing index within a cell (a stable sort, so sorting sorted atoms
changes nothing).

A model applies the permutation to every per-atom array (positions,
velocities, images, ids ...) just before it builds a neighbour list, and
keeps the atoms' ids, by which its outputs are ordered; the physics does not
change, only the order in which forces are summed (results equal to
rounding).
"""

import numpy as np

from hpcgpu.backends import get_backend
from hpcgpu.errors import ConfigError
from hpcgpu.kernels.md import cells
from hpcgpu.kernels.md.box import check_box
from hpcgpu.validation import check_finite_array, check_float

__all__ = ["cell_order"]


def cell_order(positions, box, *, radius, backend="auto"):
    """The atoms' indices listed cell by cell (cells about ``radius`` wide, x fastest).

    Parameters
    ----------
    positions : array (3, N)
        x, y, z rows (length), any periodic image, on the backend's device.
    box : sequence of 3 floats
        Orthorhombic periodic box ``(Lx, Ly, Lz)`` (length), each side > 0.
    radius : float
        The neighbour-list radius (``cutoff + skin``, length), > 0: the cells
        are those a build of this radius uses (:func:`.cells.grid`).
    backend : str or Backend

    Returns
    -------
    order : int64 array (N,)
        On the backend's device: ``positions[:, order]`` holds the atoms
        sorted by cell, those of one cell in increasing index.

    Raises
    ------
    ConfigError
        Positions not ``(3, N)`` floats, a bad box, ``radius <= 0``.

    Examples
    --------
    >>> import numpy as np
    >>> x = np.array([[9.0, 1.0, 6.0, 1.5], [0.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]])
    >>> cell_order(x, (10.0, 10.0, 10.0), radius=2.8, backend="numpy").tolist()
    [1, 3, 2, 0]
    """
    backend = get_backend(backend)
    box = check_box(box)
    radius = check_float("radius", radius, minimum=0.0, strict_min=True)
    positions = backend.asarray(positions)
    if positions.ndim != 2 or positions.shape[0] != 3 or positions.shape[1] < 1 \
            or positions.dtype.kind != "f":
        raise ConfigError(f"positions must be a float array of shape (3, N) with N >= 1; "
                          f"got {positions.dtype} of shape {positions.shape}")
    check_finite_array("positions", positions)
    xp = backend.xp
    n = positions.shape[1]
    counts = cells.grid(box, radius, n)
    cell = xp.zeros(n, dtype=np.int64)
    # z first: c = cx + nx * (cy + ny * cz), each coordinate as cells.cell_coordinate, in float64
    for axis in (2, 1, 0):
        s = positions[axis].astype(np.float64) / box[axis]
        s -= xp.floor(s)
        c = xp.minimum(xp.floor(s * counts[axis]).astype(np.int64), counts[axis] - 1)
        cell = cell * counts[axis] + c
    return xp.argsort(cell, kind="stable").astype(np.int64)

