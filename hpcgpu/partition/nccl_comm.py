"""The communicator's NCCL transport: CuPy device buffers move GPU to GPU, everything else rides on dask.

:class:`NcclCommunicator` wraps a
:class:`~hpcgpu.partition.dask_comm.DaskCommunicator` (the *base*). The
device buffers of a message (a bare ``cupy.ndarray``, or the CuPy arrays
inside any picklable object: a model's state dataclass, a tuple, a dict)
travel through NCCL (``cupy.cuda.nccl``); the rest of the message,
everything else (Python objects, NumPy arrays, scalars), every abort and
every timeout go through the base. :func:`choose_communicator` gives the
engine this transport where every rank has a GPU of its own, else the
base.

Matching, as in MPI
-------------------
A send posts the NCCL sends of its device buffers at once (each in C
order: a non-contiguous array is copied first), then sends
two small messages over the base: a *header* on the direction's control
key (sequence number, shape, dtype of each buffer) and the *envelope*
under the caller's tag (the object with a placeholder for each buffer).
The base matches tags and keeps the order per (source, tag) exactly as for
host objects, so one tag may carry host and device messages in any mix;
the receiver posts NCCL receives in the order of the headers, which is the
sender's order, so NCCL's order-matched point-to-point operations never
cross two messages. The receiver does not need to know shapes or dtypes.

An NCCL send may wait until its receive is posted (NVIDIA/nccl#783).
Receives are therefore posted *eagerly*: whenever a rank waits for
anything on this communicator, it reads the headers that reached it from
every peer and posts their receives (into new arrays, which wait there
until the caller receives them). A device send completes once its
receiver has entered the communicator; until then its NCCL kernel waits on
the sender's GPU. A rank that never waits on the communicator holds its
peers' device sends (until their timeout), as an MPI rank that never makes
progress does.

Why one NCCL communicator per direction
---------------------------------------
NCCL runs the operations of one communicator one after the other
(NVIDIA/nccl#574): two ranks that both send before receiving, as every
halo exchange does, would deadlock on one communicator. So each ordered
pair (i -> j) has a two-rank communicator that carries only i's sends to
j, in order; a main communicator of all ranks carries the collectives.
NCCL connects two ranks at their first send/receive, blocking the host
until the peer joins (NVIDIA/nccl#783), so the bootstrap connects every
direction while all ranks are there, in one global order (which cannot
deadlock). That is P(P-1) + 1 communicators for P ranks:
:func:`choose_communicator` keeps the base beyond :data:`MAX_RANKS`.

Streams and completion
----------------------
Each NCCL communicator has its own non-blocking stream (no implicit
synchronisation with the legacy default stream where CuPy launches
kernels). An NCCL operation first waits on an event recorded on the
caller's current stream (the data to send is written; a receive buffer's
memory is no longer read there), and a request completes when the event
recorded after the operation is done, polled against the wait's timeout.

Collectives
-----------
``allgather`` of bare device arrays exchanges small descriptors over the
base first (every rank then takes the same path), then runs one
ncclAllGather of the bytes, each rank's padded to the longest: exact
copies. ``allreduce`` of device arrays combines the gathered values on
every rank with CuPy, in the generic allreduce's fixed tree order
(:func:`~hpcgpu.partition.collectives.tree_reduce`): bitwise the same on
every rank, and what the generic reduction gives. With ``ordered=False``,
arrays of one shape and dtype are reduced by ncclAllReduce (sum, max,
min): NCCL computes each element once and copies it to every rank (ring
and tree algorithms), so the ranks agree with each other, but the order of
the additions is NCCL's: not bitwise the generic sum for floats. Scalars
and host values are gathered over the base and combined in the same tree
order. ``gather``, ``bcast``, ``exchange`` and ``barrier``
are the generic ones on the point-to-point path above.

Faults
------
An abort by any rank (the base's) aborts this rank's NCCL communicators
(ncclCommAbort: kernels waiting for a peer stop) and its waits raise
:class:`~hpcgpu.errors.CommAborted`. An NCCL operation past its wait's
timeout aborts the NCCL communicators and the session, then raises
:class:`~hpcgpu.errors.CommTimeout`. Either way the session's NCCL
transport is gone; later calls raise CommAborted.

Limits (NCCL's)
---------------
- Ranks must be on distinct GPUs: NCCL does not support two ranks of one
  communicator on one device (NCCL user guide, "Creating a Communicator")
  and refuses it at init since NCCL 2.5 ("Duplicate GPU detected",
  NVIDIA/nccl#418). NCCL tells devices apart by host and PCI bus id, the
  host being ``NCCL_HOSTID`` where set; :func:`choose_communicator` uses
  the same rule.
- ncclCommInitRank has no timeout: a rank lost during the bootstrap leaves
  the others in it (the client still sees the lost worker).
- Several NCCL communicators run their kernels concurrently, which needs
  the GPU to hold them all (NCCL user guide, "Using multiple NCCL
  communicators concurrently"); these kernels are small.
- A device-wide synchronisation (``cudaDeviceSynchronize``, a
  ``cudaFree``) while a device send waits for its receiver waits for that
  receiver, without a timeout: wait for device sends before synchronising
  the device, and receive a device message in the epoch that sent it (the
  engine synchronises the device at the end of an epoch; its
  decompositions receive every halo in the step that sends it).
- A receive waits for the work queued before it on the caller's stream
  (its buffer is allocated there), and eagerly posted receives are
  allocated as their headers arrive.

The NCCL communicators are created inside the first epoch of a session
and kept on the worker for the next ones (:func:`release` ends them).

Where it lives: this module chooses the transport (:func:`choose_communicator`,
:func:`nccl_communicator`); :mod:`~hpcgpu.partition.nccl_transport` is the
communicator and its per-session state, :mod:`~hpcgpu.partition.nccl_messages`
splits device arrays from a message, :mod:`~hpcgpu.partition.nccl_device`
drives NCCL through CuPy. All of them build on the base,
:mod:`hpcgpu.partition.dask_comm`, which knows none of them.

Examples
--------
>>> def epoch(session, rank):  # doctest: +SKIP
...     comm = choose_communicator(session, rank)   # NCCL on GPU workers, dask elsewhere
...     halo = comm.exchange({1 - rank: cupy.arange(4.0) + rank}, [1 - rank])
...     return comm.transport, float(halo[1 - rank][0])
"""

import ctypes
import os
import socket

from hpcgpu.partition.dask_comm import communicator
from hpcgpu.partition.nccl_messages import _join, _split  # noqa: F401 - the names the tests and users saw here
from hpcgpu.partition.nccl_transport import (  # noqa: F401 - as above
    NcclCommunicator,
    _attach,
    _bootstraps,
    _decisions,
    _registry_lock,
    _sweep,
    release,
)

__all__ = ["MAX_RANKS", "NCCL_ENV", "NcclCommunicator", "choose_communicator", "nccl_communicator",
           "nccl_identity", "release", "use_nccl"]

NCCL_ENV = "HPCGPU_COMM_NCCL"
"""Environment variable: ``0`` keeps device arrays on the base communicator (dask's comm layer)."""

MAX_RANKS = 8
"""Most ranks :func:`choose_communicator` gives NCCL: each rank holds 2(P-1) + 1 NCCL communicators, each
with its connection buffers and proxy thread (measure before raising it)."""


def nccl_communicator(session, rank, worker=None, ordered=True):
    """This worker's :class:`NcclCommunicator` for ``rank`` of ``session``, NCCL without asking (see below).

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
    return _attach(communicator(session, rank, worker), ordered=ordered)


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

    NCCL (:class:`NcclCommunicator`) when every rank's worker has a GPU of
    its own (distinct by host and PCI bus id), CuPy with NCCL >= 2.7 imports
    there, :data:`NCCL_ENV` is not ``0``, and the session has 2 to
    :data:`MAX_RANKS` ranks; else the base
    :class:`~hpcgpu.partition.dask_comm.DaskCommunicator`. The first call of
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
    with _registry_lock:
        decided = _decisions.get(key)
    if decided is None:
        _sweep(base)
        decided = use_nccl(base.allgather(nccl_identity()))
        with _registry_lock:
            _decisions[key] = decided
    return _attach(base) if decided else base
