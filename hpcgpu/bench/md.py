"""``hpcgpu bench md``: the molecular-dynamics workload's benchmark case per backend.

The model is the ``"step"`` benchmark case the md workload declares
(:class:`hpcgpu.registry.BenchmarkCase`; the suite names no model class,
case or parameter): the classic Lennard-Jones liquid benchmark of MD codes,
atoms on an fcc lattice at density 0.8442 (``N = 4 n^3``, ``n = 20``:
32,000 atoms), velocities at T = 1.44, cutoff 2.5 (energy shifted to zero
there), a Verlet list with skin 0.3 rebuilt when some atom has moved more
than half the skin, velocity-Verlet NVE with dt = 0.005, 100 steps. Its
lines carry the case's name and the facts it declares of
the model (state point, cutoff, skin, ensemble). ``value`` is atom-steps
per second, ``N * steps / t``, with ``t`` the wall time of the whole run as
an MD code reports it: the neighbour-list builds, the force evaluations,
the integration and the rebuild checks (the model's ``step``).

Each timed call runs the same ``steps`` steps from the same initial state
(so every repeat does the same work, rebuilds included); the device is
synchronised at the end, inside the timed region. Before it, the model's
kernels are compiled on a tiny system (its ``warm_up``,
reported as ``warmup_s``), the initial state is built (``setup_s``: its
neighbour list and forces) and the harness runs one untimed call (caches,
memory pool). After the timed calls, one more run with the builds and force
calls timed one by one (synchronised around each) gives the split:
``build_s``, ``forces_s`` and ``other_s`` (drift and kicks, the rebuild
checks) for one call, and ``seconds_per_build``.

Case ``<name>_bricks`` (with ``--workers N``, N >= 2): the same run on a
local dask cluster of N workers (one core or one GPU each), the box cut into
N bricks (:mod:`hpcgpu.partition.bricks`): atoms stay on their
workers, ghosts and migrants move between neighbours. The partitions are
set up once and warmed up by one untimed call; each timed call advances
``steps`` more steps of that run and waits for them; ``value`` is
atom-steps per second as above, with ``ratio_to_one_process``, the rate
over the one-process line of the same backend and dtype in this run.

The ``numba`` line carries ``ratio_to_plain``: the time per step of a
plain cell-list Lennard-Jones force loop (:mod:`hpcgpu.bench.plain`: cells
rebuilt each call, 27 neighbouring cells, forces only) over the model's
time per step (everything), the two timed in turns over
:data:`PLAIN_STEPS` steps.

The ``numpy`` reference builds its lists by brute force over all pairs
(O(N^2): 13 to 26 s per build at 32,000 atoms here), so it runs
:data:`NUMPY_STEPS` steps, once, with no warm-up (it has nothing to
compile); its JSON line says so (``note``), and its rate, like every other,
includes the builds in its steps.
"""

import time

import numpy as np

from hpcgpu.bench.harness import measure, measure_partitioned, one_process_rate
from hpcgpu.errors import ConfigError

__all__ = ["run", "lj_liquid_case", "WORKLOAD", "NUMPY_STEPS"]

WORKLOAD = "md"
"""The workload this suite benchmarks (its ``"step"`` case)."""

NUMPY_STEPS = 10
"""Steps the numpy reference runs (at most), once."""


def lj_liquid_case():
    """The ``"step"`` benchmark case of the md workload (:class:`hpcgpu.registry.BenchmarkCase`)."""
    from hpcgpu import registry

    return registry.benchmark_case("step", WORKLOAD)[1]


def _time_calls(model, names):
    """Time each call of ``model``'s methods ``names`` (synchronised around it); returns ``{name: [seconds, calls]}``.

    The methods are replaced on this instance only, so the model steps as
    it would: its own ``step`` calls them through ``self``.
    """
    spent = {name: [0.0, 0] for name in names}
    for name in names:
        method = getattr(model, name)

        def timed(*args, _method=method, _name=name, **kwargs):
            model.backend.synchronize()
            start = time.perf_counter()
            result = _method(*args, **kwargs)
            model.backend.synchronize()
            spent[_name][0] += time.perf_counter() - start
            spent[_name][1] += 1
            return result

        setattr(model, name, timed)
    return spent


def _lj_liquid(recorder, case, backend, dtype, requested, steps, budget_s):
    reference = backend.name == "numpy"
    if reference:
        steps = min(steps, NUMPY_STEPS)
    model = case.model(requested, dtype=dtype, backend=backend)
    n = model.n

    start = time.perf_counter()
    model.warm_up()
    warmup_s = time.perf_counter() - start
    start = time.perf_counter()
    initial = model.initial_state()
    backend.synchronize()
    setup_s = time.perf_counter() - start
    dt = case.dt(model, initial)

    # The split: one more run with the builds and force calls timed one by
    # one. numpy runs only this one (a few steps; instrumenting costs
    # microseconds per step, its steps take a tenth of a second).
    profiled = case.model(requested, dtype=dtype, backend=backend)
    spent = _time_calls(profiled, ("neighbor_list", "forces"))

    def profile():
        start = time.perf_counter()
        state = profiled.step(initial, dt, steps)
        backend.synchronize()
        return state, time.perf_counter() - start

    if reference:
        final, profile_s = profile()
        durations = [profile_s]
    else:
        final = None
        stepper = model.stepper(dt)

        def call():
            nonlocal final
            final = stepper.advance(initial, steps)

        durations = measure(call, synchronize=backend.synchronize, budget_s=budget_s, min_repeats=2)
        _, profile_s = profile()
    median = float(np.median(durations))

    before, after = model.diagnostics(initial), model.diagnostics(final)
    counts = backend.to_host(initial.neighbors.counts)
    (build_s, builds), (forces_s, force_calls) = spent["neighbor_list"], spent["forces"]
    split = {}
    if builds == final.rebuilds - initial.rebuilds and force_calls == steps:
        split = dict(build_s=build_s, forces_s=forces_s, other_s=profile_s - build_s - forces_s,
                     build_share=build_s / profile_s, seconds_per_build=build_s / builds if builds else None)
    extra = {}
    if reference:
        extra["note"] = (f"numpy (O(N^2) list builds) runs {steps} steps once, without warm-up; "
                         "its rate includes the builds in those steps")
    threads = None
    if backend.name == "numba":
        import numba

        threads = numba.get_num_threads()
        extra.update(_plain_ratio(model, initial, dt, min(steps, PLAIN_STEPS)))
    recorder.add(case=case.name, backend=backend.name, dtype=np.dtype(dtype).name,
                 size=case.recorded_size(model, requested), metric="atom_steps_per_s", value=n * steps / median,
                 unit="1/s", durations=durations, steps_per_call=steps, seconds_per_step=median / steps,
                 requested_size=requested, **case.described(model), dt=dt,
                 neighbor_rebuilds=final.rebuilds - initial.rebuilds,
                 neighbors_per_atom=float(np.mean(counts)), neighbor_capacity=initial.neighbors.capacity,
                 **split, warmup_s=warmup_s, setup_s=setup_s,
                 energy_change=abs(after["energy"] - before["energy"]) / abs(before["energy"]),
                 final_temperature=after["temperature"], threads=threads, **extra)


PLAIN_STEPS = 10
"""Steps per call when the numba line is timed in turns with the plain cell-list kernel."""


def _plain_ratio(model, initial, dt, steps):
    """``ratio_to_plain``: time per step of the model over a plain cell-list force evaluation
    (binning included) on the same atoms, timed in turns; the model's steps also integrate and
    rebuild, the plain kernel only computes forces, so the ratio is a floor."""
    from hpcgpu.bench import plain

    stepper = model.stepper(dt)
    positions = np.ascontiguousarray(model.backend.to_host(initial.positions))
    forces = np.empty_like(positions)

    def plain_forces():
        for _ in range(steps):
            plain.lj_forces(positions, model.box, model.cutoff, forces)

    ours, theirs = plain.paired_seconds(lambda: stepper.advance(initial, steps), plain_forces, rounds=3)
    return {"plain_seconds_per_step": theirs / steps, "ratio_to_plain": theirs / ours,
            "plain_kernel": "njit(parallel, fastmath) cell list (27 cells, rebuilt each call), LJ forces only"}


def _lj_liquid_bricks(recorder, case, backend, dtype, requested, steps, budget_s, workers):
    model = case.model(requested, dtype=dtype, backend=backend.name)
    initial = model.initial_state()
    durations = measure_partitioned(backend, workers, model, initial, case.dt(model, initial), steps,
                                    name="bench-md-bricks", budget_s=budget_s)
    median = float(np.median(durations))
    rate = model.n * steps / median
    size = case.recorded_size(model, requested)
    one_process = one_process_rate(recorder, case.name, backend, dtype, size)
    recorder.add(case=f"{case.name}_bricks", backend=backend.name, dtype=np.dtype(dtype).name, size=size,
                 metric="atom_steps_per_s", value=rate, unit="1/s", durations=durations, steps_per_call=steps,
                 seconds_per_step=median / steps, workers=workers, partitions=workers,
                 ratio_to_one_process=None if one_process is None else rate / one_process,
                 note="the partitions are set up once; each call advances them and waits for the last step")


def run(recorder, backends, *, sizes=(32000,), dtypes=("float32",), steps=100, budget_s=20.0, workers=None):
    """Run the md suite; results go to ``recorder`` (numpy first for ratios).

    ``sizes`` are numbers of atoms (the case rounds them to ``4 n^3``);
    ``steps`` time steps per timed call; ``workers`` (2 or more) adds the
    slab case on that many local workers for every backend but ``numpy``.

    Raises
    ------
    ConfigError
        A size below the case's smallest (108 atoms: the box must hold twice
        the cutoff) or ``steps < 1``.
    """
    if steps < 1:
        raise ConfigError(f"steps must be >= 1 for the md benchmark; got {steps}")
    if workers is not None and workers < 2:
        raise ConfigError(f"workers must be >= 2 for the md benchmark's slab case; got {workers}")
    case = lj_liquid_case()
    for size in sizes:
        case.check_size(size)
    order = sorted(backends, key=lambda b: b.name != "numpy")
    for size in sizes:
        for dtype in dtypes:
            for backend in order:
                # One failing backend must not hide the others' numbers.
                try:
                    _lj_liquid(recorder, case, backend, dtype, size, steps, budget_s)
                except Exception as error:  # noqa: BLE001 - reported, then re-raised by the CLI's status
                    recorder.error(case=case.name, backend=backend.name, dtype=np.dtype(dtype).name,
                                   size=size, error=error)
                if workers and backend.name != "numpy":
                    try:
                        _lj_liquid_bricks(recorder, case, backend, dtype, size, steps, budget_s, workers)
                    except Exception as error:  # noqa: BLE001 - as above
                        recorder.error(case=f"{case.name}_bricks", backend=backend.name,
                                       dtype=np.dtype(dtype).name, size=size, error=error)
    return recorder.results
