"""Kafka's consumer group records (logstore.groups.consumerrecords), checked against bytes laid out
by hand from Kafka's JSON specs (group-coordinator's ConsumerGroup*Key/Value.json)."""

from __future__ import annotations

import uuid

import pytest

from logstore.errors import CorruptRecordError
from logstore.groups import consumerrecords as rec

T = uuid.UUID("12345678-1234-5678-1234-567812345678")


def test_keys_are_kafkas_non_flexible_keys():
    assert rec.encode_key(rec.GROUP_METADATA, "g") == b"\x00\x03\x00\x01g"
    assert rec.encode_key(rec.CURRENT_ASSIGNMENT, "g", "m1") == b"\x00\x08\x00\x01g\x00\x02m1"
    assert rec.decode_key(b"\x00\x08\x00\x01g\x00\x02m1") == (8, "g", "m1")
    assert rec.decode_key(b"\x00\x01\x00\x01g\x00\x01t\x00\x00\x00\x00") is None  # an offset commit
    with pytest.raises(CorruptRecordError):
        rec.decode_key(b"\x00\x05\x00\x01g")  # a member key without its member
    with pytest.raises(ValueError):
        rec.encode_key(rec.MEMBER_METADATA, "g")


def test_group_epoch_value_is_version_0_flexible():
    assert rec.encode_value(rec.GROUP_METADATA, 7) == b"\x00\x00\x00\x00\x00\x07\x00"
    assert rec.decode_value(rec.GROUP_METADATA, b"\x00\x00\x00\x00\x00\x07\x00") == 7


def test_current_assignment_bytes_as_kafkas_spec_lays_them_out():
    value = rec.CurrentAssignment(5, 4, 1, {T: frozenset({0, 2})}, {T: frozenset({1})})
    raw = rec.encode_value(rec.CURRENT_ASSIGNMENT, value)
    expected = (b"\x00\x00" + b"\x00\x00\x00\x05" + b"\x00\x00\x00\x04" + b"\x01"
                + b"\x02" + T.bytes + b"\x03\x00\x00\x00\x00\x00\x00\x00\x02\x00"
                + b"\x02" + T.bytes + b"\x02\x00\x00\x00\x01\x00" + b"\x00")
    assert raw == expected
    assert rec.decode_value(rec.CURRENT_ASSIGNMENT, raw) == value


def test_member_metadata_round_trips_and_skips_unknown_tagged_fields():
    meta = rec.MemberMetadata("inst", None, "client", "/127.0.0.1", ("a", "b"), "t.*", 30000, "range")
    raw = rec.encode_value(rec.MEMBER_METADATA, meta)
    assert rec.decode_value(rec.MEMBER_METADATA, raw) == meta
    # a tagged field this reader does not know (tag 5) is skipped
    tagged = raw[:-1] + b"\x01\x05\x03abc"
    assert rec.decode_value(rec.MEMBER_METADATA, tagged) == meta


def test_a_classic_members_metadata_is_kafkas_tagged_field_0():
    classic = rec.ClassicMemberMetadata(10000, (("range", b"\x00\x01sub"), ("cooperative-sticky", b"")))
    meta = rec.MemberMetadata(None, "r1", "client", "/127.0.0.1", ("a",), None, 30000, None, classic)
    raw = rec.encode_value(rec.MEMBER_METADATA, meta)
    plain = rec.encode_value(rec.MEMBER_METADATA, meta._replace(classic=None))
    # Kafka's layout: the plain value's fields, then one tagged field (tag 0) holding the
    # session timeout and the compact array of (name, metadata, no tags), then its own tags
    body = (b"\x00\x00\x27\x10" + b"\x03" + b"\x06range" + b"\x06\x00\x01sub" + b"\x00"
            + b"\x13cooperative-sticky" + b"\x01" + b"\x00" + b"\x00")
    assert raw == plain[:-1] + b"\x01\x00" + bytes([len(body)]) + body
    assert rec.decode_value(rec.MEMBER_METADATA, raw) == meta


def test_partition_metadata_and_target_member_round_trip():
    topics = {T: ("orders", 6)}
    assert rec.decode_value(rec.PARTITION_METADATA, rec.encode_value(rec.PARTITION_METADATA, topics)) == topics
    target = {T: frozenset({1, 3})}
    assert rec.decode_value(rec.TARGET_MEMBER, rec.encode_value(rec.TARGET_MEMBER, target)) == target


def test_a_newer_value_version_is_not_read_and_garbage_is_corrupt():
    assert rec.decode_value(rec.GROUP_METADATA, b"\x00\x01\x00\x00\x00\x07\x00") is None
    with pytest.raises(CorruptRecordError):
        rec.decode_value(rec.GROUP_METADATA, b"\x00\x00\x00\x00")
    with pytest.raises(CorruptRecordError):
        rec.decode_value(rec.CURRENT_ASSIGNMENT, b"\x00\x00" + b"\x00" * 9 + b"\x7f")
