"""Topic ids (KIP-516) and the newest versions of the core APIs, through real clients:
confluent-kafka (librdkafka 2.16: Metadata v12, Fetch v16 by topic id, Produce v11,
CreateTopics v7, DeleteTopics v6, DescribeCluster, DescribeTopicPartitions, ApiVersions v4),
kafka-python and aiokafka (older versions still negotiated), kcat (librdkafka 2.0). Every id a
client reports is compared with the store's and with the ``partition.metadata`` file."""

from __future__ import annotations

import asyncio
import base64
import json
import shutil
import subprocess
import time
import uuid

import pytest

from logstore.kafka.server import KafkaServer

ck = pytest.importorskip("confluent_kafka")
from confluent_kafka import Consumer, Producer, TopicCollection, TopicPartition  # noqa: E402
from confluent_kafka.admin import AdminClient, NewTopic  # noqa: E402


def _uuid(ck_uuid) -> uuid.UUID:
    """confluent-kafka's Uuid as a uuid.UUID (its base64 text, Kafka's form, decoded here)."""
    return uuid.UUID(bytes=base64.urlsafe_b64decode(str(ck_uuid) + "=="))


def _file_id(server, topic, partition=0) -> uuid.UUID:
    text = (server.store.root + f"/{topic}-{partition}/partition.metadata")
    with open(text) as f:
        lines = f.read().split("\n")
    assert lines[0] == "version: 0"
    return uuid.UUID(bytes=base64.urlsafe_b64decode(lines[1].removeprefix("topic_id: ") + "=="))


def _admin(server):
    return AdminClient({"bootstrap.servers": server.bootstrap_servers})


def _create(admin, topic, partitions=1, **config):
    futures = admin.create_topics([NewTopic(topic, partitions, 1, config=config)], operation_timeout=10)
    futures[topic].result(15)


def _delete(admin, topic):
    admin.delete_topics([topic], operation_timeout=10)[topic].result(15)


# ---------------------------------------------------------------------- confluent-kafka
def test_describe_topics_returns_the_stores_topic_id(kafka_server):
    admin = _admin(kafka_server)
    _create(admin, "ids", 3)
    described = admin.describe_topics(TopicCollection(["ids"]))["ids"].result(15)
    topic_id = _uuid(described.topic_id)
    assert topic_id == kafka_server.store.topic_id("ids") == _file_id(kafka_server, "ids", 2)
    assert topic_id.int != 0
    assert [p.id for p in described.partitions] == [0, 1, 2]
    assert all(p.leader.id == kafka_server.node_id and [r.id for r in p.isr] == [kafka_server.node_id]
               for p in described.partitions)


def test_describe_topics_pages_through_many_partitions(kafka_server):
    """librdkafka asks DescribeTopicPartitions with its page size; a topic of more partitions
    than one page takes several requests (the cursor), all partitions arrive once."""
    admin = AdminClient({"bootstrap.servers": kafka_server.bootstrap_servers})
    kafka_server.store.create_topic("wide", 37)
    kafka_server.store.create_topic("narrow", 2)
    found = admin.describe_topics(TopicCollection(["wide", "narrow"]))
    wide = found["wide"].result(15)
    assert [p.id for p in wide.partitions] == list(range(37))
    assert _uuid(wide.topic_id) == kafka_server.store.topic_id("wide")
    assert _uuid(found["narrow"].result(15).topic_id) == kafka_server.store.topic_id("narrow")


def test_describe_an_unknown_topic_fails(kafka_server):
    admin = _admin(kafka_server)
    with pytest.raises(ck.KafkaException) as info:
        admin.describe_topics(TopicCollection(["missing"]))["missing"].result(15)
    assert info.value.args[0].code() == ck.KafkaError.UNKNOWN_TOPIC_OR_PART


def test_describe_cluster(kafka_server):
    admin = _admin(kafka_server)
    cluster = admin.describe_cluster(request_timeout=10).result(15)
    assert cluster.cluster_id == kafka_server.cluster_id
    assert [(n.id, n.host, n.port) for n in cluster.nodes] == [(kafka_server.node_id, *kafka_server.address)]
    assert cluster.controller.id == kafka_server.node_id
    assert cluster.authorized_operations is None  # not asked for


def test_create_topics_v7_returns_the_id_and_delete_and_recreate_gives_a_new_one(kafka_server):
    admin = _admin(kafka_server)
    _create(admin, "again", 2, **{"retention.ms": "60000"})
    first = kafka_server.store.topic_id("again")
    assert _uuid(admin.describe_topics(TopicCollection(["again"]))["again"].result(15).topic_id) == first
    _delete(admin, "again")
    _create(admin, "again", 1)
    second = kafka_server.store.topic_id("again")
    assert second != first
    assert _uuid(admin.describe_topics(TopicCollection(["again"]))["again"].result(15).topic_id) == second
    assert _file_id(kafka_server, "again") == second


def test_a_consumer_reading_across_a_delete_and_recreate_gets_only_the_new_topics_records(kafka_server):
    """librdkafka 2.16 fetches by topic id (Fetch v13+). After the topic is deleted and created
    again, its fetches by the old id get UNKNOWN_TOPIC_ID; it takes up the new id from Metadata
    and reads the new topic's records, never the old ones."""
    admin = _admin(kafka_server)
    _create(admin, "cycle", 1)
    producer = Producer({"bootstrap.servers": kafka_server.bootstrap_servers, "linger.ms": 1})
    for i in range(5):
        producer.produce("cycle", value=b"old %d" % i)
    assert producer.flush(15) == 0
    consumer = Consumer({"bootstrap.servers": kafka_server.bootstrap_servers, "group.id": "cycle-reader",
                         "auto.offset.reset": "earliest", "enable.auto.commit": False,
                         "topic.metadata.refresh.interval.ms": 500})
    try:
        consumer.subscribe(["cycle"])
        got = []
        deadline = time.monotonic() + 30
        while len(got) < 5 and time.monotonic() < deadline:
            m = consumer.poll(0.5)
            if m is not None and m.error() is None:
                got.append(m.value())
        assert got == [b"old %d" % i for i in range(5)]
        _delete(admin, "cycle")
        _create(admin, "cycle", 1)
        producer2 = Producer({"bootstrap.servers": kafka_server.bootstrap_servers, "linger.ms": 1})
        for i in range(3):
            producer2.produce("cycle", value=b"new %d" % i)
        assert producer2.flush(15) == 0
        new = []
        deadline = time.monotonic() + 60
        while len(new) < 3 and time.monotonic() < deadline:
            m = consumer.poll(0.5)
            if m is not None and m.error() is None:
                new.append(m.value())
        assert new == [b"new %d" % i for i in range(3)]
    finally:
        consumer.close()
    assert [r.value for r in kafka_server.store.partition("cycle", 0).read(0)] == [b"new %d" % i for i in range(3)]


def test_the_newest_versions_are_negotiated(kafka_server):
    """librdkafka's ApiVersions v3+ is answered (no retry with v0), and it uses the newest
    versions of Metadata, Fetch, Produce that both sides have: the server's request metrics
    name what it answered."""
    kafka_server.store.create_topic("newest", 1)
    producer = Producer({"bootstrap.servers": kafka_server.bootstrap_servers, "linger.ms": 1})
    producer.produce("newest", value=b"v")
    assert producer.flush(15) == 0
    consumer = Consumer({"bootstrap.servers": kafka_server.bootstrap_servers, "group.id": "n",
                         "enable.auto.commit": False})
    try:
        consumer.assign([TopicPartition("newest", 0, 0)])
        deadline = time.monotonic() + 15
        m = None
        while m is None and time.monotonic() < deadline:
            m = consumer.poll(0.5)
        assert m is not None and m.error() is None and m.value() == b"v"
    finally:
        consumer.close()
    # librdkafka's debug log names the versions it picked
    logs: list[str] = []
    p = Producer({"bootstrap.servers": kafka_server.bootstrap_servers, "debug": "protocol",
                  "logger": _ListLogger(logs)})
    p.list_topics(timeout=10)
    p.flush(5)
    text = "\n".join(logs)
    assert "ApiVersionRequest (v4" in text or "ApiVersionRequest (v3" in text, text[:2000]
    assert "MetadataRequest (v12" in text, text[:2000]


class _ListLogger:
    """A logging.Logger stand-in librdkafka writes its debug lines to."""

    def __init__(self, out: list[str]) -> None:
        self.out = out

    def log(self, level, fmt, *args):
        self.out.append(fmt % args if args else fmt)


# ---------------------------------------------------------------------- restarts and the replica set
def test_the_id_survives_a_restart(tmp_path):
    server = KafkaServer(str(tmp_path), ("127.0.0.1", 0)).start()
    try:
        admin = _admin(server)
        _create(admin, "kept", 2)
        topic_id = server.store.topic_id("kept")
    finally:
        server.stop()
    server = KafkaServer(str(tmp_path), ("127.0.0.1", 0)).start()
    try:
        admin = _admin(server)
        described = admin.describe_topics(TopicCollection(["kept"]))["kept"].result(15)
        assert _uuid(described.topic_id) == topic_id == _file_id(server, "kept", 1)
    finally:
        server.stop()


# ---------------------------------------------------------------------- kafka-python, aiokafka, kcat
def test_kafka_python_still_negotiates_its_versions(kafka_server):
    kafka = pytest.importorskip("kafka")
    from kafka.admin import KafkaAdminClient, NewTopic as KpNewTopic

    admin = KafkaAdminClient(bootstrap_servers=kafka_server.bootstrap_servers, request_timeout_ms=10000)
    try:
        admin.create_topics([KpNewTopic("kp-topic", 2, 1)])
        described = admin.describe_topics(["kp-topic"])
        assert described[0]["name"] == "kp-topic" and len(described[0]["partitions"]) == 2
        assert described[0]["topic_id"] == str(kafka_server.store.topic_id("kp-topic"))  # Metadata v10+
        cluster = admin.describe_cluster()
        assert cluster["cluster_id"] == kafka_server.cluster_id
        assert [b["broker_id"] for b in cluster["brokers"]] == [kafka_server.node_id]
        admin.delete_topics(["kp-topic"])
    finally:
        admin.close()
    assert "kp-topic" not in kafka_server.store.topics()
    producer = kafka.KafkaProducer(bootstrap_servers=kafka_server.bootstrap_servers)
    producer.send("kp-data", b"x").get(15)
    producer.close()
    consumer = kafka.KafkaConsumer("kp-data", bootstrap_servers=kafka_server.bootstrap_servers,
                                   auto_offset_reset="earliest", consumer_timeout_ms=10000)
    try:
        assert next(consumer).value == b"x"  # (the first record: no wait for the timeout)
    finally:
        consumer.close()


def test_aiokafka_still_negotiates_its_versions(kafka_server):
    aiokafka = pytest.importorskip("aiokafka")
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic as AioNewTopic

    async def run():
        admin = AIOKafkaAdminClient(bootstrap_servers=kafka_server.bootstrap_servers)
        await admin.start()
        try:
            await admin.create_topics([AioNewTopic("aio-topic", 3, 1)])
            described = await admin.describe_topics(["aio-topic"])
            cluster = await admin.describe_cluster()
            await admin.delete_topics(["aio-topic"])
        finally:
            await admin.close()
        producer = aiokafka.AIOKafkaProducer(bootstrap_servers=kafka_server.bootstrap_servers)
        await producer.start()
        try:
            await producer.send_and_wait("aio-data", b"y")
        finally:
            await producer.stop()
        consumer = aiokafka.AIOKafkaConsumer("aio-data", bootstrap_servers=kafka_server.bootstrap_servers,
                                             auto_offset_reset="earliest")
        await consumer.start()
        try:
            message = await asyncio.wait_for(consumer.getone(), 15)
        finally:
            await consumer.stop()
        return described, cluster, message

    described, cluster, message = asyncio.run(run())
    assert len(described[0]["partitions"]) == 3
    assert cluster["cluster_id"] == kafka_server.cluster_id
    assert message.value == b"y"
    assert "aio-topic" not in kafka_server.store.topics()


@pytest.mark.skipif(shutil.which("kcat") is None, reason="kcat is not installed")
def test_kcat_lists_and_reads(kafka_server):
    kafka_server.store.create_topic("kc", 2)
    kafka_server.store.partition("kc", 1).append(b"from the store")
    out = subprocess.run(["kcat", "-b", kafka_server.bootstrap_servers, "-L", "-J"], capture_output=True,
                         text=True, timeout=30, check=True).stdout
    listed = {t["topic"]: len(t["partitions"]) for t in json.loads(out)["topics"]}
    assert listed["kc"] == 2
    out = subprocess.run(["kcat", "-b", kafka_server.bootstrap_servers, "-C", "-t", "kc", "-p", "1", "-o",
                          "beginning", "-c", "1", "-e"], capture_output=True, text=True, timeout=30, check=True).stdout
    assert out.strip() == "from the store"
