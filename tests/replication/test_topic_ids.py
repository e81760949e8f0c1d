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

from logstore.replica.context import default_cluster_id, replica_topic_id
from logstore.store.topicids import read_partition_metadata

from .test_inprocess import wait_for
from .test_kafka_listener import CONFLUENT_LOGIN, kafka_cluster, leader_of, stop_all

ck = pytest.importorskip("confluent_kafka")
from confluent_kafka import Consumer, Producer, TopicCollection, TopicPartition  # noqa: E402
from confluent_kafka.admin import AdminClient  # noqa: E402

PARTITIONS = (("replicated", 1), ("wide", 3))


def _uuid(ck_uuid) -> uuid.UUID:
    return uuid.UUID(bytes=base64.urlsafe_b64decode(str(ck_uuid) + "=="))


def assigned_values(consumer, count):
    """The first ``count`` values of replicated-0 from its start, read by ``consumer`` (closed
    after; Fetch v13+ addresses the topic by id)."""
    try:
        consumer.assign([TopicPartition("replicated", 0, 0)])
        got: list[bytes] = []
        deadline = time.monotonic() + 30
        while len(got) < count and time.monotonic() < deadline:
            m = consumer.poll(0.5)
            if m is not None and m.error() is None:
                got.append(m.value())
        return got
    finally:
        consumer.close()


def test_every_node_gives_a_topic_the_same_id_and_clients_read_it_from_any(tmp_path):
    nodes, addrs = kafka_cluster(tmp_path, partitions=PARTITIONS)
    try:
        ids = {i: {t: n.store.topic_id(t) for t, _ in PARTITIONS} for i, n in nodes.items()}
        assert ids[0] == ids[1] == ids[2]
        cluster_id = nodes[0].context.cluster_id
        assert all(n.context.cluster_id == cluster_id for n in nodes.values())
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
        assert assigned_values(consumer, 10) == [b"r%d" % i for i in range(10)]  # librdkafka 2.16: by topic id
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


def _legacy_cluster_id(secret: bytes, voters) -> str:
    """How a replica set's cluster id was made before it was chosen: derived from the set's
    secret (which a client reading the id could guess offline), as the old code did."""
    import hashlib
    digest = hashlib.sha256(secret + repr(sorted(voters)).encode()).digest()
    return base64.urlsafe_b64encode(digest[:16]).decode().rstrip("=")


def _strip_cluster_id(data_dir) -> None:
    """Make a data directory look as one written before cluster ids were kept."""
    meta = data_dir / "meta.properties"
    meta.write_text("".join(line for line in meta.read_text().splitlines(True) if not line.startswith("cluster.id=")))


def _described_ids(addrs, topics):
    admin = AdminClient({"bootstrap.servers": "%s:%d" % addrs[0], **CONFLUENT_LOGIN})
    described = admin.describe_topics(TopicCollection(list(topics)))
    cluster = admin.describe_cluster(request_timeout=10).result(20)
    return {t: _uuid(f.result(20).topic_id) for t, f in described.items()}, cluster.cluster_id


@pytest.mark.regression
def test_an_existing_set_keeps_its_topic_ids_under_a_cluster_id_chosen_once(tmp_path):
    """The cluster id was derived from the set's secret (any client reading it could guess the
    secret offline). A set written then, restarted with this version, takes an id that says
    nothing of the secret (derived from its node ids) and keeps it in each node's
    meta.properties; the topics keep the ids their clients know (derived from the old id, kept
    in the stores); the records stay. A node whose directory is older, started alone later,
    takes the same id as its running peers."""
    from .test_kafka_listener import SECRET

    legacy = _legacy_cluster_id(SECRET, [0, 1, 2])
    nodes, addrs = kafka_cluster(tmp_path, partitions=PARTITIONS, cluster_id=legacy)
    try:
        leader_of(nodes)
        producer = Producer({"bootstrap.servers": "%s:%d" % addrs[0], "acks": "all", **CONFLUENT_LOGIN})
        for i in range(5):
            producer.produce("replicated", value=b"old%d" % i)
        assert producer.flush(30) == 0
        before, old_cluster = _described_ids(addrs, ["replicated", "wide"])
        assert old_cluster == legacy and before["wide"] == replica_topic_id(legacy, "wide")
    finally:
        stop_all(nodes)
    for i in range(3):
        _strip_cluster_id(tmp_path / f"node{i}")
    nodes, addrs = kafka_cluster(tmp_path, partitions=PARTITIONS)  # no cluster id given
    try:
        chosen = nodes[0].context.cluster_id
        assert chosen == default_cluster_id([0, 1, 2]) != legacy
        assert all(n.context.cluster_id == chosen for n in nodes.values())
        for i in range(3):
            assert f"cluster.id={chosen}\n" in (tmp_path / f"node{i}" / "meta.properties").read_text()
        leader_of(nodes, ("wide", 2))
        after, new_cluster = _described_ids(addrs, ["replicated", "wide"])
        assert after == before and new_cluster == chosen
        consumer = Consumer({"bootstrap.servers": "%s:%d" % addrs[1], "group.id": "upgrade",
                             "enable.auto.commit": False, **CONFLUENT_LOGIN})
        assert assigned_values(consumer, 5) == [b"old%d" % i for i in range(5)]
        # node 2 restarted from an older directory while 0 and 1 run: it takes their id
        nodes[2].stop()
        _strip_cluster_id(tmp_path / "node2")
        from logstore.replication import ReplicaNode
        nodes[2] = ReplicaNode(2, str(tmp_path / "node2"), addrs[2], {j: a for j, a in addrs.items() if j != 2},
                               SECRET, election_timeout_ms=300, partitions=PARTITIONS).start()
        assert nodes[2].context.cluster_id == chosen
        assert nodes[2].store.topic_id("wide") == before["wide"]
    finally:
        stop_all(nodes)


def test_a_directory_of_another_cluster_and_a_node_of_another_cluster_are_refused(tmp_path, caplog):
    from logstore.errors import LogstoreError
    from logstore.replica.context import random_cluster_id
    from logstore.replication import ReplicaNode

    from .test_kafka_listener import SECRET, free_ports

    ours, theirs = random_cluster_id(), random_cluster_id()
    ports = free_ports(3)
    addrs = {i: ("127.0.0.1", ports[i]) for i in range(3)}
    nodes = {}
    try:
        for i in range(3):  # node 2 is told another cluster's id
            nodes[i] = ReplicaNode(i, str(tmp_path / f"node{i}"), addrs[i],
                                   {j: a for j, a in addrs.items() if j != i}, SECRET, election_timeout_ms=300,
                                   cluster_id=theirs if i == 2 else ours).start()
        leader = leader_of({i: nodes[i] for i in (0, 1)})
        assert leader in (0, 1)
        wait_for(lambda: "INCONSISTENT_CLUSTER_ID" in caplog.text, timeout=10)
        assert (f"belongs to cluster '{theirs}', this node to '{ours}'" in caplog.text
                or f"belongs to cluster '{ours}', this node to '{theirs}'" in caplog.text)
        # node 2, not knowing a leader, asks its peers' Metadata: their answer names their cluster
        wait_for(lambda: "node 2: node 0 belongs to cluster" in caplog.text
                 or "node 2: node 1 belongs to cluster" in caplog.text, timeout=10)
        assert nodes[2].describe()[("replicated", 0)]["leader"] not in (0, 1)  # never followed them
    finally:
        stop_all(nodes)
    # a directory keeps its cluster: started with another id, the node refuses to start
    with pytest.raises(LogstoreError, match=f"belongs to cluster {ours}, not {theirs}"):
        ReplicaNode(0, str(tmp_path / "node0"), addrs[0], {j: a for j, a in addrs.items() if j != 0}, SECRET,
                    cluster_id=theirs)
    with pytest.raises(ValueError, match="is not a cluster id"):
        ReplicaNode(0, str(tmp_path / "node0"), addrs[0], {}, SECRET, cluster_id="not-an-id")
