"""The replication client side, over Kafka's protocol: connections to nodes, the peer connection
pool, and ``Client``.

Every node serves one Kafka listener (SASL, over TLS when configured) to Kafka clients and to
its peers alike. Peers and :class:`Client` log in as the user :data:`REPLICA_USER` with the
set's shared secret as the password (SCRAM-SHA-256: the secret never crosses the wire), the
principal the nodes allow the replication requests (a follower's Fetch, Vote,
BeginQuorumEpoch). :class:`NodeConnection` is one such blocking connection;
:class:`PeerConnections` is a node's set of them to the other voters (votes, BeginQuorumEpoch,
leader discovery); :class:`Client` produces to and fetches from a replica set, following its
leader. The errors a replication request raises (:class:`ReplicationError` and its
subclasses) live here too; their ``code`` is Kafka's error code.
"""

from __future__ import annotations

import random
import ssl
import threading
import time
from typing import Any, Callable, Iterable, Mapping, NamedTuple

from ..records import compression
from .quorum import NONE
from ..errorcodes import ErrorCode
from ..errors import LogstoreError, OffsetOutOfRangeError
from ..kafka.apikeys import (ADD_PARTITIONS_TO_TXN, BEGIN_QUORUM_EPOCH, DESCRIBE_QUORUM, ENVELOPE, FETCH,
                             LIST_OFFSETS, METADATA, PRODUCE, VOTE, WRITE_TXN_MARKERS)
from ..kafka.client import Security, Connection
from ..net.protocol import TLSConfig
from ..records.batch import BatchBuilder, Record, decode_batches, end_offset_of

__all__ = ["Client", "Fetched", "NodeConnection", "PeerConnections", "ReplicationError", "NotLeaderError",
           "NotEnoughReplicasError", "ReplicationTimeoutError", "REPLICA_USER", "replica_password"]

#: The SASL user that peers and :class:`Client` authenticate as, with the shared secret.
REPLICA_USER = "replica"
REPLICA_MECHANISM = "SCRAM-SHA-256"

# API keys and the versions replication speaks.
VERSIONS = {PRODUCE: 8, FETCH: 12, LIST_OFFSETS: 8, METADATA: 8, VOTE: 2, BEGIN_QUORUM_EPOCH: 1,
            WRITE_TXN_MARKERS: 1, ADD_PARTITIONS_TO_TXN: 4,
            DESCRIBE_QUORUM: 1,
            ENVELOPE: 0}  # (ACL and topic changes forwarded to their leader, in an Envelope: KIP-590)

#: the text of a ReplicationError for a code its answer carried without an error_message
ERROR_TEXT = {
    ErrorCode.not_leader_or_follower: "not the leader",
    ErrorCode.not_enough_replicas: "not enough in-sync replicas",
    ErrorCode.fenced_leader_epoch: "fenced leader epoch",
    ErrorCode.request_timed_out: "timed out waiting for a majority",
    ErrorCode.unknown_topic_or_partition: "unknown partition",
    ErrorCode.offset_out_of_range: "offset out of range",
    ErrorCode.invalid_request: "invalid request",
    ErrorCode.corrupt_message: "corrupt record batch",
    ErrorCode.message_too_large: "record batch too large",
    ErrorCode.invalid_record: "invalid record",
    ErrorCode.out_of_order_sequence_number: "out of order sequence number",
}


# ---------------------------------------------------------------------- errors
class ReplicationError(LogstoreError):
    """A replication request failed (the message says why; ``code`` is Kafka's error code, an int
    equal to a :class:`~logstore.errorcodes.ErrorCode` member)."""

    def __init__(self, message: str, code: int = ErrorCode.invalid_request, leader: int = NONE) -> None:
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


def _raise_for(code: int, leader: int, what: str, message: str | None = None) -> None:
    if code == ErrorCode.none:
        return
    text = f"{what}: {message or ERROR_TEXT.get(code, f'error {code}')}"
    if code == ErrorCode.not_leader_or_follower:
        raise NotLeaderError(text + (f" (leader: node {leader})" if leader != NONE else ""), code, leader)
    if code == ErrorCode.not_enough_replicas:
        raise NotEnoughReplicasError(text, code, leader)
    if code == ErrorCode.request_timed_out:
        raise ReplicationTimeoutError(text, code, leader)
    raise ReplicationError(text, code, leader)


def replica_password(secret: bytes) -> str:
    """The shared secret as :data:`REPLICA_USER`'s SASL password (it must be UTF-8 text)."""
    try:
        return secret.decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError("the shared secret must be UTF-8 text") from None


# ---------------------------------------------------------------------- connections
class NodeConnection:
    """One authenticated connection to a node's Kafka listener (request/response, one at a
    time), logged in as :data:`REPLICA_USER`.

    Thread-safety: not thread-safe; threads that share one take ``lock`` around
    :meth:`request`. Blocking: every call waits on the socket (its timeout bounds each wait).

    Raises (constructor): KafkaClientError: the node could not be reached or refused the login
    (its ``__cause__`` is the OSError, a ConnectionError when the node refused the connection).
    """

    def __init__(self, address: tuple[str, int], secret: bytes, node_id: int, timeout: float,
                 tls: ssl.SSLContext | None = None) -> None:
        security = Security("SASL_SSL" if tls is not None else "SASL_PLAINTEXT", REPLICA_MECHANISM, REPLICA_USER,
                            replica_password(secret))
        self.conn = Connection(str(address[0]), int(address[1]), timeout, f"logstore-node-{node_id}", security,
                                context=tls)
        #: one request at a time on this connection (several threads of a node share it)
        self.lock = threading.Lock()

    def request(self, api_key: int, fields: Mapping[str, Any], timeout: float | None = None) -> Any:
        """Send one request (at replication's version of the API) and return kio's answer.

        Raises:
            KafkaClientError: the connection failed or timed out, or a malformed answer.
        """
        return self.conn.request(api_key, fields, VERSIONS[api_key], timeout)

    def close(self) -> None:
        """Close the connection."""
        try:
            self.conn.close()
        except OSError:
            pass


def refused(exc: BaseException) -> bool:
    """Whether a failed request or connection means the node refused or dropped it (its
    process is most likely gone), not a timeout."""
    return isinstance(exc, ConnectionError) or isinstance(exc.__cause__, ConnectionError)


class PeerConnections:
    """A node's connections to the other voters: one per peer, made on first use, shared by the
    node's threads (one request at a time on each), dropped when a request on it fails.

    Thread-safety: thread-safe. Blocking: :meth:`request` waits for the peer's answer.
    """

    def __init__(self, peers: dict[int, tuple[str, int]], secret: bytes, node_id: int,
                 tls: ssl.SSLContext | None, stopping: threading.Event) -> None:
        self._peers = peers
        self._secret = secret
        self._node_id = node_id
        self._tls = tls
        self._stopping = stopping
        self._lock = threading.Lock()
        self._conns: dict[int, NodeConnection] = {}

    def request(self, peer: int, api_key: int, fields: Mapping[str, Any], timeout: float) -> Any:
        """One request to ``peer``; kio's answer. Waits at most ``timeout`` for the connection
        (another thread's request on it) too, so a request never waits without bound behind
        another.

        Raises:
            OSError, LogstoreError: the peer could not answer (the connection is dropped), the
            connection stayed busy for ``timeout`` (TimeoutError; kept), or the node is
            stopping (ConnectionError).
        """
        with self._lock:
            conn = self._conns.get(peer)
        if conn is None:
            # Connect and authenticate without holding the lock (a slow peer must not hold up
            # requests to the others); the first connection registered wins.
            fresh = NodeConnection(self._peers[peer], self._secret, self._node_id, timeout, self._tls)
            with self._lock:
                conn = self._conns.setdefault(peer, fresh)
                stopped = self._stopping.is_set()
            if conn is not fresh or stopped:
                fresh.close()
            if stopped:
                raise ConnectionError(f"node {self._node_id} is stopping")
        if not conn.lock.acquire(timeout=max(0.0, timeout)):
            raise TimeoutError(f"the connection to node {peer} stayed busy for {timeout:.1f}s")
        try:
            return conn.request(api_key, fields, timeout)
        except (OSError, LogstoreError):
            self.drop(peer)
            raise
        finally:
            conn.lock.release()

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
    """Produces to and reads from a replica set over Kafka's protocol, following its leader.

    Args:
        bootstrap: [(host, port)] of some nodes' listeners.
        secret: the shared secret (the client logs in as :data:`REPLICA_USER`).
        timeout: seconds for a connection or a request, and the default for produce/fetch.
        tls: TLS (required when the nodes use it; with a client certificate when they ask).
        compression_type: codec of produced batches ("gzip", "snappy", "lz4", "zstd"; None: none).

    Produces are idempotent as Kafka's producer makes them: each batch carries this client's
    producer id and a sequence number per partition, so a retry after a lost answer is
    recognised by the leader (also after a failover) instead of appended twice. After a
    produce that failed, whatever the error, the client takes a new producer id (a sequence
    number is never used for two batches): a new ``produce`` call is a new write.

    Thread-safety: one thread at a time (give each thread its own Client).
    """

    def __init__(self, bootstrap: Iterable[tuple[str, int]], secret: bytes, timeout: float = 10.0,
                 tls: TLSConfig | None = None, compression_type: str | None = None) -> None:
        self.bootstrap = [(str(h), int(p)) for h, p in bootstrap]
        if not self.bootstrap:
            raise ValueError("bootstrap needs at least one (host, port)")
        replica_password(secret)
        self.secret = secret
        self.timeout = timeout
        self._tls = tls.client_context() if tls is not None else None
        self._conns: dict[tuple[str, int], NodeConnection] = {}
        self._rng = random.SystemRandom()
        self.producer_id = self._rng.getrandbits(62)
        self._sequences: dict[tuple[str, int], int] = {}
        self._builder = BatchBuilder()
        #: node id -> address, learnt from Metadata answers
        self._nodes: dict[int, tuple[str, int]] = {}
        #: (topic, partition) -> the node last seen leading it
        self._leaders: dict[tuple[str, int], int] = {}
        self._codec = compression.codec_from_name(compression_type) if compression_type else compression.NONE

    def _conn(self, address: tuple[str, int]) -> NodeConnection:
        conn = self._conns.get(address)
        if conn is None:
            conn = self._conns[address] = NodeConnection(address, self.secret, NONE, self.timeout, self._tls)
        return conn

    def _call(self, address: tuple[str, int], api_key: int, fields: Mapping[str, Any], wait: float = 0.0) -> Any:
        """One request; a cached connection the node closed meanwhile (idle limit, restart) is
        replaced once. ``wait`` is how long the node may hold the request (an acks="all"
        produce): the socket waits that much longer. Raises OSError/LogstoreError when the
        node cannot answer."""
        reused = address in self._conns
        timeout = self.timeout + wait
        try:
            return self._conn(address).request(api_key, fields, timeout)
        except (OSError, LogstoreError) as exc:
            self._drop(address)
            if not reused or isinstance(exc.__cause__, TimeoutError):
                raise  # a timeout: the node may still be working on it, never send it twice here
        try:
            return self._conn(address).request(api_key, fields, timeout)
        except (OSError, LogstoreError):
            self._drop(address)
            raise

    def _drop(self, address: tuple[str, int]) -> None:
        conn = self._conns.pop(address, None)
        if conn is not None:
            conn.close()

    # ------------------------------------------------------------------ produce
    def produce(self, topic: str, partition: int, values: list[bytes | None], keys: list[bytes | None] | None = None,
                acks: int | str = "all", timeout: float | None = None) -> list[int]:
        """Append records on the leader; returns their offsets (none with acks=0, which waits
        for no answer). With acks="all" it returns once they are committed (held by a
        majority).

        Raises:
            NotEnoughReplicasError, ReplicationError: as the leader answers; NotLeaderError when no
            leader could be found before ``timeout``.
        """
        code = {0: 0, 1: 1, "all": -1, -1: -1}.get(acks)  # type: ignore[call-overload]
        if code is None:
            raise ValueError(f"acks must be 0, 1 or 'all', got {acks!r}")
        key = (topic, partition)
        timeout = timeout or self.timeout
        for attempt in range(2):
            sequence = self._sequences.get(key, 0)
            # One record batch, encoded here by the C encoder and stored by the leader as it
            # is (as Kafka's producer does); the producer id and sequence travel in its header.
            batch = self._builder.build(values, keys, producer_id=self.producer_id, producer_epoch=0,
                                        base_sequence=sequence, codec=self._codec)
            self._sequences[key] = (sequence + len(values)) % (1 << 31)
            fields = {"transactional_id": None, "acks": code, "timeout": int(timeout * 1000),
                      "topic_data": [{"name": topic, "partition_data": [{"index": partition, "records": batch}]}]}
            if code == 0:
                return self._produce_unanswered(key, fields)
            try:
                err, leader, entry = self._leader_request(key, PRODUCE, fields, timeout, f"produce to {topic}-{partition}",
                                                          _produce_entry, wait=timeout if code == -1 else 0.0)
            except BaseException:
                self._new_producer()  # the outcome is unknown: later batches must not depend on it
                raise
            if err == ErrorCode.out_of_order_sequence_number and attempt == 0:
                self._new_producer()  # not appended: an earlier batch was lost with a leader
                continue
            if err != ErrorCode.none:
                # Never reuse the sequence: an earlier send of this very batch (a lost answer,
                # then a resend) may be in the log even when this answer says it is not (the
                # leader checks the in-sync replicas before it recognises a duplicate).
                self._new_producer()
            _raise_for(err, leader, f"produce to {topic}-{partition}", entry.error_message)
            return list(range(entry.base_offset, entry.base_offset + len(values)))
        raise AssertionError("unreachable")

    def _new_producer(self) -> None:
        self.producer_id = self._rng.getrandbits(62)
        self._sequences.clear()

    def _produce_unanswered(self, key: tuple[str, int], fields: Mapping[str, Any]) -> list[int]:
        """acks=0: written to the leader's connection, no answer read."""
        address = self._candidates(key)[0]
        conn = self._conn(address)
        try:
            conn.conn.send_only(PRODUCE, fields, VERSIONS[PRODUCE])
        except (OSError, LogstoreError):
            self._drop(address)
            raise
        return []

    # ------------------------------------------------------------------ following the leader
    def _candidates(self, key: tuple[str, int]) -> list[tuple[str, int]]:
        """Addresses to try: the partition's last known leader first, then the bootstrap list."""
        leader = self._leaders.get(key)
        first = [self._nodes[leader]] if leader is not None and leader in self._nodes else []
        return first + [a for a in self.bootstrap if a not in first]

    def _follow(self, key: tuple[str, int], refused_by: tuple[str, int]) -> bool:
        """A node refused a request as not the leader: ask it who leads; True when that is a
        node at another address."""
        try:
            leaders = self._read_metadata(self._call(refused_by, METADATA, metadata_request([key[0]])))
        except (OSError, LogstoreError):
            return False
        leader = leaders.get(key, (NONE, -1))[0]
        if leader < 0:
            self._leaders.pop(key, None)
            return False
        self._leaders[key] = leader
        return self._nodes.get(leader, refused_by) != refused_by

    def _leader_request(self, key: tuple[str, int], api_key: int, fields: Mapping[str, Any], timeout: float,
                        what: str, entry_of: Callable[[Any], Any], wait: float = 0.0) -> tuple[int, int, Any]:
        """Send a request the partition's leader must answer, following "not the leader"
        answers, until a node accepts it or ``timeout`` passes. Returns (error code, leader id,
        the partition's entry in the answer)."""
        deadline = time.monotonic() + timeout
        last_error: Exception | None = None
        redirects = 0
        while time.monotonic() < deadline:
            redirected = False
            for address in self._candidates(key):
                try:
                    entry = entry_of(self._call(address, api_key, fields, wait))
                except (OSError, LogstoreError) as exc:
                    last_error = exc
                    continue
                err = int(entry.error_code)
                if err != ErrorCode.not_leader_or_follower:
                    leader = self._leaders.get(key, NONE)
                    if err == ErrorCode.none:
                        node = next((n for n, a in self._nodes.items() if a == address), None)
                        if node is not None:
                            self._leaders[key] = leader = node
                    return err, leader, entry
                last_error = NotLeaderError(f"node at {address[0]}:{address[1]} is not the leader", err)
                if redirects < 8 and self._follow(key, address):
                    redirects += 1
                    redirected = True
                    break  # straight to the leader it named
            if not redirected:
                time.sleep(0.05)
        raise NotLeaderError(f"{what}: no leader answered within the timeout ({last_error})",
                             ErrorCode.not_leader_or_follower, self._leaders.get(key, NONE))

    def _read_metadata(self, answer: Any) -> dict[tuple[str, int], tuple[int, int]]:
        """Learn the brokers' addresses; {(topic, partition): (leader, epoch)}."""
        for broker in answer.brokers:
            self._nodes[int(broker.node_id)] = (broker.host, int(broker.port))
        return {(t.name, int(p.partition_index)): (int(p.leader_id), int(p.leader_epoch))
                for t in answer.topics for p in t.partitions}

    # ------------------------------------------------------------------ fetch and metadata
    def fetch(self, topic: str, partition: int, offset: int, max_bytes: int = 1 << 20,
              timeout: float | None = None) -> Fetched:
        """Committed records of a partition from ``offset`` on (about ``max_bytes`` of batches,
        at least one when any is committed), from its leader. An empty answer means nothing is
        committed at or after ``offset`` yet (also between the high watermark and the log end);
        fetch again from ``next_offset``.

        Raises:
            OffsetOutOfRangeError: ``offset`` below the log start or above the leader's log end.
            NotLeaderError: no leader answered before ``timeout``.
            CorruptRecordError: a batch failed its CRC on arrival.
        """
        if max_bytes <= 0:
            raise ValueError(f"max_bytes must be > 0, got {max_bytes}")
        fields = {"replica_id": -1, "max_wait": 0, "min_bytes": 0, "max_bytes": max_bytes, "isolation_level": 0,
                  "session_id": 0, "session_epoch": -1, "rack_id": "", "forgotten_topics_data": [],
                  "topics": [{"topic": topic, "partitions": [
                      {"partition": partition, "current_leader_epoch": -1, "fetch_offset": offset,
                       "last_fetched_epoch": -1, "log_start_offset": -1, "partition_max_bytes": max_bytes}]}]}
        what = f"fetch from {topic}-{partition}"
        err, leader, entry = self._leader_request((topic, partition), FETCH, fields, timeout or self.timeout, what,
                                                  _fetch_entry)
        if err == ErrorCode.offset_out_of_range:
            start, end = self._bounds(topic, partition)
            raise OffsetOutOfRangeError(offset, start, end, what)
        _raise_for(err, leader, what)
        data = bytes(entry.records or b"")
        return Fetched(decode_batches(data, offset), end_offset_of(data, offset), int(entry.high_watermark))

    def _bounds(self, topic: str, partition: int) -> tuple[int, int]:
        """(log start, high watermark) of a partition, from its leader (ListOffsets)."""
        out = []
        for timestamp in (-2, -1):
            fields = {"replica_id": -1, "isolation_level": 0, "topics": [
                {"name": topic, "partitions": [{"partition_index": partition, "current_leader_epoch": -1,
                                                "timestamp": timestamp}]}]}
            err, leader, entry = self._leader_request((topic, partition), LIST_OFFSETS, fields, self.timeout,
                                                      f"offsets of {topic}-{partition}", _list_offsets_entry)
            _raise_for(err, leader, f"offsets of {topic}-{partition}")
            out.append(int(entry.offset))
        return out[0], out[1]

    def metadata(self) -> dict[tuple[str, int], tuple[int, int, int]]:
        """{(topic, partition): (leader, epoch, high watermark)} as the first reachable node
        knows them (Metadata, then DescribeQuorum: each node answers with its own view)."""
        for address in self.bootstrap:
            try:
                leaders = self._read_metadata(self._call(address, METADATA, metadata_request(None)))
                topics: dict[str, list[int]] = {}
                for t, p in sorted(leaders):
                    topics.setdefault(t, []).append(p)
                quorum = self._call(address, DESCRIBE_QUORUM, {"topics": [
                    {"topic_name": t, "partitions": [{"partition_index": p} for p in ps]} for t, ps in topics.items()]})
            except (OSError, LogstoreError):
                continue
            return {(t.topic_name, int(p.partition_index)): (int(p.leader_id), int(p.leader_epoch),
                                                             int(p.high_watermark))
                    for t in quorum.topics for p in t.partitions}
        raise ReplicationError("no node reachable")

    def close(self) -> None:
        """Close every connection."""
        for address in list(self._conns):
            self._drop(address)


def metadata_request(topics: list[str] | None) -> dict[str, Any]:
    """A Metadata request's fields for ``topics`` (None: every topic), creating none."""
    return {"topics": None if topics is None else [{"name": t} for t in topics], "allow_auto_topic_creation": False,
            "include_cluster_authorized_operations": False, "include_topic_authorized_operations": False}


def _only(answer: Any, topics: str, partitions: str) -> Any:
    """The one partition entry of a one-partition answer."""
    return getattr(getattr(answer, topics)[0], partitions)[0]


def _produce_entry(answer: Any) -> Any:
    return _only(answer, "responses", "partition_responses")


def _fetch_entry(answer: Any) -> Any:
    if answer.error_code:
        raise ReplicationError(f"fetch refused: error {int(answer.error_code)}", int(answer.error_code))
    return _only(answer, "responses", "partitions")


def _list_offsets_entry(answer: Any) -> Any:
    return _only(answer, "topics", "partitions")

