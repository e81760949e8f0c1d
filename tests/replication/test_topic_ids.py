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

from .test_inprocess import wait_for
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


def test_a_follower_refusing_a_produce_or_fetch_names_the_leader(tmp_path):
    """Produce v11 and Fetch v16 (KIP-951): NOT_LEADER_OR_FOLLOWER comes with the partition's
    current leader and epoch, and the leader's endpoint; written and read by kafka-python's
    protocol classes."""
    from kafka.protocol.consumer.fetch import FetchRequest, FetchResponse
    from kafka.protocol.producer.produce import ProduceRequest, ProduceResponse

    from .test_kafka_listener import Conn, batch

    nodes, addrs = kafka_cluster(tmp_path)
    try:
        leader = leader_of(nodes)
        # every node knows the leader (a follower learns it from the leader's BeginQuorumEpoch)
        wait_for(lambda: all(n.describe()[("replicated", 0)]["leader"] == leader for n in nodes.values()))
        epoch = nodes[leader].describe()[("replicated", 0)]["epoch"]
        follower = next(i for i in nodes if i != leader)
        conn = Conn(addrs[follower])
        try:
            P = ProduceRequest.TopicProduceData
            answer = conn.call(ProduceRequest(version=11, transactional_id=None, acks=-1, timeout_ms=5000, topic_data=[
                P(name="replicated", partition_data=[P.PartitionProduceData(index=0, records=batch([b"x"]))])]),
                ProduceResponse)
            (entry,) = answer.responses[0].partition_responses
            assert entry.error_code == 6  # NOT_LEADER_OR_FOLLOWER
            assert (entry.current_leader.leader_id, entry.current_leader.leader_epoch) == (leader, epoch)
            assert [(e.node_id, e.host, e.port) for e in answer.node_endpoints] == [(leader, *addrs[leader])]
            T = FetchRequest.FetchTopic
            part = T.FetchPartition(partition=0, current_leader_epoch=-1, fetch_offset=0, last_fetched_epoch=-1,
                                    log_start_offset=-1, partition_max_bytes=1 << 20)
            topic_id = nodes[follower].store.topic_id("replicated")
            answer = conn.call(FetchRequest(version=16, max_wait_ms=0, min_bytes=0, max_bytes=1 << 20,
                                            isolation_level=0, session_id=0, session_epoch=-1,
                                            topics=[T(topic_id=topic_id, partitions=[part])],
                                            forgotten_topics_data=[], rack_id=""), FetchResponse)
            (partition,) = answer.responses[0].partitions
            assert answer.responses[0].topic_id == topic_id
            assert partition.error_code == 6
            assert (partition.current_leader.leader_id, partition.current_leader.leader_epoch) == (leader, epoch)
            assert [(e.node_id, e.port) for e in answer.node_endpoints] == [(leader, addrs[leader][1])]
        finally:
            conn.close()
    finally:
        stop_all(nodes)


def test_a_kafka_python_consumer_keeps_reading_after_its_leader_stops(tmp_path):
    """kafka-python 3 (Metadata v12, Fetch v16) checks its position with OffsetForLeaderEpoch
    once the partition's leader epoch moves past its records' (KIP-320): the new leader
    answers it, and the consumer reads on (without it, the partition is never fetched again)."""
    import kafka

    from .test_kafka_listener import KAFKA_PYTHON_LOGIN

    nodes, addrs = kafka_cluster(tmp_path)
    bootstrap = ",".join(f"{h}:{p}" for h, p in addrs.values())
    consumer = None
    try:
        leader = leader_of(nodes)
        producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", **CONFLUENT_LOGIN})
        for i in range(20):
            producer.produce("replicated", value=b"a%d" % i)
        assert producer.flush(30) == 0
        consumer = kafka.KafkaConsumer("replicated", group_id="kp", bootstrap_servers=bootstrap.split(","),
                                       auto_offset_reset="earliest", enable_auto_commit=False, **KAFKA_PYTHON_LOGIN)
        got: list[bytes] = []
        deadline = time.monotonic() + 30
        while len(got) < 20 and time.monotonic() < deadline:
            got += [r.value for records in consumer.poll(500).values() for r in records]
        assert got == [b"a%d" % i for i in range(20)]
        nodes[leader].stop()
        leader_of({i: n for i, n in nodes.items() if i != leader}, timeout=20)
        for i in range(20):
            producer.produce("replicated", value=b"b%d" % i)
        assert producer.flush(30) == 0
        deadline = time.monotonic() + 40
        while len(got) < 40 and time.monotonic() < deadline:
            got += [r.value for records in consumer.poll(500).values() for r in records]
        assert got[20:] == [b"b%d" % i for i in range(20)]
    finally:
        if consumer is not None:
            consumer.close(autocommit=False)
        stop_all(nodes)
