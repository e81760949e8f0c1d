"""Kafka's consumer group records (KIP-848) in ``__consumer_offsets``: keys, values, their codec.

A consumer group (the protocol of ConsumerGroupHeartbeat) is kept as Kafka's group coordinator
keeps it, one record per fact, each key naming the group (and the member), so that compaction
keeps the last word on every fact and a tombstone deletes it:

==============================================  ===========  ========================================
record (key version)                            key          value (version 0, flexible)
==============================================  ===========  ========================================
ConsumerGroupMetadata (3)                       group        the group epoch
ConsumerGroupPartitionMetadata (4)              group        the subscribed topics: id, name, count
ConsumerGroupMemberMetadata (5)                 group, member  instance, rack, client, subscription,
                                                             rebalance timeout, server assignor
ConsumerGroupTargetAssignmentMetadata (6)       group        the target assignment epoch
ConsumerGroupTargetAssignmentMember (7)         group, member  the member's target partitions
ConsumerGroupCurrentMemberAssignment (8)        group, member  epoch, previous epoch, state,
                                                             assigned and pending-revocation partitions
==============================================  ===========  ========================================

Keys are Kafka's non-flexible encoding (``int16 version`` then ``int16``-length strings); values
are ``int16 version`` then the flexible encoding of Kafka's JSON specs (compact strings and
arrays, UUIDs as 16 bytes, a tagged-field section). A member that speaks the classic protocol
(JoinGroup, SyncGroup, Heartbeat) inside a consumer group keeps, as Kafka's, its session
timeout and supported protocols in the member metadata's tagged field 0
(``ClassicMemberMetadata``); other tagged fields are skipped.

Thread-safety: pure functions over immutable values.
"""

from __future__ import annotations

import struct
import uuid
from typing import Any, NamedTuple

from ..errors import CorruptRecordError
from .assignors import Assignment
from ..records.control import uvarint

__all__ = ["GROUP_METADATA", "PARTITION_METADATA", "MEMBER_METADATA", "TARGET_METADATA", "TARGET_MEMBER",
           "CURRENT_ASSIGNMENT", "CONSUMER_KEY_VERSIONS", "ClassicMemberMetadata", "MemberMetadata", "CurrentAssignment",
           "encode_key", "decode_key", "encode_value", "decode_value"]

GROUP_METADATA = 3
PARTITION_METADATA = 4
MEMBER_METADATA = 5
TARGET_METADATA = 6
TARGET_MEMBER = 7
CURRENT_ASSIGNMENT = 8
#: the key versions of Kafka's consumer group records
CONSUMER_KEY_VERSIONS = frozenset(range(GROUP_METADATA, CURRENT_ASSIGNMENT + 1))
_WITH_MEMBER = frozenset({MEMBER_METADATA, TARGET_MEMBER, CURRENT_ASSIGNMENT})
_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_I8 = struct.Struct(">b")


class ClassicMemberMetadata(NamedTuple):
    """ConsumerGroupMemberMetadataValue's ClassicMemberMetadata: a classic member's session
    timeout and its JoinGroup protocols, (name, metadata) in its order of preference."""

    session_timeout_ms: int
    protocols: tuple[tuple[str, bytes], ...]


class MemberMetadata(NamedTuple):
    """ConsumerGroupMemberMetadataValue (``classic``: None for a member of the consumer protocol)."""

    instance_id: str | None
    rack_id: str | None
    client_id: str
    client_host: str
    subscribed_topic_names: tuple[str, ...]
    subscribed_topic_regex: str | None
    rebalance_timeout_ms: int
    server_assignor: str | None
    classic: ClassicMemberMetadata | None = None


class CurrentAssignment(NamedTuple):
    """ConsumerGroupCurrentMemberAssignmentValue."""

    epoch: int
    previous_epoch: int
    state: int
    assigned: Assignment
    pending_revocation: Assignment


def _key_string(text: str) -> bytes:
    raw = text.encode("utf-8")
    if len(raw) > 32767:
        raise ValueError(f"string of {len(raw)} bytes does not fit Kafka's int16 length")
    return _I16.pack(len(raw)) + raw


def encode_key(version: int, group: str, member: str | None = None) -> bytes:
    """The key of a record of ``version`` (3 to 8) for ``group`` (and ``member`` for 5, 7, 8)."""
    if version not in CONSUMER_KEY_VERSIONS:
        raise ValueError(f"key version {version} is not a consumer group record's")
    if (version in _WITH_MEMBER) != (member is not None):
        raise ValueError(f"key version {version} {'needs' if version in _WITH_MEMBER else 'has no'} member id")
    return _I16.pack(version) + _key_string(group) + (b"" if member is None else _key_string(member))


def decode_key(key: bytes) -> tuple[int, str, str | None] | None:
    """(version, group, member or None) of a consumer group record's key; None for another key
    version (offset commits, classic group metadata, records of a newer Kafka).

    Raises:
        CorruptRecordError: a consumer group key that is truncated or has trailing bytes.
    """
    if len(key) < 2:
        return None
    (version,) = _I16.unpack_from(key, 0)
    if version not in CONSUMER_KEY_VERSIONS:
        return None
    reader = _Reader(key, 2, "key")
    group = reader.key_string()
    member = reader.key_string() if version in _WITH_MEMBER else None
    reader.end()
    return version, group, member


# ---------------------------------------------------------------------- flexible values
def _compact_string(text: str | None) -> bytes:
    if text is None:
        return b"\0"
    raw = text.encode("utf-8")
    return uvarint(len(raw) + 1) + raw


def _compact_bytes(raw: bytes) -> bytes:
    return uvarint(len(raw) + 1) + raw


def _compact_array(items: list[bytes]) -> bytes:
    return uvarint(len(items) + 1) + b"".join(items)


def _partitions(assignment: Assignment) -> bytes:
    return _compact_array([topic.bytes + _compact_array([_I32.pack(p) for p in sorted(parts)]) + b"\0"
                           for topic, parts in sorted(assignment.items()) if parts])


def encode_value(version: int, value: Any) -> bytes:
    """The value (version 0) of a record whose key has ``version``: an int (3, 6: an epoch), a
    ``{topic id: (name, partition count)}`` (4), a :class:`MemberMetadata` (5), an assignment
    (7) or a :class:`CurrentAssignment` (8)."""
    head = _I16.pack(0)
    if version in (GROUP_METADATA, TARGET_METADATA):
        body = _I32.pack(value)
    elif version == PARTITION_METADATA:
        body = _compact_array([topic.bytes + _compact_string(name) + _I32.pack(count) + _compact_array([]) + b"\0"
                               for topic, (name, count) in sorted(value.items())])
    elif version == MEMBER_METADATA:
        m: MemberMetadata = value
        body = (_compact_string(m.instance_id) + _compact_string(m.rack_id) + _compact_string(m.client_id)
                + _compact_string(m.client_host)
                + _compact_array([_compact_string(t) for t in m.subscribed_topic_names])
                + _compact_string(m.subscribed_topic_regex) + _I32.pack(m.rebalance_timeout_ms)
                + _compact_string(m.server_assignor))
        if m.classic is not None:
            classic = (_I32.pack(m.classic.session_timeout_ms)
                       + _compact_array([_compact_string(name) + _compact_bytes(meta) + b"\0"
                                         for name, meta in m.classic.protocols]) + b"\0")
            return head + body + b"\x01\x00" + uvarint(len(classic)) + classic  # tagged field 0
    elif version == TARGET_MEMBER:
        body = _partitions(value)
    elif version == CURRENT_ASSIGNMENT:
        c: CurrentAssignment = value
        body = (_I32.pack(c.epoch) + _I32.pack(c.previous_epoch) + _I8.pack(c.state)
                + _partitions(c.assigned) + _partitions(c.pending_revocation))
    else:
        raise ValueError(f"key version {version} is not a consumer group record's")
    return head + body + b"\0"  # no tagged fields


class _Reader:
    """Bounds-checked reads of one key or value."""

    def __init__(self, buf: bytes, pos: int, what: str) -> None:
        self.buf = bytes(buf)
        self.pos = pos
        self.what = what

    def _need(self, n: int) -> None:
        if n < 0 or self.pos + n > len(self.buf):
            raise CorruptRecordError(None, None, f"consumer group record {self.what}: runs past its end")

    def fixed(self, s: struct.Struct) -> int:
        self._need(s.size)
        (v,) = s.unpack_from(self.buf, self.pos)
        self.pos += s.size
        return v  # type: ignore[no-any-return]

    def key_string(self) -> str:
        n = self.fixed(_I16)
        return self._text(n)

    def _text(self, n: int) -> str:
        self._need(n)
        raw = self.buf[self.pos:self.pos + n]
        self.pos += n
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise CorruptRecordError(None, None, f"consumer group record {self.what}: {exc}") from None

    def uvarint(self) -> int:
        shift = value = 0
        while True:
            self._need(1)
            b = self.buf[self.pos]
            self.pos += 1
            value |= (b & 0x7F) << shift
            if not b & 0x80:
                return value
            shift += 7
            if shift > 28:
                raise CorruptRecordError(None, None, f"consumer group record {self.what}: varint too long")

    def string(self) -> str | None:
        n = self.uvarint()
        return None if n == 0 else self._text(n - 1)

    def count(self) -> int:
        n = self.uvarint() - 1
        if n < 0 or n > len(self.buf) - self.pos:  # every item takes at least one byte
            raise CorruptRecordError(None, None, f"consumer group record {self.what}: bad array length")
        return n

    def uuid(self) -> uuid.UUID:
        self._need(16)
        found = uuid.UUID(bytes=self.buf[self.pos:self.pos + 16])
        self.pos += 16
        return found

    def tags(self) -> dict[int, bytes]:
        """The tagged fields: tag -> raw bytes."""
        out = {}
        for _ in range(self.uvarint()):
            tag = self.uvarint()
            size = self.uvarint()
            self._need(size)
            out[tag] = self.buf[self.pos:self.pos + size]
            self.pos += size
        return out

    def raw_bytes(self) -> bytes:
        n = self.uvarint()
        if n == 0:
            raise CorruptRecordError(None, None, f"consumer group record {self.what}: null bytes")
        self._need(n - 1)
        raw = self.buf[self.pos:self.pos + n - 1]
        self.pos += n - 1
        return raw

    def partitions(self) -> Assignment:
        out: dict[uuid.UUID, frozenset[int]] = {}
        for _ in range(self.count()):
            topic = self.uuid()
            out[topic] = frozenset(self.fixed(_I32) for _ in range(self.count()))
            self.tags()
        return out

    def end(self) -> None:
        if self.pos != len(self.buf):
            raise CorruptRecordError(None, None, f"consumer group record {self.what}: "
                                     f"{len(self.buf) - self.pos} bytes after its last field")


def decode_value(version: int, value: bytes) -> Any:
    """The value of a record whose key has ``version`` (see :func:`encode_value`); None when
    the value's own version is newer than 0 (a later Kafka's: not read here).

    Raises:
        CorruptRecordError: a truncated or malformed value.
    """
    reader = _Reader(value, 0, f"value (key version {version})")
    if reader.fixed(_I16) != 0:
        return None
    out: Any
    if version in (GROUP_METADATA, TARGET_METADATA):
        out = reader.fixed(_I32)
    elif version == PARTITION_METADATA:
        topics = {}
        for _ in range(reader.count()):
            topic = reader.uuid()
            name = reader.string() or ""
            count = reader.fixed(_I32)
            for _ in range(reader.count()):  # per-partition racks: not used
                reader.fixed(_I32)
                for _ in range(reader.count()):
                    reader.string()
                reader.tags()
            reader.tags()
            topics[topic] = (name, count)
        out = topics
    elif version == MEMBER_METADATA:
        instance_id, rack_id = reader.string(), reader.string()
        client_id, client_host = reader.string() or "", reader.string() or ""
        names = tuple(reader.string() or "" for _ in range(reader.count()))
        regex = reader.string()
        out = MemberMetadata(instance_id, rack_id, client_id, client_host, names, regex, reader.fixed(_I32),
                             reader.string())
        tagged = reader.tags()
        if 0 in tagged:
            out = out._replace(classic=_classic(_Reader(tagged[0], 0, "classic member metadata")))
        reader.end()
        return out
    elif version == TARGET_MEMBER:
        out = reader.partitions()
    elif version == CURRENT_ASSIGNMENT:
        epoch, previous = reader.fixed(_I32), reader.fixed(_I32)
        out = CurrentAssignment(epoch, previous, reader.fixed(_I8), reader.partitions(), reader.partitions())
    else:
        raise ValueError(f"key version {version} is not a consumer group record's")
    reader.tags()
    reader.end()
    return out


def _classic(reader: _Reader) -> ClassicMemberMetadata:
    session = reader.fixed(_I32)
    protocols = []
    for _ in range(reader.count()):
        name = reader.string() or ""
        protocols.append((name, reader.raw_bytes()))
        reader.tags()
    reader.tags()
    reader.end()
    return ClassicMemberMetadata(session, tuple(protocols))
