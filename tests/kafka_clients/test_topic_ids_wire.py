"""Topic ids on the wire, request by request, written and read by kafka-python's protocol
classes (generated from Kafka's JSON specs, an implementation independent of the server's kio):
Metadata v12 by id, Fetch v16 by a current and a stale id (UNKNOWN_TOPIC_ID after a delete and
re-create), DeleteTopics v6 by id and its refusals, CreateTopics v7's id and settings, and
DescribeTopicPartitions' cursor."""

from __future__ import annotations

import uuid

import pytest

pytest.importorskip("kafka")
from kafka.protocol.admin.topics import (  # noqa: E402
    CreateTopicsRequest,
    CreateTopicsResponse,
    DeleteTopicsRequest,
    DeleteTopicsResponse,
    DescribeTopicPartitionsRequest,
    DescribeTopicPartitionsResponse,
)
from kafka.protocol.consumer.fetch import FetchRequest, FetchResponse  # noqa: E402
from kafka.protocol.metadata import MetadataRequest  # noqa: E402
from kafka.protocol.metadata import MetadataResponse  # noqa: E402
from .wire_conn import RequestConnection  # noqa: E402

NONE, UNKNOWN_TOPIC_OR_PARTITION, INVALID_REQUEST, UNKNOWN_TOPIC_ID = 0, 3, 42, 100
STALE = uuid.UUID("8d8a9a4e-8d9e-4c1d-9b7a-0123456789ab")


def Conn(server):
    return RequestConnection(server.address, "ids-test")


@pytest.fixture
def conn(kafka_server):
    c = Conn(kafka_server)
    yield c
    c.close()


def metadata_by_id(conn, *topic_ids):
    T = MetadataRequest.MetadataRequestTopic
    return conn.call(MetadataRequest(version=12, topics=[T(topic_id=i, name=None) for i in topic_ids],
                                     allow_auto_topic_creation=False, include_topic_authorized_operations=False),
                     MetadataResponse)


def fetch_by_id(conn, topic_id, offset=0):
    T = FetchRequest.FetchTopic
    part = T.FetchPartition(partition=0, current_leader_epoch=-1, fetch_offset=offset, last_fetched_epoch=-1,
                            log_start_offset=-1, partition_max_bytes=1 << 20)
    answer = conn.call(FetchRequest(version=16, max_wait_ms=0, min_bytes=0, max_bytes=1 << 20, isolation_level=0,
                                    session_id=0, session_epoch=-1, topics=[T(topic_id=topic_id, partitions=[part])],
                                    forgotten_topics_data=[], rack_id=""), FetchResponse)
    (topic,) = answer.responses
    (partition,) = topic.partitions
    return topic.topic_id, partition


def test_metadata_v12_looks_topics_up_by_id(kafka_server, conn):
    kafka_server.store.create_topic("by-id", 2)
    topic_id = kafka_server.store.topic_id("by-id")
    answer = metadata_by_id(conn, topic_id, STALE)
    found, unknown = answer.topics
    assert (found.error_code, found.name, found.topic_id, len(found.partitions)) == (NONE, "by-id", topic_id, 2)
    assert (unknown.error_code, unknown.name, unknown.topic_id) == (UNKNOWN_TOPIC_ID, None, STALE)
    assert answer.cluster_id == kafka_server.cluster_id


def test_fetch_by_a_stale_id_after_delete_and_recreate_is_unknown_topic_id(kafka_server, conn):
    store = kafka_server.store
    store.create_topic("cycle")
    store.partition("cycle", 0).append(b"old")
    old = store.topic_id("cycle")
    topic_id, partition = fetch_by_id(conn, old)
    assert (topic_id, partition.error_code, partition.high_watermark) == (old, NONE, 1)
    store.delete_topic("cycle")
    store.create_topic("cycle")
    store.partition("cycle", 0).append(b"new")
    topic_id, partition = fetch_by_id(conn, old)
    assert (topic_id, partition.error_code, partition.high_watermark) == (old, UNKNOWN_TOPIC_ID, -1)
    assert not partition.records
    new = store.topic_id("cycle")
    topic_id, partition = fetch_by_id(conn, new)
    assert (topic_id, partition.error_code, partition.high_watermark) == (new, NONE, 1)
    assert b"new" in bytes(partition.records) and b"old" not in bytes(partition.records)


def test_delete_topics_v6_by_id_and_its_refusals(kafka_server, conn):
    store = kafka_server.store
    store.create_topic("doomed")
    store.create_topic("kept")
    doomed = store.topic_id("doomed")
    S = DeleteTopicsRequest.DeleteTopicState
    answer = conn.call(DeleteTopicsRequest(version=6, timeout_ms=10000, topics=[
        S(name=None, topic_id=doomed), S(name=None, topic_id=STALE), S(name="kept", topic_id=store.topic_id("kept")),
        S(name=None, topic_id=None)]), DeleteTopicsResponse)
    got = [(r.name, r.topic_id, r.error_code) for r in answer.responses]
    assert got[0] == ("doomed", doomed, NONE)
    assert got[1][1:] == (STALE, UNKNOWN_TOPIC_ID)
    assert got[2][0] == "kept" and got[2][2] == INVALID_REQUEST  # name and id both given
    assert got[3][2] == INVALID_REQUEST  # neither
    assert store.topics() == ["kept"]


def test_create_topics_v7_returns_the_id_partitions_and_settings(kafka_server, conn):
    T = CreateTopicsRequest.CreatableTopic
    C = T.CreatableTopicConfig
    answer = conn.call(CreateTopicsRequest(version=7, timeout_ms=10000, validate_only=False, topics=[
        T(name="made", num_partitions=3, replication_factor=1, assignments=[],
          configs=[C(name="retention.ms", value="60000")])]), CreateTopicsResponse)
    (result,) = answer.topics
    assert (result.error_code, result.num_partitions, result.replication_factor) == (NONE, 3, 1)
    assert result.topic_id == kafka_server.store.topic_id("made")
    configs = {c.name: (c.value, c.config_source) for c in result.configs}
    assert configs["retention.ms"] == ("60000", 1)  # DYNAMIC_TOPIC_CONFIG
    assert configs["cleanup.policy"] == ("delete", 5)  # DEFAULT_CONFIG
    again = conn.call(CreateTopicsRequest(version=7, timeout_ms=10000, validate_only=False, topics=[
        T(name="made", num_partitions=1, replication_factor=1, assignments=[], configs=[])]), CreateTopicsResponse)
    (result,) = again.topics
    assert (result.error_code, result.num_partitions, result.topic_id) == (36, -1, None)  # TOPIC_ALREADY_EXISTS, no id


def test_describe_topic_partitions_pages_with_a_cursor(kafka_server, conn):
    kafka_server.store.create_topic("a", 3)
    kafka_server.store.create_topic("b", 2)
    T = DescribeTopicPartitionsRequest.TopicRequest
    pages, cursor = [], None
    for _ in range(10):
        answer = conn.call(DescribeTopicPartitionsRequest(version=0, topics=[T(name="b"), T(name="a")],
                                                          response_partition_limit=2, cursor=cursor),
                           DescribeTopicPartitionsResponse)
        pages.append([(t.name, [p.partition_index for p in t.partitions]) for t in answer.topics])
        assert all(t.topic_id == kafka_server.store.topic_id(t.name) for t in answer.topics)
        if answer.next_cursor is None:
            break
        cursor = DescribeTopicPartitionsRequest.Cursor(topic_name=answer.next_cursor.topic_name,
                                                      partition_index=answer.next_cursor.partition_index)
    assert pages == [[("a", [0, 1])], [("a", [2]), ("b", [0])], [("b", [1])]]
    bad = conn.call(DescribeTopicPartitionsRequest(version=0, topics=[T(name="a")], response_partition_limit=5,
                                                   cursor=DescribeTopicPartitionsRequest.Cursor(topic_name="b",
                                                                                                partition_index=0)),
                    DescribeTopicPartitionsResponse)
    assert [(t.name, t.error_code) for t in bad.topics] == [("a", INVALID_REQUEST)]
    missing = conn.call(DescribeTopicPartitionsRequest(version=0, topics=[T(name="nope")], response_partition_limit=5,
                                                       cursor=None), DescribeTopicPartitionsResponse)
    assert [(t.name, t.error_code) for t in missing.topics] == [("nope", UNKNOWN_TOPIC_OR_PARTITION)]


def test_offset_for_leader_epoch_answers_a_consumers_position_check(kafka_server, conn):
    """KIP-320 as a consumer asks it (v4): a single store leads every partition in epoch 0, to
    its log end; a newer current epoch than the broker's is UNKNOWN_LEADER_EPOCH (75)."""
    from kafka.protocol.consumer.offsets import OffsetForLeaderEpochRequest, OffsetForLeaderEpochResponse

    kafka_server.store.create_topic("epochs")
    kafka_server.store.partition("epochs", 0).append(b"x")
    kafka_server.store.partition("epochs", 0).append(b"y")
    T = OffsetForLeaderEpochRequest.OffsetForLeaderTopic
    P = T.OffsetForLeaderPartition
    answer = conn.call(OffsetForLeaderEpochRequest(version=4, replica_id=-1, topics=[T(topic="epochs", partitions=[
        P(partition=0, current_leader_epoch=0, leader_epoch=0), P(partition=1, current_leader_epoch=0, leader_epoch=0)]),
        T(topic="epochs-x", partitions=[P(partition=0, current_leader_epoch=-1, leader_epoch=0)])]),
        OffsetForLeaderEpochResponse)
    got = [(t.topic, p.partition, p.error_code, p.leader_epoch, p.end_offset) for t in answer.topics for p in t.partitions]
    assert got == [("epochs", 0, NONE, 0, 2), ("epochs", 1, UNKNOWN_TOPIC_OR_PARTITION, -1, -1),
                   ("epochs-x", 0, UNKNOWN_TOPIC_OR_PARTITION, -1, -1)]
    newer = conn.call(OffsetForLeaderEpochRequest(version=4, replica_id=-1, topics=[T(topic="epochs", partitions=[
        P(partition=0, current_leader_epoch=3, leader_epoch=0)])]), OffsetForLeaderEpochResponse)
    assert newer.topics[0].partitions[0].error_code == 75
