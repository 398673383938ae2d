"""``hpcgpu run astro``: the N-body model from the command line."""

import json
import math
import os
import sys
import time

from hpcgpu._cli_common import (add_checkpoint_arguments, add_cluster_arguments, check_run_arguments, open_client,
                                output_schedule, run_options, start)
from hpcgpu.cluster import close_client

HELP = "gravitational N-body model (astrophysics)"
DESCRIPTION = ("Run a gravitational N-body case (Kepler orbit, Plummer sphere, galaxy collision), write "
               "snapshots and diagnostics to Zarr and a PNG of the projected density.")


def add_arguments(parser):
    """Add the astro options to an argparse parser."""
    from hpcgpu.workloads.astro import CASES, INTEGRATORS, METHODS

    parser.add_argument("--case", default="galaxy_collision", choices=sorted(CASES),
                        help="initial condition (default: galaxy_collision)")
    parser.add_argument("--n", type=int, help="number of bodies (default: the case's)")
    parser.add_argument("--steps", type=int, help="time steps (default: run to the case's stop time; "
                                                  "with --resume: the checkpointed run's, or extend it to N)")
    parser.add_argument("--stop-time", type=float, help="model time to stop at (N-body units)")
    parser.add_argument("--dt", type=float, help="time step (default: the case's)")
    parser.add_argument("--softening", type=float, help="Plummer softening length (default: the case's)")
    parser.add_argument("--method", default="direct", choices=METHODS, help="force method (default direct)")
    parser.add_argument("--theta", type=float, default=0.5, help="tree opening angle (default 0.5)")
    parser.add_argument("--integrator", default="kdk", choices=INTEGRATORS,
                        help="leapfrog form: kdk (kick-drift-kick) or dkd (drift-kick-drift); default kdk")
    parser.add_argument("--backend", default="auto", help="auto, numpy, numba, cuda or cupy (default auto)")
    parser.add_argument("--dtype", default="float32", choices=("float32", "float64"))
    parser.add_argument("--seed", type=int, default=0, help="random seed of the initial conditions")
    parser.add_argument("--out", help="output directory (default: hpcgpu-output/astro-CASE)")
    parser.add_argument("--snapshots", type=int, default=8, help="snapshots written to Zarr (default 8)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_cluster_arguments(parser, "blocks of bodies (default: one per worker)")
    add_checkpoint_arguments(parser)


def run(args):
    """Run the model as the parsed ``args`` say; prints a summary; returns 0."""
    check_run_arguments(args)
    from hpcgpu.io import ZarrWriter, save_panels
    from hpcgpu.simulation import Simulation
    from hpcgpu.workloads.astro import NBody

    # A resumed run is the checkpoint's model and state (start() calls the lambda below for a new run
    # only): this command line's model would allocate a full-size state just to drop it. A new run
    # starts from the model's case: on a cluster the ranks build their own bodies, never the client.
    model = dt = steps = None
    if not args.resume:
        model = NBody(args.case, n=args.n, softening=args.softening, method=args.method, theta=args.theta,
                      integrator=args.integrator, dtype=args.dtype, backend=args.backend, seed=args.seed)
        dt = args.dt if args.dt is not None else model.case_dt
        stop_time = args.stop_time if args.stop_time is not None else model.stop_time
        steps = args.steps if args.steps is not None else max(1, math.ceil(stop_time / dt - 1e-9))
    client = open_client(args)
    sim, planned = start(args, lambda: Simulation(
        model, dt=dt, stop_steps=steps, progress=False if args.no_progress else None,
        client=client, partitions=args.partitions, grid=args.grid), client)
    model, steps, dt = sim.model, sim.stop_steps, sim.dt
    sim.diagnostics_schedule = output_schedule(planned, 200, steps)
    # a resumed run appends to its own store: named by its model, not by this command line's --case
    out = args.out or os.path.join("hpcgpu-output", f"astro-{getattr(model, 'case', args.case)}")
    os.makedirs(out, exist_ok=True)
    zarr_path = os.path.join(out, "snapshots.zarr")
    sim.add_writer(ZarrWriter(zarr_path, output_schedule(planned, args.snapshots, steps), append=bool(args.resume)))
    print(f"hpcgpu: {model!r}, dt={dt:.4g}, {steps} steps to t={steps * dt:.4g}", file=sys.stderr)
    started = time.perf_counter()
    try:
        sim.run(**run_options(args))
        final = model.to_host(sim.state)
    finally:
        if client is not None:
            sim.close()
    wall = time.perf_counter() - started
    summary = sim.summary()
    interactions = model.n * model.n if model.method == "direct" else float("nan")
    summary.update(wall_s=wall, output=os.path.abspath(out), zarr=os.path.abspath(zarr_path), n=model.n,
                   backend=model.backend.name, dtype=model.dtype.name, case=getattr(model, "case", args.case),
                   method=model.method, integrator=model.integrator,
                   interactions_per_s=interactions * summary["steps_per_s"])
    diagnostics = sim.diagnostics
    first, last = diagnostics.isel(time=0), diagnostics.isel(time=-1)
    summary["energy_relative_change"] = float((last.energy - first.energy) / abs(first.energy))
    summary["momentum_change"] = float(sum(abs(last[f"momentum_{a}"] - first[f"momentum_{a}"]) for a in "xyz"))
    summary["virial_ratio"] = float(last.virial_ratio)
    summary["lagrangian_radius_50"] = float(last.lagrangian_radius_50)
    png = os.path.join(out, "final.png")
    save_panels(png, [_density(final, (0, 1), "x", "y"), _density(final, (0, 2), "x", "z")],
                title=f"N-body, {getattr(model, 'case', args.case)}, N = {model.n}, t = {sim.time:.3g}")
    summary["png"] = os.path.abspath(png)
    with open(os.path.join(out, "summary.json"), "w") as stream:
        json.dump(summary, stream, indent=2, default=str)
    _print_summary(summary)
    close_client(client)
    return 0


def _density(state, axes, first, second):
    """Projected surface density (log10 of mass per pixel) around the bodies."""
    import numpy as np

    x, y = state.positions[axes[0]], state.positions[axes[1]]
    extent = float(np.percentile(np.abs(np.concatenate([x, y])), 97)) * 1.2 or 1.0
    histogram, _, _ = np.histogram2d(y, x, bins=256, range=[[-extent, extent], [-extent, extent]],
                                     weights=state.masses)
    with np.errstate(divide="ignore"):
        image = np.log10(histogram)
    image[~np.isfinite(image)] = np.nan
    return dict(data=image, label=f"log10 projected mass ({first}-{second} plane)",
                extent=(-extent, extent, -extent, extent), cmap="magma", xlabel=first, ylabel=second)


def _print_summary(s):
    print(f"astro/{s['case']} ({s['method']}, {s['integrator']}) on {s['backend']} ({s['dtype']}, N = {s['n']}): "
          f"{s['step']} steps to t = {s['time']:.6g} in {s['wall_s']:.2f} s wall")
    rate = s["interactions_per_s"]
    rate_text = f", {rate / 1e9:.2f} G interactions/s" if rate == rate else ""
    print(f"  speed:        {s['steps_per_s']:.1f} steps/s{rate_text} (JIT warm-up {s['warmup_s']:.2f} s, not counted)")
    print(f"  energy change:  {s['energy_relative_change']:+.3e} (relative)")
    print(f"  momentum change: {s['momentum_change']:.3e}")
    print(f"  virial ratio 2K/|W|: {s['virial_ratio']:.3f}; half-mass radius {s['lagrangian_radius_50']:.3f}")
    if s.get("executor") == "distributed":
        print(f"  cluster:      {s['workers']} workers, {s['partitions']} partitions of "
              f"{s['bodies_per_partition']} bodies")
    print(f"  output:       {s['zarr']} (xarray.open_zarr)")
    print(f"  picture:      {s['png']}")
