"""aiokafka (asyncio; non-flexible protocol versions only) against a served store."""

from __future__ import annotations

import asyncio

import pytest

aiokafka = pytest.importorskip("aiokafka")
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition  # noqa: E402


@pytest.mark.parametrize("codec", [None, "gzip", "zstd"])
def test_produce_and_consume(kafka_server, codec):
    async def run():
        producer = AIOKafkaProducer(bootstrap_servers=kafka_server.bootstrap_servers, compression_type=codec,
                                    acks="all", enable_idempotence=True)
        await producer.start()
        try:
            sent = [await producer.send_and_wait("aio", key=b"k", value=b"value %d" % i) for i in range(100)]
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
    assert [(m.offset, m.key, m.value) for m in got] == [(i, b"k", b"value %d" % i) for i in range(100)]
    assert [r.value for r in kafka_server.store.partition("aio", 0).iter()] == [b"value %d" % i for i in range(100)]
