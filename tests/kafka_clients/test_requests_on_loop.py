"""Produce and Fetch requests answered on the server's network loop (``KafkaApis.on_produce``
with ``Log.try_append_idempotent``, ``KafkaApis.on_fetch`` with ``Log.exclusive_if_free``), and
those the loop hands to a worker because they would wait: a log another thread holds, a
partition not open yet, a roll due, several partitions, a transactional or large batch, a
compacted topic, a refused batch, a fetch below the active segment. Every answer is decoded by
kafka-python, in request order, and the records are read back.
"""

from __future__ import annotations

import select
import socket
import threading
import time

import pytest
from kafka.protocol.consumer.fetch import FetchResponse
from kafka.protocol.metadata.api_versions import ApiVersionsRequest, ApiVersionsResponse
from kafka.protocol.metadata.metadata import MetadataResponse
from kafka.protocol.producer.produce import ProduceRequest, ProduceResponse
from kafka.record.memory_records import MemoryRecordsBuilder

from logstore.kafka.server import INLINE_PRODUCE_BYTES, KafkaServer
from logstore.log.log import Log

from .test_pipelining import answers, answers_after, batch, fetch, framed, metadata, produce, server, values_of

__all__ = ["server"]  # (the fixture, shared with test_pipelining)

NONE = 0
CORRUPT_MESSAGE = 2
INVALID_RECORD = 87


@pytest.fixture
def holds(monkeypatch):
    """Each Log.exclusive_if_free entered: (thread name, whether it held the log)."""
    made: list[tuple[str, bool]] = []
    original = Log.exclusive_if_free

    class Spy:
        def __init__(self, inner):
            self.inner = inner

        def __enter__(self):
            held = self.inner.__enter__()
            made.append((threading.current_thread().name, held is not None))
            return held

        def __exit__(self, *exc):
            return self.inner.__exit__(*exc)

    monkeypatch.setattr(Log, "exclusive_if_free", lambda self: Spy(original(self)))
    return made


@pytest.fixture
def tries(monkeypatch):
    """Each try_append_idempotent made: (thread name, whether it appended)."""
    made: list[tuple[str, bool]] = []
    original = Log.try_append_idempotent

    def spy(self, batch, **kw):
        appended = original(self, batch, **kw)
        made.append((threading.current_thread().name, appended is not None))
        return appended

    monkeypatch.setattr(Log, "try_append_idempotent", spy)
    return made


def loop(server):
    """The name of the server's network loop thread."""
    return f"kafka-{server.node_id}-net"


def produced(answer):
    part = answer.responses[0].partition_responses[0]
    return part.error_code, part.base_offset


def test_a_small_produce_to_an_open_log_is_appended_on_the_network_loop(server, tries):
    server.store.create_topic("t")
    server.store.partition("t", 0)  # open
    with socket.create_connection(server.address, timeout=10) as sock:
        for i in range(3):
            [answer] = answers_after(sock, produce("t", b"v%d" % i, acks=1), ProduceResponse, 8, correlation=i)
            assert produced(answer) == (NONE, i)
    assert len(tries) == 3 and all(appended for _, appended in tries)
    assert {name for name, _ in tries} == {loop(server)}
    assert [r.value for r in server.store.partition("t", 0).iter()] == [b"v0", b"v1", b"v2"]


def test_a_produce_to_a_log_another_thread_holds_waits_on_a_worker_not_on_the_loop(server, holds):
    server.store.create_topic("held")
    server.store.create_topic("free")
    log = server.store.partition("held", 0)
    server.store.partition("free", 0)
    with socket.create_connection(server.address, timeout=10) as waiting, \
            socket.create_connection(server.address, timeout=10) as other:
        with log.exclusive():
            waiting.sendall(framed(produce("held", b"late"), 1))
            # The loop still answers everyone else, produces to another log included.
            for i in range(3):
                [answer] = answers_after(other, produce("free", b"%d" % i), ProduceResponse, 8, correlation=10 + i)
                assert produced(answer) == (NONE, i)
            [versions] = answers_after(other, ApiVersionsRequest[0](), ApiVersionsResponse, 0, correlation=20)
            assert versions.error_code == NONE
            assert select.select([waiting], [], [], 0.2)[0] == []  # its append waits for the log
        [answer] = answers(waiting, [(1, ProduceResponse, 8)])
        assert produced(answer) == (NONE, 0)
    assert holds[0] == (loop(server), False)  # tried on the loop, then appended by a worker
    assert [r.value for r in log.iter()] == [b"late"]


def test_a_produce_on_the_loop_wakes_a_long_polling_fetch(server):
    server.store.create_topic("poll")
    server.store.partition("poll", 0)
    with socket.create_connection(server.address, timeout=20) as polling, \
            socket.create_connection(server.address, timeout=20) as producing:
        polling.sendall(framed(fetch("poll", 0, max_wait_ms=10_000), 1))
        time.sleep(0.2)  # the fetch waits in the purgatory
        started = time.monotonic()
        [answer] = answers_after(producing, produce("poll", b"wake", acks=1), ProduceResponse, 8)
        assert produced(answer) == (NONE, 0)
        [woken] = answers(polling, [(1, FetchResponse, 11)])
        assert time.monotonic() - started < 5.0  # woken by the append, not by its 10 s wait
        assert values_of(woken.responses[0].partitions[0].records) == [(0, b"wake")]


def two_partitions(topic, first, second):
    P = ProduceRequest.TopicProduceData.PartitionProduceData
    return ProduceRequest[8](transactional_id=None, acks=-1, timeout_ms=5000, topic_data=[
        ProduceRequest.TopicProduceData(name=topic, partition_data=[P(index=0, records=batch(first)),
                                                                    P(index=1, records=batch(second))])])


def corrupt(message):
    records = bytearray(message.topic_data[0].partition_data[0].records)
    records[-1] ^= 0xFF  # the last record's last byte: the CRC no longer matches
    message.topic_data[0].partition_data[0].records = bytes(records)
    return message


def test_produces_the_loop_cannot_answer_are_answered_by_a_worker_in_request_order(server, tries):
    store = server.store
    store.create_topic("a", 2)
    store.partition("a", 0)
    store.create_topic("unopened")  # its log opens on the worker
    store.create_topic("compacted", cleanup_policy="compact")
    store.partition("compacted", 0)
    big = b"x" * (INLINE_PRODUCE_BYTES + 1)  # over the loop's size: straight to a worker
    plan = [
        (produce("a", b"0"), ProduceResponse, 8),
        (produce("unopened", b"u0"), ProduceResponse, 8),
        (two_partitions("a", b"1", b"p1"), ProduceResponse, 8),
        (corrupt(produce("a", b"bad")), ProduceResponse, 8),
        (produce("compacted", b"keyless"), ProduceResponse, 8),
        (produce("a", big), ProduceResponse, 8),
        (metadata("a"), MetadataResponse, 9),
        (produce("a", b"3"), ProduceResponse, 8),
        (fetch("a", 0), FetchResponse, 11),
    ]
    with socket.create_connection(server.address, timeout=10) as sock:
        sock.sendall(b"".join(framed(message, 100 + i) for i, (message, _, _) in enumerate(plan)))
        got = answers(sock, [(100 + i, cls, version) for i, (_, cls, version) in enumerate(plan)])
    assert produced(got[0]) == (NONE, 0)
    assert produced(got[1]) == (NONE, 0)
    both = got[2].responses[0].partition_responses
    assert [(p.index, p.error_code, p.base_offset) for p in both] == [(0, NONE, 1), (1, NONE, 0)]
    assert produced(got[3]) == (CORRUPT_MESSAGE, -1)
    assert produced(got[4]) == (INVALID_RECORD, -1)
    assert got[4].responses[0].partition_responses[0].record_errors  # the keyless record named
    assert produced(got[5]) == (NONE, 2)
    assert got[6].topics[0].error_code == NONE
    assert produced(got[7]) == (NONE, 3)
    assert [v for _, v in values_of(got[8].responses[0].partitions[0].records)] == [b"0", b"1", big, b"3"]
    assert [r.value for r in store.partition("unopened", 0).iter()] == [b"u0"]
    assert [r.value for r in store.partition("a", 1).iter()] == [b"p1"]
    assert list(store.partition("compacted", 0).iter()) == []
    # The first produce was appended on the loop; the one that could not be (a log to open)
    # took the rest of its burst to a worker (which frames shared a burst depends on the reads).
    assert tries[0] == (loop(server), True)
    assert all(name == loop(server) for name, _ in tries)


def test_an_acks_0_produce_on_the_loop_gets_no_answer_and_is_appended(server):
    server.store.create_topic("quiet")
    server.store.partition("quiet", 0)
    with socket.create_connection(server.address, timeout=10) as sock:
        sock.sendall(framed(produce("quiet", b"silent", acks=0), 1))
        [answer] = answers_after(sock, produce("quiet", b"heard", acks=1), ProduceResponse, 8, correlation=2)
        assert produced(answer) == (NONE, 1)
    assert [r.value for r in server.store.partition("quiet", 0).iter()] == [b"silent", b"heard"]


def test_a_produce_that_needs_a_roll_is_appended_by_a_worker(tmp_path, tries):
    with KafkaServer(str(tmp_path), ("127.0.0.1", 0)) as server:
        server.store.create_topic("small", segment_bytes=1024)
        log = server.store.partition("small", 0)
        with socket.create_connection(server.address, timeout=10) as sock:
            for i in range(12):
                [answer] = answers_after(sock, produce("small", b"%03d" % i + b"v" * 200, acks=1), ProduceResponse,
                                         8, correlation=i)
                assert produced(answer) == (NONE, i)
        assert len(log.segments) >= 3
        assert [r.value[:3] for r in log.iter()] == [b"%03d" % i for i in range(12)]
    assert any(not appended for _, appended in tries)  # each roll: tried on the loop, made by a worker
    assert sum(appended for _, appended in tries) >= 6


def idempotent_batch(producer_id, sequence, value):
    builder = MemoryRecordsBuilder(2, 0, 1 << 20)
    builder.set_producer_state(producer_id, 0, sequence, False)
    builder.append(1_700_000_000_000, None, value, [])
    builder.close()
    return bytes(builder.buffer())


def test_an_idempotent_producers_retry_on_the_loop_is_answered_with_the_first_offsets(server, tries):
    server.store.create_topic("idem")
    server.store.partition("idem", 0)
    P = ProduceRequest.TopicProduceData.PartitionProduceData

    def send(sequence, value):
        return ProduceRequest[8](transactional_id=None, acks=-1, timeout_ms=5000, topic_data=[
            ProduceRequest.TopicProduceData(name="idem", partition_data=[
                P(index=0, records=idempotent_batch(7, sequence, value))])])

    with socket.create_connection(server.address, timeout=10) as sock:
        firsts = [produced(answers_after(sock, send(i, b"r%d" % i), ProduceResponse, 8, correlation=i)[0])
                  for i in range(3)]
        retry = produced(answers_after(sock, send(1, b"r1"), ProduceResponse, 8, correlation=9)[0])
    assert firsts == [(NONE, 0), (NONE, 1), (NONE, 2)]
    assert retry == (NONE, 1)  # a duplicate: not appended again
    assert [r.value for r in server.store.partition("idem", 0).iter()] == [b"r0", b"r1", b"r2"]
    # The first batch loads the producer state (a read: on a worker); the later ones, the retry
    # among them, are checked and appended on the loop.
    assert tries[0] == (loop(server), False)
    assert tries[1:] == [(loop(server), True)] * 3


def test_a_fetch_at_the_tail_is_answered_on_the_loop_and_one_that_would_wait_by_a_worker(server, holds):
    server.store.create_topic("f", segment_bytes=1024)
    log = server.store.partition("f", 0)
    for i in range(12):
        log.append(b"%03d" % i + b"v" * 200)  # several segments: offset 0 is below the active one
    tail = log.active_base_offset
    assert tail > 0
    with socket.create_connection(server.address, timeout=10) as sock:
        [at_tail] = answers_after(sock, fetch("f", tail), FetchResponse, 11, correlation=1)
        assert [o for o, _ in values_of(at_tail.responses[0].partitions[0].records)] == list(range(tail, 12))
        assert holds == [(loop(server), True)]
        [older] = answers_after(sock, fetch("f", 0), FetchResponse, 11, correlation=2)
        assert values_of(older.responses[0].partitions[0].records)[0] == (0, b"000" + b"v" * 200)
        assert holds[1] == (loop(server), True)  # held, then let go: a worker reads the older segments
        with log.exclusive():  # another thread holds the log: the fetch is not answered on the loop
            sock.sendall(framed(fetch("f", tail), 3))
            assert select.select([sock], [], [], 0.2)[0] == []
            [versions] = answers_after(socket.create_connection(server.address, timeout=10), ApiVersionsRequest[0](),
                                       ApiVersionsResponse, 0)
            assert versions.error_code == NONE  # (the loop answers everyone else meanwhile)
        [later] = answers(sock, [(3, FetchResponse, 11)])
        assert values_of(later.responses[0].partitions[0].records)[0][0] == tail
        assert holds[2] == (loop(server), False)


def test_a_fetch_waiting_on_the_loop_is_answered_by_the_next_produce(server, holds):
    server.store.create_topic("w")
    server.store.partition("w", 0)
    with socket.create_connection(server.address, timeout=20) as polling, \
            socket.create_connection(server.address, timeout=20) as producing:
        polling.sendall(framed(fetch("w", 0, max_wait_ms=10_000), 1))
        time.sleep(0.2)
        assert holds == [(loop(server), True)]  # read at once on the loop, then waiting
        started = time.monotonic()
        [answer] = answers_after(producing, produce("w", b"now", acks=1), ProduceResponse, 8)
        assert produced(answer) == (NONE, 0)
        [woken] = answers(polling, [(1, FetchResponse, 11)])
        assert time.monotonic() - started < 5.0
        assert values_of(woken.responses[0].partitions[0].records) == [(0, b"now")]


def test_a_fetch_far_behind_the_log_end_reads_on_a_worker(server, monkeypatch):
    from logstore.kafka.apis import INLINE_FETCH_LAG

    server.store.create_topic("lag")
    log = server.store.partition("lag", 0)
    log.append_batch([b"r%d" % i for i in range(INLINE_FETCH_LAG + 100)])
    readers: list[str] = []
    original = Log.read_region

    def spy(self, *args, **kw):
        readers.append(threading.current_thread().name)
        return original(self, *args, **kw)

    monkeypatch.setattr(Log, "read_region", spy)
    with socket.create_connection(server.address, timeout=10) as sock:
        [behind] = answers_after(sock, fetch("lag", 0), FetchResponse, 11, correlation=1)
        [near] = answers_after(sock, fetch("lag", 150), FetchResponse, 11, correlation=2)
    assert values_of(behind.responses[0].partitions[0].records)[0] == (0, b"r0")
    assert dict(values_of(near.responses[0].partitions[0].records))[150] == b"r150"  # (its whole batch)
    assert readers[0].startswith(loop(server) + "-worker") and readers[1] == loop(server)


def test_a_produce_narrowed_by_the_authorizer_is_still_answered_on_the_loop(tmp_path, tries):
    from logstore.cli import main as cli_main

    with KafkaServer(str(tmp_path), ("127.0.0.1", 0), authorizer=True, sasl_credentials=None,
                     super_users=()) as server:
        for name in ("ok", "no"):
            server.store.create_topic(name)
            server.store.partition(name, 0)
        assert cli_main(["acls", "add", str(tmp_path), "--allow-principal", "User:ANONYMOUS", "--operation", "All",
                         "--topic", "ok"]) == 0
        P = ProduceRequest.TopicProduceData.PartitionProduceData
        both = ProduceRequest[8](transactional_id=None, acks=1, timeout_ms=5000, topic_data=[
            ProduceRequest.TopicProduceData(name=name, partition_data=[P(index=0, records=batch(b"to " + name.encode()))])
            for name in ("ok", "no")])
        with socket.create_connection(server.address, timeout=10) as sock:
            [answer] = answers_after(sock, both, ProduceResponse, 8)
        codes = {t.name: t.partition_responses[0].error_code for t in answer.responses}
        assert codes == {"ok": NONE, "no": 29}  # TOPIC_AUTHORIZATION_FAILED for the denied one
        assert [r.value for r in server.store.partition("ok", 0).iter()] == [b"to ok"]
        assert list(server.store.partition("no", 0).iter()) == []
    assert tries == [(loop(server), True)]  # the allowed part, one partition: appended on the loop
