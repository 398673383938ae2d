"""``hpcgpu bench stencil``: diffusion and shallow-water kernels per backend.

Cases
-----
``diffusion``
    ``steps`` explicit five-point diffusion steps (periodic) per call.
    Effective traffic: one read and one write of the field per point per step.
``diffusion_dirichlet``
    The same with fixed-value (Dirichlet, zero) edges on all four sides: the
    textbook heat-equation setup. It shows what the edge handling costs next
    to the periodic line.
``shallow_water``
    One SSP-RK3 step of the shallow-water equations: three fused stages
    (Arakawa-Lamb tendencies plus the Runge-Kutta update in one pass each).
    ``gb_per_s`` counts one read and one write of u, v and h per point per
    step (the issue's "effective" figure); ``traffic_gb_per_s`` counts the
    bytes the three stages must move at least (6 + 9 + 9 field passes).
``shallow_water_fused_step`` (backends that have it: Numba)
    The same step as one sweep that pipelines the three stages through
    cache-resident rows (what the weather model runs): it reads and writes
    the state once per step (6 field passes), so it is bound by arithmetic,
    not memory; ``speedup_vs_stages`` compares it with the line above.

The kernels are timed themselves, without the public functions' checks:
:func:`hpcgpu.kernels.stencil.raw_kernels` (the fused step where
:data:`hpcgpu.kernels.stencil.FAST_PATHS` lists the backend).

Each line also carries the copy bandwidth measured in the same run on a
working set of the same size, and the kernel's fraction of it. The
``diffusion`` line of the ``numba`` backend carries ``ratio_to_plain``: its
rate over that of a plain ``prange`` periodic 5-point update
(:mod:`hpcgpu.bench.plain`) running the same steps, the two timed in turns.
"""

import numpy as np

from hpcgpu.bench.harness import copy_bandwidth, measure
from hpcgpu.errors import ConfigError

__all__ = ["run"]

DIFFUSION_CASES = {"diffusion": "periodic", "diffusion_dirichlet": "dirichlet"}
"""The diffusion cases and the boundary kind each puts on all four edges."""


def _diffusion(recorder, backend, dtype, n, steps, budget_s, copy_bw, case="diffusion"):
    from hpcgpu.kernels.stencil import CODES, raw_kernels

    kernels = raw_kernels(backend)
    rng = np.random.default_rng(1)
    field = backend.asarray(rng.random((n, n)), dtype=dtype)
    work = backend.empty((n, n), dtype)
    cx = cy = 0.2
    boundary = DIFFUSION_CASES[case]
    codes = (CODES[boundary],) * 3

    def call():
        kernels.diffuse(field, work, cx, cy, steps, *codes, 0.0)

    durations = measure(call, synchronize=backend.synchronize, budget_s=budget_s, min_repeats=2)
    median = float(np.median(durations))
    updates = n * n * steps / median
    gbs = 2 * np.dtype(dtype).itemsize * n * n * steps / median / 1e9
    extra = {}
    if backend.name == "numba" and boundary == "periodic":
        extra = _plain_ratio(call, field, cx, cy, steps)
    recorder.add(case=case, backend=backend.name, dtype=np.dtype(dtype).name, size=n,
                 metric="point_updates_per_s", value=updates, unit="1/s", durations=durations,
                 boundary=boundary, steps_per_call=steps, seconds_per_step=median / steps, gb_per_s=gbs,
                 copy_gb_per_s=copy_bw / 1e9, fraction_of_copy=gbs * 1e9 / copy_bw, **extra)


def _plain_ratio(call, field, cx, cy, steps):
    """The plain ``prange`` periodic 5-point update's rate for the same ``steps`` steps, timed in
    turns with ``call``."""
    from hpcgpu.bench import plain

    a, b = field.copy(), np.empty_like(field)
    cx, cy = field.dtype.type(cx), field.dtype.type(cy)

    def plain_steps():
        for step in range(steps):
            source, target = (a, b) if step % 2 == 0 else (b, a)
            plain.diffusion_step(source, target, cx, cy)

    ours, theirs = plain.paired_seconds(call, plain_steps, rounds=3)
    return {"plain_point_updates_per_s": field.size * steps / theirs, "ratio_to_plain": theirs / ours,
            "plain_kernel": "njit(parallel, fastmath) prange over rows, periodic 5-point update"}


def _shallow_water(recorder, backend, dtype, n, budget_s, copy_bw):
    from hpcgpu.kernels.stencil import FAST_PATHS, SSP_RK3_STAGES, raw_kernels

    kernels = raw_kernels(backend)
    rng = np.random.default_rng(2)
    dev = lambda a: backend.asarray(a, dtype=dtype)  # noqa: E731
    y0 = (dev(rng.standard_normal((n, n))), dev(rng.standard_normal((n, n))),
          dev(1000.0 + rng.random((n, n))))
    bufs = [tuple(backend.empty((n, n), dtype) for _ in range(3)) for _ in range(2)]
    f = backend.asarray(np.full(n + 1, 1e-4), dtype=dtype)
    dt, spacing = 10.0, 1.0 / 1.0e4

    def call():
        first, second = bufs
        for (a, b, c), src, dst in zip(SSP_RK3_STAGES, (y0, first, second), (first, second, first)):
            kernels.shallow_water_stage(*y0, *src, *dst, f, 9.81, spacing, spacing, 10.0,
                                        a, b, c * dt, 0, 0, 0)

    durations = measure(call, synchronize=backend.synchronize, budget_s=budget_s, min_repeats=2)
    median = float(np.median(durations))
    item = np.dtype(dtype).itemsize
    gbs = 6 * item * n * n / median / 1e9
    traffic = (6 + 9 + 9) * item * n * n / median / 1e9
    recorder.add(case="shallow_water", backend=backend.name, dtype=np.dtype(dtype).name, size=n,
                 metric="point_updates_per_s", value=n * n / median, unit="1/s", durations=durations,
                 seconds_per_step=median, gb_per_s=gbs, traffic_gb_per_s=traffic,
                 copy_gb_per_s=copy_bw / 1e9, fraction_of_copy=traffic * 1e9 / copy_bw,
                 scheme="Arakawa-Lamb C-grid, SSP-RK3 (3 fused stages)")
    if backend.name not in FAST_PATHS["shallow_water_rk3_step"]:
        return
    fused = kernels.shallow_water_rk3_step
    out = bufs[0]

    def call_fused():
        fused(*y0, *out, f, 9.81, spacing, spacing, 10.0, dt, SSP_RK3_STAGES, 0, 0, 0)

    fused_durations = measure(call_fused, synchronize=backend.synchronize, budget_s=budget_s, min_repeats=2)
    fused_median = float(np.median(fused_durations))
    recorder.add(case="shallow_water_fused_step", backend=backend.name, dtype=np.dtype(dtype).name, size=n,
                 metric="point_updates_per_s", value=n * n / fused_median, unit="1/s", durations=fused_durations,
                 seconds_per_step=fused_median, gb_per_s=6 * item * n * n / fused_median / 1e9,
                 copy_gb_per_s=copy_bw / 1e9, fraction_of_copy=6 * item * n * n / fused_median / copy_bw,
                 speedup_vs_stages=median / fused_median,
                 scheme="Arakawa-Lamb C-grid, SSP-RK3 (the three stages in one sweep: what the model runs)")


def run(recorder, backends, *, sizes=(4096,), dtypes=("float32",), steps=100, budget_s=20.0,
        cases=("diffusion", "diffusion_dirichlet", "shallow_water")):
    """Run the stencil suite; results go to ``recorder`` (numpy first for ratios)."""
    known = (*DIFFUSION_CASES, "shallow_water")
    unknown = [case for case in cases if case not in known]
    if unknown:
        raise ConfigError(f"cases must be among {', '.join(known)}; got {', '.join(map(repr, unknown))}")
    order = sorted(backends, key=lambda b: b.name != "numpy")
    for n in sizes:
        for dtype in dtypes:
            item = np.dtype(dtype).itemsize
            for backend in order:
                for case in cases:
                    # One failing backend must not hide the others' numbers.
                    try:
                        if case in DIFFUSION_CASES:
                            copy_bw = copy_bandwidth(backend, 2 * item * n * n)
                            _diffusion(recorder, backend, dtype, n, steps, budget_s, copy_bw, case)
                        else:
                            copy_bw = copy_bandwidth(backend, 12 * item * n * n)
                            _shallow_water(recorder, backend, dtype, n, budget_s, copy_bw)
                    except Exception as error:  # noqa: BLE001 - reported, then re-raised by the CLI's status
                        recorder.error(case=case, backend=backend.name, dtype=np.dtype(dtype).name,
                                       size=n, error=error)
    return recorder.results
