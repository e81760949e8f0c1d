"""The consumer protocol and the range assignor of groupclient, against kafka-python's structs (an
independent codec), and the client's requests against a served coordinator."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, strategies as st
from kafka.protocol.old.consumer_protocol import ConsumerProtocolMemberAssignment_v0, ConsumerProtocolMemberMetadata_v0

from logstore.kafka.groupclient import (
    decode_assignment,
    decode_subscription,
    encode_assignment,
    encode_subscription,
    range_assign,
)
from logstore.kafka.client import KafkaClientError

topic = st.text(alphabet="abcxyz-_.0", min_size=1, max_size=12)


@given(st.lists(topic, unique=True, max_size=6))
def test_subscription_matches_kafka_python(topics):
    ours = encode_subscription(topics)
    theirs = ConsumerProtocolMemberMetadata_v0(0, sorted(topics), None).encode()
    assert ours == theirs
    assert decode_subscription(ConsumerProtocolMemberMetadata_v0(0, topics, b"user").encode()) == topics


@given(st.dictionaries(topic, st.lists(st.integers(0, 1000), unique=True, max_size=5), max_size=5))
def test_assignment_matches_kafka_python(assignment):
    ours = encode_assignment(assignment)
    theirs = ConsumerProtocolMemberAssignment_v0(
        0, [(t, sorted(ps)) for t, ps in sorted(assignment.items())], None).encode()
    assert ours == theirs
    decoded = decode_assignment(theirs)
    assert {t: sorted(ps) for t, ps in decoded.items()} == {t: sorted(ps) for t, ps in assignment.items()}


def test_later_versions_are_read_as_far_as_version_3_goes():
    # version 1 adds owned partitions (an array), version 3 the rack (a string); extra trailing bytes
    v1 = struct.pack(">h", 1) + ConsumerProtocolMemberMetadata_v0(0, ["a", "b"], None).encode()[2:] + \
        struct.pack(">i", 0)
    assert decode_subscription(v1) == ["a", "b"]
    v9 = struct.pack(">h", 9) + v1[2:] + struct.pack(">i", 0) + struct.pack(">h", -1) + b"future fields"
    assert decode_subscription(v9) == ["a", "b"]


@pytest.mark.parametrize("data", [b"", b"\x00", b"\xff\xff", b"\x00\x00\x00\x00\x00\x05ab"])
def test_malformed_subscriptions_raise(data):
    with pytest.raises(KafkaClientError):
        decode_subscription(data)


def test_malformed_assignment_raises_and_empty_is_nothing():
    assert decode_assignment(b"") == {}
    with pytest.raises(KafkaClientError):
        decode_assignment(b"\x00\x00\x00\x00\x00\x01\x00\x09ab")


def test_range_assign_is_kafkas_range_assignor():
    subs = {"m-b": ["t", "u"], "m-a": ["t"], "m-c": ["u", "gone"]}
    got = range_assign(subs, {"t": 5, "u": 3})
    # t: m-a, m-b in member id order: 3 + 2; u: m-b, m-c: 2 + 1; "gone" is unknown: skipped
    assert got == {"m-a": {"t": [0, 1, 2]}, "m-b": {"t": [3, 4], "u": [0, 1]}, "m-c": {"u": [2]}}
    assert range_assign({"x": ["t"], "y": ["t"], "z": ["t"]}, {"t": 1}) == {"x": {"t": [0]}, "y": {}, "z": {}}


@given(st.dictionaries(st.text(min_size=1, max_size=4), st.sets(st.sampled_from("tuv"), min_size=1), min_size=1,
                       max_size=6), st.dictionaries(st.sampled_from("tuv"), st.integers(0, 20)))
def test_range_assign_gives_each_partition_to_one_subscriber(subs, counts):
    got = range_assign(subs, counts)
    for t, n in counts.items():
        owners = [(m, p) for m, a in got.items() for p in a.get(t, [])]
        if any(t in ts for ts in subs.values()):
            assert sorted(p for _, p in owners) == list(range(n))
            assert all(t in subs[m] for m, _ in owners)
        else:
            assert owners == []
