"""``hpcgpu bench soak``: a model on a cluster while workers are killed at random.

Not a CI test: a benchmark of resilience an operator runs for minutes or
hours. A local cluster of two worker processes (or the cluster at
``--scheduler``) runs the ``"soak"`` benchmark case of a workload
(:class:`hpcgpu.registry.BenchmarkCase`; hpcgpu's own: the weather model)
with checkpoints; a
background thread SIGKILLs a random worker process every ``kill_every``
seconds (the nanny restarts it, as a batch system would replace a node).
The run survives from its last checkpoint each time. At the end the final
state is compared with an undisturbed single-process run of the same steps,
and one JSON line reports steps done, restarts, steps redone, wall time and
the time lost to failures, and whether the states match bitwise.
"""

import json
import os
import random
import signal
import tempfile
import threading
import time
import warnings

import dask
import numpy as np

__all__ = ["run_soak"]


def _killer(client, every, stop, killed, rng):
    """Kill a random worker process every ``every`` seconds until ``stop`` is set."""
    while not stop.wait(every):
        try:
            pids = client.run(os.getpid)
        except Exception:  # noqa: BLE001 - a worker is restarting: try again next time
            continue
        if len(pids) < 2:
            continue  # never kill the last worker standing
        address = rng.choice(sorted(pids))
        try:
            # the worker kills itself, on its own host: its pid means nothing on this one (a cluster at
            # --scheduler), where os.kill would hit an unrelated local process of that number, or none
            client.run(_kill_this_process, workers=[address], wait=False)
            killed.append({"address": address, "pid": pids[address], "at_s": time.perf_counter()})
        except Exception:  # noqa: BLE001 - the worker went away first: try again next time
            pass


async def _kill_this_process():
    # a coroutine: Client.run sends it without waiting for a reply only then (wait=False)
    os.kill(os.getpid(), signal.SIGKILL)


def run_soak(minutes, *, client=None, kill_every=None, workload=None, size=None, backend="numba", seed=0,
             stream=None):
    """Soak the engine for about ``minutes``; returns (and prints) the report dict.

    Parameters
    ----------
    minutes : float
        Wall-clock length of the disturbed run (> 0).
    client : distributed.Client, optional
        Default: a new local cluster of two single-threaded worker processes.
    kill_every : float, optional
        Seconds between kills (default: a quarter of the run, at least 10 s).
    workload : str, optional
        A workload that declares a ``"soak"`` benchmark case; default the
        first registered one (hpcgpu's own: weather).
    size : int or tuple of int, optional
        The case's size (default the case's own).
    backend : str
    seed : int
        Seed of the choice of worker to kill.
    stream : file, optional
        Where to print the report as one JSON line.

    Examples
    --------
    >>> report = run_soak(0.1, kill_every=2.5, size=128)  # doctest: +SKIP
    >>> report["final_state_matches_reference"]  # doctest: +SKIP
    True
    """
    from hpcgpu import registry
    from hpcgpu.cluster import close_client, start_cluster
    from hpcgpu.simulation import Simulation
    from hpcgpu.validation import check_float

    minutes = check_float("minutes", minutes, minimum=0.0, strict_min=True)
    seconds = 60.0 * minutes
    kill_every = max(10.0, seconds / 4) if kill_every is None else check_float(
        "kill_every", kill_every, minimum=0.0, strict_min=True)
    declared, case = registry.benchmark_case("soak", workload)  # before a cluster starts: a typo costs no waiting
    size = case.check_size(case.size if size is None else size)
    own = client is None
    if own:
        client = start_cluster(workers=2, threads_per_worker=1, gpus=False, dashboard_address="127.0.0.1:0", quiet=True)
    try:
        model = case.model(size, backend=backend)
        dt = case.dt(model, model.initial_state())
        probe = Simulation(model, dt=dt, stop_steps=100, progress=False, client=client, partitions=2,
                           steps_per_task=4).run(steps=20)  # compile and place, then time the rest
        begun = time.perf_counter()
        probe.run()
        rate = 80 / (time.perf_counter() - begun)
        probe.close()
        steps = max(40, int(rate * seconds * 0.8) // 4 * 4)
        stop, killed = threading.Event(), []
        with tempfile.TemporaryDirectory(prefix="hpcgpu-soak-") as path:
            sim = Simulation(model, dt=dt, stop_steps=steps, progress=False, client=client, partitions=2,
                             steps_per_task=4)
            killer = threading.Thread(target=_killer, args=(client, kill_every, stop, killed, random.Random(seed)),
                                      daemon=True)
            started = time.perf_counter()
            killer.start()
            try:
                # A local cluster closes a nanny for good when no worker of its
                # name is back lost-worker-timeout (15 s) after a loss; kills
                # 10 s apart can land in that window and shrink the cluster.
                with warnings.catch_warnings(), dask.config.set({"distributed.deploy.lost-worker-timeout": "1h"}):
                    warnings.simplefilter("ignore", RuntimeWarning)
                    sim.run(checkpoint=path, checkpoint_every=max(4, steps // 20 // 4 * 4))
            finally:
                stop.set()
                killer.join()
            wall = time.perf_counter() - started
            final = sim.state
            sim.close()
        reference = Simulation(model, dt=dt, stop_steps=steps, progress=False).run()
        matches = all(np.array_equal(model.backend.to_host(a), model.backend.to_host(b))
                      for a, b in zip(final.arrays(), reference.state.arrays(), strict=True))
        redone = sum(r["steps_lost"] for r in sim.restarts)
        report = {"suite": "soak", "workload": declared.name, "case": case.name, "backend": backend,
                  "size": case.recorded_size(model, size), "minutes": minutes,
                  "steps": sim.step, "kills": len(killed), "restarts": len(sim.restarts), "steps_redone": redone,
                  "wall_s": wall, "time_lost_s": redone / rate if rate > 0 else None,
                  "undisturbed_estimate_s": steps / rate if rate > 0 else None,
                  "final_state_matches_reference": bool(matches)}
        print(json.dumps(report), file=stream, flush=True)
        return report
    finally:
        if own:
            close_client(client)
