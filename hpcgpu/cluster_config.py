"""The dask settings hpcgpu's clusters start with: quieter periodic work, so the kernels keep the cores.

:data:`LOCAL_CLUSTER_CONFIG` is what a local cluster from
:func:`hpcgpu.cluster.start_cluster` starts with (:func:`worker_config`), and
:func:`worker_environment` the same as environment variables, for batch jobs
(:func:`hpcgpu.cluster.slurm_cluster`) and workers started by hand
(``hpcgpu info --worker-env``).

Examples
--------
>>> from hpcgpu.cluster_config import LOCAL_CLUSTER_CONFIG
>>> LOCAL_CLUSTER_CONFIG["distributed.admin.tick.interval"]
'200ms'
"""

__all__ = ["LOCAL_CLUSTER_CONFIG", "worker_config", "worker_environment"]

LOCAL_CLUSTER_CONFIG = {
    # the workers' stack sampler for the dashboard's profile page (dask:
    # 10 ms): 2% of the step rate of two busy single-core workers on 2 cores
    # at 10 ms; at 100 ms the page still fills over any run worth profiling
    "distributed.worker.profile.interval": "100ms",
    # every server (scheduler, nannies, workers) wakes its event loop this
    # often only to measure how late the wake-up was (dask: 20 ms); each
    # wake-up takes a core from a kernel for a moment
    "distributed.admin.tick.interval": "200ms",
    # CPU, memory and network samples for the dashboard's system pages (dask: 500 ms)
    "distributed.admin.system-monitor.interval": "2s",
    # how often workers and nannies read their memory use to spill, pause or
    # restart (dask: 100 ms); partitions stay resident, so their memory moves slowly
    "distributed.worker.memory.monitor-interval": "500ms",
    # what nannies set before starting a worker process: dask's list without
    # MALLOC_TRIM_THRESHOLD_=65536, which fixes glibc's thresholds so that
    # every large array (a force kernel's outputs, each step) is a fresh
    # mmap with its page faults: the Lennard-Jones step took 1.47 s per 100
    # steps instead of 1.11 (32,000 atoms, one thread), the epochs of a
    # partitioned run as much
    "distributed.nanny.pre-spawn-environ": {"OMP_NUM_THREADS": 1, "MKL_NUM_THREADS": 1,
                                            "OPENBLAS_NUM_THREADS": 1},
}
"""dask settings a local cluster from :func:`hpcgpu.cluster.start_cluster` starts with, each unless
the user's dask config already changed it from dask's default. Together they
took two busy single-core workers on 2 cores (partitioned shallow water,
2048^2 per worker) from 0.0458-0.0502 to 0.0435 s/step: dask's periodic
wake-ups share the cores with the kernels. Batch jobs from
:func:`hpcgpu.cluster.slurm_cluster` export the same settings (:func:`worker_environment`)."""


def worker_environment():
    """:data:`LOCAL_CLUSTER_CONFIG` as dask environment variables, for workers
    and schedulers started by hand (``dask worker``, ``dask cuda worker``,
    ``dask scheduler``), which read dask's config from their environment.

    Returns
    -------
    dict
        Variable name -> value.

    Examples
    --------
    >>> env = worker_environment()
    >>> env["DASK_DISTRIBUTED__ADMIN__TICK__INTERVAL"]
    '200ms'
    """
    import json

    # dicts as compact JSON (no spaces: ``export $(hpcgpu info --worker-env)`` splits on them);
    # dask reads them back with ast.literal_eval
    return {"DASK_" + key.upper().replace(".", "__").replace("-", "_"):
            json.dumps(value, separators=(",", ":")) if isinstance(value, dict) else value
            for key, value in LOCAL_CLUSTER_CONFIG.items()}


def worker_config(dask_defaults=False):
    """A context that sets :data:`LOCAL_CLUSTER_CONFIG`, less what the user set, while a cluster starts.

    Nannies pass on the config they see to their workers; with
    ``dask_defaults=True`` nothing is set.
    """
    import contextlib

    import dask

    if dask_defaults:
        return contextlib.nullcontext()
    defaults = dask.config.merge(*dask.config.defaults)
    ours = {key: value for key, value in LOCAL_CLUSTER_CONFIG.items()
            if dask.config.get(key) == dask.config.get(key, config=defaults)}
    return dask.config.set(ours)
