"""Replication's Kafka requests on a node's listener (replica_peerapis): a follower's Fetch
with its epochs and the diverging epoch it is told, Vote with and without pre_vote,
BeginQuorumEpoch, DescribeQuorum, and what is refused (old Fetch versions, several partitions
in one follower fetch, a non-voter). Requests are written by kio from Kafka's specs; the
answers are read back by kio."""

from __future__ import annotations

import pytest

from logstore.kafka.client import Connection
from logstore.replication import Client, ReplicaNode
from logstore.replica.client import (
    BEGIN_QUORUM_EPOCH,
    DESCRIBE_QUORUM,
    FETCH,
    VOTE,
    NodeConnection,
    REPLICA_MECHANISM,
    REPLICA_USER,
)
from logstore.kafka.client import Security

from .test_inprocess import SECRET, cluster, free_ports, leader_of, wait_for
from .test_server import begin_epoch_fields, replica_fetch_fields, stop_all, vote_fields

KEY = ("replicated", 0)


def quorum(conn, topic="replicated", partitions=(0,)):
    answer = conn.request(DESCRIBE_QUORUM, {"topics": [{"topic_name": topic, "partitions": [
        {"partition_index": p} for p in partitions]}]})
    return answer.topics[0].partitions


def test_describe_quorum_gives_each_nodes_view(tmp_path):
    nodes, addrs = cluster(tmp_path)
    try:
        leader = leader_of(nodes)
        client = Client([addrs[leader]], SECRET)
        (offset,) = client.produce(*KEY, [b"x"], acks="all")
        client.close()
        follower = next(i for i in nodes if i != leader)
        wait_for(lambda: nodes[follower].describe()[KEY]["high_watermark"] == offset + 1)
        wait_for(lambda: all(n.describe()[KEY]["leader"] == leader for n in nodes.values()))  # (a slow machine)
        epoch = nodes[leader].describe()[KEY]["epoch"]
        for i, node in nodes.items():
            conn = NodeConnection(addrs[i], SECRET, -1, 5.0)
            try:
                (p,) = quorum(conn)
                assert (p.error_code, p.leader_id, p.leader_epoch) == (0, leader, epoch)
                if i == leader:
                    assert p.high_watermark == offset + 1
                    voters = {v.replica_id: v for v in p.current_voters}
                    assert set(voters) == set(nodes)
                    assert voters[leader].log_end_offset == offset + 1
                    assert all(v.last_fetch_timestamp > 0 for v in voters.values())
                else:
                    assert p.high_watermark <= offset + 1
                    assert {v.replica_id for v in p.current_voters} == set(nodes)
                (missing,) = quorum(conn, "nope")
                assert missing.error_code == 3  # UNKNOWN_TOPIC_OR_PARTITION
            finally:
                conn.close()
    finally:
        stop_all(nodes)


def test_a_follower_fetch_gets_records_and_then_the_diverging_epoch(tmp_path):
    nodes, addrs = cluster(tmp_path)
    try:
        leader = leader_of(nodes)
        client = Client([addrs[leader]], SECRET)
        offsets = client.produce(*KEY, [b"a", b"b"], acks="all")
        client.close()
        epoch = nodes[leader].describe()[KEY]["epoch"]
        follower = next(i for i in nodes if i != leader)
        conn = NodeConnection(addrs[leader], SECRET, follower, 5.0)
        try:
            # From the start, with no history: whole batches, the high watermark, the leader.
            p = conn.request(FETCH, replica_fetch_fields(follower, epoch, 0, -1)).responses[0].partitions[0]
            assert p.error_code == 0 and p.high_watermark == offsets[-1] + 1
            assert (p.current_leader.leader_id, p.current_leader.leader_epoch) == (leader, epoch)
            assert p.records and (p.diverging_epoch.epoch, p.diverging_epoch.end_offset) == (-1, -1)
            # A log the leader never had (the current epoch, past the leader's end): told the
            # epoch and where it ends in the leader's log.
            p = conn.request(FETCH, replica_fetch_fields(follower, epoch, offsets[-1] + 5, epoch)
                             ).responses[0].partitions[0]
            assert p.error_code == 0 and p.records is None
            assert (p.diverging_epoch.epoch, p.diverging_epoch.end_offset) == (epoch, offsets[-1] + 1)
            # Records past the offset without any epoch history: start again from the log start.
            p = conn.request(FETCH, replica_fetch_fields(follower, epoch, 1, -1)).responses[0].partitions[0]
            assert (p.diverging_epoch.epoch, p.diverging_epoch.end_offset) == (-1, 0) and p.records is None
        finally:
            conn.close()
    finally:
        stop_all(nodes)


def test_follower_fetches_that_are_not_served(tmp_path):
    nodes, addrs = cluster(tmp_path)
    try:
        leader = leader_of(nodes)
        wait_for(lambda: all(n.describe()[KEY]["leader"] == leader for n in nodes.values()))  # (a slow machine)
        epoch = nodes[leader].describe()[KEY]["epoch"]
        follower = next(i for i in nodes if i != leader)
        conn = NodeConnection(addrs[leader], SECRET, follower, 5.0)
        try:
            # Two partitions in one follower fetch: INVALID_REQUEST (each has its own connection).
            two = replica_fetch_fields(follower, epoch)
            two["topics"][0]["partitions"] = two["topics"][0]["partitions"] * 2
            assert conn.request(FETCH, two).error_code == 42
            # A replica id that is no voter's: refused, and the leader's state is unchanged.
            p = conn.request(FETCH, replica_fetch_fields(7, epoch + 3)).responses[0].partitions[0]
            assert p.error_code == 42
            # A fetch of a version without last_fetched_epoch (v11) from a replica: refused.
            assert conn.conn.request(FETCH, replica_fetch_fields(follower, epoch), 11).error_code == 42
            # The leader's id in a fetch sent to itself is no follower's either.
            p = conn.request(FETCH, replica_fetch_fields(leader, epoch)).responses[0].partitions[0]
            assert p.error_code == 42
            # A follower asking a node that does not lead is told who does.
            other = NodeConnection(addrs[follower], SECRET, leader, 5.0)
            try:
                p = other.request(FETCH, replica_fetch_fields(leader, epoch)).responses[0].partitions[0]
                assert p.error_code == 6
                assert (p.current_leader.leader_id, p.current_leader.leader_epoch) == (leader, epoch)
            finally:
                other.close()
        finally:
            conn.close()
        d = nodes[leader].describe()[KEY]
        assert (d["role"], d["epoch"]) == ("leader", epoch)
    finally:
        stop_all(nodes)


def test_votes_and_pre_votes(tmp_path):
    """On a node whose partition has no leader (its peers never start): a pre-vote is granted
    and persists nothing; a vote is granted once per epoch; a stale or behind candidate is not."""
    ports = free_ports(3)
    node = ReplicaNode(0, str(tmp_path / "n0"), ("127.0.0.1", ports[0]),
                       {1: ("127.0.0.1", ports[1]), 2: ("127.0.0.1", ports[2])}, SECRET,
                       election_timeout_ms=60_000).start()
    conn = NodeConnection(node.address, SECRET, 1, 5.0)
    try:
        epoch = node.describe()[KEY]["epoch"]
        end = node.store.partition(*KEY).log_end_offset

        def vote(**kw):
            fields = vote_fields(**kw)
            fields["cluster_id"] = node.cluster_id
            return conn.request(VOTE, fields).topics[0].partitions[0]

        p = vote(epoch=epoch + 1, candidate=1, last_epoch=0, last_offset=end, pre_vote=True)
        assert p.vote_granted and p.leader_epoch == epoch
        assert node.describe()[KEY]["epoch"] == epoch  # a pre-vote changes nothing
        p = vote(epoch=epoch + 1, candidate=1, last_epoch=0, last_offset=end)
        assert p.vote_granted and p.leader_epoch == epoch + 1
        p = vote(epoch=epoch + 1, candidate=2, last_epoch=0, last_offset=end)
        assert not p.vote_granted  # one vote per epoch
        p = vote(epoch=epoch, candidate=2, last_epoch=0, last_offset=end)
        assert not p.vote_granted and p.leader_epoch == epoch + 1  # a stale epoch
        node.store.partition(*KEY).append_batch([b"ahead"])
        p = vote(epoch=epoch + 2, candidate=2, last_epoch=-1, last_offset=0)
        assert not p.vote_granted  # its log is behind this node's
        p = vote(epoch=epoch + 3, candidate=9, last_epoch=0, last_offset=10**6)
        assert not p.vote_granted  # no voter
        # BeginQuorumEpoch from a voter sets the leader; naming a non-voter changes nothing.
        fields = begin_epoch_fields(epoch + 4, 99)
        assert conn.request(BEGIN_QUORUM_EPOCH, fields).topics[0].partitions[0].leader_id != 99
        answer = conn.request(BEGIN_QUORUM_EPOCH, begin_epoch_fields(epoch + 4, 2)).topics[0].partitions[0]
        assert (answer.leader_id, answer.leader_epoch) == (2, epoch + 4)
        assert node.describe()[KEY]["leader"] == 2
    finally:
        conn.close()
        node.stop()


def test_the_replica_user_has_scram_only_and_a_wrong_password_fails(tmp_path):
    node = ReplicaNode(0, str(tmp_path / "n0"), ("127.0.0.1", 0), {}, SECRET, min_insync_replicas=1).start()
    try:
        good = Connection(*node.address, 5.0, "t", Security("SASL_PLAINTEXT", REPLICA_MECHANISM, REPLICA_USER,
                                                             SECRET.decode()))
        good.close()
        from logstore.kafka.client import KafkaClientError
        with pytest.raises(KafkaClientError):
            Connection(*node.address, 5.0, "t", Security("SASL_PLAINTEXT", "PLAIN", REPLICA_USER, SECRET.decode()))
        with pytest.raises(ValueError, match="UTF-8"):
            ReplicaNode(1, str(tmp_path / "n1"), ("127.0.0.1", 0), {}, b"\xff\xfe")
    finally:
        node.stop()


def test_requests_meant_for_another_voter_or_cluster_are_refused(tmp_path):
    ports = free_ports(3)
    node = ReplicaNode(0, str(tmp_path / "n0"), ("127.0.0.1", ports[0]),
                       {1: ("127.0.0.1", ports[1]), 2: ("127.0.0.1", ports[2])}, SECRET,
                       election_timeout_ms=60_000).start()
    conn = NodeConnection(node.address, SECRET, 1, 5.0)
    try:
        epoch = node.describe()[KEY]["epoch"]
        # A vote or an announcement addressed to node 2 but delivered to node 0 (a wrong peer
        # address): INCONSISTENT_VOTER_SET, nothing changes.
        fields = {**vote_fields(epoch + 1, 1, 0, 10**6), "voter_id": 2}
        assert conn.request(VOTE, fields).error_code == 94
        assert conn.request(BEGIN_QUORUM_EPOCH, {**begin_epoch_fields(epoch + 1, 1), "voter_id": 2}).error_code == 94
        # Another cluster's requests: INCONSISTENT_CLUSTER_ID, for each of them.
        assert conn.request(BEGIN_QUORUM_EPOCH, {**begin_epoch_fields(epoch + 1, 1), "cluster_id": "x"}).error_code == 104
        assert conn.request(FETCH, {**replica_fetch_fields(1, epoch + 1), "cluster_id": "x"}).error_code == 104
        # Addressed to this node: taken.
        fields = {**vote_fields(epoch + 1, 1, 0, 10**6), "voter_id": 0, "cluster_id": node.cluster_id}
        assert conn.request(VOTE, fields).topics[0].partitions[0].vote_granted
        d = node.describe()[KEY]
        assert d["epoch"] == epoch + 1 and d["leader"] == -1
        # A BeginQuorumEpoch naming a non-voter changes neither the leader nor the epoch.
        answer = conn.request(BEGIN_QUORUM_EPOCH, begin_epoch_fields(epoch + 2, 99)).topics[0].partitions[0]
        assert answer.leader_id == -1 and node.describe()[KEY]["epoch"] == epoch + 1
    finally:
        conn.close()
        node.stop()


def test_an_unserved_api_after_the_login_closes_only_its_own_connection(tmp_path):
    import struct

    node = ReplicaNode(0, str(tmp_path / "n0"), ("127.0.0.1", 0), {}, SECRET, min_insync_replicas=1).start()
    other = NodeConnection(node.address, SECRET, -1, 5.0)
    bad = NodeConnection(node.address, SECRET, -1, 5.0)
    try:
        header = struct.pack(">hhih", 99, 0, 7, -1)
        bad.conn.sock.sendall(struct.pack(">i", len(header)) + header)
        assert bad.conn.sock.recv(100) == b""  # closed without an answer
        (p,) = quorum(other)
        assert p.error_code == 0
    finally:
        bad.close()
        other.close()
        node.stop()


def test_a_held_follower_fetch_that_fails_closes_its_connection(tmp_path, monkeypatch):
    """A caught-up follower's fetch waits at the leader; when its answer cannot be made (the
    segment read fails), the connection is closed at once rather than left unanswered."""
    nodes, addrs = cluster(tmp_path)
    try:
        leader = leader_of(nodes)
        epoch = nodes[leader].describe()[KEY]["epoch"]
        follower = next(i for i in nodes if i != leader)
        log = nodes[leader].store.partition(*KEY)
        end = log.log_end_offset

        def failing(*args, **kwargs):
            raise OSError(5, "Input/output error (injected)")

        conn = NodeConnection(addrs[leader], SECRET, follower, 5.0)
        outcome = {}

        def fetch():
            fields = {**replica_fetch_fields(follower, epoch, end, log.latest_epoch), "max_wait": 4000}
            try:
                outcome["answer"] = conn.request(FETCH, fields, timeout=30)
            except Exception as exc:  # noqa: BLE001 - reported below
                outcome["error"] = exc

        import threading
        t = threading.Thread(target=fetch)
        t.start()
        wait_for(lambda: KEY in nodes[leader].purgatory.keys() or not t.is_alive(), timeout=5)
        monkeypatch.setattr(log, "read_region", failing)
        client = Client([addrs[leader]], SECRET)
        client.produce(*KEY, [b"wakes the fetch"], acks=1)
        client.close()
        t.join(30)
        assert not t.is_alive()
        # Closed by the leader (the read failed), not timed out waiting for an answer.
        assert "error" in outcome and not isinstance(outcome["error"].__cause__, TimeoutError), outcome
        conn.close()
    finally:
        stop_all(nodes)
