"""The network layer: one event-driven TCP or Unix-socket listener serving a pluggable framed protocol.

A :class:`Server` owns a listening socket and one loop thread. The loop accepts connections,
runs each one's TLS handshake and authentication handshake without blocking, reads frames, and
writes responses; request handlers run on a pool of worker threads, because a handler may block
(an acks="all" produce waits for the high watermark, a follower's fetch long-polls). What is
spoken on the wire is the :class:`Protocol`'s business: how long a frame is (read from a
fixed-size prefix and checked against a cap before anything is allocated), the authentication
state machine (:class:`Handshake`), and how a request is answered. Kafka's
(:class:`logstore.kafka.server.KafkaProtocol`, SASL: :mod:`logstore.kafka.auth`) is the one served, to clients and replica
nodes' peers alike.
A request the protocol knows does not block (:meth:`Protocol.inline`) is answered on the loop.

A server listens on TCP (a ``(host, port)`` address) or on a Unix domain socket (a path); both
serve the same way, TLS included, except that TCP_NODELAY is set on TCP connections only, and
that a Unix connection's :attr:`Session.peer` is what ``accept()`` reports (usually ``''``), not
a ``(host, port)`` tuple. A path longer than a socket address holds (``sun_path``: 107 bytes on
Linux) is bound through its directory (``/proc/self/fd/<directory fd>/<name>``); clients reach
such a path the same way with :func:`connect_unix`.

Life of a connection::

    accepted --(TLS handshake)--> authenticating --(Handshake.done)--> open
                                        ^                                |
                                        +--(Handshake.reauthenticate)----+
        read the frames there are (a burst) -> muted -> worker: Protocol.handle each, in order
            -> their responses written together -> unmuted

Re-authentication (Kafka's KIP-368): a handshake that is done may give its session an end
(``Handshake.session_expires``). Each frame of the open connection is first offered to
``Handshake.reauthenticate``: a frame that starts a re-authentication takes the connection back
to authenticating (the handshake's frame cap and deadline again) until the handshake is done
once more; otherwise a frame that arrives after the session's end closes the connection
unanswered, as Kafka closes an expired connection at its next request. A connection never has a
request in a worker while it re-authenticates: frames are read one at a time.

A handshake step that costs more than the loop may spend (a PLAIN password's PBKDF2, up to
16384 iterations: 10 ms and more) comes back from ``Handshake.receive`` as a :class:`SlowStep`:
the connection is muted, as for a request in a worker, the step runs on one of the listener's
verification threads (at most :data:`VERIFICATION_THREADS`, so that a flood of bad passwords
costs the other connections at most that many cores, never the loop), and its outcome comes
back to the loop, which answers and goes on with the handshake in the frames' order. The
handshake deadline is not enforced while the step runs: a connection past it when the step
ends is closed then, unanswered.

Invariants:

- A connection's requests are handled one at a time, in order, as Kafka handles them: what it
  pipelined and the loop read in one go (a *burst*: at most :data:`BURST_FRAMES` frames, about
  :data:`BURST_BYTES` bytes) goes to one handler run, and the connection is *muted* (nothing
  more is read from it) until every answer of the burst is written (a handler's None is no
  response, as for Kafka's acks=0). The answers leave together (one ``sendmsg``), in request
  order. A deferred answer (a Future) ends the run: the answers before it are written, then
  its own once it completes, then the frames after it are handled. One slow request holds up
  only its own connection, and a connection that pipelines without end is read a burst at a
  time between the other connections' turns.
- A frame's size is checked by the protocol before its buffer is allocated; a frame over the cap,
  a protocol error, a failed handshake or a handler that raises closes only that connection,
  after the answers to the requests it read before that frame.
- Limits: at most ``max_connections`` connections at once (more are accepted and closed at
  once); the TLS and authentication handshakes together must finish within
  ``handshake_timeout_s`` of the accept; an open connection with no request in a worker that
  moves no byte for ``idle_timeout_s`` is closed. A connection closed while its handler still
  runs keeps its slot until the handler returns, so there are never more handlers at work than
  ``max_connections``, and the worker pool (of that size) can never leave a request waiting
  behind handlers that wait for it.

A handler may also return a ``concurrent.futures.Future`` (a deferred answer: the worker is free
at once, and the loop writes the result when the future completes); one that is done already
(an acks=all produce whose high watermark is there at once) is taken as an answer in hand, and
the burst goes on.

Cost: a burst of requests crosses threads once on its way in (loop -> worker), however many
requests it holds: a producer that pipelines one-record requests (librdkafka with
``linger.ms=0``) is answered a burst per crossing once it sends faster than one crossing takes.
A run of requests the protocol says never block (:meth:`Protocol.inline`) is answered on the
loop without a crossing; a burst mixing them with others is split into runs, in order. One that
turns out to need to wait (its handler's :class:`Offload`: a lock another thread holds) takes
the rest of its burst to a worker, which makes the offloaded call and handles the frames after
it, the loop's earlier answers leaving with theirs. On the
way out, the thread
that has the answer writes it: a handler's worker, or whoever completes a deferred answer (the
thread whose append wakes a held fetch, see ``purgatory``), straight to the socket when the
connection is plain (not TLS) and the socket takes the bytes (what it does not take, and every TLS
answer, the loop writes). The loop then only unmutes the connection, which is off the request's
path: the peer's next request takes longer than that to arrive. Writing through the loop cost a
second crossing per request, 100-150 microseconds on this project's 2-core machine, which cut
replicated acks="all" produce throughput by a quarter (bench/bench_replication.py).

Thread-safety: :class:`Server` methods may be called from any thread; :meth:`Protocol.handle`
runs on worker threads (several at once) and :meth:`Protocol.frame_size`, :meth:`Protocol.handshake`
and :class:`Handshake` on the loop thread (they must not block). This module imports nothing of
logstore above ``errors``.
"""

from __future__ import annotations

import collections
import errno
import gc
import itertools
import logging
import os
import selectors
import socket
import ssl
import stat
import sys
import threading
import time
from concurrent.futures import Future
from typing import Any, Sequence

from .. import _fileio
from .._fileio import FileRegion
from ..errors import LogstoreError
from .protocol import Handshake, HandshakeError, Limits, Offload, Protocol, Response, Session, SlowStep
from .workers import WorkerPool

__all__ = ["Server", "Protocol", "Handshake", "HandshakeError", "SlowStep", "Session", "Limits", "Response",
           "Offload", "connect_unix", "freeze_startup_heap"]

logger = logging.getLogger("logstore.net.server")

#: The most bytes handed to one send() (a TLS write of this size is retried with the same bytes).
_SEND_CHUNK = 256 * 1024
#: The most buffers handed to one sendmsg() (below every system's IOV_MAX).
_SENDMSG_BUFFERS = 512
#: The most frames of one connection read in one go and handed to one handler run (a burst of
#: pipelined requests); then the loop serves other connections before reading more of it.
#: Measured (bench/bench_kafka.py --per-request, 20,000 one-record requests/s with a consumer
#: long-polling the partition): bursts of 4-8 kept p99 produce-to-consume latency 2-4 times
#: lower than bursts of 16-64, whose handler run holds the interpreter lock while the
#: consumer's fetches wait; a client pipelining without pause is answered at 2x the rate of
#: one request per crossing either way.
BURST_FRAMES = 8
#: ... and the most bytes (the frame that crosses it is the burst's last). A burst's answers
#: leave together, so a large frame (a producer's batch of a few hundred kB or more) is its
#: burst's last: handled as soon as it is read, its answer not held back by the read and the
#: append of the frame after it (at 1 MiB, two pipelined 940 kB produces went as one burst).
BURST_BYTES = 256 * 1024
#: The most bytes one recv() into the loop's buffer takes (a frame's rest past this is read
#: straight into the frame's own buffer).
_READ_CHUNK = 64 * 1024
#: A frame of an open connection of at least this many bytes (and at most _SPARE_MAX) is read
#: into one of the connection's spare buffers (see _frame_buffer).
_SPARE_MIN = _READ_CHUNK
_SPARE_MAX = 2 << 20
#: The most spare buffers a connection keeps (one for the frame being read, one a deferred
#: answer's request may still reference). A connection keeps at most _SPARES * _SPARE_MAX bytes
#: of them (4 MiB) until it closes, and all of a server's together at most _SPARE_BUDGET.
_SPARES = 2
#: The spare buffers all connections of a server keep together, at most (64 MiB): past it a
#: large frame gets a buffer of its own, as smaller ones do.
_SPARE_BUDGET = 64 << 20
#: The longest the loop sleeps in one select() (deadlines further off are looked at again then).
_LONGEST_SLEEP_S = 3600.0
#: No frames to handle after an answer.
_NO_FRAMES: list[bytearray] = []
#: The threads of a listener that run handshakes' slow steps (:class:`SlowStep`) at once.
VERIFICATION_THREADS = 2
#: How long accepting pauses after accept() itself failed (out of file descriptors).
_ACCEPT_BACKOFF_S = 0.1
#: The longest path a Unix socket address holds (Linux's sun_path is 108 bytes, NUL included);
#: a longer one is reached through its directory (see _unix_call).
_SUN_PATH_MAX = 107


class _Failed:
    """A handler's exception, carried from the worker to the loop, with the answers of the
    burst's earlier requests (``before``: written before the connection closes)."""

    __slots__ = ("exc", "before", "responses")

    def __init__(self, exc: BaseException, before: Sequence[Any] = (), responses: int = 0) -> None:
        self.exc = exc
        self.before = before
        self.responses = responses  # in ``before``


class _Answers:
    """The answers of a burst's requests (``responses`` of them; none for acks=0 requests),
    as the buffers to write in order."""

    __slots__ = ("buffers", "responses")

    def __init__(self, buffers: list[Any], responses: int) -> None:
        self.buffers = buffers
        self.responses = responses


class _Partial:
    """A burst stopped at a deferred answer: the earlier requests' answers (written first),
    the deferred answer's Future (its callback is attached once those are written, so that
    answers leave in request order), and the frames after it (handled once it is written)."""

    __slots__ = ("answers", "future", "rest")

    def __init__(self, answers: _Answers, future: Future, rest: list[bytearray]) -> None:
        self.answers = answers
        self.future = future
        self.rest = rest


class _Stepped:
    """A :class:`SlowStep`'s outcome (its reply, or the exception it raised), carried from the
    verification thread to the loop."""

    __slots__ = ("reply", "exc")

    def __init__(self, reply: bytes, exc: BaseException | None) -> None:
        self.reply = reply
        self.exc = exc


class _Sent:
    """An answer written by the thread that had it: how many bytes went, and what the socket
    did not take (the loop writes it)."""

    __slots__ = ("sent", "rest", "responses")

    def __init__(self, sent: int, rest: list[Any], responses: int = 1) -> None:
        self.sent = sent
        self.rest = rest
        self.responses = responses


# Connection states.
_TLS, _AUTH, _OPEN, _CLOSED = "tls", "auth", "open", "closed"


class _Conn:
    """One served connection's state. Owned by the loop thread (workers only read ``session``)."""

    def __init__(self, sock: socket.socket, session: Session, header_size: int, deadline: float) -> None:
        self.sock = sock
        self.session = session
        self.state = _TLS if session.tls else _AUTH
        self.handshake: Handshake | None = None  # kept once open while its session may end (KIP-368)
        self.reauthenticating = False          # authenticating again on the open connection
        self.deadline = deadline              # of the handshakes; then of idling
        self.header = bytearray(header_size)
        self.body: bytearray | None = None    # the frame being read, once its size is known
        self.got = 0                          # bytes of header (or body) read so far
        self.out: collections.deque[memoryview] = collections.deque()
        self.muted = False                    # a request is in a worker or its response is being written
        self.in_flight = False                # a request is in a worker (or its deferred answer pending)
        self.pending: list[bytearray] = []    # frames read, not yet handed to a handler (a burst)
        self.pending_bytes = 0
        self.leftover = b""                   # bytes read past a burst's bound (see Server._read_burst)
        self.spares: list[bytearray] = []     # large frames' buffers, reused (see _frame_buffer)
        self.waiting: tuple[Future, list[bytearray]] | None = None  # a _Partial's future and frames after it
        self.close_after_write = False
        self.close_delay_s = 0.0              # a failed handshake's reply written: close this much later
        self.lingering = False                # ... at the deadline (see _expire)
        self.events = 0                       # registered with the selector
        self.tls_want = selectors.EVENT_READ  # during the TLS handshake
        self.read_wants_write = False         # TLS: a read needs the socket writable first
        self.write_wants_read = False         # TLS: a write needs the socket readable first
        # Held while another thread than the loop writes an answer, and by the loop to close:
        # the socket is never closed under a write.
        self.write_lock = threading.Lock()


class _Counters:
    """The server's counters; written by the loop thread only."""

    __slots__ = ("accepted", "refused", "closed", "expired", "auth_ok", "auth_failed", "reauth_ok", "reauth_failed",
                 "sessions_expired", "requests", "responses", "bytes_in", "bytes_out")

    def __init__(self) -> None:
        for name in self.__slots__:
            setattr(self, name, 0)


class Server:
    """Serve ``protocol`` on ``address`` with one event loop thread and a worker pool.

    The socket is bound (and :attr:`address` known) at construction; :meth:`start` starts the
    loop. Args:
        address: (host, port) to listen on over TCP (port 0: any free port), or a path (``str`` or
            ``os.PathLike``) to listen on as a Unix domain socket (SOCK_STREAM); :attr:`address`
            is then that path as a str. A path longer than ``sun_path`` holds (107 bytes) is bound
            through its directory; clients connect to it with :func:`connect_unix`. Binding to a
            path where a file already exists (a stale socket included) raises OSError
            (EADDRINUSE): the server never removes what it did not create, so whether to unlink
            a stale socket first is the caller's decision. :meth:`stop` removes the socket file
            the server bound (if it is still that socket).
        protocol: the :class:`Protocol` spoken.
        tls: a server-side ``ssl.SSLContext`` every connection is wrapped in first (None: plain
            TCP or Unix socket).
        limits: :class:`Limits`.
        name: the listener's name in metrics and logs (Kafka's listener name).
        thread_name: the loop thread's name; workers are ``<thread_name>-worker-N``.

    Thread-safety: every method may be called from any thread; :meth:`stop` is final.
    """

    def __init__(self, address: tuple[str, int] | str | os.PathLike[str], protocol: Protocol, *,
                 tls: ssl.SSLContext | None = None, limits: Limits = Limits(), name: str = "listener",
                 thread_name: str | None = None) -> None:
        self.protocol = protocol
        self.limits = limits
        self.name = name
        self._tls = tls
        # The Unix socket this server bound: its absolute path (the working directory may change
        # before stop()) and (st_dev, st_ino), so that stop() unlinks that socket and no other.
        self._unix: tuple[str, tuple[int, int]] | None = None
        self.address: tuple[str, int] | str
        if isinstance(address, (str, os.PathLike)):
            self.address = os.fsdecode(address)
            self._listener, identity = _listen_unix(self.address)
            self._unix = (os.path.abspath(self.address), identity)
        else:
            self._listener = socket.create_server(address)
            self.address = self._listener.getsockname()[:2]
        self._listener.setblocking(False)
        self._thread_name = thread_name or f"net-{name}"
        self._selector = selectors.DefaultSelector()
        self._waker_r, self._waker_w = socket.socketpair()
        self._waker_r.setblocking(False)
        self._waker_w.setblocking(False)
        self._selector.register(self._listener, selectors.EVENT_READ, _LISTENER)
        self._selector.register(self._waker_r, selectors.EVENT_READ, _WAKER)
        self._accept_paused_until = 0.0
        self._conns: dict[int, _Conn] = {}
        self._lingering = 0   # closed connections whose handler still runs (they keep their slot)
        self._ids = itertools.count(1)
        # (connection, outcome, frames to handle once the outcome is written)
        self._done: collections.deque[tuple[_Conn, Any, list[bytearray]]] = collections.deque()
        self._lock = threading.Lock()
        self._spare_bytes = 0  # what the connections' spares hold (see _frame_buffer); under _lock
        self._closing = False
        self._stopped = False
        self._thread: threading.Thread | None = None
        self._loop_ident = -1
        self._sleep_until = float("inf")  # when the loop's select() returns at the latest
        self._workers = WorkerPool(f"{self._thread_name}-worker", limits.max_connections)
        self._verifiers = WorkerPool(f"{self._thread_name}-verify", VERIFICATION_THREADS)
        self._counts = _Counters()
        # The loop's read buffer: an open connection's bytes are read here in one go and cut into frames.
        self._scratch = memoryview(bytearray(_READ_CHUNK))
        self._handed_back = _Counters()  # answers written off the loop (under _lock)
        # epoll and kqueue see a registration made while another thread waits in select().
        self._register_anywhere = type(self._selector).__name__ in ("EpollSelector", "KqueueSelector")

    # ------------------------------------------------------------------ public
    def start(self) -> "Server":
        """Start the loop thread; returns self."""
        with self._lock:
            if self._thread is not None or self._stopped:
                raise RuntimeError(f"{self.name}: start() once, before stop()")
            self._thread = threading.Thread(target=self._run, name=self._thread_name, daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        """Stop accepting, close every connection, and wait up to ``timeout`` seconds for the
        loop and for the handlers still running (their answers are dropped). A Unix socket's
        file is removed once the listener is closed (if it is still the socket this server
        bound). Idempotent."""
        with self._lock:
            if self._stopped:
                return
            self._stopped = True
            self._closing = True
            thread = self._thread
        deadline = time.monotonic() + timeout
        if thread is None:
            self._shutdown()
        else:
            self._wake()
            thread.join(timeout)
        self._verifiers.close(max(0.0, deadline - time.monotonic()))
        self._workers.close(max(0.0, deadline - time.monotonic()))

    def sessions(self) -> list[Session]:
        """The connections served now (handshaking ones included)."""
        with self._lock:
            return [c.session for c in self._conns.values()]

    def metrics(self) -> dict[str, int]:
        """Counters since the server was made, under Kafka's names where Kafka has the metric
        (``kafka.server:type=socket-server-metrics,listener=<name>,name=connection-count`` ...)
        and the same shape under ``logstore`` otherwise."""
        c = self._counts
        with self._lock:
            responses = c.responses + self._handed_back.responses
            bytes_out = c.bytes_out + self._handed_back.bytes_out
            spare_bytes = self._spare_bytes
        kafka = f"kafka.server:type=socket-server-metrics,listener={self.name},name="
        ours = f"logstore:type=socket-server-metrics,listener={self.name},name="
        return {
            kafka + "connection-count": len(self._conns),
            kafka + "connection-creation-total": c.accepted,
            kafka + "connection-close-total": c.closed,
            kafka + "successful-authentication-total": c.auth_ok,
            kafka + "failed-authentication-total": c.auth_failed,
            kafka + "successful-reauthentication-total": c.reauth_ok,
            kafka + "failed-reauthentication-total": c.reauth_failed,
            kafka + "expired-connections-killed-count": c.sessions_expired,
            kafka + "request-total": c.requests,
            kafka + "response-total": responses,
            kafka + "incoming-byte-total": c.bytes_in,
            kafka + "outgoing-byte-total": bytes_out,
            ours + "connection-refused-total": c.refused,
            ours + "connection-expired-total": c.expired,
            ours + "spare-buffer-bytes": spare_bytes,  # large frames' buffers kept for reuse
            f"kafka.network:type=RequestChannel,listener={self.name},name=RequestQueueSize": self._workers.queued,
        }

    def _frame_buffer(self, conn: _Conn, n: int) -> bytearray | memoryview:
        """A buffer for an open connection's frame of ``n`` bytes (on the loop thread), which
        the frame's bytes fill at once. A large frame (:data:`_SPARE_MIN` to :data:`_SPARE_MAX`
        bytes) is read into the smallest of the connection's spare buffers that fits and that
        nothing reads any more (the handlers of its last frame are done with it and kept no view
        of it: a Produce's records are appended straight from the frame), as a view of its first
        ``n`` bytes: no allocation, no zero-fill and no page faults per frame (a 1 MB produce
        spent a tenth of the server's time there). A spare that is still referenced or viewed
        is left alone; a new one (zero-filled once) is kept while the connection has fewer than
        :data:`_SPARES` and the server's spares stay within :data:`_SPARE_BUDGET`, else it
        replaces a free smaller one, else it is the frame's alone. A new spare is the frame's
        size rounded up to a multiple of :data:`_SPARE_MIN` (a producer's batches differ in
        size). The connection's spares go when it closes."""
        if not _SPARE_MIN <= n <= _SPARE_MAX:
            return bytearray(n)
        spares = conn.spares
        fit = None
        for spare in spares:
            # Any reference but the list's and this loop's (a handler that kept it), or any view
            # of it, means it may still be read. Both checks: the first is measured at import
            # (a tracer reading frames' locals then makes it too lenient), the second is exact.
            if len(spare) >= n and sys.getrefcount(spare) == _FREE_REFS and _unexported(spare):
                if fit is None or len(spare) < len(fit):
                    fit = spare
        if fit is not None:
            return memoryview(fit)[:n]
        size = min(-(-n // _SPARE_MIN) * _SPARE_MIN, _SPARE_MAX)  # room for the next frames' sizes
        spare = bytearray(size)
        with self._lock:
            if conn.state is _CLOSED:
                pass
            elif len(spares) < _SPARES:
                if self._spare_bytes + size <= _SPARE_BUDGET:
                    spares.append(spare)
                    self._spare_bytes += size
            else:
                for i in range(len(spares)):
                    old = len(spares[i])
                    if (old < size and self._spare_bytes + size - old <= _SPARE_BUDGET
                            and sys.getrefcount(spares[i]) == _FREE_REFS_INDEXED and _unexported(spares[i])):
                        spares[i] = spare
                        self._spare_bytes += size - old
                        break
        return memoryview(spare)[:n]

    # ------------------------------------------------------------------ the loop
    def _run(self) -> None:
        self._loop_ident = threading.get_ident()
        try:
            while not self._closing:
                now = time.monotonic()
                timeout = self._expire(now)
                if timeout is None:
                    # No deadline: sleep an idle timeout at most all the same. A connection given
                    # back by a worker (_hand_back) then never has its idle deadline before the
                    # loop's wake-up, and need not wake the loop (with one connection and no
                    # deadline, every request cost a wake-up of the loop: a thread switch and a
                    # turn of the loop).
                    timeout = self.limits.idle_timeout_s
                if self._done:  # answers the last turn left (see _deliver): look at the sockets, no sleep
                    timeout = 0.0
                timeout = min(timeout, _LONGEST_SLEEP_S)  # (epoll refuses a timeout past ~24.8 days)
                self._sleep_until = now + timeout
                for key, mask in self._selector.select(timeout):
                    if key.data is _LISTENER:
                        self._accept()
                    elif key.data is _WAKER:
                        self._drain_waker()
                    else:
                        self._service(key.data, mask)
                self._deliver()
        except Exception:  # noqa: BLE001 - a bug in the loop: log it and close everything
            logger.exception("%s: the network loop failed; closing every connection", self.name)
        finally:
            self._shutdown()

    def _wake(self) -> None:
        try:
            self._waker_w.send(b"\0")
        except (BlockingIOError, OSError):
            pass  # a wake-up is already pending (or the loop is gone)

    def _drain_waker(self) -> None:
        try:
            while self._waker_r.recv(4096):
                pass
        except (BlockingIOError, OSError):
            pass

    def _expire(self, now: float) -> float | None:
        """Close connections past their handshake or idle deadline; returns how long the loop
        may sleep until the next deadline (None: no deadline)."""
        next_at = None
        if self._accept_paused_until and now >= self._accept_paused_until:
            self._accept_paused_until = 0.0
            self._selector.register(self._listener, selectors.EVENT_READ, _LISTENER)
        elif self._accept_paused_until:
            next_at = self._accept_paused_until
        for conn in list(self._conns.values()):
            if conn.in_flight and conn.waiting is None:
                continue  # the handler may take as long as it needs (not so a write stalled before it)
            if now >= conn.deadline:
                if not conn.lingering:  # (lingering: the delayed close after a failed handshake)
                    what = "finish its handshake" if conn.state is not _OPEN else "send a request"
                    logger.debug("%s: closing connection %d: it did not %s in time", self.name, conn.session.id,
                                 what)
                    self._counts.expired += 1
                self._close(conn)
                continue
            next_at = conn.deadline if next_at is None else min(next_at, conn.deadline)
        return None if next_at is None else max(0.0, next_at - now)

    def _accept(self) -> None:
        while not self._closing:
            try:
                sock, peer = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # out of file descriptors: pause rather than spin
                logger.warning("%s: accept failed (%s); pausing for %.1f s", self.name, exc, _ACCEPT_BACKOFF_S)
                self._selector.unregister(self._listener)
                self._accept_paused_until = time.monotonic() + _ACCEPT_BACKOFF_S
                return
            if len(self._conns) + self._lingering >= self.limits.max_connections:
                logger.warning("%s: refusing a connection: %d connections open (max_connections)", self.name,
                               self.limits.max_connections)
                self._counts.refused += 1
                sock.close()
                continue
            try:
                self._open(sock, peer)
            except (OSError, ValueError) as exc:
                logger.debug("%s: could not set up a connection from %r: %s", self.name, peer, exc)
                sock.close()

    def _open(self, sock: socket.socket, peer: Any) -> None:
        sock.setblocking(False)
        if sock.family in (socket.AF_INET, socket.AF_INET6):  # not a Unix socket's option
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if self._tls is not None:
            sock = self._tls.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
        now = time.monotonic()
        # One deadline for both handshakes: a peer dribbling a byte at a time cannot hold a
        # connection slot for longer.
        conn = _Conn(sock, Session(next(self._ids), peer, self._tls is not None), self.protocol.header_size,
                     now + self.limits.handshake_timeout_s)
        with self._lock:
            self._conns[conn.session.id] = conn
        self._counts.accepted += 1
        if conn.state is _AUTH:
            self._begin_auth(conn)
        self._interest(conn)

    def _service(self, conn: _Conn, mask: int) -> None:
        """Act on a connection's readiness; any failure closes this connection only."""
        try:
            if conn.state is _TLS:
                self._tls_handshake(conn)
            else:
                if mask & selectors.EVENT_WRITE or conn.write_wants_read:
                    self._write(conn)
                # Read whatever the event: a TLS socket may hold decrypted bytes that the
                # selector cannot see (a read that finds nothing costs one recv).
                self._read(conn)
        except Exception as exc:  # noqa: BLE001 - one connection's failure is not the server's
            self._fail(conn, exc)
        self._interest(conn, read_while_muted=conn.muted and bool(mask & selectors.EVENT_READ))

    def _fail(self, conn: _Conn, exc: BaseException) -> None:
        if conn.state is _CLOSED:
            return
        if conn.state is not _OPEN:
            self._counts.auth_failed += 1
        self._log_failure(conn, exc)
        self._close(conn)

    def _log_failure(self, conn: _Conn, exc: BaseException) -> None:
        """Log why a connection ends (a bug's traceback as an error; a peer's doing at debug)."""
        if isinstance(exc, (OSError, LogstoreError, ConnectionError)):
            logger.debug("%s: connection %d ended: %s", self.name, conn.session.id, exc)
        else:
            logger.error("%s: connection %d failed", self.name, conn.session.id, exc_info=exc)

    def _close(self, conn: _Conn) -> None:
        if conn.state is _CLOSED:
            return
        with conn.write_lock:
            if conn.events:
                self._selector.unregister(conn.sock)
                conn.events = 0
            conn.state = _CLOSED
            try:
                conn.sock.close()
            except OSError:
                pass
        with self._lock:
            del self._conns[conn.session.id]
            self._spare_bytes -= sum(map(len, conn.spares))
            conn.spares.clear()
        _release(conn.out)
        conn.out.clear()
        if conn.in_flight:
            self._lingering += 1
        if conn.waiting is not None:  # a deferred answer awaited after a burst's first answers: its
            future, _ = conn.waiting  # completion, dropped, gives the slot back
            conn.waiting = None
            future.add_done_callback(lambda f: self._complete(conn, _settled(f)))
        self._counts.closed += 1

    def _interest(self, conn: _Conn, read_while_muted: bool = False) -> None:
        """Register the events the connection waits for now. A plain (not TLS) connection stays
        registered for reading while its request is in a worker (two epoll_ctl calls fewer per
        request), until it turns readable meanwhile (``read_while_muted``: a pipelined request or
        the peer's close), when it leaves the selector until the answer is written."""
        if conn.state is _CLOSED:
            return
        with conn.write_lock:  # against a worker handing the connection back (_hand_back)
            if conn.state is _TLS:
                want = conn.tls_want
            else:
                want = 0
                if conn.out or conn.read_wants_write:
                    want |= selectors.EVENT_WRITE
                if (not conn.muted and not conn.out) or conn.write_wants_read:
                    want |= selectors.EVENT_READ
                elif conn.in_flight and not conn.out and not conn.session.tls and not read_while_muted:
                    want |= conn.events & selectors.EVENT_READ
            if want == conn.events:
                return
            if conn.events == 0:
                self._selector.register(conn.sock, want, conn)
            elif want == 0:
                self._selector.unregister(conn.sock)
            else:
                self._selector.modify(conn.sock, want, conn)
            conn.events = want

    # ------------------------------------------------------------------ handshakes
    def _tls_handshake(self, conn: _Conn) -> None:
        try:
            conn.sock.do_handshake()  # type: ignore[attr-defined]
        except ssl.SSLWantReadError:
            conn.tls_want = selectors.EVENT_READ
            return
        except ssl.SSLWantWriteError:
            conn.tls_want = selectors.EVENT_WRITE
            return
        self._begin_auth(conn)
        self._read(conn)  # the peer's first frame may have come with the handshake's last bytes

    def _begin_auth(self, conn: _Conn) -> None:
        conn.handshake = self.protocol.handshake(conn.session)
        if conn.handshake is None:
            self._authenticated(conn)
        else:
            conn.state = _AUTH

    def _authenticated(self, conn: _Conn) -> None:
        conn.state = _OPEN
        conn.reauthenticating = False
        conn.session.principal = conn.handshake.principal if conn.handshake is not None else None
        if conn.handshake is not None and conn.handshake.session_expires is None:
            conn.handshake = None  # nothing more to ask it: no re-authentication, no expiry
        conn.deadline = time.monotonic() + self.limits.idle_timeout_s

    # ------------------------------------------------------------------ reading
    def _read(self, conn: _Conn) -> None:
        """Read until the socket has nothing more, the connection is muted, or output waits.
        An open connection's requests read in one go (a client pipelining them) are handed to
        one handler run as a burst once reading stops, at most :data:`BURST_FRAMES` frames or
        about :data:`BURST_BYTES` bytes at a time (the other connections are served between
        two bursts). A frame that cannot be read (a malformed size, the peer gone) closes the
        connection after the burst read before it is answered."""
        size = self.protocol.header_size
        try:
            while conn.state in (_AUTH, _OPEN) and not conn.muted and not conn.out:
                if conn.state is _OPEN and conn.handshake is None:
                    self._read_burst(conn)
                    break
                if conn.body is None:
                    n = self._recv(conn, memoryview(conn.header)[conn.got:])
                    if n is None:
                        break
                    conn.got += n
                    if conn.got < size:
                        continue
                    # The size is checked before the body is allocated.
                    conn.body = bytearray(self.protocol.frame_size(bytes(conn.header), conn.state is _OPEN))
                    conn.got = 0
                if conn.got < len(conn.body):
                    n = self._recv(conn, memoryview(conn.body)[conn.got:])
                    if n is None:
                        break
                    conn.got += n
                    if conn.got < len(conn.body):
                        continue
                frame, conn.body, conn.got = conn.body, None, 0
                self._frame(conn, frame)
                if len(conn.pending) >= BURST_FRAMES or conn.pending_bytes >= BURST_BYTES:
                    break
        except Exception as exc:  # noqa: BLE001 - closes this connection, after the burst's answers
            if not conn.pending or conn.state is not _OPEN or conn.muted:
                raise
            self._log_failure(conn, exc)
            conn.close_after_write = True
        if conn.pending and conn.state is _OPEN and not conn.muted:
            self._dispatch(conn)

    def _read_burst(self, conn: _Conn) -> None:
        """Read an open connection's frames into ``conn.pending`` (no handshake may take a frame
        back: every frame is a request) until the socket has nothing more or the burst is full.
        Bytes come in chunks through the loop's buffer and are cut into frames there (one
        recv() for many small requests); a large frame's rest goes straight into its own
        buffer. What is read past the burst's bound waits in ``conn.leftover`` for the next."""
        size = self.protocol.header_size
        while True:
            if conn.leftover:
                data, conn.leftover = memoryview(conn.leftover), b""
            elif conn.body is not None and len(conn.body) - conn.got >= _READ_CHUNK:
                n = self._recv(conn, memoryview(conn.body)[conn.got:])
                if n is None:
                    return
                conn.got += n
                data = self._scratch[:0]
            else:
                n = self._recv(conn, self._scratch)
                if n is None:
                    return
                data = self._scratch[:n]
            at, end = 0, len(data)
            frame_size = self.protocol.frame_size
            while True:
                if conn.body is None and not conn.got and end - at >= size:
                    # A whole size prefix here (the common case): the size is checked before
                    # anything is allocated, and a whole frame is copied out at once.
                    n = frame_size(bytes(data[at:at + size]), True)
                    if n < 0:
                        raise ValueError(f"a frame size of {n}")
                    at += size
                    if end - at < n:
                        conn.body = self._frame_buffer(conn, n)
                    else:
                        conn.pending.append(bytearray(data[at:at + n]))
                        at += n
                        conn.pending_bytes += n
                        self._counts.requests += 1
                        if len(conn.pending) >= BURST_FRAMES or conn.pending_bytes >= BURST_BYTES:
                            if at < end:
                                conn.leftover = bytes(data[at:end])
                            return
                        continue
                if conn.body is None:
                    if at == end:
                        break
                    k = min(size - conn.got, end - at)
                    conn.header[conn.got:conn.got + k] = data[at:at + k]
                    conn.got += k
                    at += k
                    if conn.got < size:
                        break
                    # The size is checked before the body is allocated.
                    n = self.protocol.frame_size(bytes(conn.header), True)
                    if n < 0:
                        raise ValueError(f"a frame size of {n}")
                    conn.body = self._frame_buffer(conn, n)
                    conn.got = 0
                k = min(len(conn.body) - conn.got, end - at)
                if k:
                    conn.body[conn.got:conn.got + k] = data[at:at + k]
                    conn.got += k
                    at += k
                if conn.got < len(conn.body):
                    break
                frame, conn.body, conn.got = conn.body, None, 0
                conn.pending.append(frame)
                conn.pending_bytes += len(frame)
                self._counts.requests += 1
                if len(conn.pending) >= BURST_FRAMES or conn.pending_bytes >= BURST_BYTES:
                    if at < end:
                        conn.leftover = bytes(data[at:end])
                    return

    def _recv(self, conn: _Conn, view: memoryview) -> int | None:
        """Bytes read into ``view``, or None when the socket has none now."""
        conn.read_wants_write = False
        try:
            n = conn.sock.recv_into(view, len(view))
        except (BlockingIOError, InterruptedError, ssl.SSLWantReadError):
            return None
        except ssl.SSLWantWriteError:
            conn.read_wants_write = True
            return None
        if n == 0:
            raise ConnectionError("closed by the peer")
        self._counts.bytes_in += n
        if conn.state is _OPEN:
            conn.deadline = time.monotonic() + self.limits.idle_timeout_s
        return n

    def _frame(self, conn: _Conn, frame: bytearray) -> None:
        if conn.state is _OPEN and conn.handshake is not None:
            now = time.monotonic()
            if conn.handshake.reauthenticate(frame, now):
                conn.state, conn.reauthenticating = _AUTH, True
                conn.deadline = now + self.limits.handshake_timeout_s
            elif conn.handshake.session_expires is not None and now > conn.handshake.session_expires:
                logger.debug("%s: closing connection %d: its session expired and it did not re-authenticate",
                             self.name, conn.session.id)
                self._counts.sessions_expired += 1
                self._close(conn)
                return
        if conn.state is _AUTH:
            assert conn.handshake is not None
            try:
                reply = conn.handshake.receive(frame)
            except HandshakeError as exc:
                self._handshake_step(conn, b"", exc)
                return
            if isinstance(reply, SlowStep):
                conn.muted = conn.in_flight = True
                self._verifiers.submit(self._verify, conn, reply)
            else:
                self._handshake_step(conn, reply, None)
            return
        conn.pending.append(frame)
        conn.pending_bytes += len(frame)
        self._counts.requests += 1
        if conn.handshake is not None:  # its session may end or re-authenticate: one frame at a time
            self._dispatch(conn)

    def _dispatch(self, conn: _Conn) -> None:
        """Hand the frames read (a burst, in order) to handler runs: the first run of frames
        the protocol says do not block is answered on the loop (its answers delivered at the
        end of this turn), a run of others on a worker; the frames after the run are handled
        once its answers are written. The connection is muted until then."""
        frames, conn.pending, conn.pending_bytes = conn.pending, [], 0
        conn.muted = conn.in_flight = True
        inline = self.protocol.inline
        first = inline(conn.session, frames[0])
        run = 1
        while run < len(frames) and inline(conn.session, frames[run]) == first:
            run += 1
        rest = frames[run:] if run < len(frames) else _NO_FRAMES
        if run < len(frames):
            del frames[run:]
        if first:
            self._work(conn, frames, rest)
        else:
            self._workers.submit(self._work, conn, frames, rest)

    def _handshake_step(self, conn: _Conn, reply: bytes, exc: HandshakeError | None) -> None:
        """Act on one handshake step's outcome (on the loop): answer, and open the connection
        when the handshake is done, or answer the failure and close."""
        assert conn.handshake is not None
        if exc is not None:
            if conn.reauthenticating:
                self._counts.reauth_failed += 1
            else:
                self._counts.auth_failed += 1
            logger.debug("%s: connection %d failed the handshake: %s", self.name, conn.session.id, exc)
            if not exc.reply:
                self._close(conn)
                return
            reply, conn.close_after_write, conn.muted = exc.reply, True, True
            conn.close_delay_s = exc.close_delay_s
        elif conn.handshake.done:
            if conn.reauthenticating:
                self._counts.reauth_ok += 1
            else:
                self._counts.auth_ok += 1
            self._authenticated(conn)
        if reply:
            self._queue(conn, [reply])
            self._write(conn)

    def _verify(self, conn: _Conn, step: SlowStep) -> None:
        """Run a handshake's slow step (on a verification thread) and hand its outcome to the loop."""
        try:
            outcome = _Stepped(step.run(), None)
        except BaseException as exc:  # noqa: BLE001 - the loop acts on it (a HandshakeError) or closes
            outcome = _Stepped(b"", exc)
        with self._lock:
            self._done.append((conn, outcome, _NO_FRAMES))
        self._wake()

    # ------------------------------------------------------------------ handlers and responses
    def _work(self, conn: _Conn, frames: list[bytearray], after: list[bytearray] = _NO_FRAMES,
              offload: Offload | None = None, buffers: list[Any] | None = None, responses: int = 0) -> None:
        """Answer a burst of one connection's requests in order (on a worker, or on the loop
        when the protocol says none of them blocks) and hand their answers to the loop
        together. A request answered later (a Future) ends the burst there: the answers before
        it go first, then its own, then the frames after it are handled (see _Partial). A
        handler that raises ends it too: the earlier answers are written, then the connection
        closes. ``after``: frames to handle once these are answered.

        On the loop, a request whose handler gives an :class:`Offload` (it would wait) hands
        the rest of the burst to a worker: that call answers the request (``offload``, for the
        first of ``frames``), the worker's handler the frames after it, and the answers
        gathered so far (``buffers``, ``responses``) leave with theirs."""
        buffers = [] if buffers is None else buffers
        on_loop = threading.get_ident() == self._loop_ident
        handle = self.protocol.handle_inline if on_loop else self.protocol.handle
        for i, frame in enumerate(frames):
            try:
                if offload is not None:
                    result: Any = offload.call()  # (on a worker) the request the loop handed over
                    offload = None
                else:
                    result = handle(conn.session, frame)
                if result.__class__ is Offload:  # it would wait: on a worker, with the frames after it
                    if on_loop:
                        self._workers.submit(self._work, conn, frames[i:], after, result, buffers, responses)
                        return
                    result = result.call()
                if isinstance(result, Future) and result.done() and not result.cancelled():
                    result = result.result()  # answered already (acks=all with the high watermark there)
            except BaseException as exc:  # noqa: BLE001 - reported by the loop, which closes the connection
                self._complete(conn, _Failed(exc, buffers, responses))
                return
            if result is None:  # no response (Kafka's acks=0)
                continue
            if isinstance(result, Future):
                rest = frames[i + 1:] + after
                if responses:
                    self._complete(conn, _Partial(_Answers(buffers, responses), result, rest))
                else:
                    result.add_done_callback(lambda f: self._complete(conn, _settled(f), rest))
                return
            buffers.extend(_buffers(result))
            responses += 1
        # Handled: the frames' buffers are the connection's to reuse once the answers are out
        # (see _frame_buffer), which may be before this thread returns.
        frame = result = None
        frames.clear()
        self._complete(conn, _Answers(buffers, responses) if responses else None, after)

    def _complete(self, conn: _Conn, result: Any, rest: list[bytearray] = _NO_FRAMES) -> None:
        """Hand an outcome to the loop (with the frames to handle once it is written); off the
        loop, write answers first when the socket takes them."""
        if threading.get_ident() == self._loop_ident:
            with self._lock:
                self._done.append((conn, result, rest))  # the loop delivers at the end of this turn
            return
        if isinstance(result, _Answers) and not rest and not conn.session.tls:
            result = _send_now(conn, result)
            if isinstance(result, _Sent) and not result.rest and self._hand_back(conn, result):
                return
        with self._lock:
            self._done.append((conn, result, rest))
        self._wake()

    def _hand_back(self, conn: _Conn, sent: _Sent) -> bool:
        """After a whole answer was written off the loop: unmute the connection and give it
        back to the loop from this thread, so that the loop need not wake. It is still
        registered for reading (see _interest), or is registered here where the selector takes
        registrations while another thread waits in it (epoll, kqueue). False: the loop must
        do it."""
        with conn.write_lock:
            if conn.state is not _OPEN or conn.close_after_write or conn.events & ~selectors.EVENT_READ \
                    or conn.leftover:  # (bytes read already: the loop must take them, the socket may not wake it)
                return False
            if not conn.events and not self._register_anywhere:
                return False
            with self._lock:
                self._handed_back.responses += sent.responses
                self._handed_back.bytes_out += sent.sent
            # The loop takes the connection back when it sees it unmuted: every field is set
            # before.
            conn.deadline = time.monotonic() + self.limits.idle_timeout_s
            conn.in_flight = conn.muted = False
            if not conn.events:
                conn.events = selectors.EVENT_READ
                self._selector.register(conn.sock, selectors.EVENT_READ, conn)
        if conn.deadline < self._sleep_until:
            self._wake()  # the loop sleeps past this connection's idle deadline
        return True

    def _deliver(self) -> None:
        """Write the answers the workers finished (on the loop thread): those there when it
        starts. Answers of requests handled on the loop meanwhile (a connection pipelining
        inline requests: its next burst is read and answered as this one is written) wait for
        the next turn, so that such a connection never keeps the loop from the others."""
        with self._lock:
            count = len(self._done)
        for _ in range(count):
            with self._lock:
                conn, result, rest = self._done.popleft()
            if isinstance(result, _Partial):  # the connection stays in flight: its deferred answer is pending
                self._partial(conn, result)
                continue
            conn.in_flight = False
            if conn.state is _CLOSED:
                self._lingering -= 1
                _release(result.rest if isinstance(result, _Sent) else result.buffers if isinstance(result, _Answers)
                         else result.before if isinstance(result, _Failed) else ())
                continue
            if isinstance(result, _Stepped):  # a handshake's slow step is done: on with the handshake
                conn.muted = False
                if time.monotonic() >= conn.deadline and not conn.lingering:  # (not waited for meanwhile)
                    logger.debug("%s: closing connection %d: it did not finish its handshake in time", self.name,
                                 conn.session.id)
                    self._counts.expired += 1
                    self._close(conn)
                    continue
                try:
                    if result.exc is not None and not isinstance(result.exc, HandshakeError):
                        self._fail(conn, result.exc)
                    else:
                        self._handshake_step(conn, result.reply, result.exc)
                        self._read(conn)  # frames the peer sent meanwhile (none is read while muted)
                except Exception as exc:  # noqa: BLE001
                    self._fail(conn, exc)
                self._interest(conn)
                continue
            # The idle clock restarts with the answer (the request may have taken longer).
            conn.deadline = time.monotonic() + self.limits.idle_timeout_s
            if isinstance(result, _Failed):
                if not result.before:
                    self._fail(conn, result.exc)
                    continue
                # The burst's earlier answers are written, then the connection closes.
                self._log_failure(conn, result.exc)
                conn.close_after_write = True
                result = _Answers(list(result.before), result.responses)
            conn.pending[:0] = rest  # handled once this answer is written (see _unmute)
            conn.pending_bytes += sum(len(f) for f in rest)
            try:
                if result is None:      # no response (Kafka's acks=0): on as after a written answer
                    self._write(conn)   # (which closes a connection whose burst ended in a bad frame)
                elif isinstance(result, _Sent):  # written (all or part) by the thread that had it
                    self._counts.responses += result.responses
                    self._counts.bytes_out += result.sent
                    conn.out.extend(result.rest)
                    self._write(conn)   # unmutes once all is written
                else:
                    self._queue(conn, result.buffers)
                    self._counts.responses += result.responses
                    self._write(conn)   # unmutes once all is written
            except Exception as exc:  # noqa: BLE001
                self._fail(conn, exc)
            self._interest(conn)

    def _partial(self, conn: _Conn, partial: _Partial) -> None:
        """Write a burst's answers up to its deferred one; the deferred answer is awaited once
        they are written (see _write), then the frames after it are handled."""
        if conn.state is _CLOSED:  # its deferred answer still counts as the handler at work
            _release(partial.answers.buffers)
            partial.future.add_done_callback(lambda f: self._complete(conn, _settled(f)))
            return
        conn.waiting = (partial.future, partial.rest)
        try:
            self._queue(conn, partial.answers.buffers)
            self._counts.responses += partial.answers.responses
            self._write(conn)
        except Exception as exc:  # noqa: BLE001
            self._fail(conn, exc)
        self._interest(conn)

    # ------------------------------------------------------------------ writing
    @staticmethod
    def _queue(conn: _Conn, buffers: Sequence[Any]) -> None:
        """Append whole frames to the connection's output (file regions are read into bytes on
        a TLS connection, which sendfile cannot write)."""
        for b in buffers:
            if isinstance(b, FileRegion):
                if conn.session.tls:
                    b = b.read()
                elif b.length:
                    conn.out.append(b)
                    continue
            if len(b):
                conn.out.append(memoryview(b).cast("B"))

    def _write(self, conn: _Conn) -> None:
        conn.write_wants_read = False
        while conn.out:
            buf = conn.out[0]
            if isinstance(buf, FileRegion):
                try:
                    n = _send_region(conn.sock, buf)
                except (BlockingIOError, InterruptedError):
                    return
                self._counts.bytes_out += n
                if not buf.length:
                    conn.out.popleft().close()
                continue
            try:
                n = conn.sock.send(buf[:_SEND_CHUNK])
            except (BlockingIOError, InterruptedError, ssl.SSLWantWriteError):
                return
            except ssl.SSLWantReadError:
                conn.write_wants_read = True
                return
            self._counts.bytes_out += n
            if n == len(buf):
                conn.out.popleft()
            else:
                conn.out[0] = buf[n:]
            if conn.state is _OPEN:
                conn.deadline = time.monotonic() + self.limits.idle_timeout_s
        if conn.waiting is not None:  # a burst's earlier answers are out: await its deferred one
            future, rest = conn.waiting
            conn.waiting = None
            future.add_done_callback(lambda f: self._complete(conn, _settled(f), rest))
        elif conn.in_flight:
            pass  # answers are still to come (a burst cut short by an unreadable frame closes after them)
        elif conn.pending:  # frames read after a deferred answer, which is written now
            self._unmute(conn)
        elif conn.close_after_write:
            if conn.close_delay_s > 0:  # _expire closes it at the deadline; nothing is read meanwhile
                conn.deadline, conn.close_delay_s, conn.lingering = time.monotonic() + conn.close_delay_s, 0.0, True
            elif not conn.lingering:
                self._close(conn)
        elif conn.muted:
            self._unmute(conn)

    def _unmute(self, conn: _Conn) -> None:
        """The request is answered: handle the frames already read after it, or read the next
        ones (TLS may hold their bytes already)."""
        conn.muted = False
        conn.deadline = time.monotonic() + self.limits.idle_timeout_s
        if conn.pending:
            self._dispatch(conn)
        else:
            self._read(conn)

    def _shutdown(self) -> None:
        for conn in list(self._conns.values()):
            self._close(conn)
        with self._lock:
            self._done.clear()
        for sock in (self._listener, self._waker_r, self._waker_w):
            try:
                sock.close()
            except OSError:
                pass
        self._selector.close()
        self._unlink_unix()

    def _unlink_unix(self) -> None:
        """Remove the Unix socket file this server bound (after the listener is closed), unless
        something else is at its path by now."""
        if self._unix is None:
            return
        path, identity = self._unix
        self._unix = None
        try:
            st = os.lstat(path)
            if stat.S_ISSOCK(st.st_mode) and (st.st_dev, st.st_ino) == identity:
                os.unlink(path)
        except FileNotFoundError:
            pass
        except OSError as exc:
            logger.warning("%s: could not remove the socket file %s: %s", self.name, path, exc)


def freeze_startup_heap() -> None:
    """Move every object the process holds now out of reach of the cyclic garbage collector
    (``gc.freeze()``), for a process that has just started a long-running server.

    A full collection walks every tracked object, and a server's request path promotes enough
    short-lived objects into the oldest generation to start one every few seconds at a few
    thousand requests a second. Walking the tens of thousands of objects of the imported modules
    and the opened store took 200-280 ms on this project's VM (its memory, untouched between two
    collections, costs microseconds per object to read again): a stall of every connection,
    measured as the p99 of one-record produces (137-262 ms; 8-15 ms after). The frozen objects
    stay alive as before and are still freed by reference counting; only cycles among them are
    never collected, which objects made at start-up (modules, classes, the open store) do not
    leave behind.

    Called by ``logstore serve`` and ``logstore node`` once they listen; not by
    :class:`Server` itself, since the heap is the embedding application's. An application
    embedding a server may call it (or ``gc.freeze()``) after its own start-up for the same
    effect. Process-wide; call it from one thread.
    """
    gc.freeze()


def connect_unix(path: str | os.PathLike[str], timeout: float | None = None) -> socket.socket:
    """A stream socket connected to the Unix socket at ``path``, with ``timeout`` set (None:
    blocking). A path longer than a socket address holds (107 bytes) is reached through its
    directory, as :class:`Server` binds it. Raises OSError (FileNotFoundError, ConnectionRefusedError,
    ...) when nothing listens there."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(timeout)
        _unix_call(sock.connect, os.fsdecode(path))
    except BaseException:
        sock.close()
        raise
    return sock


def _listen_unix(path: str) -> tuple[socket.socket, tuple[int, int]]:
    """A Unix stream socket bound at ``path`` and listening, with the (st_dev, st_ino) of its
    file. Raises OSError (EADDRINUSE when a file is already there: it is not removed)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    bound = False
    try:
        _unix_call(sock.bind, path)
        bound = True
        st = os.stat(path)
        sock.listen()
    except BaseException:
        sock.close()
        if bound:
            try:
                os.unlink(path)
            except OSError:
                pass
        raise
    return sock, (st.st_dev, st.st_ino)


def _unix_call(call: Any, path: str) -> None:
    """``call`` (a socket's bind or connect) with the address ``path``; a path longer than
    ``sun_path`` holds goes through its directory: /proc/self/fd/<directory fd>/<name>, the
    directory's descriptor closed after the call."""
    raw = os.fsencode(path)
    if len(raw) <= _SUN_PATH_MAX:
        call(raw)
        return
    directory, name = os.path.split(raw)
    if not name:
        raise OSError(errno.EINVAL, f"not a socket path (it names a directory): {path}")
    dirfd = os.open(directory or b".", os.O_RDONLY | os.O_DIRECTORY)
    try:
        via = b"/proc/self/fd/%d/%s" % (dirfd, name)
        if len(via) > _SUN_PATH_MAX:
            raise OSError(errno.ENAMETOOLONG, f"a Unix socket's name is too long even reached through its directory"
                                              f" ({len(name)} bytes): {path}")
        call(via)
    finally:
        os.close(dirfd)


def _send_now(conn: _Conn, result: _Answers) -> Any:
    """Write answers from the thread that has them (not TLS: the connection is muted
    with nothing queued, so the loop does not write to it); returns a :class:`_Sent`."""
    buffers = [b if isinstance(b, FileRegion) else memoryview(b).cast("B") for b in result.buffers if len(b)]
    with conn.write_lock:
        if conn.state is not _OPEN:
            return result  # closed meanwhile: the loop drops it
        try:
            if any(isinstance(b, FileRegion) for b in buffers):
                sent_part = _send_with_regions(conn.sock, buffers)
                sent_part.responses = result.responses
                return sent_part
            if len(buffers) > 1:
                sent = conn.sock.sendmsg(buffers[:_SENDMSG_BUFFERS])
            else:
                sent = conn.sock.send(buffers[0]) if buffers else 0
        except (BlockingIOError, InterruptedError):
            sent = 0
        except OSError as exc:
            _release(buffers)
            return _Failed(exc)
    rest, skip = [], sent
    for buf in buffers:
        if skip >= len(buf):
            skip -= len(buf)
        else:
            rest.append(buf[skip:])
            skip = 0
    return _Sent(sent, rest, result.responses)


def _unexported(buf: bytearray) -> bool:
    """Whether no buffer view of ``buf`` exists: CPython refuses to resize a bytearray while a
    view of it lives (BufferError), whatever else holds references to it."""
    try:
        buf.append(buf.pop())  # (shrinks and grows in place: no copy)
    except BufferError:
        return False
    return True


def _free_refs() -> tuple[int, int]:
    """What sys.getrefcount says of a spare nothing else references, in _frame_buffer's two
    loops (the interpreter's own references differ between versions: measured, not assumed)."""
    spares = [bytearray(1)]
    plain = 0
    for spare in spares:
        plain = sys.getrefcount(spare)
    del spare
    return plain, sys.getrefcount(spares[0])


_FREE_REFS, _FREE_REFS_INDEXED = _free_refs()


def _send_region(sock: socket.socket, region: FileRegion) -> int:
    """One sendfile of a region's next bytes; advances it. Raises BlockingIOError when the
    socket takes nothing now, OSError when the file ends before the region does."""
    n = _fileio.ops.sendfile(sock.fileno(), region.fd, region.position, min(region.length, 4 * _SEND_CHUNK))
    if n == 0:
        raise OSError(errno.EIO, f"a file region ends {region.length} bytes early")
    region.position += n
    region.length -= n
    return n


def _send_with_regions(sock: socket.socket, buffers: list[Any]) -> _Sent:
    """Write buffers and file regions in order until the socket takes no more: the bytes sent,
    and what is left (a partly sent buffer or region first)."""
    sent = 0
    for i, buf in enumerate(buffers):
        try:
            if isinstance(buf, FileRegion):
                while buf.length:
                    sent += _send_region(sock, buf)
                buf.close()
                continue
            n = sock.send(buf)
        except (BlockingIOError, InterruptedError):
            return _Sent(sent, buffers[i:])
        sent += n
        if n < len(buf):
            return _Sent(sent, [buf[n:]] + buffers[i + 1:])
    return _Sent(sent, [])


def _release(buffers: Any) -> None:
    """Close the file regions among answers that will not be written."""
    for buf in buffers:
        if isinstance(buf, FileRegion):
            buf.close()


def _buffers(result: Any) -> Sequence[bytes | bytearray | memoryview]:
    """A handler's response as a sequence of buffers."""
    return [result] if isinstance(result, (bytes, bytearray, memoryview)) else result


def _settled(future: Future) -> Any:
    """A completed deferred answer (as :class:`_Answers`; None: no response), or its failure."""
    if future.cancelled():
        return _Failed(ConnectionError("the deferred answer was cancelled"))
    exc = future.exception()
    if exc is not None:
        return _Failed(exc)
    result = future.result()
    return None if result is None else _Answers(list(_buffers(result)), 1)


_LISTENER = object()
_WAKER = object()
