"""The driver: schedules, stop criteria, output, timing."""

import dataclasses
import re

import numpy as np
import pytest
import xarray as xr
from _support import interrupted_after_one_step

from hpcgpu import Simulation, ZarrWriter
from hpcgpu.errors import ConfigError
from hpcgpu.io import open_output
from hpcgpu.schedules import Every, TimeInterval
from hpcgpu.workloads.weather import ShallowWater


@pytest.fixture
def model():
    return ShallowWater("gravity_wave", nx=16, ny=8, backend="numpy")


def test_callbacks_fire_on_their_schedules(model):
    sim = Simulation(model, dt=100.0, stop_steps=25, progress=False)
    every_step, every_seven, every_hour = [], [], []
    sim.add_callback(lambda s: every_step.append(s.step), 1)
    sim.add_callback(lambda s: every_seven.append(s.step), Every(7))
    sim.add_callback(lambda s: every_hour.append(s.step), TimeInterval(1000.0))
    sim.run()
    assert every_step == list(range(26))
    assert every_seven == [0, 7, 14, 21]
    assert every_hour == [0, 10, 20]
    assert sim.step == 25 and sim.time == pytest.approx(2500.0)


def test_time_interval_not_a_multiple_of_dt_fires_at_first_step_after(model):
    sim = Simulation(model, dt=300.0, stop_time=3000.0, progress=False)
    fired = []
    sim.add_callback(lambda s: fired.append(s.step), TimeInterval(1000.0))
    sim.run()
    assert fired == [0, 4, 7, 10]
    assert sim.step == 10


def test_stop_by_time_steps_and_wall_time(model):
    sim = Simulation(model, dt=100.0, stop_time=1234.0, progress=False)
    assert sim.run().step == 13  # first step at or after the stop time
    assert sim.run(steps=5).step == 18
    clock = Simulation(model, dt=1.0, wall_time_limit=0.3, progress=False, diagnostics=1000)
    clock.run()
    assert clock.step > 0
    assert clock.timing["run_s"] < 3.0


def test_diagnostics_are_recorded_as_xarray(model):
    sim = Simulation(model, dt=100.0, stop_steps=20, diagnostics=5, progress=False).run()
    ds = sim.diagnostics
    assert isinstance(ds, xr.Dataset)
    assert list(ds["step"].values) == [0, 5, 10, 15, 20]
    np.testing.assert_allclose(ds["mass"], ds["mass"][0], rtol=1e-13)
    assert set(ds.data_vars) >= {"mass", "energy", "enstrophy", "max_cfl"}


def test_warm_up_is_timed_apart_from_steps(model):
    sim = Simulation(model, dt=100.0, stop_steps=10, progress=False).run()
    assert sim.timing["warmup_s"] > 0
    assert sim.timing["steps"] == 10
    summary = sim.summary()
    assert summary["steps_per_s"] > 0 and summary["point_updates_per_s"] == pytest.approx(
        summary["steps_per_s"] * 16 * 8)
    assert abs(summary["mass_relative_change"]) < 1e-13


def test_zarr_output_is_readable_with_coordinates_and_units(model, tmp_path):
    path = tmp_path / "run.zarr"
    sim = Simulation(model, dt=100.0, stop_steps=10, progress=False)
    sim.add_writer(ZarrWriter(path, Every(5)))
    sim.run()
    fields, diagnostics = open_output(path)
    assert fields.sizes["time"] == 3
    assert list(fields["step"].values) == [0, 5, 10]
    assert fields["h"].dims == ("time", "y", "x")
    assert fields["u"].dims == ("time", "y", "x_face")
    assert fields["h"].attrs["units"] == "m" and fields["x"].attrs["units"] == "m"
    assert fields.attrs["case"] == "gravity_wave"
    np.testing.assert_allclose(fields["h"].isel(time=-1).values, sim.state.h)
    assert diagnostics is not None and diagnostics.sizes["time"] >= 2


def test_progress_bar_stays_quiet_when_not_a_terminal(model, capsys):
    Simulation(model, dt=100.0, stop_steps=5).run()
    captured = capsys.readouterr()
    assert captured.err == "" and captured.out == ""


def test_bad_schedules_and_writers(model):
    sim = Simulation(model, dt=100.0, stop_steps=5, progress=False)
    with pytest.raises(ConfigError, match="schedule must be >= 1"):
        sim.add_callback(print, 0)
    with pytest.raises(ConfigError, match="callable"):
        sim.add_callback("not a function")
    with pytest.raises(ConfigError, match="interval must be > 0"):
        TimeInterval(-1.0)
    with pytest.raises(ConfigError, match="writer"):
        sim.add_writer(object())


def test_diagnostics_carry_the_wall_clock(model):
    sim = Simulation(model, dt=100.0, stop_steps=30, diagnostics=10, progress=False)
    sim.add_callback(lambda s: __import__("time").sleep(0.02), 1)
    sim.run()
    wall = sim.diagnostics["wall_s"].values
    assert (np.diff(wall) > 0).all() and wall[-1] <= sim.timing["run_s"] + 1e-9


@pytest.mark.parametrize("make", [
    lambda: __import__("hpcgpu.workloads.weather", fromlist=["x"]).ShallowWater("gravity_wave", nx=16, ny=8,
                                                                               backend="numpy"),
    lambda: __import__("hpcgpu.workloads.md", fromlist=["x"]).LennardJones(3, backend="numpy"),
    lambda: __import__("hpcgpu.workloads.astro", fromlist=["x"]).NBody("plummer", n=64, backend="numpy"),
    lambda: __import__("hpcgpu.workloads.vorticity", fromlist=["x"]).BarotropicVorticity(nx=16, ny=16,
                                                                                        backend="numpy"),
], ids=["weather", "md", "astro", "vorticity"])
def test_every_diagnostic_and_the_time_axis_carry_units(make):
    """In memory as in the files: a weather run's seconds and an N-body run's time must not read alike."""
    diagnostics = Simulation(make(), stop_steps=2, progress=False).run().diagnostics
    missing = [name for name in diagnostics.variables if not diagnostics[name].attrs.get("units")]
    assert not missing, missing


def test_ctrl_c_inside_a_step_call_stops_with_state_step_and_time_in_agreement(model):
    """A Ctrl-C while the executor advances must not leave the state steps ahead of ``step``.

    The interrupt arrives after the first of the steps of one call; the run
    stops with :class:`KeyboardInterrupt`, and ``run()`` again continues bitwise
    like a run that was never interrupted (the weather stepper reuses buffers,
    so an interrupted call would leave a half-advanced state behind).
    """
    import signal

    sim = Simulation(model, dt=100.0, stop_steps=12, diagnostics=4, progress=False)
    sim.add_callback(lambda s: None, Every(3))
    with interrupted_after_one_step(sim), pytest.raises(KeyboardInterrupt):
        sim.run()
    assert sim.step == 3 and sim.time == 300.0
    reference = Simulation(model, dt=100.0, stop_steps=12, diagnostics=4, progress=False)
    reference.run(steps=3)
    for name in ("u", "v", "h"):
        assert np.array_equal(getattr(sim.state, name), getattr(reference.state, name)), name
    sim.run()
    reference.run()
    for name in ("u", "v", "h"):
        assert np.array_equal(getattr(sim.state, name), getattr(reference.state, name)), name
    assert list(sim.diagnostics["step"].values) == [0, 4, 8, 12]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_record_diagnostics_twice_at_a_step_keeps_one_record(model):
    sim = Simulation(model, dt=100.0, stop_steps=7, diagnostics=5, progress=False).run()
    sim.record_diagnostics()
    sim.summary()
    sim.record_diagnostics()
    steps = list(sim.diagnostics["step"].values)
    assert steps == [0, 5, 7]
    assert sim.diagnostics.sel(time=700.0)["step"].item() == 7  # a unique time coordinate


@pytest.mark.parametrize("value", ["5", -1.0, 0])
def test_run_checks_its_wall_time_limit_like_the_constructor(model, value):
    sim = Simulation(model, dt=100.0, progress=False)
    with pytest.raises(ConfigError, match="wall_time_limit must be"):
        sim.run(wall_time_limit=value)
    assert sim.step == 0


def test_zarr_writer_never_deletes_a_file_or_a_folder_of_other_data(model, tmp_path):
    """overwrite=True replaces an earlier run's store, not the user's files under the same name."""
    folder = tmp_path / "results"
    folder.mkdir()
    (folder / "thesis.tex").write_text("years of work")
    with pytest.raises(ConfigError, match="is not a Zarr store"):
        ZarrWriter(folder, 1)
    single = tmp_path / "notes.txt"
    single.write_text("notes")
    with pytest.raises(ConfigError, match="is not a Zarr store"):
        ZarrWriter(single, 1)
    assert (folder / "thesis.tex").read_text() == "years of work" and single.read_text() == "notes"
    # an earlier run's store, and an empty folder, are replaced as before
    store, empty = tmp_path / "run.zarr", tmp_path / "empty"
    empty.mkdir()
    for path in (store, store, empty):
        Simulation(model, dt=100.0, stop_steps=2, progress=False).add_writer(ZarrWriter(path, 1)).run()
        assert list(xr.open_zarr(path)["step"].values) == [0, 1, 2]


def test_ctrl_c_during_the_first_events_still_writes_step_0(model, tmp_path):
    """Step 0's events run once per simulation: a Ctrl-C among them must not skip the writers."""
    import os
    import signal

    path = tmp_path / "run.zarr"
    sim = Simulation(model, dt=100.0, stop_steps=4, progress=False)
    sim.add_callback(lambda s: s.step == 0 and os.kill(os.getpid(), signal.SIGINT), 1)
    sim.add_writer(ZarrWriter(path, Every(2)))
    with pytest.raises(KeyboardInterrupt):
        sim.run()
    assert sim.step == 0
    sim.run()
    assert list(xr.open_zarr(path)["step"].values) == [0, 2, 4]


# -- a writer serves one run (and the runs resumed from its checkpoints) ---------------------------------------
@dataclasses.dataclass
class _StepList:
    """A writer of the user's own: unhashable (a dataclass), so not usable as a dict key."""

    schedule: Every
    steps: list = dataclasses.field(default_factory=list)

    def write(self, simulation):
        self.steps.append(simulation.step)


@dataclasses.dataclass(slots=True)
class _SlottedStepList:
    """Neither hashable nor weak-referenceable, nor open to new attributes."""

    schedule: Every
    steps: list = dataclasses.field(default_factory=list)

    def write(self, simulation):
        self.steps.append(simulation.step)


def test_a_writer_of_one_run_is_refused_by_another_and_its_store_is_left_alone(model, tmp_path):
    path = tmp_path / "first.zarr"
    writer = ZarrWriter(path, Every(2))
    Simulation(model, dt=100.0, stop_steps=4, progress=False, diagnostics=1).add_writer(writer).run()
    second = Simulation(model, dt=50.0, stop_steps=4, progress=False, name="second")
    with pytest.raises(ConfigError, match=re.escape(f"ZarrWriter writing to {str(path)!r} holds the output of "
                                                    "another run ('weather-gravity_wave'); used by 'second'")):
        second.add_writer(writer)
    # handed to two simulations before either ran: the second to run is refused before it writes
    other = ZarrWriter(tmp_path / "other.zarr", Every(2))
    first, third = (Simulation(model, dt=100.0, stop_steps=4, progress=False).add_writer(other) for _ in range(2))
    first.run()
    with pytest.raises(ConfigError, match="holds the output of another run"):
        third.run()
    assert third.step == 0
    assert list(xr.open_zarr(path)["step"].values) == [0, 2, 4]
    assert list(xr.open_zarr(tmp_path / "other.zarr")["step"].values) == [0, 2, 4]
    assert xr.open_zarr(path, group="diagnostics").sizes["time"] == 5  # the first run's, not overwritten
    for kind in (_StepList, _SlottedStepList):  # the user's writers too, whatever they are
        mine = kind(Every(2))
        Simulation(model, dt=100.0, stop_steps=2, progress=False).add_writer(mine).run()
        with pytest.raises(ConfigError, match=f"{kind.__name__}.* holds the output of another run"):
            Simulation(model, dt=100.0, stop_steps=2, progress=False).add_writer(mine)
        assert mine.steps == [0, 2]


def test_a_run_resumed_from_a_checkpoint_continues_the_writer_of_its_run(model, tmp_path):
    import shutil

    path, folder = tmp_path / "run.zarr", tmp_path / "ck"
    writer = ZarrWriter(path, Every(2))
    first = Simulation(model, dt=100.0, stop_steps=6, progress=False).add_writer(writer)
    first.run(checkpoint=folder, checkpoint_every=4)
    shutil.rmtree(folder / "step-0000000006")  # the job stopped after writing step 6, before its checkpoint
    resumed = Simulation.resume(folder, stop_steps=10, progress=False)
    resumed.add_writer(writer).run()
    # steps 5 and 6 run again from the checkpoint at 4: step 6 is in the store already
    assert list(xr.open_zarr(path)["step"].values) == [0, 2, 4, 6, 8, 10]
    whole = Simulation(model, dt=100.0, stop_steps=10, progress=False).run()
    np.testing.assert_array_equal(xr.open_zarr(path)["h"].isel(time=-1).values, whole.state.h)
    # a run resumed from it in turn continues it too; a new simulation does not
    Simulation.resume(folder, stop_steps=12, progress=False).add_writer(writer).run()
    assert list(xr.open_zarr(path)["step"].values) == [0, 2, 4, 6, 8, 10, 12]
    with pytest.raises(ConfigError, match="another run"):
        Simulation(model, dt=100.0, stop_steps=2, progress=False).add_writer(writer)
