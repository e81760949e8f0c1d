"""read_committed consumers of three independent Kafka clients against a served store whose log
holds committed, aborted and open transactions (written through the library: transactional
batches and the log's COMMIT/ABORT markers). Each client applies Kafka's rules itself to the
Fetch answers (the last stable offset and the aborted transactions of the range), so what it
returns checks the server's answers, not the server's own codec."""

from __future__ import annotations

import asyncio
import time

import pytest

ck = pytest.importorskip("confluent_kafka")
from confluent_kafka import Consumer, TopicPartition  # noqa: E402

TOPIC = "txns"


def fill(store) -> tuple[list[bytes], list[bytes]]:
    """Write a log with interleaved transactions; return (committed view, uncommitted view)."""
    store.create_topic(TOPIC, 1)
    log = store.partition(TOPIC, 0)
    seq = {1: 0, 2: 0, 3: 0}

    def txn(pid: int, values: list[bytes]) -> None:
        log.append_batch(values, producer_id=pid, producer_epoch=0, base_sequence=seq[pid], transactional=True)
        seq[pid] += len(values)

    log.append(b"plain-0")
    txn(1, [b"c1-a", b"c1-b"])
    txn(2, [b"a2-a"])
    log.append(b"plain-1")
    txn(1, [b"c1-c"])
    log.append_txn_marker(2, 0, commit=False)
    log.append_txn_marker(1, 0, commit=True)
    for i in range(50):  # many small transactions, every third aborted
        txn(2, [b"t%d" % i])
        log.append_txn_marker(2, 0, commit=i % 3 != 0)
    log.append(b"plain-2")
    txn(3, [b"open-a"])                        # open: the LSO stops here
    log.append(b"plain-after-open")
    committed = [b"plain-0", b"c1-a", b"c1-b", b"plain-1", b"c1-c"] + [b"t%d" % i for i in range(50) if i % 3] + \
        [b"plain-2"]
    uncommitted = [r.value for r in log.iter()]
    return committed, uncommitted


def confluent_values(server, isolation: str, count: int) -> list[bytes]:
    c = Consumer({"bootstrap.servers": server.bootstrap_servers, "group.id": "rc", "enable.auto.commit": False,
                  "isolation.level": isolation})
    try:
        c.assign([TopicPartition(TOPIC, 0, 0)])
        out: list[bytes] = []
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and len(out) < count:
            m = c.poll(0.3)
            if m is not None and m.error() is None:
                out.append(m.value())
        idle = time.monotonic() + 1.5  # nothing more may come
        while time.monotonic() < idle:
            m = c.poll(0.2)
            if m is not None and m.error() is None:
                out.append(m.value())
        return out
    finally:
        c.close()


def test_confluent_kafka_read_committed_sees_only_committed_records(kafka_server):
    committed, uncommitted = fill(kafka_server.store)
    assert confluent_values(kafka_server, "read_committed", len(committed)) == committed
    assert confluent_values(kafka_server, "read_uncommitted", len(uncommitted)) == uncommitted


def test_confluent_kafka_read_committed_sees_a_transaction_once_committed(kafka_server):
    committed, _ = fill(kafka_server.store)
    log = kafka_server.store.partition(TOPIC, 0)
    log.append_txn_marker(3, 0, commit=True)
    assert confluent_values(kafka_server, "read_committed", len(committed) + 2) == \
        committed + [b"open-a", b"plain-after-open"]


def test_kafka_python_read_committed(kafka_server):
    kafka = pytest.importorskip("kafka")
    committed, _ = fill(kafka_server.store)
    consumer = kafka.KafkaConsumer(bootstrap_servers=kafka_server.bootstrap_servers, isolation_level="read_committed",
                                   enable_auto_commit=False, consumer_timeout_ms=3000)
    try:
        tp = kafka.TopicPartition(TOPIC, 0)
        consumer.assign([tp])
        consumer.seek(tp, 0)
        got = [m.value for m in consumer]
        assert got == committed
        # The end offset a read_committed consumer sees is the last stable offset.
        assert consumer.end_offsets([tp])[tp] == kafka_server.store.partition(TOPIC, 0).last_stable_offset
    finally:
        consumer.close()


def test_aiokafka_read_committed(kafka_server):
    aiokafka = pytest.importorskip("aiokafka")
    committed, _ = fill(kafka_server.store)

    async def run() -> list[bytes]:
        consumer = aiokafka.AIOKafkaConsumer(bootstrap_servers=kafka_server.bootstrap_servers,
                                             isolation_level="read_committed", enable_auto_commit=False)
        await consumer.start()
        try:
            tp = aiokafka.TopicPartition(TOPIC, 0)
            consumer.assign([tp])
            consumer.seek(tp, 0)
            out: list[bytes] = []
            deadline = time.monotonic() + 15
            while time.monotonic() < deadline:
                batch = await consumer.getmany(timeout_ms=500)
                for messages in batch.values():
                    out.extend(m.value for m in messages)
                if len(out) >= len(committed):
                    batch = await consumer.getmany(timeout_ms=1000)  # nothing more may come
                    for messages in batch.values():
                        out.extend(m.value for m in messages)
                    break
            return out
        finally:
            await consumer.stop()

    assert asyncio.run(run()) == committed
