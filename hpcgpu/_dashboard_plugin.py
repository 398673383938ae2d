"""The scheduler side of the hpcgpu dashboard page (see :mod:`hpcgpu.dashboard`).

``DashboardPlugin`` lives on the dask scheduler. It keeps the status records
that running simulations publish (handler ``hpcgpu_dashboard_publish``),
serves ``/hpcgpu`` (a self-contained HTML page) and ``/hpcgpu/data.json``
from the scheduler's dashboard port, and registers ``GpuStatsPlugin`` on the
workers, which answers ``hpcgpu_gpu_stats`` with NVML readings. Workers are
asked only while someone is looking at the page, and at most every
``GPU_POLL_S`` seconds.

Everything here runs in the scheduler's (or a worker's) event loop; none of it
may raise into dask: a broken record or a worker without NVML shows up on the
page, not in the scheduler log as a traceback.
"""

import asyncio
import json
import logging
import math
import os
import socket
import time

from distributed.diagnostics.plugin import SchedulerPlugin, WorkerPlugin
from tornado import web

from hpcgpu._dashboard_page import PAGE

__all__ = ["DashboardPlugin", "GpuStatsPlugin", "gpu_stats"]

logger = logging.getLogger(__name__)

PLUGIN_NAME = "hpcgpu-dashboard"
WORKER_PLUGIN_NAME = "hpcgpu-gpu-stats"
PUBLISH_OP = "hpcgpu_dashboard_publish"
GPU_OP = "hpcgpu_gpu_stats"

GPU_POLL_S = 2.0          # at most one round of NVML questions per this many seconds
GPU_TIMEOUT_S = 5.0       # a worker that does not answer in time is shown without GPUs
STALE_AFTER_S = 30.0      # a running simulation silent for this long is shown as stale
MAX_RUNS = 20             # runs kept; finished ones go first
MAX_POINTS = 1000         # diagnostics kept per run; halved (every other point) when full
# Matches the page under any dashboard prefix (``dask scheduler --dashboard-prefix``).
_ROUTE = r"(?:/.*)?/hpcgpu"


class DashboardPlugin(SchedulerPlugin):
    """Scheduler plugin: keeps run status records and serves the hpcgpu page.

    Register it with ``client.register_plugin(DashboardPlugin())`` (what
    :func:`hpcgpu.dashboard.register` does); registering it again is a no-op.
    """

    name = PLUGIN_NAME
    idempotent = True

    def __init__(self):
        self.scheduler = None
        self.runs = {}
        self.gpus = {"available": False, "reason": "not asked yet", "devices": [], "updated": None}
        self._gpu_task = None
        self._gpu_asked = 0.0
        self._gpu_probe = True  # the workers answer GPU_OP (False: the worker plugin was refused)

    # -- life cycle ---------------------------------------------------------------
    async def start(self, scheduler):
        self.scheduler = scheduler
        scheduler.handlers[PUBLISH_OP] = self.receive
        app = getattr(scheduler, "http_application", None)
        if app is not None:
            app.add_handlers(r".*$", [
                (_ROUTE + r"/?", _PageHandler, {"plugin": self}),
                (_ROUTE + r"/data\.json", _DataHandler, {"plugin": self}),
            ])
        _link_from_dask_navigation(scheduler)
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
        if run is None:
            run = self.runs[run_id] = {"id": run_id, "series": {}, "first_seen": time.time()}
            self._evict()
        for key in ("name", "model", "status", "step", "time", "dt", "steps_per_s", "wall_s", "backend",
                    "steps_per_task", "partitions", "unit", "workers", "error"):
            if key in record:
                run[key] = record[key]
        run["updated"] = time.time()
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

    def _evict(self):
        while len(self.runs) > MAX_RUNS:
            order = sorted(self.runs.values(), key=lambda r: (r.get("status") == "running", r.get("updated", 0)))
            del self.runs[order[0]["id"]]

    # -- what the page shows ----------------------------------------------------------
    def snapshot(self):
        """Everything the page shows, as JSON-ready builtins (no NaN: ``null`` instead)."""
        now = time.time()
        self._poll_gpus(now)  # asked only while someone is looking
        runs = []
        # Running ones first, then the newest.
        for run in sorted(self.runs.values(), key=lambda r: (r.get("status") != "running", -r["first_seen"])):
            run = dict(run)
            age = now - run.get("updated", now)
            run["age_s"] = age
            if run.get("status") == "running" and age > STALE_AFTER_S:
                run["status"] = "stale"
            runs.append(run)
        workers = []
        scheduler = self.scheduler
        for address, ws in sorted(getattr(scheduler, "workers", {}).items()):
            workers.append({"address": address, "name": str(ws.name), "nthreads": ws.nthreads,
                            "memory_limit": ws.memory_limit})
        gpus = dict(self.gpus)
        gpus["age_s"] = None if gpus["updated"] is None else now - gpus["updated"]
        return _clean({"now": now, "scheduler": getattr(scheduler, "address", None), "workers": workers,
                       "runs": runs, "gpus": gpus})

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


def _link_from_dask_navigation(scheduler):
    """Add "hpcgpu" to the top bar of dask's Bokeh pages (best effort: dask's template variables)."""
    try:
        from distributed.dashboard.scheduler import template_variables

        pages = template_variables(scheduler)["pages"]  # memoized per scheduler, shared by its pages
        if "hpcgpu" not in pages:
            pages.append("hpcgpu")
    except Exception:  # noqa: BLE001 - no Bokeh, or another dask version: the page is still at /hpcgpu
        pass


class _PageHandler(web.RequestHandler):
    def initialize(self, plugin):
        self.plugin = plugin

    def get(self):
        self.set_header("Content-Type", "text/html; charset=utf-8")
        self.set_header("Cache-Control", "no-store")
        self.write(PAGE)


class _DataHandler(web.RequestHandler):
    def initialize(self, plugin):
        self.plugin = plugin

    def get(self):
        self.set_header("Content-Type", "application/json")
        self.set_header("Cache-Control", "no-store")
        try:
            body = json.dumps(self.plugin.snapshot(), allow_nan=False, default=str)
        except Exception as error:  # noqa: BLE001 - the page shows the error instead of a blank
            logger.warning("hpcgpu dashboard: data.json failed (%s: %s)", type(error).__name__, error)
            body = json.dumps({"error": f"{type(error).__name__}: {error}", "runs": [], "workers": [],
                               "gpus": {"available": False, "reason": "error", "devices": []}})
        self.write(body)


# -- the workers' side: NVML readings -----------------------------------------------------
class GpuStatsPlugin(WorkerPlugin):
    """Worker plugin: answers ``hpcgpu_gpu_stats`` with :func:`gpu_stats`."""

    name = WORKER_PLUGIN_NAME
    idempotent = True

    def setup(self, worker):
        worker.handlers[GPU_OP] = _gpu_stats_handler

    def teardown(self, worker):
        worker.handlers.pop(GPU_OP, None)


def _gpu_stats_handler():
    return gpu_stats()


_NVML = {"pid": None, "error": None}


def gpu_stats():
    """NVML readings of this process's GPU(s); never raises and creates no CUDA context.

    A worker whose ``CUDA_VISIBLE_DEVICES`` is set (dask-cuda: one GPU per
    worker, listed first) reports that GPU; otherwise every GPU of the host.

    Returns
    -------
    dict
        ``{"available": True, "host": ..., "gpus": [{"index", "uuid", "name",
        "utilization" (%), "memory_used", "memory_total" (bytes), "power_w",
        "power_limit_w" (W), "temperature_c" (deg C)}, ...]}``, or
        ``{"available": False, "reason": ...}``.
    """
    try:
        import pynvml
    except ImportError:
        return {"available": False, "reason": "NVML not available: pynvml (nvidia-ml-py) is not installed"}
    try:
        if _NVML["pid"] != os.getpid():
            pynvml.nvmlInit()
            _NVML["pid"] = os.getpid()
        handles = _handles(pynvml)
    except Exception as error:  # noqa: BLE001 - no driver, no library, no GPU: all mean "not available"
        return {"available": False, "reason": f"NVML not available: {error}"}
    gpus = []
    for index, handle in handles:
        gpus.append({
            "index": index,
            "uuid": _nvml(pynvml.nvmlDeviceGetUUID, handle, str),
            "name": _nvml(pynvml.nvmlDeviceGetName, handle, str),
            "utilization": _nvml(pynvml.nvmlDeviceGetUtilizationRates, handle, lambda u: u.gpu),
            "memory_used": _nvml(pynvml.nvmlDeviceGetMemoryInfo, handle, lambda m: m.used),
            "memory_total": _nvml(pynvml.nvmlDeviceGetMemoryInfo, handle, lambda m: m.total),
            "power_w": _nvml(pynvml.nvmlDeviceGetPowerUsage, handle, lambda mw: mw / 1000.0),
            "power_limit_w": _nvml(pynvml.nvmlDeviceGetEnforcedPowerLimit, handle, lambda mw: mw / 1000.0),
            "temperature_c": _nvml(lambda h: pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU),
                                   handle, float),
        })
    return {"available": bool(gpus), "host": socket.gethostname(), "gpus": gpus,
            **({} if gpus else {"reason": "NVML found no GPU"})}


def _handles(pynvml):
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")[0].strip()
    if visible:
        if visible.startswith(("GPU-", "MIG-")):
            handle = pynvml.nvmlDeviceGetHandleByUUID(visible)
            return [(pynvml.nvmlDeviceGetIndex(handle), handle)]
        if int(visible) < 0:
            return []
        return [(int(visible), pynvml.nvmlDeviceGetHandleByIndex(int(visible)))]
    return [(i, pynvml.nvmlDeviceGetHandleByIndex(i)) for i in range(pynvml.nvmlDeviceGetCount())]


def _nvml(query, handle, convert):
    try:
        value = query(handle)
        return convert(value.decode() if isinstance(value, bytes) else value)  # older pynvml: bytes
    except Exception:  # noqa: BLE001 - e.g. NVMLError_NotSupported: power on some boards
        return None


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
