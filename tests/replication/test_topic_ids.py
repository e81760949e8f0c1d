"""Topic ids (KIP-516) on a replica set: every node gives a topic the same id (derived from the
set's cluster id and the topic's name), in its store and in each partition's
``partition.metadata``, kept across a restart; clients (confluent-kafka) read it from any node
and fetch by it (Fetch v13+); DescribeTopicPartitions and DescribeCluster name the set's nodes
and leaders; a follower's refusal of a produce names the leader (Produce v10+)."""

from __future__ import annotations

import base64
import time
import uuid

import pytest

from logstore.replica.context import cluster_id_of, replica_topic_id
from logstore.store.topicids import read_partition_metadata

from .test_kafka_listener import CONFLUENT_LOGIN, kafka_cluster, leader_of, stop_all

ck = pytest.importorskip("confluent_kafka")
from confluent_kafka import Consumer, Producer, TopicCollection, TopicPartition  # noqa: E402
from confluent_kafka.admin import AdminClient  # noqa: E402

PARTITIONS = (("replicated", 1), ("wide", 3))


def _uuid(ck_uuid) -> uuid.UUID:
    return uuid.UUID(bytes=base64.urlsafe_b64decode(str(ck_uuid) + "=="))


def test_every_node_gives_a_topic_the_same_id_and_clients_read_it_from_any(tmp_path):
    nodes, addrs = kafka_cluster(tmp_path, partitions=PARTITIONS)
    try:
        ids = {i: {t: n.store.topic_id(t) for t, _ in PARTITIONS} for i, n in nodes.items()}
        assert ids[0] == ids[1] == ids[2]
        cluster_id = cluster_id_of(nodes[0].context.secret, nodes[0].context.voters)
        assert ids[0]["wide"] == replica_topic_id(cluster_id, "wide") != ids[0]["replicated"]
        for i in nodes:
            for p in range(3):
                assert read_partition_metadata(str(tmp_path / f"node{i}" / f"wide-{p}")) == ids[0]["wide"]
        leader_of(nodes, ("wide", 2))
        for i, (host, port) in addrs.items():  # each node answers for the whole set
            admin = AdminClient({"bootstrap.servers": f"{host}:{port}", **CONFLUENT_LOGIN})
            described = admin.describe_topics(TopicCollection(["wide"]))["wide"].result(20)
            assert _uuid(described.topic_id) == ids[0]["wide"]
            assert [p.id for p in described.partitions] == [0, 1, 2]
            assert all(sorted(r.id for r in p.replicas) == [0, 1, 2] for p in described.partitions)
            cluster = admin.describe_cluster(request_timeout=10).result(20)
            assert sorted(n.id for n in cluster.nodes) == [0, 1, 2]
            assert cluster.cluster_id == cluster_id
    finally:
        stop_all(nodes)
    # A restart keeps every id (the stores hold them).
    nodes, _ = kafka_cluster(tmp_path, partitions=PARTITIONS)
    try:
        assert all(n.store.topic_id("wide") == ids[0]["wide"] for n in nodes.values())
    finally:
        stop_all(nodes)


def test_a_consumer_fetching_by_id_reads_what_the_leader_committed(tmp_path):
    nodes, addrs = kafka_cluster(tmp_path)
    try:
        leader_of(nodes)
        bootstrap = ",".join(f"{h}:{p}" for h, p in addrs.values())
        producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", **CONFLUENT_LOGIN})
        for i in range(10):
            producer.produce("replicated", value=b"r%d" % i)
        assert producer.flush(30) == 0
        consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "by-id", "enable.auto.commit": False,
                             **CONFLUENT_LOGIN})
        try:
            consumer.assign([TopicPartition("replicated", 0, 0)])  # librdkafka 2.16: Fetch v13+, by topic id
            got = []
            deadline = time.monotonic() + 30
            while len(got) < 10 and time.monotonic() < deadline:
                m = consumer.poll(0.5)
                if m is not None and m.error() is None:
                    got.append(m.value())
            assert got == [b"r%d" % i for i in range(10)]
        finally:
            consumer.close()
    finally:
        stop_all(nodes)
