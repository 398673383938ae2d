"""The scheduler's side of the dashboard: ``DashboardPlugin`` (see :mod:`hpcgpu.dashboard`).

``DashboardPlugin`` lives on the dask scheduler. It keeps the status records
that running simulations publish (handler ``hpcgpu_dashboard_publish``),
serves the hpcgpu page and its data (:mod:`hpcgpu.dashboard.page`), adds the
Bokeh panels to dask's own dashboard (:mod:`hpcgpu.dashboard.panels`), and
registers :class:`~hpcgpu.dashboard.gpu.GpuStatsPlugin` on the workers, which
answers ``hpcgpu_gpu_stats`` with NVML readings. Workers are asked only while
someone is looking (the page or a GPU panel is open), and at most every
``GPU_POLL_S`` seconds.

Everything here runs in the scheduler's (or a worker's) event loop; none of it
may raise into dask: a broken record or a worker without NVML shows up on the
page, not in the scheduler log as a traceback.
"""

import asyncio
import logging
import math
import time

from distributed.diagnostics.plugin import SchedulerPlugin

from hpcgpu.dashboard import page
from hpcgpu.dashboard.gpu import GPU_OP, WORKER_PLUGIN_NAME, GpuStatsPlugin

__all__ = ["DashboardPlugin"]

logger = logging.getLogger(__name__)

PLUGIN_NAME = "hpcgpu-dashboard"
PUBLISH_OP = "hpcgpu_dashboard_publish"

GPU_POLL_S = 2.0          # at most one round of NVML questions per this many seconds
GPU_TIMEOUT_S = 5.0       # a worker that does not answer in time is shown without GPUs
STALE_AFTER_S = 30.0      # a running simulation silent for this long is shown as stale
MAX_RUNS = 20             # runs kept; finished ones go first
MAX_POINTS = 1000         # diagnostics (and steps/s readings) kept per run; halved (every other point) when full


class DashboardPlugin(SchedulerPlugin):
    """Scheduler plugin: keeps run status records, serves the hpcgpu page and adds the panels.

    Register it with ``client.register_plugin(DashboardPlugin())`` (what
    :func:`hpcgpu.dashboard.register` does; registering it again is a
    no-op), or start the scheduler with it: ``dask scheduler --preload
    hpcgpu.dashboard.preload``.
    """

    name = PLUGIN_NAME
    idempotent = True

    def __init__(self):
        self.scheduler = None
        self.runs = {}
        self.gpus = {"available": False, "reason": "not asked yet", "devices": [], "updated": None}
        self.panels = []  # the Bokeh panels' paths added to dask's dashboard
        self._gpu_task = None
        self._gpu_asked = 0.0
        self._gpu_probe = True  # the workers answer GPU_OP (False: the worker plugin was refused)

    # -- life cycle ---------------------------------------------------------------
    async def start(self, scheduler):
        self.scheduler = scheduler
        scheduler.handlers[PUBLISH_OP] = self.receive
        page.add_routes(scheduler, self)
        self.panels = _add_panels(scheduler, self)
        try:
            from distributed.protocol.pickle import dumps

            await scheduler.register_worker_plugin(None, dumps(GpuStatsPlugin()), WORKER_PLUGIN_NAME,
                                                   idempotent=True)
        except Exception as error:  # noqa: BLE001 - GPU stats are optional; the page says why they are missing
            self._gpu_probe = False
            self.gpus["reason"] = f"could not install the GPU probe on the workers: {error}"
            logger.warning("hpcgpu dashboard: %s", self.gpus["reason"])

    async def close(self):
        if self.scheduler is not None and self.scheduler.handlers.get(PUBLISH_OP) == self.receive:
            del self.scheduler.handlers[PUBLISH_OP]
        if self._gpu_task is not None:
            self._gpu_task.cancel()

    # -- run records ------------------------------------------------------------------
    def receive(self, record=None):
        """Handler ``hpcgpu_dashboard_publish``: take in one status record from a simulation."""
        try:
            self._merge(record)
        except Exception as error:  # noqa: BLE001 - a malformed record must not break the scheduler
            logger.warning("hpcgpu dashboard: ignored a status record (%s: %s)", type(error).__name__, error)
        return "OK"

    def _merge(self, record):
        run_id = str(record["id"])
        run = self.runs.get(run_id)
        new = run is None
        if new:
            run = self.runs[run_id] = {"id": run_id, "series": {}, "first_seen": time.time()}
        for key in ("name", "model", "status", "step", "time", "dt", "steps_per_s", "wall_s", "backend",
                    "steps_per_task", "partitions", "unit", "workers", "error", "plot_first"):
            if key in record:
                run[key] = record[key]
        run["updated"] = time.time()
        if new:
            # only now: a run without its status and time yet sorts as the oldest finished one, so with
            # MAX_RUNS runs kept every new run was the one dropped and never showed
            self._evict()
        series = run["series"]
        for row in record.get("diagnostics") or ():
            steps = series.get("step", [])
            if steps and _number(row.get("step")) is not None and row["step"] <= steps[-1]:
                continue  # already have it (a record sent twice, or a restart from a checkpoint)
            for key in row:
                series.setdefault(str(key), [None] * len(steps))
            for key, column in series.items():
                column.append(_number(row.get(key)))
            if len(series["step"]) > MAX_POINTS:
                for key in series:
                    series[key] = series[key][::2]
        rate = _number(record.get("steps_per_s"))
        if rate is not None:
            rates = run.setdefault("rates", {"t": [], "steps_per_s": []})
            rates["t"].append(run["updated"])
            rates["steps_per_s"].append(rate)
            if len(rates["t"]) > MAX_POINTS:
                for key in rates:
                    rates[key] = rates[key][::2]

    def _evict(self):
        while len(self.runs) > MAX_RUNS:
            order = sorted(self.runs.values(), key=lambda r: (r.get("status") == "running", r.get("updated", 0)))
            del self.runs[order[0]["id"]]

    # -- what the page and the panels show ------------------------------------------------
    def snapshot(self):
        """Everything the page shows, as JSON-ready builtins (no NaN: ``null`` instead)."""
        now = time.time()
        workers = []
        scheduler = self.scheduler
        for address, ws in sorted(getattr(scheduler, "workers", {}).items()):
            workers.append({"address": address, "name": str(ws.name), "nthreads": ws.nthreads,
                            "memory_limit": ws.memory_limit})
        return _clean({"now": now, "scheduler": getattr(scheduler, "address", None), "workers": workers,
                       "runs": self.current_runs(now), "gpus": self.current_gpus(now)})

    def current_runs(self, now=None):
        """The runs, running ones first, then the newest; shallow copies with ``age_s`` (s since the last record).

        A running simulation silent for ``STALE_AFTER_S`` shows as ``"stale"``.
        """
        now = time.time() if now is None else now
        runs = []
        for run in sorted(self.runs.values(), key=lambda r: (r.get("status") != "running", -r["first_seen"])):
            run = dict(run)
            run["age_s"] = now - run.get("updated", now)
            if run.get("status") == "running" and run["age_s"] > STALE_AFTER_S:
                run["status"] = "stale"
            runs.append(run)
        return runs

    def current_gpus(self, now=None):
        """The latest GPU readings (a copy with ``age_s``); asks the workers again when due.

        Workers are asked only from here, that is only while someone is looking.
        """
        now = time.time() if now is None else now
        self._poll_gpus(now)
        gpus = dict(self.gpus)
        gpus["age_s"] = None if gpus["updated"] is None else now - gpus["updated"]
        return gpus

    def _poll_gpus(self, now):
        if self.scheduler is None or not self._gpu_probe or (self._gpu_task is not None and not self._gpu_task.done()):
            return
        if now - self._gpu_asked < GPU_POLL_S:
            return
        self._gpu_asked = now
        self._gpu_task = asyncio.ensure_future(self._ask_workers())

    async def _ask_workers(self):
        scheduler = self.scheduler
        workers = list(scheduler.workers)
        if not workers:
            self.gpus.update(available=False, reason="no workers", devices=[], updated=time.time())
            return
        try:
            answers = await asyncio.wait_for(
                scheduler.broadcast(msg={"op": GPU_OP}, workers=workers, on_error="return"), GPU_TIMEOUT_S)
        except Exception as error:  # noqa: BLE001 - shown on the page
            self.gpus.update(available=False, reason=f"workers did not answer: {error}", devices=[],
                             updated=time.time())
            return
        devices, reasons = {}, set()
        for worker, answer in sorted(answers.items()):
            if not isinstance(answer, dict):
                reasons.add(f"{type(answer).__name__}: {answer}")
                continue
            if not answer.get("available"):
                reasons.add(str(answer.get("reason", "unknown")))
                continue
            for gpu in answer.get("gpus", ()):
                key = (answer.get("host"), gpu.get("uuid") or gpu.get("index"))
                device = devices.setdefault(key, dict(gpu, host=answer.get("host"), workers=[]))
                device["workers"].append(worker)
        self.gpus.update(available=bool(devices), devices=list(devices.values()),
                         reason="; ".join(sorted(reasons)) or None, updated=time.time())


def _add_panels(scheduler, plugin):
    """Add the Bokeh panels to the scheduler's dashboard; their paths (none without Bokeh or a dashboard)."""
    try:
        from hpcgpu.dashboard.dask_dashboard import add_to_dask_dashboard

        return add_to_dask_dashboard(scheduler, plugin)
    except ImportError as error:  # no Bokeh on the scheduler: dask has no Bokeh pages either; the page remains
        logger.info("hpcgpu dashboard: no Bokeh panels (%s)", error)
    except Exception as error:  # noqa: BLE001 - another dask or Bokeh version: the page remains
        logger.warning("hpcgpu dashboard: could not add the panels to dask's dashboard (%s: %s)",
                       type(error).__name__, error, exc_info=True)
    return []


# -- helpers ---------------------------------------------------------------------------
def _number(value):
    if isinstance(value, bool) or value is None:
        return value
    try:
        value = float(value)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


def _clean(value):
    """JSON-ready copy: non-finite floats become None, tuples lists, keys strings."""
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if value is None or isinstance(value, (str, int, bool)):
        return value
    return _number(value) if hasattr(value, "__float__") else str(value)
