"""The client gathers a partitioned run's state only when asked, and refuses a gather that would not fit it."""

import re

import numpy as np
import pytest

from hpcgpu import Simulation
from hpcgpu.errors import ConfigError, GatherTooLarge
from hpcgpu.partition import client_gather
from hpcgpu.partition.client_gather import JOIN_COPIES, check_gather, gather_nbytes, state_nbytes
from hpcgpu.workloads.md import LennardJones
from hpcgpu.workloads.weather import ShallowWater


def test_the_state_bytes_are_those_of_its_host_arrays_not_its_neighbour_list():
    model = LennardJones(3, backend="numpy")
    state = model.initial_state()
    assert state.neighbors is not None
    assert state_nbytes(state) == sum(a.nbytes for a in model.to_host(state).arrays())
    weather = ShallowWater("rest", nx=8, ny=4, backend="numpy")
    assert state_nbytes(weather.initial_state()) == 3 * 8 * 4 * 8


def test_a_gather_that_would_not_fit_names_the_bytes_the_memory_and_what_to_use_instead():
    model = ShallowWater("rest", nx=64, ny=32, backend="numpy")
    assert check_gather(model, [100, 200], available=600) == 600 == gather_nbytes([100, 200])
    with pytest.raises(GatherTooLarge) as caught:
        check_gather(model, [100, 200], available=599)
    error = caught.value
    assert isinstance(error, ConfigError) and (error.needed, error.available) == (600, 599)
    message = str(error)
    for words in ("nx=64, ny=32", "600 bytes", "599 bytes", f"{JOIN_COPIES} copies", "sim.diagnostics",
                  "ZarrWriter", "reduce_on_ranks"):
        assert words in message, words


def test_sim_state_checks_the_real_gathered_bytes_against_the_clients_memory(client, monkeypatch):
    model = ShallowWater("gravity_wave", nx=32, ny=24, backend="numpy")
    sim = Simulation(model, dt=60.0, progress=False, client=client, partitions=2)
    try:
        sim.run(4)
        state_bytes = 3 * 32 * 24 * 8  # u, v, h in float64: what the ranks hold and would send
        needed = JOIN_COPIES * state_bytes
        monkeypatch.setattr(client_gather, "available_memory", lambda backend: needed - 1)
        with pytest.raises(GatherTooLarge, match=f"takes about {needed} bytes") as caught:
            sim.state
        assert caught.value.needed == needed
        sim.run(4)  # refused, not broken: the run goes on
        monkeypatch.setattr(client_gather, "available_memory", lambda backend: needed)
        gathered = sim.state
    finally:
        sim.close()
    assert sim.step == 8 and gathered.h.shape == (24, 32) and np.isfinite(gathered.h).all()


def test_a_brick_gather_counts_the_copy_sorted_by_id(client, monkeypatch):
    model = LennardJones(4, temperature=1.0, backend="numpy")
    sim = Simulation(model, dt=0.005, progress=False, client=client, partitions=2)
    try:
        host_bytes = state_nbytes(model.to_host(model.initial_state()))
        monkeypatch.setattr(client_gather, "available_memory", lambda backend: 3 * host_bytes - 1)
        with pytest.raises(GatherTooLarge, match="3 copies") as caught:
            sim.state
    finally:
        sim.close()
    assert caught.value.needed == 3 * host_bytes


def test_a_command_draws_no_picture_rather_than_fail_at_the_end_of_a_run_too_large_for_its_client(capsys):
    class TooLarge:
        @property
        def state(self):
            raise GatherTooLarge("gathering the state of n=10 takes about 600 bytes", needed=600, available=1)

    assert client_gather.gathered_or_none(TooLarge(), "picture") is None
    assert "hpcgpu: no picture: gathering the state of n=10" in capsys.readouterr().err
    model = ShallowWater("rest", nx=8, ny=4, backend="numpy")
    sim = Simulation(model, dt=60.0, progress=False)
    assert client_gather.gathered_or_none(sim, "picture") is sim.state


def test_the_client_is_checked_for_the_whole_estimate_only_when_it_builds_the_state(monkeypatch):
    from hpcgpu import validation

    model = LennardJones(6, backend="numpy")
    what, estimate = model.memory_estimate()
    workers = {"tcp://a": {"memory_limit": 2**40}, "tcp://b": {"memory_limit": 2**40}}
    monkeypatch.setattr(validation, "available_memory", lambda backend: estimate - 1)
    # the ranks build their atoms: nothing full-size on the client, whatever its memory
    validation.check_model_memory(model, workers, 2, client_builds=False)
    # the client builds the state, its list and first forces: the model's whole estimate, not a part of it
    with pytest.raises(ConfigError, match=re.escape(f"(the state built on the client) needs about {estimate:.3g}")):
        validation.check_model_memory(model, workers, 2, client_builds=True)
    monkeypatch.setattr(validation, "available_memory", lambda backend: estimate)
    validation.check_model_memory(model, workers, 2, client_builds=True)
