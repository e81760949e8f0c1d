"""The group metadata record (Kafka's GroupMetadataKey v2 / GroupMetadataValue v0-v3): bytes laid
out by hand from Kafka's JSON schema (group-coordinator's GroupMetadataValue.json), not by the
codec under test."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, strategies as st

from logstore.errors import CorruptRecordError
from logstore.groups.metadata import (
    GroupMember,
    GroupMetadata,
    decode_group_key,
    decode_group_value,
    encode_group_key,
    encode_group_value,
)
from logstore.groups.offsets import decode_offset_key, encode_offset_key


def s(text):
    if text is None:
        return struct.pack(">h", -1)
    raw = text.encode()
    return struct.pack(">h", len(raw)) + raw


def b(data):
    return struct.pack(">i", len(data)) + data


def test_key_is_kafkas_version_2():
    assert encode_group_key("grp") == b"\x00\x02\x00\x03grp"
    assert decode_group_key(b"\x00\x02\x00\x03grp") == "grp"
    assert decode_group_key(encode_offset_key("grp", "t", 1)) is None
    assert decode_offset_key(encode_group_key("grp")) is None


def _v3_bytes():
    return (struct.pack(">h", 3) + s("consumer") + struct.pack(">i", 7) + s("range") + s("m-1")
            + struct.pack(">q", 1_700_000_000_000) + struct.pack(">i", 2)
            + s("m-1") + s(None) + s("client-a") + s("/127.0.0.1") + struct.pack(">ii", 30000, 10000)
            + b(b"sub-a") + b(b"asg-a")
            + s("m-2") + s("static-2") + s("client-b") + s("/10.0.0.2") + struct.pack(">ii", 40000, 6000)
            + b(b"") + b(b"asg-b"))


def test_value_v3_decodes_and_encodes_byte_for_byte():
    expected = GroupMetadata("consumer", 7, "range", "m-1", 1_700_000_000_000, (
        GroupMember("m-1", None, "client-a", "/127.0.0.1", 30000, 10000, b"sub-a", b"asg-a"),
        GroupMember("m-2", "static-2", "client-b", "/10.0.0.2", 40000, 6000, b"", b"asg-b")))
    assert decode_group_value(_v3_bytes()) == expected
    assert encode_group_value(expected) == _v3_bytes()


def test_older_versions_take_kafkas_defaults():
    v0 = (struct.pack(">h", 0) + s("consumer") + struct.pack(">i", 2) + s(None) + s(None) + struct.pack(">i", 1)
          + s("m") + s("c") + s("h") + struct.pack(">i", 5000) + b(b"x") + b(b"y"))
    assert decode_group_value(v0) == GroupMetadata("consumer", 2, None, None, -1,
                                                   (GroupMember("m", None, "c", "h", -1, 5000, b"x", b"y"),))
    v1 = (struct.pack(">h", 1) + s("consumer") + struct.pack(">i", 2) + s("range") + s("m") + struct.pack(">i", 1)
          + s("m") + s("c") + s("h") + struct.pack(">ii", 9000, 5000) + b(b"x") + b(b"y"))
    assert decode_group_value(v1).members[0].rebalance_timeout_ms == 9000


def test_flexible_versions_are_not_read():
    assert decode_group_value(struct.pack(">h", 4) + b"\x09consumer") is None


@pytest.mark.parametrize("cut", [1, 5, 20, 60, 100])
def test_truncated_values_are_corrupt(cut):
    data = _v3_bytes()
    with pytest.raises(CorruptRecordError):
        decode_group_value(data[:len(data) - cut])


def test_trailing_bytes_and_absurd_counts_are_corrupt():
    with pytest.raises(CorruptRecordError, match="after its last field"):
        decode_group_value(_v3_bytes() + b"\x00")
    head = struct.pack(">h", 3) + s("consumer") + struct.pack(">i", 1) + s(None) + s(None) + struct.pack(">q", 0)
    with pytest.raises(CorruptRecordError, match="member count"):
        decode_group_value(head + struct.pack(">i", 1 << 30))
    with pytest.raises(CorruptRecordError, match="member count"):
        decode_group_value(head + struct.pack(">i", -2))


text = st.text(max_size=20)
members = st.builds(GroupMember, text, st.none() | text, text, text, st.integers(-1, 2**31 - 1),
                    st.integers(0, 2**31 - 1), st.binary(max_size=30), st.binary(max_size=30))


@given(st.builds(GroupMetadata, text, st.integers(-1, 2**31 - 1), st.none() | text, st.none() | text,
                 st.integers(-1, 2**62), st.lists(members, max_size=5).map(tuple)))
def test_round_trip(metadata):
    assert decode_group_value(encode_group_value(metadata)) == metadata


def test_offset_store_follows_group_records_and_tombstones(tmp_path):
    from logstore import LogStore
    from logstore.groups.offsets import offset_store

    with LogStore(str(tmp_path)) as store:
        offsets = offset_store(store)
        meta = GroupMetadata("consumer", 3, "range", "m", 1, (GroupMember("m", None, "c", "h", 1, 2, b"s", b"a"),))
        offsets.store_group("g", meta)
        assert offsets.group_metadata() == {"g": meta}
        # A record that does not decode is skipped with a warning; the offsets around it are kept.
        store.partition("__consumer_offsets", 0).append_batch([b"\x00\x03garbage"], [encode_group_key("bad")])
        store.create_topic("t", 1)
        offsets.commit("g", {("t", 0): 9})
        assert offsets.committed("g", "t", 0) == 9 and "bad" not in offsets.group_metadata()
        offsets.store_group("g", None)
        assert offsets.group_metadata() == {}
    with LogStore(str(tmp_path)) as store:
        assert offset_store(store).group_metadata() == {} and offset_store(store).committed("g", "t", 0) == 9
