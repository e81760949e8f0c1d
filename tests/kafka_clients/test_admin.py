"""Kafka's admin operations against a served store, through real admin clients: CreatePartitions,
AlterConfigs, IncrementalAlterConfigs, DeleteRecords, DescribeLogDirs, ListOffsets v7/v8 and
DescribeProducers, by confluent-kafka's AdminClient, kafka-python's KafkaAdminClient, aiokafka's
AIOKafkaAdminClient and kcat; each result read back through another client or the store, and
after a restart. Bad input gets Kafka's errors. Also: a batch in a codec the server cannot
decode gets UNSUPPORTED_COMPRESSION_TYPE (never a closed connection), and Fetch's overall
``max_bytes`` (KIP-74) bounds the first partition after its first batch."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import time
import warnings

import pytest

ck = pytest.importorskip("confluent_kafka")
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition  # noqa: E402
from confluent_kafka.admin import (  # noqa: E402
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ConfigSource,
    NewPartitions,
    NewTopic,
    OffsetSpec,
)

from logstore.kafka.server import KafkaServer  # noqa: E402
from logstore.records import compression  # noqa: E402

from .test_wire_edges import response  # noqa: E402
from .test_wire_requests import connect, exchange  # noqa: E402

KCAT = shutil.which("kcat") or shutil.which("kafkacat")

# Kafka's error codes (org.apache.kafka.common.protocol.Errors), written out here on purpose.
NONE = 0
OFFSET_OUT_OF_RANGE = 1
UNKNOWN_TOPIC_OR_PARTITION = 3
UNSUPPORTED_VERSION = 35
INVALID_PARTITIONS = 37
INVALID_REPLICA_ASSIGNMENT = 39
INVALID_CONFIG = 40
INVALID_REQUEST = 42
POLICY_VIOLATION = 44
UNSUPPORTED_COMPRESSION_TYPE = 76


@pytest.fixture
def server(tmp_path):
    s = KafkaServer(str(tmp_path), ("127.0.0.1", 0)).start()
    yield s
    s.stop()


def admin(server):
    return AdminClient({"bootstrap.servers": server.bootstrap_servers})


def restarted(server):
    """Stop ``server`` and serve its directory again (a new process's view: everything read
    back from disk)."""
    root = server.store.root
    server.stop()
    return KafkaServer(root, ("127.0.0.1", 0)).start()


def results(futures):
    """{key: result or the KafkaError} of an admin call's futures."""
    out = {}
    for key, future in futures.items():
        try:
            out[key] = future.result(timeout=20)
        except KafkaException as exc:
            out[key] = exc.args[0]
    return out


def produce(server, topic, values, partition, timestamps=None):
    p = Producer({"bootstrap.servers": server.bootstrap_servers, "linger.ms": 0})
    for i, value in enumerate(values):
        p.produce(topic, value, partition=partition, timestamp=(timestamps[i] if timestamps else 0))
    assert p.flush(20) == 0


def consume(server, topic, partition, start, count, timeout_s=20.0):
    """kafka-python reads ``count`` records of one partition from ``start``: [(offset, value)]."""
    from kafka import KafkaConsumer
    from kafka import TopicPartition as KTP

    c = KafkaConsumer(bootstrap_servers=server.bootstrap_servers, enable_auto_commit=False)
    try:
        tp = KTP(topic, partition)
        c.assign([tp])
        c.seek(tp, start)
        out = []
        deadline = time.monotonic() + timeout_s
        while len(out) < count and time.monotonic() < deadline:
            for records in c.poll(500).values():
                out.extend((r.offset, r.value) for r in records)
        return out
    finally:
        c.close()


# ---------------------------------------------------------------------------- CreatePartitions
def test_create_partitions_adds_empty_partitions_that_clients_write_and_read_across_a_restart(server):
    a = admin(server)
    assert results(a.create_topics([NewTopic("grow", 2)]))["grow"] is None
    produce(server, "grow", [b"old-0", b"old-1"], partition=1)
    assert results(a.create_partitions([NewPartitions("grow", 5)]))["grow"] is None

    # kafka-python's metadata and confluent's both see five partitions; the new ones are empty
    from kafka import KafkaConsumer
    probe = KafkaConsumer(bootstrap_servers=server.bootstrap_servers)
    assert probe.partitions_for_topic("grow") == {0, 1, 2, 3, 4}
    probe.close()
    assert len(a.list_topics(timeout=10).topics["grow"].partitions) == 5
    assert server.store.partition("grow", 4).log_end_offset == 0
    produce(server, "grow", [b"new-0", b"new-1", b"new-2"], partition=4)
    assert consume(server, "grow", 4, 0, 3) == [(0, b"new-0"), (1, b"new-1"), (2, b"new-2")]

    server = restarted(server)
    try:
        assert server.store.partitions_for("grow") == 5
        assert [r.value for r in server.store.partition("grow", 4).iter()] == [b"new-0", b"new-1", b"new-2"]
        assert [r.value for r in server.store.partition("grow", 1).iter()] == [b"old-0", b"old-1"]
        if KCAT is not None:  # a third client reads the new partition after the restart
            out = subprocess.run([KCAT, "-b", server.bootstrap_servers, "-C", "-t", "grow", "-p", "4", "-o",
                                  "beginning", "-e", "-q"], capture_output=True, timeout=30)
            assert out.returncode == 0, out.stderr
            assert out.stdout.decode().split() == ["new-0", "new-1", "new-2"]
    finally:
        server.stop()


def test_create_partitions_refuses_as_kafka_does(server):
    a = admin(server)
    server.store.create_topic("fixed", 3)
    got = results(a.create_partitions([NewPartitions("fixed", 2)]))["fixed"]
    assert got.code() == INVALID_PARTITIONS and "higher than the requested 2" in got.str()
    assert results(a.create_partitions([NewPartitions("fixed", 3)]))["fixed"].code() == INVALID_PARTITIONS
    assert results(a.create_partitions([NewPartitions("missing", 3)]))["missing"].code() == UNKNOWN_TOPIC_OR_PARTITION
    other_broker = results(a.create_partitions([NewPartitions("fixed", 4, replica_assignment=[[7]])]))["fixed"]
    assert other_broker.code() == INVALID_REPLICA_ASSIGNMENT
    short = results(a.create_partitions([NewPartitions("fixed", 5, replica_assignment=[[0]])]))["fixed"]
    assert short.code() == INVALID_REPLICA_ASSIGNMENT
    assert results(a.create_partitions([NewPartitions("fixed", 6)], validate_only=True))["fixed"] is None
    assert server.store.partitions_for("fixed") == 3  # nothing of the above changed the topic
    mine = results(a.create_partitions([NewPartitions("fixed", 5, replica_assignment=[[0], [0]])]))["fixed"]
    assert mine is None and server.store.partitions_for("fixed") == 5


def test_create_partitions_with_a_topic_twice_in_one_request_is_invalid_request(server):
    """Encoded and decoded by kafka-python's protocol classes (no client sends this)."""
    from kafka.protocol.admin.topics import CreatePartitionsRequest, CreatePartitionsResponse

    server.store.create_topic("twice", 1)
    T = CreatePartitionsRequest.CreatePartitionsTopic
    ask = CreatePartitionsRequest[3](topics=[T(name="twice", count=2, assignments=None),
                                             T(name="twice", count=3, assignments=None)],
                                     timeout_ms=5000, validate_only=False)
    answer = exchange(server, ask, CreatePartitionsResponse)
    assert [(r.name, r.error_code) for r in answer.results] == [("twice", INVALID_REQUEST)] * 2
    assert server.store.partitions_for("twice") == 1


def test_kafka_python_and_aiokafka_create_partitions(server):
    from kafka import KafkaAdminClient

    server.store.create_topic("kp", 1)
    kp = KafkaAdminClient(bootstrap_servers=server.bootstrap_servers, request_timeout_ms=10_000)
    try:
        kp.create_partitions({"kp": 3})
    finally:
        kp.close()
    assert server.store.partitions_for("kp") == 3

    from aiokafka.admin import AIOKafkaAdminClient, NewPartitions as AioNewPartitions
    from aiokafka.errors import InvalidPartitionsError

    async def grow():
        client = AIOKafkaAdminClient(bootstrap_servers=server.bootstrap_servers)
        await client.start()
        try:
            await client.create_partitions({"kp": AioNewPartitions(4)})
            with pytest.raises(InvalidPartitionsError):
                await client.create_partitions({"kp": AioNewPartitions(2)})
        finally:
            await client.close()

    asyncio.run(grow())
    assert server.store.partitions_for("kp") == 4
    produce(server, "kp", [b"via-confluent"], partition=3)
    assert consume(server, "kp", 3, 0, 1) == [(0, b"via-confluent")]


def test_a_library_producer_picks_up_new_partitions(server):
    """The store's Producer with a partitioner: partitions added by an admin client are chosen
    once the producer looks at the topic again (as Kafka's on its metadata refresh)."""
    server.store.create_topic("spread", 1)
    chosen = []

    def partitioner(key, partitions, topic):
        chosen.append(partitions)
        return partitions - 1

    producer = server.store.producer(partitioner=partitioner)
    try:
        producer.send("spread", b"before").result(10)
        a = admin(server)
        assert results(a.create_partitions([NewPartitions("spread", 3)]))["spread"] is None
        meta = producer.send("spread", b"after").result(10)
        assert chosen == [1, 3] and meta.partition == 2
    finally:
        producer.close()
    assert consume(server, "spread", 2, 0, 1) == [(0, b"after")]


# ---------------------------------------------------------------------------- configs
def described(server, topic):
    a = admin(server)
    [future] = a.describe_configs([ConfigResource("topic", topic)]).values()
    return future.result(timeout=20)


def test_incremental_alter_configs_sets_deletes_appends_and_subtracts_and_open_logs_apply_them(server):
    store = server.store
    store.create_topic("tuned", 1, retention_ms=100_000)
    log = store.partition("tuned", 0)
    a = admin(server)
    r = ConfigResource("topic", "tuned", incremental_configs=[
        ConfigEntry("max.message.bytes", "2000", incremental_operation=AlterConfigOpType.SET),
        ConfigEntry("retention.ms", None, incremental_operation=AlterConfigOpType.DELETE),
        ConfigEntry("cleanup.policy", "compact", incremental_operation=AlterConfigOpType.APPEND)])
    assert results(a.incremental_alter_configs([r]))[r] is None
    # the open log took them at once: a batch over the new max.message.bytes is refused
    assert (log.config.max_message_bytes, log.config.retention_ms, log.config.cleanup_policy) == \
        (2000, 604800000, "compact,delete")
    p = Producer({"bootstrap.servers": server.bootstrap_servers, "linger.ms": 0, "message.max.bytes": 100_000})
    errors = []
    p.produce("tuned", b"x" * 5000, key=b"k", on_delivery=lambda err, msg: errors.append(err))
    p.flush(20)
    assert errors[0] is not None and errors[0].code() == KafkaError.MSG_SIZE_TOO_LARGE
    entries = described(server, "tuned")
    assert entries["max.message.bytes"].value == "2000"
    assert entries["max.message.bytes"].source == ConfigSource.DYNAMIC_TOPIC_CONFIG.value
    assert entries["retention.ms"].source == ConfigSource.DEFAULT_CONFIG.value
    assert entries["cleanup.policy"].value == "compact,delete"

    r = ConfigResource("topic", "tuned", incremental_configs=[
        ConfigEntry("cleanup.policy", "delete", incremental_operation=AlterConfigOpType.SUBTRACT)])
    assert results(a.incremental_alter_configs([r]))[r] is None
    assert log.config.cleanup_policy == "compact"

    server = restarted(server)
    try:
        entries = described(server, "tuned")
        assert (entries["cleanup.policy"].value, entries["max.message.bytes"].value) == ("compact", "2000")
        assert server.store.partition("tuned", 0).config.max_message_bytes == 2000
    finally:
        server.stop()


@pytest.mark.regression
def test_lowering_max_message_bytes_keeps_larger_batches_already_written_readable(server):
    """Kafka applies max.message.bytes to new appends only: a batch written under the old limit
    is still fetched (it was read as corrupt: the reads checked it against the new limit)."""
    a = admin(server)
    assert results(a.create_topics([NewTopic("shrunk", 1)]))["shrunk"] is None
    p = Producer({"bootstrap.servers": server.bootstrap_servers, "linger.ms": 0, "message.max.bytes": 1_000_000})
    p.produce("shrunk", b"x" * 200_000, partition=0)
    p.produce("shrunk", b"small", partition=0)
    assert p.flush(20) == 0
    r = ConfigResource("topic", "shrunk", incremental_configs=[
        ConfigEntry("max.message.bytes", "100000", incremental_operation=AlterConfigOpType.SET)])
    assert results(a.incremental_alter_configs([r]))[r] is None
    assert server.store.partition("shrunk", 0).config.max_message_bytes == 100_000
    assert [(o, len(v)) for o, v in consume(server, "shrunk", 0, 0, 2)] == [(0, 200_000), (1, 5)]
    assert [(o, len(v)) for o, v in consume(server, "shrunk", 0, 1, 1)] == [(1, 5)]
    server = restarted(server)
    try:
        assert [(o, len(v)) for o, v in consume(server, "shrunk", 0, 0, 2)] == [(0, 200_000), (1, 5)]
        assert [len(r.value) for r in server.store.partition("shrunk", 0).read(0)] == [200_000, 5]
    finally:
        server.stop()

def test_alter_configs_replaces_the_whole_set_of_overrides(server):
    server.store.create_topic("whole", 1, retention_ms=100_000, segment_ms=200_000)
    a = admin(server)
    r = ConfigResource("topic", "whole", set_config={"retention.bytes": "123456"})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # (confluent prefers the incremental call)
        assert results(a.alter_configs([r]))[r] is None
    assert server.store.describe("whole").overrides == {"retention.bytes": "123456"}
    assert server.store.partition("whole", 0).config.segment_ms == 604800000

    from kafka import KafkaAdminClient
    from kafka.admin import ConfigResource as KConfigResource
    kp = KafkaAdminClient(bootstrap_servers=server.bootstrap_servers, request_timeout_ms=10_000)
    try:
        kp.alter_configs([KConfigResource("TOPIC", "whole", configs={"segment.ms": "300000"})], incremental=False)
    finally:
        kp.close()
    # kafka-python sends the other overrides it described along (AlterConfigs replaces the set)
    assert server.store.describe("whole").overrides == {"retention.bytes": "123456", "segment.ms": "300000"}

    from aiokafka.admin import AIOKafkaAdminClient
    from aiokafka.admin.config_resource import ConfigResource as AConfigResource, ConfigResourceType

    async def alter():
        client = AIOKafkaAdminClient(bootstrap_servers=server.bootstrap_servers)
        await client.start()
        try:
            [answer] = await client.alter_configs([AConfigResource(ConfigResourceType.TOPIC, "whole",
                                                                   configs={"flush.messages": "10"})])
            return [tuple(r)[:2] for r in answer.resources]
        finally:
            await client.close()

    assert asyncio.run(alter()) == [(NONE, None)]
    assert server.store.describe("whole").overrides == {"flush.messages": "10"}
    assert described(server, "whole")["flush.messages"].value == "10"


def test_alter_configs_refuses_bad_input_and_validate_only_changes_nothing(server):
    server.store.create_topic("strict", 1)
    a = admin(server)

    def incremental(name, value, op=AlterConfigOpType.SET, topic="strict", validate_only=False):
        r = ConfigResource("topic", topic, incremental_configs=[ConfigEntry(name, value, incremental_operation=op)])
        return results(a.incremental_alter_configs([r], validate_only=validate_only))[r]

    unknown = incremental("no.such.config", "1")
    assert unknown.code() == INVALID_CONFIG and "no.such.config" in unknown.str()
    bad = incremental("segment.bytes", "10")
    assert bad.code() == INVALID_CONFIG and "segment" in bad.str()
    assert incremental("retention.ms", "1", op=AlterConfigOpType.APPEND).code() == INVALID_CONFIG
    assert incremental("retention.ms", "1", topic="missing").code() == UNKNOWN_TOPIC_OR_PARTITION
    assert incremental("retention.ms", "5000", validate_only=True) is None
    assert server.store.describe("strict").overrides == {}

    broker = ConfigResource("broker", "0", incremental_configs=[
        ConfigEntry("num.partitions", "3", incremental_operation=AlterConfigOpType.SET)])
    refused = results(a.incremental_alter_configs([broker]))[broker]
    assert refused.code() == INVALID_CONFIG and "num.partitions" in refused.str()  # fixed at start: read-only
    broker = ConfigResource("broker", "0", incremental_configs=[
        ConfigEntry("no.such.broker.config", "3", incremental_operation=AlterConfigOpType.SET)])
    assert results(a.incremental_alter_configs([broker]))[broker].code() == INVALID_CONFIG
    broker = ConfigResource("broker", "0", incremental_configs=[
        ConfigEntry("log.segment.bytes", "7", incremental_operation=AlterConfigOpType.SET)])
    assert results(a.incremental_alter_configs([broker]))[broker].code() == INVALID_CONFIG
    assert server.store.dynamic_defaults == {}


def test_the_brokers_dynamic_configs_are_the_defaults_of_every_topic_and_survive_a_restart(server):
    """Kafka's dynamic broker configs (log.retention.ms, message.max.bytes, ...) are the store's
    dynamic defaults: a topic without its own setting takes them at once (its open log too), a
    topic with one keeps it; DescribeConfigs shows the source; a fixed setting is read-only."""
    store = server.store
    store.create_topic("plain", 1)
    store.create_topic("own", 1, retention_ms=42_000)
    log = store.partition("plain", 0)
    a = admin(server)
    broker = ConfigResource("broker", "0", incremental_configs=[
        ConfigEntry("log.retention.ms", "3600000", incremental_operation=AlterConfigOpType.SET),
        ConfigEntry("message.max.bytes", "5000", incremental_operation=AlterConfigOpType.SET)])
    assert results(a.incremental_alter_configs([broker]))[broker] is None
    assert (log.config.retention_ms, log.config.max_message_bytes) == (3_600_000, 5000)
    assert store.partition("own", 0).config.retention_ms == 42_000
    plain = described(server, "plain")
    assert (plain["retention.ms"].value, plain["retention.ms"].source) == \
        ("3600000", ConfigSource.DYNAMIC_BROKER_CONFIG.value)
    assert described(server, "own")["retention.ms"].source == ConfigSource.DYNAMIC_TOPIC_CONFIG.value
    whole = ConfigResource("broker", "0")
    [future] = a.describe_configs([whole]).values()
    entries = future.result(timeout=20)
    assert (entries["log.retention.ms"].value, entries["log.retention.ms"].source) == \
        ("3600000", ConfigSource.DYNAMIC_BROKER_CONFIG.value)
    assert entries["log.segment.bytes"].source == ConfigSource.DEFAULT_CONFIG.value
    assert not entries["log.retention.ms"].is_read_only and entries["num.partitions"].is_read_only

    # kafka-python reads the same, and deletes one (the topic's default falls back to Kafka's)
    from kafka import KafkaAdminClient
    from kafka.admin import ConfigResource as KConfigResource
    kp = KafkaAdminClient(bootstrap_servers=server.bootstrap_servers, request_timeout_ms=10_000)
    try:
        kp.alter_configs([KConfigResource("BROKER", "0", configs={"message.max.bytes": ("DELETE", None)})],
                         raise_on_unknown=False)
    finally:
        kp.close()
    assert store.dynamic_defaults == {"retention.ms": "3600000"} and log.config.max_message_bytes == 1048588

    server = restarted(server)
    try:
        assert server.store.partition("plain", 0).config.retention_ms == 3_600_000
        assert described(server, "plain")["retention.ms"].source == ConfigSource.DYNAMIC_BROKER_CONFIG.value
    finally:
        server.stop()


# ---------------------------------------------------------------------------- DeleteRecords
def test_delete_records_moves_the_log_start_for_every_client_and_survives_a_restart(server):
    server.store.create_topic("trim", 2)
    produce(server, "trim", [b"v%d" % i for i in range(10)], partition=0)
    produce(server, "trim", [b"w%d" % i for i in range(4)], partition=1)
    a = admin(server)
    got = results(a.delete_records([TopicPartition("trim", 0, 6)]))
    [(tp, deleted)] = got.items()
    assert deleted.low_watermark == 6
    # -1 means the high watermark
    [(_, to_end)] = results(a.delete_records([TopicPartition("trim", 1, -1)])).items()
    assert to_end.low_watermark == 4

    # another client's fetch from the new log start, and from below it
    assert consume(server, "trim", 0, 6, 4) == [(i, b"v%d" % i) for i in range(6, 10)]
    c = Consumer({"bootstrap.servers": server.bootstrap_servers, "group.id": "trim", "auto.offset.reset": "error"})
    try:
        c.assign([TopicPartition("trim", 0, 2)])
        message = c.poll(10)
        assert message is not None and message.error() is not None
        assert message.error().code() == KafkaError._AUTO_OFFSET_RESET
    finally:
        c.close()
    earliest = results(a.list_offsets({TopicPartition("trim", 0): OffsetSpec.earliest()}))
    assert [r.offset for r in earliest.values()] == [6]

    from kafka import KafkaAdminClient
    from kafka import TopicPartition as KTP
    kp = KafkaAdminClient(bootstrap_servers=server.bootstrap_servers, request_timeout_ms=10_000)
    try:
        answer = kp.delete_records({KTP("trim", 0): 8})
    finally:
        kp.close()
    assert server.store.partition("trim", 0).log_start_offset == 8, answer

    from aiokafka.admin import AIOKafkaAdminClient, RecordsToDelete
    from aiokafka.structs import TopicPartition as ATP

    async def delete():
        client = AIOKafkaAdminClient(bootstrap_servers=server.bootstrap_servers)
        await client.start()
        try:
            return await client.delete_records({ATP("trim", 0): RecordsToDelete(before_offset=9)})
        finally:
            await client.close()

    assert asyncio.run(delete()) == {ATP("trim", 0): 9}

    server = restarted(server)
    try:
        assert server.store.partition("trim", 0).log_start_offset == 9
        assert consume(server, "trim", 0, 9, 1) == [(9, b"v9")]
    finally:
        server.stop()


def test_delete_records_refuses_as_kafka_does(server):
    server.store.create_topic("few", 1)
    server.store.create_topic("table", 1, cleanup_policy="compact")
    produce(server, "few", [b"a", b"b", b"c"], partition=0)
    a = admin(server)
    [beyond] = results(a.delete_records([TopicPartition("few", 0, 4)])).values()
    assert beyond.code() == OFFSET_OUT_OF_RANGE
    # (the clients refuse an unknown partition themselves: asked on the wire, by kafka-python's classes)
    from kafka.protocol.admin.topics import DeleteRecordsRequest, DeleteRecordsResponse
    T = DeleteRecordsRequest.DeleteRecordsTopic
    ask = DeleteRecordsRequest[2](topics=[T(name="few", partitions=[
        T.DeleteRecordsPartition(partition_index=5, offset=1), T.DeleteRecordsPartition(partition_index=0, offset=-7)])],
        timeout_ms=5000)
    answer = exchange(server, ask, DeleteRecordsResponse)
    assert [(p.partition_index, p.error_code) for p in answer.topics[0].partitions] == \
        [(5, UNKNOWN_TOPIC_OR_PARTITION), (0, OFFSET_OUT_OF_RANGE)]
    [compacted] = results(a.delete_records([TopicPartition("table", 0, 0)])).values()
    assert compacted.code() == POLICY_VIOLATION
    assert server.store.partition("few", 0).log_start_offset == 0


# ---------------------------------------------------------------------------- DescribeLogDirs
def test_describe_log_dirs_names_the_store_and_each_partitions_size(server):
    from kafka import KafkaAdminClient

    server.store.create_topic("dirs", 2)
    produce(server, "dirs", [b"x" * 100] * 5, partition=1)
    kp = KafkaAdminClient(bootstrap_servers=server.bootstrap_servers, request_timeout_ms=10_000)
    try:
        answer = kp.describe_log_dirs()
    finally:
        kp.close()
    [broker] = answer
    [log_dir] = broker["log_dirs"]
    assert (broker["broker"], log_dir["error_code"], log_dir["log_dir"]) == (0, NONE, server.store.root)
    sizes = {(t["name"], p["partition_index"]): (p["partition_size"], p["offset_lag"], p["is_future_key"])
             for t in log_dir["topics"] for p in t["partitions"]}
    size = server.store.partition("dirs", 1).size_in_bytes
    assert size > 500
    assert sizes[("dirs", 0)] == (0, 0, False) and sizes[("dirs", 1)] == (size, 0, False)


def test_describe_log_dirs_v4_carries_total_and_usable_bytes(server):
    from kafka.protocol.admin.cluster import DescribeLogDirsRequest, DescribeLogDirsResponse

    server.store.create_topic("space", 1)
    produce(server, "space", [b"y" * 50] * 3, partition=0)
    T = DescribeLogDirsRequest.DescribableLogDirTopic
    answer = exchange(server, DescribeLogDirsRequest[4](topics=[T(topic="space", partitions=[0, 9])]),
                      DescribeLogDirsResponse)
    [result] = answer.results
    assert (result.error_code, result.log_dir) == (NONE, server.store.root)
    assert result.total_bytes > result.usable_bytes > 0
    [topic] = result.topics
    [p] = topic.partitions  # partition 9 does not exist: left out, as Kafka does
    assert (topic.name, p.partition_index, p.partition_size, p.offset_lag, p.is_future_key) == \
        ("space", 0, server.store.partition("space", 0).size_in_bytes, 0, False)


# ---------------------------------------------------------------------------- ListOffsets
def test_list_offsets_max_timestamp_earliest_and_latest(server):
    server.store.create_topic("times", 1)
    stamps = [1_000, 5_000, 9_000, 3_000, 9_000, 2_000]
    produce(server, "times", [b"t%d" % i for i in range(6)], partition=0, timestamps=stamps)
    a = admin(server)
    tp = TopicPartition("times", 0)
    newest = results(a.list_offsets({tp: OffsetSpec.max_timestamp()}))[tp]
    assert (newest.offset, newest.timestamp) == (2, 9_000)  # the first record with the largest timestamp
    assert results(a.list_offsets({tp: OffsetSpec.earliest()}))[tp].offset == 0
    assert results(a.list_offsets({tp: OffsetSpec.latest()}))[tp].offset == 6
    assert results(a.list_offsets({tp: OffsetSpec.for_timestamp(4_000)}))[tp].offset == 1


def test_list_offsets_sentinels_a_version_cannot_carry_are_unsupported_version(server):
    """Kafka's ReplicaManager: -3 needs v7, -4 v8; an older version asking for them (librdkafka
    with v5 and -3 got offset 0 before) gets UNSUPPORTED_VERSION for the partition. Requests
    encoded and decoded by kafka-python's protocol classes."""
    from kafka.protocol.consumer.offsets import ListOffsetsRequest, ListOffsetsResponse

    server.store.create_topic("old", 1)
    produce(server, "old", [b"a", b"b"], partition=0, timestamps=[10, 20])
    server.store.partition("old", 0).delete_records_before(1)

    def ask(version, timestamp):
        T = ListOffsetsRequest.ListOffsetsTopic
        body = dict(replica_id=-1, topics=[T(name="old", partitions=[
            T.ListOffsetsPartition(partition_index=0, timestamp=timestamp, current_leader_epoch=-1)])])
        if version >= 2:
            body["isolation_level"] = 0
        answer = exchange(server, ListOffsetsRequest[version](**body), ListOffsetsResponse)
        [p] = answer.topics[0].partitions
        return p.error_code, p.offset

    assert ask(5, -3) == (UNSUPPORTED_VERSION, -1)
    assert ask(7, -4) == (UNSUPPORTED_VERSION, -1)
    assert ask(7, -3) == (NONE, 1)
    assert ask(8, -4) == (NONE, 1)  # the local log start: nothing is tiered
    assert ask(6, -7) == (UNSUPPORTED_VERSION, -1)


# ---------------------------------------------------------------------------- DescribeProducers
def test_describe_producers_lists_an_idempotent_producer(server):
    """A confluent producer's state, described to kafka-python (confluent's AdminClient has no
    DescribeProducers), against the log's own producer state."""
    from kafka import KafkaAdminClient
    from kafka import TopicPartition as KTP

    server.store.create_topic("idem", 1)
    p = Producer({"bootstrap.servers": server.bootstrap_servers, "enable.idempotence": True, "linger.ms": 0})
    for value in (b"one", b"two"):
        p.produce("idem", value)
        assert p.flush(20) == 0
    [(pid, entry)] = server.store.partition("idem", 0).active_producers().items()
    kp = KafkaAdminClient(bootstrap_servers=server.bootstrap_servers, request_timeout_ms=10_000)
    try:
        answer = kp.describe_producers([KTP("idem", 0)])
    finally:
        kp.close()
    [state] = answer[KTP("idem", 0)].active_producers
    assert (state.producer_id, state.producer_epoch, state.last_sequence, state.current_transaction_start_offset) == \
        (pid, entry.epoch, 1, -1)
    assert state.last_timestamp == entry.last_timestamp


# ---------------------------------------------------------------------------- codecs
def _batch(codec_id):
    """A one-record v2 batch by kafka-python's builder, its codec bits then set to ``codec_id``
    and its CRC fixed (what a client with a codec Kafka does not know would send)."""
    import struct

    from kafka.record.default_records import DefaultRecordBatchBuilder
    from kafka.record.util import calc_crc32c

    builder = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=False, producer_id=-1,
                                        producer_epoch=-1, base_sequence=-1, batch_size=1 << 20)
    builder.append(0, timestamp=1, key=None, value=b"payload", headers=[])
    data = bytearray(builder.build())
    attributes = struct.unpack_from(">h", data, 21)[0]
    struct.pack_into(">h", data, 21, (attributes & ~7) | codec_id)
    struct.pack_into(">I", data, 17, calc_crc32c(bytes(data[21:])))
    return bytes(data)


def _produce_raw(server, topic, records):
    from kafka.protocol.producer.produce import ProduceRequest, ProduceResponse

    T = ProduceRequest.TopicProduceData
    ask = ProduceRequest[8](transactional_id=None, acks=1, timeout_ms=5000, topic_data=[
        T(name=topic, partition_data=[T.PartitionProduceData(index=0, records=records)])])
    answer = exchange(server, ask, ProduceResponse)
    [part] = answer.responses[0].partition_responses
    return part.error_code


@pytest.mark.parametrize("codec_id", [5, 6, 7])
def test_a_batch_with_an_unknown_codec_id_gets_unsupported_compression_type(server, codec_id):
    server.store.create_topic("codecs", 1)
    assert _produce_raw(server, "codecs", _batch(codec_id)) == UNSUPPORTED_COMPRESSION_TYPE
    assert _produce_raw(server, "codecs", _batch(0)) == NONE  # the connection and topic still serve
    assert [r.value for r in server.store.partition("codecs", 0).iter()] == [b"payload"]


def test_an_lz4_batch_without_the_lz4_library_gets_unsupported_compression_type(server, monkeypatch):
    server.store.create_topic("nolz4", 1)
    p = Producer({"bootstrap.servers": server.bootstrap_servers, "compression.type": "lz4", "linger.ms": 0,
                  "retries": 0})
    monkeypatch.setattr(compression, "_lz4", None)  # the library gone, as where it is not installed
    errors = []
    p.produce("nolz4", b"z" * 1000, on_delivery=lambda err, msg: errors.append(err))
    p.flush(20)
    assert errors and errors[0] is not None
    assert errors[0].code() == KafkaError.UNSUPPORTED_COMPRESSION_TYPE
    monkeypatch.undo()
    errors.clear()
    p.produce("nolz4", b"z" * 1000, on_delivery=lambda err, msg: errors.append(err))  # same connection
    p.flush(20)
    assert errors == [None]
    assert server.store.partition("nolz4", 0).log_end_offset == 1


# ---------------------------------------------------------------------------- Fetch max_bytes (KIP-74)
def test_fetch_max_bytes_stops_the_first_partition_after_its_first_batch(server):
    """librdkafka's test 0082: max_bytes 1 MB with a large per-partition maximum gets about
    1 MB back, not every batch the partition limit allows."""
    from .test_wire_edges import fetch_v4

    store = server.store
    store.create_topic("limits", 2)
    log = store.partition("limits", 0)
    for _ in range(8):
        log.append_batch([b"m" * 1000] * 100)  # batches of ~100 kB
    store.partition("limits", 1).append_batch([b"n" * 1000] * 100)
    got = fetch_v4(server, [0, 1], max_bytes=250_000, partition_max_bytes=10_000_000)
    assert 100_000 < len(got[0]) <= 250_000 and got[1] == b""
    one = fetch_v4(server, [0], max_bytes=1, partition_max_bytes=10_000_000)
    assert 100_000 < len(one[0]) < 110_000  # only the first batch passes the limit


# ---------------------------------------------------------------------------- CreateTopics
def test_create_topics_with_an_assignment_naming_this_broker(server):
    a = admin(server)
    mine = results(a.create_topics([NewTopic("assigned", num_partitions=3, replica_assignment=[[0], [0], [0]])]))
    assert mine["assigned"] is None and server.store.partitions_for("assigned") == 3
    other = results(a.create_topics([NewTopic("elsewhere", num_partitions=2,
                                              replica_assignment=[[0], [3]])]))["elsewhere"]
    assert other.code() == INVALID_REPLICA_ASSIGNMENT
    assert "elsewhere" not in server.store.topics()


def test_no_request_above_closes_its_connection(server):
    """A DescribeLogDirs (v1) then an ApiVersions on one connection: the admin APIs are answered
    like any other."""
    from kafka.protocol.admin.cluster import DescribeLogDirsRequest, DescribeLogDirsResponse

    ask = DescribeLogDirsRequest[1](topics=None)
    ask.with_header(3, "one-connection")
    with connect(server) as sock:
        sock.sendall(ask.encode(header=True, framed=True))
        answer = DescribeLogDirsResponse[1].decode(response(sock), header=True)
        assert answer.results[0].log_dir == server.store.root
        sock.sendall(ask.encode(header=True, framed=True))
        assert DescribeLogDirsResponse[1].decode(response(sock), header=True).results[0].error_code == NONE


# ---------------------------------------------------------------------------- ElectLeaders
def test_elect_leaders_answers_election_not_needed_for_every_partition_as_each_already_has_its_leader(server):
    """confluent-kafka's elect_leaders and kafka-python's: every partition's one replica, this
    broker, leads it already; an unknown partition UNKNOWN_TOPIC_OR_PARTITION; all partitions
    (None): nothing to elect, nothing listed (as Kafka lists only what it elected)."""
    from confluent_kafka import ElectionType
    from kafka.admin import KafkaAdminClient

    server.store.create_topic("led", 2)
    a = admin(server)
    answer = a.elect_leaders(ElectionType.PREFERRED, [TopicPartition("led", 0), TopicPartition("led", 1),
                                                      TopicPartition("led", 7)]).result(20)
    codes = {(tp.topic, tp.partition): (None if err is None else err.code()) for tp, err in answer.items()}
    assert codes == {("led", 0): KafkaError.ELECTION_NOT_NEEDED, ("led", 1): KafkaError.ELECTION_NOT_NEEDED,
                     ("led", 7): KafkaError.UNKNOWN_TOPIC_OR_PART}
    assert a.elect_leaders(ElectionType.UNCLEAN, None).result(20) == {}
    kp = KafkaAdminClient(bootstrap_servers=server.bootstrap_servers)
    try:
        result = kp.elect_leaders(0, {"led": [0, 1]}, raise_errors=False)
        assert [(p.partition_id, p.error_code) for r in result.replica_election_results for p in r.partition_result] \
            == [(0, 84), (1, 84)]  # ELECTION_NOT_NEEDED
    finally:
        kp.close()
    assert [server.store.partition("led", p).log_end_offset for p in (0, 1)] == [0, 0]  # nothing moved
