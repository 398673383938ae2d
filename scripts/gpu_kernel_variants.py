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
T steps per pass over memory, ``diffusion_cuda.VARIANTS``; off by default
until these numbers say which, if any, beats the one-step kernel), checked
after 8 steps against NumPy.

Reads: ``G/s`` is G point-updates per second (diffusion: per step; stage:
grid points per RK3 step); ``GB/s`` counts the bytes the kernel must move at
least (diffusion: one read and one write per point; RK3: 6 + 9 + 9 field
passes); ``copy`` is that over the measured copy bandwidth. A ``*`` marks the
default launch.

Each variant is checked and timed in its own ``try``: one that raises
becomes a row with its error text (``status`` "error", or "refused" where
its launch chooser refuses it with ``ConfigError``) and the others still
run. Each row is printed and appended to the ``--jsonl`` file (one JSON
object per line, flushed) as soon as it is made, so that a crash or a
timeout kill late in the run loses nothing already measured. Without CuPy
or a device the script writes one error row and exits with status 2.

Usage (after installing the package, e.g. by ``scripts/device_check.sh``)::

    python3 -P scripts/gpu_kernel_variants.py [--size 8192] [--check-size 2048]
        [--repeats 15] [--dtype float32] [--backend cupy] [--jsonl rows.jsonl]

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
        from hpcgpu.kernels.stencil import diffusion_cuda
        return diffusion_cuda.VARIANTS

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


def _numpy_diffusion(field, steps, boundary):
    from hpcgpu.kernels.stencil import _numpy
    return _numpy.diffuse(field.copy(), np.empty_like(field), _CX, _CY, steps, *boundary)


def _state(rng, n, dtype, depth=1000.0, spread=1.0):
    """Random u, v (standard normal) and h (depth + spread * uniform)."""
    return (rng.standard_normal((n, n)).astype(dtype), rng.standard_normal((n, n)).astype(dtype),
            (depth + spread * rng.random((n, n))).astype(dtype))


class Variant:
    """One launch variant to measure: who it is, and ``run()``, which checks and times it.

    ``run()`` returns the measured fields of its row (``check``, ``ms``,
    ``gpts``, ``gbs``, ``copy``, ``copy_gbs``); anything it raises becomes the
    row's ``error`` (:func:`measure`).
    """

    def __init__(self, backend, case, dtype, launch, default, run):
        self.backend, self.case, self.dtype, self.launch, self.default = backend, case, dtype, launch, default
        self.run = run


class _Workspace:
    """Device buffers of the timed runs of one backend and dtype, made on first use and shared
    by the variants (the diffusion buffers are released before the RK3 buffers are made)."""

    def __init__(self, cupy, dtype, n, rng):
        self.cupy, self.dtype, self.n, self.rng = cupy, dtype, n, rng
        self._diffusion = self._stage = None

    def diffusion(self):
        if self._diffusion is None:
            cupy, n = self.cupy, self.n
            self._diffusion = (cupy.asarray(self.rng.random((n, n)), dtype=self.dtype),
                               cupy.empty((n, n), self.dtype))
        return self._diffusion

    def stage(self):
        if self._stage is None:
            self._diffusion = None
            cupy, n = self.cupy, self.n
            y0 = tuple(cupy.asarray(x) for x in _state(self.rng, n, self.dtype))
            bufs = [tuple(cupy.empty((n, n), self.dtype) for _ in range(3)) for _ in range(2)]
            self._stage = (y0, bufs, cupy.full(n + 1, 1e-4, self.dtype))
        return self._stage


def _five_point_variant(cupy, runner, dtype, cases, work, copy, repeats, launch, k):
    dtype_name, item, n = np.dtype(dtype).name, np.dtype(dtype).itemsize, work.n
    steps = 10

    def run():
        err = 0.0
        m = cases[0]["field"].shape[0]
        for case in cases:
            src = cupy.asarray(case["field"])
            for diffuse, ref in case["five"].items():
                if not diffuse and k:
                    continue  # the Laplacian is diffusion's strip code: checked at the default only
                dst = cupy.full((m, m), np.nan, dtype)
                runner.five_point(src, dst, _CX, _CY, case["boundary"], diffuse, launch)
                err = max(err, _relative_error(cupy, dst, ref) / (8 * _TOLERANCE[dtype_name]))
        field, scratch = work.diffusion()

        def diffusion():
            src, dst = field, scratch
            for _ in range(steps):
                runner.five_point(src, dst, _CX, _CY, (0, 0, 0), True, launch)
                src, dst = dst, src

        ms = _median_ms(cupy, diffusion, repeats) / steps
        gbs = 2 * item * n * n / (ms * 1e-3) / 1e9
        return dict(check=err, ms=ms, gpts=n * n / (ms * 1e-3) / 1e9, gbs=gbs, copy=gbs / copy["diffusion"],
                    copy_gbs=copy["diffusion"])

    return Variant(runner.name, "diffusion", dtype_name, _label(launch), k == 0, run)


def _pass_variant(cupy, runner, dtype, cases, work, copy, repeats, launch):
    dtype_name, item, n = np.dtype(dtype).name, np.dtype(dtype).itemsize, work.n

    def run():
        err = 0.0
        m = cases[0]["field"].shape[0]
        for case in cases:
            ref = _numpy_diffusion(case["field"].astype(np.float64), _PASS_STEPS, case["boundary"])
            src = cupy.array(case["field"])  # a copy: the passes overwrite both buffers
            got = runner.diffuse_passes(src, cupy.full((m, m), np.nan, dtype), _PASS_STEPS, case["boundary"],
                                        launch)
            err = max(err, _relative_error(cupy, got, ref) / (8 * _PASS_STEPS * _TOLERANCE[dtype_name]))
        field, scratch = work.diffusion()

        def passes():
            runner.diffuse_passes(field, scratch, _PASS_STEPS, (0, 0, 0), launch)

        ms = _median_ms(cupy, passes, repeats) / _PASS_STEPS
        gbs = 2 * item * n * n / (ms * 1e-3) / 1e9
        return dict(check=err, ms=ms, gpts=n * n / (ms * 1e-3) / 1e9, gbs=gbs, copy=gbs / copy["diffusion"],
                    copy_gbs=copy["diffusion"])

    return Variant(runner.name, "diffusion", dtype_name, _label(launch), False, run)


def _stage_variant(cupy, runner, dtype, cases, work, copy, repeats, launch, k):
    dtype_name, item, n = np.dtype(dtype).name, np.dtype(dtype).itemsize, work.n

    def run():
        err = 0.0
        m = cases[0]["field"].shape[0]
        for case in cases:
            dev0 = tuple(cupy.asarray(x) for x in case["state0"])
            dev = tuple(cupy.asarray(x) for x in case["state"])
            f_corner = cupy.asarray(case["f_corner"])
            for (a, b, c), ref in case["stages"]:
                result = tuple(cupy.full((m, m), np.nan, dtype) for _ in range(3))
                runner.stage(dev0, dev, result, f_corner, a, b, c, case["boundary"], launch, _CHECK)
                err = max(err, max(_relative_error(cupy, g, r) for g, r in zip(result, ref))
                          / (50 * _TOLERANCE[dtype_name]))
        y0, bufs, f_corner = work.stage()

        def rk3():
            first, second = bufs
            for (a, b, c), src, dst in zip(_RK3, (y0, first, second), (first, second, first)):
                runner.stage(y0, src, dst, f_corner, a, b, c * _DT, (0, 0, 0), launch, _BENCH)

        ms = _median_ms(cupy, rk3, repeats)
        gbs = (6 + 9 + 9) * item * n * n / (ms * 1e-3) / 1e9
        return dict(check=err, ms=ms, gpts=n * n / (ms * 1e-3) / 1e9, gbs=gbs,
                    copy=gbs / copy["shallow_water"], copy_gbs=copy["shallow_water"])

    return Variant(runner.name, "shallow_water", dtype_name, _label(launch), k == 0, run)


def _variants(cupy, runner, dtype, cases, n, repeats, rng, copy):
    """Every variant of one backend and dtype, in the order they are measured: the
    one-step diffusion launches (default first), the multi-step passes, the RK3 stage launches."""
    dtype_name = np.dtype(dtype).name
    work = _Workspace(cupy, dtype, n, rng)
    for k, launch in enumerate(runner.launches("five_point", dtype_name)):
        yield _five_point_variant(cupy, runner, dtype, cases, work, copy, repeats, launch, k)
    for launch in runner.passes():
        yield _pass_variant(cupy, runner, dtype, cases, work, copy, repeats, launch)
    for k, launch in enumerate(runner.launches("stage", dtype_name)):
        yield _stage_variant(cupy, runner, dtype, cases, work, copy, repeats, launch, k)


class JsonLines:
    """Append one JSON object per line to ``path``, flushed as each is written, so that a
    crash or a timeout kill later on loses nothing already measured."""

    def __init__(self, path):
        self.path = path
        self._file = open(path, "a", encoding="utf-8") if path else None

    def write(self, row):
        if self._file is not None:
            self._file.write(json.dumps(row, default=_jsonable) + "\n")
            self._file.flush()

    def close(self):
        if self._file is not None:
            self._file.close()


def _jsonable(value):
    if isinstance(value, (np.floating, np.integer)):
        return value.item()
    return str(value)


def _error_text(error):
    text = f"{type(error).__name__}: {error}"
    return text if len(text) <= 2000 else text[:2000] + " ..."


def error_row(error, **fields):
    """A result row that records ``error`` (an exception) instead of measurements."""
    from hpcgpu.errors import ConfigError
    row = dict(backend=None, case=None, dtype=None, launch=None, default=False)
    row.update(fields)
    row.update(status="refused" if isinstance(error, ConfigError) else "error", error=_error_text(error))
    return row


_HEADER = (f"{'backend':7s} {'case':13s} {'dtype':7s} {'launch':24s} {'check':>6s} {'ms':>8s} "
           f"{'G/s':>7s} {'GB/s':>6s} {'copy':>5s}")


def format_row(r):
    """One line of the printed table (errors: the status and the error text)."""
    mark = "*" if r.get("default") else " "
    who = f"{r.get('backend') or '-':7s} {r.get('case') or '-':13s} {r.get('dtype') or '-':7s} {mark}{r.get('launch') or '-':23s}"
    if r.get("error"):
        return f"{who} {r['status'].upper()}: {r['error'][:300]}"
    return (f"{who} {r['check']:6.2f} {r['ms']:8.3f} {r['gpts']:7.1f} {r['gbs']:6.0f} {r['copy']:5.0%}"
            + ("" if r["status"] == "ok" else f"  {r['status'].upper()}"))


def measure(variants, sink, stream=sys.stdout):
    """Measure each variant in its own try; write and print each row as soon as it is made.

    A variant that raises becomes a row with ``status`` "error" (or "refused":
    a launch its chooser refuses with ``ConfigError``) and the ``error`` text;
    a variant whose check exceeds the tolerance has ``status`` "mismatch".
    Errors raised while producing the variants themselves end the list with
    one such row. Returns the rows.
    """
    rows = []
    iterator = iter(variants)
    while True:
        started = time.perf_counter()
        try:
            variant = next(iterator)
        except StopIteration:
            break
        except Exception as error:  # noqa: BLE001 - making the variant failed: record it, stop this list
            row = error_row(error, case="setup")
            row["seconds"] = time.perf_counter() - started
            sink.write(row)
            rows.append(row)
            print(format_row(row), file=stream, flush=True)
            break
        row = dict(backend=variant.backend, case=variant.case, dtype=variant.dtype, launch=variant.launch,
                   default=variant.default)
        try:
            row.update(variant.run())
            row["status"] = "ok" if row["check"] <= 1.0 else "mismatch"
        except Exception as error:  # noqa: BLE001 - one variant's failure must not lose the others
            row.update({k: v for k, v in error_row(error).items() if k in ("status", "error")})
        row["seconds"] = time.perf_counter() - started
        sink.write(row)
        rows.append(row)
        print(format_row(row), file=stream, flush=True)
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=int, default=8192, help="timed grid is size x size")
    parser.add_argument("--check-size", type=int, default=2048, help="checked grid is n x n")
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--dtype", action="append", choices=("float32", "float64"))
    parser.add_argument("--backend", action="append", choices=("cupy", "cuda"))
    parser.add_argument("--jsonl", "--json", dest="jsonl",
                        help="append every result row to this file (JSON lines), each as it is made")
    args = parser.parse_args(argv)
    dtypes = args.dtype or ["float32", "float64"]
    backends = args.backend or ["cupy", "cuda"]
    sink = JsonLines(args.jsonl)
    started = time.perf_counter()
    try:
        try:
            import cupy
            props = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)
        except Exception as error:  # noqa: BLE001 - no CuPy or no device: one clean row, no traceback
            row = error_row(error, case="setup")
            sink.write(row)
            print(f"gpu_kernel_variants: cannot start: {row['error']}", file=sys.stderr, flush=True)
            return 2
        print(f"device: {props['name'].decode()}, cupy {cupy.__version__}", flush=True)
        rng = np.random.default_rng(7)
        results = []
        print(_HEADER, flush=True)
        for dtype_name in dtypes:
            dtype = np.dtype(dtype_name)
            item = dtype.itemsize
            try:
                copy = {"diffusion": _copy_gbs(cupy, 2 * item * args.size ** 2, args.repeats),
                        "shallow_water": _copy_gbs(cupy, 12 * item * args.size ** 2, args.repeats)}
                print(f"{dtype_name}: copy {copy['diffusion']:.0f} GB/s (diffusion working set), "
                      f"{copy['shallow_water']:.0f} GB/s (RK3 working set)", flush=True)
                cases = _references(dtype, args.check_size, rng)
            except Exception as error:  # noqa: BLE001
                row = error_row(error, case="setup", dtype=dtype_name)
                sink.write(row)
                results.append(row)
                print(format_row(row), flush=True)
                continue
            for name in backends:
                t0 = time.perf_counter()
                try:
                    runner = _Runner(name)
                except Exception as error:  # noqa: BLE001
                    row = error_row(error, case="setup", backend=name, dtype=dtype_name)
                    sink.write(row)
                    results.append(row)
                    print(format_row(row), flush=True)
                    continue
                rows = measure(_variants(cupy, runner, dtype, cases, args.size, args.repeats, rng, copy), sink)
                results += rows
                print(f"  {name} {dtype_name}: {len(rows)} variants in {time.perf_counter() - t0:.1f} s",
                      flush=True)
                cupy.get_default_memory_pool().free_all_blocks()
    finally:
        sink.close()

    failures = [r for r in results if r["status"] in ("error", "mismatch")]
    refused = [r for r in results if r["status"] == "refused"]
    print(f"\ncheck = worst relative error over the test tolerance (must be <= 1); {len(results)} rows, "
          f"{len(refused)} refused by their chooser, {len(failures)} failed; "
          f"{time.perf_counter() - started:.0f} s in all", flush=True)
    if failures:
        print(f"FAILED: {len(failures)} variants do not run or do not match numpy", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
