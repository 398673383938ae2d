"""Named initial conditions of the barotropic vorticity model.

Each case fixes a domain, boundaries, physical constants and its own
parameters, and builds the streamfunction ``psi`` (m**2/s) on the grid's
points (``x = i dx``, ``y = j dy``) on the host in float64. The model takes
the vorticity as the discrete Laplacian of it, so the initial state is
exactly balanced. On a channel (walls in y) ``psi`` vanishes on both walls.
"""

import math
from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True)
class VorticityCase:
    """A named test case: defaults plus an initial streamfunction."""

    name: str
    description: str
    streamfunction: object
    nx: int
    ny: int
    Lx: float
    Ly: float
    boundary: tuple
    physics: dict = field(default_factory=dict)
    parameters: dict = field(default_factory=dict)
    stop_time: float = 0.0
    limits: dict = field(default_factory=dict)
    """Ranges of the parameters (:func:`hpcgpu.workloads.weather.cases.check_case_parameters`)."""


def _wavenumbers(grid, case):
    """``(k, l)`` in 1/m: 2 pi m / L along periodic axes, pi m / Ly across a channel."""
    k = 2 * math.pi * case["wavenumber_x"] / grid.Lx
    l_factor = math.pi if grid.wall_y else 2 * math.pi
    return k, l_factor * case["wavenumber_y"] / grid.Ly


def _rossby_wave(grid, params, case):
    """A single Rossby wave, ``psi = A sin(k x + l y)`` (``A sin(k x) sin(l y)`` in a channel).

    A single Fourier mode is an exact nonlinear solution: its Jacobian
    ``J(psi, lap psi)`` vanishes (and so does Arakawa's discrete one for the
    discrete Laplacian), so the wave only propagates, at the frequency of
    :func:`rossby_wave_frequency`. ``A`` is set by the peak speed ``velocity``.
    """
    k, l = _wavenumbers(grid, case)
    x, y = grid.x_face()[None, :], grid.y_face()[:, None]
    if grid.wall_y:
        psi = np.sin(k * x) * np.sin(l * y)
    else:
        psi = np.sin(k * x + l * y) * np.ones_like(y)
    return case["velocity"] / math.hypot(k, l) * psi


def rossby_wave_frequency(params, case, grid, discrete=False):
    """Angular frequency (rad/s, negative: westward) of the ``rossby_wave`` case.

    Continuous equation: ``omega = -beta k / (k**2 + l**2)``. With
    ``discrete=True``, that of the semi-discrete scheme: the centred
    difference gives ``sin(k dx) / dx`` for ``k`` and the five-point
    Laplacian the eigenvalue ``4 sin(k dx/2)**2 / dx**2 + 4 sin(l dy/2)**2 / dy**2``
    for ``k**2 + l**2``. The zonal phase speed is ``omega / k`` (m/s).
    """
    k, l = _wavenumbers(grid, case)
    if not discrete:
        return -params.beta * k / (k * k + l * l)
    dx, dy = grid.dx, grid.dy
    k_eff = math.sin(k * dx) / dx
    k2 = 4 * math.sin(0.5 * k * dx) ** 2 / dx**2 + 4 * math.sin(0.5 * l * dy) ** 2 / dy**2
    return -params.beta * k_eff / k2


def _turbulence(grid, params, case):
    """Random eddies with a spectrum peaked at ``peak_wavenumber``: decaying 2D turbulence.

    Random phases (seeded by ``seed``), amplitude set so that the peak speed
    is ``velocity``. In a channel the field is the odd part of a field on
    twice the height, so it vanishes on both walls. On a beta plane the
    eddies radiate Rossby waves and organise into zonal jets (Rhines 1975).
    """
    rng = np.random.default_rng(int(case["seed"]))
    rows = 2 * grid.ny if grid.wall_y else grid.ny
    ky = np.fft.fftfreq(rows, 1.0 / rows)[:, None] * (0.5 if grid.wall_y else 1.0) * grid.Lx / grid.Ly
    kx = np.fft.fftfreq(grid.nx, 1.0 / grid.nx)[None, :]
    k = np.hypot(kx, ky)
    spectrum = np.exp(-0.5 * ((k - case["peak_wavenumber"]) / 2.0) ** 2)
    spectrum[0, 0] = 0.0
    phases = np.exp(2j * np.pi * rng.random((rows, grid.nx)))
    psi = np.fft.ifft2(spectrum * phases).real
    if grid.wall_y:
        mirror = psi[(-np.arange(rows)) % rows]
        psi = 0.5 * (psi - mirror)[:grid.ny]
    u = (np.roll(psi, -1, axis=0) - psi) / grid.dy
    v = (np.roll(psi, -1, axis=1) - psi) / grid.dx
    return psi * case["velocity"] / max(np.abs(u).max(), np.abs(v).max())


CASES = {
    "rossby_wave": VorticityCase(
        name="rossby_wave",
        description="a single Rossby wave on the beta plane with a known phase speed",
        streamfunction=_rossby_wave,
        nx=64, ny=64, Lx=6.0e6, Ly=6.0e6, boundary=("periodic", "periodic"),
        physics=dict(beta=1.6e-11, viscosity=0.0),
        parameters=dict(velocity=10.0, wavenumber_x=2.0, wavenumber_y=1.0),
        stop_time=10 * 86400.0,
        # whole waves fit the periodic domain (or the channel); (0, 0) is no wave (the model refuses it)
        limits=dict(wavenumber_x=dict(integer=True), wavenumber_y=dict(integer=True)),
    ),
    "turbulence": VorticityCase(
        name="turbulence",
        description="decaying 2D turbulence on the beta plane: eddies merge and form zonal jets",
        streamfunction=_turbulence,
        nx=128, ny=128, Lx=4.0e6, Ly=4.0e6, boundary=("periodic", "periodic"),
        physics=dict(beta=1.6e-11, viscosity=2000.0),
        parameters=dict(velocity=10.0, peak_wavenumber=8.0, seed=0.0),
        stop_time=20 * 86400.0,
        limits=dict(seed=dict(integer=True, minimum=0)),
    ),
}
