"""The workers' side of the dashboard: NVML readings of each worker's GPU.

``GpuStatsPlugin`` answers the scheduler's ``hpcgpu_gpu_stats`` with
:func:`gpu_stats`. It never raises and creates no CUDA context: a worker
without NVML (``pynvml``, from ``nvidia-ml-py``) or without a GPU says why,
and the dashboard shows "no GPU" with that reason.
"""

import os
import socket

from distributed.diagnostics.plugin import WorkerPlugin

__all__ = ["GpuStatsPlugin", "gpu_stats"]

WORKER_PLUGIN_NAME = "hpcgpu-gpu-stats"
GPU_OP = "hpcgpu_gpu_stats"


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
