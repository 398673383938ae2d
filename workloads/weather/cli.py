"""``hpcgpu run weather``: the shallow-water model from the command line."""

import json
import math
import os
import sys
import time

from hpcgpu._cli_common import (add_checkpoint_arguments, add_cluster_arguments, check_run_arguments, open_client,
                                output_schedule, parse_weights, run_options, start)
from hpcgpu.cluster import close_client
from hpcgpu.partition.client_gather import gathered_or_none

HELP = "rotating shallow-water model (weather)"
DESCRIPTION = ("Run the rotating shallow-water model on a named case and write fields and "
               "diagnostics to Zarr plus a PNG of the final height and vorticity.")


def add_arguments(parser):
    """Add the weather options to an argparse parser."""
    from hpcgpu.workloads.weather import CASES

    parser.add_argument("--case", default="unstable_jet", choices=sorted(CASES),
                        help="initial condition (default: unstable_jet)")
    parser.add_argument("--nx", type=int, help="cells along x (default: the case's)")
    parser.add_argument("--ny", type=int, help="cells along y (default: the case's)")
    parser.add_argument("--steps", type=int, help="number of time steps (default: run to the case's stop time; "
                                                   "with --resume: the checkpointed run's, or extend it to N)")
    parser.add_argument("--stop-time", type=float, help="model time to stop at, s (default: the case's)")
    parser.add_argument("--dt", type=float, help="time step, s (default: CFL number --cfl)")
    parser.add_argument("--cfl", type=float, default=0.5, help="CFL number for the default dt (default 0.5)")
    parser.add_argument("--backend", default="auto", help="auto, numpy, numba, cuda or cupy (default auto)")
    parser.add_argument("--dtype", default="float64", choices=("float32", "float64"))
    parser.add_argument("--out", help="output directory (default: hpcgpu-output/weather-CASE)")
    parser.add_argument("--snapshots", type=int, default=8, help="field snapshots written to Zarr (default 8)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument("--energy-budget", action="store_true",
                        help="integrate the viscous dissipation every step and report the energy budget (the "
                             "change, the dissipation, their difference); slower: Numba steps by three stage "
                             "passes instead of its fused step (about 4x at the default size)")
    cluster = add_cluster_arguments(parser, "blocks of the state on a process grid (default: one per worker)")
    cluster.add_argument("--steps-per-task", type=int,
                         help="time steps per task, K (default: the largest of 16, 8, 4, 2, 1 whose halo is at "
                              "most a quarter of a partition)")
    cluster.add_argument("--weights", help="'calibrate' or comma-separated partition weights")
    add_checkpoint_arguments(parser)


def run(args):
    """Run the model as the parsed ``args`` say; prints a summary; returns 0."""
    check_run_arguments(args)
    from hpcgpu.io import ZarrWriter, save_panels
    from hpcgpu.simulation import Simulation
    from hpcgpu.workloads.weather import CASES, ShallowWater

    weights = parse_weights(args.weights)  # before a cluster is started: a typo is an error, not a traceback
    # A resumed run is the checkpoint's model and state (start() calls the lambda below for a new run
    # only): this command line's model would allocate a full-size state just to drop it.
    model = state = dt = steps = None
    if not args.resume:
        model = ShallowWater(args.case, nx=args.nx, ny=args.ny, dtype=args.dtype, backend=args.backend,
                             energy_budget=args.energy_budget)
        state = model.initial_state()
        dt = args.dt if args.dt is not None else model.suggested_dt(state, args.cfl)
        stop_time = args.stop_time if args.stop_time is not None else CASES[args.case].stop_time
        steps = args.steps if args.steps is not None else max(1, math.ceil(stop_time / dt - 1e-9))
    client = open_client(args)
    # K (steps per task) defaults in the engine; outputs do not round to it, so that the steps
    # written are the same on any number of workers (the engine splits a task at any step)
    sim, planned = start(args, lambda: Simulation(
        model, state, dt=dt, stop_steps=steps, progress=False if args.no_progress else None,
        client=client, partitions=args.partitions, steps_per_task=args.steps_per_task, weights=weights,
        grid=args.grid), client,
        steps_per_task=args.steps_per_task, weights=weights)
    model, steps, dt = sim.model, sim.stop_steps, sim.dt
    # diagnostics every multiple of 16, the largest default K (auto_grid_steps picks 16, 8, 4, 2 or 1),
    # once they are 16 or more steps apart: on any worker count they then split no task (an extra halo exchange)
    sim.diagnostics_schedule = output_schedule(planned, 200, steps, align=16)
    # a resumed run appends to its own store: named by its model, not by this command line's --case
    out = args.out or os.path.join("hpcgpu-output", f"weather-{model.case}")
    os.makedirs(out, exist_ok=True)
    zarr_path = os.path.join(out, "fields.zarr")
    sim.add_writer(ZarrWriter(zarr_path, output_schedule(planned, args.snapshots, steps), append=bool(args.resume)))
    print(f"hpcgpu: {model!r}, dt={dt:.4g} s, steps {sim.step} to {steps}, t={steps * dt:.4g} s", file=sys.stderr)
    started = time.perf_counter()
    try:
        sim.run(**run_options(args))
        # gathered once from a cluster, for the picture (none when it would not fit the client)
        final = gathered_or_none(sim, "picture")
    finally:
        if client is not None:
            sim.close()
    wall = time.perf_counter() - started
    summary = sim.summary()
    summary.update(_energy_budget(sim.diagnostics))
    summary.update(wall_s=wall, output=os.path.abspath(out), zarr=os.path.abspath(zarr_path),
                   grid=f"{model.grid.nx}x{model.grid.ny}", backend=model.backend.name, dtype=model.dtype.name,
                   case=getattr(model, "case", args.case))
    summary["png"] = None
    if final is not None:
        png = os.path.join(out, "final.png")
        g = model.grid
        extent = (0, g.Lx / 1e3, 0, g.Ly / 1e3)
        save_panels(png, [
            dict(data=model.backend.to_host(final.h), label="layer depth h (m)", extent=extent,
                 xlabel="x (km)", ylabel="y (km)"),
            dict(data=model.vorticity(final), label="relative vorticity (1/s)", extent=extent,
                 cmap="RdBu_r", symmetric=True, xlabel="x (km)", ylabel="y (km)"),
        ], title=f"shallow water, {summary['case']}, t = {sim.time / 3600:.1f} h")
        summary["png"] = os.path.abspath(png)
    with open(os.path.join(out, "summary.json"), "w") as stream:
        json.dump(summary, stream, indent=2, default=str)
    _print_summary(summary)
    close_client(client)
    return 0


def _energy_budget(diagnostics):
    """The run's energy budget (m5 s-2) from its diagnostics: the change, the viscous dissipation and their
    difference, the time scheme's error (the spatial scheme conserves energy). Empty without a budget."""
    if "energy_dissipated" not in diagnostics:
        return {}
    energy, dissipated = diagnostics["energy"].values, diagnostics["energy_dissipated"].values
    change, removed = float(energy[-1] - energy[0]), float(dissipated[-1] - dissipated[0])
    error = change + removed
    return {"energy_change": change, "energy_dissipated": removed, "energy_budget_error": error,
            "energy_budget_error_relative": error / abs(float(energy[0])) if energy[0] else float("nan")}


def _print_summary(s):
    print(f"weather/{s['case']} on {s['backend']} ({s['dtype']}, grid {s['grid']}): "
          f"{s['step']} steps to t = {s['time']:.6g} s in {s['wall_s']:.2f} s wall")
    print(f"  speed:        {s['steps_per_s']:.1f} steps/s, {s['point_updates_per_s'] / 1e6:.1f} M grid-point updates/s "
          f"(JIT warm-up {s['warmup_s']:.2f} s, not counted)")
    # only mass is conserved: viscosity removes energy and enstrophy, so their changes are no errors;
    # the energy budget tells the scheme's error apart from the dissipation
    for key, label, note in (("mass", "mass", "relative; conserved"),
                             ("energy", "energy", "relative; viscosity removes energy"),
                             ("enstrophy", "potential enstrophy", "relative; viscosity changes it")):
        value = s.get(f"{key}_relative_change")
        if value is not None:
            print(f"  {label + ' change:':<27} {value:+.3e} ({note})")
    if "energy_budget_error" in s:
        share = abs(s["energy_budget_error"] / s["energy_change"]) if s["energy_change"] else float("nan")
        print(f"  {'energy budget:':<27} change {s['energy_change']:+.4e} m5/s2, viscous dissipation "
              f"{s['energy_dissipated']:.4e}, their difference {s['energy_budget_error']:+.3e} "
              f"(the time scheme's error: {share:.2%} of the change)")
    print(f"  max CFL:      {s.get('max_cfl', float('nan')):.3f}")
    if s.get("executor") == "distributed":
        print(f"  cluster:      {s['workers']} workers, {s['partitions']} partitions on a {s['process_grid']} process "
              f"grid (blocks of {s['block_rows']} rows x {s['block_cols']} columns), {s['steps_per_task']} steps per "
              "task")
    print(f"  output:       {s['zarr']} (xarray.open_zarr)")
    print(f"  picture:      {s['png'] or 'none (the state would not fit the client)'}")
