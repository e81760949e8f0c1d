"""The records of ``__remote_log_metadata``, byte for byte as Kafka writes them (KIP-405).

Kafka's TopicBasedRemoteLogMetadataManager keeps each event of a remote segment's life as one
record (null key) whose value is its RemoteLogMetadataSerde's framing of a generated message
(BytesApiMessageSerde over AbstractApiMessageSerde)::

    value   = frame_version apiKey version message      (three unsigned varints, then the message)
    frame_version = 1                                   (0 was KRaft's 2.8 preview: refused)

and the message is the flexible encoding (compact strings, arrays and bytes; UUIDs as 16 bytes;
a tagged-field section after every struct) of one of Kafka's JSON specs under
``storage/src/main/resources/message/``:

======  ========================================  ==============================================
apiKey  message                                   fields (v0, in order)
======  ========================================  ==============================================
0       RemoteLogSegmentMetadataRecord            RemoteLogSegmentId {TopicIdPartition {Name, Id,
                                                  Partition}, Id}, StartOffset, EndOffset,
                                                  BrokerId, MaxTimestampMs, EventTimestampMs,
                                                  SegmentLeaderEpochs [{LeaderEpoch, Offset}],
                                                  SegmentSizeInBytes, CustomMetadata (nullable),
                                                  RemoteLogSegmentState; tagged 0: TxnIndexEmpty
1       RemoteLogSegmentMetadataUpdateRecord      RemoteLogSegmentId, BrokerId, EventTimestampMs,
                                                  CustomMetadata (nullable), RemoteLogSegmentState
2       RemotePartitionDeleteMetadataRecord       TopicIdPartition, BrokerId, EventTimestampMs,
                                                  RemotePartitionDeleteState
3       RemoteLogSegmentMetadataSnapshotRecord    Kafka's local snapshot files only: refused here
======  ========================================  ==============================================

Every record names its partition by topic id *and* topic name (``TopicIdPartition {Name, Id,
Partition}``), so the name needs no other source. The leader epochs of a segment travel as
``SegmentLeaderEpochs`` (epoch -> the segment's first offset in it, ascending by epoch), the
RemoteStorageManager's custom metadata as the nullable ``CustomMetadata`` bytes of an added
segment and of each update (how an update's applies is ``RemoteLogSegmentMetadata.with_update``'s
rule; this codec writes what the value holds), and ``TxnIndexEmpty`` (KIP-1058) as tagged
field 0, written only when true, as Kafka's writer leaves a field at its default (false) out: a
record without it reads as False, "the segment may have a transaction index".

Versions: every record is written at version 0, which every Kafka with tiered storage reads.
Version 1 (a later Kafka's, which adds only tagged fields: ``BrokerLeaderEpoch``, and an
update's or a deletion's ``EndOffset``) is read, its new tagged fields skipped, as are unknown
tagged fields of any version. A newer version, whose required fields this code cannot know, an
unknown apiKey, and a snapshot record are refused with
:class:`UnsupportedRemoteLogMetadataError`; a truncated or malformed record (a length past its
end, trailing bytes, an unknown state id, offsets that are no range) with
:class:`RemoteLogMetadataRecordError`. Every length is checked before it is used.

Thread-safety: pure functions over immutable values.
"""

from __future__ import annotations

import struct
import uuid
from typing import Union

from ..errors import CorruptRecordError
from ..records.control import uvarint
from .metadata import (
    RemoteLogSegmentId,
    RemoteLogSegmentMetadata,
    RemoteLogSegmentMetadataUpdate,
    RemoteLogSegmentState,
    RemotePartitionDeleteMetadata,
    RemotePartitionDeleteState,
    TopicIdPartition,
)

__all__ = [
    "REMOTE_LOG_METADATA_TOPIC",
    "FRAME_VERSION",
    "SEGMENT_METADATA_API_KEY",
    "SEGMENT_METADATA_UPDATE_API_KEY",
    "PARTITION_DELETE_API_KEY",
    "SNAPSHOT_API_KEY",
    "WRITE_VERSION",
    "READ_VERSIONS",
    "RemoteLogMetadata",
    "RemoteLogMetadataRecordError",
    "UnsupportedRemoteLogMetadataError",
    "encode",
    "decode",
]

#: Kafka's topic of remote log metadata records
REMOTE_LOG_METADATA_TOPIC = "__remote_log_metadata"
#: AbstractApiMessageSerde's frame version (the first unsigned varint of every value)
FRAME_VERSION = 1
SEGMENT_METADATA_API_KEY = 0
SEGMENT_METADATA_UPDATE_API_KEY = 1
PARTITION_DELETE_API_KEY = 2
SNAPSHOT_API_KEY = 3
#: the version every record is written at
WRITE_VERSION = 0
#: the versions read: 1 adds only tagged fields to 0
READ_VERSIONS = (0, 1)
_NAMES = {
    SEGMENT_METADATA_API_KEY: "RemoteLogSegmentMetadataRecord",
    SEGMENT_METADATA_UPDATE_API_KEY: "RemoteLogSegmentMetadataUpdateRecord",
    PARTITION_DELETE_API_KEY: "RemotePartitionDeleteMetadataRecord",
    SNAPSHOT_API_KEY: "RemoteLogSegmentMetadataSnapshotRecord",
}
_TAG_TXN_INDEX_EMPTY = 0  # RemoteLogSegmentMetadataRecord's tagged field 0 (bool)

_I8 = struct.Struct(">b")
_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")
_EPOCH_ENTRY = struct.Struct(">iq")  # LeaderEpoch, Offset
_OFFSETS_BROKER = struct.Struct(">qqi")  # StartOffset, EndOffset, BrokerId
_TIMES = struct.Struct(">qq")  # MaxTimestampMs, EventTimestampMs
_BROKER_TIME = struct.Struct(">iq")  # BrokerId, EventTimestampMs
_NO_TAGS = b"\x00"

#: what one record holds
RemoteLogMetadata = Union[RemoteLogSegmentMetadata, RemoteLogSegmentMetadataUpdate, RemotePartitionDeleteMetadata]


class RemoteLogMetadataRecordError(CorruptRecordError):
    """A ``__remote_log_metadata`` record that cannot be read: truncated, a length past its end,
    trailing bytes, an unknown state id, values that break a field's rule. Immutable; safe to
    share. ``detail`` says what is wrong (``reason`` adds the topic); the codec knows no offset,
    its reader names it."""

    def __init__(self, detail: str) -> None:
        self.detail = detail
        super().__init__(None, None, f"{REMOTE_LOG_METADATA_TOPIC} record: {detail}")

    def __reduce__(self):  # type: ignore[no-untyped-def]  # pickling keeps this class's argument
        return (type(self), (self.detail,))


class UnsupportedRemoteLogMetadataError(RemoteLogMetadataRecordError):
    """A well-framed ``__remote_log_metadata`` record this code does not read: an apiKey it does
    not know, a version newer than it knows (whose required fields it cannot know), a frame
    version other than 1, or a snapshot record (Kafka keeps those in local files only)."""


# ---------------------------------------------------------------------- writing
def _pack(fmt: struct.Struct, what: str, *values: int) -> bytes:
    try:
        return fmt.pack(*values)
    except struct.error as exc:
        raise ValueError(f"{what} {values if len(values) > 1 else values[0]!r} is out of range: {exc}") from None


def _compact_string(text: str, what: str) -> bytes:
    if not isinstance(text, str):
        raise TypeError(f"{what} must be a str, not {type(text).__name__}")
    raw = text.encode("utf-8")
    if len(raw) > 0x7FFF:
        raise ValueError(f"{what} is {len(raw)} bytes long, more than a Kafka string holds (32767)")
    return uvarint(len(raw) + 1) + raw


def _nullable_bytes(raw: bytes | None) -> bytes:
    if raw is None:
        return b"\x00"
    return uvarint(len(raw) + 1) + bytes(raw)


def _topic_id_partition(tp: TopicIdPartition) -> bytes:
    return (_compact_string(tp.topic, "topic name") + tp.topic_id.bytes
            + _pack(_I32, "partition", tp.partition) + _NO_TAGS)


def _segment_id(segment_id: RemoteLogSegmentId) -> bytes:
    return _topic_id_partition(segment_id.topic_id_partition) + segment_id.id.bytes + _NO_TAGS


def _frame(api_key: int, body: bytes) -> bytes:
    return uvarint(FRAME_VERSION) + uvarint(api_key) + uvarint(WRITE_VERSION) + body


def encode(value: RemoteLogMetadata) -> bytes:
    """The ``__remote_log_metadata`` record value Kafka writes for ``value`` (version 0).

    A RemoteLogSegmentMetadata is written with the state it holds (the manager adds segments at
    COPY_SEGMENT_STARTED), its leader epochs ascending, and tagged field 0 when its transaction
    index is empty. Pure; thread-safe.

    Raises:
        TypeError: ``value`` is none of the three kinds.
        ValueError: a number does not fit its Kafka field (a partition, broker id, size or epoch
            past int32, an offset or time past int64), or the topic name is over 32767 bytes.
    """
    if isinstance(value, RemoteLogSegmentMetadata):
        epochs = sorted(value.segment_leader_epochs.items())
        body = [_segment_id(value.segment_id),
                _pack(_OFFSETS_BROKER, "start offset, end offset, broker id", value.start_offset, value.end_offset,
                      value.broker_id),
                _pack(_TIMES, "max timestamp, event timestamp", value.max_timestamp_ms, value.event_timestamp_ms),
                uvarint(len(epochs) + 1)]
        body += [_pack(_EPOCH_ENTRY, "leader epoch, offset", epoch, offset) + _NO_TAGS for epoch, offset in epochs]
        body += [_pack(_I32, "segment size", value.segment_size_in_bytes), _nullable_bytes(value.custom_metadata),
                 _pack(_I8, "state", int(value.state)),
                 b"\x01\x00\x01\x01" if value.txn_index_empty else _NO_TAGS]  # 1 field: tag 0, size 1, true
        return _frame(SEGMENT_METADATA_API_KEY, b"".join(body))
    if isinstance(value, RemoteLogSegmentMetadataUpdate):
        body = [_segment_id(value.segment_id),
                _pack(_BROKER_TIME, "broker id, event timestamp", value.broker_id, value.event_timestamp_ms),
                _nullable_bytes(value.custom_metadata), _pack(_I8, "state", int(value.state)), _NO_TAGS]
        return _frame(SEGMENT_METADATA_UPDATE_API_KEY, b"".join(body))
    if isinstance(value, RemotePartitionDeleteMetadata):
        body = [_topic_id_partition(value.topic_id_partition),
                _pack(_BROKER_TIME, "broker id, event timestamp", value.broker_id, value.event_timestamp_ms),
                _pack(_I8, "state", int(value.state)), _NO_TAGS]
        return _frame(PARTITION_DELETE_API_KEY, b"".join(body))
    raise TypeError(f"a RemoteLogSegmentMetadata, RemoteLogSegmentMetadataUpdate or RemotePartitionDeleteMetadata, "
                    f"not {type(value).__name__}")


# ---------------------------------------------------------------------- reading
class _Cursor:
    """Bounds-checked reads of one record value; every failure names the message and field."""

    def __init__(self, data: bytes) -> None:
        self.data = bytes(data)
        self.pos = 0
        self.message = "record"

    def fail(self, reason: str) -> RemoteLogMetadataRecordError:
        return RemoteLogMetadataRecordError(f"{self.message}: {reason}")

    def take(self, n: int, field: str) -> bytes:
        if n < 0 or n > len(self.data) - self.pos:
            raise self.fail(f"{field} ({n} bytes at position {self.pos}) runs past the record's end "
                            f"({len(self.data)} bytes)")
        out = self.data[self.pos:self.pos + n]
        self.pos += n
        return out

    def fixed(self, fmt: struct.Struct, field: str) -> tuple[int, ...]:
        return fmt.unpack(self.take(fmt.size, field))

    def varint(self, field: str) -> int:
        """An unsigned varint of at most 5 bytes that fits an int32, as Kafka reads them."""
        value = 0
        for shift in range(0, 35, 7):
            byte = self.take(1, field)[0]
            value |= (byte & 0x7F) << shift
            if not byte & 0x80:
                if value > 0x7FFFFFFF:
                    break
                return value
        raise self.fail(f"{field}: an unsigned varint longer than 5 bytes or above 2^31 - 1")

    def length(self, field: str, nullable: bool) -> int | None:
        """A compact length (stored + 1; 0 is null), checked against the bytes left."""
        n = self.varint(f"{field} length") - 1
        if n < 0:
            if nullable:
                return None
            raise self.fail(f"{field} is null, and the field is not nullable")
        if n > len(self.data) - self.pos:
            raise self.fail(f"{field} length {n} runs past the record's end ({len(self.data) - self.pos} bytes left)")
        return n

    def string(self, field: str) -> str:
        n = self.length(field, False) or 0
        if n > 0x7FFF:
            raise self.fail(f"{field} length {n} is more than a Kafka string holds (32767)")
        raw = self.take(n, field)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise self.fail(f"{field} is not UTF-8: {exc}") from None

    def uuid(self, field: str) -> uuid.UUID:
        return uuid.UUID(bytes=self.take(16, field))

    def tagged_fields(self, field: str) -> dict[int, bytes]:
        """The tagged fields after a struct: tag -> raw bytes (every one is skipped unless asked for)."""
        count = self.varint(f"{field} tagged field count")
        if count * 2 > len(self.data) - self.pos:  # a tag and a size take a byte each at least
            raise self.fail(f"{field} tagged field count {count} does not fit the "
                            f"{len(self.data) - self.pos} bytes left")
        found = {}
        for _ in range(count):
            tag = self.varint(f"{field} tag")
            found[tag] = self.take(self.varint(f"{field} tagged field {tag} size"), f"{field} tagged field {tag}")
        return found

    def topic_id_partition(self) -> TopicIdPartition:
        name = self.string("topic name")
        topic_id = self.uuid("topic id")
        (partition,) = self.fixed(_I32, "partition")
        self.tagged_fields("TopicIdPartition")
        if partition < 0:
            raise self.fail(f"partition {partition} < 0")
        return TopicIdPartition(topic_id, name, partition)

    def segment_id(self) -> RemoteLogSegmentId:
        tp = self.topic_id_partition()
        found = RemoteLogSegmentId(tp, self.uuid("remote log segment id"))
        self.tagged_fields("RemoteLogSegmentId")
        return found

    def end(self) -> None:
        if self.pos != len(self.data):
            raise self.fail(f"{len(self.data) - self.pos} bytes after its last field")


def _segment_state(cursor: _Cursor) -> RemoteLogSegmentState:
    (state,) = cursor.fixed(_I8, "RemoteLogSegmentState")
    try:
        return RemoteLogSegmentState(state)
    except ValueError:
        raise cursor.fail(f"RemoteLogSegmentState {state} is no state (0-3 are)") from None


def _read_segment(cursor: _Cursor) -> RemoteLogSegmentMetadata:
    segment_id = cursor.segment_id()
    start, end, broker = cursor.fixed(_OFFSETS_BROKER, "start offset, end offset, broker id")
    max_ts, event_ts = cursor.fixed(_TIMES, "max timestamp, event timestamp")
    count = cursor.varint("SegmentLeaderEpochs length") - 1
    if count < 0:
        raise cursor.fail("SegmentLeaderEpochs is null, and the field is not nullable")
    if count * (_EPOCH_ENTRY.size + 1) > len(cursor.data) - cursor.pos:
        raise cursor.fail(f"SegmentLeaderEpochs count {count} does not fit the {len(cursor.data) - cursor.pos} "
                          "bytes left")
    epochs: dict[int, int] = {}
    for _ in range(count):
        epoch, offset = cursor.fixed(_EPOCH_ENTRY, "SegmentLeaderEpochs entry")
        cursor.tagged_fields("SegmentLeaderEpochEntry")
        epochs[epoch] = offset  # (a repeated epoch: the last one holds, as Kafka's map keeps it)
    (size,) = cursor.fixed(_I32, "SegmentSizeInBytes")
    custom_length = cursor.length("CustomMetadata", True)
    custom = None if custom_length is None else cursor.take(custom_length, "CustomMetadata")
    state = _segment_state(cursor)
    tagged = cursor.tagged_fields(_NAMES[SEGMENT_METADATA_API_KEY])
    txn_index_empty = False  # Kafka's default: a record from before KIP-1058 says nothing
    if _TAG_TXN_INDEX_EMPTY in tagged:
        flag = tagged[_TAG_TXN_INDEX_EMPTY]
        if len(flag) != 1:
            raise cursor.fail(f"TxnIndexEmpty (tagged field 0) is {len(flag)} bytes, not 1")
        txn_index_empty = flag != b"\x00"
    try:
        return RemoteLogSegmentMetadata(segment_id, start, end, max_ts, broker, event_ts, size,
                                        dict(sorted(epochs.items())), state, custom, txn_index_empty)
    except ValueError as exc:
        raise cursor.fail(str(exc)) from None


def _read_update(cursor: _Cursor) -> RemoteLogSegmentMetadataUpdate:
    segment_id = cursor.segment_id()
    broker, event_ts = cursor.fixed(_BROKER_TIME, "broker id, event timestamp")
    custom_length = cursor.length("CustomMetadata", True)
    custom = None if custom_length is None else cursor.take(custom_length, "CustomMetadata")
    state = _segment_state(cursor)
    cursor.tagged_fields(_NAMES[SEGMENT_METADATA_UPDATE_API_KEY])  # v1's BrokerLeaderEpoch, EndOffset: skipped
    return RemoteLogSegmentMetadataUpdate(segment_id, event_ts, state, broker, custom)


def _read_partition_delete(cursor: _Cursor) -> RemotePartitionDeleteMetadata:
    tp = cursor.topic_id_partition()
    broker, event_ts = cursor.fixed(_BROKER_TIME, "broker id, event timestamp")
    (state_id,) = cursor.fixed(_I8, "RemotePartitionDeleteState")
    try:
        state = RemotePartitionDeleteState(state_id)
    except ValueError:
        raise cursor.fail(f"RemotePartitionDeleteState {state_id} is no state (0-2 are)") from None
    cursor.tagged_fields(_NAMES[PARTITION_DELETE_API_KEY])  # v1's BrokerLeaderEpoch, EndOffset: skipped
    return RemotePartitionDeleteMetadata(tp, state, event_ts, broker)


_READERS = {
    SEGMENT_METADATA_API_KEY: _read_segment,
    SEGMENT_METADATA_UPDATE_API_KEY: _read_update,
    PARTITION_DELETE_API_KEY: _read_partition_delete,
}


def decode(data: bytes | bytearray | memoryview) -> RemoteLogMetadata:
    """The event a ``__remote_log_metadata`` record value holds (versions 0 and 1). Pure.

    Raises:
        UnsupportedRemoteLogMetadataError: a frame version other than 1, an unknown apiKey, a
            snapshot record (apiKey 3), or a version above 1.
        RemoteLogMetadataRecordError: the record is truncated, has trailing bytes, a length past
            its end, a null where Kafka allows none, a state id Kafka does not have, a known
            tagged field of the wrong size, or offsets that are no range.
    """
    cursor = _Cursor(data)
    frame = cursor.varint("frame version")
    if frame != FRAME_VERSION:
        raise UnsupportedRemoteLogMetadataError(
            f"frame version {frame} is not supported (only {FRAME_VERSION} is"
            + ("; 0 was KRaft's 2.8 preview)" if frame == 0 else ")"))
    api_key = cursor.varint("apiKey")
    version = cursor.varint("version")
    name = _NAMES.get(api_key)
    reader = _READERS.get(api_key)
    if reader is None:
        what = f"a {name}, which Kafka keeps in local snapshot files only" if name else "no message this code knows"
        raise UnsupportedRemoteLogMetadataError(f"apiKey {api_key} (version {version}) is {what}")
    if version not in READ_VERSIONS:
        raise UnsupportedRemoteLogMetadataError(
            f"{name} version {version} is newer than the newest read here ({READ_VERSIONS[-1]}): "
            "its required fields are unknown")
    cursor.message = f"{name} v{version}"
    value = reader(cursor)
    cursor.end()
    return value
