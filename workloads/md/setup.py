"""Set-up pieces of the Lennard-Jones model: lattice, random numbers, velocities, tail corrections.

Everything here is in reduced Lennard-Jones units (``epsilon = sigma =
mass = k_B = 1``): lengths in sigma, energies in epsilon, time in
``sigma sqrt(mass / epsilon)``, temperature in ``epsilon / k_B``, pressure in
``epsilon / sigma**3``.

Random numbers are counter based (:mod:`hpcgpu.random_streams`): a Gaussian
an atom receives is a pure function of ``(seed, stream, step, atom id)`` --
splitmix64 (Steele, Lea and Flood 2014) hashes the counter to 64 random
bits, two of those give two uniforms and Box-Muller turns them into two
normal deviates. So the noise an atom gets never depends on how many atoms
there are, how they are ordered or how they are split between workers.
"""

import math

import numpy as np

from hpcgpu.errors import ConfigError
from hpcgpu.random_streams import counter_bits, stream_key
from hpcgpu.validation import check_float, check_int

__all__ = ["geometry", "fcc_lattice", "fcc_positions", "fcc_sites", "atom_ids", "stream_key", "gaussians",
           "maxwell_boltzmann", "raw_velocities", "velocity_sums", "velocity_normalisation", "normalised_velocities",
           "lj_pair_energy", "tail_corrections", "STREAM_VELOCITIES", "STREAM_LANGEVIN"]

STREAM_VELOCITIES = 1
"""Random stream of the initial Maxwell-Boltzmann velocities."""
STREAM_LANGEVIN = 2
"""Random stream of the Langevin thermostat's noise."""

def geometry(n_cells, density=None, box=None):
    """Unit cells ``(nx, ny, nz)`` and box sides of an fcc lattice at ``density`` or in ``box``.

    Exactly one of ``density`` (atoms per sigma^3: cubic cells of side
    ``(4 / density)^(1/3)``) and ``box`` (three sides) must be given.

    Raises
    ------
    ConfigError
        Cells that are not 1 or 3 positive ints, density <= 0, bad box sides,
        or both density and box.
    """
    cells = (n_cells,) * 3 if not isinstance(n_cells, (tuple, list)) else tuple(n_cells)
    if len(cells) != 3:
        raise ConfigError(f"n_cells must be an int or 3 ints (nx, ny, nz); got {n_cells!r}")
    cells = tuple(check_int("n_cells", c, minimum=1) for c in cells)
    if (box is None) == (density is None):
        raise ConfigError(f"give density or box, not both; got density={density!r} and box={box!r}")
    if box is None:
        side = (4.0 / check_float("density", density, minimum=0.0, strict_min=True)) ** (1.0 / 3.0)
        return cells, tuple(side * c for c in cells)
    if not isinstance(box, (tuple, list)) or len(box) != 3:
        raise ConfigError(f"box must be 3 side lengths (Lx, Ly, Lz); got {box!r}")
    return cells, tuple(check_float(f"box side L{a}", b, minimum=0.0, strict_min=True) for a, b in zip("xyz", box))


def fcc_lattice(cells, box):
    """Positions ``(3, 4 nx ny nz)`` of a face-centred cubic lattice filling ``box``, in atom id order.

    Parameters
    ----------
    cells : tuple of 3 int
        Unit cells along x, y, z.
    box : tuple of 3 float
        Box sides (sigma); the unit cell is ``box[k] / cells[k]`` along each axis.

    Returns
    -------
    numpy.ndarray
        float64, every atom inside ``[0, L)``: the lattice is offset by a quarter
        cell so that no atom sits on a face of the box. Column ``i`` is
        :func:`fcc_positions` of id ``i``, bitwise.
    """
    return fcc_positions(cells, box, np.arange(4 * math.prod(cells), dtype=np.int64))


_BASIS = np.array([[0.0, 0.0, 0.0], [0.5, 0.5, 0.0], [0.5, 0.0, 0.5], [0.0, 0.5, 0.5]]) + 0.25


def fcc_positions(cells, box, ids):
    """The lattice positions ``(3, len(ids))`` of atoms ``ids``: a pure function of each id.

    Atom ``i = 4 ((cx ny + cy) nz + cz) + b`` sits at ``(c + basis_b) * box / cells``
    (the unit cell ``(cx, cy, cz)`` x slowest, basis site ``b``), so that a
    rank computes the atoms of its own brick without the others'.

    Examples
    --------
    >>> fcc_positions((2, 2, 2), (2.0, 2.0, 2.0), np.array([0, 5])).T.tolist()
    [[0.25, 0.25, 0.25], [0.75, 0.75, 1.25]]
    """
    ids = np.asarray(ids, dtype=np.int64)
    nx, ny, nz = cells
    unit = ids // 4
    cell = np.stack([unit // (ny * nz), (unit // nz) % ny, unit % nz])
    points = cell.astype(np.float64) + _BASIS[ids % 4].T
    return np.ascontiguousarray(points * (np.asarray(box, float) / np.asarray(cells, float))[:, None])


def fcc_sites(cells, box, candidate_cells):
    """The ids (increasing) and positions of the lattice sites in the unit cells ``candidate_cells``.

    ``candidate_cells`` holds, per axis, the unit-cell indices to take (any
    order, repeats ignored): their product's sites are returned, so a rank
    lists the sites near its brick without the whole lattice.

    Examples
    --------
    >>> ids, positions = fcc_sites((3, 3, 3), (3.0, 3.0, 3.0), ([0], [2], [1, 0]))
    >>> ids.tolist()
    [24, 25, 26, 27, 28, 29, 30, 31]
    """
    cx, cy, cz = (np.unique(np.asarray(c, dtype=np.int64)) for c in candidate_cells)
    _, ny, nz = cells
    units = ((cx[:, None, None] * ny + cy[None, :, None]) * nz + cz[None, None, :]).reshape(-1)
    ids = (4 * units[:, None] + np.arange(4)[None, :]).reshape(-1)
    return ids, fcc_positions(cells, box, ids)


def atom_ids(backend, ids, n):
    """Global atom ids as int64 on the backend: ``0..n-1`` by default, else checked.

    Raises
    ------
    ConfigError
        Not ``n`` integers, negative or repeated ids.
    """
    if ids is None:
        return backend.xp.arange(n, dtype=np.int64)
    host = np.asarray(backend.to_host(ids))
    if host.shape != (n,) or host.dtype.kind not in "iu":
        raise ConfigError(f"ids must be integers of shape ({n},); got {host.dtype} of shape {host.shape}")
    if n and (host.min() < 0 or np.unique(host).size != n):
        raise ConfigError("ids must be unique non-negative integers")
    return backend.asarray(host.astype(np.int64))


def gaussians(xp, key, ids, count=3):
    """Standard normal deviates ``(count, N)`` (float64), a function of ``(key, id)`` only.

    Each atom draws 4 splitmix64 outputs, counters ``4 id + 1 .. 4 id + 4``
    of the sequence seeded with ``key``; two Box-Muller pairs give up to 4
    deviates (``count`` <= 4). The 53 high bits of a draw make a uniform;
    the radius uses ``u1`` in ``(0, 1]`` so the logarithm is finite.
    """
    if not 1 <= count <= 4:
        raise ConfigError(f"count must be between 1 and 4; got {count}")
    base = ids.astype(np.uint64) * np.uint64(4)
    scale = 2.0**-53
    out = xp.empty((count, ids.shape[0]), dtype=np.float64)
    for pair in range((count + 1) // 2):
        z1 = counter_bits(key, base + np.uint64(2 * pair + 1))
        z2 = counter_bits(key, base + np.uint64(2 * pair + 2))
        u1 = ((z1 >> np.uint64(11)).astype(np.float64) + 1.0) * scale
        angle = (z2 >> np.uint64(11)).astype(np.float64) * (2.0 * math.pi * scale)
        radius = xp.sqrt(-2.0 * xp.log(u1))
        out[2 * pair] = radius * xp.cos(angle)
        if 2 * pair + 1 < count:
            out[2 * pair + 1] = radius * xp.sin(angle)
    return out


def raw_velocities(xp, ids, seed):
    """The standard normal deviates ``(3, N)`` the initial velocities of atoms ``ids`` are made from.

    A pure function of ``(seed, atom id)`` (the stream :data:`STREAM_VELOCITIES`
    of :func:`gaussians`): the same numbers for an atom whichever rank, brick
    layout or process count builds it.
    """
    return gaussians(xp, stream_key(seed, STREAM_VELOCITIES, 0), ids)


def velocity_sums(velocities):
    """Exact partial sums of ``velocities`` ``(3, N)``: ``{"sum": [3], "squares": one, "atoms": N}``.

    The pieces of any split of the atoms add up exactly
    (:class:`~hpcgpu.exact_sums.ExactPartial`), so that
    :func:`velocity_normalisation` gives the same numbers for every split.
    """
    from hpcgpu.exact_sums import exact_partial

    return {"sum": [exact_partial(velocities[axis]) for axis in range(3)],
            "squares": exact_partial(velocities * velocities), "atoms": int(velocities.shape[1])}


def velocity_normalisation(parts, temperature):
    """``(mean (3,), scale)`` from every part's :func:`velocity_sums`: ``v <- (v - mean) * scale``.

    Removes the total momentum and rescales so that ``2 K / (3N - 3) = T``
    (the centre of mass carries no kinetic energy, so 3N - 3 degrees of
    freedom remain). ``K`` is the sum of squares less ``N mean^2``, both
    from the exact totals: the same floats for any split of the atoms.
    """
    n = sum(p["atoms"] for p in parts)
    totals = [float(sum((p["sum"][axis] for p in parts[1:]), parts[0]["sum"][axis])) for axis in range(3)]
    squares = float(sum((p["squares"] for p in parts[1:]), parts[0]["squares"]))
    mean = tuple(t / n for t in totals)
    kinetic = 0.5 * (squares - n * sum(m * m for m in mean))
    if temperature == 0 or n < 2 or not kinetic > 0:
        return mean, 0.0
    return mean, math.sqrt(temperature * (3 * n - 3) / (2 * kinetic))


def normalised_velocities(xp, raw, normalisation):
    """``(raw - mean) * scale`` for a :func:`velocity_normalisation` (elementwise: the same on every rank)."""
    mean, scale = normalisation
    return (raw - xp.asarray(np.asarray(mean, dtype=np.float64))[:, None]) * scale


def maxwell_boltzmann(xp, ids, temperature, seed):
    """Velocities ``(3, N)`` (float64) at exactly ``temperature``, zero total momentum.

    Gaussian components from the counter-based stream
    :data:`STREAM_VELOCITIES` (:func:`raw_velocities`); the mean is removed
    and the result rescaled so that ``2 K / (3N - 3) = T`` to rounding
    (:func:`velocity_normalisation`). A partitioned run's ranks build the
    same velocities from their own atoms and the sums of every rank.
    """
    raw = raw_velocities(xp, ids, seed)
    return normalised_velocities(xp, raw, velocity_normalisation([velocity_sums(raw)], temperature))


def lj_pair_energy(r, epsilon=1.0, sigma=1.0):
    """The Lennard-Jones pair energy ``4 eps ((sigma/r)**12 - (sigma/r)**6)``."""
    sr6 = (sigma / r) ** 6
    return 4.0 * epsilon * sr6 * (sr6 - 1.0)


def tail_corrections(density, cutoff, epsilon=1.0, sigma=1.0):
    """Long-range corrections of a Lennard-Jones potential truncated at ``cutoff``.

    The standard corrections (Allen and Tildesley, *Computer Simulation of
    Liquids*, 2nd ed. 2017, eqs. 2.144-2.145; Frenkel and Smit, *Understanding
    Molecular Simulation*, eq. 3.2.5), which assume ``g(r) = 1`` beyond the
    cutoff::

        u_tail = (8/3)  pi rho   eps sigma^3 [ (1/3)(sigma/rc)^9 - (sigma/rc)^3 ]   per atom
        P_tail = (16/3) pi rho^2 eps sigma^3 [ (2/3)(sigma/rc)^9 - (sigma/rc)^3 ]

    ``P_virial + P_tail`` estimates the pressure of the full potential for
    both the truncated and the truncated-and-shifted potential (their forces
    are the same). ``U_truncated + N u_tail`` estimates the full potential
    energy; with the shifted potential, ``U_truncated = U_shifted +
    n_pairs(r < rc) u(rc)``.

    Returns
    -------
    (float, float)
        Energy per atom (epsilon) and pressure (epsilon / sigma**3); both negative.

    Examples
    --------
    >>> energy, pressure = tail_corrections(0.8442, 2.5)
    >>> round(energy, 4), round(pressure, 4)
    (-0.452, -0.7621)
    """
    sr3 = (sigma / cutoff) ** 3
    sr9 = sr3**3
    energy = 8.0 / 3.0 * math.pi * density * epsilon * sigma**3 * (sr9 / 3.0 - sr3)
    pressure = 16.0 / 3.0 * math.pi * density**2 * epsilon * sigma**3 * (2.0 * sr9 / 3.0 - sr3)
    return energy, pressure
