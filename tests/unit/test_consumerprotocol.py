"""The topics of a consumer protocol subscription (logstore.groups.consumerprotocol), read from
subscriptions written by kafka-python's own encoder (an independent codec) in each version."""

from __future__ import annotations

import pytest
from kafka.protocol.consumer.metadata import ConsumerProtocolSubscription

from logstore.groups.consumerprotocol import subscribed_topics


@pytest.mark.parametrize("version", [0, 1, 2, 3])
def test_each_version_written_by_kafka_python(version):
    owned = [ConsumerProtocolSubscription.TopicPartition(topic="orders", partitions=[0, 2])]
    raw = ConsumerProtocolSubscription(topics=["orders", "payments"], user_data=b"user", owned_partitions=owned,
                                       generation_id=4, rack_id="r1", version=version).encode()
    assert raw[:2] == version.to_bytes(2, "big")
    assert subscribed_topics(raw) == ["orders", "payments"]


def test_a_later_version_is_read_as_version_3_and_the_rest_ignored():
    raw = ConsumerProtocolSubscription(topics=["x"], user_data=None, owned_partitions=[], generation_id=-1,
                                       rack_id=None, version=3).encode()
    assert subscribed_topics(b"\x00\x09" + raw[2:] + b"fields of version 9") == ["x"]


@pytest.mark.parametrize("raw", [b"", b"\x00", b"\xff\xff", b"\x00\x00\x00\x00\x00\x05", b"\x00\x00\x7f\xff\xff\xff"])
def test_malformed_subscriptions_are_value_errors(raw):
    with pytest.raises(ValueError, match="consumer protocol subscription"):
        subscribed_topics(raw)
