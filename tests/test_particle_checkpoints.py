"""Particle runs on a cluster (MD bricks, N-body blocks): each rank writes its particles as a checkpoint piece."""

import json
import os
import warnings

import numpy as np
import pytest

pytest.importorskip("dask")  # a bare GPU image lacks it: skip there

from hpcgpu import Simulation  # noqa: E402
from hpcgpu.checkpoint import list_checkpoints  # noqa: E402
from hpcgpu.errors import ConfigError, WorkerLost  # noqa: E402
from hpcgpu.particle_checkpoints import ParticlePieces  # noqa: E402
from hpcgpu.workloads.astro import NBody  # noqa: E402
from hpcgpu.workloads.md import LennardJones  # noqa: E402

STEPS, WRITTEN = 30, 10
MD_ARRAYS = ("positions", "velocities", "forces", "images", "origins", "ids", "energies", "virials", "pair_counts")
BODY_ARRAYS = ("positions", "velocities", "masses", "accelerations", "potentials")


def _md():
    # box 10.1 x 10.1 x 5.0: bricks of 2x2x1, 2 and 3 layers all at least cutoff + 2 skin = 2.6 thick
    return LennardJones((6, 6, 3), temperature=1.2, cutoff=2.0, thermostat="langevin", backend="numpy", seed=7)


def _arrays(sim, names):
    state = sim.state
    return {name: np.asarray(getattr(state, name)) for name in names}


@pytest.fixture(scope="module")
def md_written(client, tmp_path_factory):
    """An MD checkpoint written at step 10 by 4 bricks (2x2x1 on 2 workers), and the uninterrupted run."""
    folder = tmp_path_factory.mktemp("md-pieces")
    options = dict(dt=0.005, stop_steps=STEPS, progress=False)
    reference = Simulation(_md(), client=client, partitions=4, grid=(2, 2, 1), **options).run()
    expected = (_arrays(reference, MD_ARRAYS), reference.state.rebuilds, reference.diagnostics)
    reference.close()
    sim = Simulation(_md(), client=client, partitions=4, grid=(2, 2, 1), **options)
    sim.run(steps=WRITTEN, checkpoint=folder)
    sim.close()
    return folder, expected


@pytest.fixture(scope="module")
def bodies_written(client, tmp_path_factory):
    """An N-body checkpoint written at step 10 by 4 ranks, and the uninterrupted run in one process."""
    folder = tmp_path_factory.mktemp("body-pieces")
    model = NBody("plummer", n=90, backend="numpy", seed=2)
    reference = Simulation(model, dt=0.002, stop_steps=STEPS, progress=False).run()
    sim = Simulation(model, dt=0.002, stop_steps=STEPS, progress=False, client=client, partitions=4)
    sim.run(steps=WRITTEN, checkpoint=folder)
    sim.close()
    return folder, _arrays(reference, BODY_ARRAYS), reference.diagnostics


# -- what the ranks write --------------------------------------------------------------------------------------
def test_md_ranks_write_their_atoms_with_ids_and_listed_positions_under_a_manifest(md_written):
    folder, _ = md_written
    directory = folder / f"step-{WRITTEN:010d}"
    manifest = json.loads((directory / "manifest.json").read_text())
    assert manifest["format"] == "hpcgpu-particle-pieces-1" and manifest["step"] == WRITTEN
    assert manifest["process_grid"] == [2, 2, 1] and manifest["particles"] == _md().n
    assert [p["rank"] for p in manifest["pieces"]] == [0, 1, 2, 3]
    assert sum(p["particles"] for p in manifest["pieces"]) == _md().n
    assert all(p["scalars"]["step"] == WRITTEN and p["listed_bounds"] for p in manifest["pieces"])
    expected = ["manifest.json", "model.pkl"] + [f"rank-{r:06d}-{name}.npy" for r in range(4) for name in MD_ARRAYS] \
        + [f"rank-{r:06d}-extra-listed.npy" for r in range(4)]
    assert sorted(os.listdir(directory)) == sorted(expected) and not (directory / "state.pkl").exists()
    ids = np.concatenate([np.load(directory / f"rank-{r:06d}-ids.npy") for r in range(4)])
    np.testing.assert_array_equal(np.sort(ids), np.arange(_md().n))  # each atom once, on its rank


def test_body_ranks_write_their_blocks_with_their_ids(bodies_written):
    folder, _, _ = bodies_written
    directory = folder / f"step-{WRITTEN:010d}"
    manifest = json.loads((directory / "manifest.json").read_text())
    assert manifest["decomposition"] == "bodies" and manifest["process_grid"] == [4]
    ranges = [p["ids"] for p in manifest["pieces"]]
    assert ranges[0][0] == 0 and ranges[-1][1] == 90 and all(a[1] == b[0] for a, b in zip(ranges, ranges[1:]))
    for piece in manifest["pieces"]:
        np.testing.assert_array_equal(np.load(directory / piece["extra"]["ids"]["file"]), np.arange(*piece["ids"]))


# -- resuming ----------------------------------------------------------------------------------------------------
def test_md_pieces_resume_on_the_same_bricks_bitwise(client, md_written):
    folder, (expected, rebuilds, diagnostics) = md_written
    resumed = Simulation.resume(folder, progress=False, client=client, partitions=4, grid=(2, 2, 1))
    assert resumed.step == WRITTEN
    resumed.run()
    for name, value in expected.items():
        np.testing.assert_array_equal(_arrays(resumed, [name])[name], value, err_msg=name)
    assert resumed.state.rebuilds == rebuilds  # the lists kept: the same builds at the same steps
    np.testing.assert_array_equal(resumed.diagnostics.energy, diagnostics.energy)
    resumed.close()


@pytest.mark.parametrize("layout", [dict(partitions=2), dict(partitions=3), None], ids=["2", "3", "local"])
def test_md_pieces_of_4_bricks_resume_on_any_bricks_to_rounding(client, md_written, monkeypatch, layout):
    folder, (expected, rebuilds, diagnostics) = md_written
    if layout is not None:  # the client reads no atom: each rank reads the pieces near its brick
        monkeypatch.setattr(ParticlePieces, "whole_state", lambda *a: pytest.fail("the client read the pieces"))
    resumed = Simulation.resume(folder, progress=False, **({} if layout is None else dict(client=client, **layout)))
    resumed.run()
    got = _arrays(resumed, MD_ARRAYS)
    # another summation order: rounding, amplified by the chaotic dynamics (as tests/partition/test_bricks.py)
    for name in ("positions", "velocities", "forces"):
        np.testing.assert_allclose(got[name], expected[name], rtol=0, atol=1e-9, err_msg=name)
    for name in ("ids", "images", "pair_counts"):
        np.testing.assert_array_equal(got[name], expected[name], err_msg=name)
    assert resumed.state.rebuilds == rebuilds  # each rank's first list is its atoms' own: the same builds
    np.testing.assert_allclose(resumed.diagnostics.energy, diagnostics.energy, rtol=1e-10)
    resumed.close()


@pytest.mark.parametrize("layout", [dict(partitions=2), dict(partitions=3), None], ids=["2", "3", "local"])
def test_body_pieces_of_4_ranks_resume_on_any_count_bitwise(client, bodies_written, layout):
    folder, expected, diagnostics = bodies_written
    resumed = Simulation.resume(folder, progress=False, **({} if layout is None else dict(client=client, **layout)))
    assert resumed.step == WRITTEN
    resumed.run()
    for name, value in expected.items():
        np.testing.assert_array_equal(_arrays(resumed, [name])[name], value, err_msg=name)
    np.testing.assert_array_equal(resumed.diagnostics.energy, diagnostics.energy)
    resumed.close()


def test_body_pieces_resume_on_another_backend(bodies_written):
    pytest.importorskip("numba")
    folder, expected, _ = bodies_written
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        resumed = Simulation.resume(folder, progress=False, backend="numba").run()
    np.testing.assert_allclose(resumed.state.positions, expected["positions"], rtol=1e-10, atol=1e-12)


# -- broken checkpoints and lost workers -------------------------------------------------------------------------
def test_a_particle_checkpoint_without_its_manifest_is_ignored(client, tmp_path):
    model = NBody("plummer", n=40, backend="numpy", seed=3)
    sim = Simulation(model, dt=0.002, stop_steps=STEPS, progress=False, client=client, partitions=2)
    sim.run(steps=8, checkpoint=tmp_path, checkpoint_every=4)
    sim.close()
    os.remove(tmp_path / "step-0000000008" / "manifest.json")  # as a crash before the manifest leaves it
    with pytest.warns(RuntimeWarning, match=r"step-0000000008 is unusable .*no manifest.json"):
        resumed = Simulation.resume(tmp_path, progress=False, client=client, partitions=3)
    assert resumed.step == 4
    resumed.close()


def test_a_corrupted_particle_piece_is_a_clear_error_naming_it(client, tmp_path):
    sim = Simulation(_md(), dt=0.005, stop_steps=STEPS, progress=False, client=client, partitions=2)
    sim.run(steps=4, checkpoint=tmp_path)
    sim.close()
    piece = tmp_path / "step-0000000004" / "rank-000001-velocities.npy"
    data = bytearray(piece.read_bytes())
    data[-3] ^= 0xFF
    piece.write_bytes(bytes(data))
    for options in (dict(client=client, partitions=2), dict(client=client, partitions=3), {}):
        with pytest.raises(ConfigError, match=r"checkpoint piece .*rank-000001-velocities.npy is corrupted"):
            Simulation.resume(tmp_path, progress=False, **options)


def test_a_lost_worker_restarts_an_md_run_from_its_pieces(client, tmp_path):
    options = dict(dt=0.005, stop_steps=20, progress=False, client=client, partitions=2)
    reference = Simulation(_md(), **options).run()
    expected = _arrays(reference, MD_ARRAYS)
    reference.close()
    sim = Simulation(_md(), **options)
    raised = []

    def lose(s):
        if s.step == 12 and not raised:
            raised.append(WorkerLost("a worker was lost during the run (injected)"))
            raise raised[-1]

    sim.add_callback(lose, 2)
    with pytest.warns(RuntimeWarning, match="restarted from the checkpoint at step 8 "):
        sim.run(checkpoint=tmp_path, checkpoint_every=8)
    assert [r["step"] for r in sim.restarts] == [8]
    assert all((tmp_path / os.path.basename(c) / "manifest.json").exists() for c in list_checkpoints(tmp_path))
    for name, value in expected.items():  # the same bricks: bitwise
        np.testing.assert_array_equal(_arrays(sim, [name])[name], value, err_msg=name)
    sim.close()


# -- a brick rank's start from the pieces --------------------------------------------------------------------------
@pytest.mark.parametrize("grid", [(4, 1, 1), (2, 2, 1)])
def test_a_brick_reads_only_the_pieces_near_it_and_starts_as_the_clients_split_would(tmp_path, grid):
    from hpcgpu.partition.brick_start import BrickHalo, pieces_start
    from hpcgpu.partition.bricks import BrickDecomposition
    from hpcgpu.particle_checkpoints import write_particle_piece

    model = LennardJones((24, 12, 4), temperature=1.2, cutoff=2.0, backend="numpy", seed=5)  # box 40 x 20 x 7
    state = model.step(model.initial_state(), 0.005, 20)
    decomposition = BrickDecomposition.build(model, 0.005, int(np.prod(grid)), None, None, False, grid=grid)
    split = decomposition.split(model, model.to_host(state), model.listed_positions(state))
    pieces = []
    for rank, domain in enumerate(split):
        host, extra, region = decomposition.checkpoint_particles(model, rank, domain)
        pieces.append(write_particle_piece(tmp_path, rank, region, host, extra))
    source = ParticlePieces(str(tmp_path), type(host), pieces)
    assert source.has_extra("listed") and source.particles == model.n
    if grid == (4, 1, 1):  # its own slab and both neighbours (one across the periodic face), not the far one
        halo = BrickHalo(decomposition.bricks, 0, model.ghost_radius(), True)
        assert [halo.wants(piece) for piece in pieces] == [True, True, False, True]
    for rank, expected in enumerate(split):
        built, sends, listed = pieces_start(decomposition.bricks, model, rank, source, True)
        for name in MD_ARRAYS:
            np.testing.assert_array_equal(getattr(built, name), getattr(expected.state, name), err_msg=name)
        np.testing.assert_array_equal(listed, expected.listed)
        assert [(axis, [q for q, _ in stage]) for axis, stage in sends] == \
            [(axis, [q for q, _ in stage]) for axis, stage in expected.sends]
        for (_, mine), (_, theirs) in zip(sends, expected.sends):
            for (_, a), (_, b) in zip(mine, theirs):
                np.testing.assert_array_equal(a, b)


def test_a_particle_piece_refuses_a_state_it_cannot_hold(tmp_path):
    from dataclasses import dataclass

    from hpcgpu.particle_checkpoints import write_particle_piece

    @dataclass
    class Odd:
        positions: object
        table: object

        @property
        def size(self):
            return self.positions.shape[-1]

    with pytest.raises(ConfigError, match=r"Odd.table: a particle checkpoint piece holds arrays over the 3 particles"):
        write_particle_piece(tmp_path, 0, {}, Odd(np.zeros((3, 3)), {"a": 1}))
    with pytest.raises(ConfigError, match="needs a dataclass state; got dict"):
        write_particle_piece(tmp_path, 0, {}, {"positions": np.zeros((3, 3))})
