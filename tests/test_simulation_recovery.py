"""The driver after failures: restarts from its own checkpoints, a cap on restarts, close and step after errors."""

import os
import re
import uuid

import numpy as np
import pytest

pytest.importorskip("dask")  # a bare GPU image lacks it: skip there

from _faulty_models import PoisonedRows  # noqa: E402

from hpcgpu import Simulation, checkpoint  # noqa: E402
from hpcgpu.errors import ClusterError, ConfigError, UnstableSimulation, WorkerLost  # noqa: E402
from hpcgpu.workloads.weather import ShallowWater  # noqa: E402

STEPS = 16
CLUSTER = {"partitions": 2, "steps_per_task": 2}


@pytest.fixture
def jet():
    return ShallowWater("unstable_jet", nx=16, ny=40, backend="numpy")


def _names(folder):
    return [os.path.basename(p) for p in checkpoint.list_checkpoints(folder)]


def _sessions(client):
    return client.run_on_scheduler(lambda dask_scheduler: len(dask_scheduler.plugins["hpcgpu-comm"].sessions))


def _lose_a_worker_at(step, times, raised, error=WorkerLost):
    """A callback raising ``error`` (as the executor does for a lost worker) at ``step``, at most ``times`` times."""
    def callback(sim):
        if sim.step == step and len(raised) < times:
            raised.append(error(f"{sim.name}: a worker was lost during the run (injected {len(raised) + 1})"))
            raise raised[-1]
    return callback


# -- checkpoints of another run in the folder --------------------------------------------------------------
def test_a_folder_holding_later_checkpoints_of_another_run_is_refused(tmp_path):
    other = ShallowWater("gravity_wave", nx=16, ny=8, backend="numpy")
    Simulation(other, dt=100.0, stop_steps=12, progress=False).run(checkpoint=tmp_path, checkpoint_every=10)
    sim = Simulation(ShallowWater("rest", nx=16, ny=8, backend="numpy"), dt=100.0, stop_steps=4, progress=False)
    with pytest.raises(ConfigError, match=re.escape(f"checkpoint='{tmp_path}' already holds checkpoints at step(s) "
                                                    "10, 12, later than this run's step 0") + ".*Simulation.resume"):
        sim.run(checkpoint=tmp_path)
    assert sim.step == 0 and _names(tmp_path) == ["step-0000000010", "step-0000000012"]


def test_a_new_checkpoint_is_never_pruned_in_favour_of_later_steps(tmp_path, jet):
    state = jet.to_host(jet.initial_state())
    for step in (10, 12):  # another run's history
        checkpoint.write_checkpoint(tmp_path, jet, state, {"step": step})
    checkpoint.write_checkpoint(tmp_path, jet, state, {"step": 3})
    assert "step-0000000003" in _names(tmp_path)
    for step in (4, 5):
        checkpoint.write_checkpoint(tmp_path, jet, state, {"step": step})
    assert _names(tmp_path) == ["step-0000000004", "step-0000000005", "step-0000000010", "step-0000000012"]


def test_a_resumed_run_keeps_writing_into_its_folder_even_past_an_unusable_newest_checkpoint(tmp_path):
    model = ShallowWater("gravity_wave", nx=16, ny=8, backend="numpy")
    reference = Simulation(model, dt=100.0, stop_steps=12, progress=False).run()
    Simulation(model, dt=100.0, stop_steps=6, progress=False).run(checkpoint=tmp_path, checkpoint_every=3)
    resumed = Simulation.resume(tmp_path, stop_steps=8, progress=False).run(checkpoint=tmp_path)
    assert resumed.step == 8 and _names(tmp_path) == ["step-0000000006", "step-0000000008"]
    newest = tmp_path / "step-0000000008" / "state.pkl"
    newest.write_bytes(newest.read_bytes()[:-100])  # truncated: resume falls back to step 6
    with pytest.warns(RuntimeWarning, match="step-0000000008 is unusable"):
        again = Simulation.resume(tmp_path, stop_steps=12, progress=False)
    again.run(checkpoint=tmp_path, checkpoint_every=4)
    assert again.step == 12 and _names(tmp_path) == ["step-0000000008", "step-0000000012"]
    np.testing.assert_array_equal(again.state.h, reference.state.h)


def test_a_lost_worker_restarts_from_this_runs_checkpoint_not_a_later_one_of_another_run(tmp_path, client, jet):
    reference = Simulation(jet, dt=100.0, stop_steps=STEPS, progress=False).run()
    foreign = ShallowWater("gravity_wave", nx=16, ny=40, backend="numpy")
    sim = Simulation(jet, dt=100.0, stop_steps=STEPS, progress=False, client=client, **CLUSTER)
    raised = []

    def another_run_writes(s):  # a run sharing the folder writes after this one's start
        if s.step == 8 and not raised:
            checkpoint.write_checkpoint(tmp_path, foreign, foreign.to_host(foreign.initial_state()),
                                        {"step": 40, "time": 4000.0, "records": []})

    sim.add_callback(another_run_writes, 2)
    sim.add_callback(_lose_a_worker_at(10, 1, raised), 2)
    with pytest.warns(RuntimeWarning, match="restarted from the checkpoint at step 8 "):
        sim.run(checkpoint=tmp_path, checkpoint_every=4)
    assert [r["step"] for r in sim.restarts] == [8] and sim.step == STEPS
    np.testing.assert_array_equal(sim.state.h, reference.state.h)
    sim.close()


# -- a failure that repeats on every restart -----------------------------------------------------------------
def test_a_loss_repeating_after_every_restart_gives_up_after_three_restarts_with_the_loss_chained(tmp_path, client,
                                                                                                     jet):
    sim = Simulation(jet, dt=100.0, stop_steps=STEPS, progress=False, client=client, **CLUSTER)
    raised = []
    sim.add_callback(_lose_a_worker_at(10, 6, raised), 2)  # bounded: without a cap the run would end after 6
    with pytest.warns(RuntimeWarning, match="restarted from the checkpoint at step 8 "), \
            pytest.raises(WorkerLost, match=r"not restarting again: the last 3 restart\(s\) from the checkpoint at "
                                            r"step 8 failed .*\(max_restarts=3\)") as caught:
        sim.run(checkpoint=tmp_path, checkpoint_every=4)
    assert len(raised) == 4 and caught.value.__cause__ is raised[-1]
    assert [r["step"] for r in sim.restarts] == [8, 8, 8]
    sim.close()


def test_max_restarts_zero_never_restarts(tmp_path, client, jet):
    sim = Simulation(jet, dt=100.0, stop_steps=STEPS, progress=False, client=client, **CLUSTER)
    raised = []
    sim.add_callback(_lose_a_worker_at(10, 1, raised), 2)
    with pytest.raises(WorkerLost, match=r"injected 1\); not restarting \(max_restarts=0\)") as caught:
        sim.run(checkpoint=tmp_path, checkpoint_every=4, max_restarts=0)
    assert caught.value.__cause__ is raised[0] and sim.restarts == []
    sim.close()


def test_a_failed_restart_reports_the_lost_worker_not_its_own_error(tmp_path, client, jet, monkeypatch):
    sim = Simulation(jet, dt=100.0, stop_steps=STEPS, progress=False, client=client, **CLUSTER)
    raised = []
    sim.add_callback(_lose_a_worker_at(10, 1, raised), 2)

    def no_workers(*args):
        raise ClusterError("the dask cluster has no workers")

    monkeypatch.setattr(sim, "_make_executor", no_workers)
    with pytest.raises(WorkerLost, match="restarting from the checkpoint at step 8 failed: the dask cluster has "
                                         "no workers") as caught:
        sim.run(checkpoint=tmp_path, checkpoint_every=4)
    assert caught.value.__cause__ is raised[0] and sim.restarts == []
    sim.close()


def test_max_restarts_is_validated(jet):
    sim = Simulation(jet, dt=100.0, stop_steps=2, progress=False)
    with pytest.raises(ConfigError, match="max_restarts must be >= 0, got -1"):
        sim.run(max_restarts=-1)
    with pytest.raises(ConfigError, match="max_restarts must be an integer, got 'many'"):
        sim.run(max_restarts="many")
    assert sim.step == 0


# -- closed runs and errors that are not a lost worker ------------------------------------------------------
def test_a_closed_simulation_refuses_to_run_and_is_not_revived_from_its_checkpoint(tmp_path, client, jet):
    before = _sessions(client)
    sim = Simulation(jet, dt=100.0, progress=False, client=client, **CLUSTER)
    sim.run(steps=4, checkpoint=tmp_path)
    sim.close()
    closed = sim._executor
    for kwargs in ({}, {"checkpoint": tmp_path}):
        with pytest.raises(ClusterError, match=r"run\(\) after close\(\)"):
            sim.run(steps=4, **kwargs)
    assert sim._executor is closed and sim.restarts == [] and sim.step == 4
    assert _sessions(client) == before
    local = Simulation(jet, dt=100.0, progress=False).run(steps=2)
    local.close()
    with pytest.raises(ClusterError, match=r"run\(\) after close\(\)"):
        local.run(steps=2)


def test_only_a_lost_worker_is_recovered_from(tmp_path, client, jet):
    sim = Simulation(jet, dt=100.0, stop_steps=STEPS, progress=False, client=client, **CLUSTER)
    raised = []
    sim.add_callback(_lose_a_worker_at(10, 1, raised, error=ClusterError), 2)  # e.g. "after the run failed"
    with pytest.raises(ClusterError) as caught:
        sim.run(checkpoint=tmp_path, checkpoint_every=4)
    assert caught.value is raised[0] and sim.restarts == []
    sim.close()


# -- after an unstable step on a cluster ---------------------------------------------------------------------
def _poisoned(client):
    model = PoisonedRows("unstable_jet", nx=16, ny=40, backend="numpy", poison_at=3, token=uuid.uuid4().hex)
    return Simulation(model, dt=100.0, progress=False, client=client, check=2, diagnostics=2, **CLUSTER)


def test_close_after_an_unstable_run_releases_the_executor_without_raising_again(client):
    before = _sessions(client)
    sim = _poisoned(client)
    with pytest.raises(UnstableSimulation):
        sim.run(steps=400)
    sim.close()
    sim.close()
    assert not sim._executor.usable and _sessions(client) == before


def test_an_unstable_run_on_a_cluster_stops_at_the_failing_step(client, tmp_path):
    sim = _poisoned(client)
    with pytest.raises(UnstableSimulation) as caught:
        sim.run(steps=400)
    failing = caught.value.step
    assert 0 < failing < 40
    assert sim.step == failing and sim.time == pytest.approx(failing * 100.0)
    assert sim._executor.step == failing  # the steps the workers ran: the state is the failing step's
    assert all(record["step"] <= failing for record in sim._records)
    assert os.path.basename(sim.write_checkpoint(tmp_path)) == f"step-{failing:010d}"
    # nor does a second run() step the workers on from the failing state
    with pytest.raises(UnstableSimulation, match=f"not finite since step {failing} "):
        sim.run(steps=4)
    assert sim.step == failing and sim._executor.step == failing
    sim.close()


def test_an_unstable_local_run_stops_at_the_failing_step(jet):
    sim = Simulation(jet, dt=100.0, progress=False, check=2)

    def poison(s):
        if s.step == 5:
            s.state.h[0, 0] = float("nan")

    sim.add_callback(poison, 1)
    with pytest.raises(UnstableSimulation, match="step 6") as caught:
        sim.run(steps=40)
    assert caught.value.step == 6 and sim.step == 6 and sim.time == pytest.approx(600.0)
    sim.close()


def test_run_after_a_non_finite_state_refuses_to_step_on_and_says_how_to_go_on(jet, tmp_path):
    sim = Simulation(jet, dt=100.0, progress=False, check=2)
    sim.run(steps=4, checkpoint=tmp_path)  # a good state to go back to

    def poison(s):
        if s.step == 5:
            s.state.h[0, 0] = float("nan")

    sim.add_callback(poison, 1)
    with pytest.raises(UnstableSimulation, match="step 6"):
        sim.run(steps=40)
    failed = {name: np.array(getattr(sim.state, name)) for name in ("u", "v", "h")}
    # run() again, for any stop, neither steps on from the NaN state nor hides where it went bad
    for again in (dict(steps=1), dict(steps=5), dict(stop_time=4000.0)):
        with pytest.raises(UnstableSimulation, match=re.escape("not finite since step 6 (t=600)")) as caught:
            sim.run(**again)
        message = str(caught.value)
        assert "Simulation.resume" in message and "new Simulation" in message
        assert caught.value.step == 6 and "h" in caught.value.field
        assert sim.step == 6 and sim.time == pytest.approx(600.0)
        for name, before in failed.items():  # not one step further (NaN compares equal here)
            np.testing.assert_array_equal(getattr(sim.state, name), before)
    # the way out it names: the checkpoint before the failure runs on
    resumed = Simulation.resume(tmp_path, progress=False)
    assert resumed.step == 4 and resumed.run(steps=4).step == 8
    assert np.isfinite(resumed.state.h).all()
    sim.close()


def test_a_run_stopped_by_the_cfl_limit_alone_is_not_refused_as_non_finite(jet):
    sim = Simulation(jet, dt=100.0, progress=False, check=1).run(steps=2)
    sim.model.cfl_limit = 1e-9  # from now on every step is over the limit; the state stays finite
    with pytest.raises(UnstableSimulation, match="exceeds the stable limit") as caught:
        sim.run(steps=3)
    assert caught.value.field == "cfl" and caught.value.step == 3
    with pytest.raises(UnstableSimulation, match="exceeds the stable limit"):  # stepped on, and checked again
        sim.run(steps=3)
    assert sim.step == 4 and np.isfinite(sim.state.h).all()


def test_a_restart_asks_for_the_weights_the_run_was_given(tmp_path, client, jet):
    reference = Simulation(jet, dt=100.0, stop_steps=STEPS, progress=False).run()
    sim = Simulation(jet, dt=100.0, stop_steps=STEPS, progress=False, client=client, weights=[3, 1], **CLUSTER)
    rows = sim.summary()["block_rows"]
    assert rows[0] > 2 * rows[1]  # 3:1, the second raised to its halo (12 rows)
    sim.add_callback(_lose_a_worker_at(10, 1, []), 2)
    with pytest.warns(RuntimeWarning, match="restarted from the checkpoint at step 8 "):
        sim.run(checkpoint=tmp_path, checkpoint_every=4)
    assert sim.summary()["block_rows"] == rows and sim._executor.weights_requested == [3, 1]
    np.testing.assert_array_equal(sim.state.h, reference.state.h)
    sim.close()


def test_a_restart_keeps_a_forced_process_grid(tmp_path, client):
    model = ShallowWater("unstable_jet", nx=48, ny=32, backend="numpy")
    reference = Simulation(model, dt=100.0, stop_steps=STEPS, progress=False).run()
    # 1x2 is not the grid 2 ranks would choose for 48 x 32 cells (2x1 cuts 32 cells, 1x2 48)
    sim = Simulation(model, dt=100.0, stop_steps=STEPS, progress=False, client=client, grid=(1, 2),
                     steps_per_task=2)
    assert sim.summary()["process_grid"] == "1x2"
    sim.add_callback(_lose_a_worker_at(10, 1, []), 2)
    with pytest.warns(RuntimeWarning, match="restarted from the checkpoint at step 8 "):
        sim.run(checkpoint=tmp_path, checkpoint_every=4)
    assert sim.summary()["process_grid"] == "1x2" and sim.restarts
    np.testing.assert_array_equal(sim.state.h, reference.state.h)
    sim.close()
