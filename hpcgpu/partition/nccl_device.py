"""The device layer of the NCCL transport: one rank's NCCL communicators and streams, through CuPy.

:class:`NcclDevice` holds a main communicator of all ranks (collectives)
and one two-rank communicator per direction (i -> j) with its own
non-blocking stream, made and connected by :meth:`NcclDevice.bootstrap`
while every rank is there (see "Why one NCCL communicator per direction" in
:mod:`hpcgpu.partition.nccl_communicator`). Every operation waits on an event of
the caller's current stream and returns an event that says when it is done.
CuPy is imported only when a device is made.
"""

import threading
import time

import numpy as np

from hpcgpu.errors import CommTimeout

__all__ = ["NAP_S", "NcclDevice", "call_within"]

NAP_S = 1e-3       # longest sleep between polls
_WARM_UP_BYTES = 1 << 23  # the largest message of the bootstrap's connection warm-up

_NCCL_DTYPES = {("f", 2): "NCCL_FLOAT16", ("f", 4): "NCCL_FLOAT32", ("f", 8): "NCCL_FLOAT64",
                ("i", 1): "NCCL_INT8", ("i", 4): "NCCL_INT32", ("i", 8): "NCCL_INT64",
                ("u", 1): "NCCL_UINT8", ("u", 4): "NCCL_UINT32", ("u", 8): "NCCL_UINT64"}
_NCCL_OPS = {"sum": "NCCL_SUM", "max": "NCCL_MAX", "min": "NCCL_MIN"}


class NcclDevice:
    """One rank's NCCL communicators and streams, and the CuPy calls the protocol needs.

    Every NCCL call here is one of ``cupy.cuda.nccl``: ``get_unique_id``,
    ``NcclCommunicator(ndev, commId, rank)``, its ``send``/``recv``
    (NCCL >= 2.7), ``allGather``, ``allReduce``, ``check_async_error`` and
    ``abort`` (ncclCommAbort).
    """

    def __init__(self, rank, size, main, main_stream, outgoing, incoming):
        import cupy
        from cupy.cuda import nccl

        self.cupy, self.nccl = cupy, nccl
        self.array_type = cupy.ndarray
        self.rank, self.size = rank, size
        self.main, self.main_stream = main, main_stream
        self.outgoing, self.incoming = outgoing, incoming  # peer -> (communicator, stream)

    @classmethod
    def bootstrap(cls, base, rank, size, timeout):
        """Make every NCCL communicator of this rank (a collective of all ranks, over ``base``)."""
        import cupy
        from cupy.cuda import nccl

        made = []
        try:
            root_id = base.bcast(nccl.get_unique_id() if rank == 0 else None, root=0, timeout=timeout)
            # each rank makes the ids of its own directions (rank -> peer)
            ids = base.allgather({peer: nccl.get_unique_id() for peer in range(size) if peer != rank}, timeout)
            # ncclCommInitRank blocks until every rank joins and has no timeout of its own
            main = call_within(lambda: nccl.NcclCommunicator(size, root_id, rank), timeout,
                               f"rank {rank}: NCCL's communicator of all {size} ranks (ncclCommInitRank)", rank)
            made.append(main)
            main_stream = cupy.cuda.Stream(non_blocking=True)
            outgoing, incoming = {}, {}
            probe = cupy.zeros(_WARM_UP_BYTES, cupy.uint8)
            deadline = time.monotonic() + timeout
            for source in range(size):
                for dest in range(size):
                    if source == dest or rank not in (source, dest):
                        continue
                    comm = call_within(lambda: nccl.NcclCommunicator(2, ids[source][dest], 0 if rank == source else 1),
                                       max(deadline - time.monotonic(), NAP_S),
                                       f"rank {rank}: NCCL's communicator {source} -> {dest} (ncclCommInitRank)", rank)
                    made.append(comm)
                    stream = cupy.cuda.Stream(non_blocking=True)
                    # connect now, while every rank is here (a first send/recv blocks until the peer joins);
                    # a small and a large message, in case NCCL gives larger ones more channels
                    for count in (1, probe.size):
                        if rank == source:
                            comm.send(probe.data.ptr, count, nccl.NCCL_UINT8, 1, stream.ptr)
                        else:
                            comm.recv(probe.data.ptr, count, nccl.NCCL_UINT8, 0, stream.ptr)
                    if rank == source:
                        outgoing[dest] = (comm, stream)
                    else:
                        incoming[source] = (comm, stream)
                    event = stream.record()
                    while not event.done:
                        if time.monotonic() > deadline:
                            raise CommTimeout(f"rank {rank}: NCCL could not connect {source} -> {dest} within "
                                              f"{timeout:g} s", rank=rank)
                        time.sleep(NAP_S)
            return cls(rank, size, main, main_stream, outgoing, incoming)
        except BaseException:
            for comm in made:
                _quietly(comm.abort)
            raise

    def contiguous(self, array):
        # ascontiguousarray makes a 0-d array 1-d, as NumPy's does: keep the shape
        return self.cupy.ascontiguousarray(array).reshape(array.shape)

    def empty(self, shape, dtype):
        return self.cupy.empty(shape, dtype)

    def asarray(self, value):
        return self.cupy.asarray(value)

    def as_bytes(self, array):
        """A contiguous array's bytes as a 1-D uint8 view."""
        return array.reshape(-1).view(self.cupy.uint8)

    def reductions(self):
        cupy = self.cupy
        return {"sum": lambda a, b: a + b, "max": cupy.maximum, "min": cupy.minimum, "any": cupy.logical_or,
                "all": cupy.logical_and}

    def _after_current(self, stream):
        event = self.cupy.cuda.Event(disable_timing=True)
        event.record(self.cupy.cuda.get_current_stream())
        stream.wait_event(event)

    def _finished(self, stream):
        event = self.cupy.cuda.Event(disable_timing=True)
        event.record(stream)
        return event

    def send(self, dest, array):
        """Post an NCCL send of ``array`` (contiguous) to ``dest``; an event with ``done``."""
        comm, stream = self.outgoing[dest]
        self._after_current(stream)
        comm.send(array.data.ptr, array.nbytes, self.nccl.NCCL_UINT8, 1, stream.ptr)
        return self._finished(stream)

    def recv(self, source, array):
        """Post an NCCL receive into ``array`` (contiguous) from ``source``; an event with ``done``."""
        comm, stream = self.incoming[source]
        self._after_current(stream)
        comm.recv(array.data.ptr, array.nbytes, self.nccl.NCCL_UINT8, 0, stream.ptr)
        return self._finished(stream)

    def allgather(self, chunk):
        """Every rank's ``chunk`` (1-D uint8, one length) end to end: ``(array, event)``."""
        out = self.cupy.empty(self.size * chunk.size, self.cupy.uint8)
        self._after_current(self.main_stream)
        self.main.allGather(chunk.data.ptr, out.data.ptr, chunk.size, self.nccl.NCCL_UINT8, self.main_stream.ptr)
        return out, self._finished(self.main_stream)

    def can_allreduce(self, dtype, op):
        dtype = np.dtype(dtype)
        return op in _NCCL_OPS and (dtype.kind, dtype.itemsize) in _NCCL_DTYPES

    def allreduce(self, array, op):
        """ncclAllReduce of ``array`` (contiguous): ``(array, event)``."""
        kind = _NCCL_DTYPES[array.dtype.kind, array.dtype.itemsize]
        out = self.cupy.empty_like(array)
        self._after_current(self.main_stream)
        self.main.allReduce(array.data.ptr, out.data.ptr, array.size, getattr(self.nccl, kind),
                            getattr(self.nccl, _NCCL_OPS[op]), self.main_stream.ptr)
        return out, self._finished(self.main_stream)

    def _communicators(self):
        return [self.main] + [c for c, _ in self.outgoing.values()] + [c for c, _ in self.incoming.values()]

    def check(self):
        """Raise NCCL's asynchronous error of any communicator (a peer's connection broke)."""
        for comm in self._communicators():
            comm.check_async_error()

    def abort(self):
        """ncclCommAbort every communicator: frees them and stops their kernels (never raises)."""
        for comm in self._communicators():
            _quietly(comm.abort)


def _quietly(call):
    try:
        call()
    except Exception:  # noqa: BLE001 - tearing down: nothing left to tell
        pass


def call_within(call, timeout, describe, rank=None):
    """``call()``'s result, or :class:`~hpcgpu.errors.CommTimeout` after ``timeout`` seconds.

    For a blocking call with no deadline of its own (``ncclCommInitRank``
    waits for every rank to join, forever): it runs in a daemon thread,
    and past the deadline the rank stops waiting and reports what it was
    doing. The thread stays blocked until the call returns (Python cannot
    stop it); whatever it makes then is not used. Errors of the call are
    raised here.

    Examples
    --------
    >>> call_within(lambda: 6 * 7, 1.0, "a quick call")
    42
    >>> call_within(lambda: time.sleep(1), 0.05, "rank 0: a slow call", 0)
    Traceback (most recent call last):
    ...
    hpcgpu.errors.CommTimeout: rank 0: a slow call did not finish within 0.05 s
    """
    outcome = {}

    def run():
        try:
            outcome["value"] = call()
        except BaseException as error:  # noqa: BLE001 - handed to the waiting thread
            outcome["error"] = error

    thread = threading.Thread(target=run, name="hpcgpu-bounded-call", daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        raise CommTimeout(f"{describe} did not finish within {timeout:g} s", rank=rank)
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]
