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
- Produce v0-v2 (magic v0/v1 message sets), which Kafka 4 dropped but still advertises
  because librdkafka before 2.11.1 compresses only when Produce's minimum version is 0: in the
  ranges, but a request of one of them is refused as an unsupported version, which closes its
  connection without an answer, as Kafka 4 does (SocketServer.parseRequestHeader).

Thread-safety: every function may be called from any thread (the caches are filled
idempotently).
"""

from __future__ import annotations

import struct
from typing import Any, Mapping

from kio.index import KioIndexError, load_request_schema, load_response_schema
from kio.serial import entity_reader
from kio.serial.errors import SerialError

from ..errors import LogstoreError
from .apikeys import METADATA, PRODUCE
from .bounds import check_flexible, check_flexible_header
from .writer import write_response

__all__ = ["SUPPORTED", "API_NAMES", "KafkaRequest", "KafkaProtocolError", "UnsupportedVersionError",
           "parse_request", "response_class", "encode"]

#: api key -> (lowest, highest) version served. Non-flexible versions, which every client this
#: server is tested with speaks (aiokafka speaks nothing else), but for the transaction APIs,
#: whose newer versions carry what the clients need (KIP-360's epoch bump). (:func:`parse_request`
#: takes other ranges from a caller that serves more.)
SUPPORTED: dict[int, tuple[int, int]] = {
    0: (0, 11),   # Produce (v0-v2 advertised, refused: see _REFUSED_PRODUCE; v9+ flexible)
    1: (4, 11),   # Fetch
    2: (1, 5),    # ListOffsets
    3: (0, 12),   # Metadata (v9+ flexible, v10+ topic ids)
    8: (2, 9),    # OffsetCommit (v8+ flexible; v9: a consumer group's member epoch, KIP-848)
    9: (1, 5),    # OffsetFetch
    10: (0, 2),   # FindCoordinator
    11: (0, 5),   # JoinGroup
    12: (0, 3),   # Heartbeat
    13: (0, 3),   # LeaveGroup
    14: (0, 3),   # SyncGroup
    15: (0, 4),   # DescribeGroups
    16: (0, 2),   # ListGroups
    17: (0, 1),   # SaslHandshake (answered by kafkaauth before authentication)
    18: (0, 2),   # ApiVersions
    19: (2, 4),   # CreateTopics
    20: (1, 3),   # DeleteTopics
    22: (0, 4),   # InitProducerId (v2+ flexible; v3+ KIP-360's epoch bump)
    23: (2, 4),   # OffsetForLeaderEpoch (v4 flexible; KIP-320: clients that trust Metadata v9+'s leader epochs)
    24: (0, 3),   # AddPartitionsToTxn (v3 flexible; v4 batches transactions between brokers)
    25: (0, 3),   # AddOffsetsToTxn (v3 flexible)
    26: (0, 4),   # EndTxn (v3+ flexible; v5 is KIP-890's transaction version 2)
    28: (0, 3),   # TxnOffsetCommit (v3 flexible: the group's generation and member)
    32: (1, 3),   # DescribeConfigs
    36: (0, 1),   # SaslAuthenticate (answered by kafkaauth before authentication)
    61: (0, 0),   # DescribeProducers (flexible)
    65: (0, 0),   # DescribeTransactions (flexible)
    66: (0, 1),   # ListTransactions (flexible)
    68: (0, 1),   # ConsumerGroupHeartbeat (KIP-848; not advertised when only classic groups are served)
    69: (0, 1),   # ConsumerGroupDescribe (KIP-848)
}

API_NAMES = {0: "Produce", 1: "Fetch", 2: "ListOffsets", 3: "Metadata", 8: "OffsetCommit", 9: "OffsetFetch",
             10: "FindCoordinator", 11: "JoinGroup", 12: "Heartbeat", 13: "LeaveGroup", 14: "SyncGroup",
             15: "DescribeGroups", 16: "ListGroups",
             17: "SaslHandshake", 18: "ApiVersions", 19: "CreateTopics", 20: "DeleteTopics", 22: "InitProducerId",
             23: "OffsetForLeaderEpoch", 24: "AddPartitionsToTxn", 25: "AddOffsetsToTxn", 26: "EndTxn",
             27: "WriteTxnMarkers",
             28: "TxnOffsetCommit", 32: "DescribeConfigs", 36: "SaslAuthenticate", 61: "DescribeProducers",
             65: "DescribeTransactions", 66: "ListTransactions", 68: "ConsumerGroupHeartbeat",
             69: "ConsumerGroupDescribe",
             52: "Vote", 53: "BeginQuorumEpoch", 54: "EndQuorumEpoch", 55: "DescribeQuorum"}

_HEADER = struct.Struct(">hhi")  # api key, api version, correlation id
#: Produce versions advertised but refused (closing the connection), as Kafka 4 does.
_REFUSED_PRODUCE = range(0, 3)


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

    __slots__ = ("api_key", "api_version", "correlation_id", "client_id", "body", "client_host", "principal")

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

    @property
    def name(self) -> str:
        """The API's name (``Produce``, ``Fetch`` ...)."""
        return API_NAMES.get(self.api_key, str(self.api_key))

    def __repr__(self) -> str:
        return f"KafkaRequest({self.name} v{self.api_version}, id={self.correlation_id}, client={self.client_id!r})"


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
        if flexible is not None:
            check_flexible(flexible, data, offset)
        body, size = read_body(data, offset)
    except (KioIndexError, SerialError, ValueError, struct.error, KeyError) as exc:  # KeyError: an unknown tag
        raise KafkaProtocolError(f"{API_NAMES.get(api_key, api_key)} v{api_version}: malformed request: "
                                 f"{exc}") from None
    if offset + size != len(data) and not _brokers_only_metadata(api_key, api_version, data, offset, size):
        raise KafkaProtocolError(f"{API_NAMES.get(api_key, api_key)} v{api_version}: "
                                 f"{len(data) - offset - size} bytes after the request")
    return KafkaRequest(api_key, api_version, correlation_id, header.client_id, body)


def _brokers_only_metadata(api_key: int, api_version: int, data: Any, offset: int, size: int) -> bool:
    """Whether the bytes after a request are librdkafka's "brokers only" Metadata v11+: its
    topic count is written as a 4-byte zero where the flexible version has a one-byte compact
    count, which reads as a null array (every topic) followed by the request's last 3 bytes
    again. Kafka's readers ignore what follows a request, so Kafka answers it with every
    topic; so does this server, for this one shape (any other stray bytes are refused)."""
    return (api_key == METADATA and api_version >= 11 and len(data) - offset - size == 3
            and bytes(data[offset:offset + 4]) == b"\0\0\0\0")


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
