"""Large Produce requests (at least wire.PRODUCE_VIEW_BYTES): their records are read as views of
the frame and their frames' buffers reused by the connection (net.server._frame_buffer). Each
refusal still gets Kafka's error code with the connection kept open; many large batches on one
connection, by confluent-kafka (flexible Produce versions), read back whole by kafka-python.
Batches are built by kafka-python's record builder and requests encoded by its protocol
structs (independent of the server's codec)."""

from __future__ import annotations

import socket
import struct

import pytest
from confluent_kafka import Producer
from kafka import KafkaConsumer, TopicPartition
from kafka.protocol.old.produce import ProduceRequest, ProduceResponse

from logstore.kafka.server import KafkaServer
from logstore.kafka.wire import PRODUCE_VIEW_BYTES

from .test_produce_errors import CORRUPT_MESSAGE, INVALID_RECORD, MESSAGE_TOO_LARGE, NONE, batch

BIG = PRODUCE_VIEW_BYTES + 1000


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    s = KafkaServer(str(tmp_path_factory.mktemp("large")), ("127.0.0.1", 0), auto_create_topics=False).start()
    s.store.create_topic("plain", 1)
    s.store.create_topic("small", 1, max_message_bytes=1000)
    s.store.create_topic("keyed", 1, cleanup_policy="compact")
    yield s
    s.stop()


def big_batch(seed, key=b"k", codec=0):
    return batch([(key, bytes([seed % 256]) * BIG)], codec)


def exchange(sock, topics, version, correlation):
    """One Produce request on ``sock`` ({topic: {partition: records}}): {(topic, partition): error}."""
    request = ProduceRequest[version](None, -1, 10_000, [(t, list(parts.items())) for t, parts in topics.items()])
    request.with_header(correlation, "large-test")
    sock.sendall(request.encode(header=True, framed=True))
    size = struct.unpack(">i", sock.recv(4, socket.MSG_WAITALL))[0]
    payload = sock.recv(size, socket.MSG_WAITALL)
    answer = ProduceResponse[version].decode(payload, header=True)
    return {(t, p[0]): p[1] for t, parts in answer.topics for p in parts}


def corrupt(data: bytes) -> bytes:
    bad = bytearray(data)
    bad[-1] ^= 0xFF  # a record byte, covered by the CRC
    return bytes(bad)


def cut(data: bytes) -> bytes:
    return data[:-10]  # the batch's length claims ten bytes more than there are


def magic1(data: bytes) -> bytes:
    bad = bytearray(data)
    bad[16] = 1  # the magic byte: a v1 message set
    return bytes(bad)


REFUSALS = [
    ("plain", lambda: corrupt(big_batch(1)), CORRUPT_MESSAGE),
    ("plain", lambda: cut(big_batch(2)), CORRUPT_MESSAGE),
    ("plain", lambda: big_batch(3) + big_batch(4), INVALID_RECORD),
    ("plain", lambda: magic1(big_batch(5)), INVALID_RECORD),
    ("small", lambda: big_batch(6), MESSAGE_TOO_LARGE),
    ("keyed", lambda: big_batch(7, key=None), INVALID_RECORD),
]


@pytest.mark.parametrize("version", [3, 7, 8])
@pytest.mark.parametrize("topic, records, error", REFUSALS)
def test_a_large_malformed_batch_gets_kafkas_error_and_the_connection_goes_on(server, version, topic, records,
                                                                              error):
    log = server.store.partition(topic, 0)
    before = log.log_end_offset
    with socket.create_connection(server.address, timeout=10) as sock:
        assert exchange(sock, {topic: {0: records()}}, version, 1) == {(topic, 0): error}
        assert log.log_end_offset == before
        # the same connection, its frame buffer now reused: a good batch is written
        assert exchange(sock, {"plain": {0: big_batch(version)}}, version, 2) == {("plain", 0): NONE}
    last = list(server.store.partition("plain", 0).iter(start=server.store.partition("plain", 0).log_end_offset - 1))
    assert [r.value for r in last] == [bytes([version]) * BIG]


def test_many_large_batches_on_one_connection_read_back_whole(server):
    """confluent-kafka (Produce v9+, flexible) sends batches of one large record each, one
    request in flight at a time: every frame after the first reuses a buffer; kafka-python
    reads every value back."""
    server.store.create_topic("many", 1)
    values = [bytes([i % 251]) * (BIG + i * 997) for i in range(40)]
    p = Producer({"bootstrap.servers": server.bootstrap_servers, "linger.ms": 0, "acks": 1,
                  "max.in.flight.requests.per.connection": 1, "message.max.bytes": 4 << 20})
    for value in values:
        p.produce("many", value, partition=0)
        p.poll(0)
    assert p.flush(30) == 0
    c = KafkaConsumer(bootstrap_servers=server.bootstrap_servers, enable_auto_commit=False,
                      max_partition_fetch_bytes=8 << 20, fetch_max_bytes=64 << 20)
    tp = TopicPartition("many", 0)
    c.assign([tp])
    c.seek(tp, 0)
    got: list[bytes] = []
    for _ in range(50):
        got += [m.value for m in c.poll(timeout_ms=1000).get(tp, [])]
        if len(got) >= len(values):
            break
    c.close()
    assert got == values
