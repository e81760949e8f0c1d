"""aiokafka (asyncio; non-flexible protocol versions only) against a served store: produce with every
acks setting and codec, consume by assignment, offsets for times, admin create/describe/delete."""

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


@pytest.mark.parametrize("acks", [0, 1])
def test_plain_produce_with_acks_0_and_1(kafka_server, acks):
    """Not idempotent: acks=0 gets no answer (aiokafka resolves each send to None) but the records
    arrive; acks=1 reports the offsets. Keys, headers and timestamps are stored as sent."""
    topic = f"aio-acks-{acks}"
    kafka_server.store.create_topic(topic, 1)

    async def run():
        producer = AIOKafkaProducer(bootstrap_servers=kafka_server.bootstrap_servers, acks=acks,
                                    enable_idempotence=False, linger_ms=5)
        await producer.start()
        try:
            futures = [await producer.send(topic, key=b"k%d" % i, value=b"v%d" % i, headers=[("h", b"%d" % i)],
                                           timestamp_ms=1_600_000_000_000 + i) for i in range(40)]
            return await asyncio.wait_for(asyncio.gather(*futures), 15)
        finally:
            await producer.stop()

    sent = asyncio.run(run())
    if acks == 0:
        assert sent == [None] * 40
    else:
        assert [(m.topic, m.partition, m.offset) for m in sent] == [(topic, 0, i) for i in range(40)]
    log = kafka_server.store.partition(topic, 0)
    assert log.wait_for_append(39, timeout=10)  # acks=0: sent is not yet stored
    assert [(r.offset, r.key, r.value, r.timestamp, list(r.headers)) for r in log.iter()] == \
        [(i, b"k%d" % i, b"v%d" % i, 1_600_000_000_000 + i, [("h", b"%d" % i)]) for i in range(40)]


def test_offsets_for_times_and_beginning_and_end_offsets(kafka_server):
    kafka_server.store.create_topic("aio-timed", 2)

    async def run():
        producer = AIOKafkaProducer(bootstrap_servers=kafka_server.bootstrap_servers)
        await producer.start()
        try:
            for i in range(20):
                await producer.send("aio-timed", value=b"%d" % i, partition=1, timestamp_ms=1_000_000 + i * 1000)
            await producer.flush()
        finally:
            await producer.stop()
        kafka_server.store.partition("aio-timed", 1).delete_records_before(3)
        consumer = AIOKafkaConsumer(bootstrap_servers=kafka_server.bootstrap_servers, enable_auto_commit=False)
        await consumer.start()
        try:
            tp0, tp1 = TopicPartition("aio-timed", 0), TopicPartition("aio-timed", 1)
            return (await consumer.offsets_for_times({tp0: 1_000_000, tp1: 1_007_500}),
                    await consumer.offsets_for_times({tp1: 1_000_000}),
                    await consumer.offsets_for_times({tp1: 10**13}),
                    await consumer.beginning_offsets([tp0, tp1]), await consumer.end_offsets([tp0, tp1]))
        finally:
            await consumer.stop()

    found, before_start, too_late, beginning, end = asyncio.run(run())
    tp0, tp1 = TopicPartition("aio-timed", 0), TopicPartition("aio-timed", 1)
    # The first record at or after the time, with that record's own timestamp (not the one asked).
    assert found == {tp0: None, tp1: (8, 1_008_000)}
    assert before_start == {tp1: (3, 1_003_000)}  # only records from the log start count
    assert too_late == {tp1: None}
    assert (beginning, end) == ({tp0: 0, tp1: 3}, {tp0: 0, tp1: 20})


def test_admin_creates_describes_and_deletes_topics_with_kafkas_errors(kafka_server):
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic
    from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
    from aiokafka.errors import TopicAlreadyExistsError, UnknownTopicOrPartitionError

    async def run():
        admin = AIOKafkaAdminClient(bootstrap_servers=kafka_server.bootstrap_servers, request_timeout_ms=10_000)
        await admin.start()
        try:
            created = await admin.create_topics([NewTopic("aio-admin", 3, 1, topic_configs={
                "cleanup.policy": "compact", "retention.ms": "1234"})])
            assert kafka_server.store.partitions_for("aio-admin") == 3
            again = await admin.create_topics([NewTopic("aio-admin", 1, 1)])
            assert kafka_server.store.partitions_for("aio-admin") == 3  # unchanged by the refused request
            described = await admin.describe_topics(["aio-admin"])
            (configs,) = await admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, "aio-admin")])
            (some,) = await admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, "aio-admin",
                                                                   {"retention.ms": None})])
            (missing,) = await admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, "no-such-topic")])
            deleted = await admin.delete_topics(["aio-admin"])
            unknown = await admin.delete_topics(["aio-admin"])
            return created, again, described, configs, some, missing, deleted, unknown
        finally:
            await admin.close()

    created, again, described, configs, some, missing, deleted, unknown = asyncio.run(run())
    assert [(t["topic"], t["error_code"]) for t in created.to_object()["topic_errors"]] == [("aio-admin", 0)]
    ((topic, code, message),) = again.topic_errors
    assert (topic, code, aiokafka.errors.for_code(code)) == ("aio-admin", 36, TopicAlreadyExistsError) and message
    (topic_meta,) = described
    assert (topic_meta["error_code"], topic_meta["topic"]) == (0, "aio-admin")
    assert [(p["partition"], p["leader"], p["replicas"], p["isr"]) for p in topic_meta["partitions"]] == \
        [(i, 0, [0], [0]) for i in range(3)]
    (resource,) = configs.to_object()["resources"]
    assert (resource["error_code"], resource["resource_type"], resource["resource_name"]) == (0, 2, "aio-admin")
    entries = {e["config_names"]: e for e in resource["config_entries"]}
    assert (entries["cleanup.policy"]["config_value"], entries["cleanup.policy"]["config_source"]) == ("compact", 1)
    assert (entries["retention.ms"]["config_value"], entries["retention.ms"]["config_source"]) == ("1234", 1)
    assert (entries["segment.bytes"]["config_value"], entries["segment.bytes"]["config_source"]) == ("1073741824", 5)
    assert [(e["config_names"], e["config_value"]) for e in some.to_object()["resources"][0]["config_entries"]] == \
        [("retention.ms", "1234")]  # only the names asked for
    assert missing.to_object()["resources"][0]["error_code"] == 3  # UNKNOWN_TOPIC_OR_PARTITION
    assert [tuple(t) for t in deleted.topic_error_codes] == [("aio-admin", 0)]
    ((topic, code),) = unknown.topic_error_codes
    assert (topic, aiokafka.errors.for_code(code)) == ("aio-admin", UnknownTopicOrPartitionError)
    assert "aio-admin" not in kafka_server.store.topics()
