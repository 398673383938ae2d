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
allows only dask's ports). The listener binds to the host of the worker's
*listen* address and advertises the host of its *contact* address (dask's
``--contact-address``: a worker behind NAT or in a container), on a port
of its own (:func:`rank_port_hosts`).

Nothing read from this port is unpickled before the peer has proven that
it belongs to the session (the port is one more the user may not know
about: anyone who reaches it must not run code as the worker). Each
session has a secret (:data:`SECRET_BYTES` random bytes made on the client
when it opens, handed to the workers through dask's own comm, never sent
on this port). At connect the listener sends a fresh nonce, the sender
answers with a fixed binary hello (:data:`_HELLO`: magic, the session id's
length, its rank and the HMAC-SHA256 of the nonce, rank and id under the
secret) and the id; the listener refuses a session it has not opened, a
wrong MAC (:func:`hmac.compare_digest`) or a handshake slower than
:data:`HANDSHAKE_TIMEOUT_S` (all of it, TLS included), and answers
:data:`_ACCEPTED` otherwise. One HMAC per connection, none per frame: the
connection is then the session's. At most :data:`MAX_HANDSHAKES`
handshakes and :data:`MAX_CONNECTIONS` connections run at once; more are
closed at accept. The traffic itself is not encrypted on ``tcp://``
(``tls://`` is, with dask's certificates).

Frames, on one connection per (session, source rank, destination worker),
each a kind byte and a fixed binary header (struct): ``D`` data
(:data:`_DATA`: destination rank, length of the pickled tag, of the
pickle and the number of out-of-band buffers, then the buffers' lengths,
the tag, the pickle and the buffers), ``A`` abort (:data:`_TEXT` and the
reason in UTF-8), ``H`` heartbeat (the kind byte alone, every second from
:mod:`hpcgpu.partition.heartbeats`: every frame tells the receiver that
its sender lives), ``B`` goodbye. A connection that ends
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

import hashlib
import hmac
import logging
import os
import pickle
import select
import socket
import struct
import threading
import time

from hpcgpu.errors import CommAborted, CommError, CommTimeout
from hpcgpu.partition.message_codec import decode, encode

__all__ = ["DIRECT_ENV", "HANDSHAKE_TIMEOUT_S", "Link", "Listener", "MAX_CONNECTIONS", "MAX_HANDSHAKES",
           "SECRET_BYTES", "decode", "direct_enabled", "encode", "hello_mac", "new_secret", "rank_port_hosts"]

logger = logging.getLogger(__name__)

DIRECT_ENV = "HPCGPU_COMM_DIRECT"
"""Environment variable: ``0`` keeps every message on dask's comm layer."""

SECRET_BYTES = 32
"""Length of a session's secret (:func:`new_secret`), the key of its HMAC."""

HANDSHAKE_TIMEOUT_S = 10.0
"""Longest a connection may take from accept to proven (TLS handshake, nonce, hello): a slow peer is cut."""

MAX_HANDSHAKES = 64
"""Connections a listener lets prove themselves at once; more are closed at accept."""

MAX_CONNECTIONS = 1024
"""Connections a listener keeps at once (proven or not; one per session, remote rank and worker)."""

_MAGIC = b"HGR1"                     # hpcgpu rank port, version 1 of the hello
_NONCE_BYTES = 32
_MAX_SESSION_ID = 128                # bytes of a session id in a hello (uuid4 hex: 32)
_HELLO = struct.Struct("!4sHI32s")   # magic, session id length, source rank, HMAC-SHA256; then the id
_ACCEPTED = b"K"                     # the listener's answer to a proven hello
_DATA = struct.Struct("!IIIH")       # dest rank, tag pickle length, pickle length, buffer count
_BUFFER = struct.Struct("!Q")        # length of one out-of-band buffer
_TEXT = struct.Struct("!I")          # length of an abort's reason (UTF-8)
_MAC_CONTEXT = b"hpcgpu rank port hello 1"


def new_secret():
    """A fresh session secret (:data:`SECRET_BYTES` bytes of ``os.urandom``)."""
    return os.urandom(SECRET_BYTES)


def hello_mac(secret, nonce, session_id, source):
    """The HMAC-SHA256 a rank proves ``session_id``'s ``secret`` with, for the listener's ``nonce``.

    Examples
    --------
    >>> len(hello_mac(b"k" * 32, b"n" * 32, "s1", 0))
    32
    """
    message = _MAC_CONTEXT + nonce + struct.pack("!I", source) + session_id.encode("utf-8")
    return hmac.new(secret, message, hashlib.sha256).digest()


_COALESCE_BYTES = 1 << 18
"""A message up to this size is joined and sent in one ``sendall`` (the copy
costs less than the extra system calls: MD slabs of 6,912 atoms, 6.95
against 7.2 ms a step, docs/journal.md); larger ones go part by part."""

_WAIT_S = 0.25
"""Longest single wait for room in a full socket buffer: between waits a send looks for an abort and its deadline."""

_GOODBYE_S = 5.0
"""Longest a goodbye or an abort frame may take to leave (best effort: the peer has its own timeout)."""


def direct_enabled(address):
    """Whether a worker at ``address`` gets the fast path (tcp/tls, not turned off)."""
    if os.environ.get(DIRECT_ENV, "1").strip() in ("0", "false", "no"):
        return False
    return address.startswith(("tcp://", "tls://"))


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


def _cut(holder):
    """Shut the socket in ``holder[0]`` down unless ``holder[1]`` (proven): a blocked read returns at once."""
    if holder[1]:
        return
    try:
        holder[0].shutdown(socket.SHUT_RDWR)
    except OSError:
        pass


def _host_port(address):
    """``(host, port)`` of ``tcp://host:port`` (brackets of IPv6 hosts removed)."""
    rest = address.split("://", 1)[-1]
    host, _, port = rest.rpartition(":")
    return host.strip("[]"), int(port)


def rank_port_hosts(worker):
    """``(hosts to bind, in the order tried; the host advertised)`` of ``worker``'s rank port.

    The port binds to the host of the worker's listen address and is
    advertised at the host of its contact address. They differ for a worker
    started with dask's ``--contact-address`` (behind NAT, in a container),
    whose contact host is not one of its own. A wildcard listen address
    (``0.0.0.0``, ``::``) tries the contact host first, to open the port on
    no more interfaces than its peers use, and every interface if that host
    is not this machine's.

    Examples
    --------
    >>> from types import SimpleNamespace
    >>> rank_port_hosts(SimpleNamespace(address="tcp://203.0.113.7:9000", listen_address="tcp://0.0.0.0:9000"))
    (('203.0.113.7', '0.0.0.0'), '203.0.113.7')
    >>> rank_port_hosts(SimpleNamespace(address="tcp://203.0.113.7:9000", listen_address="tcp://10.0.0.5:9000"))
    (('10.0.0.5',), '203.0.113.7')
    """
    contact, _ = _host_port(worker.address)
    listen = _host_port(getattr(worker, "listen_address", None) or worker.address)[0] or "0.0.0.0"
    wildcard = listen in ("0.0.0.0", "::")
    return ((contact, listen) if wildcard and contact != listen else (listen,)), contact


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

    ``secret_of(session)`` is the secret of a session this worker opened
    (None for any other: the connection is refused, nothing is made for
    it). ``deliver(session, dest, source, key, obj)``, ``abort(session,
    reason)`` and ``finished(session, source)`` are the extension's mailbox
    hooks; ``fail(session, dest, reason)`` aborts the session on every
    worker (a message this worker cannot rebuild: its peers would wait
    otherwise); ``heard(session, source)`` is called on every frame of a
    proven connection (the heartbeats' evidence of life).

    Raises
    ------
    OSError
        The port cannot be bound (the caller falls back to dask's comm layer).
    """

    def __init__(self, worker, deliver, abort, finished, fail, secret_of, heard=lambda session, source: None):
        self._deliver, self._abort, self._finished, self._fail = deliver, abort, finished, fail
        self._secret_of, self._heard = secret_of, heard
        self._server_ssl, self.client_ssl = _ssl_contexts(worker)
        self._lock = threading.Lock()
        self._handshakes = 0
        self._connections = 0
        self.refused = 0  # connections refused or cut before they were proven (for tests and logs)
        binds, advertised = rank_port_hosts(worker)
        for k, host in enumerate(binds):
            self._socket = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
            try:
                self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                self._socket.bind((host, 0))
                self._socket.listen(64)
                self.bound_host = host  # where it listens (the address advertised may be another's)
                break
            except OSError:
                self._socket.close()
                if k == len(binds) - 1:
                    raise
        self.address = f"{advertised}:{self._socket.getsockname()[1]}"
        threading.Thread(target=self._accept, name="hpcgpu-comm-accept", daemon=True).start()

    def connections(self):
        """``(handshakes, connections)`` running now."""
        with self._lock:
            return self._handshakes, self._connections

    def _accept(self):
        while True:
            try:
                connection, _ = self._socket.accept()
            except OSError:  # closed
                return
            with self._lock:
                full = self._handshakes >= MAX_HANDSHAKES or self._connections >= MAX_CONNECTIONS
                if not full:
                    self._handshakes += 1
                    self._connections += 1
                else:
                    self.refused += 1
            if full:
                if self.refused & (self.refused - 1) == 0:  # 1, 2, 4, 8...: a flood does not flood the log
                    logger.warning("hpcgpu comm: %s refuses connections (%d so far): %d handshakes or %d "
                                   "connections run", self.address, self.refused, MAX_HANDSHAKES, MAX_CONNECTIONS)
                connection.close()
                continue
            threading.Thread(target=self._receive, args=(connection,), name="hpcgpu-comm-receive",
                             daemon=True).start()

    def _handshake(self, connection):
        """``(connection, session, source)`` once the peer has proven its session's secret, else None.

        Nothing is unpickled here: the hello is a fixed struct and an ASCII id.
        """
        holder = [connection, False]
        # one deadline for all of it (a peer sending a byte every few seconds is cut too)
        timer = threading.Timer(HANDSHAKE_TIMEOUT_S, _cut, args=(holder,))
        timer.daemon = True
        timer.start()
        try:
            connection.settimeout(HANDSHAKE_TIMEOUT_S)
            connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self._server_ssl is not None:
                connection = self._server_ssl.wrap_socket(connection, server_side=True,
                                                          do_handshake_on_connect=False)
                holder[0] = connection
                connection.do_handshake()
            nonce = os.urandom(_NONCE_BYTES)
            connection.sendall(nonce)
            magic, id_size, source, mac = _HELLO.unpack(_recv_exactly(connection, _HELLO.size))
            if magic != _MAGIC or not 0 < id_size <= _MAX_SESSION_ID:
                return None
            session = bytes(_recv_exactly(connection, id_size)).decode("ascii")  # UnicodeDecodeError: refused
            secret = self._secret_of(session)
            if not secret or not hmac.compare_digest(mac, hello_mac(secret, nonce, session, source)):
                return None
            holder[1] = True
            connection.sendall(_ACCEPTED)
            connection.settimeout(None)  # proven: a rank may stay quiet between steps as long as it likes
            return connection, session, source
        except (OSError, ValueError, struct.error):  # closed, cut, timed out, TLS refused, not ASCII
            return None
        finally:
            timer.cancel()
            if connection.gettimeout() is not None:  # refused (a proven one was set to block)
                try:
                    holder[0].close()
                except OSError:
                    pass

    def _receive(self, connection):
        session = source = None
        proven = None
        try:
            try:
                proven = self._handshake(connection)
            finally:
                with self._lock:
                    self._handshakes -= 1
                    if not proven:
                        self.refused += 1
            if not proven:
                return
            connection, session, source = proven
            while True:
                self._heard(session, source)
                kind = bytes(_recv_exactly(connection, 1))
                if kind == b"H":
                    continue
                if kind == b"D":
                    dest, key_size, data_size, count = _DATA.unpack(_recv_exactly(connection, _DATA.size))
                    lengths = struct.unpack(f"!{count}Q", _recv_exactly(connection, 8 * count)) if count else ()
                    body = memoryview(_recv_exactly(connection, key_size + data_size))
                    buffers = [_recv_exactly(connection, n) for n in lengths]
                    key = "(a tag that cannot be rebuilt)"
                    try:
                        key = pickle.loads(body[:key_size])
                        obj = decode(body[key_size:], buffers)
                    except Exception as error:  # noqa: BLE001 - the frame was read whole: the stream goes on
                        self._fail(session, dest, f"rank {dest} cannot rebuild the message rank {source} sent "
                                                  f"tagged {key!r}: {type(error).__name__}: {error}")
                        continue
                    self._deliver(session, dest, source, key, obj)
                elif kind == b"A":
                    (size,) = _TEXT.unpack(_recv_exactly(connection, _TEXT.size))
                    self._abort(session, _recv_exactly(connection, size).decode(errors="replace"))
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
            with self._lock:
                self._connections -= 1
            try:
                connection.close()
            except OSError:
                pass

    def close(self):
        """Stop accepting (connections already proven run on until their goodbye)."""
        try:
            self._socket.shutdown(socket.SHUT_RDWR)  # wakes the accepting thread (close alone does not)
        except OSError:
            pass
        self._socket.close()


class Link:
    """One rank's connection to a peer worker's :class:`Listener` for one session (thread-safe sends).

    Raises
    ------
    ConnectionRefusedError
        The listener refused the hello: the session is not open on that worker, or ``secret`` is not its.
    """

    def __init__(self, address, session, source, client_ssl=None, timeout=30.0, secret=b""):
        host, port = _host_port("tcp://" + address)
        sock = socket.create_connection((host, port), timeout=timeout)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if client_ssl is not None:
            sock = client_ssl.wrap_socket(sock, server_hostname=host if client_ssl.check_hostname else None)
        nonce = _recv_exactly(sock, _NONCE_BYTES)
        session_bytes = session.encode("ascii")
        mac = hello_mac(secret, bytes(nonce), session, source)
        sock.sendall(_HELLO.pack(_MAGIC, len(session_bytes), source, mac) + session_bytes)
        try:
            answer = sock.recv(1)
        except OSError:
            answer = b""
        if answer != _ACCEPTED:
            sock.close()
            raise ConnectionRefusedError(f"the rank port {address} refused rank {source} of session {session}: "
                                         "the session is not open on that worker, or its secret differs")
        # plain sockets block and send with MSG_DONTWAIT (one call when there is room); an SSL socket
        # refuses flags, so a timeout bounds each of its writes instead
        sock.settimeout(None if client_ssl is None else _WAIT_S)
        self._tls = client_ssl is not None
        self._socket = sock
        self._lock = threading.Lock()
        self.closed = False
        self.source = source

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
            tag = pickle.dumps(key, protocol=5)
        except Exception as error:  # noqa: BLE001 - what fails to pickle is the caller's object: say which
            raise CommError(f"rank {self.source} cannot send the {type(obj).__module__}.{type(obj).__qualname__} "
                            f"object tagged {key!r} to rank {dest}: neither pickle nor cloudpickle can serialize "
                            f"it ({type(error).__name__}: {error})", rank=self.source) from error
        count = len(buffers)
        head = b"D" + _DATA.pack(dest, len(tag), len(data), count)
        if count:
            head += struct.pack(f"!{count}Q", *[len(b) for b in buffers])
        parts = [head, tag, data, *buffers]
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

    def heartbeat(self):
        """Send a heartbeat frame if the link is idle and its socket has room; never waits.

        A link busy sending needs none (its data is the sign of life), and a
        full socket buffer is the receiver's silence, not this sender's.
        """
        if self.closed or not self._lock.acquire(blocking=False):
            return
        try:
            if self.closed:
                return
            if not self._tls:
                self._socket.send(b"H", socket.MSG_DONTWAIT)  # one byte: sent whole or not at all
            elif select.select([], [self._socket], [], 0)[1]:
                self._send(b"H", time.monotonic() + _GOODBYE_S, None)  # an SSL write is retried until whole
        except (OSError, CommError):  # no room, or broken: the next data send reports it
            pass
        finally:
            self._lock.release()

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
            self._send(b"A" + _TEXT.pack(len(text)) + text, time.monotonic() + _GOODBYE_S, None)

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
