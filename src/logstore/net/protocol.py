"""What a protocol served by :class:`logstore.net.server.Server` implements, and what it is given.

:class:`Protocol` (frame sizes, the authentication :class:`Handshake`, and the handler),
:class:`Session` (one connection as a handler sees it), :class:`Limits` and the :data:`Response`
a handler returns, and :class:`TLSConfig` (a listener's and its clients' TLS). Kept apart
from :mod:`logstore.net.server` so that the loop and the contract it serves read apart.

Thread-safety: as documented on each class (a Protocol's handler runs on several worker threads
at once; its other methods, and a Handshake, on the loop thread). This module imports nothing
of logstore above the base layer.
"""

from __future__ import annotations

import abc
import ssl
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Callable, Sequence, Union

from .._fileio import FileRegion
from ..errors import LogstoreError

__all__ = ["Protocol", "Handshake", "HandshakeError", "SlowStep", "Session", "Limits", "Response", "Offload",
           "TLSConfig"]

#: What a handler returns: bytes to write (whole frames), several buffers written in order (a
#: :class:`~logstore._fileio.FileRegion` among them is written with sendfile, and closed), None
#: for no response at all, or a Future of one of those.
Response = Union[bytes, bytearray, memoryview, Sequence[Union[bytes, bytearray, memoryview, FileRegion]], None,
                 Future]


class Offload:
    """What :meth:`Protocol.handle_inline` returns for a request it cannot answer without
    waiting: ``call()`` runs on a worker thread (where it may block) and returns the answer, as
    :meth:`Protocol.handle` does (a :data:`Response`). Immutable."""

    __slots__ = ("call",)

    def __init__(self, call: Callable[[], Response]) -> None:
        self.call = call

    def __repr__(self) -> str:
        return f"Offload({self.call!r})"


class HandshakeError(LogstoreError):
    """A peer failed the handshake. ``reply`` (whole frames, may be empty) is sent to it, and the
    connection closed ``close_delay_s`` after (Kafka's ``connection.failed.authentication.delay.ms``:
    a client that drops what it read with the close still reads the reply), reading nothing more."""

    def __init__(self, message: str, reply: bytes = b"", close_delay_s: float = 0.0) -> None:
        super().__init__(message)
        self.reply = reply
        self.close_delay_s = close_delay_s


class SlowStep:
    """A handshake step too costly for the loop thread (a PLAIN password's PBKDF2: milliseconds,
    during which every other connection of the listener would wait), returned by
    :meth:`Handshake.receive` instead of its reply. The loop mutes the connection (nothing more
    is read from it), runs ``run()`` on one of the listener's few verification threads, and
    takes its outcome back on the loop as it would have taken :meth:`Handshake.receive`'s: the
    reply bytes, or a :class:`HandshakeError`. Meanwhile ``run`` owns the handshake (the loop
    does not touch it until the outcome is back), and other connections are served.
    Immutable."""

    __slots__ = ("run",)

    def __init__(self, run: Callable[[], bytes]) -> None:
        self.run = run


class Session:
    """A served connection as a protocol sees it: an id unique in the server, the peer's
    address, whether it came over TLS, and who it authenticated as (``principal``, set by the
    handshake; None before). Thread-safety: read it from any thread; the loop sets
    ``principal`` before the first request, and again (to the same principal) after a
    re-authentication, while no request of the connection is in a worker."""

    __slots__ = ("id", "peer", "tls", "principal")

    def __init__(self, id: int, peer: Any, tls: bool) -> None:
        self.id = id
        self.peer = peer
        self.tls = tls
        self.principal: Any = None

    def __repr__(self) -> str:
        return f"Session({self.id}, peer={self.peer!r}, tls={self.tls}, principal={self.principal!r})"


class Handshake(abc.ABC):
    """One connection's authentication, driven by the loop one frame at a time.

    Every frame that arrives before ``done`` is true goes to :meth:`receive`; frames are capped
    with ``authenticated=False`` meanwhile. Not thread-safe (the loop thread alone calls it), and
    it must not block.
    """

    #: True once the peer authenticated: frames from then on are requests.
    done: bool = False
    #: Who the peer authenticated as (copied to :attr:`Session.principal` when done).
    principal: Any = None
    #: When the authenticated session ends (``time.monotonic()``; set with ``done``), None:
    #: never. Past it, the loop closes the connection at its next frame unless that frame starts
    #: a re-authentication (Kafka's KIP-368: the next request, not a timer).
    session_expires: float | None = None

    def reauthenticate(self, frame: bytearray, now: float) -> bool:
        """Called by the loop with every frame of the authenticated connection (before the
        session's expiry is checked): whether ``frame`` starts a re-authentication. If so,
        ``done`` is false again, and this frame and the next go to :meth:`receive` until it is
        done (with the same principal, or the handshake fails). Default: never."""
        return False

    @abc.abstractmethod
    def receive(self, frame: bytearray) -> bytes | SlowStep:
        """Take one frame (its body, after the size prefix; the loop does not reuse the buffer)
        and return the bytes to send back (whole frames; may be empty), or a :class:`SlowStep`
        that computes them off the loop.

        Raises:
            HandshakeError: the peer failed; its ``reply`` is sent, then the connection closed.
            Exception: anything else closes the connection at once.
        """


class Protocol(abc.ABC):
    """What a listener speaks. One instance serves every connection of a :class:`Server`.

    Thread-safety: :meth:`handle` is called from several worker threads at once; the other
    methods from the loop thread, where they must not block.
    """

    #: Bytes of the size prefix that starts every frame.
    header_size: int = 4

    @abc.abstractmethod
    def frame_size(self, header: bytes, authenticated: bool) -> int:
        """How many bytes follow the size prefix ``header`` (``header_size`` bytes). Called
        before the frame's buffer is allocated: raise (any exception closes the connection)
        for a malformed size or one over the cap (``authenticated`` tells which cap)."""

    def handshake(self, session: Session) -> Handshake | None:
        """A new handshake state machine for a connection (after its TLS handshake), or None
        when requests may follow at once."""
        return None

    def inline(self, session: Session, request: bytearray) -> bool:
        """Whether the loop answers ``request`` itself, with :meth:`handle_inline`: a hand-off
        to a worker costs a thread wake-up, about half of a small request's round trip. Called
        on the loop thread; must not block. The default: False (every request goes to a
        worker)."""
        return False

    def handle_inline(self, session: Session, request: bytearray) -> Union[Response, Offload]:
        """Answer a request :meth:`inline` accepted, on the loop thread, without blocking: at
        once, with a Future, or with an :class:`Offload` whose call a worker makes (for a
        request that turns out to need to wait, e.g. for a lock another thread holds; nothing
        of it may have taken effect on the loop then). Raising closes the connection, as from
        :meth:`handle`. The default: :meth:`handle` (for requests that never block)."""
        return self.handle(session, request)

    @abc.abstractmethod
    def handle(self, session: Session, request: bytearray) -> Response:
        """Answer one request: the whole frame after its size prefix, a bytearray, or for a
        large frame a writable memoryview of a buffer the connection reuses for a later frame
        once nothing references it (so the handler may keep the frame, or views of it, and
        they stay as they are). Runs on a worker thread
        and may block. Returns what to write (see :data:`Response`); raising closes the
        connection (an OSError or LogstoreError is logged at debug level, anything else as an
        error)."""


@dataclass(frozen=True)
class Limits:
    """A server's connection limits (Kafka's max.connections, connections.max.idle.ms).
    Immutable."""

    max_connections: int = 256
    handshake_timeout_s: float = 10.0
    idle_timeout_s: float = 600.0

    def __post_init__(self) -> None:
        if self.max_connections < 1:
            raise ValueError(f"max_connections must be >= 1, got {self.max_connections}")
        if self.handshake_timeout_s <= 0 or self.idle_timeout_s <= 0:
            raise ValueError("the handshake and idle timeouts must be > 0")


# ---------------------------------------------------------------------- TLS
@dataclass(frozen=True)
class TLSConfig:
    """TLS for a listener and its clients (the ``ssl`` module); mutual TLS for replication.

    Every node and client presents ``certfile``/``keyfile`` and accepts only peers whose
    certificate chains to ``cafile``: a server requires a client certificate
    (``ssl.CERT_REQUIRED``), so a peer without one is refused during the TLS handshake. Peer
    names are not checked against the certificate (replicas are addressed by IP); the identity
    check is the private CA (and, for replication, the shared secret's SASL login). TLS 1.2 is the minimum.

    ``cafile`` None (the Kafka listener only: replication refuses it) asks clients for no
    certificate (Kafka's ``ssl.client.auth=none``); a client context then verifies servers
    against the system's CAs.

    Thread-safety: immutable; the contexts it builds are shared by every connection.
    """

    certfile: str
    keyfile: str
    cafile: str | None = None

    def _context(self, purpose: ssl.Purpose) -> ssl.SSLContext:
        side = ssl.PROTOCOL_TLS_SERVER if purpose is ssl.Purpose.CLIENT_AUTH else ssl.PROTOCOL_TLS_CLIENT
        ctx = ssl.SSLContext(side)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_REQUIRED
        try:
            ctx.load_cert_chain(self.certfile, self.keyfile)
            if self.cafile is not None:
                ctx.load_verify_locations(cafile=self.cafile)
            elif purpose is ssl.Purpose.CLIENT_AUTH:
                ctx.verify_mode = ssl.CERT_NONE
            else:
                ctx.load_default_certs(purpose)
        except (OSError, ssl.SSLError) as exc:
            raise ValueError(f"TLS configuration: cannot load {self.certfile}, {self.keyfile} or "
                             f"{self.cafile}: {exc}") from None
        return ctx

    @property
    def mutual(self) -> bool:
        """Whether a server requires client certificates (``cafile`` is set)."""
        return self.cafile is not None

    def server_context(self) -> ssl.SSLContext:
        """The context a node wraps accepted connections in (client certificates required
        when ``cafile`` is set)."""
        return self._context(ssl.Purpose.CLIENT_AUTH)

    def client_context(self) -> ssl.SSLContext:
        """The context outgoing connections (to peers, from clients) are wrapped in."""
        return self._context(ssl.Purpose.SERVER_AUTH)
