"""Extended-XYZ frames: formatted a block of atoms at a time, byte for byte what one number at a time gives;
a partitioned run's frames are gathered, and its writer says so once."""

import warnings

import numpy as np
import pytest

from hpcgpu import Simulation
from hpcgpu.errors import GatherWarning
from hpcgpu.workloads.md import LennardJones, XYZWriter, output
from hpcgpu.workloads.md.output import atom_lines, xyz_frame


def _one_number_at_a_time(species, columns, precision):
    """The atom lines as the writer formatted them before (a Python loop over every number): the reference."""
    number = f" %.{precision}g"
    return "\n".join(species + "".join(number % v for v in row) for row in columns.tolist()) + "\n"


@pytest.mark.parametrize("precision", [1, 8, 17])
def test_atom_lines_are_the_bytes_of_one_number_at_a_time(rng, precision, monkeypatch):
    monkeypatch.setattr(output, "ROWS_PER_BLOCK", 7)  # several blocks and a short last one
    columns = rng.standard_normal((50, 6)) * 10.0 ** rng.integers(-12, 12, (50, 6))
    columns[0] = [0.0, -0.0, 1.0, -1e-300, 1e300, 123456789.0]
    columns[1, :3] = np.float32(rng.standard_normal(3))  # float32 values widened, as the writer does
    assert atom_lines("Ar", columns, precision) == _one_number_at_a_time("Ar", columns, precision)
    assert atom_lines("Kr", columns[:1], precision) == _one_number_at_a_time("Kr", columns[:1], precision)


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_a_frame_is_the_header_and_the_lines_of_every_atom_in_id_order(dtype):
    model = LennardJones(3, dtype=dtype, backend="numpy")
    state = model.step(model.initial_state(), 0.005, 5)
    text = xyz_frame(model, state, time=0.025, step=5, unwrapped=True)
    header, comment, *lines = text.split("\n")
    assert header == str(model.n) and "Step=5" in comment and lines[-1] == ""
    order = np.argsort(state.ids)
    positions = state.positions.astype(np.float64) + state.images * np.asarray(model.box)[:, None]
    columns = np.concatenate([positions, state.velocities.astype(np.float64)])[:, order].T
    assert "\n".join(lines) == _one_number_at_a_time("Ar", columns, 8)


def test_a_partitioned_runs_xyz_writer_warns_once_that_it_gathers(client, tmp_path):
    model = LennardJones(4, temperature=1.0, backend="numpy")
    sim = Simulation(model, dt=0.005, progress=False, client=client, partitions=2)
    writer = XYZWriter(tmp_path / "run.xyz", 2)
    sim.add_writer(writer)
    try:
        with pytest.warns(GatherWarning, match="gathers every atom") as caught:
            sim.run(4)
        gathered = sim.state
    finally:
        sim.close()
    assert sum(issubclass(w.category, GatherWarning) for w in caught) == 1 and writer.frames == 3
    lines = (tmp_path / "run.xyz").read_text().split("\n")
    assert len(lines) == 3 * (model.n + 2) + 1
    last = "\n".join(lines[-(model.n + 3):])  # the frame of step 4 is the gathered state's
    assert last == xyz_frame(model, gathered, time=sim.time, step=4)


def test_a_local_runs_xyz_writer_does_not_warn(tmp_path):
    sim = Simulation(LennardJones(3, backend="numpy"), dt=0.005, stop_steps=2, progress=False)
    sim.add_writer(XYZWriter(tmp_path / "run.xyz", 1))
    with warnings.catch_warnings():
        warnings.simplefilter("error", GatherWarning)
        sim.run()
