"""The communicator's fast path on tcp and tls clusters: one socket per rank and peer, no event loop in between.

dask's comm layer costs about 0.35 ms of CPU per message on a worker's
event loop (framing, msgpack, tornado), and every message crosses between
the rank's thread and that loop twice. Both add up on a small step: a
4 KiB round trip took 1.0-1.3 ms here, and the loop's work held the GIL
while the rank's kernels waited for it. On clusters that speak ``tcp://``
or ``tls://`` the session therefore carries each worker's *direct*
listener, a plain socket (wrapped with the cluster's own TLS context on
``tls://``: the same certificates, never weaker than dask's own traffic),
and a rank sends from its own thread: the object pickled with protocol 5
(NumPy buffers out of band, no copy), and the header, pickle and buffers
go out in one ``send`` (joined, up to :data:`_COALESCE_BYTES`). A receiver thread per incoming connection blocks in
``recv`` (the GIL released), unpickles, and files the message in the
session's mailbox, exactly where the dask path files it: waits, aborts and
timeouts are the same. Other protocols (``ucx://``) keep the dask path,
and ``HPCGPU_COMM_DIRECT=0`` turns the fast path off (a firewall that
allows only dask's ports).

Frames, on one connection per (session, source rank, destination worker):
``kind`` (``D`` data, ``A`` abort, ``B`` goodbye), then for data the
length of the pickled header ``(dest, key, buffer lengths)`` and of the
pickle, the header, the pickle and the buffers. A connection that ends
without a goodbye aborts its session on the receiving worker (the sender's
worker died); a message that cannot be rebuilt there aborts the session
with the sender's rank, the tag and the error (the stream itself is intact).

A send never hangs: when the socket buffer is full (a slow or stopped
peer) the rank waits for room in short slices, checking between them for
an abort of the session and for the communicator's timeout
(:class:`~hpcgpu.errors.CommAborted`, :class:`~hpcgpu.errors.CommTimeout`).

Examples
--------
>>> import pickle, numpy as np
>>> data, buffers = encode(np.arange(4.0))
>>> decode(data, [bytearray(b) for b in buffers]).tolist()
[0.0, 1.0, 2.0, 3.0]
"""

import io
import logging
import os
import pickle
import select
import socket
import struct
import threading
import time

import numpy as np

from hpcgpu.errors import CommAborted, CommError, CommTimeout

__all__ = ["DIRECT_ENV", "Link", "Listener", "decode", "direct_enabled", "encode"]

logger = logging.getLogger(__name__)

DIRECT_ENV = "HPCGPU_COMM_DIRECT"
"""Environment variable: ``0`` keeps every message on dask's comm layer."""

_HELLO = struct.Struct("!I")       # length of the pickled (session, source rank)
_SIZES = struct.Struct("!II")      # lengths of the header and of the pickle
_BUFFER = struct.Struct("!Q")      # length of one out-of-band buffer

_COALESCE_BYTES = 1 << 18
"""A message up to this size is joined and sent in one ``sendall`` (the copy
costs less than the extra system calls: MD slabs of 6,912 atoms, 6.95
against 7.2 ms a step, docs/benchmarks.md); larger ones go part by part."""

_WAIT_S = 0.25
"""Longest single wait for room in a full socket buffer: between waits a send looks for an abort and its deadline."""

_GOODBYE_S = 5.0
"""Longest a goodbye or an abort frame may take to leave (best effort: the peer has its own timeout)."""


def direct_enabled(address):
    """Whether a worker at ``address`` gets the fast path (tcp/tls, not turned off)."""
    if os.environ.get(DIRECT_ENV, "1").strip() in ("0", "false", "no"):
        return False
    return address.startswith(("tcp://", "tls://"))


class _Pickler(pickle.Pickler):
    """Protocol 5 with non-contiguous NumPy arrays made contiguous first.

    NumPy pickles a non-contiguous array in band, and that path drops a
    non-native byte order (a strided ``>f8`` view arrives as ``<f8``): such
    an array travels as its contiguous copy, out of band like any other.
    Everything else pickles as with :func:`pickle.dumps` (the hook is not
    even called for ints, floats, strings, tuples, lists and dicts).
    """

    def reducer_override(self, obj):
        if type(obj) is np.ndarray and not obj.flags.forc:
            return np.ascontiguousarray(obj).__reduce_ex__(5)
        return NotImplemented


_SCALARS = frozenset({int, float, bool, str, bytes, type(None)})


def _contiguous(obj):
    """True if ``obj`` is a contiguous NumPy array, a scalar, or a tuple or list of them (nothing for _Pickler).

    A quick look at the shapes halo and ghost messages take; anything else
    (dicts, dataclasses, nested containers) goes through :class:`_Pickler`.
    """
    kind = type(obj)
    if kind is np.ndarray:
        return obj.flags.forc
    if kind is tuple or kind is list:
        for item in obj:
            kind = type(item)
            if kind is np.ndarray:
                if not item.flags.forc:
                    return False
            elif kind not in _SCALARS and not isinstance(item, np.generic):  # NumPy scalars: native order
                return False
        return True
    return kind in _SCALARS or isinstance(obj, np.generic)


def encode(obj):
    """``(pickle bytes, out-of-band buffers)`` of ``obj`` (protocol 5: arrays travel without a copy).

    Objects plain pickle refuses but dask would send (lambdas, functions of
    ``__main__``) go with cloudpickle.

    Raises
    ------
    pickle.PicklingError, TypeError, AttributeError
        Neither pickle nor cloudpickle can serialize ``obj`` (the error of cloudpickle).
    """
    buffers = []
    try:
        if _contiguous(obj):  # the messages of a step: pickle.dumps, the cheapest (no Pickler object to make)
            data = pickle.dumps(obj, protocol=5, buffer_callback=buffers.append)
        else:
            stream = io.BytesIO()
            _Pickler(stream, protocol=5, buffer_callback=buffers.append).dump(obj)
            data = stream.getvalue()
    except Exception:  # noqa: BLE001 - whatever pickle refuses, cloudpickle may take
        import cloudpickle

        buffers = []
        data = cloudpickle.dumps(obj, protocol=5, buffer_callback=buffers.append)
    return data, [b.raw() for b in buffers]


def decode(data, buffers):
    """The object :func:`encode` gave ``data`` and ``buffers`` for."""
    return pickle.loads(data, buffers=buffers)


def _recv_exactly(sock, size):
    buffer = bytearray(size)
    view = memoryview(buffer)
    got = 0
    while got < size:
        count = sock.recv_into(view[got:], size - got)
        if count == 0:
            raise ConnectionError("the connection closed")
        got += count
    return buffer


def _host_port(address):
    """``(host, port)`` of ``tcp://host:port`` (brackets of IPv6 hosts removed)."""
    rest = address.split("://", 1)[-1]
    host, _, port = rest.rpartition(":")
    return host.strip("[]"), int(port)


def _ssl_contexts(worker):
    """``(server, client)`` SSL contexts of a ``tls://`` worker (its dask security), or ``(None, None)``."""
    if not worker.address.startswith("tls://"):
        return None, None
    server = worker.security.get_listen_args("worker").get("ssl_context")
    client = worker.security.get_connection_args("worker").get("ssl_context")
    if server is None or client is None:
        raise RuntimeError("a tls:// worker without TLS contexts")
    return server, client


class Listener:
    """A worker's socket for the direct path; a thread accepts, one thread per connection receives.

    ``deliver(session, dest, source, key, obj)``, ``abort(session, reason)``
    and ``finished(session, source)`` are the extension's mailbox hooks;
    ``fail(session, dest, reason)`` aborts the session on every worker (a
    message this worker cannot rebuild: its peers would wait otherwise).
    """

    def __init__(self, worker, deliver, abort, finished, fail):
        self._deliver, self._abort, self._finished, self._fail = deliver, abort, finished, fail
        self._server_ssl, self.client_ssl = _ssl_contexts(worker)
        host, _ = _host_port(worker.address)
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._socket = socket.socket(family, socket.SOCK_STREAM)
        self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._socket.bind((host, 0))
        self._socket.listen(64)
        self.address = f"{host}:{self._socket.getsockname()[1]}"
        threading.Thread(target=self._accept, name="hpcgpu-comm-accept", daemon=True).start()

    def _accept(self):
        while True:
            try:
                connection, _ = self._socket.accept()
            except OSError:  # closed
                return
            threading.Thread(target=self._receive, args=(connection,), name="hpcgpu-comm-receive",
                             daemon=True).start()

    def _receive(self, connection):
        session = source = None
        try:
            connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self._server_ssl is not None:
                connection = self._server_ssl.wrap_socket(connection, server_side=True)
            (size,) = _HELLO.unpack(_recv_exactly(connection, _HELLO.size))
            session, source = pickle.loads(_recv_exactly(connection, size))
            while True:
                kind = bytes(_recv_exactly(connection, 1))
                if kind == b"D":
                    header_size, data_size = _SIZES.unpack(_recv_exactly(connection, _SIZES.size))
                    dest, key, lengths = pickle.loads(_recv_exactly(connection, header_size))
                    data = _recv_exactly(connection, data_size)
                    buffers = [_recv_exactly(connection, n) for n in lengths]
                    try:
                        obj = decode(data, buffers)
                    except Exception as error:  # noqa: BLE001 - the frame was read whole: the stream goes on
                        self._fail(session, dest, f"rank {dest} cannot rebuild the message rank {source} sent "
                                                  f"tagged {key!r}: {type(error).__name__}: {error}")
                        continue
                    self._deliver(session, dest, source, key, obj)
                elif kind == b"A":
                    (size,) = _HELLO.unpack(_recv_exactly(connection, _HELLO.size))
                    self._abort(session, _recv_exactly(connection, size).decode())
                elif kind == b"B":
                    self._finished(session, source)
                    return
                else:
                    raise ConnectionError(f"unknown frame {kind!r}")
        except Exception as error:  # noqa: BLE001 - any broken connection: the sender is gone
            if session is not None:
                self._abort(session, f"rank {source}'s connection closed without a goodbye "
                                     f"({type(error).__name__}): its worker was lost or it stopped")
        finally:
            try:
                connection.close()
            except OSError:
                pass

    def close(self):
        self._socket.close()


class Link:
    """One rank's connection to a peer worker's :class:`Listener` for one session (thread-safe sends)."""

    def __init__(self, address, session, source, client_ssl=None, timeout=30.0):
        host, port = _host_port("tcp://" + address)
        sock = socket.create_connection((host, port), timeout=timeout)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if client_ssl is not None:
            sock = client_ssl.wrap_socket(sock, server_hostname=host if client_ssl.check_hostname else None)
        # plain sockets block and send with MSG_DONTWAIT (one call when there is room); an SSL socket
        # refuses flags, so a timeout bounds each of its writes instead
        sock.settimeout(None if client_ssl is None else _WAIT_S)
        self._tls = client_ssl is not None
        self._socket = sock
        self._lock = threading.Lock()
        self.closed = False
        self.source = source
        hello = pickle.dumps((session, source))
        self._send(_HELLO.pack(len(hello)) + hello, time.monotonic() + timeout, None)

    def send(self, dest, key, obj, timeout=None, aborted=None):
        """Send ``obj`` to rank ``dest`` under ``key``, within ``timeout`` seconds (None: no limit).

        ``aborted()`` says why the session was aborted (None while it is
        not): a send that waits for room in a full socket buffer looks at it
        and at its deadline every :data:`_WAIT_S`.

        Raises
        ------
        CommError
            Neither pickle nor cloudpickle can serialize ``obj`` (nothing was sent).
        CommTimeout, CommAborted
            The peer took no data for ``timeout`` seconds, or the session was aborted meanwhile; the
            message went out in part, so the link is closed.
        OSError
            The connection is closed or broken.
        """
        try:
            data, buffers = encode(obj)
        except Exception as error:  # noqa: BLE001 - what fails to pickle is the caller's object: say which
            raise CommError(f"rank {self.source} cannot send the {type(obj).__module__}.{type(obj).__qualname__} "
                            f"object tagged {key!r} to rank {dest}: neither pickle nor cloudpickle can serialize "
                            f"it ({type(error).__name__}: {error})", rank=self.source) from error
        header = pickle.dumps((dest, key, [len(b) for b in buffers]))
        head = b"D" + _SIZES.pack(len(header), len(data)) + header
        parts = [head, data, *buffers]
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            if sum(len(part) for part in parts) <= _COALESCE_BYTES:
                # one system call: each one gives the GIL up and must win it back from the
                # worker's receive thread, busy with the peer's message of the same step
                self._send(b"".join(parts), deadline, aborted)
            else:
                for part in parts:
                    self._send(part, deadline, aborted)

    def _send(self, data, deadline, aborted):
        """Send all of ``data`` (the lock held): at once if the buffer has room, else in bounded waits."""
        sock = self._socket
        sent = 0
        if not self._tls:
            try:
                sent = sock.send(data, socket.MSG_DONTWAIT)
            except BlockingIOError:
                pass
            if sent == len(data):
                return
        view = memoryview(data).cast("B")
        poller = None
        while sent < len(view):
            reason = None if aborted is None else aborted()
            if reason is not None:
                self._break()
                raise CommAborted(f"rank {self.source}: the run was aborted while sending: {reason}",
                                  rank=self.source)
            if deadline is not None and time.monotonic() >= deadline:
                self._break()
                raise CommTimeout(f"rank {self.source}: the peer took no data for the send's timeout (it hangs, "
                                  f"or its worker is gone); {sent} of {len(view)} bytes went out",
                                  rank=self.source)
            try:
                if self._tls:
                    # a timed-out SSL write is retried with the same data, as SSL requires
                    sent += sock.send(view[sent:])
                else:
                    if poller is None:
                        poller = select.poll()
                        poller.register(sock, select.POLLOUT)
                    if poller.poll(_WAIT_S * 1000):
                        sent += sock.send(view[sent:], socket.MSG_DONTWAIT)
            except (BlockingIOError, TimeoutError):
                pass

    def _break(self):
        """Close without a goodbye: a message went out in part, nothing more may follow it."""
        self.closed = True
        try:
            self._socket.close()
        except OSError:
            pass

    def abort(self, reason):
        text = reason.encode()
        with self._lock:
            self._send(b"A" + _HELLO.pack(len(text)) + text, time.monotonic() + _GOODBYE_S, None)

    def close(self):
        """Say goodbye and close (best effort, within :data:`_GOODBYE_S`)."""
        with self._lock:
            if self.closed:
                return
            self.closed = True
            try:
                self._send(b"B", time.monotonic() + _GOODBYE_S, None)
            except (OSError, CommError):
                pass
            try:
                self._socket.close()
            except OSError:
                pass
