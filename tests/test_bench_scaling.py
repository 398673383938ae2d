"""``hpcgpu bench scaling``: what its lines carry of the engine (no cluster: the executor is a stand-in)."""

import pytest

from hpcgpu.bench import scaling


class _Executor:
    """Records advances; every epoch's ranks report (seconds, seconds waiting, CPU seconds)."""

    described = {}

    def __init__(self, client, model, state, dt, *, partitions, steps_per_task, name):
        self.partitions, self.epoch_stats = partitions, []

    def advance(self, steps):
        self.epoch_stats.append({"ranks": [(0.02, 0.005, 0.015)] * self.partitions})

    def synchronize(self):
        pass

    def describe(self):
        return {"partitions": self.partitions, **self.described}

    def close(self):
        pass


class _NoBystanders:
    def __init__(self, client):
        pass

    def seconds(self):
        return 0.0


class _Model:
    def initial_state(self):
        return None


@pytest.mark.parametrize("described, grid", [({}, None), ({"grid": (2, 1)}, [2, 1]),
                                             ({"process_grid": "2x2"}, [2, 2])])
def test_a_timed_run_carries_the_process_grid_the_executor_describes(monkeypatch, described, grid):
    monkeypatch.setattr(scaling, "PartitionedExecutor", type("Described", (_Executor,), {"described": described}))
    monkeypatch.setattr(scaling, "_BystanderCPU", _NoBystanders)
    runs = scaling.time_engine(None, _Model(), 2, 4, 3, repeats=2, time_step=lambda model, state: 1.0)
    assert len(runs) == 2 and all(run.grid == grid for run in runs)
    median = scaling.median_run(runs)
    assert median.compute_s == pytest.approx(0.015 / 3) and median.halo_s == pytest.approx(0.005 / 3)


def test_the_scaling_suite_refuses_a_workload_without_a_scaling_case_before_any_cluster_starts():
    from hpcgpu.bench.harness import Recorder
    from hpcgpu.errors import ConfigError

    with pytest.raises(ConfigError, match="'vorticity' declares no 'scaling' benchmark case"):
        scaling.run(Recorder("scaling"), [], workload="vorticity")
    with pytest.raises(ConfigError, match="size=8 cells per side"):
        scaling.run(Recorder("scaling"), [], workload="weather", sizes=[8])


@pytest.mark.parametrize("case", ["turbulence", "unstable_jet"], ids=["periodic", "channel"])
def test_the_map_overlap_baseline_steps_as_one_process_does(case):
    import numpy as np

    from hpcgpu.workloads.weather import ShallowWater

    model = ShallowWater(case, nx=16, ny=40, backend="numpy", beta=2e-11)  # f varies: each block's rows matter
    state = model.initial_state()
    dt = model.suggested_dt(state, 0.4)
    stacked, step = scaling._overlap_stepper(model, model.to_host(state), dt, 3)
    stepped = step(step(stacked)).compute(scheduler="synchronous")
    expected = model.step(state, dt, 2)
    np.testing.assert_array_equal(stepped, np.stack(expected.arrays()))


def test_k_is_the_one_asked_where_the_engines_blocks_hold_its_frame_and_1_elsewhere():
    from hpcgpu.workloads.astro import NBody
    from hpcgpu.workloads.weather import ShallowWater

    model = ShallowWater("turbulence", nx=64, ny=128, backend="numpy")  # 2 blocks of 64 rows; K=4 reads 24, 12
    assert scaling._steps_per_task(model, 4, 2) == 4
    assert scaling._steps_per_task(model, 16, 2) == 1  # a frame of 96 rows fits no 2-rank grid of it
    assert scaling._steps_per_task(NBody("galaxy_collision", n=64, backend="numpy"), 4, 2) == 1
