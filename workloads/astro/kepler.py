"""The analytic two-body orbit of the N-body model's ``kepler`` case, to check an integrator against.

:func:`kepler_period` and :func:`kepler_orbit` take a
:class:`~hpcgpu.workloads.astro.NBody` of the ``kepler`` case or the case's
parameters; the orbit itself (Kepler's equation) is in
:mod:`hpcgpu.workloads.astro.cases`.
"""

from collections.abc import Mapping

import numpy as np

from hpcgpu.errors import ConfigError
from hpcgpu.validation import check_float
from hpcgpu.workloads.astro import cases
from hpcgpu.workloads.astro.model import CASES, NBody

__all__ = ["kepler_period", "kepler_orbit"]


def _kepler_parameters(model, G):
    """``(parameters, G)`` of a kepler NBody or of a mapping of case parameters, checked."""
    spec = CASES["kepler"]
    if isinstance(model, NBody):
        if model.case != "kepler":
            raise ConfigError(f"model must be an NBody of the 'kepler' case; got case {model.case!r}")
        if model.softening != 0:
            raise ConfigError(f"model softening must be 0 for the analytic Kepler orbit (point masses); got "
                              f"softening={model.softening}")
        if G is not None:
            raise ConfigError(f"G comes from the model (G={model.G}); give G only with case parameters")
        return cases.check_kepler(model.case_parameters), model.G
    if model is None:
        model = {}
    if not isinstance(model, Mapping):
        raise ConfigError("model must be an NBody of the 'kepler' case or a mapping of its parameters "
                          f"{sorted(spec.parameters)}; got {type(model).__name__}")
    unknown = set(model) - set(spec.parameters)
    if unknown:
        raise ConfigError(f"unknown parameter(s) {sorted(unknown)} for case 'kepler'; valid: "
                          f"{sorted(spec.parameters)}")
    G = check_float("G", 1.0 if G is None else G, minimum=0.0, strict_min=True)
    return cases.check_kepler({**spec.parameters, **model}), G


def kepler_period(model=None, *, G=None):
    """Orbital period of the ``kepler`` case: ``2 pi sqrt(a**3 / (G M))`` (N-body time units).

    Parameters
    ----------
    model : NBody or mapping, optional
        An :class:`NBody` of the ``kepler`` case, or the case's parameters
        (``semi_major_axis``, ``eccentricity``, ``total_mass``,
        ``mass_ratio``; those left out take the case's defaults, as in
        ``NBody("kepler", **parameters)``). Default: the case's defaults.
    G : float, optional
        Gravitational constant with case parameters (default 1); a model
        brings its own.

    Returns
    -------
    float

    Raises
    ------
    ConfigError
        A model of another case or with softening, unknown or out-of-range parameters
        (``semi_major_axis``, ``total_mass``, ``mass_ratio`` > 0,
        0 <= ``eccentricity`` < 1), ``G`` <= 0 or given with a model.

    Examples
    --------
    >>> round(kepler_period(NBody("kepler", backend="numpy")), 6)  # a = 1, M = 1: 2 pi
    6.283185
    >>> round(kepler_period({"semi_major_axis": 4.0}), 6)  # Kepler's third law: 8 times longer
    50.265482
    """
    parameters, G = _kepler_parameters(model, G)
    return cases.kepler_period(parameters, G)


def kepler_orbit(model, t, *, G=None):
    """Both bodies of the ``kepler`` case at time ``t`` on the exact two-body orbit.

    The case starts (t = 0) at apocentre, relative position ``a (1 + e)``
    along +x, and orbits counter-clockwise in the x-y plane about the
    centre of mass, which stays at rest at the origin. The position on the
    ellipse at ``t`` comes from Kepler's equation ``E - e sin E = M``
    (mean anomaly ``M = pi + 2 pi t / period``), solved by Newton iteration
    to rounding, so the orbit is exact for any eccentricity 0 <= e < 1:
    compare a run of the model against it to measure an integrator's error.

    Parameters
    ----------
    model : NBody or mapping
        An :class:`NBody` of the ``kepler`` case, or the case's parameters
        (as for :func:`kepler_period`).
    t : float or array
        Model time(s) since the start (N-body units).
    G : float, optional
        Gravitational constant with case parameters (default 1).

    Returns
    -------
    positions, velocities : ndarray, float64, shape ``(3, 2)`` or ``(3, 2, *t.shape)``
        Rows x, y, z of the two bodies, laid out as a state's
        ``positions`` / ``velocities`` (on the host). Body 2 minus body 1
        is the relative orbit.

    Raises
    ------
    ConfigError
        As for :func:`kepler_period`, or a non-finite ``t``.

    Examples
    --------
    >>> import numpy as np
    >>> model = NBody("kepler", backend="numpy")  # a = 1, e = 0.5, equal masses
    >>> positions, velocities = kepler_orbit(model, kepler_period(model) / 2)
    >>> np.round(positions[:, 1] - positions[:, 0], 12) + 0.0  # pericentre: a (1 - e) along -x
    array([-0.5,  0. ,  0. ])
    >>> kepler_orbit(model, np.linspace(0.0, 1.0, 5))[0].shape
    (3, 2, 5)
    """
    parameters, G = _kepler_parameters(model, G)
    times = np.asarray(t, dtype=np.float64)
    if not bool(np.isfinite(times).all()):
        raise ConfigError(f"t must be finite model time(s); got {t!r}")
    return cases.kepler_state(parameters, times, G)
