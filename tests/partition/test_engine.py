"""The SPMD engine: epochs instead of per-step tasks, only scalars to the client, and faults that never hang."""

import os
import signal
import threading
import time

import numpy as np
import pytest

dask = pytest.importorskip("dask")  # a bare GPU image lacks it: skip there
from dask.sizeof import sizeof  # noqa: E402

from hpcgpu import Simulation
from hpcgpu.cluster import start_cluster
from hpcgpu.errors import ClusterError, ConfigError, WorkerLost
from hpcgpu.partition.protocols import GridModel, SteppedModel, missing_methods
from hpcgpu.workloads.astro import NBody
from hpcgpu.workloads.md import LennardJones
from hpcgpu.workloads.weather import ShallowWater


def test_many_short_events_run_in_few_epochs(client):
    model = ShallowWater("unstable_jet", nx=32, ny=48, backend="numba")
    reference = Simulation(model, dt=100.0, stop_steps=200, diagnostics=2, progress=False).run()
    sim = Simulation(model, dt=100.0, stop_steps=200, diagnostics=2, progress=False, client=client, partitions=2,
                     steps_per_task=2).run()
    np.testing.assert_array_equal(sim.state.h, reference.state.h)
    assert [r["step"] for r in sim._records] == list(range(0, 201, 2))
    epochs = sim.summary()["epochs"]
    assert epochs < 30, f"{epochs} epochs for 100 diagnostics: the driver's events were not merged"
    sim.close()


def test_a_run_and_its_closing_check_are_one_epoch_and_the_check_still_catches_the_last_steps(client):
    import uuid

    from _faulty_models import PoisonedRows

    from hpcgpu.errors import UnstableSimulation

    model = ShallowWater("unstable_jet", nx=16, ny=40, backend="numba")
    sim = Simulation(model, dt=100.0, progress=False, client=client, partitions=2, steps_per_task=2,
                     diagnostics=10**6, check=10**6)
    sim.run(steps=4)
    before = sim._executor.epoch
    sim.run(steps=6)
    # a check asked for after the steps were sent would be an epoch of its own
    assert sim._executor.epoch == before + 1
    sim.close()
    # the blocks turn NaN in the last of three supersteps: only the closing check can see it
    poisoned = PoisonedRows("unstable_jet", nx=16, ny=40, backend="numba", poison_at=3, token=uuid.uuid4().hex)
    sim = Simulation(poisoned, dt=100.0, progress=False, client=client, partitions=2, steps_per_task=2,
                     diagnostics=10**6, check=10**6)
    with pytest.raises(UnstableSimulation, match=r"step 6 .*field\(s\) .*h"):
        sim.run(steps=6)
    sim.close()


def _holds_array(value):
    if isinstance(value, np.ndarray) or hasattr(value, "__cuda_array_interface__"):
        return True
    if isinstance(value, dict):
        return any(_holds_array(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return any(_holds_array(v) for v in value)
    return hasattr(value, "arrays")


def test_state_is_not_moved_to_the_client_during_a_run(client):
    model = ShallowWater("unstable_jet", nx=128, ny=128, backend="numba")
    state = model.initial_state()
    field_bytes = state.h.nbytes
    received = []
    original = client.gather

    def counting_gather(futures, *args, **kwargs):
        result = original(futures, *args, **kwargs)
        received.append((sizeof(result), _holds_array(result)))
        return result

    client.gather = counting_gather
    try:
        sim = Simulation(model, state, dt=model.suggested_dt(state), stop_steps=120, progress=False,
                         client=client, partitions=2, steps_per_task=4, diagnostics=8, check=4)
        sim.run()
        assert len(sim.diagnostics["time"]) >= 10
    finally:
        client.gather = original
    assert received, "diagnostics and checks travel to the client"
    assert not any(holds for _, holds in received), "an array reached the client"
    largest = max(size for size, _ in received)
    # an epoch's records (a dict of floats per diagnostics step) are all that arrives
    assert largest < field_bytes / 4, f"the client received {largest} bytes at once"
    sim.close()


def test_the_dashboard_sees_one_epoch_task_per_worker_and_the_run(client):
    from distributed import get_task_stream

    model = ShallowWater("unstable_jet", nx=16, ny=40, backend="numba")
    with get_task_stream(client) as stream:
        sim = Simulation(model, dt=100.0, stop_steps=12, progress=False, client=client, partitions=2,
                         steps_per_task=3, name="named-jet-run").run()
    epochs = sim.summary()["epochs"]
    keys = [str(record["key"]) for record in stream.data]
    # per epoch: one task per worker and rank 0's scalars; nothing per step
    assert sum("weather-epoch-" in k for k in keys) == 2 * epochs
    assert sum("weather-records-" in k for k in keys) == epochs

    def spans(dask_scheduler):
        return sorted({s.name[-1] for s in dask_scheduler.extensions["spans"].spans.values()})

    assert "named-jet-run" in client.run_on_scheduler(spans)
    sim.close()


def test_a_closed_run_keeps_its_final_diagnostics_and_refuses_new_work(client):
    """The final step (7 steps at K = 2: not a whole superstep, nor a diagnostics step) is summarised after close."""
    model = ShallowWater("unstable_jet", nx=16, ny=40, backend="numpy")
    sim = Simulation(model, dt=100.0, stop_steps=7, diagnostics=4, progress=False, client=client, partitions=2,
                     steps_per_task=2)
    sim.run()
    assert [r["step"] for r in sim._records] == [0, 4]
    final = sim.state
    sim.close()
    sim.close()  # twice does nothing
    summary = sim.summary()
    assert summary["step"] == 7 and [r["step"] for r in sim._records] == [0, 4, 7]
    assert abs(summary["mass_relative_change"]) < 1e-12
    expected = model.diagnostics(final)
    assert sim._records[-1]["energy"] == pytest.approx(expected["energy"], rel=1e-12)
    for call in (sim.record_diagnostics, lambda: sim.run(steps=2), lambda: sim.state):
        with pytest.raises(ClusterError, match="close"):  # "after the run was closed" or "after close()"
            call()


def test_a_model_must_provide_its_decompositions_protocol(client):
    class Incomplete:
        decomposition = "grid"
        name = "incomplete"

    assert "step_block" in missing_methods(Incomplete(), GridModel)
    model = ShallowWater("rest", nx=8, ny=8, backend="numpy")
    assert missing_methods(model, GridModel) == [] and isinstance(model, SteppedModel)
    from hpcgpu.partition.engine import PartitionedExecutor

    with pytest.raises(ConfigError, match="cannot be partitioned as 'grid': it lacks .*step_block"):
        PartitionedExecutor(client, Incomplete(), None, 1.0)


@pytest.mark.parametrize("kind", [None, "rows"], ids=["none", "rows"])
def test_a_model_without_a_known_decomposition_is_refused_naming_the_kinds(client, kind):
    from hpcgpu.partition.engine import PartitionedExecutor

    Unsplit = type("Unsplit", (), {"name": "unsplit"} if kind is None else {"name": "unsplit", "decomposition": kind})
    got = "it has none" if kind is None else f"got {kind!r}"
    with pytest.raises(ConfigError, match=rf"Unsplit.decomposition must be one of \['bodies', 'domains', 'grid', "
                                          rf"'spectral'\] \(see hpcgpu.partition.protocols\); {got}"):
        PartitionedExecutor(client, Unsplit(), None, 1.0)


def test_an_interrupted_wait_loses_no_step_and_no_record(client):
    """Ctrl-C in the throttle of advance, then in a later wait: continuing gives the uninterrupted run."""
    from _faulty_models import SlowRows

    plain = ShallowWater("unstable_jet", nx=16, ny=40, backend="numpy")
    reference = Simulation(plain, dt=100.0, stop_steps=40, diagnostics=2, progress=False).run()
    # slow supersteps: epochs pile up to the throttle while the driver queues the next ones
    model = SlowRows("unstable_jet", nx=16, ny=40, backend="numpy", pause=0.02)
    sim = Simulation(model, dt=100.0, stop_steps=40, diagnostics=2, progress=False, client=client, partitions=2,
                     steps_per_task=2)
    executor = sim._executor
    watch = executor._watch  # the executor's waits
    original_wait, original_advance, advancing, interrupted = watch.wait, executor.advance, [], []

    def advance(steps):
        advancing.append(steps)
        try:
            return original_advance(steps)
        finally:
            advancing.pop()

    def interrupting_wait(futures, deadline=None):
        if (advancing and not interrupted) or len(interrupted) == 1:
            interrupted.append(bool(advancing))
            raise KeyboardInterrupt  # as Ctrl-C does, inside dask's wait
        return original_wait(futures, deadline)

    executor.advance, watch.wait = advance, interrupting_wait
    for _ in range(2):
        with pytest.raises(KeyboardInterrupt):
            sim.run()
        # the steps of the interrupted advance count nowhere: the driver asks for them again
        assert executor.step == sim.step
    assert interrupted[0], "the first interrupt was not in advance's throttle"
    sim.run()
    np.testing.assert_array_equal(sim.state.h, reference.state.h)
    assert sum(stats["steps"] for stats in executor.epoch_stats) == 40
    assert [r["step"] for r in sim._records] == list(range(0, 41, 2))
    for got, expected in zip(sim._records, reference._records):
        assert got["energy"] == pytest.approx(expected["energy"], rel=1e-12), got["step"]
    sim.close()


def test_a_failed_health_check_leaves_the_run_at_its_step_with_the_blown_up_fields(client):
    import uuid

    from _faulty_models import PoisonedRows

    from hpcgpu.errors import UnstableSimulation

    # h turns NaN in each rank's third superstep (step 6); u and v of that step are still those of a clean run
    clean = Simulation(ShallowWater("unstable_jet", nx=16, ny=40, backend="numpy"), dt=100.0, stop_steps=6,
                       progress=False).run().state
    model = PoisonedRows("unstable_jet", nx=16, ny=40, backend="numpy", poison_at=3, token=uuid.uuid4().hex)
    sim = Simulation(model, dt=100.0, progress=False, client=client, partitions=2, steps_per_task=2, check=2,
                     diagnostics=2)
    with pytest.raises(UnstableSimulation, match="step 6 ") as info:
        sim.run(steps=400)
    assert info.value.step == 6 and [r["step"] for r in sim._records] == [0, 2, 4]
    executor = sim._executor
    # the epochs sent after the failed check and the queued steps are dropped, not run on the NaN state
    assert executor.usable and executor.step == 6
    assert sum(stats["steps"] for stats in executor.epoch_stats) == 6
    assert executor.collect(block=True) == []
    state = executor.global_state()
    assert np.isnan(state.h).all()
    np.testing.assert_array_equal(state.u, clean.u)
    np.testing.assert_array_equal(state.v, clean.v)
    executor.close()


def test_timeout_and_weights_out_of_range_are_config_errors_naming_them(client):
    from hpcgpu.partition.engine import PartitionedExecutor

    model = ShallowWater("unstable_jet", nx=16, ny=40, backend="numpy")
    state = model.initial_state()
    for timeout in (0, -5, "abc", float("nan"), True):
        with pytest.raises(ConfigError, match=r"timeout must be"):
            PartitionedExecutor(client, model, state, 100.0, partitions=2, timeout=timeout)
    for weights in (5, ["a", "b"], [1, -1], [1, float("inf")], [1, 0], [1, 2, 3]):
        with pytest.raises(ConfigError, match=r"weights must be .*2 positive finite numbers"):
            PartitionedExecutor(client, model, state, 100.0, partitions=2, weights=weights)
    executor = PartitionedExecutor(client, model, state, 100.0, partitions=2, weights=np.array([1, 3]), timeout=30)
    rows = executor.describe()["block_rows"]  # a 1 x 2 process grid: blocks of rows
    executor.close()
    assert rows[1] > rows[0] and sum(rows) == 40


def test_closing_a_run_with_an_epoch_running_ends_it_at_once_and_later_collects_say_so(client):
    from _faulty_models import SlowRows

    from hpcgpu.partition.engine import PartitionedExecutor

    model = SlowRows("unstable_jet", nx=16, ny=40, backend="numpy", pause=0.05)
    executor = PartitionedExecutor(client, model, model.initial_state(), 100.0, partitions=2, steps_per_task=2)
    executor.advance(200)  # 100 supersteps: 5 s a rank
    executor.request_diagnostics(200)
    assert executor.collect() == []  # sent: the workers were idle
    time.sleep(0.5)
    started = time.monotonic()
    executor.close()
    assert time.monotonic() - started < 3, "close waited for the epoch"
    assert _idle_within(client, 3), "the epoch still runs after close"
    with pytest.raises(ClusterError, match="after the run was closed"):
        executor.collect()  # its diagnostics are gone: not an empty list
    idle = PartitionedExecutor(client, model, model.initial_state(), 100.0, partitions=2, steps_per_task=2)
    idle.close()
    assert idle.collect() == []  # nothing was asked for (Simulation reads its diagnostics after close)
    with pytest.raises(ClusterError, match="after the run was closed"):
        idle.collect(block=True)


# -- faults -------------------------------------------------------------------------------------------------
def _idle_within(client, seconds):
    """Whether no task runs on the cluster within ``seconds``."""
    deadline = time.monotonic() + seconds
    while any(client.processing().values()) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not any(client.processing().values())


def test_a_failing_rank_ends_every_rank_at_once_with_its_own_error(client):
    from _faulty_models import FailingRows

    model = FailingRows("unstable_jet", nx=32, ny=64, backend="numba", fail_row=40, fail_after=3)
    sim = Simulation(model, dt=100.0, stop_steps=10_000, progress=False, client=client, partitions=2,
                     steps_per_task=2)
    started = time.monotonic()
    with pytest.raises(ValueError, match="injected failure in the block holding row 40"):
        sim.run()
    assert time.monotonic() - started < 30, "the ranks waited for their timeout (300 s)"
    assert _idle_within(client, 10), "a rank is still running after the abort"
    sim.close()


def test_losing_a_worker_without_a_checkpoint_ends_the_run_with_a_clear_error():
    client = start_cluster(workers=2, threads_per_worker=1, gpus=False, dashboard_address="127.0.0.1:0", quiet=True)
    try:
        model = ShallowWater("unstable_jet", nx=64, ny=64, backend="numba")
        sim = Simulation(model, stop_steps=100000, progress=False, client=client, partitions=2, steps_per_task=2)
        pids = client.run(os.getpid)

        def kill_one(simulation):
            if simulation.step == 20:
                os.kill(sorted(pids.values())[-1], signal.SIGKILL)

        sim.add_callback(kill_one, 10)
        start = time.perf_counter()
        with pytest.raises(WorkerLost, match="lost"):  # the one ClusterError a Simulation recovers from
            sim.run()
        assert time.perf_counter() - start < 60
    finally:
        cluster_object = client.cluster
        client.close()
        cluster_object.close()


def test_a_lost_worker_seen_by_the_records_gather_fails_the_run(client, monkeypatch):
    from distributed.comm.core import CommClosedError

    from hpcgpu.partition.engine import PartitionedExecutor

    model = ShallowWater("unstable_jet", nx=16, ny=40, backend="numpy")
    executor = PartitionedExecutor(client, model, model.initial_state(), 100.0, partitions=2, steps_per_task=2)
    executor.advance(4)

    def lost(*args, **kwargs):
        raise CommClosedError("in <TCP (closed) ConnectionPool.gather local=tcp://127.0.0.1 remote=tcp://127.0.0.1>")

    with monkeypatch.context() as patch:
        patch.setattr(client, "gather", lost)
        with pytest.raises(WorkerLost, match="a worker was lost"):
            executor.synchronize()
    assert not executor.usable
    with pytest.raises(ClusterError, match="after the run failed") as info:
        executor.advance(2)
    assert type(info.value) is ClusterError  # a failed run is not a lost worker to recover from
    executor.close()


def test_a_session_worker_missing_is_a_lost_worker(client, monkeypatch):
    from _faulty_models import SlowRows

    from hpcgpu.partition import engine, epoch_watch

    model = SlowRows("unstable_jet", nx=16, ny=40, backend="numpy", pause=0.02)
    executor = engine.PartitionedExecutor(client, model, model.initial_state(), 100.0, partitions=2, steps_per_task=2)
    # the scheduler no longer lists the second worker
    monkeypatch.setattr(epoch_watch, "_POLL_S", 0.05)
    monkeypatch.setattr(epoch_watch, "worker_info", lambda c: {executor.owner[0]: {}})
    executor.advance(40)
    executor.collect()
    time.sleep(0.1)  # both ranks run: dropping one before it starts would leave the other waiting for it
    with pytest.raises(WorkerLost, match="left the cluster"):
        executor.synchronize()
    assert not executor.usable
    monkeypatch.undo()
    executor.close()
    # ranks aborted with no worker gone, and aborted because one left: tests/partition/test_epoch_watch.py


def test_an_epoch_may_take_ten_times_its_expected_time_and_a_new_kind_of_work_its_rank_timeout(client):
    from hpcgpu.partition.engine import PartitionedExecutor

    model = ShallowWater("unstable_jet", nx=16, ny=40, backend="numpy")
    executor = PartitionedExecutor(client, model, model.initial_state(), 100.0, partitions=2, steps_per_task=2,
                                   timeout=30, epoch_deadline=5)
    try:
        assert executor._deadline(1, 4, {})["seconds"] == 30  # nothing measured yet: the rank timeout
        executor.advance(4)
        executor.synchronize()  # one epoch of advances: its speed is measured
        executor._seconds_per_step = 1.0  # as if a step took a second
        now = time.monotonic()
        for operations, seconds in (({"advance"}, 40), ({"advance", "diagnostics"}, 30)):
            executor._submitted[99] = (now, 8, operations)
            deadline = executor._deadline(99, 4, {})
            assert deadline["seconds"] == seconds and deadline["at"] == pytest.approx(now + seconds, abs=0.01)
        executor._seconds_per_step = 0.01
        executor._submitted[99] = (now, 8, {"advance"})
        assert executor._deadline(99, 4, {})["seconds"] == 5  # the floor
        assert "epoch 99 (steps 8 to 12)" in executor._deadline(99, 4, {})["what"]
    finally:
        executor.close()


def test_no_more_than_max_ahead_epochs_are_ever_in_flight(client, monkeypatch):
    from _faulty_models import SlowRows

    from hpcgpu.partition import engine

    model = SlowRows("unstable_jet", nx=16, ny=40, backend="numpy", pause=0.01)
    executor = engine.PartitionedExecutor(client, model, model.initial_state(), 100.0, partitions=2, steps_per_task=2)
    in_flight, submit = [], executor._submit

    def counted():
        submit()
        in_flight.append(len(executor._in_flight))

    monkeypatch.setattr(executor, "_submit", counted)
    monkeypatch.setattr(executor, "_long_enough", lambda: True)  # every queued program is worth an epoch
    for k in range(12):
        executor.advance(20)  # 10 block advances: 0.1 s a rank
        if k % 3 == 0:
            executor.request_diagnostics(executor.step)
        executor.collect()  # sends the queue when the workers would idle, or it is long enough
    executor.synchronize()
    executor.close()
    assert len(in_flight) >= 6 and max(in_flight) == engine.MAX_AHEAD, in_flight


def _kill_during_an_epoch(client, victim, killed):
    """SIGKILL ``victim``'s process as soon as it runs an epoch task."""
    pid = client.run(os.getpid, workers=[victim])[victim]
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        running = client.processing(workers=[victim]).get(victim, ())
        if any("-epoch-" in str(key) for key in running):
            time.sleep(0.05)  # well inside it
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)
            return
        time.sleep(0.01)


KILL_CASES = {
    "weather": (lambda: ShallowWater("unstable_jet", nx=40, ny=64, backend="numba"), None, 240,
                ("u", "v", "h")),
    "md": (lambda: LennardJones(5, temperature=1.2, thermostat="langevin", backend="numba"), 0.005, 120,
           ("positions", "velocities")),
    "astro": (lambda: NBody("plummer", n=400, backend="numba", seed=2), 0.002, 160, ("positions", "velocities")),
}


@pytest.mark.parametrize("case", sorted(KILL_CASES))
def test_a_worker_killed_in_the_middle_of_an_epoch_is_survived_from_the_last_checkpoint(tmp_path, client, case):
    make, dt, steps, names = KILL_CASES[case]
    model = make()
    reference = Simulation(model, dt=dt, stop_steps=steps, progress=False, client=client, partitions=2).run()
    expected = {name: np.asarray(getattr(reference.state, name)) for name in names}
    reference.close()
    sim = Simulation(model, dt=dt, stop_steps=steps, progress=False, client=client, partitions=2)
    killed = []
    victim = sim._executor.owner[1]

    def start_killer(simulation):
        if simulation.step >= steps // 2 and not killed and not getattr(simulation, "_killer", None):
            simulation._killer = threading.Thread(target=_kill_during_an_epoch, args=(client, victim, killed))
            simulation._killer.start()

    sim.add_callback(start_killer, 10)
    with pytest.warns(RuntimeWarning, match="restarted from the checkpoint at step"), \
            dask.config.set({"distributed.deploy.lost-worker-timeout": "1h"}):
        sim.run(checkpoint=tmp_path, checkpoint_every=20)
    sim._killer.join()
    assert killed and sim.step == steps and sim.restarts
    assert sim.restarts[0]["step"] < steps and "lost" in sim.restarts[0]["error"]
    for name, value in expected.items():
        got = np.asarray(getattr(sim.state, name))
        if case == "md":  # slabs rebuild their lists after a restart: another summation order
            np.testing.assert_allclose(got, value, rtol=0, atol=1e-9, err_msg=name)
        else:
            np.testing.assert_array_equal(got, value, err_msg=name)
    sim.close()
    client.wait_for_workers(2, timeout=60)
