"""Named initial conditions of the N-body model, in N-body units (G = 1): functions of (seed, body id).

A case draws each body from counter-based random streams
(:mod:`hpcgpu.random_streams`): body ``i``'s position, velocity and mass
are a pure function of ``(seed, i)``, whatever the number of processes
that build the bodies, so a rank of a partitioned run builds only its own
(:mod:`hpcgpu.partition.bodies_start`). A case gives, for any ids, host
arrays in float64: ``sample`` the positions and velocities ``(3, M)``
about the origin of each body's *group* (a contiguous range of ids: one
Plummer sphere, each galaxy of a collision), ``masses`` ``(M,)``; and
``offsets`` where each group's centre of mass goes and how it moves.
:meth:`~hpcgpu.workloads.astro.NBody.initial_state` places every group at
its centre of mass, at rest, then moves it by its offsets: the centre of
mass of the whole is at the origin and the total momentum is zero (to
rounding).

Examples
--------
>>> import numpy as np
>>> ids = np.arange(6)
>>> every, _ = plummer_bodies(ids, seed=3, velocities=False)
>>> some, _ = plummer_bodies(ids[[4, 1]], seed=3, velocities=False)
>>> bool((some == every[:, [4, 1]]).all())
True
"""

import math
from dataclasses import dataclass, field

import numpy as np

from hpcgpu.errors import ConfigError
from hpcgpu.random_streams import stream_key, uniforms
from hpcgpu.validation import check_float

STREAM_PLACES = 1
"""Random stream of a Plummer body's radius and the directions of its position and velocity (5 per body)."""
STREAM_SPEEDS = 2
"""Random stream of a Plummer body's speed: 2 per body per attempt of the rejection sampler (step = attempt)."""
RADIUS_LIMIT = 10.0
"""Plummer bodies are drawn within this many scale radii (beyond it lies 1.5% of the mass)."""
_MASS_WITHIN_LIMIT = RADIUS_LIMIT**3 / (1.0 + RADIUS_LIMIT**2) ** 1.5


def one_group(n):
    """The groups of a case whose bodies form one system: ``((0, n),)``."""
    return ((0, n),)


@dataclass(frozen=True)
class AstroCase:
    """A named test case: defaults, and its bodies as functions of their ids.

    ``sample(ids, n, seed, case, G, velocities)`` gives float64 positions
    and velocities ``(3, M)`` (velocities None when not asked for) about
    each group's origin; ``masses(ids, n, case)``; ``groups(n)`` the
    ``(lo, hi)`` id ranges; ``offsets(case, G)`` the position and velocity
    offset of each group (None: at the origin, at rest). ``centred``
    False: the sample is already at its centre of mass, at rest (kepler).
    """

    name: str
    description: str
    sample: object
    masses: object
    n: int
    softening: float
    dt: float
    stop_time: float
    parameters: dict = field(default_factory=dict)
    check: object = None  # checks the case's parameters (raises ConfigError), or None
    groups: object = one_group
    offsets: object = None
    centred: bool = True


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


def _kepler_bodies(n, case, G):
    """Both bodies on an ellipse of semi-major axis a and eccentricity e, at apocentre, and their masses.

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


def _kepler(ids, n, seed, case, G, velocities=True):
    positions, moving, _ = _kepler_bodies(n, case, G)
    return positions[:, ids], moving[:, ids] if velocities else None


def _kepler_masses(ids, n, case):
    return _kepler_bodies(n, case, 1.0)[2][ids]


def plummer_radii(u, scale_radius):
    """Radii of a Plummer sphere from uniforms ``u`` in (0, 1]: the inverse of its mass profile within the limit.

    The mass within r is ``M r^3 / (r^2 + a^2)^(3/2)``; ``u`` scaled to the
    mass within :data:`RADIUS_LIMIT` scale radii keeps every body inside it.
    """
    return scale_radius / np.sqrt((u * _MASS_WITHIN_LIMIT) ** (-2.0 / 3.0) - 1.0)


def plummer_speed_fractions(ids, seed):
    """``q = v / v_escape`` of bodies ``ids`` from ``g(q) = q^2 (1 - q^2)^(7/2)`` by rejection (max of g < 0.1).

    Attempt k of a body draws 2 uniforms of stream :data:`STREAM_SPEEDS` at
    step k: a body's speed depends on its id only (about 2.3 attempts each).
    """
    ids = np.asarray(ids, dtype=np.int64)
    q = np.empty(ids.shape[0])
    todo = np.arange(ids.shape[0])
    attempt = 0
    while todo.size:
        trial, test = uniforms(np, stream_key(seed, STREAM_SPEEDS, attempt), ids[todo], 2)
        accept = 0.1 * test < trial**2 * (1 - trial**2) ** 3.5
        q[todo[accept]] = trial[accept]
        todo = todo[~accept]
        attempt += 1
    return q


def _isotropic(cos_u, phi_u):
    """Unit vectors ``(3, M)`` from uniforms: cos(theta) uniform in (-1, 1], phi in (0, 2 pi]."""
    cos_theta = 2.0 * cos_u - 1.0
    sin_theta = np.sqrt(np.maximum(1.0 - cos_theta**2, 0.0))
    phi = 2.0 * math.pi * phi_u
    return np.stack([sin_theta * np.cos(phi), sin_theta * np.sin(phi), cos_theta])


def plummer_bodies(ids, seed, total_mass=1.0, scale_radius=3 * math.pi / 16, G=1.0, velocities=True):
    """Bodies ``ids`` of a Plummer sphere in virial equilibrium (Aarseth, Henon & Wielen 1974), about its centre.

    Positions and velocities ``(3, M)`` (float64; velocities None unless
    asked), each body a pure function of ``(seed, id)``. With the defaults
    (M = 1, a = 3 pi / 16, G = 1) these are Henon units: total energy
    -1/4, virial radius 1, crossing time 2 sqrt(2) (for the sample, to
    its statistical spread ~ 1/sqrt(N)). Radii stay within
    :data:`RADIUS_LIMIT` scale radii.
    """
    ids = np.asarray(ids, dtype=np.int64)
    u = uniforms(np, stream_key(seed, STREAM_PLACES), ids, 5, open_below=True)
    radius = plummer_radii(u[0], scale_radius)
    positions = radius * _isotropic(u[1], u[2])
    if not velocities:
        return positions, None
    escape = np.sqrt(2 * G * total_mass) * (radius**2 + scale_radius**2) ** -0.25
    return positions, plummer_speed_fractions(ids, seed) * escape * _isotropic(u[3], u[4])


def _plummer(ids, n, seed, case, G, velocities=True):
    return plummer_bodies(ids, seed, case["total_mass"], case["scale_radius"], G, velocities)


def _equal_masses(ids, n, case):
    return np.full(len(ids), case["total_mass"] / n)


def _two_groups(n):
    """The two galaxies of a collision: bodies ``0 .. n // 2`` and the rest."""
    return ((0, n // 2), (n // 2, n))


def _collision(ids, n, seed, case, G, velocities=True):
    """Two equal Plummer spheres (each about its own centre; :func:`_collision_offsets` places them)."""
    return plummer_bodies(ids, seed, case["total_mass"] / 2, case["scale_radius"], G, velocities)


def _collision_masses(ids, n, case):
    half = n // 2
    ids = np.asarray(ids, dtype=np.int64)
    return np.where(ids < half, case["total_mass"] / 2 / half, case["total_mass"] / 2 / (n - half))


def _collision_offsets(case, G):
    """The galaxies on a parabolic orbit with pericentre distance q, at separation d, moving towards pericentre.

    The incoming branch of the parabola r = 2 q / (1 + cos f); each
    galaxy (mass M / 2) is half the relative vector from the common
    centre of mass, at rest at the origin.
    """
    q, d = case["pericentre"], case["separation"]
    total = case["total_mass"]
    anomaly = -math.acos(2 * q / d - 1)  # incoming branch
    p = 2 * q  # semi-latus rectum of a parabola
    radial = math.sqrt(G * total / p) * math.sin(anomaly)
    tangential = math.sqrt(G * total / p) * (1 + math.cos(anomaly))
    unit_r = np.array([math.cos(anomaly), math.sin(anomaly), 0.0])
    unit_t = np.array([-math.sin(anomaly), math.cos(anomaly), 0.0])
    relative_x = d * unit_r
    relative_v = radial * unit_r + tangential * unit_t
    return (tuple(-relative_x / 2), tuple(relative_x / 2)), (tuple(-relative_v / 2), tuple(relative_v / 2))


CASES = {
    "kepler": AstroCase(
        name="kepler", description="two bodies on a Kepler ellipse (period 2 pi by default)",
        sample=_kepler, masses=_kepler_masses, n=2, softening=0.0, dt=2 * math.pi / 2000,
        stop_time=10 * 2 * math.pi,
        parameters=dict(semi_major_axis=1.0, eccentricity=0.5, total_mass=1.0, mass_ratio=1.0),
        check=check_kepler, centred=False),
    "plummer": AstroCase(
        name="plummer", description="a Plummer sphere in virial equilibrium (Henon units)",
        sample=_plummer, masses=_equal_masses, n=4096, softening=0.01, dt=0.005, stop_time=10 * 2 * math.sqrt(2),
        parameters=dict(total_mass=1.0, scale_radius=3 * math.pi / 16), check=check_plummer),
    "galaxy_collision": AstroCase(
        name="galaxy_collision", description="two Plummer galaxies on a parabolic orbit",
        sample=_collision, masses=_collision_masses, n=8192, softening=0.01, dt=0.005, stop_time=10.0,
        parameters=dict(total_mass=1.0, scale_radius=0.15, pericentre=0.5, separation=4.0),
        check=check_collision, groups=_two_groups, offsets=_collision_offsets),
}
