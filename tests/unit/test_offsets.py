"""The ``__consumer_offsets`` codec (Kafka's GroupMetadataManager schema) and OffsetStore."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import logstore
from logstore import CorruptRecordError, Log, LogStore
from logstore.records.batch import parse_header
from logstore.groups.offsets import (
    OFFSETS_TOPIC,
    OFFSETS_TOPIC_CONFIG,
    OffsetStore,
    decode_offset_key,
    decode_offset_value,
    encode_offset_key,
    encode_offset_value,
    offset_value_leader_epoch,
)

INT16 = st.integers(-(1 << 15), (1 << 15) - 1)
INT32 = st.integers(-(1 << 31), (1 << 31) - 1)
INT64 = st.integers(-(1 << 63), (1 << 63) - 1)
OFFSET = st.integers(0, (1 << 63) - 1)
# Surrogates cannot be UTF-8 encoded; everything else can.
TEXT = st.text(st.characters(blacklist_categories=("Cs",)), max_size=40)


def kstr(text: str) -> bytes:
    """Kafka's STRING: int16 length + UTF-8 bytes, big-endian."""
    raw = text.encode("utf-8")
    return struct.pack(">h", len(raw)) + raw


def kafka_key_v1(group: str, topic: str, partition: int) -> bytes:
    g, t = group.encode(), topic.encode()
    return struct.pack(f">hh{len(g)}sh{len(t)}si", 1, len(g), g, len(t), t, partition)


def kafka_value_v3(offset: int, metadata: str, commit_ts: int, leader_epoch: int = -1) -> bytes:
    m = metadata.encode()
    return struct.pack(f">hqih{len(m)}sq", 3, offset, leader_epoch, len(m), m, commit_ts)


def kafka_value_v1(offset: int, metadata: str, commit_ts: int, expire_ts: int) -> bytes:
    m = metadata.encode()
    return struct.pack(f">hqh{len(m)}sqq", 1, offset, len(m), m, commit_ts, expire_ts)


# ---------------------------------------------------------------------------- codec: layout
def test_key_layout_is_kafkas_version_1():
    key = encode_offset_key("my-group", "events", 7)
    assert key == kafka_key_v1("my-group", "events", 7)
    assert key == (b"\x00\x01" + b"\x00\x08my-group" + b"\x00\x06events" + b"\x00\x00\x00\x07")


def test_value_layout_is_kafkas_version_3():
    value = encode_offset_value(1234567890123, "meta", commit_timestamp=1_700_000_000_000)
    assert value == kafka_value_v3(1234567890123, "meta", 1_700_000_000_000, -1)
    # version, offset, leader epoch -1, metadata, commit timestamp
    assert value[:2] == b"\x00\x03"
    assert value[2:10] == (1234567890123).to_bytes(8, "big")
    assert value[10:14] == b"\xff\xff\xff\xff"
    assert value[14:16] == b"\x00\x04" and value[16:20] == b"meta"
    assert value[20:] == (1_700_000_000_000).to_bytes(8, "big")
    assert len(value) == 28


def test_value_without_metadata_and_default_timestamp():
    import time

    before = int(time.time() * 1000)
    value = encode_offset_value(5)
    after = int(time.time() * 1000)
    assert len(value) == 2 + 8 + 4 + 2 + 8
    assert value[14:16] == b"\x00\x00"
    offset, metadata, ts = decode_offset_value(value)
    assert (offset, metadata) == (5, "")
    assert before <= ts <= after


def test_non_ascii_strings_are_length_prefixed_in_bytes():
    key = encode_offset_key("grüppe", "t", 0)
    assert key[2:4] == struct.pack(">h", len("grüppe".encode()))  # 7 bytes, 6 characters
    assert decode_offset_key(key) == ("grüppe", "t", 0)


def test_string_longer_than_int16_is_refused():
    with pytest.raises(ValueError):
        encode_offset_key("g" * 32768, "t", 0)
    with pytest.raises(ValueError):
        encode_offset_value(0, "m" * 32768)
    # the largest that fits still round-trips
    assert decode_offset_key(encode_offset_key("g" * 32767, "t", 0)) == ("g" * 32767, "t", 0)


# ---------------------------------------------------------------------------- codec: round trip
@settings(max_examples=300, deadline=None)
@given(group=TEXT, topic=TEXT, partition=INT32)
def test_key_round_trip(group, topic, partition):
    key = encode_offset_key(group, topic, partition)
    assert key == kafka_key_v1(group, topic, partition)
    assert decode_offset_key(key) == (group, topic, partition)


@settings(max_examples=300, deadline=None)
@given(offset=OFFSET, metadata=TEXT, ts=INT64, epoch=INT32)
def test_value_round_trip(offset, metadata, ts, epoch):
    value = encode_offset_value(offset, metadata, commit_timestamp=ts, leader_epoch=epoch)
    assert value == kafka_value_v3(offset, metadata, ts, epoch)
    assert decode_offset_value(value) == (offset, metadata, ts)


@settings(max_examples=200, deadline=None)
@given(offset=OFFSET, metadata=TEXT, commit_ts=INT64, expire_ts=INT64)
def test_value_version_1_decodes(offset, metadata, commit_ts, expire_ts):
    assert decode_offset_value(kafka_value_v1(offset, metadata, commit_ts, expire_ts)) == (
        offset, metadata, commit_ts)


def test_value_version_1_concrete():
    raw = struct.pack(">hqh3sqq", 1, 42, 3, b"abc", 1_600_000_000_000, 1_600_086_400_000)
    assert decode_offset_value(raw) == (42, "abc", 1_600_000_000_000)


def test_key_version_2_group_metadata_is_ignored():
    assert decode_offset_key(struct.pack(">hh5s", 2, 5, b"group")) is None
    assert decode_offset_key(b"\x00\x02" + kstr("another-group")) is None


# ---------------------------------------------------------------------------- codec: corruption
def test_every_truncation_of_a_key_is_corrupt():
    key = encode_offset_key("group", "topic", 3)
    for n in range(len(key)):
        with pytest.raises(CorruptRecordError):
            decode_offset_key(key[:n])


def test_every_truncation_of_a_value_is_corrupt():
    for value in (encode_offset_value(9, "meta", 1), kafka_value_v1(9, "meta", 1, 2)):
        # version 1 has a trailing expire timestamp the decoder does not need
        full = len(value) - (8 if value[:2] == b"\x00\x01" else 0)
        for n in range(full):
            with pytest.raises(CorruptRecordError):
                decode_offset_value(value[:n])


def test_specific_garbage_is_corrupt():
    good = encode_offset_key("g", "t", 0)
    with pytest.raises(CorruptRecordError):
        decode_offset_key(good + b"\x00")  # trailing byte
    with pytest.raises(CorruptRecordError):
        decode_offset_key(b"\x00\x01\xff\xff")  # null (-1) group string
    with pytest.raises(CorruptRecordError):
        decode_offset_key(b"\x00\x01\x00\x02\xff\xfe" + kstr("t") + b"\x00\x00\x00\x00")  # bad UTF-8
    with pytest.raises(CorruptRecordError):
        decode_offset_key(b"\x00\x01\x7f\xff" + b"x" * 10)  # length past the end
    with pytest.raises(CorruptRecordError):
        decode_offset_value(struct.pack(">hq", 7, 1))  # unknown version
    with pytest.raises(CorruptRecordError):
        decode_offset_value(struct.pack(">hqih", 3, 1, -1, -1) + b"\x00" * 8)  # null metadata
    with pytest.raises(CorruptRecordError):
        decode_offset_value(b"")
    with pytest.raises(CorruptRecordError):
        decode_offset_key(b"")


@settings(max_examples=1000, deadline=None)
@given(st.binary(max_size=64))
def test_arbitrary_bytes_decode_or_raise_corrupt(data):
    for decode in (decode_offset_key, decode_offset_value):
        try:
            decode(data)
        except CorruptRecordError as exc:
            assert isinstance(exc, logstore.LogstoreError)
            assert exc.reason


@settings(max_examples=500, deadline=None)
@given(version=st.sampled_from([0, 1, 3]), body=st.binary(max_size=48))
def test_plausible_headers_with_garbage_bodies(version, body):
    data = struct.pack(">h", version) + body
    for decode in (decode_offset_key, decode_offset_value):
        try:
            result = decode(data)
        except CorruptRecordError:
            continue
        assert result is None or isinstance(result, tuple)


# ---------------------------------------------------------------------------- OffsetStore
def open_store(root) -> LogStore:
    return LogStore(root, maintenance=False)


def offsets_log(store: LogStore) -> Log:
    store.create_topic(OFFSETS_TOPIC, 1, exist_ok=True, internal=True, **OFFSETS_TOPIC_CONFIG)
    return store.partition(OFFSETS_TOPIC, 0)


@pytest.fixture
def store(tmp_path):
    s = open_store(tmp_path / "store")
    yield s
    s.close()


def test_commit_and_committed(store):
    log = offsets_log(store)
    offsets = OffsetStore(log)
    assert offsets.committed("g", "t", 0) is None
    assert offsets.groups() == {}
    offsets.commit("g", {("t", 0): 5, ("t", 1): 7})
    assert offsets.committed("g", "t", 0) == 5
    assert offsets.committed("g", "t", 1) == 7
    assert offsets.committed("g", "t", 2) is None
    assert offsets.committed("other", "t", 0) is None
    offsets.commit("g", {("t", 0): 6})
    assert offsets.committed("g", "t", 0) == 6
    offsets.commit("h", {("u", 0): (3, "meta-data")})
    assert offsets.committed_with_metadata("h", "u", 0) == (3, "meta-data")
    assert offsets.committed_with_metadata("g", "t", 0) == (6, "")
    assert offsets.groups() == {"g": {("t", 0): 6, ("t", 1): 7}, "h": {("u", 0): 3}}


def test_the_committed_leader_epoch_is_kafkas_value_v3_field_and_survives_a_reopen(store):
    assert offset_value_leader_epoch(kafka_value_v3(5, "m", 1, leader_epoch=9)) == 9
    assert offset_value_leader_epoch(kafka_value_v1(5, "m", 1, 2)) == -1  # version 1 has none
    log = offsets_log(store)
    offsets = OffsetStore(log)
    offsets.commit("g", {("t", 0): (5, "m", 9), ("t", 1): (6, "")})
    assert [offset_value_leader_epoch(r.value) for r in log.read(0)] == [9, -1]
    assert offsets.committed_entry("g", "t", 0) == (5, "m", 9)
    assert offsets.group_entries("g") == {("t", 0): (5, "m", 9), ("t", 1): (6, "", -1)}
    offsets.commit("g", {("t", 0): 7})  # a later commit without one: none any more
    assert OffsetStore(log).committed_entry("g", "t", 0) == (7, "", -1)


def test_delete_group_writes_tombstones_for_its_offsets_and_membership(store):
    log = offsets_log(store)
    offsets = OffsetStore(log)
    offsets.commit("g", {("t", 0): 5, ("u", 1): 7})
    offsets.commit("h", {("t", 0): 1})
    offsets.delete_group("g")
    assert offsets.group_offsets("g") == {} and offsets.committed("h", "t", 0) == 1
    tombstones = log.read(3)
    assert [r.value for r in tombstones] == [None, None, None]
    assert [decode_offset_key(r.key) for r in tombstones[:2]] == [("g", "t", 0), ("g", "u", 1)]
    assert OffsetStore(log).group_offsets("g") == {}


def test_commit_writes_kafka_records_in_one_batch(store):
    log = offsets_log(store)
    offsets = OffsetStore(log)
    offsets.commit("g", {("t", 0): 5, ("t", 1): 7, ("u", 0): 0})
    records = log.read(0)
    assert log.log_end_offset == 3
    assert [decode_offset_key(r.key) for r in records] == [("g", "t", 0), ("g", "t", 1), ("g", "u", 0)]
    assert [r.key for r in records] == [kafka_key_v1("g", "t", 0), kafka_key_v1("g", "t", 1),
                                        kafka_key_v1("g", "u", 0)]
    decoded = [decode_offset_value(r.value) for r in records]
    assert [d[:2] for d in decoded] == [(5, ""), (7, ""), (0, "")]
    assert len({d[2] for d in decoded}) == 1  # one commit timestamp for the whole commit
    assert all(r.value[:2] == b"\x00\x03" for r in records)
    # one batch, so that a commit is all-or-nothing: the segment holds exactly one batch
    segment = log.segments[0]
    data = (Path(log.path) / f"{segment.base_offset:020d}.log").read_bytes()
    header = parse_header(data, 0)
    assert (header.base_offset, header.records_count, header.last_offset) == (0, 3, 2)
    assert header.size == segment.size


def test_commit_rejects_bad_offsets_and_writes_nothing(store):
    log = offsets_log(store)
    offsets = OffsetStore(log)
    for bad in (-1, True, 1.5, "3", None):
        with pytest.raises(ValueError):
            offsets.commit("g", {("t", 0): 1, ("t", 1): bad})
    assert log.log_end_offset == 0
    assert offsets.groups() == {}
    offsets.commit("g", {})  # empty: nothing to do
    assert log.log_end_offset == 0


def test_delete_writes_tombstones(store):
    log = offsets_log(store)
    offsets = OffsetStore(log)
    offsets.commit("g", {("t", 0): 5, ("t", 1): 7})
    offsets.commit("h", {("t", 0): 1})
    offsets.delete("g", [("t", 0)])
    assert offsets.committed("g", "t", 0) is None
    assert offsets.committed("g", "t", 1) == 7
    assert offsets.committed("h", "t", 0) == 1
    tail = log.read(3)
    assert len(tail) == 1 and tail[0].value is None and tail[0].key == kafka_key_v1("g", "t", 0)
    offsets.delete("g", [("t", 1)])
    assert offsets.groups() == {"h": {("t", 0): 1}}
    end = log.log_end_offset
    offsets.delete("g", [])  # nothing
    assert log.log_end_offset == end
    # a commit after a delete brings the offset back
    offsets.commit("g", {("t", 0): 9})
    assert offsets.committed("g", "t", 0) == 9


def test_second_offset_store_replays_the_same_state(store):
    log = offsets_log(store)
    first = OffsetStore(log)
    for i in range(50):
        first.commit(f"g{i % 3}", {("t", i % 4): i})
    first.delete("g0", [("t", 0)])
    second = OffsetStore(log)
    assert second.groups() == first.groups()
    assert second.committed("g0", "t", 0) is None
    assert second.committed("g1", "t", 1) == 49
    assert second.committed("g2", "t", 3) == 47


def test_offset_store_follows_commits_of_another(store):
    log = offsets_log(store)
    a, b = OffsetStore(log), OffsetStore(log)
    assert b.committed("g", "t", 0) is None  # b has caught up with the empty log
    a.commit("g", {("t", 0): 11})
    assert b.committed("g", "t", 0) == 11
    a.delete("g", [("t", 0)])
    assert b.committed("g", "t", 0) is None
    b.commit("g", {("t", 0): 12})
    assert a.committed("g", "t", 0) == 12


def test_replay_skips_foreign_records(store):
    log = offsets_log(store)
    log.append(b"\x00\x02whatever", key=struct.pack(">hh5s", 2, 5, b"group"))  # group metadata
    OffsetStore(log).commit("g", {("t", 0): 3})
    fresh = OffsetStore(log)
    assert fresh.groups() == {"g": {("t", 0): 3}}


def test_replay_starts_at_log_start_after_records_were_deleted(store):
    log = offsets_log(store)
    offsets = OffsetStore(log)
    offsets.commit("g", {("t", 0): 1})
    offsets.commit("g", {("t", 1): 2})
    log.delete_records_before(1)
    fresh = OffsetStore(log)
    assert fresh.groups() == {"g": {("t", 1): 2}}
    fresh.commit("g", {("t", 2): 3})
    assert fresh.groups() == {"g": {("t", 1): 2, ("t", 2): 3}}


def test_replay_after_compaction_keeps_latest(tmp_path):
    store = open_store(tmp_path / "s")
    try:
        log = offsets_log(store)
        offsets = OffsetStore(log)
        for i in range(100):
            offsets.commit("g", {("t", i % 5): i})
        offsets.delete("g", [("t", 4)])
        log.roll()
        offsets.commit("g", {("t", 0): 1000})
        log.roll()
        log.compact()
        fresh = OffsetStore(log)
        assert fresh.groups() == {"g": {("t", 0): 1000, ("t", 1): 96, ("t", 2): 97, ("t", 3): 98}}
        assert fresh.groups() == offsets.groups()
    finally:
        store.close()


def test_commits_survive_reopening_the_store(tmp_path):
    root = tmp_path / "s"
    store = open_store(root)
    offsets = OffsetStore(offsets_log(store))
    offsets.commit("g", {("t", 0): 5, ("t", 1): 7})
    offsets.commit("g", {("t", 0): 6})
    offsets.commit("h", {("x", 3): (8, "m")})
    offsets.delete("g", [("t", 1)])
    store.close()

    store = open_store(root)
    try:
        assert OFFSETS_TOPIC in store.topics(internal=True)
        assert OFFSETS_TOPIC not in store.topics()
        again = OffsetStore(store.partition(OFFSETS_TOPIC, 0))
        assert again.groups() == {"g": {("t", 0): 6}, "h": {("x", 3): 8}}
        assert again.committed_with_metadata("h", "x", 3) == (8, "m")
        assert again.committed("g", "t", 1) is None
    finally:
        store.close()
