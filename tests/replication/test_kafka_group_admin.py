"""Group administration on the replica set: the group coordinator is the leader of
``__consumer_offsets-0``; DeleteGroups, OffsetDelete, ListGroups with states and types,
DescribeGroups and OffsetFetch of several groups with the committed leader epochs work there
(through confluent-kafka's and kafka-python's admin clients), what they write is replicated
(a new coordinator after the old one stops has it), and every other node refuses each request
with NOT_COORDINATOR in the shape of the version asked."""

from __future__ import annotations

import pytest
from kafka import KafkaAdminClient
from kafka import TopicPartition as KafkaPythonTopicPartition
from kafka import errors as kafka_errors
from kafka.protocol.admin.groups import DeleteGroupsRequest, DeleteGroupsResponse, DescribeGroupsRequest, \
    DescribeGroupsResponse, ListGroupsRequest, ListGroupsResponse
from kafka.protocol.consumer.group import OffsetDeleteRequest, OffsetDeleteResponse, OffsetFetchRequest, \
    OffsetFetchResponse
from kafka.protocol.metadata.find_coordinator import FindCoordinatorRequest, FindCoordinatorResponse

from .test_inprocess import wait_for
from .test_kafka_listener import CONFLUENT_LOGIN, KAFKA_PYTHON_LOGIN, OFFSETS_KEY, Conn, kafka_cluster, leader_of, \
    stop_all

confluent_kafka = pytest.importorskip("confluent_kafka")
from confluent_kafka import ConsumerGroupState, ConsumerGroupTopicPartitions, ConsumerGroupType, TopicPartition  # noqa: E402
from confluent_kafka.admin import AdminClient  # noqa: E402

NONE, NOT_COORDINATOR = 0, 16


def call(conn, request, response_cls):
    """One request of a kafka-python class indexed by version, decoded as that version."""
    return conn.call(request, response_cls[request.API_VERSION])


def test_group_administration_on_the_coordinator_is_replicated(tmp_path):
    nodes, kafka = kafka_cluster(tmp_path, partitions=(("replicated", 2),))
    bootstrap = ",".join(f"{h}:{p}" for h, p in kafka.values())
    try:
        coordinator = leader_of(nodes, key=OFFSETS_KEY)
        wait_for(lambda: all(n.describe()[OFFSETS_KEY]["leader"] == coordinator for n in nodes.values()))
        admin = AdminClient({**CONFLUENT_LOGIN, "bootstrap.servers": bootstrap})
        for group, parts in (("keep", [TopicPartition("replicated", 0, 5, leader_epoch=3),
                                       TopicPartition("replicated", 1, 6)]),
                             ("doomed", [TopicPartition("replicated", 0, 1)])):
            admin.alter_consumer_group_offsets([ConsumerGroupTopicPartitions(group, parts)])[group].result(30)
        listed = admin.list_consumer_groups(states={ConsumerGroupState.EMPTY},
                                            types={ConsumerGroupType.CLASSIC}).result(30)
        assert sorted((g.group_id, g.state) for g in listed.valid) == \
            [("doomed", ConsumerGroupState.EMPTY), ("keep", ConsumerGroupState.EMPTY)]
        assert admin.delete_consumer_groups(["doomed"])["doomed"].result(30) is None
        kp = KafkaAdminClient(bootstrap_servers=bootstrap.split(","), **KAFKA_PYTHON_LOGIN)
        try:
            assert kp.delete_group_offsets("keep", [KafkaPythonTopicPartition("replicated", 1)]) == \
                {KafkaPythonTopicPartition("replicated", 1): kafka_errors.NoError}
            found = kp.list_group_offsets(["keep", "doomed"])
        finally:
            kp.close()
        assert {g: {tp.partition: (o.offset, o.leader_epoch) for tp, o in parts.items()}
                for g, parts in found.items()} == {"keep": {0: (5, 3)}, "doomed": {}}
        nodes[coordinator].stop()
        rest = {i: n for i, n in nodes.items() if i != coordinator}
        successor = leader_of(rest, key=OFFSETS_KEY)  # a new coordinator takes the groups up from the replicated log
        live = ",".join(f"{h}:{p}" for i, (h, p) in kafka.items() if i != coordinator)
        admin = AdminClient({**CONFLUENT_LOGIN, "bootstrap.servers": live})
        offsets = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions("keep")])["keep"].result(30)
        assert [(tp.partition, tp.offset, tp.leader_epoch) for tp in offsets.topic_partitions] == [(0, 5, 3)]
        # (librdkafka's listing asks every broker Metadata names, the stopped one too: ask the coordinator)
        kp = KafkaAdminClient(bootstrap_servers=live.split(","), **KAFKA_PYTHON_LOGIN)
        try:
            assert [(g["group_id"], g["group_state"]) for g in kp.list_groups(broker_ids=[successor])] == \
                [("keep", "Empty")]
        finally:
            kp.close()
    finally:
        stop_all(nodes)


def test_a_node_that_is_not_the_coordinator_refuses_each_group_request_in_its_versions_shape(tmp_path):
    nodes, kafka = kafka_cluster(tmp_path)
    try:
        coordinator = leader_of(nodes, key=OFFSETS_KEY)
        wait_for(lambda: all(n.describe()[OFFSETS_KEY]["leader"] == coordinator for n in nodes.values()))
        other = next(i for i in nodes if i != coordinator)
        conn = Conn(kafka[other])
        try:
            found = call(conn, FindCoordinatorRequest[4](key_type=0, coordinator_keys=["a", "b"]),
                         FindCoordinatorResponse)
            assert [(c.key, c.node_id, (c.host, c.port), c.error_code) for c in found.coordinators] == \
                [(k, coordinator, kafka[coordinator], NONE) for k in ("a", "b")]
            deleted = call(conn, DeleteGroupsRequest[2](groups_names=["a", "b"]), DeleteGroupsResponse)
            assert [(r.group_id, r.error_code) for r in deleted.results] == [("a", NOT_COORDINATOR),
                                                                             ("b", NOT_COORDINATOR)]
            Topic = OffsetDeleteRequest.OffsetDeleteRequestTopic
            refused = call(conn, OffsetDeleteRequest[0](group_id="a", topics=[Topic(
                name="replicated", partitions=[Topic.OffsetDeleteRequestPartition(partition_index=0)])]),
                OffsetDeleteResponse)
            assert refused.error_code == NOT_COORDINATOR
            Group = OffsetFetchRequest.OffsetFetchRequestGroup
            fetched = call(conn, OffsetFetchRequest[8](groups=[
                Group(group_id="a", topics=[Group.OffsetFetchRequestTopics(name="replicated", partition_indexes=[0])]),
                Group(group_id="b", topics=None)], require_stable=False), OffsetFetchResponse)
            assert [(g.group_id, g.error_code, [p.error_code for t in g.topics for p in t.partitions])
                    for g in fetched.groups] == [("a", NOT_COORDINATOR, [NOT_COORDINATOR]), ("b", NOT_COORDINATOR, [])]
            described = call(conn, DescribeGroupsRequest[6](groups=["a"], include_authorized_operations=False),
                             DescribeGroupsResponse)
            assert [(g.group_id, g.error_code) for g in described.groups] == [("a", NOT_COORDINATOR)]
            listed = call(conn, ListGroupsRequest[5](states_filter=[], types_filter=[]), ListGroupsResponse)
            assert (listed.error_code, listed.groups) == (NONE, [])  # this node coordinates none
        finally:
            conn.close()
    finally:
        stop_all(nodes)
