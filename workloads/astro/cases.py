"""Named initial conditions of the N-body model, in N-body units (G = 1).

Each case returns host arrays ``positions (3, N)``, ``velocities (3, N)``
and ``masses (N,)`` in float64, with the centre of mass at the origin and
zero total momentum.
"""

import math
from dataclasses import dataclass, field

import numpy as np

from hpcgpu.errors import ConfigError
from hpcgpu.validation import check_float


@dataclass(frozen=True)
class AstroCase:
    """A named test case: defaults and a generator."""

    name: str
    description: str
    generate: object
    n: int
    softening: float
    dt: float
    stop_time: float
    parameters: dict = field(default_factory=dict)
    check: object = None  # checks the case's parameters (raises ConfigError), or None


def _centre(positions, velocities, masses):
    total = masses.sum()
    positions = positions - (positions * masses).sum(axis=1, keepdims=True) / total
    velocities = velocities - (velocities * masses).sum(axis=1, keepdims=True) / total
    return positions, velocities, masses


def check_kepler(case):
    """The ``kepler`` case's parameters as floats, checked; raises ConfigError naming the bad one.

    The orbit is a bound ellipse: semi-major axis > 0, 0 <= eccentricity < 1,
    total mass > 0 and mass ratio m2/m1 > 0.
    """
    out = {key: check_float(key, value) for key, value in case.items()}
    for key in ("semi_major_axis", "total_mass", "mass_ratio"):
        check_float(key, out[key], minimum=0.0, strict_min=True)
    if not 0.0 <= out["eccentricity"] < 1.0:
        raise ConfigError(f"eccentricity must be >= 0 and < 1 (a bound ellipse); got {out['eccentricity']}")
    return out


def check_plummer(case):
    """The ``plummer`` case's parameters, checked: total mass and scale radius > 0 (else NaN bodies)."""
    for key in ("total_mass", "scale_radius"):
        check_float(key, case[key], minimum=0.0, strict_min=True)
    return case


def check_collision(case):
    """The ``galaxy_collision`` case's parameters, checked; raises ConfigError naming the bad one.

    Masses, radii and the pericentre distance are > 0, and the galaxies
    start at a separation of at least the pericentre distance (the closest
    points of their parabolic orbit).
    """
    check_plummer(case)
    q = check_float("pericentre", case["pericentre"], minimum=0.0, strict_min=True)
    if not check_float("separation", case["separation"]) >= q:
        raise ConfigError(f"separation must be >= pericentre ({q:g}: the parabolic orbit comes no closer); "
                          f"got {case['separation']:g}")
    return case


def kepler_period(case, G=1.0):
    """Orbital period of the ``kepler`` case: 2 pi sqrt(a^3 / (G M))."""
    return 2 * math.pi * math.sqrt(case["semi_major_axis"] ** 3 / (G * case["total_mass"]))


def eccentric_anomaly(mean_anomaly, eccentricity):
    """Solve Kepler's equation E - e sin E = M for E (radians, same shape as M) by Newton iteration.

    M is first reduced to [0, 2 pi). The start E = pi converges for every
    M there and every 0 <= e < 1 (Charles & Tatum 1998), so no case needs
    a special first guess; near e = 1 it takes a few more iterations.
    """
    mean_anomaly = np.mod(np.asarray(mean_anomaly, dtype=np.float64), 2 * math.pi)
    anomaly = np.full_like(mean_anomaly, math.pi)
    for _ in range(100):
        step = ((anomaly - eccentricity * np.sin(anomaly) - mean_anomaly)
                / (1 - eccentricity * np.cos(anomaly)))
        anomaly = anomaly - step
        if float(np.abs(step).max(initial=0.0)) < 1e-12:
            break
    # Newton converges quadratically: one more step takes a 1e-12 error to rounding
    return anomaly - (anomaly - eccentricity * np.sin(anomaly) - mean_anomaly) / (1 - eccentricity * np.cos(anomaly))


def kepler_state(case, t, G=1.0):
    """Both bodies of the ``kepler`` case at time ``t``: positions and velocities ``(3, 2, *t.shape)``.

    The case starts at apocentre on the +x axis and orbits counter-clockwise
    in the x-y plane about the centre of mass (at rest at the origin), so
    the mean anomaly is pi + n t with mean motion n = 2 pi / period, and
    the pericentre lies on the -x axis.
    """
    a, e, total, ratio = (case[k] for k in ("semi_major_axis", "eccentricity", "total_mass", "mass_ratio"))
    t = np.asarray(t, dtype=np.float64)
    motion = math.sqrt(G * total / a**3)
    anomaly = eccentric_anomaly(math.pi + motion * t, e)
    cos_e, sin_e = np.cos(anomaly), np.sin(anomaly)
    b = a * math.sqrt(1 - e * e)
    rate = motion / (1 - e * cos_e)  # dE/dt
    zero = np.zeros_like(t)
    relative_x = np.stack([-a * (cos_e - e), -b * sin_e, zero])
    relative_v = np.stack([a * sin_e * rate, -b * cos_e * rate, zero])
    m2 = total * ratio / (1 + ratio)
    m1 = total - m2
    positions = np.stack([-m2 / total * relative_x, m1 / total * relative_x], axis=1)
    velocities = np.stack([-m2 / total * relative_v, m1 / total * relative_v], axis=1)
    return positions, velocities


def _kepler(n, rng, case, G):
    """Two bodies on an ellipse of semi-major axis a and eccentricity e, at apocentre.

    :func:`kepler_state` at t = 0 gives the same bodies (to rounding).
    """
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
    "kepler": AstroCase(
        name="kepler", description="two bodies on a Kepler ellipse (period 2 pi by default)",
        generate=_kepler, n=2, softening=0.0, dt=2 * math.pi / 2000, stop_time=10 * 2 * math.pi,
        parameters=dict(semi_major_axis=1.0, eccentricity=0.5, total_mass=1.0, mass_ratio=1.0),
        check=check_kepler),
    "plummer": AstroCase(
        name="plummer", description="a Plummer sphere in virial equilibrium (Henon units)",
        generate=_plummer, n=4096, softening=0.01, dt=0.005, stop_time=10 * 2 * math.sqrt(2),
        parameters=dict(total_mass=1.0, scale_radius=3 * math.pi / 16), check=check_plummer),
    "galaxy_collision": AstroCase(
        name="galaxy_collision", description="two Plummer galaxies on a parabolic orbit",
        generate=_collision, n=8192, softening=0.01, dt=0.005, stop_time=10.0,
        parameters=dict(total_mass=1.0, scale_radius=0.15, pericentre=0.5, separation=4.0),
        check=check_collision),
}
