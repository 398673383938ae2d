"""Start or connect to a dask cluster: one call from a laptop to many GPU nodes.

:func:`start_cluster` (also ``hpcgpu.start_cluster``) returns a
:class:`distributed.Client`:

* by default a local cluster on this machine: ``dask_cuda.LocalCUDACluster``
  with one worker per GPU (each worker sees its GPU as device 0) when GPUs
  are usable, else ``distributed.LocalCluster`` with one single-threaded
  worker process per core;
* ``address="tcp://host:8786"`` connects to a running scheduler, which is how
  many nodes are used (``dask scheduler`` on one node, ``dask cuda worker``
  or ``dask worker`` on each node);
* ``jobqueue={...}`` starts workers as batch jobs through dask-jobqueue.

The scheduler and dashboard listen on 127.0.0.1 unless ``host`` says
otherwise: dask moves pickled data and runs what it is sent, so a scheduler
must never be reachable by untrusted users.

Examples
--------
>>> import hpcgpu
>>> client = hpcgpu.start_cluster(workers=2, quiet=True)   # doctest: +SKIP
>>> client.close()   # also stops the workers it started   # doctest: +SKIP

The dask settings a new cluster starts with are in :mod:`hpcgpu.cluster_config`;
making and closing its client, so that a failure leaves dask as it was, in
:mod:`hpcgpu.cluster_clients`.

Until this release the function was ``hpcgpu.cluster``, which hid this
module; ``hpcgpu.cluster(...)`` still works for one release, with a
:class:`DeprecationWarning`.
"""

import os
import sys
import types
import warnings

from hpcgpu.cluster_clients import close_client, connect, own_client, warn_if_one_is_running
from hpcgpu.cluster_config import LOCAL_CLUSTER_CONFIG, worker_config, worker_environment
from hpcgpu.errors import ClusterError, ConfigError
from hpcgpu.validation import check_float, check_int

# LOCAL_CLUSTER_CONFIG, worker_environment and close_client live in hpcgpu.cluster_config and
# hpcgpu.cluster_clients; they are imported here, where the README and user code find them
__all__ = ["LOCAL_CLUSTER_CONFIG", "close_client", "start_cluster", "cluster", "slurm_cluster", "worker_backends",
           "worker_environment", "worker_info"]


def _cpu_count():
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def start_cluster(address=None, *, workers=None, threads_per_worker=None, gpus="auto", host="127.0.0.1",
                  dashboard_address="127.0.0.1:8787", protocol=None, rmm_pool_size=None,
                  device_memory_limit=None, jobqueue=None, security=None, tls=False, timeout=20, quiet=False,
                  dask_defaults=False):
    """Return a dask ``Client`` on a new local cluster, a running scheduler or a batch system.

    Parameters
    ----------
    address : str, optional
        Scheduler address (``tcp://host:8786``, ``tls://...``, ``ucx://...``)
        to connect to instead of starting a cluster.
    workers : int, optional
        Local workers: default one per GPU, else one per core. With
        ``jobqueue``, the number of batch jobs.
    threads_per_worker : int, optional
        Threads per CPU worker (also the Numba thread count inside it);
        default: the cores divided among the workers.
    gpus : "auto", bool
        ``"auto"`` uses dask-cuda when a GPU is usable; ``False`` forces a
        CPU cluster; ``True`` requires GPUs.
    host : str
        Interface the scheduler and workers listen on (default 127.0.0.1).
    dashboard_address : str
        Where the dashboard listens (default 127.0.0.1:8787; ``":0"`` picks a
        free port).
    protocol : str, optional
        ``"tcp"``, ``"tls"`` (the same as ``tls=True``) or, with dask-cuda
        and UCX installed, ``"ucx"`` (NVLink and InfiniBand). Default:
        ``"tls"`` when ``security`` holds certificates, else ``"tcp"``.
    rmm_pool_size : str or int, optional
        GPU workers: size of an RMM memory pool shared by CuPy and Numba
        (e.g. ``"20GB"``).
    device_memory_limit : str, int or float, optional
        GPU workers: device memory above which dask-cuda spills to host.
    jobqueue : dict, optional
        Start workers as Slurm jobs: keyword arguments of
        ``dask_jobqueue.SLURMCluster`` (``queue``, ``account``, ``cores``,
        ``memory``, ``walltime``, ``job_extra_directives``, ...).
    security : distributed.Security, optional
        TLS certificates for the scheduler, workers and client: a new
        cluster given them speaks TLS. With ``jobqueue``, passed to it (as
        is ``protocol``) unless the dict has its own.
    tls : bool
        Encrypt and authenticate every connection of a new local cluster
        with TLS: without ``security``, a throw-away certificate authority
        is made for this cluster (``distributed.Security.temporary``), so
        only this client and its workers can talk to the scheduler. To
        reach a scheduler by ``address`` over TLS, give ``security``; the
        address must then be ``tls://`` (one without a scheme gets it).
    timeout : float
        Seconds to wait for a scheduler before giving up (default 20).
    quiet : bool
        Do not print the links to the dask dashboard and its hpcgpu page
        (:mod:`hpcgpu.dashboard`, registered on the scheduler either way).
    dask_defaults : bool
        Start a local cluster with dask's own intervals for its periodic
        work instead of :data:`LOCAL_CLUSTER_CONFIG` (see Notes).

    Notes
    -----
    A new local cluster wakes dask's periodic work less often than dask
    does (:data:`LOCAL_CLUSTER_CONFIG`: profile sampling every 100 ms, event
    loop ticks every 200 ms, system monitor every 2 s, memory monitor every
    500 ms): those wake-ups compete with the kernels for the cores. Any of
    these keys set in dask's config to another value than dask's default
    wins; ``dask_defaults=True`` keeps dask's values for all of them.

    Returns
    -------
    distributed.Client
        Its ``close()`` also closes the cluster (workers and ports, or batch
        jobs) that this call started; a scheduler joined by ``address``
        keeps running.

    Raises
    ------
    ClusterError
        The scheduler cannot be reached in time, or GPUs were required but
        none is usable.
    ConfigError
        Invalid parameters.
    """
    _refuse_in_a_spawned_worker(address)
    timeout = check_float("timeout", timeout, minimum=0.0, strict_min=True)
    if workers is not None:
        workers = check_int("workers", workers, minimum=1)
    if threads_per_worker is not None:
        threads_per_worker = check_int("threads_per_worker", threads_per_worker, minimum=1)
    if gpus not in ("auto", True, False):
        raise ConfigError(f"gpus must be 'auto', True or False; got {gpus!r}")
    if address is not None and jobqueue is not None:
        raise ConfigError("give either address (connect to a scheduler) or jobqueue (start one), not both")
    if address is not None:
        # options of a new cluster: a scheduler joined by address keeps its own workers
        ignored = [name for name, value in (("workers", workers), ("threads_per_worker", threads_per_worker),
                                            ("rmm_pool_size", rmm_pool_size),
                                            ("device_memory_limit", device_memory_limit)) if value is not None]
        if ignored:
            raise ConfigError(f"{', '.join(ignored)} {'shapes' if len(ignored) == 1 else 'shape'} a new cluster; "
                              f"the scheduler at {address!r} keeps the workers it has: leave "
                              f"{'it' if len(ignored) == 1 else 'them'} out, or give no address")
    if not isinstance(tls, bool):
        raise ConfigError(f"tls must be True or False; got {tls!r}")
    if not isinstance(dask_defaults, bool):
        raise ConfigError(f"dask_defaults must be True or False; got {dask_defaults!r}")
    if not isinstance(quiet, bool):
        raise ConfigError(f"quiet must be True or False; got {quiet!r}")
    if not isinstance(host, str) or not host:
        # "" would make dask listen on every interface: the scheduler runs what it is sent
        raise ConfigError(f"host must be an interface's address or name, such as '127.0.0.1'; got {host!r}")
    _check_dashboard_address(dashboard_address)
    if jobqueue is not None and not isinstance(jobqueue, dict):
        raise ConfigError(f"jobqueue must be a dict of dask_jobqueue.SLURMCluster arguments; got {jobqueue!r}")
    if security is not None:
        from distributed import Security

        if not isinstance(security, Security):
            raise ConfigError(f"security must be a distributed.Security; got {security!r}")
    protocol = _check_protocol(protocol)
    if address is None and _has_certificates(security):
        if protocol not in (None, "tls"):
            # dask would fail to start ("Scheduler failed to start") or, without require_encryption, not use them
            raise ConfigError(f"security holds TLS certificates, which protocol {protocol!r} does not use: "
                              "leave protocol out or give 'tls'")
        # dask starts a plain tcp cluster unless the Security also says require_encryption: certificates
        # given are meant to be used
        protocol = "tls"
    if tls or protocol == "tls":
        if address is not None and security is None:
            raise ConfigError("tls=True with an address needs security=distributed.Security(...) holding "
                              "the certificates the scheduler trusts")
        if protocol not in (None, "tls"):
            raise ConfigError(f"tls=True needs protocol 'tls' (or none); got {protocol!r}")
        protocol = "tls"
        if address is not None:
            address = _tls_address(address)
        if security is None:
            from distributed import Security

            security = Security.temporary()

    from distributed import Client

    if address is not None:
        client = connect(Client, address, timeout, security)
    else:
        if jobqueue is not None:
            # the scheduler's own options, unless the dict gives them (the client takes the cluster's security)
            scheduler = {key: value for key, value in (("protocol", protocol), ("security", security))
                         if value is not None}
            started = slurm_cluster(**{"dask_defaults": dask_defaults, **scheduler, **jobqueue})
            try:
                started.scale(jobs=workers or 1)
            except BaseException:
                started.close()  # its scheduler is up already
                raise
        else:
            warn_if_one_is_running()
            started = _local_cluster(workers, threads_per_worker, gpus, host, dashboard_address, protocol,
                                     rmm_pool_size, device_memory_limit, security, dask_defaults)
        client = own_client(Client, started, timeout)
    try:
        from hpcgpu import dashboard

        page = dashboard.register(client)  # the hpcgpu page in the dask dashboard; None if the scheduler refused it
    except BaseException:
        close_client(client)  # interrupted: leave no cluster behind that nothing refers to
        raise
    if not quiet:
        beside = f", hpcgpu page at {page}" if page else ""
        print(f"hpcgpu: dask dashboard at {client.dashboard_link}{beside}", file=sys.stderr)
    return client


PROTOCOLS = ("tcp", "tls", "ucx")
"""The ``protocol`` values :func:`start_cluster` takes (``"tls://"`` and the like too)."""


def _check_protocol(protocol):
    """``protocol`` as one of :data:`PROTOCOLS` (or None), or a ConfigError naming them."""
    if protocol is None:
        return None
    name = protocol.lower().removesuffix("://") if isinstance(protocol, str) else protocol
    if name not in PROTOCOLS:
        raise ConfigError(f"protocol must be one of {', '.join(map(repr, PROTOCOLS))} or None; got {protocol!r}")
    from hpcgpu._gpu_probe import module_installed

    if name == "ucx" and not module_installed("distributed_ucxx"):
        # without it dask only says "Scheduler failed to start"
        raise ConfigError("protocol='ucx' needs UCX for dask: pip install distributed-ucxx-cu12 "
                          "(or -cu13, matching the CUDA of your driver)")
    return name


def _check_dashboard_address(address):
    """A ConfigError unless ``address`` is ``"host:port"``, ``":port"`` or a port (0: any free one), or None."""
    if address is None:
        return
    port = address if isinstance(address, int) and not isinstance(address, bool) else None
    if isinstance(address, str):
        port = address.rpartition(":")[2] if ":" in address else None
        port = int(port) if port is not None and port.isdigit() else None
    if port is None or not 0 <= port <= 65535:
        raise ConfigError(f"dashboard_address must be 'host:port', ':port' or a port from 0 to 65535 "
                          f"(0 or ':0' picks a free one); got {address!r}")


def _has_certificates(security):
    """True when ``security`` (a distributed.Security or None) holds TLS certificates."""
    return security is not None and any(
        getattr(security, key, None) for key in ("tls_ca_file", "tls_scheduler_cert", "tls_client_cert"))


def _tls_address(address):
    """``address`` with the ``tls://`` scheme: a ConfigError for another scheme, which would talk in the clear."""
    if not isinstance(address, str):
        return address  # _connect says what an address looks like
    scheme, sep, _ = address.partition("://")
    if not sep:
        return "tls://" + address
    if scheme.lower() != "tls":
        raise ConfigError(f"tls=True (or protocol='tls') but the address {address!r} is not tls://: "
                          "the connection would not be encrypted; give the scheduler's tls:// address")
    return address


def _refuse_in_a_spawned_worker(address):
    """A ConfigError when a new local cluster is asked for while a worker process imports the user's script.

    dask starts local workers with ``spawn``: each re-imports the script that
    started the cluster (as ``__mp_main__``), so a script that calls
    :func:`start_cluster` at its top level starts a cluster again inside
    every worker, and multiprocessing refuses with a page about
    ``freeze_support()`` while the parent only says "Nanny failed to start".
    """
    import multiprocessing

    # the flag multiprocessing itself checks before refusing to start a process from a bootstrapping one
    if address is None and getattr(multiprocessing.current_process(), "_inheriting", False):
        script = getattr(sys.modules.get("__mp_main__"), "__file__", "the main module")
        raise ConfigError(
            "start_cluster() ran while a dask worker process was importing your script "
            f"({script}): local workers re-import it, so the code that "
            "starts the cluster must sit under `if __name__ == \"__main__\":` (see the README's cluster "
            "section); in a notebook or with `hpcgpu run` this is done for you")


def _local_cluster(workers, threads_per_worker, gpus, host, dashboard_address, protocol,
                   rmm_pool_size, device_memory_limit, security, dask_defaults=False):
    from hpcgpu.backends import backend_status

    gpu_usable = backend_status("cupy").usable and not os.environ.get("NUMBA_ENABLE_CUDASIM")
    if gpus is True and not gpu_usable:
        raise ClusterError(f"gpus=True but no GPU is usable: {backend_status('cupy').detail}")
    if gpus is not False and gpu_usable:
        try:
            from dask_cuda import LocalCUDACluster
        except ImportError as error:
            raise ClusterError("a GPU is usable but dask-cuda is not installed: "
                               "pip install 'hpcgpu[cuda]'") from error
        kwargs = dict(n_workers=workers, host=host, dashboard_address=dashboard_address,
                      protocol=protocol, security=security)
        if rmm_pool_size is not None:
            # One pool for both libraries: CuPy and Numba allocate through RMM.
            kwargs.update(rmm_pool_size=rmm_pool_size, rmm_allocator_external_lib_list=["cupy", "numba"])
        if device_memory_limit is not None:
            kwargs["device_memory_limit"] = device_memory_limit
        with worker_config(dask_defaults):
            return LocalCUDACluster(**{k: v for k, v in kwargs.items() if v is not None})
    if rmm_pool_size is not None or device_memory_limit is not None:
        raise ConfigError("rmm_pool_size and device_memory_limit apply to GPU clusters only; "
                          "no GPU is in use here")
    from distributed import LocalCluster

    cores = _cpu_count()
    workers = workers or cores
    threads = threads_per_worker or max(1, cores // workers)
    # Numba sizes its thread pool at import: one per worker thread avoids
    # oversubscribing the cores when every worker runs parallel kernels.
    env = {"NUMBA_NUM_THREADS": str(threads), "OMP_NUM_THREADS": str(threads)}
    if threads == 1:
        # OpenMP threads that find no work spin before they sleep; with one thread per worker and one
        # worker per core, that spin takes a core from the other worker (or its snapshot writer):
        # 3-4 % of a 2-worker weather run here. They sleep at once instead.
        env["OMP_WAIT_POLICY"] = "PASSIVE"
    with worker_config(dask_defaults):
        return LocalCluster(n_workers=workers, threads_per_worker=1, processes=True, host=host,
                            dashboard_address=dashboard_address, protocol=protocol, security=security,
                            env=env, silence_logs=40)


def worker_info(client):
    """``{address: info}`` of the workers a client's scheduler has now.

    Use this, not ``client.scheduler_info()["workers"]``: a distributed
    ``Client`` refreshes its cached scheduler identity every few seconds
    *without* the workers, and when that refresh lands between
    ``scheduler_info()``'s own fetch and its return, the workers read as
    none (seen as "the dask cluster has no workers" in a benchmark run).
    This asks the scheduler and returns its answer directly.

    Parameters
    ----------
    client : distributed.Client
        A synchronous client.

    Returns
    -------
    dict
        Worker address -> dask's worker info (``nthreads``, ``memory_limit``,
        ``host``, ``name``, ...).

    Examples
    --------
    >>> client = start_cluster(workers=1, gpus=False, quiet=True)  # doctest: +SKIP
    >>> list(worker_info(client))                                  # doctest: +SKIP
    ['tcp://127.0.0.1:40575']
    """
    return client.sync(client.scheduler.identity, n_workers=-1)["workers"]


def slurm_cluster(*, gpus=0, dask_defaults=False, **kwargs):
    """A ``dask_jobqueue.SLURMCluster`` whose workers run hpcgpu (not yet scaled).

    Parameters
    ----------
    gpus : int
        GPUs per job: asks Slurm for them (``--gres=gpu:N``) and starts
        ``dask cuda worker`` (one worker per GPU) instead of ``dask worker``.
    dask_defaults : bool
        Leave out the exports of :func:`worker_environment` that the job
        script otherwise starts with (before ``job_script_prologue``, so
        the user's own exports win).
    **kwargs
        Passed to SLURMCluster (``queue``, ``account``, ``cores``, ``memory``,
        ``walltime``, ``job_extra_directives``, ...); ``cores`` defaults to 1
        and ``memory`` to ``"4GB"``. Inspect the batch script with
        ``.job_script()``, start jobs with ``.scale(jobs=N)``.

    Raises
    ------
    ClusterError
        dask-jobqueue is not installed (``pip install 'hpcgpu[jobqueue]'``).
    """
    SLURMCluster = _import_slurm_cluster()
    gpus = check_int("gpus", gpus, minimum=0)
    kwargs.setdefault("cores", 1)
    kwargs.setdefault("memory", "4GB")
    if not isinstance(dask_defaults, bool):
        raise ConfigError(f"dask_defaults must be True or False; got {dask_defaults!r}")
    # the workers on the nodes get the quieter settings of local clusters
    import shlex

    quiet = [] if dask_defaults else [f"export {name}={shlex.quote(str(value))}"
                                      for name, value in worker_environment().items()]
    prologue = [*quiet, *kwargs.pop("job_script_prologue", [])]
    prologue.append(f"export NUMBA_NUM_THREADS={kwargs['cores']}")
    if gpus:
        kwargs["job_extra_directives"] = [*kwargs.get("job_extra_directives", []), f"--gres=gpu:{gpus}"]
        # dask-cuda's worker command: one worker process per GPU, each seeing its GPU as device 0.
        kwargs.setdefault("worker_command", "dask_cuda.cli")
    return SLURMCluster(job_script_prologue=prologue, **kwargs)


def _import_slurm_cluster():
    """``dask_jobqueue.SLURMCluster``, with Python's Ctrl-C handler left as it was.

    dask-jobqueue's ``runner`` module (imported with it) replaces the SIGINT
    handler of the whole process by ``sys.exit()`` when it is first imported,
    for its own batch runner: after ``slurm_cluster()`` a Ctrl-C in the
    user's session raised SystemExit instead of KeyboardInterrupt (a run
    that should stop cleanly, a notebook kernel told to interrupt).
    """
    import signal
    import threading

    handler = signal.getsignal(signal.SIGINT)
    try:
        from dask_jobqueue import SLURMCluster
    except ImportError as error:
        raise ClusterError("jobqueue needs dask-jobqueue: pip install 'hpcgpu[jobqueue]'") from error
    finally:
        # only the main thread may set handlers; None: one not installed from Python, which cannot be put back
        if (handler is not None and signal.getsignal(signal.SIGINT) is not handler
                and threading.current_thread() is threading.main_thread()):
            signal.signal(signal.SIGINT, handler)
    return SLURMCluster


def worker_backends(client):
    """``{worker address: backend 'auto' resolves to there}``, asked of each worker."""
    from hpcgpu.backends import get_backend

    return client.run(lambda: get_backend("auto").name)


_RENAMED = ("hpcgpu.cluster(...) is deprecated and goes in the next release: call hpcgpu.start_cluster(...) "
            "(hpcgpu.cluster is the module)")


def cluster(*args, **kwargs):
    """Deprecated name of :func:`start_cluster` (it hid this module); warns, then calls it."""
    warnings.warn(_RENAMED, DeprecationWarning, stacklevel=2)
    return start_cluster(*args, **kwargs)


class _CallableModule(types.ModuleType):
    """This module, callable for one release as the function ``hpcgpu.cluster`` it used to be."""

    def __call__(self, *args, **kwargs):
        warnings.warn(_RENAMED, DeprecationWarning, stacklevel=2)
        return start_cluster(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
