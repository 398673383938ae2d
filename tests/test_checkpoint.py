"""Checkpoints: atomic writes, exact resume on any worker count, fallback, wall time, lost workers."""

import json
import os
import signal
import warnings

import numpy as np
import pytest

dask = pytest.importorskip("dask")  # a bare GPU image lacks it: skip there

from hpcgpu import Simulation
from hpcgpu.checkpoint import list_checkpoints
from hpcgpu.errors import ConfigError
from hpcgpu.workloads.astro import NBody
from hpcgpu.workloads.md import LennardJones
from hpcgpu.workloads.weather import ShallowWater

CASES = {
    "weather": (lambda: ShallowWater("unstable_jet", nx=40, ny=32, backend="numba"), None, ("u", "v", "h")),
    "md": (lambda: LennardJones(5, temperature=1.2, thermostat="langevin", backend="numba"), 0.005,
           ("positions", "velocities")),
    "astro": (lambda: NBody("plummer", n=200, backend="numba", seed=2), 0.002, ("positions", "velocities")),
}


def _fields(sim, names):
    return {name: np.asarray(getattr(sim.state, name)) for name in names}


@pytest.mark.parametrize("case", sorted(CASES))
def test_resume_continues_bitwise_like_the_uninterrupted_run(tmp_path, case):
    make, dt, names = CASES[case]
    model = make()
    reference = Simulation(model, dt=dt, stop_steps=60, progress=False).run()
    first = Simulation(model, dt=dt, stop_steps=60, progress=False).run(steps=25, checkpoint=tmp_path,
                                                                         checkpoint_every=10)
    assert first.step == 25 and [os.path.basename(p) for p in list_checkpoints(tmp_path)] == [
        "step-0000000020", "step-0000000025"]  # the newest two are kept
    resumed = Simulation.resume(tmp_path, progress=False)
    assert resumed.step == 25 and resumed.time == pytest.approx(first.time) and resumed.stop_steps == 60
    resumed.run()
    for name, value in _fields(reference, names).items():
        np.testing.assert_array_equal(_fields(resumed, names)[name], value, err_msg=name)
    expected = reference.diagnostics
    np.testing.assert_array_equal(resumed.diagnostics.time, expected.time)
    np.testing.assert_array_equal(resumed.diagnostics.energy, expected.energy)
    meta = json.loads((tmp_path / "step-0000000025" / "meta.json").read_text())
    assert meta["step"] == 25 and meta["hpcgpu_version"] and len(meta["sha256"]) == 64


def test_a_corrupt_newest_checkpoint_falls_back_to_the_previous_one_with_a_warning(tmp_path):
    model = ShallowWater("gravity_wave", nx=24, ny=16, backend="numpy")
    Simulation(model, stop_steps=30, progress=False).run(checkpoint=tmp_path, checkpoint_every=10)
    newest = tmp_path / "step-0000000030" / "state.pkl"
    newest.write_bytes(newest.read_bytes()[:-100])  # truncated, as by a crash or a full disk
    (tmp_path / ".tmp-deadbeef").mkdir()  # an interrupted write is never a candidate
    with pytest.warns(RuntimeWarning, match=r"step-0000000030 is unusable .*digest"):
        resumed = Simulation.resume(tmp_path, progress=False)
    assert resumed.step == 20


def test_no_usable_checkpoint_is_a_clear_error(tmp_path):
    with pytest.raises(ConfigError, match="no checkpoint under"):
        Simulation.resume(tmp_path)
    (tmp_path / "step-0000000005").mkdir()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(ConfigError, match="no usable checkpoint under .*step-0000000005: FileNotFoundError"):
            Simulation.resume(tmp_path)
    model = ShallowWater("gravity_wave", nx=16, ny=8, backend="numpy")
    with pytest.raises(ConfigError, match="checkpoint_every needs a checkpoint directory"):
        Simulation(model, stop_steps=5, progress=False).run(checkpoint_every=2)


def test_wall_time_limit_stops_cleanly_with_a_checkpoint_and_resume_finishes(tmp_path):
    import time

    model = ShallowWater("unstable_jet", nx=128, ny=96, backend="numba")
    reference = Simulation(model, stop_steps=1500, progress=False).run()
    stopped = Simulation(model, stop_steps=1500, progress=False)
    stopped.add_callback(lambda sim: time.sleep(0.002), 1)  # >= 3 s for the whole run, whatever the load
    stopped.run(wall_time_limit=0.5, checkpoint=tmp_path)
    assert 0 < stopped.step < 1500
    assert os.path.basename(list_checkpoints(tmp_path)[-1]) == f"step-{stopped.step:010d}"
    resumed = Simulation.resume(tmp_path, progress=False).run()
    assert resumed.step == 1500
    np.testing.assert_array_equal(resumed.state.h, reference.state.h)


def test_resume_on_another_number_of_workers(tmp_path, client):
    model = ShallowWater("unstable_jet", nx=40, ny=32, backend="numba")
    reference = Simulation(model, stop_steps=60, progress=False).run()
    Simulation(model, stop_steps=60, progress=False).run(steps=30, checkpoint=tmp_path)
    resumed = Simulation.resume(tmp_path, progress=False, client=client, partitions=2, steps_per_task=2).run()
    np.testing.assert_array_equal(resumed.state.h, reference.state.h)  # rows: bitwise on any count
    resumed.close()


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_killed_worker_is_survived_from_the_last_checkpoint(tmp_path, client, case):
    make, dt, names = CASES[case]
    model = make()
    steps = 80
    reference = Simulation(model, dt=dt, stop_steps=steps, progress=False, client=client, partitions=2).run()
    expected = _fields(reference, names)
    reference.close()
    sim = Simulation(model, dt=dt, stop_steps=steps, progress=False, client=client, partitions=2)
    killed = []

    def kill_one(simulation):
        if simulation.step == 40 and not killed:
            pids = client.run(os.getpid)
            killed.append(sorted(pids.values())[-1])
            os.kill(killed[-1], signal.SIGKILL)

    sim.add_callback(kill_one, 10)
    # LocalCluster closes a nanny for good when no worker of its name is back
    # `lost-worker-timeout` (15 s) after a loss: with three cases killing the
    # same worker within 15 s, the first loss's check can land while the third
    # restart is starting. The nanny's restart is what this test relies on.
    with pytest.warns(RuntimeWarning, match="restarted from the checkpoint at step"), \
            dask.config.set({"distributed.deploy.lost-worker-timeout": "1h"}):
        sim.run(checkpoint=tmp_path, checkpoint_every=20)
    assert killed and sim.step == steps
    for name, value in _fields(sim, names).items():
        if case == "md":  # slabs rebuild their lists after a restart: another summation order
            np.testing.assert_allclose(value, expected[name], rtol=0, atol=1e-9, err_msg=name)
        else:
            np.testing.assert_array_equal(value, expected[name], err_msg=name)
    sim.close()
    client.wait_for_workers(2, timeout=60)


def test_soak_benchmark_reports_restarts_and_a_matching_final_state():
    import io

    from hpcgpu.bench.soak import run_soak

    stream = io.StringIO()
    report = run_soak(0.1, kill_every=2.5, size=128, stream=stream)
    assert json.loads(stream.getvalue()) == report
    assert report["kills"] >= 1 and report["restarts"] >= 1 and report["steps"] > 0
    assert report["final_state_matches_reference"] is True
    assert report["time_lost_s"] >= 0 and report["steps_redone"] >= 0


def test_a_dkd_nbody_run_resumes_with_its_integrator_bitwise(tmp_path):
    model = NBody("plummer", n=120, backend="numba", seed=4, integrator="dkd")
    reference = Simulation(model, dt=0.004, stop_steps=40, diagnostics=10, progress=False).run()
    Simulation(model, dt=0.004, stop_steps=40, diagnostics=10, progress=False).run(steps=20, checkpoint=tmp_path)
    resumed = Simulation.resume(tmp_path, progress=False)
    assert resumed.model.integrator == "dkd" and "integrator='dkd'" in json.loads(
        (tmp_path / "step-0000000020" / "meta.json").read_text())["model"]
    resumed.run()
    for name in ("positions", "velocities", "potentials"):
        np.testing.assert_array_equal(getattr(resumed.state, name), getattr(reference.state, name), err_msg=name)
    np.testing.assert_array_equal(resumed.diagnostics.energy, reference.diagnostics.energy)


def test_a_checkpoint_path_that_is_a_file_is_a_clear_error(tmp_path):
    path = tmp_path / "notes.txt"
    path.write_text("not a folder")
    sim = Simulation(ShallowWater("gravity_wave", nx=16, ny=8, backend="numpy"), stop_steps=2, progress=False)
    with pytest.raises(ConfigError, match="checkpoint=.*notes.txt.* is a file"):
        sim.run(checkpoint=path)
    assert sim.step == 0 and path.read_text() == "not a folder"


@pytest.mark.parametrize("saved, extended", [({"stop_steps": 10}, {"stop_time": 2000.0}),
                                             ({"stop_time": 1000.0}, {"stop_steps": 20})])
def test_a_new_stop_given_to_resume_extends_the_run(tmp_path, saved, extended):
    """A stop criterion given to resume replaces the saved ones, instead of stopping at the earlier."""
    model = ShallowWater("gravity_wave", nx=16, ny=8, backend="numpy")
    Simulation(model, dt=100.0, progress=False, **saved).run(checkpoint=tmp_path)
    resumed = Simulation.resume(tmp_path, progress=False, **extended)
    assert resumed.step == 10 and resumed.run().step == 20
    reference = Simulation(model, dt=100.0, stop_steps=20, progress=False).run()
    np.testing.assert_array_equal(resumed.state.h, reference.state.h)


def test_a_resumed_run_keeps_its_diagnostics_and_check_schedules(tmp_path):
    from hpcgpu.schedules import Every, TimeInterval

    model = ShallowWater("gravity_wave", nx=16, ny=8, backend="numpy")
    options = dict(dt=100.0, stop_steps=30, diagnostics=3, check=TimeInterval(500.0), progress=False)
    whole = Simulation(model, **options).run()
    Simulation(model, **options).run(steps=12, checkpoint=tmp_path)
    resumed = Simulation.resume(tmp_path, progress=False)
    assert resumed.diagnostics_schedule == Every(3) and resumed.check_schedule == TimeInterval(500.0)
    assert list(resumed.run().diagnostics["step"].values) == list(whole.diagnostics["step"].values)
    assert Simulation.resume(tmp_path, progress=False, diagnostics=5).diagnostics_schedule == Every(5)


def test_resume_refuses_a_new_dt_or_state_in_one_line_and_takes_a_new_name(tmp_path):
    model = ShallowWater("gravity_wave", nx=16, ny=8, backend="numpy")
    Simulation(model, dt=100.0, stop_steps=2, progress=False).run(checkpoint=tmp_path)
    with pytest.raises(ConfigError, match=r"dt: a resumed run continues the checkpoint's state and dt \(dt=100\)"):
        Simulation.resume(tmp_path, dt=50.0)
    with pytest.raises(ConfigError, match="state: a resumed run"):
        Simulation.resume(tmp_path, state=model.initial_state())
    assert Simulation.resume(tmp_path, name="second-half", progress=False).name == "second-half"
