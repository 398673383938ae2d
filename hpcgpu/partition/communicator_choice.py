"""Which communicator a rank gets: NCCL where every rank has a GPU of its own, else dask's.

:func:`choose_communicator` is what the engine calls in every epoch: the
first call of a session asks every rank for its :func:`nccl_identity` (one
allgather over the base, :class:`~hpcgpu.partition.dask_communicator.DaskCommunicator`)
and, where :func:`use_nccl` says NCCL can serve, bootstraps the session's
:class:`~hpcgpu.partition.nccl_communicator.NcclCommunicator` (its protocol
is described there); later calls reuse the decision and the NCCL
communicators (:mod:`hpcgpu.partition.nccl_sessions`).
:data:`NCCL_ENV` turns NCCL off; beyond :data:`MAX_RANKS` ranks the base
serves (each rank would hold 2(P-1) + 1 NCCL communicators).

Examples
--------
>>> use_nccl([("node1", "0000:1a:00.0"), ("node1", "0000:1b:00.0")])  # two GPUs of one node
True
>>> def epoch(session, rank):  # doctest: +SKIP
...     comm = choose_communicator(session, rank)   # NCCL on GPU workers, dask elsewhere
...     halo = comm.exchange({1 - rank: cupy.arange(4.0) + rank}, [1 - rank])
...     return comm.transport, float(halo[1 - rank][0])
"""

import ctypes
import os
import socket

from hpcgpu.partition.dask_communicator import communicator
from hpcgpu.partition.nccl_communicator import attach
from hpcgpu.partition.nccl_sessions import decisions, registry_lock, sweep

__all__ = ["MAX_RANKS", "NCCL_ENV", "choose_communicator", "nccl_communicator", "nccl_identity", "use_nccl"]

NCCL_ENV = "HPCGPU_COMM_NCCL"
"""Environment variable: ``0`` keeps device arrays on the base communicator (dask's comm layer)."""

MAX_RANKS = 8
"""Most ranks :func:`choose_communicator` gives NCCL: each rank holds 2(P-1) + 1 NCCL communicators, each
with its connection buffers and proxy thread (measure before raising it)."""


def nccl_communicator(session, rank, worker=None, ordered=True):
    """This worker's :class:`~hpcgpu.partition.nccl_communicator.NcclCommunicator` for ``rank`` of ``session``.

    NCCL without asking whether it can serve (see below).

    The first call of a session on every rank bootstraps its NCCL
    communicators (a collective: every rank calls it together, as the
    first epoch does); later calls reuse them. The engine calls
    :func:`choose_communicator`, which checks first that NCCL can serve.

    Raises
    ------
    ClusterError
        Called outside a dask worker, or on a worker that is not ``rank``'s.
    CommError
        The bootstrap failed (NCCL's error in the message).
    """
    return attach(communicator(session, rank, worker), ordered=ordered)


def nccl_identity():
    """``(host, PCI bus id)`` of this process's current GPU as NCCL tells devices apart, or None.

    None where NCCL cannot serve this rank: :data:`NCCL_ENV` is ``0``, no
    CuPy, no NCCL (2.7 or later, with ``send``/``recv``) in CuPy, or no GPU.
    Asks the CUDA driver, creating no CUDA context.

    Examples
    --------
    >>> identity = nccl_identity()
    >>> identity is None or len(identity) == 2
    True
    """
    if os.environ.get(NCCL_ENV, "1").strip().lower() in ("0", "false", "no"):
        return None
    try:
        import cupy
        from cupy.cuda import nccl
    except Exception:  # noqa: BLE001 - no CuPy, or a CuPy that cannot load: the base serves
        return None
    try:
        if not nccl.available or min(nccl.get_version(), nccl.get_build_version()) < 2700:
            return None
        ordinal = cupy.cuda.runtime.getDevice()
        bus = _pci_bus_id(ordinal)
    except Exception:  # noqa: BLE001 - no GPU or no driver
        return None
    if bus is None:
        return None
    host = os.environ.get("NCCL_HOSTID") or socket.gethostname()
    return host, bus


def _pci_bus_id(ordinal):
    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None
    device = ctypes.c_int(0)
    text = ctypes.create_string_buffer(64)
    if lib.cuInit(0) != 0 or lib.cuDeviceGet(ctypes.byref(device), int(ordinal)) != 0 or \
            lib.cuDeviceGetPCIBusId(text, 64, device) != 0:
        return None
    return text.value.decode().lower()


def use_nccl(identities):
    """Whether a group whose ranks have these :func:`nccl_identity` values can run on NCCL.

    Every rank needs one, all distinct (NCCL takes one rank per GPU), and
    at most :data:`MAX_RANKS` ranks, at least 2.

    Examples
    --------
    >>> use_nccl([("n1", "0000:1a:00.0"), ("n1", "0000:1b:00.0")])
    True
    >>> use_nccl([("n1", "0000:1a:00.0"), ("n1", "0000:1a:00.0")]), use_nccl([("n1", "0000:1a:00.0"), None])
    (False, False)
    """
    identities = list(identities)
    return (2 <= len(identities) <= MAX_RANKS and all(i is not None for i in identities)
            and len(set(identities)) == len(identities))


def choose_communicator(session, rank, worker=None):
    """The communicator for ``rank`` of ``session`` on this worker: NCCL where it can serve, else dask's.

    NCCL (:class:`~hpcgpu.partition.nccl_communicator.NcclCommunicator`) when every rank's worker has a GPU of
    its own (distinct by host and PCI bus id), CuPy with NCCL >= 2.7 imports
    there, :data:`NCCL_ENV` is not ``0``, and the session has 2 to
    :data:`MAX_RANKS` ranks; else the base
    :class:`~hpcgpu.partition.dask_communicator.DaskCommunicator`. The first call of
    a session decides, on every rank at once (one allgather over the base)
    and bootstraps NCCL; later calls (epochs) reuse both.

    Parameters
    ----------
    session : Session
    rank : int
    worker : distributed.Worker, optional
        The task's worker, for threads the task started.

    Raises
    ------
    ClusterError
        Called outside a dask worker, or on a worker that is not ``rank``'s.
    """
    base = communicator(session, rank, worker)
    if session.size < 2:
        return base
    key = (session.id, rank)
    with registry_lock:
        decided = decisions.get(key)
    if decided is None:
        sweep(base)
        decided = use_nccl(base.allgather(nccl_identity()))
        with registry_lock:
            decisions[key] = decided
    return attach(base) if decided else base
