"""Metadata v11+ as librdkafka's KIP-848 consumer sends it: librdkafka's "brokers only" request,
whose topic count is a 4-byte zero (bytes captured from librdkafka 2.16), answered as Kafka
answers it (every topic) instead of closing the connection. (Topics named by id: see
tests/kafka_clients/test_topic_ids_wire.py.)"""

from __future__ import annotations

import pytest

from logstore.kafka.wire import KafkaProtocolError, parse_request

#: librdkafka 2.16's Metadata v12 "brokers only" request (after its size), correlation id 4
BROKERS_ONLY_V12 = bytes.fromhex("0003000c00000004000772646b61666b610000000000010000")


def test_librdkafkas_brokers_only_metadata_reads_as_every_topic():
    request = parse_request(BROKERS_ONLY_V12)
    assert (request.api_key, request.api_version, request.correlation_id) == (3, 12, 4)
    assert request.body.topics is None


def test_other_bytes_after_a_metadata_request_are_still_refused():
    with pytest.raises(KafkaProtocolError, match="bytes after the request"):
        parse_request(BROKERS_ONLY_V12 + b"\0")
    with pytest.raises(KafkaProtocolError, match="bytes after the request"):
        parse_request(BROKERS_ONLY_V12[:-7] + b"\0\0\0\0\1\0\0\0")  # one byte more
