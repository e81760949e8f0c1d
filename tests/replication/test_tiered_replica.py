"""Tiered storage (KIP-405) on a three-node replica set tiering into ``file://``: the leader of a
partition copies its sealed segments and the events go to the replicated
``__remote_log_metadata``; the followers drop their copied segments by local retention and read
everything back through the tier; Kafka clients read across the boundary; total retention set
through a follower expires remote segments and moves every node's log start; a new leader copies on
from the remote end; a node restarted with an empty disk catches up through the tier."""

from __future__ import annotations

import os
import shutil
import time

import pytest

from logstore.replication import ReplicaNode

from .test_inprocess import SECRET, free_ports, wait_for
from .test_kafka_listener import CONFLUENT_LOGIN, leader_of, stop_all
from .test_metadata import until_done

confluent_kafka = pytest.importorskip("confluent_kafka")
from confluent_kafka.admin import AdminClient, NewTopic  # noqa: E402

TOPIC = "tiered"
KEY = (TOPIC, 0)
TOPIC_CONFIG = {"remote.storage.enable": "true", "segment.bytes": "4096", "local.retention.bytes": "0",
                "retention.ms": "-1", "local.retention.ms": "-1"}
N = 400


def start_node(i, tmp_path, addrs, remote, **kw):
    return ReplicaNode(i, str(tmp_path / f"node{i}"), addrs[i], {j: a for j, a in addrs.items() if j != i}, SECRET,
                       election_timeout_ms=300, replica_fetch_wait_max_ms=50, remote_storage=f"file://{remote}",
                       remote_log_manager_task_interval_ms=100, **kw).start()


def tiered_cluster(tmp_path, n=3):
    remote = tmp_path / "remote"
    remote.mkdir()
    ports = free_ports(n)
    addrs = {i: ("127.0.0.1", ports[i]) for i in range(n)}
    nodes = {i: start_node(i, tmp_path, addrs, remote) for i in range(n)}
    return nodes, addrs, remote


def bootstrap(addrs):
    return {"bootstrap.servers": ",".join(f"{h}:{p}" for h, p in addrs.values()), **CONFLUENT_LOGIN}


def create_tiered_topic(addrs, nodes):
    for key in (("__cluster_metadata", 0), ("__remote_log_metadata", 0)):
        leader_of(nodes, key)
    admin = AdminClient(bootstrap(addrs))
    until_done(lambda: admin.create_topics([NewTopic(TOPIC, 1, replication_factor=3, config=TOPIC_CONFIG)]))
    for node in nodes.values():
        wait_for(lambda: KEY in node.describe(), timeout=20)


def produce(addrs, values):
    producer = confluent_kafka.Producer({**bootstrap(addrs), "acks": "all", "enable.idempotence": True,
                                         "linger.ms": 0, "batch.num.messages": 10})
    for v in values:
        producer.produce(TOPIC, v, partition=0)
        producer.poll(0)
    assert producer.flush(30) == 0


def consume(addrs, n, offset=0):
    consumer = confluent_kafka.Consumer({**bootstrap(addrs), "group.id": "g", "enable.auto.commit": False})
    consumer.assign([confluent_kafka.TopicPartition(TOPIC, 0, offset)])
    out = []
    try:
        deadline = time.monotonic() + 30
        while len(out) < n and time.monotonic() < deadline:
            m = consumer.poll(0.5)
            if m is None:
                continue
            assert m.error() is None, m.error()
            out.append((m.offset(), m.value()))
    finally:
        consumer.close()
    return out


def values(start, n):
    return [f"record-{i:05d}".encode() * 8 for i in range(start, start + n)]


def read_all(node):
    """Every record value of the node's replica below its high watermark, through the library
    (below its local segments: from the tier)."""
    out, offset = [], 0
    end = node.describe()[KEY]["high_watermark"]
    while offset < end:
        batch = node.read(TOPIC, 0, offset)
        if not batch:
            break
        out.extend(r.value for r in batch)
        offset = batch[-1].offset + 1
    return out


def local_start(node):
    return node.store.partition(TOPIC, 0).local_log_start_offset


def test_leader_copies_followers_drop_local_copies_and_everyone_reads_back(tmp_path):
    nodes, addrs, remote = tiered_cluster(tmp_path)
    try:
        create_tiered_topic(addrs, nodes)
        produce(addrs, values(0, N))
        leader = leader_of(nodes, KEY)
        # every node's copied segments leave its disk (the leader's by its copies, the
        # followers' by local retention once the replicated metadata says they are copied)
        for node in nodes.values():
            wait_for(lambda: local_start(node) > N // 2, timeout=30)
        manager = nodes[leader].store.remote_log_manager
        tp = next(iter(manager.partitions()))
        copied_through = manager.rlmm.remote_log_end_offset(tp)
        assert copied_through >= N // 2
        # the events name the node that copied (Kafka's brokerId)
        assert {m.broker_id for m in manager.rlmm.list_remote_log_segments(tp)} == {leader}
        end = nodes[leader].describe()[KEY]["high_watermark"]
        for node in nodes.values():
            wait_for(lambda: node.describe()[KEY]["high_watermark"] >= end, timeout=20)
        for i, node in nodes.items():
            log = node.store.partition(TOPIC, 0)
            assert log.log_start_offset == 0
            assert read_all(node) == values(0, N), f"node {i}"
        # a Kafka client reads across the boundary from the leader
        assert [v for _, v in consume(addrs, N)] == values(0, N)
        # total retention, set through a follower (replicated): the leader expires the oldest
        # remote segments and moves the log start; every node's log start follows
        from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource

        follower = next(i for i in nodes if i != leader)
        admin = AdminClient(bootstrap({follower: addrs[follower]}))
        until_done(lambda: admin.incremental_alter_configs([ConfigResource("topic", TOPIC, incremental_configs=[
            ConfigEntry("retention.bytes", "16384", incremental_operation=AlterConfigOpType.SET)])]))
        for node in nodes.values():
            wait_for(lambda: node.store.partition(TOPIC, 0).log_start_offset > 0, timeout=30)
        start = nodes[leader].store.partition(TOPIC, 0).log_start_offset
        remaining = [v for _, v in consume(addrs, 1, offset=start)]
        assert remaining and remaining[0] in values(0, N)
        # the remote segments below it go (DELETE_SEGMENT_STARTED, then _FINISHED)
        wait_for(lambda: all(end >= start for _, end in finished_segments(nodes[leader])), timeout=30)
    finally:
        stop_all(nodes)


def test_a_node_restarted_with_an_empty_disk_catches_up_through_the_remote_tier(tmp_path):
    nodes, addrs, remote = tiered_cluster(tmp_path)
    try:
        create_tiered_topic(addrs, nodes)
        produce(addrs, values(0, N))
        leader = leader_of(nodes, KEY)
        wait_for(lambda: local_start(nodes[leader]) > N // 2, timeout=30)
        lost = next(i for i in nodes if i != leader and i != leader_of(nodes, ("__remote_log_metadata", 0)))
        nodes[lost].stop()
        shutil.rmtree(tmp_path / f"node{lost}")
        nodes[lost] = start_node(lost, tmp_path, addrs, remote)
        wait_for(lambda: KEY in nodes[lost].describe(), timeout=20)  # (from the replicated topic metadata)
        produce(addrs, values(N, 50))
        end = nodes[leader_of(nodes, KEY)].describe()[KEY]["high_watermark"]
        wait_for(lambda: nodes[lost].describe()[KEY]["high_watermark"] >= end, timeout=30)
        log = nodes[lost].store.partition(TOPIC, 0)
        # it never fetched what the tier holds: its local log starts at the leader's local start
        assert log.log_start_offset == 0 and log.local_log_start_offset > N // 2
        assert read_all(nodes[lost]) == values(0, N + 50)
    finally:
        stop_all(nodes)


def finished_segments(node):
    manager = node.store.remote_log_manager
    manager.rlmm.catch_up()
    tp = node.store.partition(TOPIC, 0).remote_tier.tp
    return sorted(((m.start_offset, m.end_offset) for m in manager.rlmm.list_remote_log_segments(tp)
                   if m.state.name == "COPY_SEGMENT_FINISHED"))


def test_after_a_leader_failover_the_new_leader_copies_on_from_the_remote_end(tmp_path):
    nodes, addrs, remote = tiered_cluster(tmp_path)
    try:
        create_tiered_topic(addrs, nodes)
        produce(addrs, values(0, N))
        old = leader_of(nodes, KEY)
        wait_for(lambda: finished_segments(nodes[old]) and finished_segments(nodes[old])[-1][1] >= N // 2, timeout=30)
        copied_before = finished_segments(nodes[old])[-1][1]
        nodes[old].stop()
        alive = {i: n for i, n in nodes.items() if i != old}
        new = leader_of(alive, KEY)
        produce({i: addrs[i] for i in alive}, values(N, 200))
        end = alive[new].describe()[KEY]["high_watermark"]
        # the new leader copies the segments past the old leader's last copy
        wait_for(lambda: finished_segments(alive[new])[-1][1] >= end - 60, timeout=30)
        segments = finished_segments(alive[new])
        assert segments[-1][1] > copied_before
        covered = -1
        for start, last in segments:  # no gap between the remote segments (overlaps are read once)
            assert start <= covered + 1, segments
            covered = max(covered, last)
        for node in alive.values():
            wait_for(lambda: node.describe()[KEY]["high_watermark"] >= end, timeout=20)
            wait_for(lambda: local_start(node) > copied_before, timeout=30)
            assert read_all(node) == values(0, N + 200)
        assert [v for _, v in consume({i: addrs[i] for i in alive}, N + 200)] == values(0, N + 200)
    finally:
        stop_all(nodes)


def test_logstore_node_processes_tier_into_a_shared_object_store_and_survive_a_kill(tmp_path):
    """``logstore node --remote-storage file://...`` in three processes: the sealed segments
    reach the object store, a Kafka consumer reads everything back, also after the leader was
    killed and restarted on its directory (which remembers the object store)."""
    from .kafkanodes import KafkaNodes

    remote = tmp_path / "remote"
    remote.mkdir()
    cluster = KafkaNodes(tmp_path, SECRET, options=(f"--remote-storage=file://{remote}",
                                                    "--remote-log-manager-task-interval-ms=100"))
    try:
        for i in cluster.addrs:
            cluster.start(i)
        admin = AdminClient({"bootstrap.servers": cluster.bootstrap, **cluster.client_config})
        until_done(lambda: admin.create_topics([NewTopic(TOPIC, 1, replication_factor=3, config=TOPIC_CONFIG)]))
        assert cluster.leader(TOPIC) is not None
        produce(cluster.addrs, values(0, N))
        wait_for(lambda: any(name.endswith(".log") for _, _, names in os.walk(remote) for name in names), timeout=30)
        assert [v for _, v in consume(cluster.addrs, N)] == values(0, N)
        leader = cluster.leader(TOPIC)
        cluster.kill(leader)
        produce(cluster.addrs, values(N, 20))
        cluster.start(leader)  # without --remote-storage the directory's would do too; the same here
        assert [v for _, v in consume(cluster.addrs, N + 20)] == values(0, N + 20)
    finally:
        cluster.stop_all()


def test_parse_leader_epochs_reads_what_a_log_writes_and_refuses_damage():
    from logstore.checkpoint import encode_checkpoint
    from logstore.errors import LogstoreError
    from logstore.replica.tiering import parse_leader_epochs

    entries = [(0, 0), (3, 60), (5, 120)]
    assert parse_leader_epochs(encode_checkpoint(entries, 2, "leader-epoch-checkpoint")) == entries
    assert parse_leader_epochs(encode_checkpoint([], 2, "leader-epoch-checkpoint")) == []
    for damaged in (b"", b"1\n0\n", b"0\n2\n0 0\n", b"0\nx\n"):
        with pytest.raises(LogstoreError):
            parse_leader_epochs(damaged)


def test_log_start_from_tier_keeps_the_remote_state_below_the_local_start(tmp_path):
    from logstore import LogStore
    from logstore.log.producers import snapshot_path
    from logstore.records.batch import BatchBuilder

    with LogStore(tmp_path / "a", maintenance=False) as store:
        source = store.create_topic("t", 1) or store.partition("t", 0)
        source.append_idempotent(BatchBuilder().build([b"x"] * 3, producer_id=7, producer_epoch=2, base_sequence=0))
        source.append(b"y")
        end = source.log_end_offset
    snapshot = open(snapshot_path(str(tmp_path / "a" / "t-0"), end), "rb").read()
    with LogStore(tmp_path / "b", maintenance=False) as store:
        store.create_topic("t", 1)
        log = store.partition("t", 0)
        log.append(b"old")
        with pytest.raises(ValueError):
            log.start_from_tier(end, end + 1, [], None)
        log.start_from_tier(end, 1, [(0, 0), (3, 2), (5, end)], snapshot)
        assert (log.log_start_offset, log.log_end_offset) == (1, end)
        assert log.latest_epoch == 3  # (the entry at the local start is left out)
        assert 7 in log.active_producers()  # the producers as of the local start
        log.append(b"new")
    with LogStore(tmp_path / "b", maintenance=False) as store:  # durable (this log has no remote tier to
        log = store.partition("t", 0)                            # read below its local start from)
        assert (log.log_end_offset, log.latest_epoch) == (end + 1, 3)


def test_the_remote_log_manager_copies_only_the_partitions_its_leads_hook_names(tmp_path):
    """RemoteLogManager(leads=) through LogStore(remote_log_leads=): a partition another node
    leads is neither copied nor expired here; once it is led here, its segments are copied."""
    from logstore import LogStore

    led = set()
    remote = tmp_path / "remote"
    remote.mkdir()
    with LogStore(tmp_path / "data", maintenance=False, remote_storage=f"file://{remote}",
                  remote_log_leads=lambda log: log.partition in led) as store:
        store.create_topic("t", 2, segment_bytes=4096, remote_storage_enable=True, local_retention_bytes=0,
                           retention_ms=-1, local_retention_ms=-1)
        logs = [store.partition("t", p) for p in range(2)]
        for log in logs:
            for i in range(300):
                log.append(f"t-{i:05d}".encode() * 8)
        sealed = [len(log.segments) - 1 for log in logs]
        done = store.run_maintenance()
        assert done["remote_segments_copied"] == 0 and not os.listdir(remote)
        led.add(1)
        done = store.run_maintenance()
        assert done["remote_segments_copied"] == sealed[1]
        assert logs[0].local_log_start_offset == 0 and logs[1].local_log_start_offset > 0


def test_every_copied_segment_takes_its_own_producer_snapshot_however_many_wait(tmp_path):
    """Regression: a log kept only its newest few producer snapshots, so the segments waiting
    for a copy lost theirs (the copy failed, then went without): a follower restarting past the
    tier (TierCatchUp) then lost the producers' state. Now a snapshot stays until its segment
    is copied."""
    from logstore import LogStore
    from logstore.log.producers import SNAPSHOTS_KEPT
    from logstore.records.batch import BatchBuilder
    from logstore.tiered.metadata import IndexType

    remote = tmp_path / "remote"
    remote.mkdir()
    with LogStore(tmp_path / "data", maintenance=False, remote_storage=f"file://{remote}") as store:
        store.create_topic("t", 1, segment_bytes=4096, remote_storage_enable=True, local_retention_bytes=0,
                           retention_ms=-1, local_retention_ms=-1)
        log = store.partition("t", 0)
        builder = BatchBuilder()
        for i in range(200):
            log.append_idempotent(builder.build([f"v{i:05d}".encode() * 20], producer_id=9, producer_epoch=0,
                                                base_sequence=i))
        assert len(log.segments) - 1 > SNAPSHOTS_KEPT + 2
        assert store.run_maintenance()["remote_errors"] == 0
        manager = store.remote_log_manager
        segments = manager.rlmm.list_remote_log_segments(log.remote_tier.tp)
        assert len(segments) > SNAPSHOTS_KEPT + 2
        for metadata in segments:
            assert manager.rsm.fetch_index(metadata, IndexType.PRODUCER_SNAPSHOT), metadata.describe()
