"""hpcgpu: scientific workloads on GPU clusters, unchanged from laptop to many GPUs.

Importing hpcgpu loads neither CuPy nor ``numba.cuda`` and creates no CUDA
context; GPU modules load on first use.

Examples
--------
>>> import hpcgpu
>>> hpcgpu.get_backend("numpy").name
'numpy'
"""

from hpcgpu import cluster, schedules
from hpcgpu.backends import Backend, backend_info, get_backend
from hpcgpu.cluster import start_cluster
from hpcgpu.errors import BackendUnavailable, ClusterError, ConfigError, HpcgpuError, UnstableSimulation
from hpcgpu.io import ZarrWriter
from hpcgpu.partition.rank_loader import RankLoader
from hpcgpu._version import __version__
from hpcgpu.simulation import Simulation

__all__ = [
    "__version__",
    "Simulation",
    "start_cluster",
    "cluster",
    "ZarrWriter",
    "RankLoader",
    "schedules",
    "Backend",
    "get_backend",
    "backend_info",
    "HpcgpuError",
    "ConfigError",
    "BackendUnavailable",
    "UnstableSimulation",
    "ClusterError",
]
