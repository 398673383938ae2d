"""The ``hpcgpu`` command line: ``info``, ``run WORKLOAD``, ``bench SUITE``, ``plan WORKLOAD``.

Examples
--------
::

    hpcgpu info
    hpcgpu run weather --case unstable_jet --nx 256 --ny 128
    hpcgpu run md --n-cells 10 --thermostat langevin --temperature 0.85 --xyz
    hpcgpu bench stencil --size 2048
    hpcgpu bench nbody --dtype float64
    hpcgpu bench comm --workers 2 --size 4096 --repeats 200
    hpcgpu plan weather --nx 16384 --ny 16384 --steps 10000 --device h100 --interconnect ndr
    hpcgpu plan --check
"""

import argparse
import importlib
import json
import os
import sys

from hpcgpu.cluster import worker_info
from hpcgpu.errors import HpcgpuError

__all__ = ["main"]

SUITES = ("stencil", "scaling", "nbody", "md", "matrix", "soak", "comm", "io")
# Per suite: (sizes, steps) defaults. Sizes are grid points per side
# (stencil, scaling) or bodies (nbody); steps are diffusion steps per timed
# call (stencil), steps per task (scaling) or evaluations per timed call (nbody).
SUITE_DEFAULTS = {"stencil": ((4096,), 100), "scaling": ((2048,), 16), "nbody": ((4096, 16384), 10),
                  # matrix: GEMM matrix side and SpMV grid side; SpMV products per timed call
                  "matrix": ((1024, 2048), 10),
                  # md: atoms (fcc, rounded to 4 n^3); time steps per timed call
                  "md": ((32000,), 100)}
# Smallest --size per suite: a grid of 4 x 4 points, one matrix row, two
# bodies, the md suite's own fcc minimum (it says why), a block of 16 rows.
DEFAULT_BUDGET_S = 20.0
"""Seconds of timed repeats per case and backend of the stencil, nbody, md and matrix suites."""
SUITE_MIN_SIZE = {"stencil": 4, "scaling": 16, "nbody": 2, "matrix": 1, "md": 1}


def _check_bench_arguments(args):
    """ConfigError naming the first ``hpcgpu bench`` option out of its range."""
    from hpcgpu.validation import check_float, check_int

    for size in args.size or ():
        check_int("size", size, minimum=SUITE_MIN_SIZE[args.suite])
    if args.steps is not None:
        check_int("steps", args.steps, minimum=1)
    check_float("budget", args.budget, minimum=0.0, strict_min=True)
    if args.workers is not None:
        check_int("workers", args.workers, minimum=2 if args.suite in ("md", "nbody", "matrix") else 1)


AUTOTUNE_ENV = "HPCGPU_AUTOTUNE"


def _info(args):
    from hpcgpu._cpu_vectors import vector_width_note, wide_vector_features
    from hpcgpu.backends import backend_info, get_backend

    if args.worker_env:
        from hpcgpu.cluster import worker_environment

        for name, value in worker_environment().items():
            print(f"{name}={value}")
        return 0
    if args.wide_vectors:
        features = wide_vector_features()
        if features is None:
            print("hpcgpu: this CPU has no AVX-512: Numba's default vector width is already its widest",
                  file=sys.stderr)
            return 1
        print(features)
        return 0
    statuses = backend_info()
    auto = get_backend("auto").name
    tuned = _autotune_choices(args.tune)
    if args.json:
        print(json.dumps({"auto": auto, "backends": [s.__dict__ for s in statuses],
                          "cpu_vectors": vector_width_note(), "kernel_cache": _kernel_cache(),
                          "autotune": tuned}))
        return 0
    import hpcgpu

    print(f"hpcgpu {hpcgpu.__version__}")
    width = max(len(s.name) for s in statuses)
    for s in statuses:
        mark = "usable  " if s.usable else "unusable"
        print(f"  {s.name:<{width}}  {mark}  {s.detail}")
    print(f"  'auto' selects: {auto}")
    print(f"  {vector_width_note()}")
    print(f"  compiled kernels cached in {_kernel_cache()}")
    for line in _autotune_lines(tuned):
        print(f"  {line}")
    return 0


def _autotune_choices(tune):
    """This machine's kernel variants (:mod:`hpcgpu.autotune`); with ``tune``, measure them now."""
    from hpcgpu import autotune

    if tune:
        from hpcgpu.kernels.matrix import raw_kernels
        from hpcgpu.kernels.nbody import inverse_sqrt_variant, sweep_variant

        from hpcgpu.kernels.stencil import diffusion_sweep_depth

        inverse_sqrt_variant("float64")
        sweep_variant("float32")
        for dtype in ("float32", "float64"):
            raw_kernels("numba").spmv_variant(dtype)
            diffusion_sweep_depth(4096, dtype)
    return autotune.choices()


def _autotune_lines(tuned):
    if not tuned["enabled"]:
        yield f"kernel variants: defaults ({AUTOTUNE_ENV}=0)"
        return
    machine = tuned["machine"]
    yield (f"kernel variants for {machine['cpu']} ({machine['llvm_cpu']}, numba {machine['numba']}), "
           f"kept in {tuned['file']}:")
    if not tuned["kernels"]:
        yield "    none measured yet: each is timed at its first use (or run hpcgpu info --tune)"
    for kernel, record in sorted(tuned["kernels"].items()):
        seconds = record.get("seconds") or {}
        timing = ", ".join(f"{name} {value * 1e6:.0f} us" for name, value in sorted(seconds.items()))
        pinned = " (pinned)" if record.get("pinned") else ""
        yield f"    {kernel}: {record['choice']}{pinned}" + (f"  [{timing}]" if timing else "")


def _kernel_cache():
    """Where Numba caches hpcgpu's compiled kernels (the user's NUMBA_CACHE_DIR wins)."""
    from hpcgpu._jit_cache import CACHE_DIR_ENV, cache_dir

    if os.environ.get("NUMBA_CACHE_DIR"):
        return f"{os.path.abspath(os.environ['NUMBA_CACHE_DIR'])} (NUMBA_CACHE_DIR)"
    return f"{cache_dir()} (set {CACHE_DIR_ENV} to move it)"


def _acceptance(args):
    """``hpcgpu bench`` without a suite: accept the attached cluster (JSON lines, HTML report)."""
    from hpcgpu._cli_common import one_cluster
    from hpcgpu.bench import acceptance
    from hpcgpu.bench.report import Thresholds, write_html
    from hpcgpu.cluster import close_client, start_cluster

    thresholds = Thresholds.from_toml(args.thresholds) if args.thresholds else Thresholds()
    _check_report_path(args.report)  # before the minutes of measuring, not after them
    one_cluster(args)
    client = start_cluster(args.scheduler, workers=args.workers, quiet=True)
    try:
        info = worker_info(client)
        hosts = len({w.get("host", a) for a, w in info.items()})
        estimate = acceptance.estimate_seconds(len(info), args.quick, hosts)
        print(f"hpcgpu bench: accepting {len(info)} worker(s) on {hosts} host(s) at {client.scheduler.address}; "
              f"{'quick' if args.quick else 'full'} suite, about {estimate / 60:.0f} min "
              f"(dashboard {client.dashboard_link})", file=sys.stderr)
        records = acceptance.run_acceptance(client, quick=args.quick, thresholds=thresholds, stream=sys.stdout)
    finally:
        close_client(client)
    os.makedirs(os.path.dirname(os.path.abspath(args.report)), exist_ok=True)
    write_html(records, args.report)
    acceptance.print_summary(records)
    print(f"hpcgpu bench: report {os.path.abspath(args.report)}", file=sys.stderr)
    return 0 if [r for r in records if r["kind"] == "summary"][-1]["passed"] else 1


def _check_report_path(path):
    """ConfigError unless the HTML report can be written at ``path`` (its folder is made here)."""
    from hpcgpu.errors import ConfigError

    path = os.path.abspath(path)
    if os.path.isdir(path):
        raise ConfigError(f"--report must name a file; {path!r} is a folder")
    folder = os.path.dirname(path)
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError as error:
        raise ConfigError(f"--report: cannot make the folder {folder!r}: {error.strerror}") from None
    if not os.access(folder, os.W_OK) or (os.path.exists(path) and not os.access(path, os.W_OK)):
        raise ConfigError(f"--report: {path!r} is not writable")


def _bench_comm(args):
    """``hpcgpu bench comm``: the communicator between every pair of workers (JSON lines)."""
    from hpcgpu.bench import comm
    from hpcgpu.bench.harness import Recorder
    from hpcgpu.cluster import close_client, start_cluster

    sizes = args.size or list(comm.DEFAULT_SIZES)
    repeats = comm.DEFAULT_REPEATS if args.repeats is None else args.repeats
    workers = args.workers if args.workers is not None or args.scheduler else comm.DEFAULT_WORKERS
    # before a cluster starts: a typo costs no waiting
    comm.check_arguments(sizes, workers, repeats)
    if args.scheduler:
        client = start_cluster(args.scheduler, quiet=True)
    else:
        client = start_cluster(workers=workers, threads_per_worker=1, gpus=False, dashboard_address="127.0.0.1:0",
                               quiet=True)
    recorder = Recorder("comm")
    try:
        if not args.scheduler:
            client.wait_for_workers(workers)
        comm.run(recorder, client, workers=workers, sizes=sizes, repeats=repeats)
    finally:
        close_client(client)
    return 0


def _bench_io(args):
    """``hpcgpu bench io``: snapshot and checkpoint write rates per rank and in all, beside NumPy (JSON lines)."""
    from hpcgpu.bench import io
    from hpcgpu.cluster import close_client, start_cluster
    from hpcgpu.validation import check_int

    size = check_int("size", (args.size or [io.DEFAULT_SIZE])[-1], minimum=16)
    workers = check_int("workers", 2 if args.workers is None else args.workers, minimum=1)
    if args.scheduler:
        client = start_cluster(args.scheduler, quiet=True)
    else:
        client = start_cluster(workers=workers, threads_per_worker=1, gpus=False, dashboard_address="127.0.0.1:0",
                               quiet=True)
    try:
        if not args.scheduler:
            client.wait_for_workers(workers)
        io.run(client, folder=args.folder, size=size, dtype=(args.dtype or ["float64"])[-1])
    finally:
        close_client(client)
    return 0


def _bench(args):
    from hpcgpu.backends import BACKEND_NAMES, backend_status, get_backend
    from hpcgpu.bench.harness import Recorder

    if args.budget is not None and args.suite in (None, "comm", "soak", "scaling", "io"):
        from hpcgpu.errors import ConfigError

        raise ConfigError(f"--budget applies to the stencil, nbody, md and matrix suites; "
                          f"{'cluster acceptance' if args.suite is None else args.suite} runs for a fixed length"
                          + (" (--minutes)" if args.suite == "soak" else ""))
    args.budget = DEFAULT_BUDGET_S if args.budget is None else args.budget
    if args.suite is None:
        return _acceptance(args)
    if args.suite == "comm":
        return _bench_comm(args)
    if args.suite == "io":
        return _bench_io(args)
    if args.suite == "soak":
        from hpcgpu.bench.soak import run_soak
        from hpcgpu.cluster import start_cluster

        client = start_cluster(args.scheduler, quiet=True) if args.scheduler else None
        report = run_soak(args.minutes, client=client, kill_every=args.kill_every, stream=sys.stdout)
        return 0 if report["final_state_matches_reference"] else 1

    names = args.backend or [n for n in BACKEND_NAMES
                             if backend_status(n).usable and not (n == "cuda" and get_backend("cuda").simulated)]
    backends = [get_backend(n) for n in names]
    recorder = Recorder(args.suite)
    module = importlib.import_module(f"hpcgpu.bench.{args.suite}")
    _check_bench_arguments(args)
    sizes, steps = SUITE_DEFAULTS[args.suite]
    args.size = args.size or list(sizes)
    args.steps = steps if args.steps is None else args.steps
    print(f"hpcgpu bench {args.suite}: backends {', '.join(names)}; sizes {args.size}; "
          f"dtypes {args.dtype}", file=sys.stderr)
    extra = {}
    if args.suite == "scaling":
        backends = backends[-1:]  # the fastest usable backend scales out
        extra = dict(workload=args.workload, max_workers=args.workers)
    elif args.suite in ("md", "nbody", "matrix") and args.workers is not None:
        extra = dict(workers=args.workers)
    module.run(recorder, backends, sizes=args.size, dtypes=args.dtype, steps=args.steps,
               budget_s=args.budget, **extra)
    if recorder.errors:
        print(f"hpcgpu bench: {len(recorder.errors)} case(s) failed (see the 'error' lines)", file=sys.stderr)
        return 1
    return 0


def _plan(args):
    from hpcgpu.plan import run_command

    return run_command(args)


def _add_workloads(run_sub):
    """One ``hpcgpu run NAME`` per registered workload (:mod:`hpcgpu.registry`); a broken one says why when run."""
    from hpcgpu import registry

    for name, declared in registry.workloads().items():
        try:
            module = declared.cli_module()
            # the name hpcgpu plan and bench use too ("hpcgpu run nbody" is "hpcgpu run astro")
            aliases = [declared.plan_name] if declared.plan_name not in (None, name) else []
            parser = run_sub.add_parser(name, aliases=aliases, help=module.HELP, description=module.DESCRIPTION)
        except Exception as error:  # noqa: BLE001 - one broken plugin must not take the command line down
            _add_broken(run_sub, name, _cli_failed(declared, error))
            continue
        try:
            module.add_arguments(parser)
        except Exception as error:  # noqa: BLE001
            parser.set_defaults(handler=_fail(_cli_failed(declared, error)))
            continue
        parser.set_defaults(handler=module.run)
    for name, message in registry.broken().items():
        _add_broken(run_sub, name, message)


def _cli_failed(declared, error):
    return (f"workload {declared.name!r} is not usable: its command line {declared.cli!r} "
            f"({declared.entry_point}) failed: {type(error).__name__}: {error}")


def _fail(message):
    def fail(args):
        raise HpcgpuError(message)

    return fail


def _add_broken(run_sub, name, message):
    parser = run_sub.add_parser(name, help="(not usable: run it to see why)", add_help=False)
    parser.add_argument("rest", nargs=argparse.REMAINDER)
    parser.set_defaults(handler=_fail(message))


def build_parser():
    parser = argparse.ArgumentParser(
        prog="hpcgpu",
        description="Scientific workloads on GPU clusters: the same model from a laptop to many GPUs.")
    sub = parser.add_subparsers(dest="command", required=True)

    info = sub.add_parser("info", help="list backends and whether each is usable here")
    info.add_argument("--json", action="store_true", help="print one JSON object")
    info.add_argument("--tune", action="store_true",
                      help="time the CPU kernels' variants now (else each is timed at its first use)")
    info.add_argument("--wide-vectors", action="store_true",
                      help="print the NUMBA_CPU_FEATURES value that compiles the CPU kernels for 512-bit vectors")
    info.add_argument("--worker-env", action="store_true",
                      help="print the environment that gives workers you start yourself (dask worker, dask cuda "
                           "worker) the quieter dask settings of hpcgpu's local clusters")
    info.set_defaults(handler=_info)

    run = sub.add_parser("run", help="run a workload")
    run_sub = run.add_subparsers(dest="workload", required=True)
    _add_workloads(run_sub)

    bench = sub.add_parser("bench", help="accept a cluster, or run one benchmark suite (JSON lines)",
                           description="Without a suite: cluster acceptance (inventory, ceilings, kernels "
                                       "against their rooflines and numpy, transfers, scaling, energy) with an "
                                       "HTML report. With a suite: that benchmark alone.")
    bench.add_argument("suite", nargs="?", choices=SUITES, help="benchmark suite (default: cluster acceptance)")
    bench.add_argument("workload", nargs="?", default="weather",
                       help="workload of the scaling suite (default: weather)")
    bench.add_argument("--backend", action="append", choices=("numpy", "numba", "cuda", "cupy"),
                       help="backend to measure (repeatable; default: every usable one)")
    bench.add_argument("--size", type=int, action="append",
                       help="grid points per side (per worker for scaling), bodies for nbody, or message "
                            "bytes for comm; repeatable; default 4096, scaling 2048, nbody 4096 and 16384, comm "
                            "4096, 1048576 and 67108864")
    bench.add_argument("--dtype", action="append", choices=("float32", "float64"),
                       help="dtype (repeatable; default float32)")
    bench.add_argument("--steps", type=int,
                       help="diffusion steps per timed call (default 100); for scaling, steps per task K "
                            "(default 16); for nbody, force evaluations per timed call (default 10)")
    bench.add_argument("--workers", type=int, help="scaling: largest number of workers (default: cores or GPUs); "
                                                    "md, nbody, matrix: also run the partitioned case on that many "
                                                    "local workers; comm: local workers (default 2), or the "
                                                    "first N workers of --scheduler (default all)")
    bench.add_argument("--budget", type=float,
                       help="stencil, nbody, md, matrix: seconds of repeats per case and backend (default 20; "
                            "the other suites run for fixed lengths)")
    soak = bench.add_argument_group("soak (suite 'soak')")
    soak.add_argument("--minutes", type=float, default=5.0, help="length of the disturbed run (default 5)")
    soak.add_argument("--kill-every", type=float, help="seconds between worker kills (default: a quarter of "
                                                       "the run, at least 10)")
    comm = bench.add_argument_group("communicator (suite 'comm')")
    comm.add_argument("--repeats", type=int, help="timed round trips per worker pair and size, and timed "
                                                  "collectives (default 100; large messages fewer)")
    io_group = bench.add_argument_group("output (suite 'io')")
    io_group.add_argument("--folder", help="where to write: a folder every worker sees, or an fsspec URL "
                                           "(s3://..., with its package); default a temporary folder")
    accept = bench.add_argument_group("cluster acceptance (no suite)")
    accept.add_argument("--quick", action="store_true", help="small sizes (under 3 minutes on a laptop)")
    accept.add_argument("--scheduler", metavar="ADDRESS", help="accept (or, with comm, measure) the cluster at "
                                                                "ADDRESS (default: a local one, one worker per GPU "
                                                                "or core)")
    accept.add_argument("--thresholds", metavar="FILE", help="TOML file of pass/fail thresholds")
    accept.add_argument("--report", default=os.path.join("hpcgpu-output", "acceptance", "report.html"),
                        help="HTML report (default hpcgpu-output/acceptance/report.html)")
    bench.set_defaults(handler=_bench)

    from hpcgpu.plan import add_arguments as add_plan_arguments

    plan = sub.add_parser("plan", help="predict time, memory per GPU and efficiency on 1..N GPUs",
                          description="Predict time to solution, memory per GPU and parallel efficiency of a "
                                      "workload on 1, 2, 4, ... GPUs from the roofline, the halo/ghost traffic "
                                      "and dask's overhead; --check compares the model with this machine.")
    add_plan_arguments(plan)
    plan.set_defaults(handler=_plan)
    return parser


def main(argv=None):
    """Entry point of the ``hpcgpu`` console script; returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "bench":
        args.dtype = args.dtype or ["float32"]
    try:
        return args.handler(args)
    except HpcgpuError as error:
        print(f"hpcgpu: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # Ctrl-C: the clusters are closed on the way out; no traceback
        print("hpcgpu: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
