"""``hpcgpu bench scaling WORKLOAD``: strong and weak scaling on a dask cluster.

The model is the workload's ``"scaling"`` benchmark case
(:class:`hpcgpu.registry.BenchmarkCase`; for weather, balanced eddies
everywhere, so that every block does the same work). For 1..N workers (N:
the cores here, or the GPUs), each worker gets one core (or one GPU). Every
line names the ``workload`` and its ``model_case``; the engine's lines carry
the problem's size in the case's unit (``problem_size``) and, when the
engine splits the problem on a process grid, that grid (``grid``). Lines
(metric):

``seconds_per_step``
    wall time per time step, split by what the ranks report of their
    epochs: ``compute_s`` (the busiest rank's time outside message waits),
    ``halo_s`` (that rank's time waiting for halos and reductions) and
    ``scheduler_share`` (the share of the wall time outside the epochs:
    submitting them, scheduling, gathering the scalars);
    ``bystander_cpu_s``, the CPU seconds per step of everything of a local
    cluster that is not a rank (the client, scheduler and nannies in this
    process, and its helper processes), and ``bystander_core_share``, that over the wall time of
    the workers' cores: what it takes from the ranks where each has one core;
    ``rank_cpu_share``, the busiest rank's thread CPU time over its working
    wall time (inside epochs, outside message waits): below 1 by the share
    of its core that anything else took, the workers' own event loops and
    message threads included, which ``bystander_cpu_s`` does not see.
``parallel_efficiency``
    weak scaling (``per_worker`` x ``per_worker`` points per worker):
    t(1) / t(N); strong scaling (a fixed ``per_worker`` squared grid):
    t(1) / (N t(N)).
``parallel_efficiency`` (case ``contention-ceiling``, CPU only)
    the machine's own ceiling for the weak-scaling line: one rank's kernels
    in N plain processes side by side, the slowest over one alone (coupled
    ranks step at the slowest one's pace; ``median_efficiency`` beside it),
    no dask (:mod:`hpcgpu.bench.ceiling`). The weak line carries it as ``ceiling``
    and its own efficiency over it as ``efficiency_vs_ceiling``: what the
    engine loses, apart from what the cores lose by sharing memory.
``imbalance`` (case ``balance``)
    a mixed cluster of a worker and one ``BALANCE_SLOWDOWN`` times slower
    (emulated: it sleeps that much longer than it computes, see
    :data:`hpcgpu.partition.slowdown.SLOWDOWN_ENV`): the slowest rank's compute
    time over the fastest's, with equal blocks and with blocks sized by
    calibration (1 is perfect balance).
``speedup_vs_map_overlap``
    the same model stepped by ``dask.array.map_overlap`` once per time step
    (one graph per step, submitted and waited on; the grid in one block of
    rows per worker, each framed by one step's reach), on the same workers
    and grid, over the time per step of hpcgpu's partitioned engine: on the
    weak-scaling grid (``per_worker`` squared per worker) and on the
    strong-scaling one (``per_worker`` squared in all), field ``scaling``.

Every time is the median of ``rounds`` x ``repeats`` runs, the rounds
alternating the worker counts (each on a fresh cluster).
"""

import os
import pickle
import sys
import time
from typing import NamedTuple

import numpy as np

from hpcgpu.partition.engine import PartitionedExecutor
from hpcgpu.partition.engine import on_worker as _on_worker
from hpcgpu.partition.grid import reach_of, state_arrays

__all__ = ["run", "scaling_case", "time_engine", "median_run", "process_grid", "EngineRun"]

BALANCE_SLOWDOWN = 2.0
"""How much slower the slow worker of the ``balance`` case is."""

OVERLAP_STEPS = 8
"""Time steps per timed run of the map_overlap baseline. Its steps vary
about 2x on this VM (whether a step's fresh 100 MB find their pages mapped
already), so a run averages several."""


def _cluster(workers, gpus):
    from hpcgpu.cluster import start_cluster

    if gpus:
        return start_cluster(workers=workers, gpus=True, dashboard_address="127.0.0.1:0", quiet=True)
    return start_cluster(workers=workers, threads_per_worker=1, gpus=False, dashboard_address="127.0.0.1:0",
                         quiet=True)


def scaling_case(workload):
    """``(Workload, BenchmarkCase)``: the model ``workload`` declares for scaling (:mod:`hpcgpu.registry`).

    Raises
    ------
    ConfigError
        ``workload`` is unknown or declares no ``"scaling"`` case.
    """
    from hpcgpu import registry

    return registry.benchmark_case("scaling", workload)


def _on_grid(model):
    """Whether ``model`` runs on the distributed structured grid (``decomposition = "grid"``), which the
    map_overlap baseline, the balance case and the choice of K here need."""
    return getattr(model, "decomposition", None) == "grid"


def _steps_per_task(model, steps, partitions):
    """K on ``partitions`` blocks of a grid model: ``steps`` when the process grid the engine chooses for that K
    has blocks at least twice as wide as the frame's narrower side along every split axis, else 1 (and 1 for
    other models, which exchange every step)."""
    from hpcgpu.errors import ConfigError
    from hpcgpu.partition.grid import GridDecomposition

    if not _on_grid(model):
        return 1
    try:
        layout = GridDecomposition.build(model, 1.0, partitions, steps, None, False)
    except ConfigError:  # no process grid holds that K's frame
        return 1
    (px, py), (west, east, south, north) = layout.grid, layout.frame
    described = layout.describe()
    fits_x = px == 1 or 2 * min(west, east) <= min(described["block_cols"])
    fits_y = py == 1 or 2 * min(south, north) <= min(described["block_rows"])
    return steps if fits_x and fits_y else 1


class EngineRun(NamedTuple):
    """One timed run of the engine (:func:`time_engine`); runs sort by their time per step."""

    seconds_per_step: float
    compute_s: float          # the busiest rank's time outside message waits, per superstep
    halo_s: float             # that rank's time waiting for messages, per superstep
    scheduler_share: float    # share of the wall time outside the epochs
    bystander_cpu_s: float    # CPU seconds per step of the client, scheduler, nannies and helpers
    rank_cpu_share: float     # the busiest rank's thread CPU over its compute time
    wall_s: float             # the whole timed run
    grid: list = None         # the process grid, when the executor's describe() has one


def _split(stats, wall, supersteps):
    """Per superstep: the busiest rank's compute and message-wait time; the share of ``wall`` outside
    epochs; and the busiest rank's thread CPU time over its compute time.

    ``stats`` are the executor's ``epoch_stats`` of the timed steps: every
    rank's (seconds, seconds waiting for messages, thread CPU seconds) of
    each epoch.
    """
    compute = _rank_compute_times(stats)
    busiest = int(np.argmax(compute))
    waited = sum(epoch["ranks"][busiest][1] for epoch in stats)
    cpu = sum(epoch["ranks"][busiest][2] for epoch in stats)
    inside = max(sum(epoch["ranks"][r][0] for epoch in stats) for r in range(len(compute)))
    share = max(0.0, wall - inside) / wall
    return compute[busiest] / supersteps, waited / supersteps, share, cpu / compute[busiest]


def _mixed_cluster(slowdown):
    """Two single-threaded CPU workers, one ``slowdown`` times slower (emulated by sleeping).

    A real mixed cluster (say 2 Numba threads against 1) needs more cores
    than workers: on 2 cores the three threads share the cores and the
    "fast" worker is not faster while both run. The emulated slow worker
    sleeps instead of computing, so both run at full speed when they run.
    """
    from distributed import Client, Nanny, Scheduler, SpecCluster

    from hpcgpu.partition.slowdown import SLOWDOWN_ENV

    def worker(factor):
        env = {"NUMBA_NUM_THREADS": "1", SLOWDOWN_ENV: str(factor)}
        return {"cls": Nanny, "options": {"nthreads": 1, "env": env}}

    spec = SpecCluster(scheduler={"cls": Scheduler, "options": {"host": "127.0.0.1", "dashboard_address": ":0"}},
                       workers={"fast": worker(1.0), "slow": worker(slowdown)}, silence_logs=40)
    return Client(spec)


def _rank_compute_times(stats):
    """Compute time (outside message waits) of each rank, summed over the epochs ``stats``."""
    ranks = len(stats[0]["ranks"])
    return [sum(epoch["ranks"][r][0] - epoch["ranks"][r][1] for epoch in stats) for r in range(ranks)]


def _balance(recorder, case, per_worker, dtype, steps_per_task, supersteps):
    """Equal vs calibrated blocks on a fast + slow worker pair."""
    client = _mixed_cluster(BALANCE_SLOWDOWN)
    try:
        client.wait_for_workers(2)
        model = case.model(per_worker, dtype=dtype, backend="numba", scale=2)
        state = model.initial_state()
        dt = model.suggested_dt(state, 0.4)
        for weights in (None, "calibrate"):
            executor = PartitionedExecutor(client, model, state, dt, partitions=2, steps_per_task=steps_per_task,
                                           weights=weights, name="bench-balance")
            executor.advance(steps_per_task)
            executor.synchronize()
            done = len(executor.epoch_stats)
            executor.advance(steps_per_task * supersteps)
            executor.synchronize()
            times = _rank_compute_times(executor.epoch_stats[done:])
            cells = [b - a for a, b in executor.bounds]
            grid = process_grid(executor.describe())
            recorder.add(case="balance", backend="numba", dtype=dtype, size=per_worker, metric="imbalance",
                         value=max(times) / min(times), unit="1",
                         durations=times, weights=weights or "equal", **({} if grid is None else {"grid": grid}),
                         cells_per_partition=cells, slowdown=BALANCE_SLOWDOWN,
                         rates=getattr(executor, "rates", None) and list(executor.rates.values()))
            executor.close()
    finally:
        spec = client.cluster
        client.close()
        spec.close()


class _BystanderCPU:
    """CPU seconds of this process and its children other than the workers.

    This process holds the client and, for a local cluster, the scheduler
    and the nannies (objects on its event loop); its other children are
    multiprocessing's helpers. That is everything of a local cluster that is
    not a rank: on a machine with as many cores as workers, what it burns
    is taken from the ranks. A remote cluster's scheduler is not counted.
    """

    def __init__(self, client):
        import psutil

        workers = set(client.run(os.getpid).values())
        me = psutil.Process()
        self.processes = [me] + [p for p in me.children(recursive=True) if p.pid not in workers]

    def seconds(self):
        total = 0.0
        for process in self.processes:
            try:
                times = process.cpu_times()
            except Exception:  # noqa: BLE001 - gone or not ours: it takes nothing from the ranks now
                continue
            total += times.user + times.system
        return total


def time_engine(client, model, workers, steps_per_task, supersteps, repeats=3, *, time_step=None):
    """``repeats`` timed runs of ``supersteps`` supersteps of ``model`` split over ``workers`` partitions.

    The kernels are compiled on every worker by one untimed superstep first.

    Parameters
    ----------
    client : distributed.Client
    model
        The model (built through its workload's benchmark case).
    workers : int
        Partitions, one per worker.
    steps_per_task : int
        K, steps per exchange.
    supersteps : int
        Supersteps (of K steps) per timed run.
    repeats : int
        Timed runs.
    time_step : callable, optional
        ``time_step(model, state) -> dt`` (a benchmark case's ``dt``);
        default ``model.suggested_dt(state, 0.4)``.

    Returns
    -------
    list of EngineRun
        One per run: seconds per step, the critical compute and halo time
        per superstep, the share outside the epochs, the CPU seconds per
        step of the client, scheduler and nannies (:class:`_BystanderCPU`),
        the busiest rank's CPU share, and the process grid when the
        executor describes one.

    Examples
    --------
    >>> runs = time_engine(client, model, 2, 4, 3)  # doctest: +SKIP
    >>> median_run(runs).seconds_per_step > 0  # doctest: +SKIP
    True
    """
    state = model.initial_state()
    dt = model.suggested_dt(state, 0.4) if time_step is None else time_step(model, state)
    executor = PartitionedExecutor(client, model, state, dt, partitions=workers, steps_per_task=steps_per_task,
                                   name="bench-scaling")
    executor.advance(steps_per_task)  # compiles the kernels on every worker
    executor.synchronize()
    bystanders = _BystanderCPU(client)
    grid = process_grid(executor.describe())
    runs = []
    for _ in range(repeats):
        done = len(executor.epoch_stats)
        cpu = bystanders.seconds()
        start = time.perf_counter()
        executor.advance(steps_per_task * supersteps)
        executor.synchronize()
        wall = time.perf_counter() - start
        steps = steps_per_task * supersteps
        compute, halo, share, rank_cpu = _split(executor.epoch_stats[done:], wall, supersteps)
        runs.append(EngineRun(wall / steps, compute, halo, share, (bystanders.seconds() - cpu) / steps, rank_cpu,
                              wall, grid))
    executor.close()
    return runs


def process_grid(described):
    """The process grid an executor's ``describe()`` reports, as a list (``[px, py]``), or None when it has none.

    Read as given: ``"grid"`` (a sequence) or ``"process_grid"`` (``"4x2"``);
    all-pairs bodies report neither.

    Examples
    --------
    >>> process_grid({"grid": (4, 2)}), process_grid({"process_grid": "2x2x1"}), process_grid({"partitions": 2})
    ([4, 2], [2, 2, 1], None)
    """
    grid = described.get("grid", described.get("process_grid"))
    if grid is None:
        return None
    return [int(n) for n in (grid.split("x") if isinstance(grid, str) else grid)]


def median_run(runs):
    """The run whose time is the median (the upper one of an even count), so
    that its split belongs to the time reported.

    Examples
    --------
    >>> median_run([EngineRun(3.0, 0, 0, 0, 0, 1, 3.0), EngineRun(1.0, 0, 0, 0, 0, 1, 1.0)]).seconds_per_step
    3.0
    """
    return sorted(runs)[len(runs) // 2]


def _overlap_step(block, block_info=None, *, model_bytes, state_type, dt, starts, south_depth, periodic):
    """One step of a chunk of whole rows that ``map_overlap`` framed with the neighbours' rows (none at a wall)."""
    from hpcgpu.partition.block_region import BlockRegion

    model = _on_worker(pickle.loads(model_bytes))
    location = block_info[0]["chunk-location"][1]
    chunks = len(starts)
    ny, nx = model.shape
    south = "halo" if periodic or location > 0 else "wall"
    north = "halo" if periodic or location < chunks - 1 else "wall"
    frame = south_depth if south == "halo" else 0
    owned = (starts[location + 1] if location + 1 < chunks else ny) - starts[location]
    x_side = "wrap" if model.periodic[0] else "wall"
    where = BlockRegion(first_row=starts[location] - frame, first_col=0, rows=slice(frame, frame + owned),
                        cols=slice(0, nx), sides=(x_side, x_side, south, north), shape=(ny, nx))
    state = state_type(*(model.backend.asarray(field) for field in block))
    new = model.step_block(state, dt, 1, where)
    return np.stack([model.backend.to_host(a) for a in state_arrays(new)])


def _overlap_stepper(model, host_state, dt, chunks):
    """``(stacked, step)``: the fields of ``host_state`` stacked into a dask array of ``chunks`` blocks of whole
    rows, and ``step(array)``, one time step of such an array as a (lazy) ``map_overlap`` graph."""
    import dask.array as da

    ny, nx = model.shape
    fields = state_arrays(host_state)
    bounds = np.linspace(0, ny, chunks + 1).astype(int)
    sizes = tuple(int(b - a) for a, b in zip(bounds[:-1], bounds[1:]))
    stacked = da.from_array(np.stack(fields), chunks=(len(fields), sizes, nx))
    _, _, south, north = reach_of(model, 1)
    periodic = bool(model.periodic[1])
    # dask pads a periodic axis by the same depth on both sides: the wider one
    depth = {0: 0, 1: max(south, north) if periodic else (south, north), 2: 0}
    boundary = {0: "none", 1: "periodic" if periodic else "none", 2: "none"}
    kwargs = dict(model_bytes=pickle.dumps(model), state_type=type(host_state), dt=dt,
                  starts=[int(b) for b in bounds[:-1]], south_depth=max(south, north) if periodic else south,
                  periodic=periodic)

    def step(array):
        return array.map_overlap(_overlap_step, depth=depth, boundary=boundary, dtype=array.dtype, **kwargs)

    return stacked, step


def _time_map_overlap(client, model, workers, steps, repeats=3):
    """Seconds per step when each step is one dask.array.map_overlap graph,
    for each of ``repeats`` runs of ``steps`` steps."""
    from distributed import wait

    initial = model.initial_state()
    stacked, one_step = _overlap_stepper(model, model.to_host(initial), model.suggested_dt(initial, 0.4), workers)
    stacked = client.persist(stacked)
    wait(stacked)

    def step(array):
        out = client.persist(one_step(array))
        wait(out)
        return out

    stacked = step(stacked)  # compile and warm up
    runs = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(steps):
            stacked = step(stacked)
        runs.append((time.perf_counter() - start) / steps)
    return runs


def run(recorder, backends, *, workload, sizes=(2048,), dtypes=("float32",), steps=16, budget_s=20.0,
        max_workers=None, supersteps=3, balance=True, repeats=2, rounds=2):
    """Run the scaling suite on ``workload``'s ``"scaling"`` benchmark case (:mod:`hpcgpu.registry`).

    ``sizes`` are each worker's share in the case's unit (cells per side of
    a worker's block for a grid), ``steps`` is K where the model's halo
    allows it. Weak scaling builds the case ``workers`` times larger
    (``scale``), strong scaling one worker's size split ``workers`` ways.
    Every worker count gets a fresh cluster once per round, rounds taking the
    counts in turn (1, 2, ..., 1, 2, ...), so that a slow spell of this
    shared machine falls on both sides of a ratio rather than on one. Each
    timing is the median of ``rounds`` x ``repeats`` runs of ``supersteps``
    supersteps. A line carries ``grid``, the process grid, when the engine
    describes one. The map_overlap baseline, the balance case and the
    contention ceiling run for models on the distributed grid.

    Raises
    ------
    ConfigError
        ``workload`` declares no scaling case, or a size below its smallest.
    """
    declared, case = scaling_case(workload)
    for per_worker in sizes:
        case.check_size(per_worker)
    backend = backends[0] if backends else None
    gpus = backend is not None and backend.on_gpu and not backend.simulated
    if gpus:
        from hpcgpu._gpu_probe import probe_driver

        available = len(probe_driver().devices)
    else:
        available = len(os.sched_getaffinity(0))
    top = max(1, min(available, max_workers or available))
    if max_workers and max_workers > top:  # more workers than cores (GPUs) would measure the sharing, not scaling
        print(f"hpcgpu bench scaling: {max_workers} workers asked, {available} {'GPUs' if gpus else 'cores'} here: "
              f"scaling to {top}", file=sys.stderr)
    backend_name = "auto" if backend is None else backend.name
    counts = sorted({1, top} | ({2} if top >= 2 else set()))
    named = dict(workload=declared.name, model_case=case.name)
    for per_worker in sizes:
        for dtype in dtypes:
            timings, overlap, shapes = {}, {"weak": [], "strong": []}, {}
            for _ in range(rounds):
                for workers in counts:
                    _time_cluster(timings, overlap, shapes, case, workers, top, gpus, per_worker, dtype,
                                  backend_name, steps, supersteps, repeats)
            weak, strong = {}, {}
            for (kind, workers, k), runs in timings.items():
                median = median_run(runs)
                seconds, compute, halo, bystander = (median.seconds_per_step, median.compute_s, median.halo_s,
                                                     median.bystander_cpu_s)
                if k == steps or (kind, workers, steps) not in timings:
                    (weak if kind == "weak" else strong)[workers] = seconds
                process_grid = {} if median.grid is None else {"grid": median.grid}
                recorder.add(case=f"{kind}-scaling", backend=backend_name, dtype=dtype, size=per_worker,
                             metric="seconds_per_step", value=seconds, unit="s",
                             durations=[run.wall_s for run in runs], workers=workers, **named,
                             problem_size=shapes[(kind, workers)], **process_grid,
                             steps_per_task=k, compute_s=compute / k, halo_s=halo / k,
                             scheduler_share=median.scheduler_share, bystander_cpu_s=bystander,
                             bystander_core_share=bystander / (seconds * workers),
                             rank_cpu_share=median.rank_cpu_share)
            strong[1] = weak[1]
            for kind, engine in (("weak", weak), ("strong", strong)):
                runs = overlap[kind]
                if not runs:
                    continue  # one worker, or a model not on the distributed grid
                baseline = median_run(runs)
                recorder.add(case="map_overlap-baseline", backend=backend_name, dtype=dtype, size=per_worker,
                             metric="speedup_vs_map_overlap", value=baseline / engine[top], unit="x",
                             durations=runs, workers=top, **named, problem_size=shapes[(kind, top)], scaling=kind,
                             map_overlap_seconds_per_step=baseline, map_overlap_runs_s_per_step=runs,
                             hpcgpu_seconds_per_step=engine[top])
            on_grid = _on_grid(case.model(per_worker, dtype=dtype, backend="numpy"))
            for workers in counts[1:]:
                efficiency = weak[1] / weak[workers]
                # on CPUs, beside the machine's own ceiling and the share of it the engine reaches
                extra = _contention_ceiling(recorder, workers, per_worker, dtype, backend) if on_grid and not gpus else {}
                if extra:
                    extra["efficiency_vs_ceiling"] = efficiency / extra["ceiling"]
                recorder.add(case="weak-scaling", backend=backend_name, dtype=dtype, size=per_worker,
                             metric="parallel_efficiency", value=efficiency, unit="1",
                             durations=[weak[workers]], workers=workers, **named, **extra)
                recorder.add(case="strong-scaling", backend=backend_name, dtype=dtype, size=per_worker,
                             metric="parallel_efficiency", value=strong[1] / (workers * strong[workers]),
                             unit="1", durations=[strong[workers]], workers=workers, **named)
            if balance and on_grid and not gpus:
                k = _steps_per_task(case.model(per_worker, dtype=dtype, backend="numba"), steps, 1)
                _balance(recorder, case, per_worker, dtype, k, supersteps)
    return recorder.results


def _contention_ceiling(recorder, workers, per_worker, dtype, backend):
    """Record the machine's ceiling for weak scaling (:mod:`.ceiling`); the fields it adds to the weak line."""
    from hpcgpu.bench.ceiling import contention_efficiency

    name = backend.name if backend is not None and backend.name in ("numba", "numpy") else "numba"
    result = contention_efficiency(workers, per_worker=per_worker, dtype=dtype, backend=name)
    recorder.add(case="contention-ceiling", backend=name, dtype=dtype, size=per_worker,
                 metric="parallel_efficiency", value=result["efficiency"], unit="1",
                 durations=[1.0 / rate for rate in result["side_by_side_steps_per_s"]], workers=workers,
                 alone_steps_per_s=result["alone_steps_per_s"], median_efficiency=result["median_efficiency"],
                 side_by_side_steps_per_s=result["side_by_side_steps_per_s"])
    return {"ceiling": result["efficiency"]}


def _time_cluster(timings, overlap, shapes, case, workers, top, gpus, per_worker, dtype, backend_name, steps,
                  supersteps, repeats):
    """One round on a fresh cluster of ``workers``: adds its engine runs to
    ``timings`` (keyed by scaling kind, workers and K), the problem's size to
    ``shapes`` and, on the largest cluster, the map_overlap baseline's runs
    on the weak and strong problems to ``overlap`` (grid models only)."""
    client = _cluster(workers, gpus)
    try:
        ks, models = {}, {}
        for kind, scale in (("weak", workers), ("strong", 1)):
            if kind == "strong" and workers == 1:
                continue  # the same run as weak on one worker
            model = models[kind] = case.model(per_worker, dtype=dtype, backend=backend_name, scale=scale)
            shapes[(kind, workers)] = case.recorded_size(model, per_worker)
            k = ks[kind] = _steps_per_task(model, steps, workers)
            timings.setdefault((kind, workers, k), []).extend(
                time_engine(client, model, workers, k, supersteps, repeats, time_step=case.dt))
        if workers != top:
            return
        if ks["weak"] > 1:  # the same grid one step per exchange, as many steps: what K saves
            timings.setdefault(("weak", workers, 1), []).extend(
                time_engine(client, models["weak"], workers, 1, supersteps * ks["weak"], repeats,
                            time_step=case.dt))
        for kind, model in models.items():
            if (workers > 1 or kind == "weak") and _on_grid(model):
                overlap[kind] += _time_map_overlap(client, model, workers, max(OVERLAP_STEPS, supersteps),
                                                   repeats)
    finally:
        local = client.cluster
        client.close()
        local.close()
