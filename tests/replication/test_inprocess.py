"""Replica sets of in-process nodes on loopback (the process-level suites come later)."""

from __future__ import annotations

import socket
import time

import pytest

from logstore.replication import Client, ReplicaNode

SECRET = b"test-secret"


def free_ports(n):
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


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
    from logstore.records import parse_header
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
