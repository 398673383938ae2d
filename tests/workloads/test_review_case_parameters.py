"""Out-of-range case parameters and boundaries are one-line ConfigErrors naming them.

Before, a negative ``seed`` failed inside NumPy's random generator, a zero
``jet_width`` gave NaN fields reported as "h holds non-finite values", a
Rossby wave of wavenumbers (0, 0) divided by zero, a fractional wavenumber
silently broke the periodic domain, and ``boundary=("periodic", "open")``
failed deep in the stencil kernels; a Plummer sphere of zero mass or radius
gave NaN bodies and a galaxy collision closer than its pericentre a "math
domain error".
"""

import pytest

from hpcgpu.errors import ConfigError
from hpcgpu.workloads.astro import NBody
from hpcgpu.workloads.vorticity import BarotropicVorticity
from hpcgpu.workloads.weather import ShallowWater


@pytest.mark.parametrize("case, kwargs, match", [
    ("turbulence", dict(seed=-1), "seed must be >= 0"),
    ("turbulence", dict(seed=1.5), "seed must be an integer"),
    ("unstable_jet", dict(jet_width=0.0), "jet_width must be > 0"),
    ("gravity_wave", dict(wavenumber=1.5), "wavenumber must be an integer"),
    ("gravity_wave", dict(boundary=("periodic", "open")), "boundary along y must be 'periodic' or 'wall'"),
])
def test_weather_case_parameters_out_of_range(case, kwargs, match):
    with pytest.raises(ConfigError, match=match):
        ShallowWater(case, nx=16, ny=16, backend="numpy", **kwargs)


@pytest.mark.parametrize("case, kwargs, match", [
    ("turbulence", dict(seed=-2), "seed must be >= 0"),
    ("rossby_wave", dict(wavenumber_x=1.5), "wavenumber_x must be an integer"),
    ("rossby_wave", dict(wavenumber_x=0, wavenumber_y=0), "must not both be 0"),
])
def test_vorticity_case_parameters_out_of_range(case, kwargs, match):
    with pytest.raises(ConfigError, match=match):
        BarotropicVorticity(case, nx=16, ny=16, backend="numpy", **kwargs)


def test_whole_number_parameters_given_as_floats_still_work():
    assert ShallowWater("turbulence", nx=16, ny=16, backend="numpy", seed=3.0).initial_state().h.shape == (16, 16)
    model = BarotropicVorticity("rossby_wave", nx=16, ny=16, backend="numpy", wavenumber_x=0, wavenumber_y=-1)
    assert model.initial_state().zeta.shape == (16, 16)


@pytest.mark.parametrize("case, kwargs, match", [
    ("plummer", dict(total_mass=0.0), "total_mass must be > 0"),
    ("plummer", dict(scale_radius=-1.0), "scale_radius must be > 0"),
    ("galaxy_collision", dict(pericentre=0.0), "pericentre must be > 0"),
    ("galaxy_collision", dict(separation=0.1), "separation must be >= pericentre"),
    ("galaxy_collision", dict(total_mass=-1.0), "total_mass must be > 0"),
])
def test_nbody_case_parameters_out_of_range(case, kwargs, match):
    with pytest.raises(ConfigError, match=match):
        NBody(case, n=64, backend="numpy", **kwargs)


@pytest.mark.parametrize("make", [
    lambda: __import__("hpcgpu.workloads.astro", fromlist=["x"]).NBody("plummer", n=16, dtype=None),
    lambda: __import__("hpcgpu.workloads.weather", fromlist=["x"]).ShallowWater(nx=16, ny=8, dtype=None),
    lambda: __import__("hpcgpu.kernels.nbody", fromlist=["x"]).prepare_gravity(None, softening=0.1),
], ids=["nbody", "weather", "prepare_gravity"])
def test_a_dtype_of_none_is_refused_not_taken_for_float64(make):
    with pytest.raises(ConfigError, match="^dtype must be one of float32, float64; got None$"):
        make()
