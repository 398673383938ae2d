"""``hpcgpu bench nbody``: direct-summation gravity per backend.

Case ``direct``: the softened accelerations on all ``N`` bodies from all
``N`` bodies (:func:`hpcgpu.kernels.nbody.prepare_direct_accelerations`:
the direct sum itself, inputs checked once, no potential), bodies in
a Gaussian blob. ``interactions_per_s`` counts ``N**2`` pair interactions
per evaluation; ``gflops`` counts 20 floating-point operations per
interaction, the convention of the GPU N-body literature (Nyland, Harris
and Prins, GPU Gems 3, ch. 31), which counts a reciprocal square root as
one operation.

``steps`` evaluations run back to back inside one timed call (the device is
synchronised once, at the end), as they would in a simulation. The ``numpy``
reference would need seconds per evaluation at these sizes, so it computes
the accelerations on the first :data:`NUMPY_TARGETS` bodies only (from all
``N``), once per timed call, and its rate is that of those interactions;
the JSON line says so (``targets_timed``, ``note``).

On the ``numba`` backend the line also carries ``ratio_to_plain``: the
rate over that of the ten-line ``@njit(parallel=True, fastmath=True)``
kernel of :mod:`hpcgpu.bench.plain` on the same bodies, the two timed in
turns (``plain_interactions_per_s``), ``inverse_sqrt``, the float64
variant :mod:`hpcgpu.autotune` chose on this machine, and ``sweep``, the
float32 one (the compiler's vectorised sweep or an explicit AVX2 / AVX-512
one).

Case ``direct_blocks`` (with ``--workers N``, N >= 2): whole leapfrog steps
of the N-body workload's ``"step"`` benchmark case
(:class:`hpcgpu.registry.BenchmarkCase`: a Plummer sphere) of ``N`` bodies
on a local dask cluster of N workers
(one core or one GPU each), the bodies in N blocks
(:mod:`hpcgpu.partition.all_pairs`: each step every block takes all
positions). The partitions are set up and warmed up once; each timed call
advances the run ``steps`` more steps and waits for them; ``value`` is ``N**2`` interactions per step over the time,
with ``ratio_to_one_process`` over the ``direct`` line of the same backend,
dtype and size (force evaluations alone, so the ratio also charges the
steps' O(N) work).
"""

import numpy as np

from hpcgpu.bench.harness import measure, measure_partitioned, one_process_rate

__all__ = ["run", "NUMPY_TARGETS", "FLOPS_PER_INTERACTION", "WORKLOAD"]

WORKLOAD = "nbody"
"""The workload whose ``"step"`` case the ``direct_blocks`` lines time (hpcgpu plan's name of astro)."""

NUMPY_TARGETS = 512
"""Targets the numpy reference is timed on (against all N sources)."""

FLOPS_PER_INTERACTION = 20

SOFTENING = 0.01
"""Plummer softening of the benchmark (the blob has unit dispersion)."""


def _direct(recorder, backend, dtype, n, evaluations, budget_s):
    from hpcgpu.kernels.nbody import prepare_direct_accelerations

    rng = np.random.default_rng(4)
    positions = backend.asarray(rng.standard_normal((3, n)), dtype=dtype)
    masses = backend.asarray(np.full(n, 1.0 / n), dtype=dtype)
    targets = min(n, NUMPY_TARGETS) if backend.name == "numpy" else n
    if backend.name == "numpy":
        evaluations = 1
    evaluate = prepare_direct_accelerations(positions, masses, softening=SOFTENING, G=1.0, targets=(0, targets),
                                            backend=backend)

    def call():
        for _ in range(evaluations):
            evaluate()

    durations = measure(call, synchronize=backend.synchronize, budget_s=budget_s, min_repeats=2)
    median = float(np.median(durations))
    rate = targets * n * evaluations / median
    extra = {}
    if backend.name == "numba":
        extra.update(_plain_ratio(evaluate, positions, masses, dtype))
    if targets < n:
        extra["note"] = (f"numpy computes {targets} of the {n} targets (against all {n} sources); "
                         "rate and seconds_per_evaluation are for N**2 interactions at that rate")
    recorder.add(case="direct", backend=backend.name, dtype=np.dtype(dtype).name, size=n,
                 metric="interactions_per_s", value=rate, unit="1/s", durations=durations,
                 gflops=FLOPS_PER_INTERACTION * rate / 1e9, flops_per_interaction=FLOPS_PER_INTERACTION,
                 seconds_per_evaluation=n * n / rate, evaluations_per_call=evaluations,
                 targets_timed=targets, softening=SOFTENING, potential=False, **extra)


def _plain_ratio(evaluate, positions, masses, dtype):
    """The plain ``prange`` kernel's rate on the same bodies, timed in turns with ``evaluate``."""
    from hpcgpu.bench import plain
    from hpcgpu.kernels.nbody import inverse_sqrt_variant, sweep_variant

    t = np.dtype(dtype).type
    n = positions.shape[1]
    x, y, z = (np.ascontiguousarray(positions[k]) for k in range(3))
    out = [np.empty(n, dtype) for _ in range(3)]
    ours, theirs = plain.paired_seconds(
        evaluate, lambda: plain.nbody_accelerations(x, y, z, masses, t(SOFTENING**2), t(1), *out))
    extra = {"plain_interactions_per_s": n * n / theirs, "ratio_to_plain": theirs / ours,
             "plain_kernel": "njit(parallel, fastmath) prange over targets, 1/sqrt(r2)"}
    extra["inverse_sqrt"] = inverse_sqrt_variant(dtype)
    extra["sweep"] = sweep_variant(dtype)
    return extra


def _direct_blocks(recorder, backend, dtype, n, steps, budget_s, workers):
    from hpcgpu import registry

    _, case = registry.benchmark_case("step", WORKLOAD)
    model = case.model(n, dtype=dtype, backend=backend.name)
    initial = model.initial_state()
    durations = measure_partitioned(backend, workers, model, initial, case.dt(model, initial), steps,
                                    name="bench-nbody-blocks", budget_s=budget_s)
    median = float(np.median(durations))
    rate = n * n * steps / median
    one_process = one_process_rate(recorder, "direct", backend, dtype, n)
    recorder.add(case="direct_blocks", backend=backend.name, dtype=np.dtype(dtype).name, size=n,
                 metric="interactions_per_s", value=rate, unit="1/s", durations=durations,
                 gflops=FLOPS_PER_INTERACTION * rate / 1e9, steps_per_call=steps, seconds_per_step=median / steps,
                 workers=workers, partitions=workers, model_case=case.name,
                 ratio_to_one_process=None if one_process is None else rate / one_process,
                 note="the partitions are set up once; each call advances them and waits for the last step")


def run(recorder, backends, *, sizes=(4096, 16384), dtypes=("float32",), steps=10, budget_s=20.0, workers=None):
    """Run the nbody suite; results go to ``recorder`` (numpy first for ratios).

    ``sizes`` are numbers of bodies; ``steps`` evaluations per timed call;
    ``workers`` (2 or more) adds the ``direct_blocks`` case on that many
    local workers for every backend but ``numpy``.
    """
    if workers is not None and workers < 2:
        from hpcgpu.errors import ConfigError

        raise ConfigError(f"workers must be >= 2 for the nbody benchmark's block case; got {workers}")
    order = sorted(backends, key=lambda b: b.name != "numpy")
    for n in sizes:
        for dtype in dtypes:
            for backend in order:
                # One failing backend must not hide the others' numbers.
                try:
                    _direct(recorder, backend, dtype, n, steps, budget_s)
                except Exception as error:  # noqa: BLE001 - reported, then re-raised by the CLI's status
                    recorder.error(case="direct", backend=backend.name, dtype=np.dtype(dtype).name,
                                   size=n, error=error)
                if workers and backend.name != "numpy":
                    try:
                        _direct_blocks(recorder, backend, dtype, n, steps, budget_s, workers)
                    except Exception as error:  # noqa: BLE001 - as above
                        recorder.error(case="direct_blocks", backend=backend.name, dtype=np.dtype(dtype).name,
                                       size=n, error=error)
    return recorder.results
