"""The replication client side: connections to nodes, the peer connection pool, and ``Client``.

:class:`Client` produces to and fetches from a replica set, following its leader;
:class:`PeerConnections` is a node's set of connections to the other voters (for votes,
BEGIN_EPOCH and leader discovery); :class:`NodeConnection` is one authenticated blocking
connection, which both use (and the follower's fetchers). The errors a replication request raises
(:class:`ReplicationError` and its subclasses) live here too.
"""

from __future__ import annotations

import errno
import random
import socket
import ssl
import threading
import time
from typing import Iterable, NamedTuple

from . import compression
from .election import NONE
from .errors import LogstoreError, OffsetOutOfRangeError
from .records import BatchBuilder, Record, decode_batches, end_offset_of
from .wire import (
    DEFAULT_MAX_FRAME,
    ERROR_TEXT,
    INVALID,
    NOT_ENOUGH_REPLICAS,
    NOT_LEADER,
    OK,
    OUT_OF_RANGE,
    TIMEOUT,
    FrameError,
    Reader,
    RequestType,
    TLSConfig,
    Writer,
    client_handshake,
    recv_frame,
    send_frame,
)

__all__ = ["Client", "Fetched", "NodeConnection", "PeerConnections", "ReplicationError", "NotLeaderError",
           "NotEnoughReplicasError", "ReplicationTimeoutError"]


# ---------------------------------------------------------------------- errors
class ReplicationError(LogstoreError):
    """A replication request failed (the message says why)."""

    def __init__(self, message: str, code: int = INVALID, leader: int = NONE) -> None:
        super().__init__(message)
        self.code = code
        self.leader = leader


class NotLeaderError(ReplicationError):
    """The node asked is not the partition's leader; ``leader`` names the one it knows (or -1)."""


class NotEnoughReplicasError(ReplicationError):
    """Fewer than min_insync_replicas replicas are in sync; nothing was written (acks="all")."""


class ReplicationTimeoutError(ReplicationError):
    """The leader appended the records but a majority did not confirm them within the timeout
    (acks="all"): they may still be committed later, or lost with the leader. (The retries
    ``produce`` makes itself carry the same producer sequence and are never appended twice; a
    new ``produce`` call is a new write.)"""


def _raise_for(code: int, leader: int, what: str) -> None:
    if code == OK:
        return
    text = f"{what}: {ERROR_TEXT.get(code, f'error {code}')}"
    if code == NOT_LEADER:
        raise NotLeaderError(text + (f" (leader: node {leader})" if leader != NONE else ""), code, leader)
    if code == NOT_ENOUGH_REPLICAS:
        raise NotEnoughReplicasError(text, code, leader)
    if code == TIMEOUT:
        raise ReplicationTimeoutError(text, code, leader)
    raise ReplicationError(text, code, leader)


# ---------------------------------------------------------------------- connections
class NodeConnection:
    """One authenticated client connection to a node (request/response, one at a time).

    Thread-safety: not thread-safe; threads that share one take ``lock`` around
    :meth:`request`. Blocking: every call waits on the socket (its timeout bounds each wait).
    """

    def __init__(self, address: tuple[str, int], secret: bytes, node_id: int, timeout: float,
                 max_frame: int, tls: ssl.SSLContext | None = None) -> None:
        sock = socket.create_connection(address, timeout=timeout)
        try:
            if sock.getsockname() == sock.getpeername():
                # TCP simultaneous open: a connect to a loopback port that nothing listens on
                # can get that very port as its local port and connect to itself, holding
                # the port that the node we wanted is about to bind.
                raise ConnectionRefusedError(errno.ECONNREFUSED, f"{address[0]}:{address[1]}: connected to itself")
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if tls is not None:
                sock = tls.wrap_socket(sock)
            client_handshake(sock, secret, node_id)
        except BaseException:
            sock.close()
            raise
        self.sock = sock
        self.max_frame = max_frame
        self._next = 1
        #: one request at a time on this connection (several threads of a node share it)
        self.lock = threading.Lock()

    def request(self, type: int, payload: bytes, timeout: float | None = None) -> Reader:
        """Send one request and return a Reader over the answer's payload.

        Raises:
            OSError: the connection failed or timed out. FrameError: a bad answer.
        """
        cid = self._next
        self._next += 1
        if timeout is not None:
            self.sock.settimeout(timeout)
        send_frame(self.sock, type, cid, payload)
        frame = recv_frame(self.sock, self.max_frame)
        if frame.correlation_id != cid:
            raise FrameError(f"response {frame.correlation_id} to request {cid}")
        return frame.reader()

    def close(self) -> None:
        """Close the connection."""
        try:
            self.sock.close()
        except OSError:
            pass


#: The name NodeConnection had while it lived in replication.py (tests import it from there).
_Connection = NodeConnection


class PeerConnections:
    """A node's connections to the other voters: one per peer, made on first use, shared by the
    node's threads (one request at a time on each), dropped when a request on it fails.

    Thread-safety: thread-safe. Blocking: :meth:`request` waits for the peer's answer.
    """

    def __init__(self, peers: dict[int, tuple[str, int]], secret: bytes, node_id: int, max_frame: int,
                 tls: ssl.SSLContext | None, stopping: threading.Event) -> None:
        self._peers = peers
        self._secret = secret
        self._node_id = node_id
        self._max_frame = max_frame
        self._tls = tls
        self._stopping = stopping
        self._lock = threading.Lock()
        self._conns: dict[int, NodeConnection] = {}

    def request(self, peer: int, type: int, payload: bytes, timeout: float) -> Reader:
        """One request to ``peer``; its answer's payload.

        Raises:
            OSError, LogstoreError: the peer could not answer (the connection is dropped), or
            the node is stopping (ConnectionError).
        """
        with self._lock:
            conn = self._conns.get(peer)
        if conn is None:
            # Connect and authenticate without holding the lock (a slow peer must not hold up
            # requests to the others); the first connection registered wins.
            fresh = NodeConnection(self._peers[peer], self._secret, self._node_id, timeout, self._max_frame, self._tls)
            with self._lock:
                conn = self._conns.setdefault(peer, fresh)
                stopped = self._stopping.is_set()
            if conn is not fresh or stopped:
                fresh.close()
            if stopped:
                raise ConnectionError(f"node {self._node_id} is stopping")
        try:
            with conn.lock:
                return conn.request(type, payload, timeout)
        except (OSError, LogstoreError):
            self.drop(peer)
            raise

    def drop(self, peer: int) -> None:
        """Close the connection to ``peer`` (a request blocked on it fails at once)."""
        with self._lock:
            conn = self._conns.pop(peer, None)
        if conn is not None:
            conn.close()

    def close(self) -> None:
        """Close every connection."""
        with self._lock:
            peers = list(self._conns)
        for peer in peers:
            self.drop(peer)


# ---------------------------------------------------------------------- the client
class Fetched(NamedTuple):
    """What :meth:`Client.fetch` returns (immutable; safe to share between threads)."""

    #: committed records from the offset asked for (control records left out)
    records: list[Record]
    #: the offset to fetch next: past every batch returned, control batches included
    next_offset: int
    #: the answering replica's high watermark
    high_watermark: int


class Client:
    """Produces to and reads from a replica set, following its leader.

    Args:
        bootstrap: [(host, port)] of some nodes.
        secret: the shared secret.
        timeout: seconds for a connection or a request, and the default for produce/fetch.
        tls: mutual TLS (required when the nodes use it).
        compression_type: codec of produced batches ("gzip", "snappy", "lz4", "zstd"; None: none).

    Thread-safety: one thread at a time (give each thread its own Client).
    """

    def __init__(self, bootstrap: Iterable[tuple[str, int]], secret: bytes, timeout: float = 10.0,
                 tls: TLSConfig | None = None, compression_type: str | None = None) -> None:
        self.bootstrap = list(bootstrap)
        if not self.bootstrap:
            raise ValueError("bootstrap needs at least one (host, port)")
        self.secret = secret
        self.timeout = timeout
        self._tls = tls.client_context() if tls is not None else None
        self._conns: dict[tuple[str, int], NodeConnection] = {}
        #: Idempotence: every produce carries this id and a per-partition sequence number, so a
        #: retry after a lost response is recognised by the leader instead of appended again.
        self.producer_id = random.SystemRandom().getrandbits(62)
        self._sequences: dict[tuple[str, int], int] = {}
        self._builder = BatchBuilder()
        #: node id -> address, learnt from METADATA answers
        self._nodes: dict[int, tuple[str, int]] = {}
        #: (topic, partition) -> the node last seen leading it
        self._leaders: dict[tuple[str, int], int] = {}
        self._codec = compression.codec_from_name(compression_type) if compression_type else compression.NONE

    def _conn(self, address: tuple[str, int]) -> NodeConnection:
        conn = self._conns.get(address)
        if conn is None:
            conn = self._conns[address] = NodeConnection(address, self.secret, NONE, self.timeout, DEFAULT_MAX_FRAME,
                                                      self._tls)
        return conn

    def _call(self, address: tuple[str, int], type: int, payload: bytes, wait: float = 0.0) -> Reader:
        """One request; a cached connection the node closed meanwhile (idle limit, restart) is
        replaced once. ``wait`` is how long the node may hold the request (an acks="all"
        produce): the socket waits that much longer. Raises OSError/LogstoreError when the
        node cannot answer."""
        reused = address in self._conns
        timeout = self.timeout + wait
        try:
            return self._conn(address).request(type, payload, timeout=timeout)
        except socket.timeout:
            self._drop(address)
            raise  # the node may still be working on it: never send it twice from here
        except (OSError, LogstoreError):
            self._drop(address)
            if not reused:
                raise
        try:
            return self._conn(address).request(type, payload, timeout=timeout)
        except (OSError, LogstoreError):
            self._drop(address)
            raise

    def _drop(self, address: tuple[str, int]) -> None:
        conn = self._conns.pop(address, None)
        if conn is not None:
            conn.close()

    def produce(self, topic: str, partition: int, values: list[bytes | None], keys: list[bytes | None] | None = None,
                acks: int | str = "all", timeout: float | None = None) -> list[int]:
        """Append records on the leader; returns their offsets. With acks="all" it returns once
        they are committed (held by a majority).

        Raises:
            NotEnoughReplicasError, ReplicationError: as the leader answers; NotLeaderError when no
            leader could be found before ``timeout``.
        """
        code = {0: 0, 1: 1, "all": -1, -1: -1}.get(acks)  # type: ignore[call-overload]
        if code is None:
            raise ValueError(f"acks must be 0, 1 or 'all', got {acks!r}")
        sequence = self._sequences.get((topic, partition), 0)
        # One record batch, encoded here by the C encoder and stored by the leader as it is
        # (as Kafka's producer does); the producer id and sequence travel in its header.
        batch = self._builder.build(values, keys, producer_id=self.producer_id, producer_epoch=0,
                                    base_sequence=sequence, codec=self._codec)
        self._sequences[(topic, partition)] = (sequence + len(values)) % (1 << 31)
        payload = (Writer().string(topic).int32(partition).int8(code).int32(int((timeout or self.timeout) * 1000))
                   .blob(batch).payload())
        err, leader, r = self._leader_request((topic, partition), RequestType.PRODUCE, payload,
                                              timeout or self.timeout, f"produce to {topic}-{partition}",
                                              wait=(timeout or self.timeout) if code == -1 else 0.0)
        first, last = r.int64(), r.int64()
        _raise_for(err, leader, f"produce to {topic}-{partition}")
        return list(range(first, last + 1))

    def _candidates(self, key: tuple[str, int]) -> list[tuple[str, int]]:
        """Addresses to try: the partition's last known leader first, then the bootstrap list."""
        leader = self._leaders.get(key)
        first = [self._nodes[leader]] if leader is not None and leader in self._nodes else []
        return first + [a for a in self.bootstrap if a not in first]

    def _follow(self, key: tuple[str, int], leader: int, refused_by: tuple[str, int]) -> bool:
        """A node refused a request naming ``leader`` (-1: unknown). Remember it, learning its
        address from the refusing node when needed; True when there is a new address to try."""
        if leader < 0:
            self._leaders.pop(key, None)
            return False
        self._leaders[key] = leader
        if leader not in self._nodes:
            try:
                self._read_metadata(self._call(refused_by, RequestType.METADATA, b""))
            except (OSError, LogstoreError):
                return False
        return self._nodes.get(leader, refused_by) != refused_by

    def _leader_request(self, key: tuple[str, int], type: int, payload: bytes, timeout: float,
                        what: str, wait: float = 0.0) -> tuple[int, int, Reader]:
        """Send a request the partition's leader must answer, following "not the leader"
        answers that name the leader, until a node accepts it or ``timeout`` passes. Returns
        (error code, leader id, the rest of the answer)."""
        deadline = time.monotonic() + timeout
        last_error: Exception | None = None
        redirects = 0
        while time.monotonic() < deadline:
            redirected = False
            for address in self._candidates(key):
                try:
                    r = self._call(address, type, payload, wait)
                except (OSError, LogstoreError) as exc:
                    last_error = exc
                    continue
                err, leader = r.int16(), r.int32()
                if err != NOT_LEADER:
                    if err == OK and leader >= 0:
                        self._leaders[key] = leader
                        self._nodes.setdefault(leader, address)
                    return err, leader, r
                last_error = NotLeaderError(f"node at {address[0]}:{address[1]} is not the leader"
                                            + (f" (node {leader} is)" if leader >= 0 else ""), err, leader)
                if redirects < 8 and self._follow(key, leader, address):
                    redirects += 1
                    redirected = True
                    break  # straight to the leader it named
            if not redirected:
                time.sleep(0.05)
        raise NotLeaderError(f"{what}: no leader answered within the timeout ({last_error})", NOT_LEADER,
                             getattr(last_error, "leader", NONE))

    def _read_metadata(self, r: Reader) -> dict[tuple[str, int], tuple[int, int, int]]:
        r.int32()
        rows = r.array(lambda x: (x.string(), x.int32(), x.int32(), x.int32(), x.int64()), 22)
        nodes = r.array(lambda x: (x.int32(), x.string(), x.int32()), 10)
        for node, host, port in nodes:
            self._nodes.setdefault(node, (host, port))
        return {(t, p): (leader, epoch, hw) for t, p, leader, epoch, hw in rows}

    def fetch(self, topic: str, partition: int, offset: int, max_bytes: int = 1 << 20,
              timeout: float | None = None) -> Fetched:
        """Committed records of a partition from ``offset`` on (about ``max_bytes`` of batches,
        at least one when any is committed), from its leader. An empty answer means nothing is
        committed at or after ``offset`` yet; fetch again from ``next_offset``.

        Raises:
            OffsetOutOfRangeError: ``offset`` below the log start or above the high watermark.
            NotLeaderError: no leader answered before ``timeout``.
            CorruptRecordError: a batch failed its CRC on arrival.
        """
        if max_bytes <= 0:
            raise ValueError(f"max_bytes must be > 0, got {max_bytes}")
        payload = (Writer().int32(-1).string(topic).int32(partition).int32(-1).int64(offset).int32(-1)
                   .int32(min(max_bytes, DEFAULT_MAX_FRAME - 4096)).payload())
        err, leader, r = self._leader_request((topic, partition), RequestType.FETCH, payload,
                                              timeout or self.timeout, f"fetch from {topic}-{partition}")
        _epoch, hw = r.int32(), r.int64()
        _div_epoch, start = r.int32(), r.int64()
        data = r.blob() or b""
        if err == OUT_OF_RANGE:
            raise OffsetOutOfRangeError(offset, start, hw, f"fetch from {topic}-{partition}")
        _raise_for(err, leader, f"fetch from {topic}-{partition}")
        return Fetched(decode_batches(data, offset), end_offset_of(data, offset), hw)

    def metadata(self) -> dict[tuple[str, int], tuple[int, int, int]]:
        """{(topic, partition): (leader, epoch, high watermark)} as the first reachable node knows it."""
        for address in self.bootstrap:
            try:
                r = self._call(address, RequestType.METADATA, b"")
            except (OSError, LogstoreError):
                continue
            return self._read_metadata(r)
        raise ReplicationError("no node reachable")

    def close(self) -> None:
        """Close every connection."""
        for address in list(self._conns):
            self._drop(address)
