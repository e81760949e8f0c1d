"""Kafka's ``__remote_log_metadata`` records (logstore.tiered.records), checked against Kafka's own
JSON message specs.

The oracle is not the codec: :class:`SchemaCodec` below is a small interpreter of Kafka's JSON
message schemas (types, versions, flexible versions, nullable fields, tagged fields and their
defaults), reading the three specs copied from Apache Kafka into
``tests/fixtures/kafka/remote_log_metadata/``, with the framing of Kafka's
AbstractApiMessageSerde (frame version 1, apiKey, version, as unsigned varints). Both
directions are checked for many values, plus bytes laid out by hand for one record of each kind.
"""

from __future__ import annotations

import json
import pathlib
import pickle
import struct
import uuid
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from logstore.errors import CorruptRecordError
from logstore.tiered import records
from logstore.tiered.metadata import (
    RemoteLogSegmentId,
    RemoteLogSegmentMetadata,
    RemoteLogSegmentMetadataUpdate,
    RemoteLogSegmentState,
    RemotePartitionDeleteMetadata,
    RemotePartitionDeleteState,
    TopicIdPartition,
)
from logstore.tiered.records import RemoteLogMetadataRecordError, UnsupportedRemoteLogMetadataError

SPECS = pathlib.Path(__file__).resolve().parents[1] / "fixtures" / "kafka" / "remote_log_metadata"


# ---------------------------------------------------------------------- the schema interpreter
def _varint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _in(versions: str | None, version: int) -> bool:
    """Whether ``version`` is in a spec's version range ("0+", "1-3", "2", "none")."""
    if versions is None or versions == "none":
        return False
    if versions.endswith("+"):
        return version >= int(versions[:-1])
    low, _, high = versions.partition("-")
    return int(low) <= version <= int(high or low)


_FIXED = {"int8": struct.Struct(">b"), "int16": struct.Struct(">h"), "int32": struct.Struct(">i"),
          "int64": struct.Struct(">q"), "float64": struct.Struct(">d")}


class _In:
    def __init__(self, data: bytes) -> None:
        self.data, self.pos = data, 0

    def take(self, n: int) -> bytes:
        assert 0 <= n <= len(self.data) - self.pos, "runs past the end"
        self.pos += n
        return self.data[self.pos - n:self.pos]

    def varint(self) -> int:
        value = shift = 0
        while True:
            byte = self.take(1)[0]
            value |= (byte & 0x7F) << shift
            shift += 7
            if not byte & 0x80:
                return value


class SchemaCodec:
    """One Kafka JSON message spec, interpreted: a message is a dict of field name -> value
    (nested structs are dicts, arrays lists, uuid a uuid.UUID, bytes bytes or None)."""

    def __init__(self, filename: str) -> None:
        text = (SPECS / filename).read_text()
        self.spec = json.loads("\n".join(line for line in text.splitlines() if not line.lstrip().startswith("//")))
        self.api_key: int = self.spec["apiKey"]

    # -------------------------------------------------------------- helpers
    def _flexible(self, version: int) -> bool:
        return _in(self.spec["flexibleVersions"], version)

    @staticmethod
    def _tagged(field: dict, version: int) -> bool:
        return _in(field.get("taggedVersions"), version)

    @staticmethod
    def default(field: dict) -> Any:
        """A field's default as Kafka's generator reads the spec."""
        kind, given_default = field["type"], field.get("default")
        if given_default == "null":
            return None
        if kind in _FIXED:
            return int(given_default, 0) if given_default is not None else 0
        if kind == "bool":
            return given_default == "true"
        if kind == "string":
            return given_default or ""
        if kind == "uuid":
            return uuid.UUID(int=0)
        if kind == "bytes":
            return b""
        if kind.startswith("[]"):
            return []
        return {f["name"]: SchemaCodec.default(f) for f in field["fields"]}

    # -------------------------------------------------------------- writing
    def encode(self, message: dict, version: int, extra_tags: dict[int, bytes] | None = None) -> bytes:
        """The record value: the serde's frame, then the message at ``version``. ``extra_tags``
        are tagged fields of a later version, added to the message's own."""
        assert _in(self.spec["validVersions"], version)
        body = self._struct(self.spec["fields"], message, version, extra_tags or {})
        return _varint(1) + _varint(self.api_key) + _varint(version) + body

    def _struct(self, fields: list[dict], values: dict, version: int, extra_tags: dict[int, bytes]) -> bytes:
        out = []
        tags = dict(extra_tags)
        for field in fields:
            if not _in(field["versions"], version):
                continue
            if self._tagged(field, version):
                value = values.get(field["name"], self.default(field))
                if value != self.default(field):  # Kafka's writer leaves a default out
                    tags[field["tag"]] = self._value(field, value, version)
                continue
            out.append(self._value(field, values[field["name"]], version))
        if self._flexible(version):
            out.append(_varint(len(tags)))
            for tag in sorted(tags):
                out.append(_varint(tag) + _varint(len(tags[tag])) + tags[tag])
        return b"".join(out)

    def _value(self, field: dict, value: Any, version: int) -> bytes:
        kind = field["type"]
        flexible = self._flexible(version)
        if kind.startswith("[]"):
            element = dict(field, type=kind[2:])
            count = _varint(len(value) + 1) if flexible else struct.pack(">i", len(value))
            return count + b"".join(self._value(element, item, version) for item in value)
        if kind in _FIXED:
            return _FIXED[kind].pack(value)
        if kind == "bool":
            return b"\x01" if value else b"\x00"
        if kind == "uuid":
            return value.bytes
        if kind in ("string", "bytes"):
            if value is None:
                assert _in(field.get("nullableVersions"), version), f"{field['name']} is not nullable"
                return b"\x00" if flexible else (b"\xff\xff" if kind == "string" else b"\xff\xff\xff\xff")
            raw = value.encode() if kind == "string" else value
            if flexible:
                return _varint(len(raw) + 1) + raw
            return (struct.pack(">h", len(raw)) if kind == "string" else struct.pack(">i", len(raw))) + raw
        return self._struct(field["fields"], value, version, {})  # a struct type

    # -------------------------------------------------------------- reading
    def decode(self, data: bytes) -> tuple[int, dict]:
        """(version, message) of a record value; unknown tagged fields are skipped."""
        reader = _In(data)
        assert reader.varint() == 1, "frame version"
        assert reader.varint() == self.api_key, "apiKey"
        version = reader.varint()
        message = self._read_struct(reader, self.spec["fields"], version)
        assert reader.pos == len(data), "trailing bytes"
        return version, message

    def _read_struct(self, reader: _In, fields: list[dict], version: int) -> dict:
        out = {}
        tagged = {}
        for field in fields:
            if not _in(field["versions"], version):
                continue
            if self._tagged(field, version):
                tagged[field["tag"]] = field
                out[field["name"]] = self.default(field)
                continue
            out[field["name"]] = self._read_value(reader, field, version)
        if self._flexible(version):
            for _ in range(reader.varint()):
                tag, size = reader.varint(), reader.varint()
                raw = reader.take(size)
                if tag in tagged:
                    inner = _In(raw)
                    out[tagged[tag]["name"]] = self._read_value(inner, tagged[tag], version)
                    assert inner.pos == size
        return out

    def _read_value(self, reader: _In, field: dict, version: int) -> Any:
        kind = field["type"]
        flexible = self._flexible(version)
        if kind.startswith("[]"):
            count = reader.varint() - 1 if flexible else struct.unpack(">i", reader.take(4))[0]
            element = dict(field, type=kind[2:])
            return [self._read_value(reader, element, version) for _ in range(count)]
        if kind in _FIXED:
            return _FIXED[kind].unpack(reader.take(_FIXED[kind].size))[0]
        if kind == "bool":
            return reader.take(1) != b"\x00"
        if kind == "uuid":
            return uuid.UUID(bytes=reader.take(16))
        if kind in ("string", "bytes"):
            if flexible:
                n = reader.varint() - 1
            else:
                n = struct.unpack(">h" if kind == "string" else ">i", reader.take(2 if kind == "string" else 4))[0]
            if n < 0:
                return None
            raw = reader.take(n)
            return raw.decode() if kind == "string" else raw
        return self._read_struct(reader, field["fields"], version)


SEGMENT = SchemaCodec("RemoteLogSegmentMetadataRecord.json")
UPDATE = SchemaCodec("RemoteLogSegmentMetadataUpdateRecord.json")
DELETE = SchemaCodec("RemotePartitionDeleteMetadataRecord.json")


# ---------------------------------------------------------------------- values <-> the specs' dicts
def _tp_dict(tp: TopicIdPartition) -> dict:
    return {"Name": tp.topic, "Id": tp.topic_id, "Partition": tp.partition}


def _segment_id_dict(segment_id: RemoteLogSegmentId) -> dict:
    return {"TopicIdPartition": _tp_dict(segment_id.topic_id_partition), "Id": segment_id.id}


def as_message(value: Any) -> tuple[SchemaCodec, dict]:
    """The spec and the message dict Kafka's transforms make of ``value``."""
    if isinstance(value, RemoteLogSegmentMetadata):
        return SEGMENT, {
            "RemoteLogSegmentId": _segment_id_dict(value.segment_id), "StartOffset": value.start_offset,
            "EndOffset": value.end_offset, "BrokerId": value.broker_id, "MaxTimestampMs": value.max_timestamp_ms,
            "EventTimestampMs": value.event_timestamp_ms,
            "SegmentLeaderEpochs": [{"LeaderEpoch": e, "Offset": o}
                                    for e, o in sorted(value.segment_leader_epochs.items())],
            "SegmentSizeInBytes": value.segment_size_in_bytes, "CustomMetadata": value.custom_metadata,
            "RemoteLogSegmentState": int(value.state), "TxnIndexEmpty": value.txn_index_empty}
    if isinstance(value, RemoteLogSegmentMetadataUpdate):
        return UPDATE, {
            "RemoteLogSegmentId": _segment_id_dict(value.segment_id), "BrokerId": value.broker_id,
            "EventTimestampMs": value.event_timestamp_ms, "CustomMetadata": value.custom_metadata,
            "RemoteLogSegmentState": int(value.state)}
    return DELETE, {
        "TopicIdPartition": _tp_dict(value.topic_id_partition), "BrokerId": value.broker_id,
        "EventTimestampMs": value.event_timestamp_ms, "RemotePartitionDeleteState": int(value.state)}


# ---------------------------------------------------------------------- strategies
_INT32 = st.integers(-2**31, 2**31 - 1)
_INT64 = st.integers(-2**63, 2**63 - 1)
_uuids = st.builds(lambda n: uuid.UUID(int=n), st.integers(0, 2**128 - 1))
_topics = st.text(alphabet="abcdefghijklmnopqrstuvwxyzABCXYZ0123456789._-", min_size=1, max_size=249)
_tps = st.builds(TopicIdPartition, _uuids, _topics, st.integers(0, 2**31 - 1))
_segment_ids = st.builds(RemoteLogSegmentId, _tps, _uuids)
_custom = st.none() | st.binary(max_size=300)


@st.composite
def segments(draw: Any) -> RemoteLogSegmentMetadata:
    start = draw(st.integers(0, 2**63 - 1))
    end = draw(st.integers(start, 2**63 - 1))
    epochs = draw(st.dictionaries(st.integers(0, 2**31 - 1), st.integers(start, end), max_size=6))
    return RemoteLogSegmentMetadata(
        draw(_segment_ids), start, end, draw(_INT64), draw(_INT32), draw(_INT64), draw(st.integers(0, 2**31 - 1)),
        epochs, draw(st.sampled_from(RemoteLogSegmentState)), draw(_custom), draw(st.booleans()))


updates = st.builds(RemoteLogSegmentMetadataUpdate, _segment_ids, _INT64, st.sampled_from(RemoteLogSegmentState),
                    _INT32, _custom)
deletes = st.builds(RemotePartitionDeleteMetadata, _tps, st.sampled_from(RemotePartitionDeleteState), _INT64, _INT32)
events = segments() | updates | deletes
#: what a later Kafka's version 1 adds (tagged fields only), and tags no version has yet
_v1_tags = st.fixed_dictionaries({"BrokerLeaderEpoch": _INT32, "EndOffset": _INT64})
_unknown_tags = st.dictionaries(st.integers(7, 300), st.binary(max_size=20), max_size=3)


# ---------------------------------------------------------------------- both directions
@settings(max_examples=300, deadline=None)
@given(events)
def test_the_codec_writes_what_kafkas_spec_lays_out_at_version_0(value):
    spec, message = as_message(value)
    data = records.encode(value)
    assert data == spec.encode(message, 0)
    assert spec.decode(data) == (0, message)


@settings(max_examples=300, deadline=None)
@given(events, _v1_tags, _unknown_tags, st.sampled_from([0, 1]))
def test_the_codec_reads_what_kafkas_spec_lays_out_at_versions_0_and_1(value, v1, unknown, version):
    spec, message = as_message(value)
    if version == 1:
        message = {**{k: v for k, v in v1.items() if k not in message}, **message}  # v1's new tagged fields
    assert records.decode(spec.encode(message, version, extra_tags=unknown)) == value


@settings(max_examples=200, deadline=None)
@given(events)
def test_every_truncation_of_a_record_is_refused(value):
    data = records.encode(value)
    for cut in range(len(data)):
        with pytest.raises(RemoteLogMetadataRecordError):
            records.decode(data[:cut])


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=200))
def test_garbage_is_refused_with_the_record_error_or_read(data):
    try:
        value = records.decode(data)
    except RemoteLogMetadataRecordError as exc:
        assert isinstance(exc, CorruptRecordError) and records.REMOTE_LOG_METADATA_TOPIC in str(exc)
    else:
        assert records.decode(records.encode(value)) == value


# ---------------------------------------------------------------------- bytes checked by hand
TOPIC_ID = uuid.UUID("00112233-4455-6677-8899-aabbccddeeff")
SEGMENT_UUID = uuid.UUID("ffeeddcc-bbaa-9988-7766-554433221100")
TP = TopicIdPartition(TOPIC_ID, "orders", 3)
SEGMENT_ID = RemoteLogSegmentId(TP, SEGMENT_UUID)
TP_BYTES = b"\x07orders" + TOPIC_ID.bytes + b"\x00\x00\x00\x03" + b"\x00"  # Name, Id, Partition, no tags
SEGMENT_ID_BYTES = TP_BYTES + SEGMENT_UUID.bytes + b"\x00"
S_DELETE_STARTED = RemoteLogSegmentState.DELETE_SEGMENT_STARTED


def test_a_segment_metadata_record_byte_for_byte():
    value = RemoteLogSegmentMetadata(SEGMENT_ID, 100, 199, 1700000000000, 2, 1700000000500, 4096, {5: 100, 6: 150},
                                     RemoteLogSegmentState.COPY_SEGMENT_STARTED, b"cm", True)
    expected = (b"\x01" + b"\x00" + b"\x00"  # frame version 1, apiKey 0, version 0
                + SEGMENT_ID_BYTES
                + (100).to_bytes(8, "big") + (199).to_bytes(8, "big")  # StartOffset, EndOffset
                + (2).to_bytes(4, "big")  # BrokerId
                + (1700000000000).to_bytes(8, "big") + (1700000000500).to_bytes(8, "big")  # Max-, EventTimestampMs
                + b"\x03"  # SegmentLeaderEpochs: 2 entries
                + (5).to_bytes(4, "big") + (100).to_bytes(8, "big") + b"\x00"
                + (6).to_bytes(4, "big") + (150).to_bytes(8, "big") + b"\x00"
                + (4096).to_bytes(4, "big")  # SegmentSizeInBytes
                + b"\x03cm"  # CustomMetadata
                + b"\x00"  # RemoteLogSegmentState COPY_SEGMENT_STARTED
                + b"\x01" + b"\x00\x01\x01")  # one tagged field: tag 0 (TxnIndexEmpty), size 1, true
    assert records.encode(value) == expected
    assert records.decode(expected) == value
    # without the tag (a record from before KIP-1058): the index may not be empty
    plain = expected[:-4] + b"\x00"
    assert records.decode(plain) == RemoteLogSegmentMetadata(
        SEGMENT_ID, 100, 199, 1700000000000, 2, 1700000000500, 4096, {5: 100, 6: 150},
        RemoteLogSegmentState.COPY_SEGMENT_STARTED, b"cm", False)


def test_an_update_record_byte_for_byte():
    value = RemoteLogSegmentMetadataUpdate(SEGMENT_ID, 1700000001000, RemoteLogSegmentState.COPY_SEGMENT_FINISHED, 2)
    expected = (b"\x01\x01\x00" + SEGMENT_ID_BYTES
                + (2).to_bytes(4, "big") + (1700000001000).to_bytes(8, "big")  # BrokerId, EventTimestampMs
                + b"\x00"  # CustomMetadata: null
                + b"\x01"  # COPY_SEGMENT_FINISHED
                + b"\x00")  # no tagged fields
    assert records.encode(value) == expected
    assert records.decode(expected) == value


def test_a_partition_delete_record_byte_for_byte():
    value = RemotePartitionDeleteMetadata(TP, RemotePartitionDeleteState.DELETE_PARTITION_STARTED, 1700000002000, 7)
    expected = (b"\x01\x02\x00" + TP_BYTES + (7).to_bytes(4, "big") + (1700000002000).to_bytes(8, "big")
                + b"\x01" + b"\x00")
    assert records.encode(value) == expected
    assert records.decode(expected) == value
    # version 1 (a later Kafka): BrokerLeaderEpoch (tag 0) and EndOffset (tag 1), read past
    v1 = (b"\x01\x02\x01" + expected[3:-1] + b"\x02" + b"\x00\x04" + (9).to_bytes(4, "big")
          + b"\x01\x08" + (5000).to_bytes(8, "big"))
    assert records.decode(v1) == value


# ---------------------------------------------------------------------- refusals
def _segment_record() -> bytes:
    return records.encode(RemoteLogSegmentMetadata(SEGMENT_ID, 0, 9, 1, 0, 1, 10, {0: 0}, txn_index_empty=False))


def test_unknown_api_keys_newer_versions_and_other_frames_are_refused_by_name():
    body = _segment_record()[3:]
    with pytest.raises(UnsupportedRemoteLogMetadataError, match="apiKey 9 .*no message"):
        records.decode(b"\x01\x09\x00" + body)
    with pytest.raises(UnsupportedRemoteLogMetadataError, match="RemoteLogSegmentMetadataSnapshotRecord"):
        records.decode(b"\x01\x03\x00" + body)
    with pytest.raises(UnsupportedRemoteLogMetadataError, match="version 2 is newer.*required fields"):
        records.decode(b"\x01\x00\x02" + body)
    with pytest.raises(UnsupportedRemoteLogMetadataError, match="frame version 0.*2.8"):
        records.decode(b"\x00\x00\x00" + body)
    with pytest.raises(UnsupportedRemoteLogMetadataError, match="frame version 2"):
        records.decode(b"\x02\x00\x00" + body)


def test_malformed_records_name_what_was_wrong():
    data = _segment_record()
    with pytest.raises(RemoteLogMetadataRecordError, match="1 bytes after its last field"):
        records.decode(data + b"\x00")
    state_at = len(data) - 2
    with pytest.raises(RemoteLogMetadataRecordError, match="RemoteLogSegmentState 9 is no state"):
        records.decode(data[:state_at] + b"\x09" + data[state_at + 1:])
    with pytest.raises(RemoteLogMetadataRecordError, match="topic name is null"):
        records.decode(b"\x01\x00\x00\x00" + data[10:])
    with pytest.raises(RemoteLogMetadataRecordError, match="topic name length 2147483646 runs past"):
        records.decode(b"\x01\x00\x00" + b"\xff\xff\xff\xff\x07" + data[10:])
    with pytest.raises(RemoteLogMetadataRecordError, match="varint longer than 5 bytes"):
        records.decode(b"\x01\x00\x00" + b"\xff" * 6)
    with pytest.raises(RemoteLogMetadataRecordError, match="TxnIndexEmpty .* is 2 bytes"):
        records.decode(data[:-1] + b"\x01\x00\x02\x01\x01")
    # an end offset below the start offset
    bad = records.encode(RemoteLogSegmentMetadata(SEGMENT_ID, 5, 9, 1, 0, 1, 10, {0: 5}))
    at = 3 + len(SEGMENT_ID_BYTES)
    with pytest.raises(RemoteLogMetadataRecordError, match="no range"):
        records.decode(bad[:at] + (5).to_bytes(8, "big") + (4).to_bytes(8, "big") + bad[at + 16:])
    with pytest.raises(RemoteLogMetadataRecordError, match="RemotePartitionDeleteState 3 is no state"):
        records.decode(b"\x01\x02\x00" + TP_BYTES + b"\x00" * 12 + b"\x03\x00")
    # the error carries the topic and pickles faithfully
    exc = RemoteLogMetadataRecordError("a detail")
    assert "__remote_log_metadata record: a detail" in str(exc)
    again = pickle.loads(pickle.dumps(exc))
    assert (again.detail, str(again)) == ("a detail", str(exc))


def test_unknown_tagged_fields_are_skipped_everywhere():
    data = records.encode(RemoteLogSegmentMetadataUpdate(SEGMENT_ID, 5, S_DELETE_STARTED, 1))
    # a tagged field (tag 4, 3 bytes) inside TopicIdPartition and one at the message's end
    tp_end = 3 + len(TP_BYTES) - 1
    tagged = data[:tp_end] + b"\x01\x04\x03abc" + data[tp_end + 1:-1] + b"\x01\x09\x01z"
    assert records.decode(tagged) == records.decode(data)


def test_values_that_do_not_fit_kafkas_fields_are_refused_before_encoding():
    with pytest.raises(ValueError, match="segment size"):
        records.encode(RemoteLogSegmentMetadata(SEGMENT_ID, 0, 9, 1, 0, 1, 2**31, {0: 0}))
    with pytest.raises(ValueError, match="partition"):
        records.encode(RemotePartitionDeleteMetadata(TopicIdPartition(TOPIC_ID, "t", 2**31),
                                                     RemotePartitionDeleteState.DELETE_PARTITION_MARKED, 0, 0))
    with pytest.raises(ValueError, match="leader epoch"):
        records.encode(RemoteLogSegmentMetadata(SEGMENT_ID, 0, 9, 1, 0, 1, 1, {2**31: 0}))
    with pytest.raises(ValueError, match="32767"):
        records.encode(RemotePartitionDeleteMetadata(TopicIdPartition(TOPIC_ID, "t" * 40000, 0),
                                                     RemotePartitionDeleteState.DELETE_PARTITION_MARKED, 0, 0))
    with pytest.raises(TypeError):
        records.encode(TP)  # type: ignore[arg-type]
