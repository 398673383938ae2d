"""Client peak RSS of a run on 2 local workers with one Zarr snapshot and one checkpoint.

Issue 33's measurement: the client should hold no full-size array, so its
peak should not grow with the state. Prints one JSON line.

    python scripts/client_memory.py 4096            # weather float64, 4096 x 4096
    python scripts/client_memory.py md 1000000      # Lennard-Jones liquid, about 10^6 atoms (fcc cells)
"""

import json
import resource
import sys
import tempfile

from hpcgpu import Simulation, ZarrWriter
from hpcgpu.cluster import start_cluster
from hpcgpu.schedules import Every


def weather(n):
    """The weather model on an n x n grid, and its state's size in MB."""
    from hpcgpu.workloads.weather import ShallowWater

    model = ShallowWater("unstable_jet", nx=n, ny=n, backend="numba", dtype="float64")
    return model, 3 * n * n * 8 / 2**20


def md(atoms):
    """The Lennard-Jones liquid with at least ``atoms`` atoms (4 a cubic fcc cell), and its state's size in MB."""
    from hpcgpu.workloads.md import LennardJones

    cells = 1
    while 4 * cells ** 3 < atoms:
        cells += 1
    model = LennardJones(cells, backend="numba", dtype="float64")
    # positions, velocities, forces (3 x 8 B each), images and origins (3 x 4 B each), id, energy, virial
    return model, model.n * (9 * 8 + 6 * 4 + 8 + 8 + 8) / 2**20


def main(kind, size, steps):
    client = start_cluster(workers=2, threads_per_worker=1, gpus=False, dashboard_address="127.0.0.1:0", quiet=True)
    folder = tempfile.mkdtemp(prefix="hpcgpu-client-memory-")
    try:
        model, state_mb = weather(size) if kind == "weather" else md(size)
        sim = Simulation(model, stop_steps=steps, progress=False, client=client, partitions=2)
        sim.add_writer(ZarrWriter(f"{folder}/fields.zarr", Every(steps)))  # one snapshot past the first
        sim.run(checkpoint=f"{folder}/ckpt", checkpoint_every=steps)
        peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        print(json.dumps({"model": kind, "size": size, "state_mb": round(state_mb, 1),
                          "client_peak_rss_mb": round(peak_mb, 1)}))
        sim.close()
    finally:
        client.close()


if __name__ == "__main__":
    args = sys.argv[1:]
    kind = args.pop(0) if args and args[0] in ("weather", "md") else "weather"
    default_size, steps = (2048, 8) if kind == "weather" else (1_000_000, 4)
    main(kind, int(float(args[0])) if args else default_size, steps)
