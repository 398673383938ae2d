"""``hpcgpu run md``: the Lennard-Jones fluid from the command line."""

import json
import os
import sys
import time

from hpcgpu._cli_common import (add_checkpoint_arguments, add_cluster_arguments, check_run_arguments, open_client,
                                output_schedule, run_options, start)
from hpcgpu.cluster import close_client
from hpcgpu.schedules import Every

HELP = "Lennard-Jones fluid (molecular dynamics)"
DESCRIPTION = ("Melt an fcc lattice of Lennard-Jones atoms and run NVE (velocity Verlet) or NVT (Langevin, "
               "BAOAB) molecular dynamics in reduced units; write snapshots and diagnostics to Zarr, "
               "optionally an extended-XYZ trajectory, and a PNG of g(r) and the energies.")


def add_arguments(parser):
    """Add the md options to an argparse parser."""
    from hpcgpu.workloads.md import THERMOSTATS

    parser.add_argument("--n-cells", type=int, default=10, help="fcc unit cells per side: N = 4 n^3 atoms (default 10)")
    parser.add_argument("--density", type=float, default=0.8442, help="number density, sigma^-3 (default 0.8442)")
    parser.add_argument("--temperature", type=float, default=1.44,
                        help="initial and thermostat temperature, epsilon/k_B (default 1.44)")
    parser.add_argument("--cutoff", type=float, default=2.5, help="interaction cutoff, sigma (default 2.5)")
    parser.add_argument("--skin", type=float, default=0.3, help="neighbour-list skin, sigma (default 0.3)")
    parser.add_argument("--no-shift", action="store_true",
                        help="truncate the potential without shifting it to zero at the cutoff")
    parser.add_argument("--dt", type=float, default=0.005, help="time step, tau (default 0.005)")
    # default None, filled in for a new run: with --resume only an explicit --steps extends the run
    parser.add_argument("--steps", type=int, help="time steps (default 2000; with --resume: the checkpointed "
                                                  "run's, or extend it to N)")
    parser.add_argument("--thermostat", default="none", choices=THERMOSTATS,
                        help="none: NVE velocity Verlet; langevin: NVT, BAOAB (default none)")
    parser.add_argument("--friction", type=float, default=1.0, help="Langevin friction, 1/tau (default 1)")
    parser.add_argument("--backend", default="auto", help="auto, numpy, numba, cuda or cupy (default auto)")
    parser.add_argument("--dtype", default="float64", choices=("float32", "float64"))
    parser.add_argument("--seed", type=int, default=0, help="seed of the velocities and the thermostat noise")
    parser.add_argument("--out", help="output directory (default: hpcgpu-output/md-nve or md-langevin)")
    parser.add_argument("--snapshots", type=int, default=8, help="snapshots written to Zarr (and XYZ) (default 8)")
    parser.add_argument("--xyz", action="store_true", help="also write the snapshots to trajectory.xyz (extended XYZ)")
    parser.add_argument("--rdf-samples", type=int, default=10,
                        help="states of the second half of the run averaged into g(r) (default 10)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_cluster_arguments(parser, "bricks of the box, one per partition, on the process grid of least ghost surface "
                                  "(default: one per worker)")
    add_checkpoint_arguments(parser)


def run(args):
    """Run the model as the parsed ``args`` say; prints a summary; returns 0."""
    check_run_arguments(args)
    from hpcgpu.errors import ConfigError
    from hpcgpu.workloads.md import LennardJones

    for name in ("steps", "snapshots", "rdf_samples"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            raise ConfigError(f"--{name.replace('_', '-')} must be >= 1; got {getattr(args, name)}")
    # A resumed run is the checkpoint's model and state (start() calls make() for a new run only):
    # this command line's model would allocate a full-size state just to drop it.
    model = state = None
    if not args.resume:
        model = LennardJones(args.n_cells, density=args.density, temperature=args.temperature, cutoff=args.cutoff,
                             skin=args.skin, shift=not args.no_shift, thermostat=args.thermostat,
                             friction=args.friction, dtype=args.dtype, backend=args.backend, seed=args.seed)
        state = model.initial_state()
    steps = args.steps if args.steps is not None else 2000
    client = open_client(args)
    try:
        return _run(args, model, state, steps, client)
    finally:
        close_client(client)


def _run(args, model, state, steps, client):
    import numpy as np

    from hpcgpu.io import ZarrWriter
    from hpcgpu.simulation import Simulation
    from hpcgpu.workloads.md import XYZWriter

    sim, planned = start(args, lambda: Simulation(
        model, state, dt=args.dt, stop_steps=steps, progress=False if args.no_progress else None,
        client=client, partitions=args.partitions, grid=args.grid), client)
    model, steps = sim.model, sim.stop_steps
    sim.diagnostics_schedule = output_schedule(planned, 200, steps)
    # a resumed run appends to its own outputs: named by its model, not by this command line's options
    out = args.out or os.path.join("hpcgpu-output", f"md-{model.case}")
    os.makedirs(out, exist_ok=True)
    every = output_schedule(planned, args.snapshots, steps)
    zarr_path = os.path.join(out, "snapshots.zarr")
    sim.add_writer(ZarrWriter(zarr_path, every, append=bool(args.resume)))
    xyz_path = os.path.join(out, "trajectory.xyz")
    if args.xyz:
        sim.add_writer(XYZWriter(xyz_path, every, append=bool(args.resume)))
    rdf = _RdfAverage(model, start=steps // 2)
    sim.add_callback(rdf, Every(max(1, (steps - steps // 2) // args.rdf_samples)), name="rdf")
    print(f"hpcgpu: {model!r}, dt={sim.dt:g}, {steps} steps to t={steps * sim.dt:g}", file=sys.stderr)
    started = time.perf_counter()
    try:
        sim.run(**run_options(args))
        if rdf.samples == 0:
            rdf(sim, force=True)
    finally:
        if client is not None:
            sim.close()
    wall = time.perf_counter() - started
    summary = sim.summary()
    diagnostics = sim.diagnostics
    late = diagnostics.isel(time=slice(diagnostics.sizes["time"] // 2, None))
    r, g = rdf.result()
    peak = int(np.argmax(g))
    summary.update(
        wall_s=wall, output=os.path.abspath(out), zarr=os.path.abspath(zarr_path), n=model.n,
        backend=model.backend.name, dtype=model.dtype.name, thermostat=model.thermostat, density=model.density,
        cutoff=model.cutoff, atom_steps_per_s=model.n * summary["steps_per_s"],
        temperature_mean=float(late.temperature.mean()), pressure_mean=float(late.pressure.mean()),
        pressure_tail=float(late.pressure_tail[0]),
        pressure_full_mean=float((late.pressure + late.pressure_tail).mean()),
        potential_energy_per_atom_mean=float(late.potential_energy_per_atom.mean()),
        potential_energy_full_per_atom_mean=float(late.potential_energy_full_per_atom.mean()),
        energy_tail_per_atom=float(late.energy_tail[0]) / model.n, msd=float(diagnostics.msd[-1]),
        neighbor_rebuilds=int(diagnostics.neighbor_rebuilds[-1]), rdf_samples=rdf.samples,
        rdf_peak_r=float(r[peak]), rdf_peak_g=float(g[peak]))
    if args.xyz:
        summary["xyz"] = os.path.abspath(xyz_path)
    png = os.path.join(out, "md.png")
    _plot(png, model, diagnostics, r, g, rdf.samples)
    summary["png"] = os.path.abspath(png)
    with open(os.path.join(out, "summary.json"), "w") as stream:
        json.dump(summary, stream, indent=2, default=str)
    _print_summary(summary, model.shift)
    return 0


class _RdfAverage:
    """A callback that averages g(r) over the states it sees from step ``start`` on.

    Each g(r) is reduced on the run's ranks (:func:`hpcgpu.workloads.md.run_rdf`): no atom reaches the client.
    """

    def __init__(self, model, start, bins=100):
        self.model = model
        self.start = start
        self.bins = bins
        self.samples = 0
        self.r = None
        self.total = None

    def __call__(self, simulation, force=False):
        if simulation.step < self.start and not force:
            return
        from hpcgpu.workloads.md import run_rdf

        self.r, g = run_rdf(simulation, bins=self.bins)
        self.total = g if self.total is None else self.total + g
        self.samples += 1

    def result(self):
        return self.r, self.total / max(self.samples, 1)


def _plot(path, model, diagnostics, r, g, samples):
    """g(r), the energies per atom, and temperature and pressure, stacked."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    n = model.n
    t = diagnostics.time.values
    fig, axes = plt.subplots(3, 1, figsize=(8, 10), constrained_layout=True)
    axes[0].plot(r, g, color="k")
    axes[0].axhline(1.0, color="0.6", lw=0.8)
    axes[0].set(xlabel="r (sigma)", ylabel="g(r)", title=f"radial distribution function ({samples} states)")
    for key, label in (("kinetic_energy", "kinetic"), ("potential_energy", "potential"), ("energy", "total")):
        axes[1].plot(t, diagnostics[key].values / n, label=label)
    axes[1].set(xlabel="time (tau)", ylabel="energy per atom (epsilon)", title="energies")
    axes[1].legend()
    axes[2].plot(t, diagnostics.temperature.values, label="temperature")
    axes[2].plot(t, diagnostics.pressure.values, label="pressure (virial, no tail)")
    axes[2].set(xlabel="time (tau)", ylabel="reduced units", title="temperature and pressure")
    axes[2].legend()
    fig.suptitle(f"Lennard-Jones fluid, N = {n}, density {model.density:.4g}, "
                 f"{'NVE' if model.thermostat == 'none' else 'NVT (Langevin)'}")
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _print_summary(s, shift=True):
    print(f"md/{s['thermostat']} on {s['backend']} ({s['dtype']}, N = {s['n']}, density {s['density']:.4g}): "
          f"{s['step']} steps to t = {s['time']:.6g} in {s['wall_s']:.2f} s wall")
    print(f"  speed:          {s['steps_per_s']:.1f} steps/s, {s['atom_steps_per_s']:.3g} atom-steps/s "
          f"(JIT warm-up {s['warmup_s']:.2f} s, not counted)")
    if s["thermostat"] == "none":
        print(f"  energy change:  {s['energy_relative_change']:+.3e} (relative)")
    else:
        print(f"  energy change:  {s['energy_relative_change']:+.3e} (relative; the thermostat exchanges energy)")
    # the simulated potential's U/N and P beside the full potential's estimates (what tables of the
    # fluid give): the tail alone is not the difference when the potential is shifted
    simulated = "shifted" if shift else "truncated"
    print(f"  second half:    T = {s['temperature_mean']:.4f}; U/N = {s['potential_energy_per_atom_mean']:.4f} "
          f"({simulated} at the cutoff), {s['potential_energy_full_per_atom_mean']:.4f} (full potential)")
    print(f"                  P = {s['pressure_mean']:.4f} (virial, {simulated}), {s['pressure_full_mean']:.4f} "
          f"(full potential: with the tail {s['pressure_tail']:+.4f})")
    print(f"  structure:      g(r) peak {s['rdf_peak_g']:.2f} at r = {s['rdf_peak_r']:.3f}; MSD {s['msd']:.3f} sigma^2")
    print(f"  neighbour list: {s['neighbor_rebuilds']} builds in {s['step']} steps")
    if s.get("executor") == "distributed":
        grid = s.get("process_grid", "")
        print(f"  cluster:        {s['workers']} workers, {s['partitions']} bricks ({grid}) holding "
              f"{s['atoms_per_partition']} atoms at the start")
    print(f"  output:         {s['zarr']} (xarray.open_zarr)")
    if "xyz" in s:
        print(f"  trajectory:     {s['xyz']} (extended XYZ)")
    print(f"  picture:        {s['png']}")
