"""The vorticity model checkpoints and resumes like the other models, in Python and from the command line.

``Simulation.run(checkpoint=...)`` saves the model's state through its
``to_host`` and restores it through ``restore_state``; ``hpcgpu run
vorticity`` takes the ``--checkpoint``/``--resume`` options every run
command documents. A resumed run continues bitwise: ``psi`` is restored as
saved, since CG starts each solve from it.
"""

import os
import subprocess
import sys

import numpy as np
import pytest
import xarray as xr

from hpcgpu import Simulation
from hpcgpu.workloads.vorticity import BarotropicVorticity


@pytest.mark.parametrize("solver", ["fft", "cg"])
def test_checkpoint_and_resume_continue_bitwise(tmp_path, solver):
    model = BarotropicVorticity("turbulence", nx=16, ny=16, backend="numpy", solver=solver)
    dt = model.suggested_dt(model.initial_state())
    whole = Simulation(model, dt=dt, stop_steps=8, progress=False).run()
    Simulation(model, dt=dt, stop_steps=5, progress=False).run(checkpoint=tmp_path / "ckpt")
    later = Simulation.resume(tmp_path / "ckpt", stop_steps=8, progress=False)
    assert later.step == 5
    later.run()
    for got, want in zip(later.state.arrays(), whole.state.arrays()):
        assert np.array_equal(got, want)
    assert later.diagnostics.drop_vars("wall_s").equals(whole.diagnostics.drop_vars("wall_s"))


def _cli(*args):
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    return subprocess.run([sys.executable, "-P", "-m", "hpcgpu.cli", "run", "vorticity", *args],
                          capture_output=True, text=True, timeout=300, env=env)


def test_cli_resume_continues_the_run_and_its_store(tmp_path):
    common = ("--case", "turbulence", "--nx", "16", "--ny", "16", "--backend", "numpy", "--no-progress")
    whole = _cli(*common, "--steps", "10", "--out", str(tmp_path / "whole"))
    assert whole.returncode == 0, whole.stderr
    first = _cli(*common, "--steps", "6", "--out", str(tmp_path / "parts"), "--checkpoint", str(tmp_path / "ckpt"))
    assert first.returncode == 0, first.stderr
    second = _cli("--resume", str(tmp_path / "ckpt"), "--steps", "10", "--out", str(tmp_path / "parts"),
                  "--no-progress")
    assert second.returncode == 0, second.stderr
    want, got = (xr.open_zarr(tmp_path / name / "fields.zarr") for name in ("whole", "parts"))
    assert int(got["step"][-1]) == 10 and list(got["step"].values) == sorted(set(got["step"].values))
    for name in ("zeta", "psi"):
        assert np.array_equal(got[name].isel(time=-1).values, want[name].isel(time=-1).values)
