"""A consumer group's membership as Kafka keeps it in ``__consumer_offsets``: the group metadata record.

The coordinator writes one record per group each time a generation becomes stable (the leader's
assignment is in) and when the group becomes empty, so that a coordinator that takes over (after
a restart, or another process taking the store's group lock) knows the generation, the leader and
every member with its subscription and assignment, and the members go on without rejoining.
The schema is Kafka's (``GroupMetadataKey``/``GroupMetadataValue`` of its group coordinator):

* key, version 2: ``int16 version=2, string group``
* value, version 3: ``int16 version=3, string protocol_type, int32 generation,
  nullable string protocol, nullable string leader, int64 current_state_timestamp,
  int32 count`` then per member ``string member_id, nullable string group_instance_id,
  string client_id, string client_host, int32 rebalance_timeout, int32 session_timeout,
  bytes subscription, bytes assignment``
* a null value (tombstone) deletes the group.

Strings are ``int16 length`` + UTF-8 (-1 for null), bytes ``int32 length`` + bytes, integers
big-endian. Values of versions 0 to 3 are read (older ones lack fields, which take Kafka's
defaults); version 4 (flexible) and later are reported as unsupported by returning None, so that
a store adopted from a newer Kafka loses no committed offset over a record it cannot read.

Thread-safety: pure functions over immutable values.
"""

from __future__ import annotations

import struct
from typing import NamedTuple

from ..errors import CorruptRecordError

__all__ = ["GroupMember", "GroupMetadata", "GROUP_KEY_VERSION", "GROUP_VALUE_VERSION", "encode_group_key",
           "decode_group_key", "encode_group_value", "decode_group_value"]

GROUP_KEY_VERSION = 2
GROUP_VALUE_VERSION = 3
_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")


class GroupMember(NamedTuple):
    """One member as the group metadata record holds it (its subscription is the metadata it gave
    for the group's protocol)."""

    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    rebalance_timeout_ms: int
    session_timeout_ms: int
    subscription: bytes
    assignment: bytes


class GroupMetadata(NamedTuple):
    """A group's generation and members as of the record (Kafka's GroupMetadataValue)."""

    protocol_type: str
    generation: int
    protocol: str | None
    leader: str | None
    current_state_timestamp: int
    members: tuple[GroupMember, ...]


def _string(text: str | None) -> bytes:
    if text is None:
        return _I16.pack(-1)
    raw = text.encode("utf-8")
    if len(raw) > 32767:
        raise ValueError(f"string of {len(raw)} bytes does not fit Kafka's int16 length")
    return _I16.pack(len(raw)) + raw


def _bytes(data: bytes) -> bytes:
    return _I32.pack(len(data)) + data


class _Reader:
    """Bounds-checked reads of one record's key or value."""

    def __init__(self, buf: bytes, what: str) -> None:
        self.buf = buf
        self.pos = 0
        self.what = what

    def _need(self, n: int, field: str) -> None:
        if n < 0 or self.pos + n > len(self.buf):
            raise CorruptRecordError(None, None, f"group metadata {self.what}: {field} runs past its end")

    def i16(self, field: str) -> int:
        self._need(2, field)
        (v,) = _I16.unpack_from(self.buf, self.pos)
        self.pos += 2
        return v  # type: ignore[no-any-return]

    def i32(self, field: str) -> int:
        self._need(4, field)
        (v,) = _I32.unpack_from(self.buf, self.pos)
        self.pos += 4
        return v  # type: ignore[no-any-return]

    def i64(self, field: str) -> int:
        self._need(8, field)
        (v,) = _I64.unpack_from(self.buf, self.pos)
        self.pos += 8
        return v  # type: ignore[no-any-return]

    def string(self, field: str, nullable: bool = False) -> str | None:
        n = self.i16(field)
        if n == -1 and nullable:
            return None
        self._need(n, field)
        raw = self.buf[self.pos:self.pos + n]
        self.pos += n
        try:
            return bytes(raw).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise CorruptRecordError(None, None, f"group metadata {self.what}: {field}: {exc}") from None

    def text(self, field: str) -> str:
        found = self.string(field)
        assert found is not None
        return found

    def data(self, field: str) -> bytes:
        n = self.i32(field)
        self._need(n, field)
        raw = bytes(self.buf[self.pos:self.pos + n])
        self.pos += n
        return raw

    def end(self) -> None:
        if self.pos != len(self.buf):
            raise CorruptRecordError(None, None, f"group metadata {self.what}: {len(self.buf) - self.pos} bytes "
                                     "after its last field")


def encode_group_key(group: str) -> bytes:
    """The ``__consumer_offsets`` key of a group's metadata (Kafka's version 2)."""
    return _I16.pack(GROUP_KEY_VERSION) + _string(group)


def decode_group_key(key: bytes) -> str | None:
    """The group of a group-metadata key; None for other key versions (offset commits)."""
    reader = _Reader(key, "key")
    if reader.i16("version") != GROUP_KEY_VERSION:
        return None
    group = reader.text("group")
    reader.end()
    return group


def encode_group_value(metadata: GroupMetadata) -> bytes:
    """The record value of ``metadata`` (Kafka's version 3)."""
    parts = [_I16.pack(GROUP_VALUE_VERSION), _string(metadata.protocol_type), _I32.pack(metadata.generation),
             _string(metadata.protocol), _string(metadata.leader), _I64.pack(metadata.current_state_timestamp),
             _I32.pack(len(metadata.members))]
    for m in metadata.members:
        parts += [_string(m.member_id), _string(m.group_instance_id), _string(m.client_id), _string(m.client_host),
                  _I32.pack(m.rebalance_timeout_ms), _I32.pack(m.session_timeout_ms), _bytes(m.subscription),
                  _bytes(m.assignment)]
    return b"".join(parts)


def decode_group_value(value: bytes) -> GroupMetadata | None:
    """The metadata of a value of versions 0 to 3; None for a later version (not read here).

    Raises:
        CorruptRecordError: the value is truncated, has trailing bytes or a bad length.
    """
    reader = _Reader(value, "value")
    version = reader.i16("version")
    if not 0 <= version <= GROUP_VALUE_VERSION:
        return None
    protocol_type = reader.text("protocol type")
    generation = reader.i32("generation")
    protocol = reader.string("protocol", nullable=True)
    leader = reader.string("leader", nullable=True)
    timestamp = reader.i64("current state timestamp") if version >= 2 else -1
    count = reader.i32("member count")
    if count < 0 or count > len(value):  # each member takes more than one byte
        raise CorruptRecordError(None, None, f"group metadata value: member count {count} out of range")
    members = []
    for _ in range(count):
        member_id = reader.text("member id")
        instance_id = reader.string("group instance id", nullable=True) if version >= 3 else None
        client_id = reader.text("client id")
        client_host = reader.text("client host")
        rebalance_ms = reader.i32("rebalance timeout") if version >= 1 else -1
        session_ms = reader.i32("session timeout")
        members.append(GroupMember(member_id, instance_id, client_id, client_host, rebalance_ms, session_ms,
                                   reader.data("subscription"), reader.data("assignment")))
    reader.end()
    return GroupMetadata(protocol_type, generation, protocol, leader, timestamp, tuple(members))
