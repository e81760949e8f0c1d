"""A KIP-848 mixed group on a replica set (``logstore node`` processes): a librdkafka consumer of
the consumer protocol and one of the classic protocol (``group.protocol=classic``) share a group;
the coordinator's node, the leader of ``__consumer_offsets-0``, is killed with SIGKILL, and the
new leader takes the mixed group up from the replicated records (its classic member with its
session timeout and protocols): the members keep their partitions, every record is consumed once,
and the commits, read afterwards from a node's own store, never move backwards."""

from __future__ import annotations

import pytest

from logstore import LogStore

from kafka_clients.test_kip848 import Member, assert_commits_never_backwards, consumed, stable, wait_for
from .kafkanodes import KafkaNodes
from .test_kip848_failover import PARTITIONS, PER_PARTITION, SECRET, produce_phase

confluent_kafka = pytest.importorskip("confluent_kafka")

CLASSIC = {"group.protocol": "classic", "partition.assignment.strategy": "range", "session.timeout.ms": 10000,
           "heartbeat.interval.ms": 500}


def test_a_mixed_group_carries_on_after_the_coordinator_is_killed(tmp_path):
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
        members = [Member(cluster.bootstrap, config=cluster.client_config),
                   Member(cluster.bootstrap, config={**cluster.client_config, **CLASSIC})]
        wait_for("a stable mixed group of two", lambda: stable(members), timeout=90)
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
        assert final == {("work", p): store.partition("work", p).log_end_offset for p in range(PARTITIONS)}
    finally:
        store.close()
