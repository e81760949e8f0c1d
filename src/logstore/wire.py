"""The replication wire protocol: frames, field codecs, error codes and the shared-secret handshake.

Every message is one frame, big-endian::

    int32 length      bytes after this field (header + payload); checked against the cap
                      before anything is allocated
    int16 type        request or response type (RequestType)
    int16 version     of that type's payload layout
    int32 correlation id, echoed by the response
    payload           fields of the type, read with :class:`Reader`

The frame cap is ``PRE_AUTH_MAX_FRAME`` (4 KiB) until the peer has authenticated, then the
connection's configured maximum (default 1 MiB + ``BATCH_OVERHEAD``). Payload fields: intN,
``bytes`` (int32 length, -1 for null), ``string`` (int16 length + UTF-8), arrays (int32 count,
checked against the bytes left times the element's minimum size before any list is built).

Handshake (mutual, the secret never crosses the wire; HMAC-SHA256):

1. client -> HELLO: int32 node id (-1 for a client), 32-byte client nonce
2. server -> CHALLENGE: 32-byte server nonce, HMAC(secret, "logstore-server" + cn + sn)
3. client checks the server's proof, then -> AUTH: HMAC(secret, "logstore-client" + sn + cn)
4. server checks it (constant-time compare) -> AUTH_OK, or closes the connection

The server's side of the handshake is a state machine (:class:`ServerHandshake`, no I/O), which
:class:`ReplicationProtocol` hands to the network layer (``net.Server``) and :func:`server_handshake`
drives over a blocking socket. The client's side (:func:`client_handshake`) and the blocking frame
I/O (:func:`recv_frame`, :func:`send_frame`) serve the replication client's connections.

FORMAT.md documents the frame and handshake layouts. Thread-safety: the functions are pure; a
:class:`Reader` or :class:`ServerHandshake` belongs to one thread; :class:`ReplicationProtocol`
is thread-safe.
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import os
import socket
import ssl
import struct
import time
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Callable, TypeVar

from . import net
from .errors import LogstoreError

__all__ = [
    "RequestType", "FrameError", "AuthenticationError", "Frame", "Reader", "Writer",
    "encode_frame", "decode_frame", "frame_of", "recv_frame", "send_frame",
    "client_handshake", "server_handshake", "PRE_AUTH_MAX_FRAME", "DEFAULT_MAX_FRAME", "BATCH_OVERHEAD",
    "TLSConfig", "ServerHandshake", "ReplicationProtocol",
    "OK", "NOT_LEADER", "NOT_ENOUGH_REPLICAS", "FENCED_EPOCH", "TIMEOUT", "UNKNOWN_PARTITION",
    "OUT_OF_RANGE", "INVALID", "CORRUPT_BATCH", "RECORD_TOO_LARGE", "INVALID_RECORD", "ERROR_TEXT",
]

PRE_AUTH_MAX_FRAME = 4096
BATCH_OVERHEAD = 4096
DEFAULT_MAX_FRAME = (1 << 20) + BATCH_OVERHEAD
HEADER = struct.Struct(">ihhi")        # length, type, version, correlation id
HEADER_AFTER_LENGTH = HEADER.size - 4
_AFTER_LENGTH = struct.Struct(">hhi")  # type, version, correlation id
NONCE_SIZE = 32
MAC_SIZE = 32
_SERVER_LABEL = b"logstore-server"
_CLIENT_LABEL = b"logstore-client"
T = TypeVar("T")

# Error codes of answers (FORMAT.md §13).
OK = 0
NOT_LEADER = 1
NOT_ENOUGH_REPLICAS = 2
FENCED_EPOCH = 3
TIMEOUT = 4
UNKNOWN_PARTITION = 5
OUT_OF_RANGE = 6
INVALID = 7
CORRUPT_BATCH = 8
RECORD_TOO_LARGE = 9
INVALID_RECORD = 10
#: What each error code means, in words.
ERROR_TEXT = {NOT_LEADER: "not the leader", NOT_ENOUGH_REPLICAS: "not enough in-sync replicas",
              FENCED_EPOCH: "fenced epoch", TIMEOUT: "timed out", UNKNOWN_PARTITION: "unknown partition",
              OUT_OF_RANGE: "offset out of range", INVALID: "invalid request",
              CORRUPT_BATCH: "corrupt record batch", RECORD_TOO_LARGE: "batch larger than max_message_bytes",
              INVALID_RECORD: "a record the partition does not accept"}


class RequestType(enum.IntEnum):
    """Frame types (FORMAT.md §13)."""

    HELLO = 1
    CHALLENGE = 2
    AUTH = 3
    AUTH_OK = 4
    ERROR = 5
    PRODUCE = 10
    FETCH = 11
    VOTE = 12
    BEGIN_EPOCH = 13
    OFFSETS_FOR_EPOCH = 14
    METADATA = 15


class FrameError(LogstoreError):
    """A frame or field that breaks the protocol: bad length, truncated field, unknown type."""


class AuthenticationError(net.HandshakeError):
    """The peer did not prove that it knows the shared secret (or we could not). On the server,
    ``reply`` is what is sent before the connection is closed."""


class Frame:
    """A decoded frame: its type, version, correlation id and payload bytes (a view of the
    frame's buffer when read from a socket)."""

    __slots__ = ("type", "version", "correlation_id", "payload")

    def __init__(self, type: int, version: int, correlation_id: int, payload: bytes | memoryview) -> None:
        self.type = type
        self.version = version
        self.correlation_id = correlation_id
        self.payload = payload

    def reader(self) -> "Reader":
        """A Reader over the payload."""
        return Reader(self.payload)

    def __repr__(self) -> str:
        return f"Frame(type={self.type}, version={self.version}, id={self.correlation_id}, {len(self.payload)} bytes)"


# ---------------------------------------------------------------------- fields
class Reader:
    """Reads payload fields, checking every length against the bytes that remain."""

    __slots__ = ("_buf", "_pos")

    def __init__(self, buf: bytes | memoryview) -> None:
        self._buf = memoryview(buf).cast("B") if not isinstance(buf, bytes) else buf
        self._pos = 0

    @property
    def remaining(self) -> int:
        """Bytes not read yet."""
        return len(self._buf) - self._pos

    def _take(self, n: int, what: str) -> bytes:
        if n < 0 or n > self.remaining:
            raise FrameError(f"{what}: needs {n} bytes, {self.remaining} left")
        start = self._pos
        self._pos += n
        return bytes(self._buf[start:self._pos])

    def _unpack(self, fmt: struct.Struct, what: str) -> int:
        pos = self._pos
        end = pos + fmt.size
        if end > len(self._buf):
            raise FrameError(f"{what}: needs {fmt.size} bytes, {len(self._buf) - pos} left")
        self._pos = end
        return fmt.unpack_from(self._buf, pos)[0]  # type: ignore[no-any-return]

    def int8(self, what: str = "int8") -> int:
        """An int8 field."""
        return self._unpack(_I8, what)

    def int16(self, what: str = "int16") -> int:
        """An int16 field."""
        return self._unpack(_I16, what)

    def int32(self, what: str = "int32") -> int:
        """An int32 field."""
        return self._unpack(_I32, what)

    def int64(self, what: str = "int64") -> int:
        """An int64 field."""
        return self._unpack(_I64, what)

    def raw(self, n: int, what: str = "bytes") -> bytes:
        """``n`` bytes as they are (Reader) / appended as they are (Writer)."""
        return self._take(n, what)

    def blob(self, what: str = "bytes") -> bytes | None:
        """A ``bytes`` field: int32 length (-1 for null) and the bytes."""
        n = self.int32(what + " length")
        if n == -1:
            return None
        if n < -1:
            raise FrameError(f"{what}: negative length {n}")
        return self._take(n, what)

    def blob_view(self, what: str = "bytes") -> memoryview | None:
        """A ``bytes`` field as a view of the payload (no copy: for a record batch that is
        validated and stored as it is). The view keeps the payload's buffer alive."""
        n = self.int32(what + " length")
        if n == -1:
            return None
        if n < -1:
            raise FrameError(f"{what}: negative length {n}")
        if n > self.remaining:
            raise FrameError(f"{what}: needs {n} bytes, {self.remaining} left")
        start = self._pos
        self._pos += n
        return memoryview(self._buf)[start:self._pos]

    def string(self, what: str = "string") -> str:
        """A string field: int16 length + UTF-8."""
        n = self.int16(what + " length")
        if n < 0:
            raise FrameError(f"{what}: negative length {n}")
        try:
            return self._take(n, what).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise FrameError(f"{what}: not UTF-8 ({exc})") from None

    def array(self, read_item: Callable[["Reader"], T], min_item_size: int, what: str = "array") -> list[T]:
        """An array field: int32 count + items."""
        count = self.int32(what + " count")
        if count < 0 or count * max(1, min_item_size) > self.remaining:
            raise FrameError(f"{what}: {count} items cannot fit in the {self.remaining} bytes left")
        return [read_item(self) for _ in range(count)]

    def end(self) -> None:
        """Require that every byte was read."""
        if self.remaining:
            raise FrameError(f"{self.remaining} unexpected bytes after the last field")


class Writer:
    """Builds a payload."""

    __slots__ = ("_parts",)

    def __init__(self) -> None:
        self._parts: list[bytes] = []

    def int8(self, v: int) -> "Writer":
        """An int8 field."""
        self._parts.append(_I8.pack(v))
        return self

    def int16(self, v: int) -> "Writer":
        """An int16 field."""
        self._parts.append(_I16.pack(v))
        return self

    def int32(self, v: int) -> "Writer":
        """An int32 field."""
        self._parts.append(_I32.pack(v))
        return self

    def int64(self, v: int) -> "Writer":
        """An int64 field."""
        self._parts.append(_I64.pack(v))
        return self

    def raw(self, b: bytes | bytearray | memoryview) -> "Writer":
        """``n`` bytes as they are (Reader) / appended as they are (Writer). The bytes are
        read by :meth:`payload`, not copied before."""
        self._parts.append(b)  # type: ignore[arg-type]
        return self

    def blob(self, b: bytes | bytearray | memoryview | None) -> "Writer":
        """A bytes field: int32 length (-1 for None) + bytes (read by :meth:`payload`, not
        copied before)."""
        if b is None:
            return self.int32(-1)
        self.int32(len(b))
        self._parts.append(b)  # type: ignore[arg-type]
        return self

    def string(self, s: str) -> "Writer":
        """A string field: int16 length + UTF-8."""
        raw = s.encode("utf-8")
        if len(raw) > 32767:
            raise ValueError(f"string of {len(raw)} bytes does not fit an int16 length")
        self.int16(len(raw))
        self._parts.append(raw)
        return self

    def array(self, items: list[T], write_item: Callable[["Writer", T], object]) -> "Writer":
        """An array field: int32 count + items."""
        self.int32(len(items))
        for item in items:
            write_item(self, item)
        return self

    def payload(self) -> bytes:
        """The payload built so far."""
        return b"".join(self._parts)


_I8 = struct.Struct(">b")
_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")


# ---------------------------------------------------------------------- frames
def encode_frame(type: int, correlation_id: int, payload: bytes = b"", version: int = 0) -> bytes:
    """One frame: length prefix, request type, flags and payload (see FORMAT.md §13)."""
    length = HEADER_AFTER_LENGTH + len(payload)
    return HEADER.pack(length, type, version, correlation_id) + payload


def decode_frame(data: bytes, max_frame: int = DEFAULT_MAX_FRAME) -> tuple[Frame, int]:
    """Decode the frame at the start of ``data``; returns it and the bytes it took.

    Raises:
        FrameError: incomplete, or a length below the header or above ``max_frame``.
    """
    if len(data) < 4:
        raise FrameError(f"frame length needs 4 bytes, got {len(data)}")
    (length,) = _I32.unpack_from(data, 0)
    _check_length(length, max_frame)
    if len(data) < 4 + length:
        raise FrameError(f"frame of {length} bytes is truncated at {len(data) - 4}")
    _, type_, version, correlation = HEADER.unpack_from(data, 0)
    return Frame(type_, version, correlation, bytes(data[HEADER.size:4 + length])), 4 + length


def _check_length(length: int, max_frame: int) -> None:
    if length < HEADER_AFTER_LENGTH:
        raise FrameError(f"frame length {length} is shorter than the {HEADER_AFTER_LENGTH}-byte header")
    if length > max_frame:
        raise FrameError(f"frame length {length} exceeds the limit of {max_frame} bytes")


def _recv_exactly(sock: socket.socket, n: int, deadline: float | None = None) -> bytearray:
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        if deadline is not None:  # a bound on the whole read, not on each recv (slow drip feeds)
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise socket.timeout(f"timed out after {got} of {n} bytes")
            sock.settimeout(remaining)
        k = sock.recv_into(view[got:], n - got)
        if k == 0:
            raise ConnectionError(f"connection closed after {got} of {n} bytes")
        got += k
    return buf


def recv_frame(sock: socket.socket, max_frame: int, deadline: float | None = None) -> Frame:
    """Read one frame from a socket; the length is checked before the payload is allocated.
    With ``deadline`` (time.monotonic()) the whole frame must arrive by then (socket.timeout)."""
    (length,) = _I32.unpack(_recv_exactly(sock, 4, deadline))
    _check_length(length, max_frame)
    return frame_of(_recv_exactly(sock, length, deadline))


def frame_of(body: bytes | bytearray) -> Frame:
    """The frame whose bytes after the length prefix are ``body`` (at least the 8-byte header:
    the length was checked)."""
    type_, version, correlation = _AFTER_LENGTH.unpack_from(body, 0)
    return Frame(type_, version, correlation, memoryview(body)[HEADER_AFTER_LENGTH:])


def send_frame(sock: socket.socket, type: int, correlation_id: int, payload: bytes = b"", version: int = 0) -> None:
    """Send one frame on a socket (all of it). A large payload on a plain socket is sent after
    its header without being copied into one buffer."""
    if len(payload) < _JOIN_BELOW or isinstance(sock, ssl.SSLSocket):
        sock.sendall(encode_frame(type, correlation_id, payload, version))
        return
    header = HEADER.pack(HEADER_AFTER_LENGTH + len(payload), type, version, correlation_id)
    views = [memoryview(header), memoryview(payload).cast("B")]
    while views:
        sent = sock.sendmsg(views)
        while views and sent >= len(views[0]):
            sent -= len(views[0])
            views.pop(0)
        if views:
            views[0] = views[0][sent:]


#: Payloads smaller than this are joined to their header (one send() is cheaper than sendmsg).
_JOIN_BELOW = 64 * 1024


# ---------------------------------------------------------------------- handshake
def _mac(secret: bytes, label: bytes, a: bytes, b: bytes) -> bytes:
    return hmac.new(secret, label + a + b, hashlib.sha256).digest()


def client_handshake(sock: socket.socket, secret: bytes, node_id: int = -1) -> None:
    """Authenticate to a server (and make it prove itself). Raises AuthenticationError."""
    client_nonce = os.urandom(NONCE_SIZE)
    send_frame(sock, RequestType.HELLO, 0, Writer().int32(node_id).raw(client_nonce).payload())
    frame = recv_frame(sock, PRE_AUTH_MAX_FRAME)
    if frame.type == RequestType.ERROR:
        raise AuthenticationError(f"server refused the handshake: {frame.reader().string('error')}")
    if frame.type != RequestType.CHALLENGE:
        raise AuthenticationError(f"expected CHALLENGE, got frame type {frame.type}")
    r = frame.reader()
    server_nonce = r.raw(NONCE_SIZE, "server nonce")
    proof = r.raw(MAC_SIZE, "server proof")
    r.end()
    if not hmac.compare_digest(proof, _mac(secret, _SERVER_LABEL, client_nonce, server_nonce)):
        raise AuthenticationError("the server does not know the shared secret")
    send_frame(sock, RequestType.AUTH, 0, _mac(secret, _CLIENT_LABEL, server_nonce, client_nonce))
    frame = recv_frame(sock, PRE_AUTH_MAX_FRAME)
    if frame.type != RequestType.AUTH_OK:
        raise AuthenticationError("the server rejected our proof of the shared secret")


def server_handshake(sock: socket.socket, secret: bytes, timeout: float | None = None) -> int:
    """Authenticate a connecting peer over a blocking socket; returns its node id (-1 for a
    client). With ``timeout`` the whole handshake must finish within that many seconds.

    Raises:
        AuthenticationError / FrameError: the peer failed; the caller closes the connection.
        socket.timeout: the handshake took longer than ``timeout``.
    """
    deadline = None if timeout is None else time.monotonic() + timeout
    handshake = ServerHandshake(secret)
    while not handshake.done:
        frame = recv_frame(sock, PRE_AUTH_MAX_FRAME, deadline)
        try:
            reply = handshake.step(frame)
        except AuthenticationError as exc:
            if exc.reply:
                sock.sendall(exc.reply)
            raise
        sock.sendall(reply)
    return handshake.principal  # type: ignore[no-any-return]


class ServerHandshake(net.Handshake):
    """The server's side of the handshake as a state machine: it takes the peer's frames and
    returns the frames to answer, and does no I/O (the network loop, or
    :func:`server_handshake`, moves the bytes). ``principal`` is the peer's node id (-1 for a
    client) once ``done``. Not thread-safe: one per connection.

    A handshake is valid iff the first frame is HELLO (int32 node id + nonce), the second AUTH,
    and the AUTH proof is HMAC(secret, client label + server nonce + client nonce).
    """

    def __init__(self, secret: bytes) -> None:
        self._secret = secret
        self._client_nonce: bytes | None = None
        self._server_nonce = b""
        self.done = False
        self.principal: int | None = None

    def receive(self, frame: bytes | bytearray) -> bytes:
        """Take the bytes of a frame after its length prefix; see :meth:`step`."""
        return self.step(frame_of(frame))

    def step(self, frame: Frame) -> bytes:
        """Take one frame; return the frame to answer.

        Raises:
            AuthenticationError: the peer failed (``reply``, if any, is its last answer).
            FrameError: a malformed frame.
        """
        if self.done:
            raise AuthenticationError(f"frame type {frame.type} after the handshake ended")
        if self._client_nonce is None:
            if frame.type != RequestType.HELLO:
                raise AuthenticationError(f"expected HELLO, got frame type {frame.type}")
            r = frame.reader()
            node_id = r.int32("node id")
            client_nonce = r.raw(NONCE_SIZE, "client nonce")
            r.end()
            self.principal, self._client_nonce = node_id, client_nonce
            self._server_nonce = os.urandom(NONCE_SIZE)
            return encode_frame(RequestType.CHALLENGE, 0, self._server_nonce
                                + _mac(self._secret, _SERVER_LABEL, client_nonce, self._server_nonce))
        if frame.type != RequestType.AUTH:
            raise AuthenticationError(f"expected AUTH, got frame type {frame.type}")
        r = frame.reader()
        proof = r.raw(MAC_SIZE, "client proof")
        r.end()
        if not hmac.compare_digest(proof, _mac(self._secret, _CLIENT_LABEL, self._server_nonce, self._client_nonce)):
            raise AuthenticationError("the peer does not know the shared secret", reply=encode_frame(
                RequestType.ERROR, 0, Writer().string("authentication failed").payload()))
        self.done = True
        return encode_frame(RequestType.AUTH_OK, 0)


#: A request handler: the request's payload fields in, the response payload out (or its Future,
#: for an answer that waits: see ``purgatory``).
Handler = Callable[[Reader], "bytes | Future[bytes]"]


class ReplicationProtocol(net.Protocol):
    """The replication protocol as ``net.Server`` serves it: 4-byte length prefix, the frame cap
    (``PRE_AUTH_MAX_FRAME`` until the peer authenticated, then ``max_frame``), the shared-secret
    handshake, and dispatch by frame type.

    ``lookup(type)`` returns the handler of a request type (None: unknown, answered with an
    ERROR frame). It is called for every request, so a handler replaced at run time is used from
    the next request on. The request types in ``inline_types`` have handlers that never block
    (they answer at once or with a Future), and are run on the network loop. Thread-safety:
    thread-safe (it holds no state of its own).
    """

    header_size = 4

    def __init__(self, secret: bytes, max_frame: int, lookup: Callable[[int], Handler | None],
                 inline_types: frozenset[int] = frozenset()) -> None:
        self.secret = secret
        self.max_frame = max_frame
        self._lookup = lookup
        self._inline_types = inline_types

    def inline(self, session: net.Session, request: bytearray) -> bool:
        return _AFTER_LENGTH.unpack_from(request, 0)[0] in self._inline_types

    def frame_size(self, header: bytes, authenticated: bool) -> int:
        (length,) = _I32.unpack(header)
        _check_length(length, self.max_frame if authenticated else PRE_AUTH_MAX_FRAME)
        return length  # type: ignore[no-any-return]

    def handshake(self, session: net.Session) -> ServerHandshake:
        return ServerHandshake(self.secret)

    def handle(self, session: net.Session, request: bytes | bytearray) -> "list[bytes] | Future[list[bytes]]":
        # The request's bytes are read where they are (a produce's batch is never copied), and
        # the answer is written as its header and payload (never joined).
        type_, _, correlation = _AFTER_LENGTH.unpack_from(request, 0)
        handler = self._lookup(type_)
        if handler is None:
            return _framed(RequestType.ERROR, correlation, Writer().string(f"unknown request type {type_}").payload())
        payload = handler(Reader(memoryview(request)[HEADER_AFTER_LENGTH:]))
        if not isinstance(payload, Future):
            return _framed(type_, correlation, payload)
        # A deferred answer: framed by whichever thread completes it.
        framed: Future[list[bytes]] = Future()

        def frame_answer(done: Future[bytes]) -> None:
            if done.cancelled():
                framed.cancel()
                return
            exc = done.exception()
            if exc is not None:
                framed.set_exception(exc)
            else:
                framed.set_result(_framed(type_, correlation, done.result()))

        payload.add_done_callback(frame_answer)
        return framed


def _framed(type: int, correlation_id: int, payload: bytes) -> list[bytes]:
    """A frame as two buffers: its header and ``payload`` (see encode_frame)."""
    return [HEADER.pack(HEADER_AFTER_LENGTH + len(payload), type, 0, correlation_id), payload]


# ---------------------------------------------------------------------- TLS
@dataclass(frozen=True)
class TLSConfig:
    """TLS for a listener and its clients (the ``ssl`` module); mutual TLS for replication,
    under the handshake above.

    Every node and client presents ``certfile``/``keyfile`` and accepts only peers whose
    certificate chains to ``cafile``: a server requires a client certificate
    (``ssl.CERT_REQUIRED``), so a peer without one is refused during the TLS handshake. Peer
    names are not checked against the certificate (replicas are addressed by IP); the identity
    check is the private CA plus the shared secret. TLS 1.2 is the minimum.

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
