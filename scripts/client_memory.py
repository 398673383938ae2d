"""Client peak RSS of a weather float64 run on 2 local workers with one Zarr snapshot and one checkpoint.

Issue 33's measurement: the client should hold no full-size array, so its
peak should not grow with the grid. Prints one JSON line.

    python scripts/client_memory.py 4096
"""

import json
import resource
import sys
import tempfile

from hpcgpu import Simulation, ZarrWriter
from hpcgpu.cluster import start_cluster
from hpcgpu.schedules import Every
from hpcgpu.workloads.weather import ShallowWater


def main(n, steps=8):
    client = start_cluster(workers=2, threads_per_worker=1, gpus=False, dashboard_address="127.0.0.1:0", quiet=True)
    folder = tempfile.mkdtemp(prefix="hpcgpu-client-memory-")
    try:
        model = ShallowWater("unstable_jet", nx=n, ny=n, backend="numba", dtype="float64")
        sim = Simulation(model, stop_steps=steps, progress=False, client=client, partitions=2)
        sim.add_writer(ZarrWriter(f"{folder}/fields.zarr", Every(steps)))  # one snapshot past the first
        sim.run(checkpoint=f"{folder}/ckpt", checkpoint_every=steps)
        state_mb = 3 * n * n * 8 / 2**20
        peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        print(json.dumps({"grid": n, "state_mb": round(state_mb, 1), "client_peak_rss_mb": round(peak_mb, 1)}))
        sim.close()
    finally:
        client.close()


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 2048)
