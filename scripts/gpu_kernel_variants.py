"""Check and time every GPU stencil kernel launch variant, on a GPU machine.

For both GPU backends (``cupy``: ``_cupy.LAUNCH`` and ``_cupy.VARIANTS``;
``cuda``: ``_cuda.LAUNCH`` and ``_cuda.VARIANTS``) and both dtypes, every
variant is first checked against the NumPy reference (computed in float64
from the same inputs) on a ``--check-size`` grid, with NaN-poisoned outputs
so that a point left unwritten fails; then the diffusion step and the
shallow-water RK3 step (three fused stages, as ``hpcgpu bench stencil`` runs
them) are timed on a ``--size`` grid with CUDA events: the median over
``--repeats`` timed calls after warm-up. The device-to-device copy bandwidth
is measured the same way on the same working sets, as ``hpcgpu bench`` does.

The ``cuda`` backend also runs its multi-step diffusion passes (``pass T..``:
T steps per pass over memory, ``_cuda_diffusion.VARIANTS``; off by default
until these numbers say which, if any, beats the one-step kernel), checked
after 8 steps against NumPy.

Reads: ``G/s`` is G point-updates per second (diffusion: per step; stage:
grid points per RK3 step); ``GB/s`` counts the bytes the kernel must move at
least (diffusion: one read and one write per point; RK3: 6 + 9 + 9 field
passes); ``copy`` is that over the measured copy bandwidth. A ``*`` marks the
default launch.

Usage (after installing the package, e.g. by ``scripts/device_check.sh``)::

    python3 -P scripts/gpu_kernel_variants.py [--size 8192] [--check-size 2048]
        [--repeats 15] [--dtype float32] [--backend cupy] [--json results.json]

Needs CuPy and numba-cuda, not dask. Runs in well under a minute on an H200.
"""

import argparse
import json
import sys
import time

import numpy as np

_RK3 = ((0.0, 1.0, 1.0), (0.75, 0.25, 0.25), (1.0 / 3.0, 2.0 / 3.0, 2.0 / 3.0))
_TOLERANCE = {"float32": 2e-5, "float64": 1e-12}  # as tests/_support.py, per unit factor
_CX, _CY = 0.2, 0.15
# Physics of the timed runs (as hpcgpu bench stencil) and of the checks: the
# checks use O(1) depths, spacings and Coriolis so that every term of the
# tendency (vorticity flux, Bernoulli gradient, viscosity) moves the result.
_BENCH = dict(g=9.81, rdx=1.0e-4, rdy=1.0e-4, nu=10.0)
_CHECK = dict(g=2.0, rdx=1.0 / 0.9, rdy=1.0 / 1.1, nu=0.01)
_DT = 10.0


def _median_ms(cupy, call, repeats, warmup=2):
    """Median milliseconds of ``call()`` between CUDA events on the current stream."""
    for _ in range(warmup):
        call()
    cupy.cuda.get_current_stream().synchronize()
    times = []
    for _ in range(repeats):
        start, stop = cupy.cuda.Event(), cupy.cuda.Event()
        start.record()
        call()
        stop.record()
        stop.synchronize()
        times.append(cupy.cuda.get_elapsed_time(start, stop))
    return float(np.median(times))


def _copy_gbs(cupy, nbytes, repeats):
    src = cupy.ones(nbytes // 4, dtype=np.float32)
    dst = cupy.empty_like(src)

    def copy():
        dst[...] = src

    return 2 * src.nbytes / (_median_ms(cupy, copy, repeats) * 1e-3) / 1e9


class _Runner:
    """Kernel entry points of one backend, with an explicit launch."""

    def __init__(self, name):
        self.name = name
        if name == "cupy":
            from hpcgpu.kernels.stencil import _cupy as module
        else:
            from hpcgpu.kernels.stencil import _cuda as module
        self.module = module

    def launches(self, family, dtype_name):
        default = self.module.LAUNCH[(family, dtype_name)]
        others = [v for v in self.module.VARIANTS[(family, dtype_name)] if v != default]
        return [default, *others]

    def five_point(self, src, dst, c_x, c_y, bc, diffuse, launch):
        if self.name == "cupy":
            name = "diffuse_kernel" if diffuse else "laplacian_kernel"
            self.module._five_point(name, src, dst, c_x, c_y, bc[0], bc[1], launch)
        else:
            self.module._five_point(src, dst, c_x, c_y, *bc, diffuse=diffuse, launch=launch)

    def passes(self):
        """Multi-step diffusion passes (temporal blocking) this backend has: ``cuda`` only."""
        if self.name != "cuda":
            return ()
        from hpcgpu.kernels.stencil import _cuda_diffusion
        return _cuda_diffusion.VARIANTS

    def diffuse_passes(self, src, work, steps, bc, launch):
        """``steps`` diffusion steps by passes of ``launch`` (overwrites both buffers); the result."""
        return self.module.diffuse(src, work, _CX, _CY, steps, *bc, multi_step=launch)

    def stage(self, state0, state, out, f_corner, a, b, c, bc, launch, physics):
        self.module._stage(*state0, *state, *out, f_corner, physics["g"], physics["rdx"],
                           physics["rdy"], physics["nu"], a, b, c, *bc, launch=launch)


def _label(launch):
    if hasattr(launch, "steps"):
        return f"pass T{launch.steps} rows{launch.rows} thr{launch.threads}"
    vec = getattr(launch, "vec", 1)
    return f"vec{vec} rows{launch.rows} thr{launch.threads}"


_PASS_STEPS = 8  # diffusion steps per timed or checked call of the multi-step passes (T divides it)


def _relative_error(cupy, got, ref):
    got = cupy.asnumpy(got).astype(np.float64)
    if not np.isfinite(got).all():
        return float("inf")
    return float(np.abs(got - ref).max() / np.abs(ref).max())


def _references(dtype, n, rng):
    """Random inputs and their float64 NumPy results, per boundary: periodic, and
    a wall in x, a wall south, an open edge north."""
    from hpcgpu.kernels.stencil import _numpy
    cases = []
    for boundary in ((0, 0, 0), (1, 1, 2)):
        field = rng.standard_normal((n, n)).astype(dtype)
        f64 = field.astype(np.float64)
        five = {False: _numpy.laplacian(f64, np.empty_like(f64), _CX, _CY, *boundary),
                True: _numpy.diffuse(f64.copy(), np.empty_like(f64), _CX, _CY, 1, *boundary)}
        state0, state = (_state(rng, n, dtype, depth=1.0, spread=0.2) for _ in range(2))
        f_corner = rng.uniform(-1.0, 1.0, n + 1).astype(dtype)
        stages = []
        for a, b, c in ((0.0, 1.0, 0.3), (0.75, 0.25, 0.075)):
            ref = tuple(np.empty((n, n)) for _ in range(3))
            _numpy.shallow_water_stage(*(x.astype(np.float64) for x in (*state0, *state)), *ref,
                                       f_corner.astype(np.float64), *_CHECK.values(), a, b, c,
                                       *boundary)
            stages.append(((a, b, c), ref))
        cases.append(dict(boundary=boundary, field=field, five=five, state0=state0, state=state,
                          f_corner=f_corner, stages=stages))
    return cases


def _check(cupy, runner, dtype, cases):
    """Worst relative error (over the factor the tests allow) of each launch, per case."""
    dtype_name = np.dtype(dtype).name
    n = cases[0]["field"].shape[0]
    out = {}
    for case in cases:
        boundary = case["boundary"]
        src = cupy.asarray(case["field"])
        for k, launch in enumerate(runner.launches("five_point", dtype_name)):
            for diffuse, ref in case["five"].items():
                if not diffuse and k:
                    continue  # the Laplacian is diffusion's strip code: checked at the default only
                dst = cupy.full((n, n), np.nan, dtype)
                runner.five_point(src, dst, _CX, _CY, boundary, diffuse, launch)
                err = _relative_error(cupy, dst, ref) / (8 * _TOLERANCE[dtype_name])
                key = ("diffusion", _label(launch))
                out[key] = max(out.get(key, 0.0), err)
        if runner.passes():
            ref = _numpy_diffusion(case["field"].astype(np.float64), _PASS_STEPS, boundary)
            for launch in runner.passes():
                got = runner.diffuse_passes(src.copy(), cupy.full((n, n), np.nan, dtype), _PASS_STEPS, boundary,
                                            launch)
                err = _relative_error(cupy, got, ref) / (8 * _PASS_STEPS * _TOLERANCE[dtype_name])
                out[("diffusion", _label(launch))] = max(out.get(("diffusion", _label(launch)), 0.0), err)
        dev0 = tuple(cupy.asarray(x) for x in case["state0"])
        dev = tuple(cupy.asarray(x) for x in case["state"])
        f_corner = cupy.asarray(case["f_corner"])
        for (a, b, c), ref in case["stages"]:
            for launch in runner.launches("stage", dtype_name):
                result = tuple(cupy.full((n, n), np.nan, dtype) for _ in range(3))
                runner.stage(dev0, dev, result, f_corner, a, b, c, boundary, launch, _CHECK)
                err = max(_relative_error(cupy, g, r) for g, r in zip(result, ref))
                err /= 50 * _TOLERANCE[dtype_name]
                key = ("shallow_water", _label(launch))
                out[key] = max(out.get(key, 0.0), err)
    return out


def _numpy_diffusion(field, steps, boundary):
    from hpcgpu.kernels.stencil import _numpy
    return _numpy.diffuse(field.copy(), np.empty_like(field), _CX, _CY, steps, *boundary)


def _state(rng, n, dtype, depth=1000.0, spread=1.0):
    """Random u, v (standard normal) and h (depth + spread * uniform)."""
    return (rng.standard_normal((n, n)).astype(dtype), rng.standard_normal((n, n)).astype(dtype),
            (depth + spread * rng.random((n, n))).astype(dtype))


def _time(cupy, runner, dtype, n, repeats, rng, copy):
    dtype_name = np.dtype(dtype).name
    item = np.dtype(dtype).itemsize
    rows = []
    field = cupy.asarray(rng.random((n, n)), dtype=dtype)
    work = cupy.empty((n, n), dtype)
    steps = 10
    for k, launch in enumerate(runner.launches("five_point", dtype_name)):
        def diffusion(field=field, work=work, launch=launch):
            src, dst = field, work
            for _ in range(steps):
                runner.five_point(src, dst, _CX, _CY, (0, 0, 0), True, launch)
                src, dst = dst, src

        ms = _median_ms(cupy, diffusion, repeats) / steps
        gbs = 2 * item * n * n / (ms * 1e-3) / 1e9
        rows.append(dict(backend=runner.name, case="diffusion", dtype=dtype_name, default=k == 0,
                         launch=_label(launch), ms=ms, gpts=n * n / (ms * 1e-3) / 1e9, gbs=gbs,
                         copy=gbs / copy["diffusion"]))
    for launch in runner.passes():
        def passes(field=field, work=work, launch=launch):
            runner.diffuse_passes(field, work, _PASS_STEPS, (0, 0, 0), launch)

        ms = _median_ms(cupy, passes, repeats) / _PASS_STEPS
        gbs = 2 * item * n * n / (ms * 1e-3) / 1e9
        rows.append(dict(backend=runner.name, case="diffusion", dtype=dtype_name, default=False,
                         launch=_label(launch), ms=ms, gpts=n * n / (ms * 1e-3) / 1e9, gbs=gbs,
                         copy=gbs / copy["diffusion"]))
    del field, work

    y0 = tuple(cupy.asarray(x) for x in _state(rng, n, dtype))
    bufs = [tuple(cupy.empty((n, n), dtype) for _ in range(3)) for _ in range(2)]
    f_corner = cupy.full(n + 1, 1e-4, dtype)
    for k, launch in enumerate(runner.launches("stage", dtype_name)):
        def rk3():
            first, second = bufs
            for (a, b, c), src, dst in zip(_RK3, (y0, first, second), (first, second, first)):
                runner.stage(y0, src, dst, f_corner, a, b, c * _DT, (0, 0, 0), launch, _BENCH)

        ms = _median_ms(cupy, rk3, repeats)
        gbs = (6 + 9 + 9) * item * n * n / (ms * 1e-3) / 1e9
        rows.append(dict(backend=runner.name, case="shallow_water", dtype=dtype_name, default=k == 0,
                         launch=_label(launch), ms=ms, gpts=n * n / (ms * 1e-3) / 1e9, gbs=gbs,
                         copy=gbs / copy["shallow_water"]))
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=int, default=8192, help="timed grid is size x size")
    parser.add_argument("--check-size", type=int, default=2048, help="checked grid is n x n")
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--dtype", action="append", choices=("float32", "float64"))
    parser.add_argument("--backend", action="append", choices=("cupy", "cuda"))
    parser.add_argument("--json", help="also write every result to this file")
    args = parser.parse_args(argv)
    dtypes = args.dtype or ["float32", "float64"]
    backends = args.backend or ["cupy", "cuda"]

    import cupy
    started = time.perf_counter()
    props = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)
    print(f"device: {props['name'].decode()}, cupy {cupy.__version__}", flush=True)
    rng = np.random.default_rng(7)
    results, failures = [], []
    for dtype_name in dtypes:
        dtype = np.dtype(dtype_name)
        item = dtype.itemsize
        copy = {"diffusion": _copy_gbs(cupy, 2 * item * args.size ** 2, args.repeats),
                "shallow_water": _copy_gbs(cupy, 12 * item * args.size ** 2, args.repeats)}
        print(f"{dtype_name}: copy {copy['diffusion']:.0f} GB/s (diffusion working set), "
              f"{copy['shallow_water']:.0f} GB/s (RK3 working set)", flush=True)
        cases = _references(dtype, args.check_size, rng)
        for name in backends:
            runner = _Runner(name)
            t0 = time.perf_counter()
            errors = _check(cupy, runner, dtype, cases)
            rows = _time(cupy, runner, dtype, args.size, args.repeats, rng, copy)
            for row in rows:
                row["check"] = errors[(row["case"], row["launch"])]
                row["copy_gbs"] = copy[row["case"]]
                if not row["check"] <= 1.0:
                    failures.append(row)
            results += rows
            print(f"  {name} {dtype_name}: {len(rows)} variants in {time.perf_counter() - t0:.1f} s",
                  flush=True)

    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    print(f"\n{'backend':7s} {'case':13s} {'dtype':7s} {'launch':24s} {'check':>6s} {'ms':>8s} "
          f"{'G/s':>7s} {'GB/s':>6s} {'copy':>5s}")
    for r in results:
        mark = "*" if r["default"] else " "
        print(f"{r['backend']:7s} {r['case']:13s} {r['dtype']:7s} {mark}{r['launch']:23s} "
              f"{r['check']:6.2f} {r['ms']:8.3f} {r['gpts']:7.1f} {r['gbs']:6.0f} {r['copy']:5.0%}")
    print(f"\ncheck = worst relative error over the test tolerance (must be <= 1); "
          f"{time.perf_counter() - started:.0f} s in all")
    if failures:
        print(f"FAILED: {len(failures)} variants do not match numpy", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
