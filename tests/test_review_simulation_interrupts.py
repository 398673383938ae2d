"""Ctrl-C in a run on a cluster: the run stops on a whole step, and continues exactly."""

import numpy as np
import pytest

pytest.importorskip("distributed")  # a bare GPU image lacks it: skip there

from _support import interrupted_after_one_step  # noqa: E402

from hpcgpu import Simulation
from hpcgpu.workloads.weather import ShallowWater


def _model():
    return ShallowWater("unstable_jet", nx=32, ny=16, backend="numpy")


def test_ctrl_c_on_a_cluster_then_diagnostics_and_run_again(client):
    """The interrupt lands while steps are queued: ``step`` must count them, the diagnostics of
    that step still on their way must not be recorded twice, and the run continues bitwise."""
    sim = Simulation(_model(), stop_steps=24, diagnostics=4, progress=False, client=client, partitions=2,
                     steps_per_task=1)
    with interrupted_after_one_step(sim), pytest.raises(KeyboardInterrupt):
        sim.run()
    assert sim.step == 4
    sim.record_diagnostics()
    sim.record_diagnostics()
    assert list(sim.diagnostics["step"].values) == [0, 4]
    sim.run()
    reference = Simulation(_model(), stop_steps=24, diagnostics=4, progress=False).run()
    for name in ("u", "v", "h"):
        assert np.array_equal(getattr(sim.state, name), getattr(reference.state, name)), name
    assert list(sim.diagnostics["step"].values) == list(reference.diagnostics["step"].values)
    sim.close()
