"""Requests on raw sockets, encoded and decoded by kafka-python's protocol classes (never by the
server's codec), checked against what Apache Kafka answers: Produce of magic v0/v1 message sets,
Fetch's offsets, errors and long polls, InitProducerId across restarts, Metadata's cluster, broker
and auto-creation, and CreateTopics' validation."""

from __future__ import annotations

import base64
import os
import socket
import threading
import time
import uuid

import pytest

from kafka.protocol.admin.topics import CreateTopicsRequest, CreateTopicsResponse
from kafka.protocol.consumer.fetch import FetchRequest, FetchResponse
from kafka.protocol.metadata.metadata import MetadataRequest, MetadataResponse
from kafka.protocol.old.produce import ProduceRequest as LegacyProduceRequest
from kafka.protocol.producer.produce import ProduceRequest, ProduceResponse
from kafka.protocol.producer.transaction import InitProducerIdRequest, InitProducerIdResponse
from kafka.record.legacy_records import LegacyRecordBatchBuilder
from kafka.record.memory_records import MemoryRecords, MemoryRecordsBuilder

from logstore.kafka.server import KafkaServer

from .test_wire_edges import api_versions_v0, closed, request, response

# Kafka's error codes (org.apache.kafka.common.protocol.Errors), written out here on purpose.
NONE = 0
OFFSET_OUT_OF_RANGE = 1
UNKNOWN_TOPIC_OR_PARTITION = 3
LEADER_NOT_AVAILABLE = 5
TOPIC_ALREADY_EXISTS = 36
INVALID_PARTITIONS = 37
INVALID_CONFIG = 40
INVALID_RECORD = 87


@pytest.fixture
def server(tmp_path):
    s = KafkaServer(str(tmp_path), ("127.0.0.1", 0)).start()
    yield s
    s.stop()


def connect(server):
    return socket.create_connection(server.address, timeout=10)


def exchange(server, message, response_class, correlation=17):
    """Send one kafka-python request (its version set) on a new connection; its decoded answer."""
    message.with_header(correlation, "wire-requests")
    with connect(server) as sock:
        sock.sendall(message.encode(header=True, framed=True))
        answer = response_class[message.API_VERSION].decode(response(sock), header=True)
    assert answer.header.correlation_id == correlation
    return answer


def v2_batch(*values):
    """A magic 2 batch built by kafka-python."""
    builder = MemoryRecordsBuilder(2, 0, 1 << 20)
    for value in values:
        builder.append(1_700_000_000_000, None, value, [])
    builder.close()
    return bytes(builder.buffer())


def legacy_message_set(magic, *values):
    """A magic 0 or 1 message set (Kafka before 0.11) built by kafka-python."""
    builder = LegacyRecordBatchBuilder(magic, 0, 1 << 20)
    for i, value in enumerate(values):
        builder.append(i, 1_700_000_000_000 if magic else None, b"k", value)
    return bytes(builder.build())


def values_of(records):
    """(offset, value) of every record in fetched bytes, read by kafka-python."""
    out = []
    batches = MemoryRecords(bytes(records or b""))
    while (batch := batches.next_batch()) is not None:
        out += [(record.offset, record.value) for record in batch]
    return out


# ---------------------------------------------------------------------- Produce
@pytest.mark.parametrize("version", [0, 1, 2])
def test_produce_v0_to_v2_closes_the_connection_as_kafka_4_does(server, version):
    """Kafka 4 advertises Produce from v0 (librdkafka before 2.11.1 compresses only then) but
    refuses v0-v2 as an unsupported version, which closes the connection without an answer
    (SocketServer.parseRequestHeader). Nothing is written; the server and other connections go on."""
    server.store.create_topic("legacy")
    magic = 0 if version < 2 else 1  # the message set each version carries
    ask = LegacyProduceRequest[version](1, 1000, [("legacy", [(0, legacy_message_set(magic, b"a", b"b"))])])
    ask.with_header(5, "wire-requests")
    with connect(server) as old, connect(server) as other:
        old.sendall(ask.encode(header=True, framed=True))
        assert closed(old)
        other.sendall(request(18, 0, 6))
        correlation, error, ranges = api_versions_v0(response(other))
        assert (correlation, error) == (6, NONE) and ranges[0][0] == 0  # still advertised from v0
    assert server.store.partition("legacy", 0).log_end_offset == 0


@pytest.mark.parametrize("version", [3, 8])
@pytest.mark.parametrize("magic", [0, 1])
def test_a_magic_0_or_1_message_set_in_produce_v3_and_later_is_invalid_record_per_partition(server, version, magic):
    """Kafka's ProduceRequest.validateRecords: v3+ carries only magic 2 batches; another magic is
    INVALID_RECORD for its partition (InvalidRecordException), and the other partitions of the
    request are written."""
    server.store.create_topic("mixed", 2)
    P = ProduceRequest.TopicProduceData.PartitionProduceData
    ask = ProduceRequest[version](
        transactional_id=None, acks=-1, timeout_ms=1000,
        topic_data=[ProduceRequest.TopicProduceData(name="mixed", partition_data=[
            P(index=0, records=legacy_message_set(magic, b"old")),
            P(index=1, records=v2_batch(b"new", b"newer")),
        ])])
    answer = exchange(server, ask, ProduceResponse)
    [topic] = answer.responses
    parts = {p.index: p for p in topic.partition_responses}
    assert topic.name == "mixed" and sorted(parts) == [0, 1]
    assert (parts[0].error_code, parts[0].base_offset) == (INVALID_RECORD, -1)
    assert (parts[1].error_code, parts[1].base_offset) == (NONE, 0)
    assert server.store.partition("mixed", 0).log_end_offset == 0
    assert server.store.partition("mixed", 1).log_end_offset == 2
    assert [r.value for r in server.store.partition("mixed", 1).iter()] == [b"new", b"newer"]


# ---------------------------------------------------------------------- Fetch
def fetch(server, version, wanted, *, isolation_level=0, min_bytes=1, max_wait_ms=0):
    """One Fetch of ``wanted`` ({(topic, partition): offset}); {(topic, partition): PartitionData}."""
    topics = {}
    for (topic, partition), offset in wanted.items():
        topics.setdefault(topic, []).append(FetchRequest.FetchTopic.FetchPartition(
            partition=partition, fetch_offset=offset, partition_max_bytes=1 << 20))
    ask = FetchRequest[version](
        replica_id=-1, max_wait_ms=max_wait_ms, min_bytes=min_bytes, max_bytes=1 << 20,
        isolation_level=isolation_level, session_id=0, session_epoch=-1,
        topics=[FetchRequest.FetchTopic(topic=t, partitions=ps) for t, ps in topics.items()],
        forgotten_topics_data=[], rack_id="")
    answer = exchange(server, ask, FetchResponse)
    assert answer.error_code == NONE
    return {(t.topic, p.partition_index): p for t in answer.responses for p in t.partitions}


@pytest.fixture
def two_partitions(server):
    """Topic "f": partition 0 holds offsets 0-5 in three batches, its log start moved to 2;
    partition 1 holds one record."""
    server.store.create_topic("f", 2)
    log = server.store.partition("f", 0)
    for i in range(3):
        log.append_batch([b"a%d" % i, b"b%d" % i])
    assert log.delete_records_before(2) == 2
    server.store.partition("f", 1).append_batch([b"only"])
    return server


@pytest.mark.parametrize("version", [4, 5, 11])
def test_fetch_answers_each_partition_with_its_high_watermark_last_stable_offset_and_log_start(two_partitions,
                                                                                               version):
    parts = fetch(two_partitions, version, {("f", 0): 2, ("f", 1): 0})
    p0, p1 = parts[("f", 0)], parts[("f", 1)]
    assert (p0.error_code, p0.high_watermark, p0.last_stable_offset) == (NONE, 6, 6)
    assert (p1.error_code, p1.high_watermark, p1.last_stable_offset) == (NONE, 1, 1)
    if version >= 5:
        assert (p0.log_start_offset, p1.log_start_offset) == (2, 0)
    assert values_of(p0.records) == [(2, b"a1"), (3, b"b1"), (4, b"a2"), (5, b"b2")]
    assert values_of(p1.records) == [(0, b"only")]


@pytest.mark.parametrize("offset", [0, 1, 7, 1000])
def test_fetch_outside_the_log_is_offset_out_of_range(two_partitions, offset):
    """Before the log start (records deleted) or past the end: OFFSET_OUT_OF_RANGE, no records,
    and, as Kafka (ReplicaManager.createLogReadResult), no offsets (-1) for that partition; the
    other partition of the request is answered as usual. The end itself is not out of range."""
    parts = fetch(two_partitions, 11, {("f", 0): offset, ("f", 1): 0})
    p0 = parts[("f", 0)]
    assert p0.error_code == OFFSET_OUT_OF_RANGE
    assert (p0.high_watermark, p0.last_stable_offset, p0.log_start_offset) == (-1, -1, -1)
    assert values_of(p0.records) == []
    assert parts[("f", 1)].error_code == NONE and values_of(parts[("f", 1)].records) == [(0, b"only")]
    at_end = fetch(two_partitions, 11, {("f", 0): 6})[("f", 0)]
    assert (at_end.error_code, at_end.high_watermark, values_of(at_end.records)) == (NONE, 6, [])


def test_read_committed_reads_what_read_uncommitted_reads_without_aborted_transactions(two_partitions):
    """No transactions: the last stable offset is the high watermark and read_committed gets the
    same batches; its aborted transactions are an empty list, read_uncommitted's null (Kafka
    collects them only for read_committed)."""
    uncommitted = fetch(two_partitions, 11, {("f", 0): 2, ("f", 1): 0}, isolation_level=0)
    committed = fetch(two_partitions, 11, {("f", 0): 2, ("f", 1): 0}, isolation_level=1)
    for key in uncommitted:
        assert committed[key].records == uncommitted[key].records
        assert committed[key].last_stable_offset == committed[key].high_watermark == uncommitted[key].high_watermark
        assert committed[key].aborted_transactions == []
        assert uncommitted[key].aborted_transactions is None
    assert values_of(committed[("f", 0)].records)[0] == (2, b"a1")


def test_a_fetch_at_the_end_waits_max_wait_ms_for_min_bytes_and_returns_empty(two_partitions):
    started = time.monotonic()
    parts = fetch(two_partitions, 11, {("f", 0): 6, ("f", 1): 1}, min_bytes=1, max_wait_ms=300)
    waited = time.monotonic() - started
    assert 0.28 <= waited < 2.0
    assert all(p.error_code == NONE and values_of(p.records) == [] for p in parts.values())
    assert parts[("f", 0)].high_watermark == 6


def test_a_waiting_fetch_returns_early_with_a_record_appended_by_another_thread(two_partitions):
    log = two_partitions.store.partition("f", 1)
    appender = threading.Timer(0.2, lambda: log.append_batch([b"late"]))
    started = time.monotonic()
    appender.start()
    try:
        parts = fetch(two_partitions, 11, {("f", 1): 1}, min_bytes=1, max_wait_ms=8000)
    finally:
        appender.join()
    waited = time.monotonic() - started
    assert 0.2 <= waited < 4.0  # woken by the append, long before max_wait_ms
    p1 = parts[("f", 1)]
    assert (p1.error_code, p1.high_watermark) == (NONE, 2)
    assert values_of(p1.records) == [(1, b"late")]


# ---------------------------------------------------------------------- InitProducerId
def test_producer_ids_never_repeat_across_a_restart_on_the_same_directory(tmp_path):
    def init(server, version):
        answer = exchange(server, InitProducerIdRequest[version](transactional_id=None, transaction_timeout_ms=60000),
                          InitProducerIdResponse)
        assert (answer.error_code, answer.producer_epoch) == (NONE, 0)
        return answer.producer_id

    runs = []
    for _ in range(3):
        with KafkaServer(str(tmp_path), ("127.0.0.1", 0)) as server:
            runs.append([init(server, 0), init(server, 1), init(server, 0)])
    ids = [pid for run in runs for pid in run]
    assert len(set(ids)) == len(ids) and all(pid >= 0 for pid in ids)
    assert ids == sorted(ids)  # each run's ids above every earlier run's
    assert runs[0] == sorted(runs[0]) and runs[0][0] < runs[1][0] < runs[2][0]


# ---------------------------------------------------------------------- Metadata
def metadata(server, version, topics, allow_auto_topic_creation=True):
    fields = {"topics": None if topics is None else [MetadataRequest.MetadataRequestTopic(name=t) for t in topics]}
    if version >= 4:
        fields["allow_auto_topic_creation"] = allow_auto_topic_creation
    return exchange(server, MetadataRequest[version](**fields), MetadataResponse)


def test_metadata_names_the_cluster_id_of_meta_properties_and_the_configured_broker(tmp_path):
    # meta.properties as a KRaft broker writes it (a Kafka log directory).
    (tmp_path / "meta.properties").write_text(
        "#\n#Thu Jan 02 10:00:00 UTC 2025\nnode.id=7\ndirectory.id=J8aAPcfLQt2bqs1JT_rMgQ\n"
        "version=1\ncluster.id=MkU3OEVBNTcwNTJENDM2Qk\n")
    with KafkaServer(str(tmp_path), ("127.0.0.1", 0), advertised=("broker.example", 19092), node_id=7) as server:
        server.store.create_topic("m", 2)
        answer = metadata(server, 8, ["m"])
        assert answer.cluster_id == "MkU3OEVBNTcwNTJENDM2Qk"
        assert answer.controller_id == 7
        assert [(b.node_id, b.host, b.port, b.rack) for b in answer.brokers] == [(7, "broker.example", 19092, None)]
        [topic] = answer.topics
        assert (topic.error_code, topic.name, topic.is_internal) == (NONE, "m", False)
        assert sorted((p.partition_index, p.error_code, p.leader_id, list(p.replica_nodes), list(p.isr_nodes))
                      for p in topic.partitions) == [(0, NONE, 7, [7], [7]), (1, NONE, 7, [7], [7])]
        old = metadata(server, 0, ["m"])
        assert [(b.node_id, b.host, b.port) for b in old.brokers] == [(7, "broker.example", 19092)]


def test_without_cluster_id_the_one_derived_from_the_store_stays_across_restarts(tmp_path):
    with KafkaServer(str(tmp_path), ("127.0.0.1", 0)) as server:
        first = metadata(server, 2, None).cluster_id
        host, port = server.address
        assert [(b.node_id, b.host, b.port) for b in metadata(server, 2, None).brokers] == [(0, host, port)]
    props = dict(line.split("=", 1) for line in (tmp_path / "meta.properties").read_text().splitlines()
                 if "=" in line and not line.startswith("#"))
    assert "cluster.id" not in props
    # Kafka's form of a cluster id: a UUID's 16 bytes in URL-safe base64, unpadded (22 characters).
    expected = base64.urlsafe_b64encode(uuid.UUID(props["directory.id"]).bytes).decode().rstrip("=")
    assert first == expected and len(first) == 22
    with KafkaServer(str(tmp_path), ("127.0.0.1", 0)) as server:
        assert metadata(server, 8, None).cluster_id == first


@pytest.mark.parametrize("version", [1, 4, 8])
def test_without_auto_creation_an_unknown_topic_is_unknown_and_nothing_is_created(tmp_path, version):
    with KafkaServer(str(tmp_path), ("127.0.0.1", 0), auto_create_topics=False) as server:
        answer = metadata(server, version, ["nope"], allow_auto_topic_creation=True)
        assert [(t.error_code, t.name, list(t.partitions)) for t in answer.topics] == \
            [(UNKNOWN_TOPIC_OR_PARTITION, "nope", [])]
        assert server.store.topics() == []
        assert metadata(server, version, None).topics == []
    assert not any(name.startswith("nope") for name in os.listdir(tmp_path))


def test_auto_creation_uses_num_partitions_and_the_request_can_refuse_it(tmp_path):
    with KafkaServer(str(tmp_path), ("127.0.0.1", 0), num_partitions=3, node_id=4) as server:
        # v4+: the client says no (allow_auto_topic_creation=false): unknown, nothing created.
        refused = metadata(server, 8, ["auto"], allow_auto_topic_creation=False)
        assert [(t.error_code, t.name) for t in refused.topics] == [(UNKNOWN_TOPIC_OR_PARTITION, "auto")]
        assert server.store.topics() == []

        first = metadata(server, 8, ["auto"])
        [topic] = first.topics
        # Kafka answers LEADER_NOT_AVAILABLE while the topic is being created; once there, its partitions.
        assert topic.error_code in (NONE, LEADER_NOT_AVAILABLE)
        assert server.store.partitions_for("auto") == 3
        [topic] = metadata(server, 8, ["auto"]).topics
        assert topic.error_code == NONE
        assert sorted((p.partition_index, p.leader_id) for p in topic.partitions) == [(0, 4), (1, 4), (2, 4)]
        [old] = metadata(server, 1, ["auto2"]).topics  # before v4 the request cannot refuse
        assert old.error_code in (NONE, LEADER_NOT_AVAILABLE)
        assert server.store.partitions_for("auto2") == 3


# ---------------------------------------------------------------------- CreateTopics
def create_topics(server, version, topics, validate_only=False):
    """topics: [(name, num_partitions, {config: value})]; {name: (error code, error message)}."""
    T = CreateTopicsRequest.CreatableTopic
    ask = CreateTopicsRequest[version](
        topics=[T(name=name, num_partitions=n, replication_factor=-1 if n == -1 else 1, assignments=[],
                  configs=[T.CreatableTopicConfig(name=k, value=v) for k, v in configs.items()])
                for name, n, configs in topics],
        timeout_ms=5000, validate_only=validate_only)
    answer = exchange(server, ask, CreateTopicsResponse)
    assert [t.name for t in answer.topics] == [name for name, _, _ in topics]
    return {t.name: (t.error_code, t.error_message) for t in answer.topics}


@pytest.mark.parametrize("version", [2, 3, 4])
def test_create_topics_validate_only_validates_everything_and_creates_nothing(server, version):
    server.store.create_topic("exists")
    answers = create_topics(server, version, [
        ("fine", 4, {"retention.ms": "60000", "cleanup.policy": "compact"}),
        ("default", -1, {}),
        ("exists", 1, {}),
        ("zero", 0, {}),
        ("unknown", 1, {"no.such.config": "1"}),
        ("bad-value", 1, {"retention.ms": "soon"}),
    ], validate_only=True)
    assert answers["fine"] == (NONE, None) and answers["default"] == (NONE, None)
    assert answers["exists"][0] == TOPIC_ALREADY_EXISTS
    assert answers["zero"][0] == INVALID_PARTITIONS
    assert answers["unknown"][0] == INVALID_CONFIG
    assert answers["bad-value"][0] == INVALID_CONFIG
    for name in ("exists", "zero", "unknown", "bad-value"):
        assert answers[name][1], f"{name}: no error message"
    assert server.store.topics() == ["exists"]
    assert not any(name.startswith(("fine", "default")) for name in os.listdir(server.store.root))
    # The same request for real creates what validated.
    real = create_topics(server, version, [("fine", 4, {"retention.ms": "60000", "cleanup.policy": "compact"})])
    assert real == {"fine": (NONE, None)}
    assert server.store.partitions_for("fine") == 4
    assert server.store.describe("fine").overrides == {"retention.ms": "60000", "cleanup.policy": "compact"}


@pytest.mark.parametrize("version", [2, 3, 4])
def test_create_topics_refuses_bad_partition_counts_and_configs_with_kafkas_errors(server, version):
    answers = create_topics(server, version, [
        ("zero", 0, {}),
        ("negative", -2, {}),
        ("unknown", 1, {"no.such.config": "1"}),
        ("field-name", 1, {"cleanup_policy": "compact"}),  # logstore's name, not Kafka's
        ("bad-value", 1, {"retention.ms": "soon"}),
        ("bad-policy", 1, {"cleanup.policy": "forever"}),
        ("null-value", 1, {"retention.ms": None}),       # Kafka: "Null value not supported"
        ("broker-only", 1, {"log.cleaner.dedupe.buffer.size": "1048576"}),  # a broker config in Kafka
        ("good", 2, {"max.message.bytes": "2048", "preallocate": "true", "segment.bytes": "1048576"}),
    ])
    assert answers["good"] == (NONE, None)
    expected = {"zero": INVALID_PARTITIONS, "negative": INVALID_PARTITIONS, "unknown": INVALID_CONFIG,
                "field-name": INVALID_CONFIG, "bad-value": INVALID_CONFIG, "bad-policy": INVALID_CONFIG,
                "null-value": INVALID_CONFIG, "broker-only": INVALID_CONFIG}
    for name, error in expected.items():
        code, message = answers[name]
        assert code == error, (name, code, message)
        assert message, f"{name}: the error message is empty"
    assert "no.such.config" in answers["unknown"][1]
    assert server.store.topics() == ["good"]
    assert server.store.partitions_for("good") == 2
    assert server.store.describe("good").overrides == {"max.message.bytes": "2048", "preallocate": "true",
                                                       "segment.bytes": "1048576"}
