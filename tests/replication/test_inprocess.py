"""Replica sets of in-process nodes on loopback (the process-level suites come later)."""

from __future__ import annotations

import random
import shutil
import socket
import time

import pytest

from logstore.replication import Client, ReplicaNode

SECRET = b"test-secret"


def _ephemeral_range() -> tuple[int, int]:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low, high = (int(x) for x in f.read().split())
        return low, high
    except (OSError, ValueError):
        return 32768, 60999


def free_ports(n):
    """``n`` distinct loopback ports that are free now and outside the kernel's ephemeral range.

    A port picked in advance and bound later must not be one the kernel can lend meanwhile as
    the local port of an outgoing connection: a proxy retrying a connect to a node that is not
    listening yet can even connect to itself (TCP simultaneous open) and hold the port. Ports
    below the ephemeral range are only ever taken by an explicit bind.
    """
    low, high = _ephemeral_range()
    candidates = list(range(10000, low)) if low > 10000 + 4 * n else list(range(high + 1, 65536))
    random.shuffle(candidates)
    ports: list[int] = []
    for port in candidates:
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        ports.append(port)
        if len(ports) == n:
            return ports
    raise RuntimeError(f"no {n} free loopback ports outside the ephemeral range {low}-{high}")


def cluster(tmp_path, n=3, election_timeout_ms=300, **kw):
    ports = free_ports(n)
    addrs = {i: ("127.0.0.1", ports[i]) for i in range(n)}
    nodes = {}
    for i in range(n):
        peers = {j: a for j, a in addrs.items() if j != i}
        nodes[i] = ReplicaNode(i, str(tmp_path / f"node{i}"), addrs[i], peers, SECRET,
                               election_timeout_ms=election_timeout_ms, **kw).start()
    return nodes, addrs


def leader_of(nodes, key=("replicated", 0), timeout=10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        leaders = [i for i, n in nodes.items() if n.describe()[key]["role"] == "leader"]
        if len(leaders) == 1:
            return leaders[0]
        time.sleep(0.05)
    raise AssertionError("no single leader elected")


def wait_for(cond, timeout=10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.05)
    raise AssertionError("condition not reached")


def test_elect_replicate_and_fail_over(tmp_path):
    nodes, addrs = cluster(tmp_path)
    client = Client(list(addrs.values()), SECRET)
    try:
        first = leader_of(nodes)
        offsets = client.produce("replicated", 0, [b"a", b"b", b"c"], acks="all")
        # Offset 0 holds the leader's leader change control record, which reads pass over.
        assert offsets == [1, 2, 3]
        wait_for(lambda: all(n.store.partition("replicated", 0).log_end_offset == 4 for n in nodes.values()))
        nodes[first].stop()
        rest = {i: n for i, n in nodes.items() if i != first}
        second = leader_of(rest)
        assert second != first
        assert client.produce("replicated", 0, [b"d"], acks="all") == [5]  # after the new leader's record
        for n in rest.values():
            wait_for(lambda n=n: n.store.partition("replicated", 0).log_end_offset == 6)
            assert [r.value for r in n.store.partition("replicated", 0).read(0)] == [b"a", b"b", b"c", b"d"]
        epochs = {n.describe()[("replicated", 0)]["epoch"] for n in rest.values()}
        assert len(epochs) == 1
    finally:
        client.close()
        for n in nodes.values():
            if not n._stop.is_set():
                n.stop()


def _crcs(node):
    from logstore.records.batch import parse_header
    log = node.store.partition("replicated", 0)
    out, offset = [], log.log_start_offset
    while offset < log.log_end_offset:
        raw = log.read_raw(offset, 1)
        h = parse_header(raw, 0)
        out.append((h.base_offset, h.crc, h.partition_leader_epoch))
        offset = h.base_offset + h.last_offset_delta + 1
    return out


def test_a_leader_without_its_majority_never_acknowledges_and_diverging_records_are_truncated(tmp_path):
    # A long election timeout: the cut-off leader keeps leading (it steps down after twice that)
    # long enough to take an acks=1 write that the others never see.
    nodes, addrs = cluster(tmp_path, election_timeout_ms=1500, min_insync_replicas=1)
    try:
        first = leader_of(nodes)
        leader_client = Client([addrs[first]], SECRET, timeout=2)
        assert leader_client.produce("replicated", 0, [b"committed"], acks="all") == [1]
        followers = [i for i in nodes if i != first]
        wait_for(lambda: all(nodes[i].store.partition("replicated", 0).log_end_offset == 2 for i in followers))
        # Cut the leader off: its followers stop (and will elect among themselves later).
        for i in followers:
            nodes[i].stop()
        # acks=1 lands locally only; acks=all can never be acknowledged without a majority.
        assert leader_client.produce("replicated", 0, [b"uncommitted"], acks=1) == [2]
        with pytest.raises(Exception):
            leader_client.produce("replicated", 0, [b"never"], acks="all", timeout=1.5)
        nodes[first].stop()
        # The two followers come back without the old leader and elect one of them.
        restarted = {}
        for i in followers:
            peers = {j: a for j, a in addrs.items() if j != i}
            restarted[i] = ReplicaNode(i, str(tmp_path / f"node{i}"), addrs[i], peers, SECRET,
                                       election_timeout_ms=300, min_insync_replicas=1).start()
        new_leader = leader_of(restarted)
        client = Client([addrs[i] for i in followers], SECRET)
        # Offset 2 now holds the new leader's control record, offset 3 the new record.
        assert client.produce("replicated", 0, [b"new"], acks="all") == [3]
        # The old leader returns: its uncommitted record 2 diverges and is replaced.
        peers = {j: a for j, a in addrs.items() if j != first}
        restarted[first] = ReplicaNode(first, str(tmp_path / f"node{first}"), addrs[first], peers, SECRET,
                                       election_timeout_ms=300, min_insync_replicas=1).start()
        wait_for(lambda: [r.value for r in restarted[first].store.partition("replicated", 0).read(0)]
                 == [b"committed", b"new"], timeout=15)
        wait_for(lambda: len({tuple(_crcs(n)) for n in restarted.values()}) == 1)
        client.close()
        leader_client.close()
    finally:
        for group in (nodes, locals().get("restarted", {})):
            for n in group.values():
                if not n._stop.is_set():
                    n.stop()


def test_a_new_leader_commits_earlier_epochs_records_without_a_new_produce(tmp_path):
    # The leader takes an acks=1 record while its followers are down; it then leads again in a
    # later epoch. The high watermark counts only records of the current epoch, so the leader
    # change record it writes on election is what commits the older record.
    nodes, addrs = cluster(tmp_path, election_timeout_ms=1500, min_insync_replicas=1)
    restarted = {}
    try:
        first = leader_of(nodes)
        client = Client([addrs[first]], SECRET, timeout=2)
        client.produce("replicated", 0, [b"committed"], acks="all")
        followers = [i for i in nodes if i != first]
        wait_for(lambda: all(nodes[i].describe()[("replicated", 0)]["log_end_offset"] == 2 for i in followers))
        nodes[followers[0]].stop()
        nodes[followers[1]].stop()
        (late,) = client.produce("replicated", 0, [b"late"], acks=1)
        client.close()
        nodes[first].stop()
        # The old leader and one follower come back; only the old leader has `late`, so only it
        # can win (the follower's log is behind); the follower grants its vote and catches up.
        for i in (first, followers[0]):
            peers = {j: a for j, a in addrs.items() if j != i}
            restarted[i] = ReplicaNode(i, str(tmp_path / f"node{i}"), addrs[i], peers, SECRET,
                                       election_timeout_ms=300, min_insync_replicas=1).start()
        assert leader_of(restarted) == first
        wait_for(lambda: restarted[first].describe()[("replicated", 0)]["high_watermark"] > late)
        wait_for(lambda: [r.value for r in restarted[followers[0]].store.partition("replicated", 0).read(0)]
                 == [b"committed", b"late"])
    finally:
        for group in (nodes, restarted):
            for n in group.values():
                if not n._stop.is_set():
                    n.stop()


def _history(path, epochs, quorum_epoch, voters=(0, 1, 2), truncate_to=None):
    """Write a replica's log (epochs = [(epoch, [values...]), ...] appended in order, after
    truncating an existing log to ``truncate_to``) and its election state (epoch
    ``quorum_epoch``, no vote, no leader)."""
    from logstore import LogStore
    from logstore.replica.quorum import NONE, QuorumState, QuorumStateFile

    store = LogStore(str(path), shared=False, maintenance=False)
    try:
        store.create_topic("replicated", 1, exist_ok=True)
        log = store.partition("replicated", 0)
        if truncate_to is not None:
            log.truncate_to(truncate_to)
        for epoch, values in epochs:
            log.assign_leader_epoch(epoch)
            for v in values:
                log.append(v)
        QuorumStateFile(log.path, list(voters)).save(QuorumState(quorum_epoch, NONE, NONE))
    finally:
        store.close()


def test_a_follower_whose_last_epoch_the_leader_never_had_truncates_into_its_own_older_epoch(tmp_path):
    # The leader's history: epoch 1 wrote a0..a4, epoch 3 wrote b5..b9. The follower led epoch 2
    # for a moment (its records 4 and 5 were never committed). The leader answers the
    # follower's epoch 2 with "epoch 1 ends at 5" — but the follower's own epoch 1 ends at 4,
    # so it must truncate to 4 (the smaller), not 5: keeping its epoch-2 record 4 would make
    # it ask again with epoch 2 and truncate to 5 forever (KIP-279).
    a = [b"a%d" % i for i in range(5)]
    b = [b"b%d" % i for i in range(5, 10)]
    _history(tmp_path / "node0", [(1, a), (3, b)], quorum_epoch=3)
    # The others hold copies of node 0's batches (as replication made them), node 1 up to 4.
    shutil.copytree(tmp_path / "node0", tmp_path / "node1")
    shutil.copytree(tmp_path / "node0", tmp_path / "node2")
    _history(tmp_path / "node1", [(2, [b"x4", b"x5"])], quorum_epoch=3, truncate_to=4)
    nodes, addrs = cluster(tmp_path)
    try:
        # Node 1 cannot win (its log is behind both others'), so it is the diverging follower.
        assert leader_of(nodes) in (0, 2)
        expected = a + b
        wait_for(lambda: all([r.value for r in n.store.partition("replicated", 0).read(0)] == expected
                             for n in nodes.values()), timeout=20)
        wait_for(lambda: len({tuple(_crcs(n)) for n in nodes.values()}) == 1)
    finally:
        for n in nodes.values():
            n.stop()


def test_a_follower_behind_the_leaders_log_start_restarts_its_log_there(tmp_path):
    nodes, addrs = cluster(tmp_path)
    restarted = {}
    try:
        first = leader_of(nodes)
        client = Client([addrs[first]], SECRET)
        client.produce("replicated", 0, [b"old-%d" % i for i in range(5)], acks="all")
        lagging = next(i for i in nodes if i != first)
        nodes[lagging].stop()
        offsets = client.produce("replicated", 0, [b"new-%d" % i for i in range(5)], acks="all")
        # The leader drops everything before the new records (DeleteRecords); the stopped
        # follower's log now ends below the leader's log start.
        leader_log = nodes[first].store.partition("replicated", 0)
        start = offsets[2]
        assert leader_log.delete_records_before(start) == start
        peers = {j: a for j, a in addrs.items() if j != lagging}
        restarted[lagging] = ReplicaNode(lagging, str(tmp_path / f"node{lagging}"), addrs[lagging], peers, SECRET,
                                         election_timeout_ms=300)
        log = restarted[lagging].store.partition("replicated", 0)
        assert log.log_end_offset < start  # what it kept ends below the leader's log start
        restarted[lagging].start()  # (checked before its fetcher runs: it may catch up at once)
        # It restarts at the start of the leader's first batch (which may hold offsets below
        # the leader's log start, as Kafka's follower does), holding nothing it had before.
        wait_for(lambda: log.log_end_offset == leader_log.log_end_offset)
        assert offsets[0] <= log.log_start_offset <= start
        assert [r.value for r in log.read(start)] == [b"new-%d" % i for i in range(2, 5)]
        client.produce("replicated", 0, [b"after"], acks="all")
        wait_for(lambda: [r.value for r in log.read(start)][-1:] == [b"after"])
        client.close()
    finally:
        for group in (nodes, restarted):
            for n in group.values():
                if not n._stop.is_set():
                    n.stop()


def test_replication_metrics_report_follower_lag_and_under_replication(tmp_path):
    nodes, addrs = cluster(tmp_path, replica_lag_time_max_ms=1000)
    client = Client(list(addrs.values()), SECRET)

    def led(node):  # the partitions a node leads ("replicated-0", and maybe "__consumer_offsets-0")
        return {key for key, d in node.describe().items() if d["role"] == "leader"}

    try:
        leader = leader_of(nodes)
        client.produce("replicated", 0, [b"x"] * 20, acks="all")
        wait_for(lambda: nodes[leader].metrics()["kafka.server:type=ReplicaFetcherManager,name=MaxLag,clientId=Replica"] == 0)
        m = nodes[leader].metrics()
        followers = [i for i in nodes if i != leader]
        assert set(m["logstore:type=Replica,name=FollowerLag"]) == {(t, p, f) for t, p in led(nodes[leader])
                                                                    for f in followers}
        assert m["kafka.server:type=ReplicaManager,name=UnderReplicatedPartitions"] == 0
        assert m["kafka.log:type=Log,name=LogEndOffset"][("replicated", 0)] == 21
        # A follower that stops falls behind: the leader reports its lag and the partition as
        # under-replicated once the follower is out of the in-sync set.
        nodes[followers[0]].stop()
        client.produce("replicated", 0, [b"y"] * 5, acks="all")
        lag = nodes[leader].metrics()["logstore:type=Replica,name=FollowerLag"]
        assert lag[("replicated", 0, followers[0])] >= 5 and lag[("replicated", 0, followers[1])] <= 5
        wait_for(lambda: nodes[leader].metrics()["kafka.server:type=ReplicaManager,name=UnderReplicatedPartitions"]
                 == len(led(nodes[leader])), timeout=30)
        # A node reports lag for the partitions it leads only.
        assert {(t, p) for t, p, _ in nodes[followers[1]].metrics()["logstore:type=Replica,name=FollowerLag"]} \
            == led(nodes[followers[1]])
    finally:
        client.close()
        for n in nodes.values():
            if not n._stop.is_set():
                n.stop()
