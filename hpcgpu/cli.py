"""The ``hpcgpu`` command line: ``info``, ``run WORKLOAD``, ``bench SUITE``.

Examples
--------
::

    hpcgpu info
    hpcgpu run weather --case unstable_jet --nx 256 --ny 128
    hpcgpu run md --n-cells 10 --thermostat langevin --temperature 0.85 --xyz
    hpcgpu bench stencil --size 2048
    hpcgpu bench nbody --dtype float64
"""

import argparse
import importlib
import json
import sys

from hpcgpu.errors import HpcgpuError

__all__ = ["main"]

# Workloads register their command-line glue here by module path, so the core
# never imports physics until a workload is asked for.
WORKLOADS = {
    "weather": "hpcgpu.workloads.weather_cli",
    "astro": "hpcgpu.workloads.astro_cli",
    "md": "hpcgpu.workloads.md_cli",
}
SUITES = ("stencil", "scaling", "nbody")
# Per suite: (sizes, steps) defaults. Sizes are grid points per side
# (stencil, scaling) or bodies (nbody); steps are diffusion steps per timed
# call (stencil), steps per task (scaling) or evaluations per timed call (nbody).
SUITE_DEFAULTS = {"stencil": ((4096,), 100), "scaling": ((2048,), 16), "nbody": ((4096, 16384), 10)}


def _info(args):
    from hpcgpu.backends import backend_info, get_backend

    statuses = backend_info()
    auto = get_backend("auto").name
    if args.json:
        print(json.dumps({"auto": auto, "backends": [s.__dict__ for s in statuses]}))
        return 0
    import hpcgpu

    print(f"hpcgpu {hpcgpu.__version__}")
    width = max(len(s.name) for s in statuses)
    for s in statuses:
        mark = "usable  " if s.usable else "unusable"
        print(f"  {s.name:<{width}}  {mark}  {s.detail}")
    print(f"  'auto' selects: {auto}")
    return 0


def _bench(args):
    from hpcgpu.backends import BACKEND_NAMES, backend_status, get_backend
    from hpcgpu.bench.harness import Recorder

    names = args.backend or [n for n in BACKEND_NAMES
                             if backend_status(n).usable and not (n == "cuda" and get_backend("cuda").simulated)]
    backends = [get_backend(n) for n in names]
    recorder = Recorder(args.suite)
    module = importlib.import_module(f"hpcgpu.bench.{args.suite}")
    sizes, steps = SUITE_DEFAULTS[args.suite]
    args.size = args.size or list(sizes)
    args.steps = args.steps or steps
    print(f"hpcgpu bench {args.suite}: backends {', '.join(names)}; sizes {args.size}; "
          f"dtypes {args.dtype}", file=sys.stderr)
    extra = {}
    if args.suite == "scaling":
        backends = backends[-1:]  # the fastest usable backend scales out
        extra = dict(workload=args.workload, max_workers=args.workers)
    module.run(recorder, backends, sizes=args.size, dtypes=args.dtype, steps=args.steps,
               budget_s=args.budget, **extra)
    if recorder.errors:
        print(f"hpcgpu bench: {len(recorder.errors)} case(s) failed (see the 'error' lines)", file=sys.stderr)
        return 1
    return 0


def build_parser():
    parser = argparse.ArgumentParser(
        prog="hpcgpu",
        description="Scientific workloads on GPU clusters: the same model from a laptop to many GPUs.")
    sub = parser.add_subparsers(dest="command", required=True)

    info = sub.add_parser("info", help="list backends and whether each is usable here")
    info.add_argument("--json", action="store_true", help="print one JSON object")
    info.set_defaults(handler=_info)

    run = sub.add_parser("run", help="run a workload")
    run_sub = run.add_subparsers(dest="workload", required=True)
    for name, module_path in WORKLOADS.items():
        module = importlib.import_module(module_path)
        workload = run_sub.add_parser(name, help=module.HELP, description=module.DESCRIPTION)
        module.add_arguments(workload)
        workload.set_defaults(handler=module.run)

    bench = sub.add_parser("bench", help="run benchmarks (one JSON object per result line)")
    bench.add_argument("suite", choices=SUITES, help="benchmark suite")
    bench.add_argument("workload", nargs="?", default="weather",
                       help="workload of the scaling suite (default: weather)")
    bench.add_argument("--backend", action="append", choices=("numpy", "numba", "cuda", "cupy"),
                       help="backend to measure (repeatable; default: every usable one)")
    bench.add_argument("--size", type=int, action="append",
                       help="grid points per side (per worker for scaling), or bodies for nbody; repeatable; "
                            "default 4096, scaling 2048, nbody 4096 and 16384")
    bench.add_argument("--dtype", action="append", choices=("float32", "float64"),
                       help="dtype (repeatable; default float32)")
    bench.add_argument("--steps", type=int,
                       help="diffusion steps per timed call (default 100); for scaling, steps per task K "
                            "(default 16); for nbody, force evaluations per timed call (default 10)")
    bench.add_argument("--workers", type=int, help="scaling: largest number of workers (default: cores or GPUs)")
    bench.add_argument("--budget", type=float, default=20.0,
                       help="seconds of repeats per case and backend (default 20)")
    bench.set_defaults(handler=_bench)
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


if __name__ == "__main__":
    sys.exit(main())
