"""The group coordinator on the wire, request by request: requests and responses are encoded and
decoded by kafka-python's own protocol structs (an independent codec), and every rule is one of
Kafka's (GroupCoordinator): KIP-394's member id, rebalances, generation and member fencing,
session and rebalance timeouts, and offset commits that the library's consumers read."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from kafka.protocol.old.commit import (
    OffsetCommitRequest,
    OffsetCommitResponse,
    OffsetFetchRequest,
    OffsetFetchResponse,
)
from kafka.protocol.old.find_coordinator import FindCoordinatorRequest, FindCoordinatorResponse
from kafka.protocol.old.group import (
    HeartbeatRequest,
    HeartbeatResponse,
    JoinGroupRequest,
    JoinGroupResponse,
    LeaveGroupRequest,
    LeaveGroupResponse,
    SyncGroupRequest,
    SyncGroupResponse,
)

from logstore.client.consumer import offset_store
from logstore.kafka.server import KafkaServer
from .wire_conn import RequestConnection  # noqa: E402

NONE, UNKNOWN_TOPIC = 0, 3
ILLEGAL_GENERATION, INCONSISTENT_PROTOCOL, INVALID_GROUP_ID, UNKNOWN_MEMBER_ID = 22, 23, 24, 25
INVALID_SESSION_TIMEOUT, REBALANCE_IN_PROGRESS, MEMBER_ID_REQUIRED, FENCED_INSTANCE_ID = 26, 27, 79, 82
COORDINATOR_NOT_AVAILABLE = 15


@pytest.fixture
def server(tmp_path):
    s = KafkaServer(str(tmp_path), ("127.0.0.1", 0), group_min_session_timeout_ms=100).start()
    s.store.create_topic("t", 4, exist_ok=True)
    yield s
    s.stop()


def Conn(server):
    """One connection; ``call`` sends a request and decodes its response with kafka-python."""
    return RequestConnection(server.address, "groups-test")


class Member:
    """A group member speaking JoinGroup v5, SyncGroup/Heartbeat v3 on its own connection."""

    def __init__(self, server, group="g", session_ms=10_000, rebalance_ms=10_000, protocols=(("range", b"m"),),
                 protocol_type="consumer", instance_id=None):
        self.conn = Conn(server)
        self.group, self.session_ms, self.rebalance_ms = group, session_ms, rebalance_ms
        self.protocols, self.protocol_type, self.instance_id = list(protocols), protocol_type, instance_id
        self.member_id = ""
        self.generation = -1

    def join(self, version=5):
        request = JoinGroupRequest[version](self.group, self.session_ms, self.rebalance_ms, self.member_id,
                                            self.instance_id, self.protocol_type, self.protocols) \
            if version >= 5 else JoinGroupRequest[version](self.group, self.session_ms, self.rebalance_ms,
                                                           self.member_id, self.protocol_type, self.protocols)
        answer = self.conn.call(request, JoinGroupResponse[version])
        if answer.error_code in (NONE, MEMBER_ID_REQUIRED):
            self.member_id = answer.member_id
        if answer.error_code == NONE:
            self.generation = answer.generation_id
        return answer

    def join_fully(self):
        answer = self.join()
        if answer.error_code == MEMBER_ID_REQUIRED:
            answer = self.join()
        return answer

    def sync(self, assignments=(), generation=None):
        request = SyncGroupRequest[3](self.group, self.generation if generation is None else generation,
                                      self.member_id, self.instance_id, list(assignments))
        return self.conn.call(request, SyncGroupResponse[3])

    def heartbeat(self, generation=None, member_id=None):
        request = HeartbeatRequest[3](self.group, self.generation if generation is None else generation,
                                      self.member_id if member_id is None else member_id, self.instance_id)
        return self.conn.call(request, HeartbeatResponse[3]).error_code

    def commit(self, offsets, generation=None, member_id=None, version=7):
        topics = {}
        for (topic, partition), offset in offsets.items():
            topics.setdefault(topic, []).append((partition, offset, -1, "meta") if version >= 6
                                                else (partition, offset, "meta"))
        generation = self.generation if generation is None else generation
        member_id = self.member_id if member_id is None else member_id
        if version >= 7:
            request = OffsetCommitRequest[7](self.group, generation, member_id, None, list(topics.items()))
        elif version >= 5:
            request = OffsetCommitRequest[version](self.group, generation, member_id, list(topics.items()))
        else:
            request = OffsetCommitRequest[version](self.group, generation, member_id, -1, list(topics.items()))
        answer = self.conn.call(request, OffsetCommitResponse[version])
        return {(t, p): e for t, parts in answer.topics for p, e in parts}

    def close(self):
        self.conn.close()


def join_together(*members):
    """Join with every member at once (each join waits until all have joined)."""
    with ThreadPoolExecutor(len(members)) as pool:
        return list(pool.map(lambda m: m.join(), members))


def form(a, b):
    """``a`` and ``b`` in one stable generation: (leader, follower), the follower not synced yet."""
    a.join()  # KIP-394: each gets its member id first
    b.join()
    answers = join_together(a, b)
    assert [x.error_code for x in answers] == [NONE, NONE]
    leader, follower = (a, b) if answers[0].members else (b, a)
    assert leader.sync([(a.member_id, b"a"), (b.member_id, b"b")]).error_code == NONE
    return leader, follower


def fetch_offsets(server, group, partitions, version=5):
    conn = Conn(server)
    try:
        topics = {}
        for topic, partition in partitions:
            topics.setdefault(topic, []).append(partition)
        answer = conn.call(OffsetFetchRequest[version](group, list(topics.items())), OffsetFetchResponse[version])
        out = {}
        for topic, parts in answer.topics:
            for part in parts:
                out[(topic, part[0])] = (part[1], part[-2], part[-1])  # offset, metadata, error
        return out
    finally:
        conn.close()


# ---------------------------------------------------------------------- coordinator discovery
@pytest.mark.parametrize("version", [0, 1, 2])
def test_find_coordinator_names_this_broker(server, version):
    conn = Conn(server)
    request = FindCoordinatorRequest[version]("g") if version == 0 else FindCoordinatorRequest[version]("g", 0)
    answer = conn.call(request, FindCoordinatorResponse[version])
    conn.close()
    assert (answer.error_code, answer.coordinator_id, answer.host, answer.port) == \
        (NONE, server.node_id, "127.0.0.1", server.address[1])


def test_find_coordinator_of_a_transaction_is_this_broker(server):
    conn = Conn(server)
    answer = conn.call(FindCoordinatorRequest[2]("txn", 1), FindCoordinatorResponse[2])
    unknown = conn.call(FindCoordinatorRequest[2]("what", 7), FindCoordinatorResponse[2])
    conn.close()
    assert answer.error_code == NONE and answer.port == server.address[1]
    assert unknown.error_code == 42  # INVALID_REQUEST: key types are 0 (group) and 1 (transaction)


# ---------------------------------------------------------------------- joining
def test_kip394_member_id_required_then_a_generation_with_a_leader(server):
    m = Member(server)
    first = m.join()
    assert first.error_code == MEMBER_ID_REQUIRED and first.member_id.startswith("groups-test-")
    answer = m.join()
    assert (answer.error_code, answer.generation_id, answer.protocol_name) == (NONE, 1, "range")
    assert answer.leader == m.member_id and [x[0] for x in answer.members] == [m.member_id]
    assert m.sync([(m.member_id, b"mine")]).assignment == b"mine"
    assert m.heartbeat() == NONE
    m.close()


def test_join_v3_gets_a_member_id_at_once(server):
    m = Member(server)
    answer = m.join(version=3)
    assert answer.error_code == NONE and answer.member_id and answer.generation_id == 1
    m.close()


def test_bad_joins_get_kafkas_errors(server):
    assert Member(server, group="").join().error_code == INVALID_GROUP_ID
    assert Member(server, session_ms=50).join().error_code == INVALID_SESSION_TIMEOUT
    stranger = Member(server, group="nobody")
    stranger.member_id = "not-a-member"
    assert stranger.join().error_code == UNKNOWN_MEMBER_ID
    m = Member(server)
    assert m.join_fully().error_code == NONE
    assert Member(server, protocol_type="connect").join().error_code == INCONSISTENT_PROTOCOL
    assert Member(server, protocols=[("sticky", b"")]).join().error_code == INCONSISTENT_PROTOCOL


def test_a_second_member_rebalances_the_group_and_fences_the_old_generation(server):
    a, b = Member(server), Member(server, protocols=[("roundrobin", b"b"), ("range", b"b")])
    a.join_fully()
    a.sync([(a.member_id, b"all")])
    assert b.join().error_code == MEMBER_ID_REQUIRED
    with ThreadPoolExecutor(1) as pool:
        b_joined = pool.submit(b.join)  # waits for a to rejoin
        deadline = time.monotonic() + 10
        while a.heartbeat() != REBALANCE_IN_PROGRESS:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        old = a.generation
        a_answer = a.join()
        b_answer = b_joined.result(timeout=10)
    assert a_answer.generation_id == b_answer.generation_id == old + 1
    assert a_answer.protocol_name == "range"  # the only protocol both support
    assert a_answer.leader == a.member_id  # the leader stays
    assert sorted(x[0] for x in a_answer.members) == sorted([a.member_id, b.member_id])
    assert b_answer.members == []
    assert a.heartbeat(generation=old) == ILLEGAL_GENERATION
    assert a.heartbeat(member_id="someone-else") == UNKNOWN_MEMBER_ID
    with ThreadPoolExecutor(1) as pool:
        b_synced = pool.submit(b.sync)  # waits for the leader's assignment
        time.sleep(0.1)
        assert not b_synced.done()
        assert a.sync([(a.member_id, b"p0,p1"), (b.member_id, b"p2,p3")]).assignment == b"p0,p1"
        assert b_synced.result(timeout=10).assignment == b"p2,p3"
    assert a.heartbeat() == NONE and b.heartbeat() == NONE
    assert b.sync(generation=old).error_code == ILLEGAL_GENERATION
    for m in (a, b):
        m.close()


def test_a_follower_rejoining_unchanged_gets_the_current_generation(server):
    a, b = Member(server), Member(server)
    leader, follower = form(a, b)
    answer = follower.join()
    assert (answer.error_code, answer.generation_id, answer.members) == (NONE, leader.generation, [])
    assert leader.heartbeat() == NONE  # no rebalance
    for m in (a, b):
        m.close()


# ---------------------------------------------------------------------- timeouts
def test_a_member_whose_session_ends_is_removed_and_the_group_rebalances(server):
    a, b = Member(server, session_ms=400), Member(server, session_ms=400)
    leader, follower = form(a, b)
    assert follower.sync().error_code == NONE
    deadline = time.monotonic() + 10
    while (error := leader.heartbeat()) == NONE:  # the follower says nothing more
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert error == REBALANCE_IN_PROGRESS
    answer = leader.join()
    assert answer.error_code == NONE and [x[0] for x in answer.members] == [leader.member_id]
    assert follower.heartbeat(generation=answer.generation_id) == UNKNOWN_MEMBER_ID
    for m in (a, b):
        m.close()


def test_a_member_that_does_not_rejoin_in_the_rebalance_timeout_is_removed(server):
    a = Member(server, rebalance_ms=300)
    b = Member(server, rebalance_ms=300)
    leader, follower = form(a, b)
    follower.sync()
    started = time.monotonic()
    answer = leader.join()  # the follower never rejoins: the join completes at the rebalance timeout
    assert answer.error_code == NONE and [x[0] for x in answer.members] == [leader.member_id]
    assert time.monotonic() - started >= 0.25
    assert follower.heartbeat() == UNKNOWN_MEMBER_ID
    for m in (a, b):
        m.close()


def test_a_member_that_never_syncs_is_removed_after_the_rebalance_timeout(server):
    a, b = Member(server, rebalance_ms=300), Member(server, rebalance_ms=300)
    leader, follower = form(a, b)
    deadline = time.monotonic() + 10
    while (error := leader.heartbeat()) == NONE:  # the follower never asks for its assignment
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert error == REBALANCE_IN_PROGRESS
    assert [x[0] for x in leader.join().members] == [leader.member_id]
    assert follower.sync().error_code in (UNKNOWN_MEMBER_ID, ILLEGAL_GENERATION)
    for m in (a, b):
        m.close()


# ---------------------------------------------------------------------- leaving, static members
def test_leave_group_v3_and_v0(server):
    a, b = Member(server), Member(server)
    leader, follower = form(a, b)
    conn = Conn(server)
    answer = conn.call(LeaveGroupRequest[3]("g", [(follower.member_id, None), ("ghost", None)]),
                       LeaveGroupResponse[3])
    assert answer.error_code == NONE and [(m[0], m[2]) for m in answer.members] == \
        [(follower.member_id, NONE), ("ghost", UNKNOWN_MEMBER_ID)]
    assert leader.heartbeat() == REBALANCE_IN_PROGRESS
    answer = leader.join()
    assert [x[0] for x in answer.members] == [leader.member_id]
    assert conn.call(LeaveGroupRequest[0]("g", leader.member_id), LeaveGroupResponse[0]).error_code == NONE
    assert conn.call(LeaveGroupRequest[0]("g", leader.member_id), LeaveGroupResponse[0]).error_code == \
        UNKNOWN_MEMBER_ID
    conn.close()
    for m in (a, b):
        m.close()


def test_a_restarted_static_member_fences_its_old_self(server):
    old = Member(server, instance_id="worker-1")
    assert old.join().error_code == NONE  # static members get their id at once
    old.sync([(old.member_id, b"a")])
    new = Member(server, instance_id="worker-1")
    assert new.join().error_code == NONE and new.member_id != old.member_id
    assert old.heartbeat() == FENCED_INSTANCE_ID
    for m in (old, new):
        m.close()


# ---------------------------------------------------------------------- offsets
def test_commits_are_fenced_by_generation_and_read_by_the_library(server):
    a = Member(server)
    a.join_fully()
    a.sync([(a.member_id, b"")])
    assert a.commit({("t", 0): 5, ("t", 1): 7}) == {("t", 0): NONE, ("t", 1): NONE}
    assert a.commit({("t", 0): 6}, generation=a.generation - 1) == {("t", 0): ILLEGAL_GENERATION}
    assert a.commit({("t", 0): 6}, member_id="ghost") == {("t", 0): UNKNOWN_MEMBER_ID}
    # generation -1 from outside the group: refused while it has members
    assert a.commit({("t", 0): 6}, generation=-1, member_id="") == {("t", 0): UNKNOWN_MEMBER_ID}
    assert a.commit({("t", 9): 1, ("nope", 0): 1}) == {("t", 9): UNKNOWN_TOPIC, ("nope", 0): UNKNOWN_TOPIC}
    assert fetch_offsets(server, "g", [("t", 0), ("t", 1), ("t", 2)]) == \
        {("t", 0): (5, "meta", NONE), ("t", 1): (7, "meta", NONE), ("t", 2): (-1, "", NONE)}
    offsets = offset_store(server.store)  # the embedded consumers' view of the same records
    assert offsets.committed("g", "t", 0) == 5 and offsets.committed("g", "t", 1) == 7
    a.close()


@pytest.mark.parametrize("version", [2, 3, 4, 5, 6, 7])
def test_assign_only_commits_are_accepted_in_every_version(server, version):
    outsider = Member(server, group=f"assign-only-{version}")
    assert outsider.commit({("t", 2): 42}, generation=-1, member_id="", version=version) == {("t", 2): NONE}
    assert fetch_offsets(server, f"assign-only-{version}", [("t", 2)], version=1)[("t", 2)][0] == 42
    assert offset_store(server.store).committed(f"assign-only-{version}", "t", 2) == 42
    outsider.close()


def test_a_commit_for_a_generation_the_coordinator_does_not_know_is_refused(server):
    m = Member(server, group="after-restart")
    m.member_id, m.generation = "member-of-a-previous-life", 3
    assert m.commit({("t", 0): 1}) == {("t", 0): ILLEGAL_GENERATION}
    assert offset_store(server.store).committed("after-restart", "t", 0) is None
    m.close()


def test_a_restarted_coordinator_takes_the_group_up_and_rebalances_it(tmp_path):
    """Membership is stored in __consumer_offsets (Kafka's group metadata record): a new
    coordinator over the same store knows the generation and its members, accepts the old
    generation's commits, and starts a rebalance that the live member joins and the member that
    never comes back misses (it is dropped when the rebalance timeout passes)."""
    first = KafkaServer(str(tmp_path), ("127.0.0.1", 0), group_min_session_timeout_ms=100).start()
    first.store.create_topic("t", 4, exist_ok=True)
    a = Member(first, group="kept", session_ms=1500, rebalance_ms=1500)
    b = Member(first, group="kept", session_ms=1500, rebalance_ms=1500)
    assert [a.join().error_code, b.join().error_code] == [MEMBER_ID_REQUIRED, MEMBER_ID_REQUIRED]
    assert [r.error_code for r in join_together(a, b)] == [NONE, NONE]
    with ThreadPoolExecutor(2) as pool:
        syncs = list(pool.map(lambda m: m.sync([(a.member_id, b"for-a"), (b.member_id, b"for-b")]), (a, b)))
    assert sorted(s.assignment for s in syncs) == [b"for-a", b"for-b"]
    generation = a.generation
    a.close()
    b.close()
    first.stop()

    second = KafkaServer(str(tmp_path), ("127.0.0.1", 0), group_min_session_timeout_ms=100).start()
    try:
        a.conn = Conn(second)
        described = second._apis.groups.describe("kept")
        assert described["generation"] == generation and described["state"] == "PreparingRebalance"
        assert {m["member_id"] for m in described["members"]} == {a.member_id, b.member_id}
        assert a.heartbeat() == REBALANCE_IN_PROGRESS
        assert a.commit({("t", 1): 7}) == {("t", 1): NONE}  # the old generation commits what it had
        assert offset_store(second.store).committed("kept", "t", 1) == 7
        began = time.monotonic()
        answer = a.join()  # b never joins: the join completes without it after the rebalance timeout
        assert answer.error_code == NONE and answer.generation_id == generation + 1
        assert [m[0] for m in answer.members] == [a.member_id]
        assert 1.0 < time.monotonic() - began < 10
        a.close()
    finally:
        second.stop()


def test_a_member_that_left_is_not_waited_for_after_a_restart(tmp_path):
    first = KafkaServer(str(tmp_path), ("127.0.0.1", 0), group_min_session_timeout_ms=100).start()
    first.store.create_topic("t", 4, exist_ok=True)
    a = Member(first, group="left", session_ms=20_000, rebalance_ms=20_000)
    b = Member(first, group="left", session_ms=20_000, rebalance_ms=20_000)
    assert [a.join().error_code, b.join().error_code] == [MEMBER_ID_REQUIRED, MEMBER_ID_REQUIRED]
    assert [r.error_code for r in join_together(a, b)] == [NONE, NONE]
    with ThreadPoolExecutor(2) as pool:
        assert [s.error_code for s in pool.map(lambda m: m.sync([(a.member_id, b"x")]), (a, b))] == [NONE, NONE]
    assert b.conn.call(LeaveGroupRequest[1]("left", b.member_id), LeaveGroupResponse[1]).error_code == NONE
    a.close()
    b.close()
    first.stop()  # a restart before a rejoined: the removal of b was stored
    second = KafkaServer(str(tmp_path), ("127.0.0.1", 0), group_min_session_timeout_ms=100).start()
    try:
        a.conn = Conn(second)
        began = time.monotonic()
        answer = a.join()
        assert answer.error_code == NONE and [m[0] for m in answer.members] == [a.member_id]
        assert time.monotonic() - began < 5  # not b's 20 s
        a.close()
    finally:
        second.stop()


def test_an_empty_group_is_stored_empty(tmp_path):
    first = KafkaServer(str(tmp_path), ("127.0.0.1", 0), group_min_session_timeout_ms=100).start()
    a = Member(first, group="emptied")
    a.join_fully()
    assert a.sync([(a.member_id, b"x")]).error_code == NONE
    stored = offset_store(first.store).group_metadata()["emptied"]
    assert stored.generation == a.generation and [m.member_id for m in stored.members] == [a.member_id]
    assert stored.members[0].assignment == b"x" and stored.members[0].subscription == b"m"
    assert stored.protocol == "range" and stored.leader == a.member_id
    assert a.conn.call(LeaveGroupRequest[1]("emptied", a.member_id), LeaveGroupResponse[1]).error_code == NONE
    stored = offset_store(first.store).group_metadata()["emptied"]
    assert stored.members == () and stored.generation == a.generation + 1 and stored.protocol is None
    a.close()
    first.stop()
    second = KafkaServer(str(tmp_path), ("127.0.0.1", 0)).start()
    try:
        described = second._apis.groups.describe("emptied")  # nothing to take up: Empty, as Kafka loads it
        assert described["state"] == "Empty" and described["members"] == []
    finally:
        second.stop()


def test_a_generation_that_cannot_be_stored_is_not_made_stable(server, monkeypatch):
    """As Kafka: the leader's SyncGroup fails (COORDINATOR_NOT_AVAILABLE) when the group's
    membership record cannot be written, and the group rebalances instead of going on
    unrecorded."""
    from logstore.errors import LogstoreError

    offsets = offset_store(server.store)
    real = offsets.store_group
    calls = []

    def failing(group, metadata, durable=True):
        calls.append(group)
        raise LogstoreError("disk full (injected)")

    a = Member(server, group="unstored")
    a.join_fully()
    monkeypatch.setattr(offsets, "store_group", failing)
    assert a.sync([(a.member_id, b"x")]).error_code == COORDINATOR_NOT_AVAILABLE
    assert calls == ["unstored"]
    assert a.heartbeat() == REBALANCE_IN_PROGRESS
    monkeypatch.setattr(offsets, "store_group", real)
    answer = a.join()
    assert answer.error_code == NONE
    assert a.sync([(a.member_id, b"x")]).error_code == NONE
    assert a.heartbeat() == NONE
    a.close()
