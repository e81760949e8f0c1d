"""KIP-848 mixed groups driven directly through both coordinators (logstore.groups.consumergroup and
logstore.groups.coordinator over one ``__consumer_offsets``): classic members (JoinGroup, SyncGroup,
Heartbeat, LeaveGroup) inside a consumer group, their commits, Kafka's protocol check, a static
classic member replaced, the online upgrade of a classic group and the downgrade back, each
migration policy, and a coordinator taking a mixed group up from its records. Subscriptions and
assignments are written and read with kafka-python's consumer protocol classes."""

from __future__ import annotations

import time
import uuid

import pytest
from kafka.protocol.consumer.metadata import ConsumerProtocolAssignment, ConsumerProtocolSubscription

from logstore import LogStore
from logstore.errorcodes import ErrorCode
from logstore.groups import consumerrecords
from logstore.groups.consumergroup import ClassicJoin, ConsumerGroupConfig, ConsumerGroupCoordinator, \
    HeartbeatRequest
from logstore.groups.coordinator import GroupConfig, GroupCoordinator
from logstore.groups.offsets import offset_store
from logstore.net.purgatory import Purgatory

T = uuid.UUID(int=7)
ALL = {0, 1, 2, 3}


def subscription(owned=(), version=1, topics=("t",)):
    tp = ConsumerProtocolSubscription.TopicPartition
    owned_partitions = [tp(topic="t", partitions=sorted(owned))] if owned else []
    return ConsumerProtocolSubscription(topics=list(topics), user_data=None, owned_partitions=owned_partitions,
                                        version=version).encode()


def assigned(answer):
    raw = answer["assignment"]
    if not raw:
        return set()
    return {p for tp in ConsumerProtocolAssignment.decode(raw).assigned_partitions for p in tp.partitions}


@pytest.fixture
def env(tmp_path):
    """(make, store): ``make(**config)`` -> (classic, consumer) coordinators over one store."""
    store = LogStore(str(tmp_path / "s"), maintenance=False)
    store.create_topic("t", 4)
    purgatory = Purgatory("test")
    made = []

    def make(**config):
        offsets = offset_store(store)
        classic = GroupCoordinator(offsets, purgatory, lambda t, p: t == "t" and p < 4,
                                   GroupConfig(min_session_timeout_ms=100))
        consumer = ConsumerGroupCoordinator(offsets, purgatory, lambda: {"t": (T, 4)},
                                            ConsumerGroupConfig(**config), classic)
        classic.committer_check = consumer.check_commit
        made.append((classic, consumer))
        return classic, consumer

    yield make, store
    for classic, consumer in made:
        consumer.close()
        classic.close()
    purgatory.close()
    store.close()


def consumer_join(c, member, owned=None):
    return c.heartbeat(HeartbeatRequest("g", member, 0, rebalance_timeout_ms=30000, subscribed_topic_names=("t",),
                                        owned={}))


def beat(c, member, epoch, owned):
    return c.heartbeat(HeartbeatRequest("g", member, epoch, owned={T: frozenset(owned)}))


def classic_join(c, member="", owned=(), instance=None, protocols=("range",), known=True, version=1,
                 session_ms=30000):
    metadata = subscription(owned, version)
    return c.classic_join(ClassicJoin("g", member, instance, "cl", "/127.0.0.1", session_ms, 30000, "consumer",
                                      tuple((name, metadata) for name in protocols), known))


def parts(answer):
    a = answer["assignment"]
    return None if a is None else {p for tp in a["topic_partitions"] for p in tp["partitions"]}


def settle(consumer, member, epoch_parts):
    """Heartbeat the consumer-protocol member with what it holds until it stops changing."""
    epoch, held = epoch_parts
    for _ in range(5):
        answer = beat(consumer, member, epoch, held)
        epoch = answer["member_epoch"]
        if parts(answer) is not None:
            held = parts(answer)
    return epoch, held


def test_a_classic_member_joins_syncs_and_is_told_to_rejoin_to_revoke_first(env):
    make, _ = env
    _, c = make()
    first = consumer_join(c, "a")
    assert parts(first) == ALL
    # JoinGroup v4+: a dynamic member without an id gets one with MEMBER_ID_REQUIRED
    required = classic_join(c)
    assert required["error_code"] == ErrorCode.member_id_required and required["member_id"]
    member = required["member_id"]
    joined = classic_join(c, member)
    assert joined["error_code"] == 0 and joined["leader"] == "" and joined["members"] == []
    assert joined["protocol_type"] == "consumer" and joined["protocol_name"] == "range"
    generation = joined["generation_id"]
    assert generation == c.describe("g")["group_epoch"]
    # nothing free yet: a still holds every partition
    synced = c.classic_sync("g", generation, member, None, "consumer", "range")
    assert synced["error_code"] == 0 and assigned(synced) == set()
    assert ConsumerProtocolAssignment.decode(synced["assignment"]).version == 1  # its subscription's version
    # waiting on a: the heartbeat says nothing to do
    assert c.classic_heartbeat("g", generation, member, None) == 0
    epoch, held = settle(c, "a", (1, ALL))
    assert len(held) == 2
    # the partitions a released are free: the classic member is told to rejoin and gets them
    assert c.classic_heartbeat("g", generation, member, None) == ErrorCode.rebalance_in_progress
    again = classic_join(c, member)
    synced = c.classic_sync("g", again["generation_id"], member, None, None, None)
    assert assigned(synced) == ALL - held
    assert c.classic_heartbeat("g", again["generation_id"], member, None) == 0
    assert c.describe("g")["group_state"] == "Stable"
    kinds = {m["member_id"]: m["member_type"] for m in c.describe("g")["members"]}
    assert kinds == {"a": 1, member: 0}  # ConsumerGroupDescribe v1: 1 consumer, 0 classic
    # a generation that is not its member epoch
    assert c.classic_heartbeat("g", 99, member, None) == ErrorCode.illegal_generation
    assert c.classic_sync("g", 99, member, None, None, None)["error_code"] == ErrorCode.illegal_generation
    assert c.classic_sync("g", again["generation_id"], member, None, "consumer", "roundrobin")["error_code"] == \
        ErrorCode.inconsistent_group_protocol
    # a consumer-protocol member is no classic member
    assert c.classic_heartbeat("g", epoch, "a", None) == ErrorCode.unknown_member_id
    # commits: a classic member's generation must be its member epoch
    assert c.check_commit("g", member, again["generation_id"], api_version=7) == 0
    assert c.check_commit("g", member, again["generation_id"] - 1, api_version=7) == ErrorCode.illegal_generation


def test_a_classic_member_that_must_revoke_rejoins_with_what_it_still_owns(env):
    make, _ = env
    _, c = make()
    consumer_join(c, "seed")
    c.heartbeat(HeartbeatRequest("g", "seed", -1))  # an empty consumer group: a classic member may join it
    member = classic_join(c, "m")["member_id"]
    generation = c.describe("g")["group_epoch"]
    assert assigned(c.classic_sync("g", generation, member, None, None, None)) == ALL
    consumer_join(c, "a")  # takes half of the classic member's partitions
    assert c.classic_heartbeat("g", generation, member, None) == ErrorCode.rebalance_in_progress
    # cooperative: it rejoins still owning everything; its assignment keeps what stays its own
    # its protocols must still include one every classic member (itself too) has
    assert classic_join(c, member, owned=ALL, protocols=("cooperative-sticky",))["error_code"] == \
        ErrorCode.inconsistent_group_protocol
    rejoin = classic_join(c, member, owned=ALL)
    assert rejoin["generation_id"] == generation  # still its epoch: revoke first
    synced = c.classic_sync("g", rejoin["generation_id"], member, None, None, None)
    kept = assigned(synced)
    assert len(kept) == 2
    assert c.classic_heartbeat("g", rejoin["generation_id"], member, None) == ErrorCode.rebalance_in_progress
    done = classic_join(c, member, owned=kept)
    assert done["generation_id"] == c.describe("g")["group_epoch"]
    _, a_held = settle(c, "a", (c.describe("g")["group_epoch"], set()))
    assert a_held == ALL - kept


def test_only_a_classic_member_with_a_protocol_every_classic_member_has_may_join(env):
    make, _ = env
    _, c = make()
    consumer_join(c, "a")
    assert classic_join(c, "x", protocols=("range", "roundrobin"))["error_code"] == 0
    assert classic_join(c, "y", protocols=("cooperative-sticky",))["error_code"] == \
        ErrorCode.inconsistent_group_protocol
    assert classic_join(c, "y", protocols=("cooperative-sticky", "roundrobin"))["error_code"] == 0
    bad = c.classic_join(ClassicJoin("g", "z", None, "cl", "h", 30000, 30000, "connect", (("range", b""),), True))
    assert bad["error_code"] == ErrorCode.inconsistent_group_protocol
    garbage = c.classic_join(ClassicJoin("g", "z", None, "cl", "h", 30000, 30000, "consumer",
                                         (("range", b"\x00"),), True))
    assert garbage["error_code"] == ErrorCode.inconsistent_group_protocol
    # group.min.session.timeout.ms (100 here) and group.max.session.timeout.ms, as for any JoinGroup
    assert classic_join(c, "z", session_ms=50)["error_code"] == ErrorCode.invalid_session_timeout


def test_a_static_classic_member_is_replaced_by_its_new_process_without_a_rebalance(env):
    make, _ = env
    _, c = make()
    consumer_join(c, "a")
    old = classic_join(c, "old", instance="i-1")
    settle(c, "a", (old["generation_id"] - 1, ALL))
    old = classic_join(c, "old", instance="i-1")
    held = assigned(c.classic_sync("g", old["generation_id"], "old", "i-1", None, None))
    epoch = c.describe("g")["group_epoch"]
    assert classic_join(c, "other", instance="i-1")["error_code"] == ErrorCode.fenced_instance_id
    new = classic_join(c, "", instance="i-1")
    assert new["error_code"] == 0 and new["member_id"] != "old"
    assert c.describe("g")["group_epoch"] == epoch  # no rebalance
    assert assigned(c.classic_sync("g", new["generation_id"], new["member_id"], "i-1", None, None)) == held
    assert c.classic_heartbeat("g", old["generation_id"], "old", "i-1") == ErrorCode.fenced_instance_id


def test_a_classic_member_leaves_and_its_session_ends(env):
    make, _ = env
    _, c = make()
    consumer_join(c, "a")
    gone = classic_join(c, "gone", session_ms=200)["member_id"]
    stays = classic_join(c, "stays")["member_id"]
    assert c.classic_leave("g", [(stays, None), ("nobody", None)]) == [0, ErrorCode.unknown_member_id]
    deadline = time.monotonic() + 10
    while gone in {m["member_id"] for m in c.describe("g")["members"]}:
        assert time.monotonic() < deadline, "the silent classic member was not fenced"
        time.sleep(0.05)
    assert {m["member_id"] for m in c.describe("g")["members"]} == {"a"}


def classic_group(classic):
    """A stable classic group ``g`` of two members (range, JoinGroup v3: no MEMBER_ID_REQUIRED),
    each handed two partitions: (generation, [member ids])."""
    def join(member_id):
        answer = classic.join("g", member_id, None, "cl", "h", 30000, 30000, "consumer",
                              [("range", subscription(version=0))], False)
        return answer.result(10) if member_id == "" and hasattr(answer, "result") and not joined else answer

    joined: list[str] = []

    first = join("")
    joined.append(first["member_id"])
    waiting = join("")  # a rebalance: it waits for the first member's rejoin
    again = join(first["member_id"])
    answers = [again.result(10), waiting.result(10)]
    generation, leader = answers[0]["generation_id"], answers[0]["leader"]
    members = [a["member_id"] for a in answers]
    tp = ConsumerProtocolAssignment.TopicPartition
    plan = {m: ConsumerProtocolAssignment(assigned_partitions=[tp(topic="t", partitions=[2 * i, 2 * i + 1])],
                                          user_data=None, version=0).encode() for i, m in enumerate(members)}
    syncs = [classic.sync("g", generation, m, None, plan if m == leader else {}) for m in members]
    for done in syncs:
        assert (done.result(10) if hasattr(done, "result") else done)["error_code"] == 0
    return generation, members


def test_a_consumer_member_upgrades_a_classic_group_whose_members_keep_their_partitions(env):
    make, store = env
    classic, c = make()
    generation, (k1, k2) = classic_group(classic)
    answer = consumer_join(c, "new")
    assert answer["error_code"] == 0
    described = c.describe("g")
    assert described["group_epoch"] == generation + 1
    members = {m["member_id"]: m for m in described["members"]}
    assert {m: members[m]["member_type"] for m in members} == {k1: 0, k2: 0, "new": 1}
    # the classic members kept their generation's partitions: the newcomer waits for them
    held = {m: {p for tp in members[m]["assignment"]["topic_partitions"] for p in tp["partitions"]}
            for m in (k1, k2)}
    assert held == {k1: {0, 1}, k2: {2, 3}}
    assert classic.describe("g") is None  # no classic group any more
    # the classic members learn it from their next heartbeat, and rejoin the consumer group
    assert c.classic_heartbeat("g", generation, k1, None) == ErrorCode.rebalance_in_progress
    assert classic_join(c, k1, owned={0, 1})["error_code"] == 0
    # the conversion is durable: the classic group's record is a tombstone, the consumer group's written
    assert "g" not in offset_store(store).group_metadata()
    _, again = make()
    assert {m["member_id"] for m in again.describe("g")["members"]} == {k1, k2, "new"}


@pytest.mark.parametrize("policy", ["downgrade", "disabled"])
def test_an_upgrade_is_refused_where_the_policy_does_not_allow_it(env, policy):
    make, _ = env
    classic, c = make(migration_policy=policy)
    classic_group(classic)
    assert consumer_join(c, "new")["error_code"] == ErrorCode.group_id_not_found
    assert len(classic.describe("g")["members"]) == 2


def test_the_last_consumer_member_leaving_downgrades_to_a_classic_group_that_rebalances(env):
    make, store = env
    classic, c = make()
    first = consumer_join(c, "a")
    k = classic_join(c, "k")
    settle(c, "a", (first["member_epoch"], ALL))
    k = classic_join(c, "k")
    held = assigned(c.classic_sync("g", k["generation_id"], "k", None, None, None))
    assert held
    assert c.heartbeat(HeartbeatRequest("g", "a", -1))["error_code"] == 0
    assert c.describe("g") is None  # no consumer group any more
    found = classic.describe("g")
    assert found["type"] == "classic" and found["protocol_type"] == "consumer"
    assert found["state"] == "PreparingRebalance" and [m["member_id"] for m in found["members"]] == ["k"]
    stored = offset_store(store).group_metadata()["g"]
    assert stored.protocol == "range" and stored.members[0].member_id == "k"
    assert {p for tp in ConsumerProtocolAssignment.decode(stored.members[0].assignment).assigned_partitions
            for p in tp.partitions} == {p for p in held} | set()  # its target partitions
    assert not [k for k in offset_store(store).consumer_group_records()
                if consumerrecords.decode_key(k)[1] == "g"]  # the consumer group's records: tombstoned
    # the classic member goes on in the classic group: it rejoins and gets everything
    rejoin = classic.join("g", "k", None, "cl", "h", 30000, 30000, "consumer", [("range", subscription(version=0))],
                          False)
    rejoin = rejoin.result(10) if hasattr(rejoin, "result") else rejoin
    assert rejoin["error_code"] == 0 and rejoin["leader"] == "k"


@pytest.mark.parametrize("policy", ["upgrade", "disabled"])
def test_a_downgrade_is_refused_where_the_policy_does_not_allow_it(env, policy):
    make, _ = env
    classic, c = make(migration_policy=policy)
    consumer_join(c, "a")
    classic_join(c, "k")
    assert c.heartbeat(HeartbeatRequest("g", "a", -1))["error_code"] == 0
    assert [m["member_id"] for m in c.describe("g")["members"]] == ["k"]
    assert classic.describe("g") is None


def test_a_mixed_group_is_taken_up_from_its_records_with_its_classic_members(env):
    make, _ = env
    _, c = make()
    consumer_join(c, "a")
    k = classic_join(c, "k", session_ms=12345)
    c.close()
    _, again = make()
    members = {m["member_id"]: m for m in again.describe("g")["members"]}
    assert members["k"]["member_type"] == 0 and members["a"]["member_type"] == 1
    assert again.classic_heartbeat("g", k["generation_id"], "k", None) in (0, ErrorCode.rebalance_in_progress)
    assert again.takes_classic("g")
