"""The KIP-848 consumer group coordinator (logstore.groups.consumergroup) driven directly: epochs,
incremental reconciliation between two members, fencing errors, static members, session
timeouts, fenced commits, and a coordinator taking the groups up from ``__consumer_offsets``."""

from __future__ import annotations

import time
import uuid

import pytest

from logstore import LogStore
from logstore.errorcodes import ErrorCode
from logstore.groups.consumergroup import ConsumerGroupConfig, ConsumerGroupCoordinator, HeartbeatRequest
from logstore.groups.offsets import offset_store
from logstore.net.purgatory import Purgatory

T = uuid.UUID(int=99)


@pytest.fixture
def env(tmp_path):
    store = LogStore(str(tmp_path / "s"), maintenance=False)
    purgatory = Purgatory("test")
    topics = {"t": (T, 4)}
    made = []

    def coordinator(**config):
        c = ConsumerGroupCoordinator(offset_store(store), purgatory, lambda: dict(topics),
                                     ConsumerGroupConfig(**config))
        made.append(c)
        return c

    yield coordinator, topics, store
    for c in made:
        c.close()
    purgatory.close()
    store.close()


def join(c, member, instance=None, names=("t",), **kw):
    return c.heartbeat(HeartbeatRequest("g", member, 0, instance_id=instance, rebalance_timeout_ms=kw.pop("rt", 30000),
                                        subscribed_topic_names=names, owned={}, **kw))


def beat(c, member, epoch, owned=None, **kw):
    return c.heartbeat(HeartbeatRequest("g", member, epoch, owned=owned, **kw))


def parts(answer):
    a = answer["assignment"]
    return None if a is None else {p for tp in a["topic_partitions"] for p in tp["partitions"]}


def test_a_second_member_gets_partitions_only_after_the_first_revoked_them(env):
    coordinator, _, _ = env
    c = coordinator()
    a = join(c, "a")
    assert a["error_code"] == 0 and a["member_epoch"] == 1 and parts(a) == {0, 1, 2, 3}
    b = join(c, "b")
    assert b["member_epoch"] == 2 and parts(b) == set()  # its target is still a's: unreleased
    assert c.describe("g")["group_state"] == "Reconciling"
    a2 = beat(c, "a", 1, {T: frozenset({0, 1, 2, 3})})
    assert a2["member_epoch"] == 1 and len(parts(a2)) == 2  # revoke two, keep the epoch
    kept = parts(a2)
    assert parts(beat(c, "b", 2, {})) in (set(), None)  # a has not revoked yet
    a3 = beat(c, "a", 1, {T: frozenset(kept)})
    assert a3["member_epoch"] == 2 and parts(a3) == kept  # revoked: the new epoch, the same partitions
    b2 = beat(c, "b", 2, {})
    assert parts(b2) == {0, 1, 2, 3} - kept
    assert beat(c, "b", 2, {T: frozenset(parts(b2))})["assignment"] is None
    assert c.describe("g")["group_state"] == "Stable"


def test_fencing_errors(env):
    coordinator, _, _ = env
    c = coordinator()
    join(c, "a")
    assert beat(c, "a", 5)["error_code"] == ErrorCode.fenced_member_epoch
    assert beat(c, "zz", 1)["error_code"] == ErrorCode.unknown_member_id
    assert c.heartbeat(HeartbeatRequest("nogroup", "a", 3))["error_code"] == ErrorCode.unknown_member_id
    assert c.heartbeat(HeartbeatRequest("g", "", 1))["error_code"] == ErrorCode.invalid_request
    assert c.heartbeat(HeartbeatRequest("g", "x", 0, subscribed_topic_names=("t",), owned={}))["error_code"] == \
        ErrorCode.invalid_request  # no rebalance timeout on join
    assert join(c, "x", server_assignor="sticky")["error_code"] == ErrorCode.unsupported_assignor
    assert c.heartbeat(HeartbeatRequest("g", "x", 0, rebalance_timeout_ms=1000, subscribed_topic_regex="(?=a)t",
                                        owned={}))["error_code"] == ErrorCode.invalid_regular_expression
    assert c.heartbeat(HeartbeatRequest("g", "x", 0, rebalance_timeout_ms=1000, subscribed_topic_regex="t[",
                                        owned={}))["error_code"] == ErrorCode.invalid_regular_expression


def test_commits_are_fenced_by_member_epoch(env):
    coordinator, _, _ = env
    c = coordinator()
    assert c.check_commit("g", "", -1) is None  # not a consumer group: the classic rules
    join(c, "a")
    assert c.check_commit("g", "a", 1, api_version=9) == 0
    assert c.check_commit("g", "a", 0, api_version=9) == ErrorCode.stale_member_epoch
    assert c.check_commit("g", "a", 2, api_version=9) == ErrorCode.fenced_member_epoch
    assert c.check_commit("g", "b", 1, api_version=9) == ErrorCode.unknown_member_id
    assert c.check_commit("g", "a", 1, api_version=8) == ErrorCode.unsupported_version
    assert c.check_commit("g", "", -1) == ErrorCode.unknown_member_id  # the group has members
    assert c.check_offset_fetch("g", "a", 0) == ErrorCode.stale_member_epoch
    assert beat(c, "a", -1)["member_epoch"] == -1
    assert c.check_commit("g", "", -1) is None  # empty: the classic rules (an admin may commit)


def test_a_static_member_rejoins_with_its_assignment_and_no_rebalance(env):
    coordinator, _, _ = env
    c = coordinator()
    join(c, "a", "i-a")
    join(c, "b", "i-b")
    beat(c, "a", 1, {T: frozenset({0, 1, 2, 3})})
    epoch = c.describe("g")["group_epoch"]
    assert beat(c, "b", 2, instance_id="i-b")["error_code"] == 0
    assert join(c, "b2", "i-b")["error_code"] == ErrorCode.unreleased_instance_id  # b has not left
    b_parts = {m["member_id"]: m for m in c.describe("g")["members"]}["b"]["assignment"]
    assert c.heartbeat(HeartbeatRequest("g", "b", -2, instance_id="i-b"))["member_epoch"] == -2
    back = join(c, "b2", "i-b")
    assert back["error_code"] == 0 and back["member_epoch"] == 2
    assert parts(back) == {p for tp in b_parts["topic_partitions"] for p in tp["partitions"]}
    assert c.describe("g")["group_epoch"] == epoch  # no rebalance
    assert {m["member_id"] for m in c.describe("g")["members"]} == {"a", "b2"}


def test_a_silent_member_is_fenced_after_its_session(env):
    coordinator, _, _ = env
    c = coordinator(session_timeout_ms=300)
    join(c, "a")
    deadline = time.monotonic() + 10
    while c.describe("g")["members"]:
        assert time.monotonic() < deadline, "the member was never fenced"
        time.sleep(0.05)
    assert c.describe("g")["group_state"] == "Empty" and c.describe("g")["group_epoch"] == 2


def test_a_new_coordinator_takes_the_group_up_from_its_records(env):
    coordinator, topics, _ = env
    c = coordinator()
    join(c, "a", "i-a", names=("t",), server_assignor="range")
    join(c, "b")
    beat(c, "a", 1, {T: frozenset({0, 1, 2, 3})})
    before = c.describe("g")
    c.close()
    again = coordinator().describe("g")
    assert again == before
    assert again["assignor_name"] == "range"


def test_a_new_topic_matching_the_regex_bumps_the_epoch(env):
    coordinator, topics, _ = env
    c = coordinator()
    first = c.heartbeat(HeartbeatRequest("g", "a", 0, rebalance_timeout_ms=1000, subscribed_topic_regex="t.*",
                                         owned={}))
    assert parts(first) == {0, 1, 2, 3}
    other = uuid.UUID(int=5)
    topics["tx"] = (other, 2)
    topics["__internal"] = (uuid.UUID(int=6), 1)
    nxt = beat(c, "a", 1, {T: frozenset({0, 1, 2, 3})})
    assert nxt["member_epoch"] == 2
    assert {tp["topic_id"] for tp in nxt["assignment"]["topic_partitions"]} == {T, other}


def test_the_records_survive_compaction_and_unknown_record_types_are_skipped(env):
    coordinator, _, store = env
    c = coordinator()
    join(c, "a")
    join(c, "b")
    beat(c, "a", 1, {T: frozenset({0, 1, 2, 3})})
    beat(c, "b", 2, {}, instance_id=None)
    assert beat(c, "b", 2, {})["error_code"] == 0
    join(c, "gone")
    assert beat(c, "gone", -1)["member_epoch"] == -1  # its records: tombstones
    before = c.describe("g")
    c.close()
    log = store.partition("__consumer_offsets", 0)
    # a record of a later Kafka (a share group's, key version 10) and a garbled consumer record
    log.append_batch([b"\x00\x00anything", b"\x00\x00\x00"], [b"\x00\x0a\x00\x01g", b"\x00\x03\x00\x01h"])
    log.roll()
    log.compact()
    again = coordinator().describe("g")
    assert again == before
    assert "gone" not in {m["member_id"] for m in again["members"]}


def test_a_member_that_does_not_revoke_within_its_rebalance_timeout_is_fenced(env):
    coordinator, _, _ = env
    c = coordinator()
    join(c, "a", rt=300)
    join(c, "b")
    asked = beat(c, "a", 1, {T: frozenset({0, 1, 2, 3})})
    assert len(parts(asked)) == 2  # two to revoke, which it never does
    deadline = time.monotonic() + 10
    while "a" in {m["member_id"] for m in c.describe("g")["members"]}:
        assert time.monotonic() < deadline, "the member was never fenced"
        time.sleep(0.05)
    assert beat(c, "a", 1)["error_code"] == ErrorCode.unknown_member_id
    got = beat(c, "b", 2, {})
    assert got["member_epoch"] == c.describe("g")["group_epoch"] and parts(got) == {0, 1, 2, 3}
