"""Flexible versions (KIP-482) on the wire: the response header v1 that encode() writes for them
(v0 for ApiVersions), and requests with header v2 read by parse_request, within the ranges a
caller gives (Fetch v12+, Vote, BeginQuorumEpoch are outside SUPPORTED). Requests are written
by kio's own writer."""

from __future__ import annotations

import datetime
import importlib
import io
import uuid

import pytest
from kio.index import load_request_schema, load_response_schema
from kio.schema.errors import ErrorCode
from kio.serial import entity_writer

from logstore.kafka.wire import API_NAMES, SUPPORTED, KafkaProtocolError, UnsupportedVersionError, encode, parse_request

#: what a server serving the KRaft APIs would give parse_request
EXTRA = {**SUPPORTED, 52: (0, 2), 53: (0, 1), 54: (0, 1), 23: (3, 4)}

_VOTE = {"error_code": 0, "topics": [{"topic_name": "__cluster_metadata", "partitions": [
    {"partition_index": 0, "error_code": 0, "leader_id": 1, "leader_epoch": 5, "vote_granted": False}]}],
    "node_endpoints": [{"node_id": 1, "host": "localhost", "port": 9093}]}


def _schema(cls):
    """The module of a kio class (its nested entity classes)."""
    return importlib.import_module(cls.__module__)


def _body(cls, value):
    out = io.BytesIO()
    entity_writer(cls)(out, value)
    return out.getvalue()


def request_frame(api_key, version, body, correlation_id=17, client_id="test-client"):
    """A request as a client sends it after the frame size: header (v2 when flexible), body."""
    cls = load_request_schema(api_key, version)
    header = cls.__header_schema__
    return _body(header, header(request_api_key=api_key, request_api_version=version,
                                correlation_id=correlation_id, client_id=client_id)) + _body(cls, body)


# ---------------------------------------------------------------------- response header
def _vote_v2_body():
    cls = load_response_schema(52, 2)
    m = _schema(cls)
    partition = m.PartitionData(partition_index=0, error_code=ErrorCode(0), leader_id=1, leader_epoch=5,
                                vote_granted=False)
    return _body(cls, cls(error_code=ErrorCode(0), topics=(
        m.TopicData(topic_name="__cluster_metadata", partitions=(partition,)),),
        node_endpoints=(m.NodeEndpoint(node_id=1, host="localhost", port=9093),)))


def test_a_flexible_response_has_header_v1():
    """Size, correlation id, the header's empty tagged fields (0x00), then the body as kio writes it."""
    frame = b"".join(encode(-5, 52, 2, _VOTE))
    body = _vote_v2_body()
    assert frame == (len(body) + 5).to_bytes(4, "big") + (-5).to_bytes(4, "big", signed=True) + b"\x00" + body


def test_api_versions_v3_response_has_header_v0():
    fields = {"error_code": 35, "api_keys": [{"api_key": 18, "min_version": 0, "max_version": 4}], "throttle_time": 0}
    frame = b"".join(encode(8, 18, 3, fields))
    cls = load_response_schema(18, 3)
    m = _schema(cls)
    body = _body(cls, cls(error_code=ErrorCode(35), api_keys=(m.ApiVersion(api_key=18, min_version=0, max_version=4),),
                          throttle_time=datetime.timedelta(0)))
    assert frame == (len(body) + 4).to_bytes(4, "big") + (8).to_bytes(4, "big") + body


def test_a_non_flexible_response_keeps_header_v0():
    frame = b"".join(encode(8, 12, 3, {"throttle_time": 0, "error_code": 27}))  # Heartbeat v3
    assert frame == (10).to_bytes(4, "big") + (8).to_bytes(4, "big") + b"\0\0\0\0" + b"\0\x1b"


# ---------------------------------------------------------------------- requests with header v2
def _fetch_v12():
    cls = load_request_schema(1, 12)
    m = _schema(cls)
    partition = m.FetchPartition(partition=0, current_leader_epoch=3, fetch_offset=100, last_fetched_epoch=2,
                                 log_start_offset=0, partition_max_bytes=1 << 20)
    return cls(cluster_id="cluster-a", replica_id=2, max_wait=datetime.timedelta(milliseconds=500), min_bytes=1,
               max_bytes=1 << 24, isolation_level=0, session_id=0, session_epoch=-1,
               topics=(m.FetchTopic(topic="t", partitions=(partition,)),), forgotten_topics_data=(), rack_id="")


def _fetch_v15():
    cls = load_request_schema(1, 15)
    m = _schema(cls)
    partition = m.FetchPartition(partition=1, current_leader_epoch=4, fetch_offset=7, last_fetched_epoch=4,
                                 log_start_offset=-1, partition_max_bytes=1 << 20)
    return cls(replica_state=m.ReplicaState(replica_id=3, replica_epoch=9),
               max_wait=datetime.timedelta(milliseconds=100), min_bytes=1,
               topics=(m.FetchTopic(topic_id=uuid.UUID(int=42), partitions=(partition,)),), forgotten_topics_data=())


def _vote_v2():
    cls = load_request_schema(52, 2)
    m = _schema(cls)
    partition = m.PartitionData(partition_index=0, replica_epoch=5, replica_id=1, replica_directory_id=uuid.UUID(int=7),
                                voter_directory_id=None, last_offset_epoch=4, last_offset=100, pre_vote=True)
    return cls(cluster_id="cluster-a", voter_id=2,
               topics=(m.TopicData(topic_name="__cluster_metadata", partitions=(partition,)),))


def _begin_quorum_epoch_v1():
    cls = load_request_schema(53, 1)
    m = _schema(cls)
    partition = m.PartitionData(partition_index=0, voter_directory_id=None, leader_id=1, leader_epoch=6)
    return cls(cluster_id=None, voter_id=3,
               topics=(m.TopicData(topic_name="__cluster_metadata", partitions=(partition,)),),
               leader_endpoints=(m.LeaderEndpoint(name="CONTROLLER", host="localhost", port=9093),))


def _fetch_v16():
    cls = load_request_schema(1, 16)
    m = _schema(cls)
    partition = m.FetchPartition(partition=0, current_leader_epoch=-1, fetch_offset=5, last_fetched_epoch=-1,
                                 log_start_offset=-1, partition_max_bytes=1 << 20)
    return cls(replica_state=m.ReplicaState(replica_id=-1, replica_epoch=-1),
               max_wait=datetime.timedelta(milliseconds=500), min_bytes=1, max_bytes=1 << 24, isolation_level=1,
               session_id=0, session_epoch=-1,
               topics=(m.FetchTopic(topic_id=uuid.UUID(int=99), partitions=(partition,)),),
               forgotten_topics_data=(), rack_id="")


def _metadata_v12():
    cls = load_request_schema(3, 12)
    m = _schema(cls)
    return cls(topics=(m.MetadataRequestTopic(topic_id=uuid.UUID(int=99), name=None),
                       m.MetadataRequestTopic(topic_id=None, name="orders")),
               allow_auto_topic_creation=False, include_topic_authorized_operations=True)


def _delete_topics_v6():
    cls = load_request_schema(20, 6)
    m = _schema(cls)
    return cls(topics=(m.DeleteTopicState(name=None, topic_id=uuid.UUID(int=99)),
                       m.DeleteTopicState(name="orders", topic_id=None)),
               timeout=datetime.timedelta(seconds=30))


def _api_versions_v4():
    cls = load_request_schema(18, 4)
    return cls(client_software_name="confluent-kafka-python", client_software_version="2.16.1-rdkafka-2.16.1")


def _describe_cluster_v2():
    cls = load_request_schema(60, 2)
    return cls(include_cluster_authorized_operations=True, endpoint_type=1, include_fenced_brokers=True)


def _describe_topic_partitions_v0():
    cls = load_request_schema(75, 0)
    m = _schema(cls)
    return cls(topics=(m.TopicRequest(name="a"), m.TopicRequest(name="b")), response_partition_limit=3,
               cursor=m.Cursor(topic_name="a", partition_index=2))


#: flexible requests of versions outside SUPPORTED (a peer's) and of the newest ones it serves
REQUESTS = {"Fetch v12": (1, 12, _fetch_v12), "Fetch v15": (1, 15, _fetch_v15), "Vote v2": (52, 2, _vote_v2),
            "BeginQuorumEpoch v1": (53, 1, _begin_quorum_epoch_v1), "Fetch v16": (1, 16, _fetch_v16),
            "Metadata v12": (3, 12, _metadata_v12), "DeleteTopics v6": (20, 6, _delete_topics_v6),
            "ApiVersions v4": (18, 4, _api_versions_v4), "DescribeCluster v2": (60, 2, _describe_cluster_v2),
            "DescribeTopicPartitions v0": (75, 0, _describe_topic_partitions_v0)}


@pytest.mark.parametrize("client_id", ["replica-2", None])
@pytest.mark.parametrize("name", list(REQUESTS))
def test_a_flexible_request_is_read_within_the_ranges_given(name, client_id):
    api_key, version, build = REQUESTS[name]
    body = build()
    assert load_request_schema(api_key, version).__header_schema__.__version__ == 2
    request = parse_request(request_frame(api_key, version, body, client_id=client_id), EXTRA)
    assert (request.api_key, request.api_version, request.correlation_id, request.client_id) == (
        api_key, version, 17, client_id)
    assert request.body == body and request.name == API_NAMES[api_key]


def test_fetch_v12_and_v15_fields_are_read():
    """The fields a follower's fetch carries: replica id (v12; replica_state, a tagged field, from
    v15), last fetched epoch, the tagged cluster id."""
    v12 = parse_request(request_frame(1, 12, _fetch_v12()), supported=EXTRA).body
    assert (v12.replica_id, v12.cluster_id) == (2, "cluster-a")
    assert v12.topics[0].partitions[0].last_fetched_epoch == 2
    v15 = parse_request(request_frame(1, 15, _fetch_v15()), supported=EXTRA).body
    assert (v15.replica_state.replica_id, v15.replica_state.replica_epoch, v15.cluster_id) == (3, 9, None)
    assert v15.topics[0].partitions[0].last_fetched_epoch == 4


def test_topic_ids_and_cursors_of_the_newest_versions_are_read():
    fetch = parse_request(request_frame(1, 16, _fetch_v16())).body
    assert fetch.topics[0].topic_id == uuid.UUID(int=99) and fetch.replica_state.replica_id == -1
    metadata = parse_request(request_frame(3, 12, _metadata_v12())).body
    assert [(t.name, t.topic_id) for t in metadata.topics] == [(None, uuid.UUID(int=99)), ("orders", None)]
    delete = parse_request(request_frame(20, 6, _delete_topics_v6())).body
    assert [(t.name, t.topic_id) for t in delete.topics] == [(None, uuid.UUID(int=99)), ("orders", None)]  # zero: None
    versions = parse_request(request_frame(18, 4, _api_versions_v4())).body
    assert versions.client_software_name == "confluent-kafka-python"
    describe = parse_request(request_frame(75, 0, _describe_topic_partitions_v0())).body
    cursor = describe.cursor
    assert (cursor.topic_name, cursor.partition_index, describe.response_partition_limit) == ("a", 2, 3)


def test_vote_pre_vote_is_read():
    body = parse_request(request_frame(52, 2, _vote_v2()), supported=EXTRA).body
    assert body.topics[0].partitions[0].pre_vote is True


@pytest.mark.parametrize("name", [n for n, (key, version, _) in REQUESTS.items()
                                  if not SUPPORTED.get(key, (0, -1))[0] <= version <= SUPPORTED.get(key, (0, -1))[1]])
def test_without_the_ranges_a_flexible_request_is_unsupported(name):
    api_key, version, build = REQUESTS[name]
    with pytest.raises(UnsupportedVersionError, match=f"{API_NAMES[api_key]} v{version} is not supported") as info:
        parse_request(request_frame(api_key, version, build(), correlation_id=23))
    assert (info.value.api_key, info.value.api_version, info.value.correlation_id) == (api_key, version, 23)


def test_a_version_outside_the_ranges_given_is_unsupported():
    frame = request_frame(52, 2, _vote_v2())
    with pytest.raises(UnsupportedVersionError, match="Vote v2"):
        parse_request(frame, {**EXTRA, 52: (0, 1)})


def test_a_flexible_request_with_bytes_after_it_is_refused():
    with pytest.raises(KafkaProtocolError, match="1 bytes after the request"):
        parse_request(request_frame(52, 2, _vote_v2()) + b"\0", EXTRA)


def test_a_flexible_request_truncated_or_with_an_unknown_tag_is_malformed():
    frame = request_frame(53, 1, _begin_quorum_epoch_v1(), client_id="me")
    with pytest.raises(KafkaProtocolError, match="malformed"):
        parse_request(frame[:-3], EXTRA)
    header_end = 2 + 2 + 4 + 2 + len("me")  # api key, version, correlation id, client id: then its tags
    assert frame[header_end] == 0
    tagged = frame[:header_end] + b"\x01\x07\x02xy" + frame[header_end + 1:]  # one tag kio does not know
    with pytest.raises(KafkaProtocolError, match="malformed"):
        parse_request(tagged, EXTRA)


def test_librdkafkas_all_topics_metadata_with_its_four_byte_null_array_is_read_as_kafka_reads_it():
    """librdkafka 2.16's all-topics Metadata v12, byte for byte (its topic array's count left as
    a four-byte placeholder): read as every topic, the three bytes after ignored, as Kafka does."""
    frame = bytes.fromhex("0003000c00000003000772646b61666b610000000000010000")
    request = parse_request(frame)
    assert (request.api_key, request.api_version, request.client_id, request.body.topics) == (3, 12, "rdkafka", None)
    # Only that request: the same bytes after a Metadata naming its topics are refused.
    named = request_frame(3, 12, _metadata_v12())
    with pytest.raises(KafkaProtocolError, match="3 bytes after the request"):
        parse_request(named + b"\x01\x00\x00")
