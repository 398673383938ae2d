"""``hpcgpu run vorticity``: the barotropic vorticity model from the command line."""

import json
import math
import os
import sys
import time

from hpcgpu._cli_common import (add_checkpoint_arguments, add_cluster_arguments, check_run_arguments, open_client,
                                output_schedule, run_options, start)

HELP = "barotropic vorticity model on a beta plane (vorticity)"
DESCRIPTION = ("Run the barotropic vorticity model on a named case and write fields and diagnostics "
               "to Zarr plus a PNG of the final vorticity and streamfunction.")
BOUNDARIES = {"periodic": "periodic", "channel": ("periodic", "wall")}


def add_arguments(parser):
    """Add the vorticity options to an argparse parser."""
    from hpcgpu.workloads.vorticity import CASES, SOLVERS

    parser.add_argument("--case", default="rossby_wave", choices=sorted(CASES),
                        help="initial condition (default: rossby_wave)")
    parser.add_argument("--nx", type=int, help="grid points along x (default: the case's)")
    parser.add_argument("--ny", type=int, help="grid points along y (default: the case's)")
    parser.add_argument("--boundary", choices=sorted(BOUNDARIES),
                        help="doubly periodic, or a zonal channel with walls in y (default: the case's)")
    parser.add_argument("--solver", default="fft", choices=SOLVERS,
                        help="Poisson solver: fft, or Jacobi-preconditioned conjugate gradient (default fft)")
    parser.add_argument("--solver-tol", type=float, default=1e-10,
                        help="relative residual tolerance of the CG solver (default 1e-10)")
    parser.add_argument("--beta", type=float, help="beta, 1/(m s) (default: the case's)")
    parser.add_argument("--viscosity", type=float, help="Laplacian viscosity, m**2/s (default: the case's)")
    parser.add_argument("--steps", type=int, help="number of time steps (default: run to the case's stop time)")
    parser.add_argument("--stop-time", type=float, help="model time to stop at, s (default: the case's)")
    parser.add_argument("--dt", type=float, help="time step, s (default: CFL number --cfl)")
    parser.add_argument("--cfl", type=float, default=0.5, help="CFL number for the default dt (default 0.5)")
    parser.add_argument("--backend", default="auto", help="auto, numpy, numba, cuda or cupy (default auto)")
    parser.add_argument("--dtype", default="float64", choices=("float32", "float64"))
    parser.add_argument("--out", help="output directory (default: hpcgpu-output/vorticity-CASE)")
    parser.add_argument("--snapshots", type=int, default=8, help="field snapshots written to Zarr (default 8)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_cluster_arguments(parser, "blocks of whole rows, with a slab-FFT Poisson solve across them (default: one "
                                  "per worker; --solver fft)")
    add_checkpoint_arguments(parser)


def run(args):
    """Run the model as the parsed ``args`` say; prints a summary; returns 0."""
    check_run_arguments(args)
    from hpcgpu.cluster import close_client
    from hpcgpu.io import ZarrWriter, save_panels
    from hpcgpu.partition.client_gather import gathered_or_none
    from hpcgpu.simulation import Simulation
    from hpcgpu.workloads.vorticity import CASES, BarotropicVorticity

    # A resumed run is the checkpoint's model and state (start() calls the lambda below for a new run
    # only): this command line's model would allocate a full-size state just to drop it.
    model = state = dt = steps = None
    if not args.resume:
        physics = {key: value for key, value in (("beta", args.beta), ("viscosity", args.viscosity))
                   if value is not None}
        model = BarotropicVorticity(args.case, nx=args.nx, ny=args.ny, dtype=args.dtype, backend=args.backend,
                                    boundary=BOUNDARIES.get(args.boundary), solver=args.solver,
                                    solver_tol=args.solver_tol, **physics)
        state = model.initial_state()
        dt = args.dt if args.dt is not None else model.suggested_dt(state, args.cfl)
        stop_time = args.stop_time if args.stop_time is not None else CASES[args.case].stop_time
        steps = args.steps if args.steps is not None else max(1, math.ceil(stop_time / dt - 1e-9))
    client = open_client(args)
    try:
        sim, planned = start(args, lambda: Simulation(model, state, dt=dt, stop_steps=steps, client=client,
                                                      partitions=args.partitions, grid=args.grid,
                                                      progress=False if args.no_progress else None), client)
    except BaseException:
        close_client(client)
        raise
    model, steps, dt = sim.model, sim.stop_steps, sim.dt
    # outputs planned on the run as first started (on resume, the checkpoint's), and the last step
    sim.diagnostics_schedule = output_schedule(planned, 200, steps)
    # a resumed run appends to its own store: named by its model, not by this command line's --case
    out = args.out or os.path.join("hpcgpu-output", f"vorticity-{model.case}")
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
        close_client(client)
    wall = time.perf_counter() - started
    summary = sim.summary()
    summary.update(wall_s=wall, output=os.path.abspath(out), zarr=os.path.abspath(zarr_path),
                   grid=f"{model.grid.nx}x{model.grid.ny}", backend=model.backend.name, dtype=model.dtype.name,
                   case=model.case, solver=model.solver,
                   circulation=float(sim.diagnostics["circulation"].values[-1]))
    summary["png"] = None
    if final is not None:
        png = os.path.join(out, "final.png")
        g = model.grid
        extent = (0, g.Lx / 1e3, 0, g.Ly / 1e3)
        save_panels(png, [
            dict(data=model.backend.to_host(final.zeta), label="relative vorticity zeta (1/s)", extent=extent,
                 cmap="RdBu_r", symmetric=True, xlabel="x (km)", ylabel="y (km)"),
            dict(data=model.backend.to_host(final.psi), label="streamfunction psi (m2/s)", extent=extent,
                 cmap="PuOr_r", symmetric=True, xlabel="x (km)", ylabel="y (km)"),
        ], title=f"barotropic vorticity, {model.case}, t = {sim.time / 86400:.2f} days")
        summary["png"] = os.path.abspath(png)
    with open(os.path.join(out, "summary.json"), "w") as stream:
        json.dump(summary, stream, indent=2, default=str)
    _print_summary(summary)
    return 0


def _print_summary(s):
    print(f"vorticity/{s['case']} on {s['backend']} ({s['dtype']}, grid {s['grid']}, {s['solver']} solver): "
          f"{s['step']} steps to t = {s['time']:.6g} s in {s['wall_s']:.2f} s wall")
    print(f"  speed:        {s['steps_per_s']:.1f} steps/s, {s['point_updates_per_s'] / 1e6:.2f} M grid-point "
          f"updates/s (JIT warm-up {s['warmup_s']:.2f} s, not counted)")
    for key, label in (("energy", "energy"), ("enstrophy", "enstrophy")):
        value = s.get(f"{key}_relative_change")
        if value is not None:
            print(f"  {label + ' change:':<17} {value:+.3e} (relative)")
    print(f"  max CFL:      {s.get('max_cfl', float('nan')):.3f}")
    if s.get("executor") == "distributed":
        print(f"  cluster:      {s['workers']} workers, {s['partitions']} partitions of {s['block_rows']} rows, "
              f"a slab-FFT solve over {s['wavenumbers_per_rank']} x wavenumbers per rank")
    print(f"  output:       {s['zarr']} (xarray.open_zarr)")
    print(f"  picture:      {s['png'] or 'none (the state would not fit the client)'}")
