"""A KIP-848 consumer group on a replica set (``logstore node`` processes): two librdkafka
consumers carry on after the group coordinator's node, the leader of ``__consumer_offsets-0``,
is killed with SIGKILL: the new leader takes the group up from the replicated records (no
rebalance: the members keep their epochs and partitions), every record is consumed once, and
the commits, read afterwards from a node's own store, never move backwards. Both members speak
the consumer protocol (``group.protocol=consumer``), or, in a mixed group, one of them the
classic protocol (taken up with its session timeout and protocols)."""

from __future__ import annotations

import pytest

from logstore import LogStore

from kafka_clients.test_kip848 import Member, assert_commits_never_backwards, commit_start_offsets, consumed, stable, \
    wait_for
from .kafkanodes import KafkaNodes

confluent_kafka = pytest.importorskip("confluent_kafka")

SECRET = b"kip848-secret"
PARTITIONS = 6
PER_PARTITION = 10
#: a member of a mixed group: librdkafka's classic protocol, eager range assignment
CLASSIC = {"group.protocol": "classic", "partition.assignment.strategy": "range", "session.timeout.ms": 10000,
           "heartbeat.interval.ms": 500}


def produce_phase(cluster, phase):
    producer = confluent_kafka.Producer({**cluster.client_config, "bootstrap.servers": cluster.bootstrap,
                                         "acks": "all", "enable.idempotence": True})
    for p in range(PARTITIONS):
        for i in range(PER_PARTITION):
            producer.produce("work", f"{phase}-{p}-{i}".encode(), partition=p)
    assert producer.flush(60) == 0


@pytest.mark.parametrize("mixed", [False, True], ids=["consumer", "mixed"])
def test_a_consumer_group_carries_on_after_the_coordinator_is_killed(tmp_path, mixed):
    cluster = KafkaNodes(tmp_path, SECRET, topics=f"work:{PARTITIONS}",
                         options=("--group-consumer-session-timeout-ms=10000",
                                  "--group-consumer-heartbeat-interval-ms=300"))
    members = []
    successor = None
    try:
        for i in cluster.addrs:
            cluster.start(i)
        coordinator = cluster.leader("__consumer_offsets")
        assert coordinator is not None and cluster.leader("work") is not None
        produce_phase(cluster, 1)
        commit_start_offsets(cluster.bootstrap, config=cluster.client_config)  # (librdkafka's re-reads: see there)
        members = [Member(cluster.bootstrap, config=cluster.client_config),
                   Member(cluster.bootstrap, config={**cluster.client_config, **(CLASSIC if mixed else {})})]
        wait_for("a stable group of two", lambda: stable(members), timeout=90)
        wait_for("phase 1 consumed", lambda: consumed(members, 1) >= PARTITIONS * PER_PARTITION, timeout=90)
        held = [m.assignment() for m in members]

        cluster.kill(coordinator)
        successor = cluster.leader("__consumer_offsets")
        assert successor is not None and successor != coordinator
        produce_phase(cluster, 2)
        wait_for("phase 2 consumed", lambda: consumed(members, 2) >= PARTITIONS * PER_PARTITION, timeout=90)
        assert [m.assignment() for m in members] == held  # taken up by the new coordinator as it was
        everything = [r for m in members for r in m.records()]
        assert len(everything) == len(set(everything)) == 2 * PARTITIONS * PER_PARTITION
    finally:
        for m in members:
            m.stop()
        cluster.stop_all()
    store = LogStore(str(tmp_path / f"n{successor}"), maintenance=False)
    try:
        final = assert_commits_never_backwards(store, "grp")
        # at each log's end (past the leader-change control records a new leader writes)
        assert final == {("work", p): store.partition("work", p).log_end_offset for p in range(PARTITIONS)}
        assert all(offset >= 2 * PER_PARTITION for offset in final.values())
    finally:
        store.close()


def test_offset_for_leader_epoch_answers_where_each_epoch_ends(tmp_path):
    """KIP-320 through kafka-python's message classes: the leader answers where an epoch ends,
    a follower NOT_LEADER_OR_FOLLOWER, a stale current epoch FENCED_LEADER_EPOCH."""
    from kafka.protocol.consumer.offsets import OffsetForLeaderEpochRequest, OffsetForLeaderEpochResponse

    from .test_inprocess import wait_for as wait_until
    from .test_kafka_listener import KEY, Conn, kafka_cluster, leader_of, stop_all

    topic_cls = OffsetForLeaderEpochRequest.OffsetForLeaderTopic
    partition_cls = topic_cls.OffsetForLeaderPartition

    def ask(address, current, epoch):
        conn = Conn(address)
        try:
            request = OffsetForLeaderEpochRequest(version=3, replica_id=-1, topics=[topic_cls(
                topic="replicated", partitions=[partition_cls(partition=0, current_leader_epoch=current,
                                                              leader_epoch=epoch)])])
            answer = conn.call(request, OffsetForLeaderEpochResponse)
        finally:
            conn.close()
        (topic,) = answer.topics
        (partition,) = topic.partitions
        return partition.error_code, partition.leader_epoch, partition.end_offset

    nodes, kafka = kafka_cluster(tmp_path)
    try:
        leader = leader_of(nodes)
        wait_until(lambda: all(n.describe()[KEY]["leader"] == leader for n in nodes.values()))
        epoch = nodes[leader].describe()[KEY]["epoch"]
        error, found_epoch, end_offset = ask(kafka[leader], epoch, epoch)
        assert (error, found_epoch) == (0, epoch) and end_offset >= 0  # the latest epoch ends at the log end
        assert ask(kafka[leader], epoch - 1, epoch)[0] == 74  # FENCED_LEADER_EPOCH
        assert ask(kafka[leader], epoch + 1, epoch)[0] == 75  # UNKNOWN_LEADER_EPOCH
        follower = next(i for i in nodes if i != leader)
        assert ask(kafka[follower], epoch, epoch)[0] == 6  # NOT_LEADER_OR_FOLLOWER
    finally:
        stop_all(nodes)
