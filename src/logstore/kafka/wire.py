"""Kafka's wire protocol: request headers, the versions served, and the message codec (kio).

Every request and response is as Kafka's JSON message specs define it; the classes come from
`kio <https://pypi.org/project/kio/>`_, which is generated from those specs (one dataclass per
message and version, e.g. ``kio.schema.metadata.v1.response.MetadataResponse``). This module
adds what a server needs around it:

- :data:`SUPPORTED`, the version range of every API the server answers (what ApiVersions
  advertises), and :func:`parse_request`, which reads a frame's request header and body and
  refuses what is outside those ranges (or others a caller gives it: a server may serve more
  APIs, e.g. Vote, BeginQuorumEpoch or Fetch v12, between its brokers), malformed, or followed
  by stray bytes. A flexible version's request header is v2 (client id, then tagged fields).
- :func:`encode`, a response as the buffers of one frame (size, response header, body), from a
  mapping of fields named as in the latest version: a field the version does not have is left
  out, a field it needs and the mapping lacks is an error. The header is v0, or v1 for a
  flexible version (except ApiVersions', always v0). The bytes are written by
  :mod:`logstore.kafka.writer` (kio's classes give the schema; kio's own writer is the tests'
  oracle).
- A large Produce request's body is read by :func:`parse_produce_body` (here, not by kio):
  the same kio classes, with each partition's records a view of the frame instead of kio's
  copy (a request of 1 MB copied once more cost the server an eighth of its CPU on the
  producer benchmark), writable when the frame is (the Produce handler has the log stamp the
  batch's offsets into the frame itself: ``Log.append_idempotent(in_place=True)``; nothing
  else writes into a request). The frame's buffer must then outlive the request's handling
  (the network layer reuses it only once nothing references it).
- Produce v0-v2 (magic v0/v1 message sets), which Kafka 4 dropped but still advertises
  because librdkafka before 2.11.1 compresses only when Produce's minimum version is 0: in the
  ranges, but a request of one of them is refused as an unsupported version, which closes its
  connection without an answer, as Kafka 4 does (SocketServer.parseRequestHeader).

Thread-safety: every function may be called from any thread (the caches are filled
idempotently).
"""

from __future__ import annotations

import datetime
import struct
import sys
from typing import Any, Mapping

from kio.index import KioIndexError, load_request_schema, load_response_schema
from kio.serial import entity_reader
from kio.serial.errors import SerialError

from ..errors import LogstoreError
from .apikeys import METADATA, PRODUCE
from .bounds import check_flexible, check_flexible_header, read_uvarint
from .writer import write_response

__all__ = ["SUPPORTED", "API_NAMES", "KafkaRequest", "KafkaProtocolError", "UnsupportedVersionError",
           "parse_request", "parse_produce_body", "PRODUCE_VIEW_BYTES", "response_class", "encode", "fetch_replica_id"]

#: api key -> (lowest, highest) version served, flexible ones included (each checked by
#: :mod:`~logstore.kafka.bounds` before kio reads it). (:func:`parse_request` takes other ranges
#: from a caller that serves more.)
SUPPORTED: dict[int, tuple[int, int]] = {
    0: (0, 11),   # Produce (v0-v2 advertised, refused: see _REFUSED_PRODUCE; v9+ flexible)
    1: (4, 16),   # Fetch (v12+ flexible; v13+ topics by id; v15 replica state; v16 node endpoints)
    2: (1, 8),    # ListOffsets (v6+ flexible; v7 -3 MAX_TIMESTAMP, v8 -4 EARLIEST_LOCAL)
    3: (0, 12),   # Metadata (v9+ flexible; v10+ topic ids; v12 look-up by id)
    8: (2, 9),    # OffsetCommit (v8+ flexible; v9 KIP-848's generation id or member epoch)
    9: (1, 9),    # OffsetFetch (v6+ flexible; v8+ several groups, KIP-709)
    10: (0, 4),   # FindCoordinator (v3+ flexible; v4 batched keys, KIP-699)
    11: (0, 9),   # JoinGroup (v6+ flexible)
    12: (0, 4),   # Heartbeat (v4 flexible)
    13: (0, 5),   # LeaveGroup (v4+ flexible)
    14: (0, 5),   # SyncGroup (v4+ flexible)
    15: (0, 6),   # DescribeGroups (v5+ flexible)
    16: (0, 5),   # ListGroups (v3+ flexible; v4 state filter, v5 type filter)
    17: (0, 1),   # SaslHandshake (answered by kafka.auth before authentication and to re-authenticate)
    18: (0, 4),   # ApiVersions (v3+ flexible, the client's software name and version)
    19: (2, 7),   # CreateTopics (v5+ flexible, the topic's settings; v7 its id)
    20: (1, 6),   # DeleteTopics (v4+ flexible; v6 topics by name or id)
    21: (0, 2),   # DeleteRecords (v2 flexible)
    22: (0, 4),   # InitProducerId (v2+ flexible; v3+ KIP-360's epoch bump)
    23: (2, 4),   # OffsetForLeaderEpoch (v4 flexible; a consumer's KIP-320 check after a leader change)
    24: (0, 3),   # AddPartitionsToTxn (v3 flexible; v4 batches transactions between brokers)
    25: (0, 3),   # AddOffsetsToTxn (v3 flexible)
    26: (0, 4),   # EndTxn (v3+ flexible; v5 is KIP-890's transaction version 2)
    28: (0, 3),   # TxnOffsetCommit (v3 flexible: the group's generation and member)
    29: (1, 3),   # DescribeAcls (v1+: pattern types; v2+ flexible)
    30: (1, 3),   # CreateAcls
    31: (1, 3),   # DeleteAcls
    32: (1, 3),   # DescribeConfigs
    33: (0, 2),   # AlterConfigs (v2 flexible)
    35: (1, 4),   # DescribeLogDirs (v2+ flexible; v4 total and usable bytes)
    36: (0, 1),   # SaslAuthenticate (answered by kafka.auth before authentication and to re-authenticate)
    37: (0, 3),   # CreatePartitions (v2+ flexible)
    42: (0, 2),   # DeleteGroups (v2 flexible)
    43: (0, 2),   # ElectLeaders (v1 election type, v2 flexible)
    44: (0, 1),   # IncrementalAlterConfigs (v1 flexible)
    47: (0, 0),   # OffsetDelete
    50: (0, 0),   # DescribeUserScramCredentials (flexible)
    51: (0, 0),   # AlterUserScramCredentials (flexible)
    60: (0, 2),   # DescribeCluster (flexible)
    61: (0, 0),   # DescribeProducers (flexible)
    65: (0, 0),   # DescribeTransactions (flexible)
    66: (0, 1),   # ListTransactions (flexible)
    68: (0, 1),   # ConsumerGroupHeartbeat (KIP-848; not advertised when only classic groups are served)
    69: (0, 1),   # ConsumerGroupDescribe (KIP-848)
    75: (0, 0),   # DescribeTopicPartitions (flexible; KIP-966)
}

API_NAMES = {0: "Produce", 1: "Fetch", 2: "ListOffsets", 3: "Metadata", 8: "OffsetCommit", 9: "OffsetFetch",
             10: "FindCoordinator", 11: "JoinGroup", 12: "Heartbeat", 13: "LeaveGroup", 14: "SyncGroup",
             15: "DescribeGroups", 16: "ListGroups", 17: "SaslHandshake", 18: "ApiVersions", 19: "CreateTopics",
             20: "DeleteTopics", 21: "DeleteRecords", 22: "InitProducerId", 23: "OffsetForLeaderEpoch",
             24: "AddPartitionsToTxn", 25: "AddOffsetsToTxn", 26: "EndTxn", 27: "WriteTxnMarkers",
             28: "TxnOffsetCommit", 29: "DescribeAcls", 30: "CreateAcls", 31: "DeleteAcls", 32: "DescribeConfigs",
             33: "AlterConfigs", 35: "DescribeLogDirs", 36: "SaslAuthenticate", 37: "CreatePartitions",
             42: "DeleteGroups", 43: "ElectLeaders", 44: "IncrementalAlterConfigs", 47: "OffsetDelete",
             50: "DescribeUserScramCredentials", 51: "AlterUserScramCredentials", 52: "Vote", 53: "BeginQuorumEpoch",
             54: "EndQuorumEpoch", 55: "DescribeQuorum", 58: "Envelope", 60: "DescribeCluster", 61: "DescribeProducers",
             65: "DescribeTransactions", 66: "ListTransactions", 68: "ConsumerGroupHeartbeat",
             69: "ConsumerGroupDescribe", 75: "DescribeTopicPartitions"}

_HEADER = struct.Struct(">hhi")  # api key, api version, correlation id
#: A Produce request of at least this many bytes is read by :func:`parse_produce_body` (its
#: records views of the frame); a smaller one by kio (its Rust reader is quicker than the walk
#: in Python, and copying a few kB costs less than the walk).
PRODUCE_VIEW_BYTES = 32 * 1024
#: The first flexible Produce version, and the last one parse_produce_body reads (v12 adds
#: nothing to the request, v13 names topics by id: neither is served).
_PRODUCE_FLEXIBLE, _PRODUCE_VIEW_MAX = 9, 11
_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_ACKS_TIMEOUT = struct.Struct(">hi")
#: Produce versions advertised but refused (closing the connection), as Kafka 4 does.
_REFUSED_PRODUCE = range(0, 3)
#: APIs whose requests librdkafka (2.x) ends with a second empty tagged-field section, one 0
#: byte after the request: Kafka reads no further than the request and never sees it.
_ONE_STRAY_ZERO = frozenset({51})  # AlterUserScramCredentials


class KafkaProtocolError(LogstoreError):
    """A request that breaks Kafka's protocol: truncated, malformed, stray bytes after it. The
    server closes the connection it came on (as Kafka does)."""


class UnsupportedVersionError(KafkaProtocolError):
    """An API key or version outside :data:`SUPPORTED` (or the ranges given to
    :func:`parse_request`). An ApiVersions request gets an answer
    (error 35 with the ranges, so the client can retry with one it shares); any other request
    closes its connection."""

    def __init__(self, api_key: int, api_version: int, correlation_id: int) -> None:
        name = API_NAMES.get(api_key, f"api key {api_key}")
        super().__init__(f"{name} v{api_version} is not supported")
        self.api_key = api_key
        self.api_version = api_version
        self.correlation_id = correlation_id


class KafkaRequest:
    """One parsed request: header fields and the kio body. Immutable by convention."""

    __slots__ = ("api_key", "api_version", "correlation_id", "client_id", "body", "client_host", "principal",
                 "on_loop")

    def __init__(self, api_key: int, api_version: int, correlation_id: int, client_id: str | None,
                 body: Any) -> None:
        self.api_key = api_key
        self.api_version = api_version
        self.correlation_id = correlation_id
        self.client_id = client_id
        self.body = body
        #: the client's address as Kafka shows it ("/127.0.0.1"); set by the server
        self.client_host = ""
        #: who the connection authenticated as (``User:<name>`` after SASL), None if no one; set by the server
        self.principal: Any = None
        #: handled on the server's network loop, where the handler must not wait (it may answer
        #: with a ``net.Offload`` instead); set by the server
        self.on_loop = False

    @property
    def name(self) -> str:
        """The API's name (``Produce``, ``Fetch`` ...)."""
        return API_NAMES.get(self.api_key, str(self.api_key))

    def __repr__(self) -> str:
        return f"KafkaRequest({self.name} v{self.api_version}, id={self.correlation_id}, client={self.client_id!r})"


def fetch_replica_id(request: KafkaRequest) -> int:
    """A Fetch's replica id (a follower's node id; -1 for a consumer): in ``replica_id`` up to
    v14, in ``replica_state.replica_id`` from v15 (KIP-903). Pure."""
    body = request.body
    if request.api_version >= 15:
        return body.replica_state.replica_id  # type: ignore[no-any-return]
    return getattr(body, "replica_id", -1)  # type: ignore[no-any-return]


_READERS: dict[tuple[int, int], tuple[Any, Any]] = {}
#: (api key, version) -> its kio class when the version is flexible, else None
_FLEXIBLE: dict[tuple[int, int], Any] = {}


def _readers(api_key: int, api_version: int) -> tuple[Any, Any]:
    """kio's readers of a request version's header and body (looked up once)."""
    readers = _READERS.get((api_key, api_version))
    if readers is None:
        cls = load_request_schema(api_key, api_version)
        _FLEXIBLE[(api_key, api_version)] = cls if getattr(cls, "__flexible__", False) else None
        readers = _READERS[(api_key, api_version)] = (entity_reader(cls.__header_schema__), entity_reader(cls))
    return readers


def parse_request(frame: bytes | bytearray | memoryview,
                  supported: Mapping[int, tuple[int, int]] | None = None) -> KafkaRequest:
    """Read one request (the frame after its 4-byte size), of an API and version in
    ``supported`` (api key -> lowest and highest version; :data:`SUPPORTED` if None). Request
    header v1, or v2 for a flexible version. kio reads only the tagged fields its classes know:
    a request with another is refused as malformed (Kafka would skip it).

    Raises:
        UnsupportedVersionError: an API or version outside ``supported`` (or a refused Produce).
        KafkaProtocolError: a truncated or malformed request, or bytes after its end.
    """
    data: Any = memoryview(frame).toreadonly()  # kio reads read-only buffers (no copy of a produce's batches)
    if len(data) < _HEADER.size:
        raise KafkaProtocolError(f"a request of {len(data)} bytes is shorter than its header")
    api_key, api_version, correlation_id = _HEADER.unpack_from(data, 0)
    served = (SUPPORTED if supported is None else supported).get(api_key)
    if served is None or not served[0] <= api_version <= served[1] or (
            api_key == PRODUCE and api_version in _REFUSED_PRODUCE):
        raise UnsupportedVersionError(api_key, api_version, correlation_id)
    try:
        read_header, read_body = _readers(api_key, api_version)
        flexible = _FLEXIBLE[(api_key, api_version)]
        if flexible is not None:  # kio's native reader trusts compact counts: check them first
            check_flexible_header(data)
        header, offset = read_header(data, 0)
        if api_key == PRODUCE and len(data) >= PRODUCE_VIEW_BYTES and api_version <= _PRODUCE_VIEW_MAX:
            body, size = parse_produce_body(memoryview(frame), offset, api_version)
        else:
            if flexible is not None:
                check_flexible(flexible, data, offset)
            body, size = read_body(data, offset)
            if api_key == PRODUCE and (body.topic_data is None or
                                       any(topic.partition_data is None for topic in body.topic_data)):
                raise ValueError("a null array where none may be")  # (kio reads it as None)
    except (KioIndexError, SerialError, ValueError, struct.error, KeyError) as exc:  # KeyError: an unknown tag
        raise KafkaProtocolError(f"{API_NAMES.get(api_key, api_key)} v{api_version}: malformed request: "
                                 f"{exc}") from None
    if offset + size != len(data) and not (api_key in _ONE_STRAY_ZERO and offset + size + 1 == len(data)
                                           and data[-1] == 0) \
            and not _librdkafka_all_topics(api_key, api_version, body, len(data) - offset - size):
        raise KafkaProtocolError(f"{API_NAMES.get(api_key, api_key)} v{api_version}: "
                                 f"{len(data) - offset - size} bytes after the request")
    return KafkaRequest(api_key, api_version, correlation_id, header.client_id, body)


def parse_produce_body(data: memoryview, offset: int, api_version: int) -> tuple[Any, int]:
    """A Produce request's body (v3-v11) at ``data[offset:]``, read as kio reads it (kio's
    ProduceRequest, TopicProduceData and PartitionProduceData), but with each partition's
    records a slice of ``data`` (no copy, writable if ``data`` is): (the body, its size in
    bytes). Every count and length is checked
    against the bytes left before it is used; a tagged field is refused as kio refuses the
    ones its classes do not know (Produce's have none). Bytes after the body are the caller's
    to refuse.

    Raises:
        ValueError: a truncated or malformed body (a count or length past the end, a null
            where none may be, a topic name that is not UTF-8, a tagged field).
    """
    if not 3 <= api_version <= _PRODUCE_VIEW_MAX:
        raise ValueError(f"Produce v{api_version} is not read here")
    request_class, topic_class, partition_class = _produce_classes(api_version)
    end = len(data)
    pos = offset
    if api_version >= _PRODUCE_FLEXIBLE:
        n, pos = read_uvarint(data, pos, end)  # compact nullable string: length + 1, 0 for null
        transactional_id, pos = (None, pos) if n == 0 else _text(data, pos, n - 1, end)
        acks, timeout = _fixed(_ACKS_TIMEOUT, data, pos, end)
        pos += _ACKS_TIMEOUT.size
        topics_left, pos = _compact_count(data, pos, end, "topic_data")
        topics = []
        for _ in range(topics_left):
            n, pos = read_uvarint(data, pos, end)
            if n == 0:
                raise ValueError("a null topic name")
            name, pos = _text(data, pos, n - 1, end)
            partitions_left, pos = _compact_count(data, pos, end, "partition_data")
            partitions = []
            for _ in range(partitions_left):
                (index,) = _fixed(_I32, data, pos, end)
                n, pos = read_uvarint(data, pos + 4, end)
                records = None
                if n:
                    if n - 1 > end - pos:
                        raise ValueError(f"records of {n - 1} bytes in {end - pos}")
                    records, pos = data[pos:pos + n - 1], pos + n - 1
                pos = _no_tags(data, pos, end)
                partitions.append(partition_class(index=index, records=records))
            pos = _no_tags(data, pos, end)
            topics.append(topic_class(name=name, partition_data=tuple(partitions)))
        pos = _no_tags(data, pos, end)
    else:
        (n,) = _fixed(_I16, data, pos, end)
        transactional_id, pos = (None, pos + 2) if n == -1 else _text(data, pos + 2, n, end)
        acks, timeout = _fixed(_ACKS_TIMEOUT, data, pos, end)
        pos += _ACKS_TIMEOUT.size
        topics_left, pos = _legacy_count(data, pos, end, "topic_data")
        topics = []
        for _ in range(topics_left):
            (n,) = _fixed(_I16, data, pos, end)
            name, pos = _text(data, pos + 2, n, end)
            partitions_left, pos = _legacy_count(data, pos, end, "partition_data")
            partitions = []
            for _ in range(partitions_left):
                index, n = _fixed(_I32_I32, data, pos, end)
                pos += _I32_I32.size
                records = None
                if n != -1:
                    if not 0 <= n <= end - pos:
                        raise ValueError(f"records of {n} bytes in {end - pos}")
                    records, pos = data[pos:pos + n], pos + n
                partitions.append(partition_class(index=index, records=records))
            topics.append(topic_class(name=name, partition_data=tuple(partitions)))
    body = request_class(transactional_id=transactional_id, acks=acks,
                          timeout=datetime.timedelta(milliseconds=timeout), topic_data=tuple(topics))
    return body, pos - offset


_I32_I32 = struct.Struct(">ii")
_PRODUCE_CLASSES: dict[int, tuple[Any, Any, Any]] = {}


def _produce_classes(api_version: int) -> tuple[Any, Any, Any]:
    """kio's ProduceRequest of a version, with its TopicProduceData and PartitionProduceData."""
    classes = _PRODUCE_CLASSES.get(api_version)
    if classes is None:
        request_class = load_request_schema(PRODUCE, api_version)
        module = sys.modules[request_class.__module__]
        classes = _PRODUCE_CLASSES[api_version] = (request_class, module.TopicProduceData,
                                                   module.PartitionProduceData)
    return classes


def _fixed(shape: struct.Struct, data: memoryview, pos: int, end: int) -> tuple[Any, ...]:
    if pos + shape.size > end:
        raise ValueError("the request ends inside a field")
    return shape.unpack_from(data, pos)


def _text(data: memoryview, pos: int, n: int, end: int) -> tuple[str, int]:
    """``n`` bytes of UTF-8 at ``pos`` (a string's bytes; a negative length other than a
    nullable string's -1, already taken, is malformed)."""
    if not 0 <= n <= end - pos:
        raise ValueError(f"a string of {n} bytes in {end - pos}")
    return str(data[pos:pos + n], "utf-8"), pos + n


def _compact_count(data: memoryview, pos: int, end: int, what: str) -> tuple[int, int]:
    """A compact array's item count (not null; each item takes a byte at least)."""
    n, pos = read_uvarint(data, pos, end)
    if n == 0:
        raise ValueError(f"a null {what} array")
    if n - 1 > end - pos:
        raise ValueError(f"an array of {n - 1} items in {end - pos} bytes")
    return n - 1, pos


def _legacy_count(data: memoryview, pos: int, end: int, what: str) -> tuple[int, int]:
    """A legacy array's item count (not null; each item takes a byte at least)."""
    (n,) = _fixed(_I32, data, pos, end)
    if not 0 <= n <= end - pos - 4:
        raise ValueError(f"an array of {n} items in {end - pos - 4} bytes" if n >= 0 else f"a null {what} array")
    return n, pos + 4


def _no_tags(data: memoryview, pos: int, end: int) -> int:
    """An empty tagged-field section (Produce's structures have no tagged field kio knows)."""
    n, pos = read_uvarint(data, pos, end)
    if n:
        raise ValueError(f"{n} tagged fields where Produce has none")
    return pos


def _librdkafka_all_topics(api_key: int, api_version: int, body: Any, after: int) -> bool:
    """Whether bytes after a request are librdkafka's all-topics Metadata v9+ request, let
    through as Kafka lets them (Kafka never checks for bytes after a request's end).

    librdkafka (2.0 to 2.16 at least, rd_kafka_MetadataRequest0) writes the topic array's
    count as a four-byte placeholder and, for "every topic" in a flexible version, leaves it
    there: four zero bytes where a compact array's null is one. Kafka reads the first zero as
    the null array, the next two as the request's booleans (false) and the third as an empty
    tagged-field section, and ignores the three bytes after. kio reads it the same way; only
    this request, with that null array and those three bytes, may carry bytes after its end."""
    return api_key == METADATA and api_version >= 9 and body.topics is None and after == 3


# ---------------------------------------------------------------------- writing responses
_RESPONSE_CLASSES: dict[tuple[int, int], type] = {}


def response_class(api_key: int, api_version: int) -> type:
    """The kio response class of an API version."""
    cls = _RESPONSE_CLASSES.get((api_key, api_version))
    if cls is None:
        cls = _RESPONSE_CLASSES[(api_key, api_version)] = load_response_schema(api_key, api_version)
    return cls


def encode(correlation_id: int, api_key: int, api_version: int, fields: Mapping[str, Any]) -> list[Any]:
    """A response frame (size, response header, body) as buffers to write in order, from the
    response's fields named as in the latest version (see :mod:`logstore.kafka.writer`); a
    :class:`~logstore._fileio.FileRegion` given as a field's bytes stays a buffer of its own.
    The header is v0, or v1 (an empty tagged-field section after the correlation id) for a
    flexible version of any API but ApiVersions.

    Raises:
        KeyError: a field the version needs is missing from ``fields``.
    """
    return write_response(correlation_id, response_class(api_key, api_version), fields)
