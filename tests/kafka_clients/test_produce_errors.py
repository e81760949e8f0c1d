"""Produce errors per partition, on the wire: batches built by kafka-python's own record builder
and requests encoded by its protocol structs (independent of the server's codec). A refused
batch writes nothing; the other partitions of the same request are written."""

from __future__ import annotations

import socket
import threading
import struct

import pytest
from kafka.protocol.old.produce import ProduceRequest, ProduceResponse
from kafka.record.default_records import DefaultRecordBatchBuilder

from logstore.kafka.server import KafkaServer

NONE, CORRUPT_MESSAGE, UNKNOWN_TOPIC_OR_PARTITION, MESSAGE_TOO_LARGE, INVALID_RECORD = 0, 2, 3, 10, 87


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    s = KafkaServer(str(tmp_path_factory.mktemp("errors")), ("127.0.0.1", 0), auto_create_topics=False).start()
    s.store.create_topic("plain", 2)
    s.store.create_topic("small", 1, max_message_bytes=1000)
    s.store.create_topic("keyed", 1, cleanup_policy="compact")
    yield s
    s.stop()


def batch(records, codec=0):
    """A v2 batch of (key, value) records, by kafka-python's builder."""
    builder = DefaultRecordBatchBuilder(magic=2, compression_type=codec, is_transactional=False, producer_id=-1,
                                        producer_epoch=-1, base_sequence=-1, batch_size=1 << 20)
    for i, (key, value) in enumerate(records):
        builder.append(i, timestamp=1_700_000_000_000 + i, key=key, value=value, headers=[])
    return bytes(builder.build())


def produce_answers(server, topics, version=8):
    """Send one Produce request ({topic: {partition: batch}}); each partition's answer as
    {(topic, partition): (error, base offset, log start offset, error message)}, None for a field
    the version does not have (log start from v5, message from v8)."""
    request = ProduceRequest[version](None, -1, 10_000, [(t, list(parts.items())) for t, parts in topics.items()])
    request.with_header(1, "errors-test")
    with socket.create_connection(server.address, timeout=10) as s:
        s.sendall(request.encode(header=True, framed=True))
        size = struct.unpack(">i", s.recv(4, socket.MSG_WAITALL))[0]
        payload = b""
        while len(payload) < size:
            payload += s.recv(size - len(payload))
    answer = ProduceResponse[version].decode(payload, header=True)
    return {(t, p[0]): (p[1], p[2], p[4] if len(p) > 4 else None, p[6] if len(p) > 6 else None)
            for t, parts in answer.topics for p in parts}


def produce(server, topics, version=8):
    """Send one Produce request ({topic: {partition: batch}}); {(topic, partition): error}."""
    return {key: answer[0] for key, answer in produce_answers(server, topics, version).items()}


def end(server, topic, partition=0):
    return server.store.partition(topic, partition).log_end_offset


def test_a_keyless_record_in_a_compacted_topic_is_invalid_record(server):
    before = end(server, "keyed")
    errors = produce(server, {"keyed": {0: batch([(b"k", b"v"), (None, b"no key")])}})
    assert errors == {("keyed", 0): INVALID_RECORD} and end(server, "keyed") == before


def record_errors(server, topics):
    """Send one Produce v8 request ({topic: {partition: batch}}); each partition's
    (error, [batch index of each record_errors entry], [their messages])."""
    request = ProduceRequest[8](None, -1, 10_000, [(t, list(parts.items())) for t, parts in topics.items()])
    request.with_header(1, "errors-test")
    with socket.create_connection(server.address, timeout=10) as s:
        s.sendall(request.encode(header=True, framed=True))
        size = struct.unpack(">i", s.recv(4, socket.MSG_WAITALL))[0]
        payload = s.recv(size, socket.MSG_WAITALL)
    answer = ProduceResponse[8].decode(payload, header=True)
    return {(t, p[0]): (p[1], [i for i, _ in p[5]], [m for _, m in p[5]]) for t, parts in answer.topics for p in parts}


def test_a_compacted_topic_names_each_keyless_record_of_a_refused_batch(server):
    """ProduceResponse's record_errors (read by kafka-python's structs): the batch index of each
    record without a key, as Kafka's LogValidator answers; nothing is written. A refusal for
    another reason names no record."""
    before = end(server, "keyed")
    keyless = batch([(b"a", b"1"), (None, b"2"), (b"c", b"3"), (None, b"4")])
    answers = record_errors(server, {"keyed": {0: keyless}, "small": {0: batch([(None, b"z" * 2000)])}})
    error, indexes, messages = answers[("keyed", 0)]
    assert (error, indexes) == (INVALID_RECORD, [1, 3]) and all(messages)
    assert answers[("small", 0)] == (MESSAGE_TOO_LARGE, [], [])
    assert end(server, "keyed") == before


def test_a_batch_over_max_message_bytes_is_message_too_large(server):
    errors = produce(server, {"small": {0: batch([(None, b"x" * 2000)])}})
    assert errors == {("small", 0): MESSAGE_TOO_LARGE} and end(server, "small") == 0


def test_a_batch_with_a_bad_crc_is_corrupt_message(server):
    good = bytearray(batch([(None, b"fine")]))
    good[-1] ^= 0xFF  # a record byte, covered by the CRC
    errors = produce(server, {"plain": {1: bytes(good)}})
    assert errors == {("plain", 1): CORRUPT_MESSAGE} and end(server, "plain", 1) == 0


def test_an_unknown_partition_and_topic(server):
    errors = produce(server, {"plain": {7: batch([(None, b"v")])}, "nowhere": {0: batch([(None, b"v")])}})
    assert errors == {("plain", 7): UNKNOWN_TOPIC_OR_PARTITION, ("nowhere", 0): UNKNOWN_TOPIC_OR_PARTITION}
    assert "nowhere" not in server.store.topics()


def test_one_refused_partition_does_not_stop_the_others(server):
    before = end(server, "plain", 0)
    errors = produce(server, {"plain": {0: batch([(b"a", b"kept"), (b"b", b"kept too")])},
                              "small": {0: batch([(None, b"y" * 5000)])}})
    assert errors == {("plain", 0): NONE, ("small", 0): MESSAGE_TOO_LARGE}
    log = server.store.partition("plain", 0)
    assert [r.value for r in log.iter(start=before)] == [b"kept", b"kept too"]


@pytest.mark.parametrize("version", [3, 5, 7, 8])
def test_every_version_writes_a_valid_batch(server, version):
    before = end(server, "plain", 1)
    assert produce(server, {"plain": {1: batch([(b"v", b"version %d" % version)], codec=1)}}, version) == \
        {("plain", 1): NONE}
    assert [r.value for r in server.store.partition("plain", 1).iter(start=before)] == [b"version %d" % version]


def test_a_stuck_partition_holds_up_no_other(server):
    """Partitions are not served behind one lock: while an append to one partition cannot go
    on (its log held, as by a slow disk), another client's produce to another partition of the
    same topic is answered."""
    stuck = server.store.partition("plain", 0)
    answers = {}
    with stuck._lock:  # the log's own lock: an append to plain-0 waits for it
        first = threading.Thread(target=lambda: answers.update(produce(server, {"plain": {0: batch([(b"k", b"late")])}})))
        first.start()
        first.join(0.5)
        assert first.is_alive() and not answers  # waiting for plain-0
        before = end(server, "plain", 1)
        assert produce(server, {"plain": {1: batch([(b"k", b"on time")])}}) == {("plain", 1): NONE}
        assert [r.value for r in server.store.partition("plain", 1).iter(start=before)] == [b"on time"]
    first.join(10)
    assert answers == {("plain", 0): NONE}


def test_no_batch_or_two_batches_in_a_partition_are_invalid_record_with_a_message(server):
    """Kafka's ProduceRequest.validateRecords: exactly one batch per partition (v3+); a refused
    partition's base offset and log start offset are -1, and v8 says why."""
    before = end(server, "plain", 0)
    two = batch([(None, b"one")]) + batch([(None, b"two")])
    answers = produce_answers(server, {"plain": {0: two, 1: b""}})
    (error0, base0, start0, message0), (error1, base1, start1, message1) = answers["plain", 0], answers["plain", 1]
    assert (error0, base0, start0) == (INVALID_RECORD, -1, -1) and "exactly one" in message0
    assert (error1, base1, start1) == (INVALID_RECORD, -1, -1) and "no record batch" in message1
    assert end(server, "plain", 0) == before
    good = produce_answers(server, {"plain": {0: batch([(None, b"alone")])}})
    assert good["plain", 0] == (NONE, before, 0, None)
