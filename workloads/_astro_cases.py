"""Named initial conditions of the N-body model, in N-body units (G = 1).

Each case returns host arrays ``positions (3, N)``, ``velocities (3, N)``
and ``masses (N,)`` in float64, with the centre of mass at the origin and
zero total momentum.
"""

import math
from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True)
class Case:
    """A named test case: defaults and a generator."""

    name: str
    description: str
    generate: object
    n: int
    softening: float
    dt: float
    stop_time: float
    parameters: dict = field(default_factory=dict)


def _centre(positions, velocities, masses):
    total = masses.sum()
    positions = positions - (positions * masses).sum(axis=1, keepdims=True) / total
    velocities = velocities - (velocities * masses).sum(axis=1, keepdims=True) / total
    return positions, velocities, masses


def kepler_period(case, G=1.0):
    """Orbital period of the ``kepler`` case: 2 pi sqrt(a^3 / (G M))."""
    return 2 * math.pi * math.sqrt(case["semi_major_axis"] ** 3 / (G * case["total_mass"]))


def _kepler(n, rng, case, G):
    """Two bodies on an ellipse of semi-major axis a and eccentricity e, at apocentre."""
    if n != 2:
        raise ValueError("the kepler case has exactly 2 bodies")
    a, e, total = case["semi_major_axis"], case["eccentricity"], case["total_mass"]
    ratio = case["mass_ratio"]
    m2 = total * ratio / (1 + ratio)
    masses = np.array([total - m2, m2])
    separation = a * (1 + e)
    speed = math.sqrt(G * total * (1 - e) / (a * (1 + e)))  # relative speed at apocentre
    relative_x = np.array([separation, 0.0, 0.0])
    relative_v = np.array([0.0, speed, 0.0])
    positions = np.stack([-m2 / total * relative_x, (total - m2) / total * relative_x], axis=1)
    velocities = np.stack([-m2 / total * relative_v, (total - m2) / total * relative_v], axis=1)
    return positions, velocities, masses


def plummer_sphere(n, rng, total_mass=1.0, scale_radius=3 * math.pi / 16, G=1.0):
    """Sample a Plummer sphere in virial equilibrium (Aarseth, Henon & Wielen 1974).

    With the defaults (M = 1, a = 3 pi / 16, G = 1) these are Henon units:
    total energy -1/4, virial radius 1, crossing time 2 sqrt(2).
    Radii beyond 10 scale radii are redrawn (they hold 0.1% of the mass).
    """
    masses = np.full(n, total_mass / n)
    radius = np.empty(n)
    todo = np.arange(n)
    while todo.size:
        x = rng.random(todo.size)
        r = 1.0 / np.sqrt(np.maximum(x, 1e-300) ** (-2.0 / 3.0) - 1.0)
        keep = r < 10.0
        radius[todo[keep]] = r[keep]
        todo = todo[~keep]
    radius *= scale_radius
    positions = radius * _isotropic(n, rng)
    # speed: q = v / v_escape from g(q) = q^2 (1 - q^2)^(7/2) by rejection (max of g < 0.1)
    q = np.empty(n)
    todo = np.arange(n)
    while todo.size:
        trial = rng.random(todo.size)
        accept = 0.1 * rng.random(todo.size) < trial**2 * (1 - trial**2) ** 3.5
        q[todo[accept]] = trial[accept]
        todo = todo[~accept]
    escape = np.sqrt(2 * G * total_mass) * (radius**2 + scale_radius**2) ** -0.25
    velocities = q * escape * _isotropic(n, rng)
    return _centre(positions, velocities, masses)


def _isotropic(n, rng):
    cos_theta = rng.uniform(-1, 1, n)
    phi = rng.uniform(0, 2 * math.pi, n)
    sin_theta = np.sqrt(1 - cos_theta**2)
    return np.stack([sin_theta * np.cos(phi), sin_theta * np.sin(phi), cos_theta])


def _plummer(n, rng, case, G):
    return plummer_sphere(n, rng, case["total_mass"], case["scale_radius"], G)


def _collision(n, rng, case, G):
    """Two equal Plummer spheres on a parabolic orbit with pericentre distance q.

    The galaxies start at separation d on the incoming branch of the
    parabola r = 2 q / (1 + cos f), moving towards pericentre.
    """
    half = n // 2
    mass = case["total_mass"] / 2
    first = plummer_sphere(half, rng, mass, case["scale_radius"], G)
    second = plummer_sphere(n - half, rng, mass, case["scale_radius"], G)
    q, d = case["pericentre"], case["separation"]
    total = 2 * mass
    anomaly = -math.acos(2 * q / d - 1)  # incoming branch
    p = 2 * q  # semi-latus rectum of a parabola
    radial = math.sqrt(G * total / p) * math.sin(anomaly)
    tangential = math.sqrt(G * total / p) * (1 + math.cos(anomaly))
    unit_r = np.array([math.cos(anomaly), math.sin(anomaly), 0.0])
    unit_t = np.array([-math.sin(anomaly), math.cos(anomaly), 0.0])
    relative_x = d * unit_r
    relative_v = radial * unit_r + tangential * unit_t
    positions = np.concatenate([first[0] - relative_x[:, None] / 2, second[0] + relative_x[:, None] / 2], axis=1)
    velocities = np.concatenate([first[1] - relative_v[:, None] / 2, second[1] + relative_v[:, None] / 2], axis=1)
    masses = np.concatenate([first[2], second[2]])
    return _centre(positions, velocities, masses)


CASES = {
    "kepler": Case(
        name="kepler", description="two bodies on a Kepler ellipse (period 2 pi by default)",
        generate=_kepler, n=2, softening=0.0, dt=2 * math.pi / 2000, stop_time=10 * 2 * math.pi,
        parameters=dict(semi_major_axis=1.0, eccentricity=0.5, total_mass=1.0, mass_ratio=1.0)),
    "plummer": Case(
        name="plummer", description="a Plummer sphere in virial equilibrium (Henon units)",
        generate=_plummer, n=4096, softening=0.01, dt=0.005, stop_time=10 * 2 * math.sqrt(2),
        parameters=dict(total_mass=1.0, scale_radius=3 * math.pi / 16)),
    "galaxy_collision": Case(
        name="galaxy_collision", description="two Plummer galaxies on a parabolic orbit",
        generate=_collision, n=8192, softening=0.01, dt=0.005, stop_time=10.0,
        parameters=dict(total_mass=1.0, scale_radius=0.15, pericentre=0.5, separation=4.0)),
}
