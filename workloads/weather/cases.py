"""Named initial conditions of the shallow-water model.

Each case fixes a domain, boundaries, physical constants and its own
parameters, and builds ``(u, v, h)`` on the host in float64 for a block of
global rows and columns (``range`` objects): a rank of a distributed run
builds only its own cells, bitwise equal to the same cells of the whole
grid's fields. What a case computes along one axis (a profile in x or y)
is computed on the whole axis and then cut, so that every cell sees the
same arithmetic as in the whole grid; what it computes per cell is
evaluated on the block only. ``turbulence`` is the exception: its
streamfunction is an inverse FFT of random phases over the whole grid, so
each block builds the whole grid (on its own worker) and keeps its cells.

Examples
--------
>>> from hpcgpu.workloads.weather.grid import Grid
>>> from hpcgpu.workloads.weather.model import ShallowWaterParams
>>> grid = Grid(nx=8, ny=4, Lx=8e3, Ly=4e3)
>>> u, v, h = CASES["rest"].initial_condition(grid, ShallowWaterParams(), {}, range(1, 3), range(2, 8))
>>> h.shape
(2, 6)
"""

import math
from dataclasses import dataclass, field

import numpy as np

from hpcgpu.validation import check_float, check_int


def check_case_parameters(limits, values):
    """Raise ConfigError naming the first case parameter out of its range; returns None.

    ``limits`` maps a name to the keywords of :func:`~hpcgpu.validation.check_float`
    (or, with ``integer=True``, of :func:`~hpcgpu.validation.check_int`); a
    name without limits need only be a finite number.

    Examples
    --------
    >>> check_case_parameters({"seed": dict(integer=True, minimum=0)}, {"seed": -1})
    Traceback (most recent call last):
    ...
    hpcgpu.errors.ConfigError: seed must be >= 0, got -1
    """
    for key, value in values.items():
        limit = dict(limits.get(key, {}))
        if limit.pop("integer", False):
            check_float(key, value)  # NaN and inf: "must be finite", not a TypeError inside check_int
            check_int(key, value, **limit)
        else:
            check_float(key, value, **limit)


@dataclass(frozen=True)
class WeatherCase:
    """A named test case: defaults plus an initial-condition function.

    ``initial_condition(grid, params, case_parameters, rows, cols)`` returns
    host float64 ``(u, v, h)`` on the global ``rows`` and ``cols`` (ranges).
    ``block_local`` says whether it computes a block's cells without the
    whole grid (False: it builds the whole grid and cuts the block).

    ``limits`` gives the ranges of its ``parameters`` (see
    :func:`check_case_parameters`): a width of zero or a negative seed would
    otherwise fail inside NumPy, or give NaN fields.
    """

    name: str
    description: str
    initial_condition: object
    nx: int
    ny: int
    Lx: float
    Ly: float
    boundary: tuple
    physics: dict = field(default_factory=dict)
    parameters: dict = field(default_factory=dict)
    stop_time: float = 0.0
    limits: dict = field(default_factory=dict)
    block_local: bool = True


def _cut(line, cells):
    """The part of a whole-axis profile ``line`` at the global indices ``cells`` (a range)."""
    return line[cells.start:cells.stop]


def _gravity_wave(grid, params, case, rows, cols):
    """A standing plane wave h = H + A cos(k x): gravity wave (f0 = 0) or Poincare wave.

    Its angular frequency is ``sqrt(f0**2 + g H k**2)`` (the phase speed is
    ``sqrt(g H)`` for f0 = 0), with k = 2 pi m / Lx for wavenumber m.
    """
    shape = (len(rows), len(cols))
    k = 2 * math.pi * case["wavenumber"] / grid.Lx
    x = grid.x_centre()
    h_row = params.mean_depth + case["amplitude"] * np.cos(k * x)
    h = np.broadcast_to(_cut(h_row, cols), shape).copy()
    return np.zeros(shape), np.zeros(shape), h


def gravity_wave_frequency(params, case, Lx):
    """Analytic angular frequency (rad/s) of the ``gravity_wave`` case."""
    k = 2 * math.pi * case["wavenumber"] / Lx
    return math.sqrt(params.f0**2 + params.g * params.mean_depth * k**2)


def _unstable_jet(grid, params, case, rows, cols):
    """A Bickley jet u = U sech^2((y - y0)/L) in geostrophic balance, perturbed.

    Balance ``g dh/dy = -f u`` with ``f`` on the corner rows gives
    ``h = H - (f0 U L / g) tanh((y - y0)/L)`` on an f-plane; the beta term is
    integrated numerically. A small height bump of zonal wavenumbers 4 and 5
    seeds the barotropic instability (most unstable near k L = 0.9), which
    rolls the jet up into vortices within a few days.
    """
    speed, width = case["jet_speed"], case["jet_width"]
    y0 = 0.5 * grid.Ly
    yc = grid.y_centre()
    u_row = speed / np.cosh((yc - y0) / width) ** 2
    # Integrate g dh/dy = -f(y) u(y) on a fine grid for accuracy with beta.
    fine = np.linspace(0.0, grid.Ly, 20 * grid.ny + 1)
    f_fine = params.f0 + params.beta * (fine - y0)
    u_fine = speed / np.cosh((fine - y0) / width) ** 2
    integrand = -f_fine * u_fine / params.g
    dh = np.concatenate([[0.0], np.cumsum(0.5 * (integrand[1:] + integrand[:-1]) * np.diff(fine))])
    h_row = np.interp(yc, fine, dh)
    h_row += params.mean_depth - h_row.mean()
    x = grid.x_centre()
    bump = _cut(np.exp(-((yc - y0) / width) ** 2), rows)[:, None]
    wave = _cut(np.cos(2 * math.pi * 4 * x / grid.Lx) + 0.5 * np.sin(2 * math.pi * 5 * x / grid.Lx), cols)[None, :]
    h = _cut(h_row, rows)[:, None] + case["perturbation"] * bump * wave
    shape = (len(rows), len(cols))
    u = np.broadcast_to(_cut(u_row, rows)[:, None], shape).copy()
    return u, np.zeros(shape), h


def _turbulence(grid, params, case, rows, cols):
    """Random geostrophically balanced eddies on a doubly periodic f-plane.

    A streamfunction with random phases and a spectrum peaked at wavenumber
    ``peak_wavenumber`` lives on the corners; the discrete velocities are its
    exact C-grid curl (non-divergent) and the depth is in geostrophic balance,
    ``h = H + f0 psi / g``. Decaying 2D turbulence: energy and potential
    enstrophy are invariants of the scheme. The streamfunction is global
    (an inverse FFT), so the whole grid is built and the block cut from it.
    """
    rng = np.random.default_rng(int(case["seed"]))
    ky = np.fft.fftfreq(grid.ny, 1.0 / grid.ny)[:, None]
    kx = np.fft.fftfreq(grid.nx, 1.0 / grid.nx)[None, :]
    k = np.hypot(kx, ky)
    spectrum = np.exp(-0.5 * ((k - case["peak_wavenumber"]) / 2.0) ** 2)
    spectrum[0, 0] = 0.0
    phases = np.exp(2j * np.pi * rng.random(grid.shape))
    psi = np.fft.ifft2(spectrum * phases).real
    u = -(np.roll(psi, -1, axis=0) - psi) / grid.dy
    v = (np.roll(psi, -1, axis=1) - psi) / grid.dx
    scale = case["velocity"] / max(np.abs(u).max(), np.abs(v).max())
    psi, u, v = psi * scale, u * scale, v * scale
    psi_centre = 0.25 * (psi + np.roll(psi, -1, 0) + np.roll(psi, -1, 1) + np.roll(np.roll(psi, -1, 0), -1, 1))
    h = params.mean_depth + params.f0 * psi_centre / params.g
    block = (slice(rows.start, rows.stop), slice(cols.start, cols.stop))
    return u[block].copy(), v[block].copy(), h[block].copy()


def _rest(grid, params, case, rows, cols):
    """A flat layer at rest: it must stay exactly at rest."""
    shape = (len(rows), len(cols))
    return np.zeros(shape), np.zeros(shape), np.full(shape, params.mean_depth)


CASES = {
    "unstable_jet": WeatherCase(
        name="unstable_jet",
        description="barotropically unstable jet in a periodic channel; rolls up into vortices",
        initial_condition=_unstable_jet,
        nx=256, ny=128, Lx=4.0e6, Ly=2.0e6, boundary=("periodic", "wall"),
        physics=dict(g=9.81, f0=1e-4, beta=0.0, mean_depth=1000.0, viscosity=1000.0),
        parameters=dict(jet_speed=25.0, jet_width=1.5e5, perturbation=2.0),
        stop_time=4 * 86400.0,
        limits=dict(jet_width=dict(minimum=0.0, strict_min=True)),
    ),
    "gravity_wave": WeatherCase(
        name="gravity_wave",
        description="standing gravity (f0 = 0) or Poincare wave with a known frequency",
        initial_condition=_gravity_wave,
        nx=64, ny=16, Lx=1.0e6, Ly=2.5e5, boundary=("periodic", "periodic"),
        physics=dict(g=9.81, f0=0.0, beta=0.0, mean_depth=100.0, viscosity=0.0),
        parameters=dict(amplitude=0.1, wavenumber=1.0),
        stop_time=1.0e6 / math.sqrt(9.81 * 100.0),
        # a whole number of waves fits the periodic domain (and has the analytic frequency)
        limits=dict(wavenumber=dict(integer=True)),
    ),
    "turbulence": WeatherCase(
        name="turbulence",
        description="random balanced eddies, doubly periodic: decaying 2D turbulence",
        initial_condition=_turbulence,
        block_local=False,
        nx=128, ny=128, Lx=2.0e6, Ly=2.0e6, boundary=("periodic", "periodic"),
        physics=dict(g=9.81, f0=1e-4, beta=0.0, mean_depth=1000.0, viscosity=0.0),
        parameters=dict(velocity=10.0, peak_wavenumber=6.0, seed=0.0),
        stop_time=5 * 86400.0,
        limits=dict(seed=dict(integer=True, minimum=0)),
    ),
    "rest": WeatherCase(
        name="rest",
        description="a flat layer at rest (a lake-at-rest check)",
        initial_condition=_rest,
        nx=32, ny=32, Lx=1.0e6, Ly=1.0e6, boundary=("wall", "wall"),
        physics=dict(g=9.81, f0=1e-4, beta=1e-11, mean_depth=500.0, viscosity=0.0),
        parameters={},
        stop_time=86400.0,
    ),
}
