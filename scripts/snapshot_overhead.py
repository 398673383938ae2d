"""Stepping time lost to rank-written Zarr snapshots: weather float32 on 2 local workers.

Issue 33's target: a snapshot every 50 steps costs at most 5% of the
stepping time. Runs the same steps with and without a ZarrWriter, in
turns (``--repeats`` of each, in ABBA order), on one cluster, and prints one JSON line
with each run's stepping seconds (``Simulation.run``; the writes still
queued after the last step, finished by ``close``, are not stepping) and
the median ratio.

    python scripts/snapshot_overhead.py --size 4096 --steps 200 --every 50
"""

import argparse
import json
import statistics
import tempfile
import time

from hpcgpu import Simulation, ZarrWriter
from hpcgpu.cluster import start_cluster
from hpcgpu.schedules import Every
from hpcgpu.workloads.weather import ShallowWater


def timed_run(client, size, steps, every, folder):
    model = ShallowWater("unstable_jet", nx=size, ny=size, backend="numba", dtype="float32")
    sim = Simulation(model, stop_steps=steps, progress=False, client=client, partitions=2)
    if every:
        sim.add_writer(ZarrWriter(f"{folder}/fields.zarr", Every(every)))
    sim.run(steps=1)  # placed, compiled and first epoch done: not what is compared
    started = time.perf_counter()
    sim.run()
    stepping = time.perf_counter() - started
    sim.close()  # the last snapshot's writes, after the last step: not stepping time
    return stepping


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=4096)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--every", type=int, default=50)
    parser.add_argument("--repeats", type=int, default=4)
    args = parser.parse_args()
    client = start_cluster(workers=2, threads_per_worker=1, gpus=False, dashboard_address="127.0.0.1:0", quiet=True)
    try:
        plain, written = [], []
        for repeat in range(args.repeats):
            # ABBA order: runs on one cluster drift slower one after the other (about 2 % a run here,
            # with or without snapshots), which a plain-first order would charge to the snapshots
            order = ("plain", "written") if repeat % 2 == 0 else ("written", "plain")
            for kind in order:
                if kind == "plain":
                    plain.append(timed_run(client, args.size, args.steps, 0, None))
                else:
                    written.append(timed_run(client, args.size, args.steps, args.every, tempfile.mkdtemp()))
        print(json.dumps({"size": args.size, "steps": args.steps, "every": args.every, "plain_s": plain,
                          "with_snapshots_s": written,
                          "lost_fraction": statistics.median(written) / statistics.median(plain) - 1.0}))
    finally:
        client.close()


if __name__ == "__main__":
    main()
