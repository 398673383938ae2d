"""Stepping time lost to rank-written Zarr snapshots: weather float32 on 2 local workers.

Issue 33's target: a snapshot every 50 steps costs at most 5% of the
stepping time. Runs the same steps with and without a ZarrWriter, in
turns (``--repeats`` of each, in ABBA order), on one cluster, and prints one JSON line
with each run's stepping seconds and the median ratio. ``Simulation.run``
ends by waiting for the writes still queued after the last step (the
last snapshot's); that wait is not stepping, and is given apart
(``final_flush_s``, and the ratio with it, ``lost_fraction_with_final_flush``).

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
    """``(stepping seconds, seconds of the final flush)`` of one run: ``Simulation.run`` ends by waiting for
    the writes still queued (``ZarrWriter.close``), after the last step: that wait is timed apart."""
    model = ShallowWater("unstable_jet", nx=size, ny=size, backend="numba", dtype="float32")
    sim = Simulation(model, stop_steps=steps, progress=False, client=client, partitions=2)
    flushes = []
    if every:
        writer = ZarrWriter(f"{folder}/fields.zarr", Every(every))
        close = writer.close

        def timed_close(simulation):
            started = time.perf_counter()
            close(simulation)
            flushes.append(time.perf_counter() - started)

        writer.close = timed_close
        sim.add_writer(writer)
    sim.run(steps=1)  # placed, compiled and first epoch done: not what is compared
    flushes.clear()
    started = time.perf_counter()
    sim.run()
    total = time.perf_counter() - started
    sim.close()
    return total - sum(flushes), sum(flushes)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=4096)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--every", type=int, default=50)
    parser.add_argument("--repeats", type=int, default=4)
    args = parser.parse_args()
    client = start_cluster(workers=2, threads_per_worker=1, gpus=False, dashboard_address="127.0.0.1:0", quiet=True)
    try:
        plain, written, flushes = [], [], []
        for repeat in range(args.repeats):
            # ABBA order: runs on one cluster drift slower one after the other (about 2 % a run here,
            # with or without snapshots), which a plain-first order would charge to the snapshots
            order = ("plain", "written") if repeat % 2 == 0 else ("written", "plain")
            for kind in order:
                if kind == "plain":
                    plain.append(timed_run(client, args.size, args.steps, 0, None)[0])
                else:
                    stepping, flush = timed_run(client, args.size, args.steps, args.every, tempfile.mkdtemp())
                    written.append(stepping)
                    flushes.append(flush)
        base = statistics.median(plain)
        print(json.dumps({"size": args.size, "steps": args.steps, "every": args.every, "plain_s": plain,
                          "with_snapshots_s": written, "final_flush_s": flushes,
                          "lost_fraction": statistics.median(written) / base - 1.0,
                          "lost_fraction_with_final_flush":
                              statistics.median(w + f for w, f in zip(written, flushes)) / base - 1.0}))
    finally:
        client.close()


if __name__ == "__main__":
    main()
