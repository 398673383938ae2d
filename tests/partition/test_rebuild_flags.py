"""The rebuild flags of MD bricks: carried by the ghost exchange, a rebuild decided late, no collective per step.

Ranks run as threads of this process (:mod:`_thread_comm`): the
decomposition's own step, its communicator counters, no dask.
"""

from types import SimpleNamespace

import numpy as np
import pytest
from _thread_comm import run_group

from hpcgpu.errors import UnstableSimulation
from hpcgpu.partition import bricks as brick_module
from hpcgpu.partition.bricks import BrickDecomposition
from hpcgpu.partition.rebuild_flags import check_list_holds, earliest, rebuild_delay, rebuild_due
from hpcgpu.workloads.md import LennardJones


def _rushing_liquid(cells):
    """A thin liquid whose atoms within 2 sigma of the box corner get 3 sigma/tau more along (1, 1, 1)."""
    model = LennardJones(cells, density=0.6, temperature=1.2, cutoff=2.0, skin=0.3, backend="numba", seed=3)
    state = model.step(model.initial_state(), 0.005, 100)
    box = np.asarray(model.box)[:, None]
    offset = (state.positions + box / 2) % box - box / 2
    velocities = state.velocities.copy()
    velocities[:, (offset ** 2).sum(axis=0) < 2.0 ** 2] += 3.0
    return model, model.state_from_arrays(state.positions, velocities, ids=state.ids)


def _run_on_threads(model, state, grid, steps, timeout=20.0):
    """``steps`` steps of ``state`` on bricks of ``grid``, one thread a rank: the joined state and each rank's
    result (its host block and communicator counters, or the error it raised)."""
    decomposition = BrickDecomposition.build(model, 0.005, int(np.prod(grid)), None, None, False, grid=grid)
    blocks = decomposition.split_state(model, state)

    def rank(comm):
        context = SimpleNamespace(model=model, comm=comm, rank=comm.rank)
        domain = decomposition.resume(context, blocks[comm.rank])
        domain = decomposition.advance(context, domain, steps)
        return model.to_host(decomposition.model_state(domain)), comm.counters_by_family()

    results, _ = run_group(decomposition.bricks.count, rank, timeout=timeout)
    if any(isinstance(r, Exception) for r in results):
        return None, results
    return model.to_host(decomposition.join(model, [block for block, _ in results])), results


def test_the_delay_is_the_layers_a_flag_crosses_after_its_own_step():
    # periodic axes: n // 2 layers to the farthest rank, one of them in the step of the raise
    assert [rebuild_delay((1, 1, n)) for n in (1, 2, 3, 4, 5, 8, 16)] == [0, 0, 0, 1, 1, 3, 7]
    assert rebuild_delay((8, 8, 4)) == 3 and rebuild_delay((16, 8, 8)) == 7 and rebuild_delay((3, 2, 2)) == 0
    assert earliest() is None and earliest(None, 7, 5, None) == 5
    assert not rebuild_due(None, 10, 0) and rebuild_due(10, 10, 0) and not rebuild_due(8, 10, 3)
    assert rebuild_due(7, 10, 3)
    check_list_holds(1.0, 0, 5, 3)  # exactly skin / 2: the list still holds
    with pytest.raises(UnstableSimulation, match=r"partition 2: an atom moved 1.1 x skin / 2 .* decided 3 step"):
        check_list_holds(1.21, 2, 5, 3)


# eight slabs (1 x 1 x 8: D = 3) and a 4 x 2 x 1 grid (D = 1, two axes): more than 3 layers on an axis
@pytest.mark.parametrize("cells, grid", [((3, 3, 12), (1, 1, 8)), ((6, 3, 3), (4, 2, 1))])
def test_more_than_three_layers_rebuild_late_without_a_collective_and_equal_one_process(cells, grid):
    model, state = _rushing_liquid(cells)
    steps = 100
    reference = model.step(state, 0.005, steps)
    final, results = _run_on_threads(model, state, grid, steps)
    assert final is not None, [r for r in results if isinstance(r, Exception)]
    side = max(model.box)
    np.testing.assert_array_equal(final.ids, reference.ids)
    np.testing.assert_array_equal(final.images, reference.images)
    np.testing.assert_allclose(final.positions, reference.positions, rtol=1e-12, atol=1e-12 * side)
    speed = np.abs(reference.velocities).max()
    np.testing.assert_allclose(final.velocities, reference.velocities, rtol=1e-12, atol=1e-12 * speed)
    np.testing.assert_allclose(final.energies.sum(), reference.energies.sum(), rtol=1e-12)
    # the late rebuild comes on a bound: at least the builds of one process, not many more
    assert reference.rebuilds <= final.rebuilds <= 2 * reference.rebuilds
    rebuilds = final.rebuilds - state.rebuilds
    for _, families in results:
        assert not any(family.startswith("#") for family in families), families  # no collective at all
        # a ghost message to each neighbour every step (rebuild steps too: the flags) but a first one without
        # lists (the split's list would not last the delay: every rank builds), nothing else but rebuilds
        neighbours = sum(2 if parts > 2 else 1 for parts in grid if parts > 1)
        assert families["ghosts"]["messages"] in ((steps - 1) * neighbours, steps * neighbours)
        others = sum(f["messages"] for name, f in families.items() if name != "ghosts")
        assert others <= rebuilds * 2 * neighbours


def test_a_rank_that_would_keep_a_list_too_long_fails_loudly(monkeypatch):
    """No margin: a flag raised at skin / 2 comes 3 steps late, and the rank that raised it refuses the step."""
    monkeypatch.setattr(brick_module, "LATE_REBUILD_MARGIN", 0.0)
    model, state = _rushing_liquid((3, 3, 12))
    final, results = _run_on_threads(model, state, (1, 1, 8), 40, timeout=3.0)
    assert final is None
    dangerous = [r for r in results if isinstance(r, UnstableSimulation) and "dangerous build" in str(r)]
    assert dangerous and "the rebuild decided 3 step(s) late has not come" in str(dangerous[0])


def test_up_to_three_layers_rebuild_at_the_steps_of_one_process():
    model, state = _rushing_liquid((4, 4, 4))
    reference = model.step(state, 0.005, 60)
    final, results = _run_on_threads(model, state, (2, 2, 2), 60)
    assert final is not None, [r for r in results if isinstance(r, Exception)]
    assert final.rebuilds == reference.rebuilds
    np.testing.assert_allclose(final.positions, reference.positions, rtol=1e-12, atol=1e-12 * max(model.box))
    assert not any(name.startswith("#") for _, families in results for name in families)


def test_one_take_cuts_both_neighbours_ghosts_on_every_backend(backend):
    from hpcgpu.partition.bricks import cut_ghosts, merged_cut

    xp = backend.xp
    host = np.random.default_rng(3).uniform(0.0, 9.0, (3, 50))
    stage = ((4, np.array([3, 0, 49, 7])), (6, np.array([], dtype=np.int64)), (5, np.array([12])))
    cut = merged_cut(xp, tuple((q, xp.asarray(index)) for q, index in stage), 50)
    pieces = cut_ghosts(xp, backend.asarray(host), cut)
    for piece, (_, index) in zip(pieces, stage):
        assert piece.shape == (3, len(index)) and piece.flags.c_contiguous
        np.testing.assert_array_equal(backend.to_host(piece), host[:, index])
    with pytest.raises(Exception, match="a ghost cut made for 50 held atoms was given 49"):
        cut_ghosts(xp, backend.asarray(host[:, 1:]), cut)


def _one_simulated_kernel_at_a_time(monkeypatch):
    """The CUDA simulator runs one kernel at a time: thread ranks take turns launching (device functions run
    inside a kernel's own threads, untouched)."""
    import threading

    from numba.cuda.simulator.kernel import FakeCUDAKernel

    launch, lock = FakeCUDAKernel.__call__, threading.Lock()

    def in_turn(self, *args):
        if self._device:
            return launch(self, *args)
        with lock:
            return launch(self, *args)

    monkeypatch.setattr(FakeCUDAKernel, "__call__", in_turn)


def test_late_rebuilds_on_every_backend_equal_its_one_process_run(backend, monkeypatch):
    """4 x 1 x 1 and 4 x 2 x 1 (a rebuild one step late), tiny: the backends' arrays through the cuts and flags."""
    grid, steps = ((4, 2, 1), 12) if backend.name != "cuda" else ((4, 1, 1), 3)
    if backend.name == "cuda" and backend.xp is np:
        _one_simulated_kernel_at_a_time(monkeypatch)
    cells = (6, 3, 3)
    numba_model, state = _rushing_liquid(cells)
    model = numba_model.with_backend(backend.name)
    state = model.restore_state(numba_model.checkpoint_state(state))
    reference = model.to_host(model.step(state, 0.005, steps))
    final, results = _run_on_threads(model, state, grid, steps, timeout=120.0)
    assert final is not None, [r for r in results if isinstance(r, Exception)]
    np.testing.assert_allclose(final.positions, reference.positions, rtol=1e-12, atol=1e-12 * max(model.box))
    np.testing.assert_allclose(final.velocities, reference.velocities, rtol=1e-12, atol=1e-11)
