"""``hpcgpu bench md``: the classic Lennard-Jones liquid benchmark per backend.

Case ``lj_liquid``: the setup of the classic LJ benchmark of MD codes: atoms
on an fcc lattice at density 0.8442 (``N = 4 n^3``, ``n = 20``: 32,000 atoms),
velocities at T = 1.44, cutoff 2.5 (energy shifted to zero there), a Verlet
list with skin 0.3 rebuilt when some atom has moved more than half the
skin, velocity-Verlet NVE with dt = 0.005, 100 steps. ``value`` is
atom-steps per second, ``N * steps / t``, with ``t`` the wall time of the
whole run as an MD code reports it: the neighbour-list builds, the force
evaluations, the integration and the rebuild checks
(:meth:`hpcgpu.workloads.md.LennardJones.step`).

Each timed call runs the same ``steps`` steps from the same initial state
(so every repeat does the same work, rebuilds included); the device is
synchronised at the end, inside the timed region. Before it, the model's
kernels are compiled on 108 atoms (:meth:`~hpcgpu.workloads.md.LennardJones.warm_up`,
reported as ``warmup_s``), the initial state is built (``setup_s``: its
neighbour list and forces) and the harness runs one untimed call (caches,
memory pool). After the timed calls, one more run with the builds and force
calls timed one by one (synchronised around each) gives the split:
``build_s``, ``forces_s`` and ``other_s`` (drift and kicks, the rebuild
checks) for one call, and ``seconds_per_build``.

Case ``lj_liquid_slabs`` (with ``--workers N``, N >= 2): the same run on a
local dask cluster of N workers (one core or one GPU each), the box cut into
N bricks (:mod:`hpcgpu.partition.bricks`): atoms stay on their
workers, ghosts and migrants move between neighbours. The partitions are
set up once and warmed up by one untimed call; each timed call advances
``steps`` more steps of that run and waits for them; ``value`` is
atom-steps per second as above, with ``ratio_to_one_process``, the rate
over the ``lj_liquid`` line of the same backend and dtype in this run.

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

__all__ = ["run", "n_cells_for", "SETUP", "NUMPY_STEPS"]

SETUP = {"density": 0.8442, "temperature": 1.44, "cutoff": 2.5, "skin": 0.3, "dt": 0.005}
"""The benchmark's state point and run parameters (reduced LJ units)."""

NUMPY_STEPS = 10
"""Steps the numpy reference runs (at most), once."""

MIN_CELLS = 3
"""Fewest fcc cells per side (108 atoms): the box must be at least twice the cutoff."""


def n_cells_for(atoms):
    """fcc unit cells per side for about ``atoms`` atoms: ``round((atoms / 4) ** (1/3))``.

    Examples
    --------
    >>> n_cells_for(32000), n_cells_for(256), n_cells_for(1_000_000)
    (20, 4, 63)
    """
    return int(round((atoms / 4.0) ** (1.0 / 3.0)))


def _model_classes():
    from hpcgpu import registry

    LennardJones = registry.get("md").model_class()

    class TimedLennardJones(LennardJones):
        """The model with its neighbour-list builds and force calls timed (synchronised)."""

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.build_s = 0.0
            self.builds = 0
            self.forces_s = 0.0
            self.force_calls = 0

        def _timed(self, function, *args):
            self.backend.synchronize()
            start = time.perf_counter()
            result = function(*args)
            self.backend.synchronize()
            return result, time.perf_counter() - start

        def neighbor_list(self, positions, previous=None):
            result, seconds = self._timed(super().neighbor_list, positions, previous)
            self.build_s += seconds
            self.builds += 1
            return result

        def forces(self, positions, neighbors):
            result, seconds = self._timed(super().forces, positions, neighbors)
            self.forces_s += seconds
            self.force_calls += 1
            return result

    return LennardJones, TimedLennardJones


def _lj_liquid(recorder, backend, dtype, requested, steps, budget_s):
    plain, timed = _model_classes()
    n_cells = n_cells_for(requested)
    options = dict(density=SETUP["density"], temperature=SETUP["temperature"], cutoff=SETUP["cutoff"],
                   skin=SETUP["skin"], shift=True, thermostat="none", dtype=dtype, backend=backend)
    reference = backend.name == "numpy"
    if reference:
        steps = min(steps, NUMPY_STEPS)
    model = plain(n_cells, **options)
    n = model.n
    dt = SETUP["dt"]

    start = time.perf_counter()
    model.warm_up()
    warmup_s = time.perf_counter() - start
    start = time.perf_counter()
    initial = model.initial_state()
    backend.synchronize()
    setup_s = time.perf_counter() - start

    # The split: one more run with the builds and force calls timed one by
    # one. numpy runs only this one (a few steps; instrumenting costs
    # microseconds per step, its steps take a tenth of a second).
    profiled = timed(n_cells, **options)

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
    split = {}
    if profiled.builds == final.rebuilds - initial.rebuilds and profiled.force_calls == steps:
        split = dict(build_s=profiled.build_s, forces_s=profiled.forces_s,
                     other_s=profile_s - profiled.build_s - profiled.forces_s,
                     build_share=profiled.build_s / profile_s,
                     seconds_per_build=profiled.build_s / profiled.builds if profiled.builds else None)
    extra = {}
    if reference:
        extra["note"] = (f"numpy (O(N^2) list builds) runs {steps} steps once, without warm-up; "
                         "its rate includes the builds in those steps")
    threads = None
    if backend.name == "numba":
        import numba

        threads = numba.get_num_threads()
    recorder.add(case="lj_liquid", backend=backend.name, dtype=np.dtype(dtype).name, size=n,
                 metric="atom_steps_per_s", value=n * steps / median, unit="1/s", durations=durations,
                 steps_per_call=steps, seconds_per_step=median / steps, requested_size=requested,
                 n_cells=n_cells, density=model.density, temperature=SETUP["temperature"],
                 cutoff=SETUP["cutoff"], skin=SETUP["skin"], dt=dt, ensemble="nve", shift=True,
                 neighbor_rebuilds=final.rebuilds - initial.rebuilds,
                 neighbors_per_atom=float(np.mean(counts)), neighbor_capacity=initial.neighbors.capacity,
                 **split, warmup_s=warmup_s, setup_s=setup_s,
                 energy_change=abs(after["energy"] - before["energy"]) / abs(before["energy"]),
                 final_temperature=after["temperature"], threads=threads, **extra)


def _lj_liquid_slabs(recorder, backend, dtype, requested, steps, budget_s, workers):
    from hpcgpu import registry

    LennardJones = registry.get("md").model_class()
    model = LennardJones(n_cells_for(requested), density=SETUP["density"], temperature=SETUP["temperature"],
                         cutoff=SETUP["cutoff"], skin=SETUP["skin"], shift=True, thermostat="none", dtype=dtype,
                         backend=backend.name)
    durations = measure_partitioned(backend, workers, model, model.initial_state(), SETUP["dt"], steps,
                                    name="bench-md-slabs", budget_s=budget_s)
    median = float(np.median(durations))
    rate = model.n * steps / median
    one_process = one_process_rate(recorder, "lj_liquid", backend, dtype, model.n)
    recorder.add(case="lj_liquid_slabs", backend=backend.name, dtype=np.dtype(dtype).name, size=model.n,
                 metric="atom_steps_per_s", value=rate, unit="1/s", durations=durations, steps_per_call=steps,
                 seconds_per_step=median / steps, workers=workers, partitions=workers,
                 ratio_to_one_process=None if one_process is None else rate / one_process,
                 note="the partitions are set up once; each call advances them and waits for the last step")


def run(recorder, backends, *, sizes=(32000,), dtypes=("float32",), steps=100, budget_s=20.0, workers=None):
    """Run the md suite; results go to ``recorder`` (numpy first for ratios).

    ``sizes`` are numbers of atoms (rounded to ``4 n^3``, see
    :func:`n_cells_for`); ``steps`` time steps per timed call; ``workers``
    (2 or more) adds the ``lj_liquid_slabs`` case on that many local workers
    for every backend but ``numpy``.

    Raises
    ------
    ConfigError
        A size below 108 atoms (the box must hold twice the cutoff) or
        ``steps < 1``.
    """
    if steps < 1:
        raise ConfigError(f"steps must be >= 1 for the md benchmark; got {steps}")
    if workers is not None and workers < 2:
        raise ConfigError(f"workers must be >= 2 for the md benchmark's slab case; got {workers}")
    for size in sizes:
        if n_cells_for(size) < MIN_CELLS:
            raise ConfigError(f"size={size} atoms gives {n_cells_for(size)} fcc cells per side; the md "
                              f"benchmark needs at least {4 * MIN_CELLS**3} atoms ({MIN_CELLS} cells: a box "
                              f"of twice the cutoff {SETUP['cutoff']})")
    order = sorted(backends, key=lambda b: b.name != "numpy")
    for size in sizes:
        for dtype in dtypes:
            for backend in order:
                # One failing backend must not hide the others' numbers.
                try:
                    _lj_liquid(recorder, backend, dtype, size, steps, budget_s)
                except Exception as error:  # noqa: BLE001 - reported, then re-raised by the CLI's status
                    recorder.error(case="lj_liquid", backend=backend.name, dtype=np.dtype(dtype).name,
                                   size=4 * n_cells_for(size) ** 3, error=error)
                if workers and backend.name != "numpy":
                    try:
                        _lj_liquid_slabs(recorder, backend, dtype, size, steps, budget_s, workers)
                    except Exception as error:  # noqa: BLE001 - as above
                        recorder.error(case="lj_liquid_slabs", backend=backend.name, dtype=np.dtype(dtype).name,
                                       size=4 * n_cells_for(size) ** 3, error=error)
    return recorder.results
