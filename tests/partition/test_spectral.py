"""Row blocks with a slab-FFT solve per stage: the vorticity model partitioned gives the one-process run bitwise.

Bitwise, not to a tolerance: every 1-D transform of the partitioned solve
runs on the same line of numbers as in one process, and the diagnostics
are exact partial sums. Fields, energy, enstrophy, circulation and the
CFL number are compared with ``assert_array_equal``.
"""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from hpcgpu import Simulation
from hpcgpu.cluster import worker_info
from hpcgpu.errors import ConfigError
from hpcgpu.partition.communicator import LoopbackCommunicator
from hpcgpu.partition.dask_communicator import communicator
from hpcgpu.partition.dask_session import close_session, open_session
from hpcgpu.partition.protocols import SpectralModel, missing_methods
from hpcgpu.partition.spectral import SpectralDecomposition
from hpcgpu.partition.transpose import columns_to_rows, even_bounds, rows_to_columns
from hpcgpu.workloads.vorticity import BarotropicVorticity

BOUNDARIES = {"periodic": "periodic", "channel": ("periodic", "wall")}
DIAGNOSTICS = ("energy", "enstrophy", "circulation", "max_cfl")


def _model(boundary, **kwargs):
    # 31 rows and 17 x wavenumbers: 2 and 3 ranks get uneven blocks of both
    return BarotropicVorticity("turbulence", nx=32, ny=31, backend="numpy", boundary=BOUNDARIES[boundary], **kwargs)


def _assert_same(result, reference):
    for name in ("zeta", "psi"):
        np.testing.assert_array_equal(getattr(result.state, name), getattr(reference.state, name), err_msg=name)
    got, expected = result.diagnostics, reference.diagnostics.sel(time=result.diagnostics.time)
    for key in DIAGNOSTICS:
        np.testing.assert_array_equal(got[key], expected[key], err_msg=key)


@pytest.mark.parametrize("boundary", sorted(BOUNDARIES))
@pytest.mark.parametrize("partitions", [1, 2, 3])
def test_partitioned_vorticity_equals_one_process_bitwise(client, partitions, boundary):
    model = _model(boundary)
    state = model.initial_state()
    dt = model.suggested_dt(state)
    reference = Simulation(model, state, dt=dt, stop_steps=7, progress=False, diagnostics=1).run()
    sim = Simulation(model, state, dt=dt, stop_steps=7, progress=False, diagnostics=1, client=client,
                     partitions=partitions).run()
    summary = sim.summary()
    assert summary["process_grid"] == f"1x{partitions}" and sum(summary["block_rows"]) == 31
    assert sum(summary["wavenumbers_per_rank"]) == 17
    _assert_same(sim, reference)
    sim.close()


def test_float32_on_numba_is_bitwise_too(client):
    model = BarotropicVorticity("rossby_wave", nx=24, ny=20, dtype="float32", backend="numba",
                                boundary=("periodic", "wall"))
    state = model.initial_state()
    dt = model.suggested_dt(state)
    reference = Simulation(model, state, dt=dt, stop_steps=6, progress=False, diagnostics=2).run()
    sim = Simulation(model, state, dt=dt, stop_steps=6, progress=False, diagnostics=2, client=client,
                     partitions=3).run()
    assert sim.state.zeta.dtype == np.float32
    _assert_same(sim, reference)
    sim.close()


def test_weighted_blocks_and_a_given_grid_give_the_same_answer(client):
    model = _model("channel")
    state = model.initial_state()
    dt = model.suggested_dt(state)
    reference = Simulation(model, state, dt=dt, stop_steps=5, progress=False, diagnostics=1).run()
    sim = Simulation(model, state, dt=dt, stop_steps=5, progress=False, diagnostics=1, client=client, grid=(1, 2),
                     weights=[1.0, 3.0]).run()
    rows = sim.summary()["block_rows"]
    assert rows[1] > 2 * rows[0] and sum(rows) == 31
    _assert_same(sim, reference)
    sim.close()


def test_a_checkpoint_resumes_on_another_partition_count_bitwise(client, tmp_path):
    model = _model("channel")
    state = model.initial_state()
    dt = model.suggested_dt(state)
    reference = Simulation(model, state, dt=dt, stop_steps=10, progress=False, diagnostics=1).run()
    first = Simulation(model, state, dt=dt, stop_steps=4, progress=False, diagnostics=1, client=client, partitions=3)
    first.run(checkpoint=tmp_path / "three")
    first.close()
    second = Simulation.resume(tmp_path / "three", client=client, partitions=2, stop_steps=7).run(
        checkpoint=tmp_path / "two")
    second.close()
    third = Simulation.resume(tmp_path / "two", stop_steps=10).run()  # and on to one process
    _assert_same(third, reference)


def test_the_model_is_a_spectral_model_and_its_one_process_step_is_a_single_block():
    model = _model("periodic")
    assert model.decomposition == "spectral" and missing_methods(model, SpectralModel) == []
    state = model.initial_state()
    # the line transforms solve the Poisson equation the operator's rfft2 solves, to rounding
    psi = model.streamfunction(state.zeta)
    expected = model.poisson.solve_fft(state.zeta)
    assert np.abs(psi - psi.mean() - expected).max() <= 1e-12 * np.abs(expected).max()


@pytest.mark.parametrize("model_options, run_options, match", [
    (dict(solver="cg"), {}, r"solver='cg' runs in one process only.*solver='fft'"),
    ({}, dict(grid=(2, 1)), r"grid=2x1.*1x2"),
    ({}, dict(steps_per_task=2), r"steps_per_task=2.*steps_per_task=1"),
], ids=["cg", "grid", "steps_per_task"])
def test_what_the_spectral_split_cannot_take_is_a_config_error(client, model_options, run_options, match):
    model = _model("periodic", **model_options)
    with pytest.raises(ConfigError, match=match):
        Simulation(model, dt=600.0, stop_steps=1, progress=False, client=client, partitions=2, **run_options)


def test_more_ranks_than_x_wavenumbers_is_a_config_error():
    model = BarotropicVorticity("turbulence", nx=8, ny=64, backend="numpy")
    with pytest.raises(ConfigError, match=r"partitions=6.*5 x wavenumbers of nx=8.*at most 5"):
        SpectralDecomposition.build(model, 600.0, 6, None, None, False)


# -- the transpose ---------------------------------------------------------------------------------------
def _transpose_round_trip(comm, array, row_bounds, column_bounds):
    r0, r1 = row_bounds[comm.rank]
    columns = rows_to_columns(comm, array[r0:r1], column_bounds, "t", np)
    back = columns_to_rows(comm, columns * 2, row_bounds, "u", np)
    c0, c1 = column_bounds[comm.rank]
    return np.array_equal(columns, array[:, c0:c1]), np.array_equal(back, 2 * array[r0:r1])


def _rank_task(session, rank, *args):
    return _transpose_round_trip(communicator(session, rank), *args)


def test_rows_to_columns_and_back_on_two_ranks(client, rng):
    array = rng.standard_normal((7, 5)) + 1j * rng.standard_normal((7, 5))
    rows, columns = ((0, 3), (3, 7)), even_bounds(5, 2)
    session = open_session(client, sorted(worker_info(client)), timeout=30)
    try:
        futures = [client.submit(_rank_task, session, rank, array, rows, columns, workers=[address],
                                 allow_other_workers=False, pure=False)
                   for rank, address in enumerate(session.addresses)]
        assert client.gather(futures) == [(True, True), (True, True)]
    finally:
        close_session(client, session)
    assert _transpose_round_trip(LoopbackCommunicator(), array, ((0, 7),), ((0, 5),)) == (True, True)


# -- the command line --------------------------------------------------------------------------------------
def _run_cli(cwd, *words):
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    result = subprocess.run([sys.executable, "-P", "-m", "hpcgpu.cli", "run", "vorticity", "--no-progress", *words],
                            capture_output=True, text=True, timeout=1800, env=env, cwd=cwd)
    assert result.returncode == 0, result.stderr[-3000:]
    return result


@pytest.mark.slow
def test_hpcgpu_run_vorticity_on_two_workers_equals_one_process(tmp_path):
    import xarray as xr

    result = _run_cli(tmp_path, "--workers", "2", "--out", "two")
    assert "2 workers, 2 partitions" in result.stdout
    _run_cli(tmp_path, "--out", "one")
    two, one = (json.loads((tmp_path / name / "summary.json").read_text()) for name in ("two", "one"))
    assert two["partitions"] == 2 and two["step"] == one["step"]
    for key in ("energy_relative_change", "enstrophy_relative_change", "circulation", "max_cfl"):
        assert two[key] == one[key], key
    with xr.open_zarr(tmp_path / "two" / "fields.zarr") as a, xr.open_zarr(tmp_path / "one" / "fields.zarr") as b:
        for name in ("zeta", "psi"):
            np.testing.assert_array_equal(a[name].values, b[name].values, err_msg=name)
