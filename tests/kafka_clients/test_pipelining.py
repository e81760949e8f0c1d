"""Pipelined requests (one connection's requests sent before the answers to the earlier ones):
answered in request order, whatever mix of Produce, Fetch, Metadata and ApiVersions, through
raw kafka-python request classes on one socket and through kafka-python's and
confluent-kafka's producers with several requests in flight; a burst of small produces from
several connections at once; a malformed request inside a burst closes only its connection,
after the earlier requests' answers; a long-polling fetch holds up no produce of another
connection. Answers are decoded by kafka-python and records read back by another client.
"""

from __future__ import annotations

import select
import socket
import struct
import threading

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from kafka import KafkaConsumer, KafkaProducer
from kafka import TopicPartition as KafkaTopicPartition
from kafka.protocol.consumer.fetch import FetchRequest, FetchResponse
from kafka.protocol.metadata.api_versions import ApiVersionsRequest, ApiVersionsResponse
from kafka.protocol.metadata.metadata import MetadataRequest, MetadataResponse
from kafka.protocol.producer.produce import ProduceRequest, ProduceResponse
from kafka.record.memory_records import MemoryRecords, MemoryRecordsBuilder

from logstore.kafka.server import KafkaServer

from .test_wire_edges import closed, response

NONE = 0


@pytest.fixture
def server(tmp_path):
    s = KafkaServer(str(tmp_path), ("127.0.0.1", 0)).start()
    yield s
    s.stop()


def batch(*values):
    builder = MemoryRecordsBuilder(2, 0, 1 << 20)
    for value in values:
        builder.append(1_700_000_000_000, None, value, [])
    builder.close()
    return bytes(builder.buffer())


def values_of(records):
    out = []
    batches = MemoryRecords(bytes(records or b""))
    while (b := batches.next_batch()) is not None:
        out += [(record.offset, record.value) for record in b]
    return out


def produce(topic, *values, version=8, acks=-1):
    P = ProduceRequest.TopicProduceData.PartitionProduceData
    return ProduceRequest[version](transactional_id=None, acks=acks, timeout_ms=5000, topic_data=[
        ProduceRequest.TopicProduceData(name=topic, partition_data=[P(index=0, records=batch(*values))])])


def fetch(topic, offset, *, version=11, max_wait_ms=0, min_bytes=1):
    return FetchRequest[version](
        replica_id=-1, max_wait_ms=max_wait_ms, min_bytes=min_bytes, max_bytes=1 << 20, isolation_level=0,
        session_id=0, session_epoch=-1, topics=[FetchRequest.FetchTopic(topic=topic, partitions=[
            FetchRequest.FetchTopic.FetchPartition(partition=0, fetch_offset=offset, partition_max_bytes=1 << 20)])],
        forgotten_topics_data=[], rack_id="")


def metadata(topic, version=9):
    return MetadataRequest[version](topics=[MetadataRequest.MetadataRequestTopic(name=topic)],
                                    allow_auto_topic_creation=False)


def framed(message, correlation):
    message.with_header(correlation, "pipelining")
    return message.encode(header=True, framed=True)


def answers(sock, expected):
    """Read and decode the answers to ``expected`` ((correlation, response class, version) in
    the order sent); each must come in that order."""
    out = []
    for correlation, cls, version in expected:
        answer = cls[version].decode(response(sock), header=True)
        assert answer.header.correlation_id == correlation
        out.append(answer)
    return out


def test_pipelined_produce_fetch_metadata_and_api_versions_are_answered_in_request_order(server):
    server.store.create_topic("mix")
    server.store.create_topic("idle")
    plan = [
        (produce("mix", b"a", b"b"), ProduceResponse, 8),
        (metadata("mix"), MetadataResponse, 9),
        (fetch("mix", 0), FetchResponse, 11),
        (produce("mix", b"c"), ProduceResponse, 8),
        (ApiVersionsRequest[0](), ApiVersionsResponse, 0),  # (answered on the network loop)
        (fetch("idle", 0, max_wait_ms=300), FetchResponse, 11),  # waits: the requests after it wait too
        (produce("mix", b"d"), ProduceResponse, 8),
        (fetch("mix", 2), FetchResponse, 11),
        (metadata("mix", version=1), MetadataResponse, 1),
    ]
    with socket.create_connection(server.address, timeout=10) as sock:
        sock.sendall(b"".join(framed(message, 100 + i) for i, (message, _, _) in enumerate(plan)))
        got = answers(sock, [(100 + i, cls, version) for i, (_, cls, version) in enumerate(plan)])
    produced = [got[i].responses[0].partition_responses[0] for i in (0, 3, 6)]
    assert [(p.error_code, p.base_offset) for p in produced] == [(NONE, 0), (NONE, 2), (NONE, 3)]
    assert got[1].topics[0].name == "mix" and got[1].topics[0].error_code == NONE
    assert values_of(got[2].responses[0].partitions[0].records) == [(0, b"a"), (1, b"b")]  # before "c"
    assert got[4].error_code == NONE
    assert values_of(got[5].responses[0].partitions[0].records) == []
    assert values_of(got[7].responses[0].partitions[0].records) == [(2, b"c"), (3, b"d")]
    assert got[8].topics[0].name == "mix"
    assert [r.value for r in server.store.partition("mix", 0).iter()] == [b"a", b"b", b"c", b"d"]


def test_a_malformed_request_inside_a_burst_closes_only_its_connection_after_the_earlier_answers(server):
    server.store.create_topic("m")
    good = [(metadata("m"), MetadataResponse, 9), (produce("m", b"kept"), ProduceResponse, 8)]
    garbage = struct.pack(">hhih", 0, 8, 102, 4) + b"test" + b"\xff\x07"  # Produce v8, body cut short
    after = framed(produce("m", b"never"), 103)
    with socket.create_connection(server.address, timeout=10) as bad, \
            socket.create_connection(server.address, timeout=10) as other:
        bad.sendall(b"".join(framed(m, 100 + i) for i, (m, _, _) in enumerate(good))
                    + struct.pack(">i", len(garbage)) + garbage + after)
        got = answers(bad, [(100, MetadataResponse, 9), (101, ProduceResponse, 8)])
        assert got[1].responses[0].partition_responses[0].error_code == NONE
        assert closed(bad)
        [still] = answers_after(other, metadata("m"), MetadataResponse, 9)
        assert still.topics[0].error_code == NONE
    assert [r.value for r in server.store.partition("m", 0).iter()] == [b"kept"]


def answers_after(sock, message, cls, version, correlation=7):
    sock.sendall(framed(message, correlation))
    return answers(sock, [(correlation, cls, version)])


def test_a_long_polling_fetch_holds_up_no_produce_on_another_connection(server):
    server.store.create_topic("quiet")
    server.store.create_topic("busy")
    with socket.create_connection(server.address, timeout=20) as polling, \
            socket.create_connection(server.address, timeout=20) as producing:
        polling.sendall(framed(fetch("quiet", 0, max_wait_ms=10_000), 1))
        for i in range(20):
            [answer] = answers_after(producing, produce("busy", b"%d" % i), ProduceResponse, 8, correlation=10 + i)
            assert answer.responses[0].partition_responses[0].base_offset == i
        assert select.select([polling], [], [], 0)[0] == []  # the fetch still waits (for 10 s)
        server.store.partition("quiet", 0).append(b"wake")  # an append answers it at once
        [woken] = answers(polling, [(1, FetchResponse, 11)])
        assert values_of(woken.responses[0].partitions[0].records) == [(0, b"wake")]


@pytest.mark.parametrize("in_flight,idempotent", [(5, True), (100, False)])
def test_confluent_producer_with_many_requests_in_flight_and_linger_0(server, in_flight, idempotent):
    """librdkafka pipelines one-record requests (linger.ms=0): each delivered at the offset of
    its order, read back in that order by kafka-python."""
    server.store.create_topic("lined")
    p = Producer({"bootstrap.servers": server.bootstrap_servers, "linger.ms": 0, "acks": "all",
                  "max.in.flight.requests.per.connection": in_flight, "enable.idempotence": idempotent,
                  "retries": 0 if not idempotent else 2147483647})
    delivered = []
    n = 2000
    for i in range(n):
        p.produce("lined", b"%d" % i, partition=0,
                  on_delivery=lambda err, msg: delivered.append((err, msg.offset(), msg.value())))
        p.poll(0)
    assert p.flush(30) == 0
    assert all(err is None for err, _, _ in delivered)
    assert sorted(offset for _, offset, _ in delivered) == list(range(n))
    assert {offset: value for _, offset, value in delivered} == {i: b"%d" % i for i in range(n)}
    c = KafkaConsumer(bootstrap_servers=server.bootstrap_servers, enable_auto_commit=False)
    try:
        tp = KafkaTopicPartition("lined", 0)
        c.assign([tp])
        c.seek(tp, 0)
        got = []
        for _ in range(60):
            for records in c.poll(timeout_ms=500).values():
                got += [r.value for r in records]
            if len(got) >= n:
                break
    finally:
        c.close()
    assert got == [b"%d" % i for i in range(n)]


def test_kafka_python_producer_with_several_requests_in_flight(server):
    server.store.create_topic("kp")
    p = KafkaProducer(bootstrap_servers=server.bootstrap_servers, linger_ms=0, acks="all",
                      max_in_flight_requests_per_connection=5, retries=0)
    try:
        futures = [p.send("kp", b"%d" % i, partition=0) for i in range(500)]
        p.flush(30)
        offsets = [f.get(10).offset for f in futures]
    finally:
        p.close()
    assert offsets == list(range(500))
    assert confluent_values(server, "kp", 500) == [b"%d" % i for i in range(500)]


def confluent_values(server, topic, n):
    c = Consumer({"bootstrap.servers": server.bootstrap_servers, "group.id": "pipelining",
                  "enable.auto.commit": False})
    try:
        c.assign([TopicPartition(topic, 0, 0)])
        got = []
        for _ in range(60):
            got += [m.value() for m in c.consume(10_000, 0.5) if m.error() is None]
            if len(got) >= n:
                break
    finally:
        c.close()
    return got


def test_a_burst_of_small_produces_from_several_connections(server):
    """Several producers at once, each with one record per request: every record is in the
    log once, each producer's in its own order."""
    server.store.create_topic("many")
    producers, n = 4, 500
    errors = []

    def run(who):
        p = Producer({"bootstrap.servers": server.bootstrap_servers, "linger.ms": 0, "acks": "all",
                      "enable.idempotence": True})
        for i in range(n):
            p.produce("many", b"%d:%d" % (who, i), partition=0,
                      on_delivery=lambda err, msg: errors.append(err) if err is not None else None)
            p.poll(0)
        if p.flush(30):
            errors.append("not all delivered")

    threads = [threading.Thread(target=run, args=(who,)) for who in range(producers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == []
    values = confluent_values(server, "many", producers * n)
    assert len(values) == producers * n
    for who in range(producers):
        mine = [int(v.split(b":")[1]) for v in values if v.startswith(b"%d:" % who)]
        assert mine == list(range(n))
