"""dask clients that leave dask as they found it: connecting to a scheduler, owning a cluster, closing.

A ``distributed.Client`` registers itself as dask's default client before it
connects: one whose constructor fails would stay the default and swallow
every later dask computation of the process. :func:`new_client` closes such
a client again; :func:`own_client` ties a cluster that
:func:`hpcgpu.cluster.start_cluster` started to its client (closing one
closes the other); :func:`connect` joins a running scheduler;
:func:`close_client` closes a client and the local cluster it started.

Examples
--------
>>> from distributed import Client
>>> from hpcgpu.cluster_clients import connect
>>> connect(Client, "no address", timeout=1, security=None)
Traceback (most recent call last):
...
hpcgpu.errors.ConfigError: address must look like 'tcp://host:8786'; got 'no address'
"""

import warnings
import weakref

from hpcgpu.errors import ClusterError, ConfigError

__all__ = ["close_client", "connect", "new_client", "own_client", "warn_if_one_is_running"]


_started_here = weakref.WeakSet()  # clients of the clusters start_cluster() started in this process (own_client)


def warn_if_one_is_running():
    """Warn when a cluster an earlier call started is still running (a notebook cell run twice, say).

    Its workers, memory (a GPU's RMM pool) and dashboard port stay taken
    until its client is closed; dask itself only says that port 8787 is in use.
    """
    running = [c for c in list(_started_here) if c.status == "running"]
    if running:
        links = ", ".join(str(c.dashboard_link) for c in running)
        warnings.warn(f"{len(running)} cluster(s) an earlier start_cluster() call started in this process "
                      f"still run (dashboard {links}) and keep their workers and memory: close them with "
                      "client.close() when they are no longer needed", ResourceWarning, stacklevel=3)


def new_client(Client, *args, **kwargs):
    """``Client(*args, **kwargs)``; if it fails, dask is left as it was before the call.

    A Client makes itself dask's default client (and sets dask's
    ``scheduler`` option to its distributed scheduler) in its constructor,
    *before* it connects, and undoes both only when closed. One whose
    constructor failed (an address dask parses only there, such as
    ``tcp://host:notaport``) is never closed by anyone: it stayed the default client, in
    state "connecting", with its event loop thread running, until the
    garbage collector happened to find it, and every dask computation in
    the process (``dask.array.to_zarr``, xarray's ``.values`` of a Zarr
    store) meanwhile queued its tasks on it and waited forever. Such a
    client is closed here, which also stops its thread and puts back the
    ``scheduler`` option.
    """
    import dask

    before = dask.config.get("scheduler", None)
    known = _default_clients()  # the objects, not their ids: an id may be reused meanwhile
    try:
        return Client(*args, **kwargs)
    except BaseException:
        for client in _default_clients():
            if not any(client is old for old in known):
                _close_failed_client(client)
        if before is None:
            dask.config.config.pop("scheduler", None)
        else:
            dask.config.set(scheduler=before)
        raise


def _default_clients():
    """The clients distributed keeps as candidates for its default client (newest last)."""
    try:
        from distributed.client import _del_global_client, _global_clients  # noqa: F401 - both used below
    except ImportError:  # pragma: no cover - a distributed without them: nothing to clean up
        return []
    return [client for _, client in sorted(_global_clients.items())]


def _close_failed_client(client):
    """Close a client whose constructor failed, so that it is no longer dask's default client.

    ``close()`` unregisters it and stops its event loop thread; the
    unregistering is repeated in case ``close()`` itself fails (its
    timeout is the client's own, which may be tiny). Only called on what
    :func:`_default_clients` found, so the private names are there.
    """
    from distributed.client import _del_global_client

    try:
        client.close(timeout=10)
    except Exception:  # noqa: BLE001 - already failing: the constructor's error is the one to raise
        pass
    finally:
        _del_global_client(client)


def own_client(Client, cluster, timeout):
    """A client of ``cluster`` (just started here) that closes it with itself; the cluster closed on failure."""
    try:
        client = new_client(Client, cluster, timeout=timeout)
    except BaseException as error:
        cluster.close()  # nothing else refers to it: its workers and ports would stay until the process exits
        if isinstance(error, (OSError, TimeoutError)):
            raise ClusterError(f"the cluster started but the client could not connect to its scheduler "
                               f"at {cluster.scheduler_address!r} within {timeout:g} s ({error}); "
                               "the cluster is closed again (a larger timeout may help)") from None
        raise
    # dask closes a cluster with a client only when the client started it itself (no address given); this
    # one was started for this client alone, so client.close() (and a client dropped) closes it too
    client._start_arg = None
    _started_here.add(client)
    return client


def close_client(client):
    """Close ``client`` and the local cluster it started, if any (a joined scheduler keeps running).

    ``client.close()`` does the same for a client from :func:`start_cluster`;
    this also closes the cluster of a client made otherwise.
    """
    if client is None:
        return
    local = getattr(client, "cluster", None)  # None for a client of a running scheduler
    client.close()
    if local is not None:
        local.close()


def connect(Client, address, timeout, security):
    """A client of the running scheduler at ``address``; ConfigError for a bad address, ClusterError if unreachable."""
    if not isinstance(address, str) or "://" not in address and ":" not in address:
        raise ConfigError(f"address must look like 'tcp://host:8786'; got {address!r}")
    if address.startswith("tls://") and (security is None or getattr(security, "tls_client_cert", None) is None):
        raise ConfigError(f"the scheduler at {address!r} speaks TLS: pass security=distributed.Security("
                          "tls_ca_file=..., tls_client_cert=..., tls_client_key=...) with certificates it trusts")
    try:
        return new_client(Client, address, timeout=timeout, security=security)
    except ValueError as error:  # dask parses the address only now: an unknown scheme, a port that is no number
        raise ConfigError(f"address must look like 'tcp://host:8786'; got {address!r} ({error})") from None
    except (OSError, TimeoutError) as error:
        raise ClusterError(
            f"could not reach a dask scheduler at {address!r} within {timeout:g} s ({error}). "
            "Start one with 'dask scheduler' and check the address, port and firewall.") from None
