"""Partitioned execution on a dask cluster: the engine shared by grids, bodies and slabs.

This module holds what every decomposition shares (resident blocks, task
submission ahead of the compute, scalar-only diagnostics, lost workers)
and :func:`DistributedExecutor`, which picks the decomposition:
:mod:`hpcgpu.rows` (grid row blocks), :mod:`hpcgpu.bodies` (all-pairs
particles) and :mod:`hpcgpu.domains` (short-range particles in slabs).
For grids:

The state is split into P blocks of rows that stay on the workers between
supersteps (CuPy arrays on GPU workers). A superstep submits, for each block,
one task that advances it K time steps; before it, two small tasks cut the
rows its neighbours need (``halo_rows(K)`` wide) where those neighbours live,
so only halos move between workers. The client holds futures only: it never
gathers the state while stepping. Diagnostics and stability checks are
reduced on the workers and only scalars travel, without stalling the
pipeline: their results are read when they are ready. Supersteps are
submitted ahead, so the scheduler's latency overlaps the compute.

Larger K means fewer scheduler round trips per step (what lets a task graph
keep up with MPI codes) and more redundant work in the halos; without a K
of its own a row model gets :func:`hpcgpu.rows.auto_steps_per_task`. Results equal the
single-block run bitwise: every point is computed by the same operations,
only the open edges differ and they are cut away.

A model plugs in by its ``decomposition``:

``"rows"`` (grids; :class:`hpcgpu.rows.RowExecutor`)
    ``decomposition_size``, ``periodic_rows``, ``halo_rows``,
    ``advance_rows``, ``assemble_rows``, ``row_view`` (see :class:`hpcgpu.workloads.weather.ShallowWater`);
``"bodies"`` (all-pairs particles; :class:`hpcgpu.bodies.BodyExecutor`)
    ``decomposition_size``, ``drift_block``, ``block_positions``,
    ``kick_block`` (see :class:`hpcgpu.workloads.astro.NBody`);
``"domains"`` (short-range particles; :class:`hpcgpu.domains.DomainExecutor`)
    see :mod:`hpcgpu.domains`;

and for all ``take_block``, ``concat_blocks``, ``to_host``,
``block_sums``/``combine_sums`` and ``block_health``/``combine_health``.
"""

import functools
import os
import time
import uuid
from collections import deque

import numpy as np

from hpcgpu.cluster import worker_info
from hpcgpu.errors import ClusterError, ConfigError
from hpcgpu.validation import check_int

__all__ = ["DistributedExecutor", "split_rows"]

_ROW_NAMES = ("RowExecutor", "auto_steps_per_task", "calibrate_workers")


def __getattr__(name):
    # the row engine lives in hpcgpu.rows (it imports this module); its public
    # names stay reachable from here
    if name in _ROW_NAMES:
        from hpcgpu import rows

        return getattr(rows, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

# Seconds to wait for results before calling a cluster stuck.
RESULT_TIMEOUT_S = 600.0
# Dask priority of the tasks that cut halos from a block (higher runs first;
# advances have the default 0).
CUT_PRIORITY = 10
# Supersteps submitted ahead of the oldest unfinished one: enough to hide the
# scheduler's latency, few enough to bound memory and wall-time overshoot.
MAX_AHEAD = 4


def split_rows(rows, weights, minimum=1):
    """Split ``rows`` into contiguous blocks proportional to ``weights``.

    Largest-remainder rounding, so each block is within one row of its exact
    share. A block whose share is below ``minimum`` (the halo a block must
    be able to give its neighbour) gets ``minimum`` and the others share the
    rest in proportion. Raises ConfigError when the blocks cannot all hold
    ``minimum`` rows.

    Examples
    --------
    >>> split_rows(10, [3, 1])
    [(0, 8), (8, 10)]
    >>> split_rows(100, [1, 100], minimum=12)
    [(0, 12), (12, 100)]
    """
    weights = np.asarray(weights, dtype=float)
    if weights.ndim != 1 or len(weights) == 0 or not np.all(weights > 0) or not np.all(np.isfinite(weights)):
        raise ConfigError(f"weights must be positive finite numbers, one per partition; got {weights.tolist()}")
    count = len(weights)
    if count * minimum > rows:
        raise ConfigError(
            f"partitions={count} needs at least {count * minimum} rows ({minimum} per block for the halo) "
            f"but the grid has {rows}; use at most {rows // minimum} partitions or fewer steps_per_task")
    sizes = np.zeros(count, dtype=int)
    fixed = np.zeros(count, dtype=bool)
    while True:
        free = rows - sizes[fixed].sum()
        exact = np.where(fixed, 0.0, free * weights / weights[~fixed].sum())
        share = np.floor(exact).astype(int)
        order = [i for i in np.argsort(-(exact - share), kind="stable") if not fixed[i]]
        for index in order[: free - share[~fixed].sum()]:
            share[index] += 1
        small = ~fixed & (share < minimum)
        if not small.any():
            sizes[~fixed] = share[~fixed]
            break
        sizes[small] = minimum
        fixed |= small
    bounds = np.concatenate([[0], np.cumsum(sizes)])
    return [(int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:])]


# -- tasks: module-level functions, so they pickle by reference ---------------

@functools.lru_cache(maxsize=8)
def _resolved(model_bytes):
    import pickle

    model = pickle.loads(model_bytes)
    # "auto" resolves on the worker's own hardware (its GPU, or Numba).
    if getattr(model, "backend_request", None) == "auto":
        model = model.with_backend("auto")
    return model


def _on_worker(model):
    import pickle

    return _resolved(pickle.dumps(model))



SLOWDOWN_ENV = "HPCGPU_EMULATE_SLOWDOWN"
"""Environment variable (benchmarks and tests only): a worker started with it
set to a factor f > 1 sleeps ``(f - 1)`` times the compute time after each
row-block advance and calibration step, so it behaves like a device f times
slower without taking CPU from the others. ``hpcgpu bench scaling`` uses it
for its mixed-cluster balance case on machines without mixed devices."""


def _emulate_slowdown(started):
    """Sleep so that the work begun at ``started`` took SLOWDOWN_ENV times as long."""
    factor = float(os.environ.get(SLOWDOWN_ENV, "1") or 1)
    if factor > 1:
        time.sleep((factor - 1.0) * (time.perf_counter() - started))


def _block_sums(model, block, start, south):
    model = _on_worker(model)
    return model.block_sums(model.concat_blocks([block]), start, south)


def _block_health(model, block):
    model = _on_worker(model)
    return model.block_health(model.concat_blocks([block]))


def _to_host(model, block):
    return _on_worker(model).to_host(block)


# Blocks that hold the model state beside other things (a ``.state`` attribute):
# particle blocks keep their next drifted step, MD slabs their send lists too.

def _held_sums(model, block, start, extra):
    return _block_sums(model, block.state, start, extra)


def _held_health(model, block):
    return _block_health(model, block.state)


def _held_to_host(model, block):
    return _to_host(model, block.state)


def DistributedExecutor(client, model, state, dt, **kwargs):
    """The executor for ``model``'s decomposition on a dask cluster.

    ``model.decomposition`` is ``"rows"`` (blocks of grid rows with halo
    exchange: :class:`hpcgpu.rows.RowExecutor`), ``"bodies"`` (blocks of particles
    that need every position each step: :class:`BodyExecutor`) or
    ``"domains"`` (slabs of space with ghost atoms and migration, for
    short-range particles: :class:`hpcgpu.domains.DomainExecutor`). Keyword
    arguments are those of :class:`_PartitionedExecutor`.
    """
    kind = getattr(model, "decomposition", "rows")
    if kind == "rows":
        from hpcgpu.rows import RowExecutor

        return RowExecutor(client, model, state, dt, **kwargs)
    if kind == "bodies":
        from hpcgpu.bodies import BodyExecutor

        return BodyExecutor(client, model, state, dt, **kwargs)
    if kind == "domains":
        from hpcgpu.domains import DomainExecutor

        return DomainExecutor(client, model, state, dt, **kwargs)
    raise ConfigError(f"model decomposition must be 'rows', 'bodies' or 'domains'; got {kind!r}")


class _PartitionedExecutor:
    """Blocks of a model's state resident on dask workers (base of the executors).

    Parameters
    ----------
    client : distributed.Client
    model
        A model with the row-decomposition methods listed in the module doc.
    state
        Initial global state (on the client; it is split and scattered once).
    dt : float
    partitions : int, optional
        Number of row blocks P (default: one per worker).
    steps_per_task : int, optional
        Time steps K per task (default: :func:`hpcgpu.rows.auto_steps_per_task` for
        grids, 1 for particles).
    weights : sequence of float or "calibrate", optional
        Relative block sizes, one per partition, or ``"calibrate"`` to size
        blocks by each worker's measured step rate.
    name : str
        Run name (dashboard span and task keys).

    Raises
    ------
    ConfigError
        P larger than the grid allows or a halo wider than a block.
    ClusterError
        The cluster has no workers.
    """

    def __init__(self, client, model, state, dt, *, partitions=None, steps_per_task=None, weights=None,
                 name="run"):
        self.client = client
        self.model = model
        self.dt = dt
        self.name = name
        workers = sorted(worker_info(client))
        if not workers:
            raise ClusterError("the dask cluster has no workers")
        self.workers = workers
        partitions = len(workers) if partitions is None else check_int("partitions", partitions, minimum=1)
        if steps_per_task is None:
            self.steps_per_task = self._default_steps_per_task(model, partitions)
        else:
            self.steps_per_task = check_int("steps_per_task", steps_per_task, minimum=1)
        rows = model.decomposition_size()
        if partitions > rows:
            raise ConfigError(f"partitions must be <= {rows} (the {self.unit} of the model); got {partitions}")
        self._check_steps_per_task()
        self.owner = [workers[p % len(workers)] for p in range(partitions)]
        if weights is None:
            weights = [1.0] * partitions
        elif isinstance(weights, str):
            if weights != "calibrate":
                raise ConfigError(f"weights must be a sequence of numbers or 'calibrate'; got {weights!r}")
            rates = self._calibrate(client, model)
            self.rates = rates
            weights = self._weights_from_rates([rates[w] for w in self.owner])
        elif len(weights) != partitions:
            raise ConfigError(f"weights must have one entry per partition ({partitions}); got {len(weights)}")
        self.weights = [float(w) for w in weights]
        self._layout(partitions)
        self.token = uuid.uuid4().hex[:12]
        self.superstep = 0
        self.step = 0
        self._model = client.scatter(model, broadcast=True, hash=False)
        self.blocks = [client.scatter(block, workers=[w], hash=False)
                       for block, w in zip(self._split(model.to_host(state)), self.owner)]
        self._pending = []
        self._in_flight = deque()

    def _layout(self, partitions):
        """Decide what each partition holds (sets ``self.bounds``)."""
        rows = self.model.decomposition_size()
        self.bounds = split_rows(rows, self.weights, self._minimum_block(partitions))

    def _split(self, host_state):
        """The initial blocks, one per partition, from the global state on the host."""
        return [self.model.take_block(host_state, a, b) for a, b in self.bounds]

    @property
    def partitions(self):
        return len(self.owner)

    @property
    def granularity(self):
        """Steps per task: the driver aligns its default schedules to it."""
        return self.steps_per_task

    def _key(self, phase, *index):
        return (f"{self.model.name}-{phase}-{self.token}", *index)

    def _submit(self, function, *args, key, worker):
        return self.client.submit(function, *args, key=key, workers=[worker], allow_other_workers=True,
                                  pure=False)

    def _submit_cut(self, function, *args, key, worker):
        """A small task that reads a resident block: on the block's worker only, before anything else.

        Run anywhere else it would first move the whole block there (seen: a
        25 MB transfer to cut 48 rows, while the owner was busy); its high
        priority puts it ahead of the owner's next advance, which it would
        otherwise wait behind.
        """
        return self.client.submit(function, *args, key=key, workers=[worker], allow_other_workers=False,
                                  pure=False, priority=CUT_PRIORITY)

    def advance(self, steps):
        """Submit ``steps`` time steps as supersteps of at most K steps; returns at once."""
        from distributed import span

        self._check_open("the run was advanced")
        with span(self.name):
            remaining = steps
            while remaining > 0:
                k = min(self.steps_per_task, remaining)
                self._superstep(k)
                remaining -= k
                self._in_flight.append(self.blocks)
                if len(self._in_flight) > MAX_AHEAD:
                    self._wait(self._in_flight.popleft())

    # -- results that only carry scalars -------------------------------------------
    def _check_open(self, what):
        if not self.blocks:
            raise ClusterError(f"{self.name}: {what} after the run was closed; its state is no longer on "
                               "the cluster (read diagnostics before close(), or keep the run open)")

    def request_health(self, step):
        self._check_open("a health check was requested")
        futures = [self._submit(self._health_task, self._model, block, key=self._key("health", self.superstep, p),
                                worker=self.owner[p]) for p, block in enumerate(self.blocks)]
        self._pending.append(("health", step, futures))

    def request_diagnostics(self, step):
        self._check_open("diagnostics were requested")
        futures = []
        for p, block in enumerate(self.blocks):
            extra = self._sums_extra(p)
            futures.append(self._submit(self._sums_task, self._model, block, self.bounds[p][0], extra,
                                        key=self._key("diagnostics", self.superstep, p), worker=self.owner[p]))
        self._pending.append(("diagnostics", step, futures))

    unit = "items"
    # Tasks that read one block (module functions: they pickle by reference).
    _health_task = staticmethod(_block_health)
    _sums_task = staticmethod(_block_sums)
    _host_task = staticmethod(_to_host)

    def _minimum_block(self, partitions):
        """Fewest items a block may hold."""
        return 1

    def _weights_from_rates(self, rates):
        """Block weights that make blocks on workers of these step rates finish together."""
        return list(rates)

    def _check_steps_per_task(self):
        """Raise ConfigError if the decomposition cannot take K steps per task."""

    def _default_steps_per_task(self, model, partitions):
        """K when the caller gives none."""
        return 1

    def _calibrate(self, client, model):
        """``{worker: steps/s}`` for ``weights="calibrate"``."""
        raise ConfigError(f"weights='calibrate' is only available for grid models; give {self.unit} "
                          "weights as numbers, one per partition")

    def _sums_extra(self, p):
        """What a block's diagnostic sums need from elsewhere (None: nothing)."""
        return None

    def _superstep(self, steps):  # pragma: no cover - interface
        raise NotImplementedError

    def collect(self, block=False):
        """Finished health checks and diagnostics, in submission order.

        Returns a list of ``(kind, step, value)``: for ``"health"`` the value
        is ``(bad_fields, cfl)``, for ``"diagnostics"`` a dict. With
        ``block=True`` waits for all of them.
        """
        done = []
        while self._pending:
            kind, step, futures = self._pending[0]
            if not block and not all(f.done() for f in futures):
                break
            parts = self._gather(futures)
            self._pending.pop(0)
            if kind == "health":
                done.append((kind, step, self.model.combine_health(parts, self.dt)))
            else:
                done.append((kind, step, self.model.combine_sums(parts)))
        return done

    def _gather(self, futures):
        from distributed import TimeoutError as DaskTimeoutError

        try:
            return self.client.gather(futures, errors="raise", direct=None) if futures else []
        except (DaskTimeoutError, TimeoutError) as error:
            raise ClusterError(f"{self.name}: no result from the cluster within {RESULT_TIMEOUT_S:g} s") from error
        except Exception as error:  # noqa: BLE001 - translated below when it is a lost worker
            if _is_lost_worker(error):
                raise ClusterError(
                    f"{self.name}: a worker was lost during the run ({type(error).__name__}: {error}); the "
                    "partitions it held are gone. Restart the run (checkpoint/resume comes in a later "
                    "release).") from error
            raise

    def synchronize(self):
        """Wait until every submitted superstep has finished (raises on a lost worker)."""
        self._wait(self.blocks)
        self._in_flight.clear()

    def _wait(self, futures):
        from distributed import wait

        try:
            wait(futures, timeout=RESULT_TIMEOUT_S, return_when="ALL_COMPLETED")
        except Exception as error:  # noqa: BLE001
            raise ClusterError(f"{self.name}: waiting for the cluster failed ({error})") from error
        for future in futures:
            if future.status == "error":
                self._gather([future])
            elif future.status in ("cancelled", "lost"):
                raise ClusterError(f"{self.name}: a partition was {future.status}: a worker was lost during "
                                   "the run; restart it (checkpoint/resume comes in a later release).")

    def health(self):
        """Blocking health check of the current state: ``(bad_fields, cfl)``."""
        self.request_health(self.step)
        return [value for kind, _, value in self.collect(block=True) if kind == "health"][-1]

    def diagnostics(self):
        """Blocking global diagnostics of the current state (dict of floats)."""
        self.request_diagnostics(self.step)
        values = [value for kind, _, value in self.collect(block=True) if kind == "diagnostics"][-1]
        values["max_cfl"] = self.health()[1]
        return values

    def global_state(self):
        """Gather the whole state to the client (for output; not used while stepping)."""
        self._check_open("the state was requested")
        hosts = self._gather([self._submit(self._host_task, self._model, block,
                                           key=self._key("gather", self.superstep, p), worker=self.owner[p])
                              for p, block in enumerate(self.blocks)])
        return self._join(hosts)

    def _join(self, host_blocks):
        """The global state from the blocks gathered to the host."""
        return self.model.concat_blocks(host_blocks)

    def describe(self):
        return {"executor": "distributed", "backend": self.model.backend_request,
                "partitions": self.partitions, "steps_per_task": self.steps_per_task,
                "workers": len(self.workers), f"{self.unit}_per_partition": [b - a for a, b in self.bounds]}

    def close(self):
        """Release the partitions and the model held on the workers."""
        self.blocks = []
        self._pending = []
        self._in_flight.clear()
        self._model = None


def _is_lost_worker(error):
    from distributed.scheduler import KilledWorker

    text = f"{type(error).__name__}: {error}".lower()
    return isinstance(error, KilledWorker) or any(
        word in text for word in ("lost", "cancelled", "killedworker", "commclosed", "worker died"))


class _HeldStateExecutor(_PartitionedExecutor):
    """Base of executors whose blocks hold the model state as ``block.state`` beside other things."""

    _health_task = staticmethod(_held_health)
    _sums_task = staticmethod(_held_sums)
    _host_task = staticmethod(_held_to_host)
