"""The diagnostics group of a Zarr output says its units, as the fields beside it do.

Before, every variable of the ``diagnostics`` group, its ``time`` axis
included, had no attributes: a weather run's seconds and an N-body run's
N-body time units read the same, and so did energies in m5 s-2 and in
N-body units.
"""

import pytest
import xarray as xr

from hpcgpu import Simulation, ZarrWriter
from hpcgpu.workloads.astro import NBody
from hpcgpu.workloads.vorticity import BarotropicVorticity
from hpcgpu.workloads.weather import ShallowWater


@pytest.mark.parametrize("make, dt, expected", [
    (lambda: ShallowWater("gravity_wave", nx=16, ny=8, backend="numpy"), None,
     {"time": "s", "mass": "m3", "energy": "m5 s-2", "enstrophy": "m s-2", "wall_s": "s"}),
    (lambda: NBody("plummer", n=32, backend="numpy"), 0.01,
     {"time": "time (N-body units)", "energy": "energy (N-body units)", "virial_ratio": "1"}),
    (lambda: BarotropicVorticity("rossby_wave", nx=16, ny=16, backend="numpy"), None,
     {"time": "s", "energy": "m4 s-2", "enstrophy": "m2 s-2", "circulation": "m2 s-1"}),
], ids=["weather", "nbody", "vorticity"])
def test_diagnostics_group_has_units(tmp_path, make, dt, expected):
    sim = Simulation(make(), dt=dt, stop_steps=3, progress=False)
    sim.add_writer(ZarrWriter(tmp_path / "run.zarr", 3)).run()
    diagnostics = xr.open_zarr(tmp_path / "run.zarr", group="diagnostics")
    fields = xr.open_zarr(tmp_path / "run.zarr")
    assert {name: diagnostics[name].attrs.get("units") for name in expected} == expected
    assert diagnostics["time"].attrs["units"] == fields["time"].attrs["units"]
