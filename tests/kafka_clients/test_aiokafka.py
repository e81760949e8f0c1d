"""aiokafka (asyncio; non-flexible protocol versions only) against a served store."""

from __future__ import annotations

import asyncio

import pytest

aiokafka = pytest.importorskip("aiokafka")
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition  # noqa: E402


@pytest.mark.parametrize("codec", [None, "gzip", "snappy", "lz4", "zstd"])
def test_produce_and_consume(kafka_server, codec):
    async def run():
        producer = AIOKafkaProducer(bootstrap_servers=kafka_server.bootstrap_servers, compression_type=codec,
                                    acks="all", enable_idempotence=True)
        await producer.start()
        try:
            sent = [await producer.send_and_wait("aio", key=b"k", value=b"value %d" % i, headers=[("h", b"%d" % i)],
                                                 timestamp_ms=1_700_000_000_000 + i) for i in range(100)]
        finally:
            await producer.stop()
        assert [m.offset for m in sent] == list(range(100))
        consumer = AIOKafkaConsumer(bootstrap_servers=kafka_server.bootstrap_servers, enable_auto_commit=False)
        await consumer.start()
        try:
            tp = TopicPartition("aio", 0)
            consumer.assign([tp])
            consumer.seek(tp, 0)
            got = []
            while len(got) < 100:
                batch = await asyncio.wait_for(consumer.getmany(tp, timeout_ms=500), 15)
                got.extend(batch.get(tp, []))
            return got
        finally:
            await consumer.stop()

    got = asyncio.run(run())
    assert [(m.offset, m.key, m.value, list(m.headers), m.timestamp) for m in got] == \
        [(i, b"k", b"value %d" % i, [("h", b"%d" % i)], 1_700_000_000_000 + i) for i in range(100)]
    assert [r.value for r in kafka_server.store.partition("aio", 0).iter()] == [b"value %d" % i for i in range(100)]


def test_a_group_consumer_commits_what_the_library_reads(kafka_server):
    store = kafka_server.store
    store.create_topic("aio-group", 3)
    for p in range(3):
        store.partition("aio-group", p).append_batch([b"%d-%d" % (p, i) for i in range(4)])

    async def run():
        consumer = AIOKafkaConsumer("aio-group", bootstrap_servers=kafka_server.bootstrap_servers, group_id="aio",
                                    enable_auto_commit=False, auto_offset_reset="earliest", session_timeout_ms=6000,
                                    heartbeat_interval_ms=200)
        await consumer.start()
        try:
            got = []
            while len(got) < 12:
                batch = await asyncio.wait_for(consumer.getmany(timeout_ms=500), 20)
                got += [r.value for records in batch.values() for r in records]
            await consumer.commit()
            return got, {tp.partition for tp in consumer.assignment()}
        finally:
            await consumer.stop()

    got, assigned = asyncio.run(run())
    assert sorted(got) == sorted(b"%d-%d" % (p, i) for p in range(3) for i in range(4)) and assigned == {0, 1, 2}
    library = store.consumer("aio", ["aio-group"])
    assert [library.committed("aio-group", p) for p in range(3)] == [4, 4, 4]
    library.close()
