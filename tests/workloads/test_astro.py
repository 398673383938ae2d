"""The N-body model: Kepler orbits, Plummer equilibrium, conservation, integrators, partitions, bad input."""

import math
import pickle

import numpy as np
import pytest
from _support import small

from hpcgpu import Simulation
from hpcgpu.errors import ConfigError, UnstableSimulation
from hpcgpu.kernels import nbody
from hpcgpu.workloads.astro import INTEGRATORS, NBody, kepler_orbit, kepler_period


def _kepler_run(dt, orbits=10, **kwargs):
    """Energies and apocentre passage times of the two-body orbit."""
    model = NBody("kepler", backend="numba", dtype="float64", **kwargs)
    state = model.initial_state()
    period = kepler_period(model)
    steps = round(orbits * period / dt)
    stepper = model.stepper(dt)
    e0 = model.diagnostics(state)["energy"]
    errors, crossings = [], []
    previous = None
    for k in range(1, steps + 1):
        state = stepper.advance(state, 1)
        rel = state.positions[:, 1] - state.positions[:, 0]
        errors.append(abs(model.diagnostics(state)["energy"] - e0) / abs(e0))
        if previous is not None and previous[1] < 0 <= rel[1] and rel[0] > 0:
            # linear interpolation of the time the orbit crosses the apocentre direction
            fraction = -previous[1] / (rel[1] - previous[1])
            crossings.append((k - 1 + fraction) * dt)
        previous = rel
    return np.array(errors), np.array(crossings), period


def test_kepler_energy_and_period_after_ten_orbits():
    dt = 2 * math.pi / 4000
    errors, crossings, period = _kepler_run(dt, orbits=10.05)
    after_ten = errors[round(10 * period / dt) - 1]
    print(f"energy error after 10 orbits {after_ten:.2e}, largest {errors.max():.2e}")
    assert after_ten < 1e-6
    assert len(crossings) == 10
    measured = crossings[9] / 10  # starts at apocentre: the 10th return is 10 periods in
    print(f"period {measured!r} vs {period!r}: relative error {abs(measured - period) / period:.1e}")
    assert abs(measured - period) / period < 1e-4


def test_leapfrog_energy_error_scales_as_dt_squared():
    coarse, _, _ = _kepler_run(dt=2 * math.pi / 500, orbits=2)
    fine, _, _ = _kepler_run(dt=2 * math.pi / 1000, orbits=2)
    ratio = coarse.max() / fine.max()
    print(f"max energy error at dt and dt/2: {coarse.max():.3e}, {fine.max():.3e}; ratio {ratio:.2f}")
    assert 3.5 < ratio < 4.5


def test_plummer_sphere_stays_in_virial_equilibrium_and_conserves_momentum():
    # seed 5: a typical sample (energy, virial ratio and half-mass radius within 0.3 sigma of their means over
    # seeds); the sampler itself is tested in test_astro_start.py
    model = NBody("plummer", n=1024, softening=0.02, backend="numba", dtype="float64", seed=5)
    state = model.initial_state()
    start = model.diagnostics(state)
    crossing = 2 * math.sqrt(2)
    stepper = model.stepper(0.01)
    ratios = [start["virial_ratio"]]
    for _ in range(10):
        state = stepper.advance(state, round(crossing / 0.01))
        ratios.append(model.diagnostics(state)["virial_ratio"])
    end = model.diagnostics(state)
    print("virial ratio each crossing time:", np.round(ratios, 3))
    assert all(abs(r - 1) < 0.05 for r in ratios)
    for axis in "xyz":
        assert abs(end[f"momentum_{axis}"] - start[f"momentum_{axis}"]) < 1e-10
        assert abs(end[f"angular_momentum_{axis}"] - start[f"angular_momentum_{axis}"]) < 1e-6
    assert abs(end["energy"] - start["energy"]) / abs(start["energy"]) < 1e-3
    # Henon units: E = -1/4 and a half-mass radius of about 0.77 at the start
    assert abs(start["energy"] + 0.25) < 0.02
    assert 0.65 < start["lagrangian_radius_50"] < 0.9


@pytest.mark.parametrize("integrator", INTEGRATORS)
def test_backends_agree_on_a_few_steps(fast_backend, dtype, integrator):
    n = small(fast_backend, 256, 24)
    reference = NBody("plummer", n=n, backend="numpy", dtype=dtype, seed=1, integrator=integrator)
    other = reference.with_backend(fast_backend)
    assert other.integrator == integrator
    state = reference.initial_state()
    expected = reference.step(state, 0.01, 3)
    got = other.step(other.state_from_arrays(state.positions, state.velocities, state.masses), 0.01, 3)
    tolerance = 1e-10 if dtype == np.float64 else 2e-4
    for name in ("positions", "velocities", "accelerations", "potentials"):
        ref = getattr(expected, name).astype(np.float64)
        result = fast_backend.to_host(getattr(got, name)).astype(np.float64)
        assert np.abs(result - ref).max() <= tolerance * np.abs(ref).max(), name
    # the energy at the synchronised positions goes through the backend's own kernel too
    energies = [model.diagnostics(s)["energy"] for model, s in ((reference, expected), (other, got))]
    assert abs(energies[1] - energies[0]) <= tolerance * abs(energies[0])


def test_tree_method_follows_direct_summation():
    direct = NBody("plummer", n=2000, backend="numba", seed=2)
    tree = NBody("plummer", n=2000, backend="numba", seed=2, method="tree", theta=0.5)
    state = direct.initial_state()
    a = direct.step(state, 0.005, 20)
    b = tree.step(tree.state_from_arrays(state.positions, state.velocities, state.masses), 0.005, 20)
    spread = np.abs(a.positions - b.positions).max()
    assert spread < 1e-3
    energies = [model.diagnostics(s)["energy"] for model, s in ((direct, a), (tree, b))]
    assert abs(energies[0] - energies[1]) / abs(energies[0]) < 1e-3


def test_galaxy_collision_case_is_bound_by_a_parabolic_orbit():
    model = NBody("galaxy_collision", n=400, backend="numba", seed=4)
    state = model.initial_state()
    d = model.diagnostics(state)
    # two bound galaxies with zero orbital energy: the total is the galaxies' own binding
    assert d["energy"] < 0
    assert all(abs(d[f"momentum_{a}"]) < 1e-12 for a in "xyz")
    assert abs(d["angular_momentum_z"]) > 0.01  # an off-axis, parabolic encounter
    first, second = state.positions[:, :200].mean(axis=1), state.positions[:, 200:].mean(axis=1)
    assert abs(np.linalg.norm(second - first) - model.case_parameters["separation"]) < 0.2
    closing = (state.velocities[:, 200:].mean(axis=1) - state.velocities[:, :200].mean(axis=1)) @ (second - first)
    assert closing < 0  # on the incoming branch of the orbit


@pytest.mark.parametrize("kwargs, match", [
    (dict(case="plummer", n=1), "n must be >= 2"),
    (dict(case="kepler", n=3), "n must be 2 for the kepler case"),
    (dict(case="plummer", softening=-0.1), "softening must be >= 0"),
    (dict(case="plummer", G=0.0), "G must be > 0"),
    (dict(case="plummer", method="fmm"), "method must be one of"),
    (dict(case="plummer", theta=0.0), "theta must be > 0"),
    (dict(case="nebula"), "case must be one of"),
    (dict(case="kepler", eccentric=0.3), "unknown parameter"),
    (dict(case="kepler", eccentricity=1.0), r"eccentricity must be >= 0 and < 1 .*got 1.0"),
    (dict(case="kepler", semi_major_axis=-1.0), "semi_major_axis must be > 0"),
    (dict(case="plummer", integrator="rk4"), "integrator must be one of 'kdk', 'dkd'; got 'rk4'"),
])
def test_bad_model_input_names_the_parameter(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        NBody(kwargs.pop("case"), backend="numpy", **kwargs)


def test_bad_state_and_run_input():
    model = NBody("plummer", n=16, backend="numpy")
    state = model.initial_state()
    positions = state.positions.copy()
    positions[1, 3] = np.nan
    with pytest.raises(ConfigError, match="positions holds 1 non-finite"):
        model.state_from_arrays(positions, state.velocities, state.masses)
    masses = state.masses.copy()
    masses[0] = -1.0
    with pytest.raises(ConfigError, match="masses must be >= 0"):
        model.state_from_arrays(state.positions, state.velocities, masses)
    with pytest.raises(ConfigError, match=r"velocities must have shape \(3, 16\)"):
        model.state_from_arrays(state.positions, state.velocities.T, state.masses)
    with pytest.raises(ConfigError, match="dt must be > 0"):
        Simulation(model, dt=0.0)
    with pytest.raises(ConfigError, match="dt must be > 0"):
        model.step(state, -1.0)


def test_too_large_a_step_is_caught():
    model = NBody("plummer", n=64, backend="numpy", softening=0.01)
    state = model.initial_state()
    with pytest.raises(ConfigError, match="above the stable limit"):
        Simulation(model, state, dt=model.suggested_dt(state, 1.5))
    sim = Simulation(model, state, dt=model.suggested_dt(state, 0.5), stop_steps=50, check=1, progress=False)

    def close_encounter(simulation):
        if simulation.step == 2:  # two bodies meet where the softened force peaks (eps / sqrt 2)
            state = simulation.state
            state.positions[:, 1] = state.positions[:, 0]
            state.positions[0, 1] += 0.01 / 2**0.5
            state.velocities[:, 1] = state.velocities[:, 0]

    sim.add_callback(close_encounter, 1)
    with pytest.raises(UnstableSimulation, match="CFL number") as info:
        sim.run()
    assert info.value.step == 3 and info.value.field == "cfl"


def test_nan_in_a_run_names_the_field():
    model = NBody("plummer", n=32, backend="numpy")
    sim = Simulation(model, dt=0.001, stop_steps=20, check=1, progress=False)

    def poison(simulation):
        if simulation.step == 4:
            simulation.state.velocities[0, 5] = np.nan

    sim.add_callback(poison, 1)
    with pytest.raises(UnstableSimulation, match="positions") as info:
        sim.run()
    assert info.value.step == 5


# -- integrators and the analytic Kepler orbit -----------------------------------------------------

def test_kepler_orbit_starts_at_the_case_and_is_an_exact_ellipse():
    model = NBody("kepler", backend="numpy")
    state = model.initial_state()
    period = kepler_period(model)
    assert period == pytest.approx(2 * math.pi, rel=1e-15)
    positions, velocities = kepler_orbit(model, 0.0)
    np.testing.assert_allclose(positions, state.positions, rtol=0, atol=1e-15)
    np.testing.assert_allclose(velocities, state.velocities, rtol=0, atol=1e-15)
    # an unequal pair on a very eccentric orbit with G != 1, from the case's parameters
    case = dict(semi_major_axis=2.0, eccentricity=0.95, total_mass=3.0, mass_ratio=0.25)
    G, (a, e, total) = 0.5, (2.0, 0.95, 3.0)
    period = kepler_period(case, G=G)
    assert period == pytest.approx(2 * math.pi * math.sqrt(a**3 / (G * total)), rel=1e-15)
    t = np.linspace(-1.5 * period, 2.5 * period, 4001)
    x, v = kepler_orbit(case, t, G=G)
    assert x.shape == v.shape == (3, 2, t.size)
    m2 = total * 0.25 / 1.25
    np.testing.assert_allclose((total - m2) * x[:, 0] + m2 * x[:, 1], 0.0, atol=1e-14)  # centre of mass at rest
    np.testing.assert_allclose((total - m2) * v[:, 0] + m2 * v[:, 1], 0.0, atol=1e-14)
    r, u = x[:, 1] - x[:, 0], v[:, 1] - v[:, 0]
    distance = np.sqrt((r * r).sum(axis=0))
    np.testing.assert_allclose(0.5 * (u * u).sum(axis=0) - G * total / distance, -G * total / (2 * a), rtol=1e-12)
    np.testing.assert_allclose(r[0] * u[1] - r[1] * u[0], math.sqrt(G * total * a * (1 - e * e)), rtol=1e-12)
    assert distance.min() == pytest.approx(a * (1 - e), rel=1e-6) and distance.max() == pytest.approx(a * (1 + e))
    # periodic, and at pericentre (on -x) half a period after each apocentre
    later = kepler_orbit(case, t + period, G=G)
    np.testing.assert_allclose(later[0], x, atol=1e-12)
    np.testing.assert_allclose(later[1], v, atol=1e-10)
    pericentre = kepler_orbit(case, 0.5 * period, G=G)[0]
    np.testing.assert_allclose(pericentre[:, 1] - pericentre[:, 0], [-a * (1 - e), 0, 0], atol=1e-13)
    # the relative velocity is the time derivative of the relative position
    h = 1e-6
    ahead, behind = kepler_orbit(case, t + h, G=G)[0], kepler_orbit(case, t - h, G=G)[0]
    np.testing.assert_allclose((ahead - behind) / (2 * h), v, rtol=0, atol=1e-6 * np.abs(v).max())


def test_the_kepler_reference_refuses_what_it_cannot_describe():
    with pytest.raises(ConfigError, match="model must be an NBody of the 'kepler' case; got case 'plummer'"):
        kepler_period(NBody("plummer", n=8, backend="numpy"))
    with pytest.raises(ConfigError, match="softening must be 0 for the analytic Kepler orbit"):
        kepler_orbit(NBody("kepler", softening=0.1, backend="numpy"), 1.0)
    with pytest.raises(ConfigError, match="G comes from the model"):
        kepler_period(NBody("kepler", backend="numpy"), G=2.0)
    with pytest.raises(ConfigError, match="eccentricity must be >= 0 and < 1"):
        kepler_orbit({"eccentricity": 1.2}, 0.0)
    with pytest.raises(ConfigError, match="unknown parameter"):
        kepler_period({"period": 1.0})
    with pytest.raises(ConfigError, match="G must be > 0"):
        kepler_period({}, G=0.0)
    with pytest.raises(ConfigError, match="t must be finite"):
        kepler_orbit({}, [0.0, np.nan])


@pytest.mark.parametrize("integrator", INTEGRATORS)
def test_kepler_orbits_converge_to_the_analytic_orbit_as_dt_squared(integrator):
    model = NBody("kepler", backend="numpy", integrator=integrator)
    start = model.initial_state()
    period = kepler_period(model)
    back, along = [], []
    for per_orbit in (250, 500, 1000):
        dt = period / per_orbit
        once = model.step(start, dt, per_orbit)
        back.append(np.abs(once.positions - kepler_orbit(model, period)[0]).max())  # the start again
        steps = per_orbit * 21 // 10  # 2.1 orbits: not at an apsis
        later = model.step(once, dt, steps - per_orbit)
        x, v = kepler_orbit(model, steps * dt)
        along.append(max(np.abs(later.positions - x).max(), np.abs(later.velocities - v).max()))
        # the leapfrog's phase error grows linearly with time: the bound is per orbit
        assert back[-1] < 4 * dt**2 and along[-1] < 4 * 2.1 * dt**2, (per_orbit, back[-1], along[-1])
    print(f"{integrator}: error after one period {back}, after 2.1 periods {along}")
    for errors in (back, along):
        for coarse, fine in zip(errors, errors[1:]):
            assert 3.8 < coarse / fine < 4.2  # second order: half the step, a quarter of the error


def test_dkd_and_kdk_agree_to_second_order():
    period = kepler_period({})
    models = [NBody("kepler", backend="numpy", integrator=name) for name in ("kdk", "dkd")]
    gaps = []
    for per_orbit in (250, 500, 1000):
        ends = [m.step(m.initial_state(), period / per_orbit, per_orbit) for m in models]
        gaps.append(max(np.abs(ends[0].positions - ends[1].positions).max(),
                        np.abs(ends[0].velocities - ends[1].velocities).max()))
    print("kdk - dkd after one period:", gaps)
    assert gaps[0] > 1e-6  # two different integrators, not one twice
    assert 3.8 < gaps[0] / gaps[1] < 4.2 and 3.8 < gaps[1] / gaps[2] < 4.2


def _energy_errors(integrator, per_orbit, orbits):
    """Relative energy error after every step, one row per orbit."""
    model = NBody("kepler", backend="numpy", integrator=integrator)
    state = model.initial_state()
    stepper = model.stepper(kepler_period(model) / per_orbit)
    e0 = model.diagnostics(state)["energy"]
    errors = []
    for _ in range(per_orbit * orbits):
        state = stepper.advance(state, 1)
        errors.append((model.diagnostics(state)["energy"] - e0) / abs(e0))
    return np.array(errors).reshape(orbits, per_orbit)


@pytest.mark.parametrize("integrator", INTEGRATORS)
def test_energy_error_oscillates_with_the_orbit_without_secular_drift(integrator):
    errors = _energy_errors(integrator, per_orbit=100, orbits=30)
    amplitude = np.abs(errors).max(axis=1)  # per orbit
    closest = np.abs(errors).min(axis=1)
    print(f"{integrator}: largest |dE/E| per orbit, first {amplitude[0]:.4e} last {amplitude[-1]:.4e}; "
          f"smallest in the last orbit {closest[-1]:.2e}; mean per orbit {errors.mean(axis=1)[[0, -1]]}")
    assert amplitude.max() < 0.02
    # bounded: the same swing in every orbit (a symplectic integrator keeps a nearby energy exactly);
    # the steps sample the sharp peak at pericentre a little differently each orbit
    assert amplitude.max() < 1.03 * amplitude.min()
    # no secular drift: the orbit-averaged error stays put (measured: to 3e-8 of itself over 30 orbits)
    np.testing.assert_allclose(errors.mean(axis=1), errors[0].mean(), rtol=1e-6)
    # and it comes back: to the start's energy once an orbit (at apocentre)
    assert closest.max() < 1e-4 * amplitude.min()
    finer = _energy_errors(integrator, per_orbit=200, orbits=1)
    assert 3.8 < amplitude[0] / np.abs(finer).max() < 4.2


def test_a_dkd_step_is_a_half_drift_a_kick_and_a_half_drift():
    model = NBody("plummer", n=32, backend="numpy", integrator="dkd", seed=7)
    state = model.initial_state()
    dt = 0.01
    x, v, m = state.positions, state.velocities, state.masses
    half = x + v * (0.5 * dt)
    a = nbody.accelerations(half, m, softening=model.softening, backend="numpy")
    expected_v = v + a * dt
    expected_x = half + expected_v * (0.5 * dt)  # in sync with the velocities: not left at mid-step
    after = model.step(state, dt)
    np.testing.assert_allclose(after.velocities, expected_v, rtol=1e-14, atol=1e-14)
    np.testing.assert_allclose(after.positions, expected_x, rtol=1e-14, atol=1e-14)
    np.testing.assert_allclose(after.accelerations, a, rtol=1e-14, atol=1e-14)  # the forces at mid-step
    # DKD uses no forces carried in from before the step; KDK does
    stale = type(state)(x, v, m, np.zeros_like(x), np.zeros_like(m))
    np.testing.assert_array_equal(model.step(stale, dt).positions, after.positions)
    kdk = NBody("plummer", n=32, backend="numpy", seed=7)
    assert not np.array_equal(kdk.step(stale, dt).positions, kdk.step(state, dt).positions)
    # many steps are one step at a time: the half drifts are never merged across steps
    several = model.step(state, dt, 5)
    one_by_one = state
    for _ in range(5):
        one_by_one = model.step(one_by_one, dt)
    np.testing.assert_array_equal(several.positions, one_by_one.positions)


@pytest.mark.parametrize("method", ["direct", "tree"])
def test_dkd_energy_is_evaluated_at_the_synchronised_positions(method):
    model = NBody("plummer", n=200, backend="numpy", integrator="dkd", method=method, seed=6)
    later = model.step(model.initial_state(), 0.02, 5)
    got = model.diagnostics(later)
    fresh = model.diagnostics(model.state_from_arrays(later.positions, later.velocities, later.masses))
    assert got["energy"] == fresh["energy"] and got["virial_ratio"] == fresh["virial_ratio"]
    carried = got["kinetic_energy"] + 0.5 * float((later.masses * later.potentials).sum())
    assert abs(carried - got["energy"]) > 1e-5  # the carried (mid-step) potentials would be wrong
    # a partition's sums need every block's positions, and add up to the whole
    everything = [model.block_positions(later)]
    parts = [model.block_sums(model.take_block(later, a, b), a, everything) for a, b in ((0, 70), (70, 200))]
    assert model.combine_sums(parts)["energy"] == pytest.approx(got["energy"], rel=1e-13)
    with pytest.raises(ValueError, match="needs extra"):
        model.block_sums(later, 0)
    kdk = NBody("plummer", n=200, backend="numpy", method=method, seed=6)
    assert not kdk.sums_need_positions and model.sums_need_positions
    # KDK sums the potentials the state carries (at its positions), whatever extra says (block sums are
    # exact parts: their fsum is the correctly rounded total)
    assert math.fsum(kdk.block_sums(later, 0, everything)["potential2"]) == \
        math.fsum(kdk.block_sums(later, 0)["potential2"]) == math.fsum(later.masses * later.potentials)


def test_dkd_with_the_tree_follows_direct_summation():
    direct = NBody("plummer", n=400, backend="numba", seed=2, integrator="dkd")
    tree = NBody("plummer", n=400, backend="numba", seed=2, method="tree", theta=0.5, integrator="dkd")
    state = direct.initial_state()
    a = direct.step(state, 0.005, 10)
    b = tree.step(tree.state_from_arrays(state.positions, state.velocities, state.masses), 0.005, 10)
    assert np.abs(a.positions - b.positions).max() < 1e-4
    energies = [model.diagnostics(s)["energy"] for model, s in ((direct, a), (tree, b))]
    assert abs(energies[0] - energies[1]) / abs(energies[0]) < 1e-3


def test_the_integrator_travels_with_the_model():
    model = NBody("plummer", n=16, backend="numpy", integrator="dkd")
    for copy in (model.with_backend("numba"), pickle.loads(pickle.dumps(model))):
        assert copy.integrator == "dkd" and copy.sums_need_positions
    assert "integrator='dkd'" in repr(model)
    assert model.attributes()["integrator"] == "dkd"
    assert model.attributes()["integrator_scheme"] == "drift-kick-drift leapfrog"
    assert "drift-kick-drift leapfrog (dkd)" in model._repr_html_()
    assert model.to_dataset(model.initial_state()).attrs["integrator"] == "dkd"
    assert NBody("plummer", n=16, backend="numpy").attributes()["integrator"] == "kdk"
    # a model pickled before the option existed (a checkpoint of an older run) is a KDK model
    old = NBody("plummer", n=16, backend="numpy")
    del old.__dict__["integrator"]
    assert pickle.loads(pickle.dumps(old)).integrator == "kdk"
