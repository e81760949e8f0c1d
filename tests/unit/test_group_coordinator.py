"""GroupCoordinator's group administration, driven directly over a store's ``__consumer_offsets``:
DeleteGroups and OffsetDelete with Kafka's rules and errors, ListGroups' state and type
filters, committed leader epochs, and a static member that rejoins under a new member id
without making its group rebalance (KIP-345). The wire and the clients are
tests/kafka_clients/test_group_admin.py's."""

from __future__ import annotations

from concurrent.futures import Future

import pytest

from logstore import LogStore
from logstore.errorcodes import ErrorCode
from logstore.groups.coordinator import GroupConfig, GroupCoordinator
from logstore.groups.offsets import offset_store
from logstore.kafka.groupclient import encode_subscription
from logstore.net.purgatory import Purgatory


@pytest.fixture
def store(tmp_path):
    s = LogStore(str(tmp_path / "store"), maintenance=False)
    s.create_topic("t", 2)
    s.create_topic("u", 1)
    yield s
    s.close()


@pytest.fixture
def purgatory():
    p = Purgatory("test")
    yield p
    p.close()


def coordinator(store, purgatory):
    def exists(topic, partition):
        return topic in store.topics() and 0 <= partition < store.partitions_for(topic)
    return GroupCoordinator(offset_store(store), purgatory, exists, GroupConfig(min_session_timeout_ms=100))


def answered(answer):
    return answer.result(10) if isinstance(answer, Future) else answer


def stable_member(groups, group="g", topics=("t",), instance_id=None, protocol_type="consumer"):
    """One member in a stable generation of its own: (member id, generation)."""
    joined = answered(groups.join(group, "", instance_id, "client", "/127.0.0.1", 10_000, 10_000, protocol_type,
                                  [("range", encode_subscription(topics))], require_known_member_id=False))
    assert joined["error_code"] == ErrorCode.none
    synced = answered(groups.sync(group, joined["generation_id"], joined["member_id"], instance_id,
                                  {joined["member_id"]: b"assigned"}))
    assert synced["error_code"] == ErrorCode.none
    return joined["member_id"], joined["generation_id"]


def test_an_empty_group_is_deleted_with_its_offsets_and_stays_deleted(store, purgatory):
    groups = coordinator(store, purgatory)
    assert groups.commit_offsets("g", -1, "", None, [("t", 0, 5, 3, "m"), ("t", 1, 7, -1, "")]) == [0, 0]
    assert groups.delete_groups(["g"]) == [ErrorCode.none]
    assert groups.fetch_offsets("g", None) == []
    assert groups.describe("g") is None and "g" not in {g for g, *_ in groups.groups()}
    assert offset_store(store).group_offsets("g") == {}
    assert groups.delete_groups(["g"]) == [ErrorCode.group_id_not_found]
    again = coordinator(store, purgatory)  # what a restart reads
    assert again.fetch_offsets("g", None) == [] and again.describe("g") is None


def test_delete_groups_refuses_a_group_with_members_an_unknown_one_and_an_empty_id(store, purgatory):
    groups = coordinator(store, purgatory)
    member, generation = stable_member(groups)
    assert groups.commit_offsets("g", generation, member, None, [("t", 0, 1, -1, None)]) == [0]
    assert groups.delete_groups(["g", "nobody", ""]) == [ErrorCode.non_empty_group, ErrorCode.group_id_not_found,
                                                         ErrorCode.invalid_group_id]
    assert groups.fetch_offsets("g", [("t", 0)]) == [("t", 0, 1, -1, "")]
    assert groups.leave("g", [(member, None)]) == [ErrorCode.none]
    assert groups.delete_groups(["g"]) == [ErrorCode.none]
    assert groups.heartbeat("g", generation, member, None) == ErrorCode.unknown_member_id


def test_offset_delete_keeps_the_subscribed_topics_of_a_group_with_members(store, purgatory):
    groups = coordinator(store, purgatory)
    member, generation = stable_member(groups, topics=("t",))
    assert groups.commit_offsets("g", generation, member, None,
                                 [("t", 0, 1, -1, None), ("u", 0, 2, -1, None)]) == [0, 0]
    error, errors = groups.delete_offsets("g", [("t", 0), ("u", 0), ("nowhere", 0)])
    assert error == ErrorCode.none
    assert errors == [ErrorCode.group_subscribed_to_topic, ErrorCode.none, ErrorCode.unknown_topic_or_partition]
    assert groups.fetch_offsets("g", [("t", 0), ("u", 0)]) == [("t", 0, 1, -1, ""), ("u", 0, -1, -1, "")]
    assert groups.delete_offsets("nobody", [("t", 0)]) == (ErrorCode.group_id_not_found, [])
    assert groups.delete_offsets("", [("t", 0)]) == (ErrorCode.invalid_group_id, [])
    assert groups.leave("g", [(member, None)]) == [ErrorCode.none]
    assert groups.delete_offsets("g", [("t", 0)]) == (ErrorCode.none, [ErrorCode.none])  # empty now
    assert coordinator(store, purgatory).fetch_offsets("g", None) == []


def test_offset_delete_of_a_group_with_members_of_another_protocol_type_is_refused(store, purgatory):
    groups = coordinator(store, purgatory)
    stable_member(groups, protocol_type="connect")
    assert groups.delete_offsets("g", [("u", 0)]) == (ErrorCode.non_empty_group, [])


def test_an_unreadable_subscription_counts_as_subscribed_to_every_topic(store, purgatory):
    groups = coordinator(store, purgatory)
    joined = answered(groups.join("g", "", None, "c", "h", 10_000, 10_000, "consumer", [("range", b"\xff")],
                                  require_known_member_id=False))
    assert groups.delete_offsets("g", [("u", 0)]) == (ErrorCode.none, [ErrorCode.group_subscribed_to_topic])
    assert joined["error_code"] == ErrorCode.none


def test_list_groups_filters_by_state_and_type_ignoring_case(store, purgatory):
    groups = coordinator(store, purgatory)
    stable_member(groups, "busy")
    groups.commit_offsets("idle", -1, "", None, [("t", 0, 1, -1, None)])
    assert groups.groups() == [("busy", "consumer", "Stable", "classic"), ("idle", "", "Empty", "classic")]
    assert [g for g, *_ in groups.groups(states=["stable"])] == ["busy"]
    assert [g for g, *_ in groups.groups(states=["EMPTY", "Dead"])] == ["idle"]
    assert [g for g, *_ in groups.groups(types=["Classic"])] == ["busy", "idle"]
    assert groups.groups(types=["consumer"]) == []


def test_the_leader_epoch_is_committed_with_the_offset(store, purgatory):
    groups = coordinator(store, purgatory)
    assert groups.commit_offsets("g", -1, "", None, [("t", 0, 5, 4, "m"), ("t", 1, 6, -1, None)]) == [0, 0]
    assert groups.fetch_offsets("g", [("t", 0), ("t", 1)]) == [("t", 0, 5, 4, "m"), ("t", 1, 6, -1, "")]
    assert groups.commit_offsets("g", -1, "", None, [("t", 0, 8, -1, "")]) == [0]
    assert coordinator(store, purgatory).fetch_offsets("g", None) == [("t", 0, 8, -1, ""), ("t", 1, 6, -1, "")]


def test_a_commit_of_an_unknown_groups_generation_is_group_id_not_found_from_v9(store, purgatory):
    groups = coordinator(store, purgatory)
    assert groups.commit_offsets("ghost", 3, "m", None, [("t", 0, 1, -1, None)], 8) == [ErrorCode.illegal_generation]
    assert groups.commit_offsets("ghost", 3, "m", None, [("t", 0, 1, -1, None)], 9) == [ErrorCode.group_id_not_found]


def test_a_static_member_rejoining_a_stable_group_keeps_its_assignment_without_a_rebalance(store, purgatory):
    groups = coordinator(store, purgatory)
    old, generation = stable_member(groups, instance_id="worker-1")
    rejoined = answered(groups.join("g", "", "worker-1", "client", "h", 10_000, 10_000, "consumer",
                                    [("range", encode_subscription(["t"]))], require_known_member_id=True))
    assert rejoined["error_code"] == ErrorCode.none and rejoined["generation_id"] == generation
    new = rejoined["member_id"]
    assert new != old and rejoined["leader"] == old and rejoined["members"] == []  # not a leader again
    assert groups.describe("g")["state"] == "Stable"
    synced = answered(groups.sync("g", generation, new, "worker-1", {}))
    assert synced == {"throttle_time": 0, "error_code": ErrorCode.none, "protocol_type": "consumer",
                      "protocol_name": "range", "assignment": b"assigned"}
    assert groups.heartbeat("g", generation, old, "worker-1") == ErrorCode.fenced_instance_id
    assert groups.heartbeat("g", generation, new, "worker-1") == ErrorCode.none
    stored = offset_store(store).group_metadata()["g"]
    assert [m.member_id for m in stored.members] == [new] and stored.generation == generation


def test_a_static_member_rejoining_with_another_protocol_rebalances(store, purgatory):
    groups = coordinator(store, purgatory)
    old, generation = stable_member(groups, instance_id="worker-1")
    rejoined = answered(groups.join("g", "", "worker-1", "client", "h", 10_000, 10_000, "consumer",
                                    [("roundrobin", b""), ("range", encode_subscription(["t"]))],
                                    require_known_member_id=True))
    assert rejoined["error_code"] == ErrorCode.none and rejoined["generation_id"] == generation + 1
    assert rejoined["protocol_name"] == "roundrobin" and rejoined["leader"] == rejoined["member_id"]


def test_sync_group_v5_checks_the_protocol_type_and_name(store, purgatory):
    groups = coordinator(store, purgatory)
    member, generation = stable_member(groups)
    assert answered(groups.sync("g", generation, member, None, {}, "connect", None))["error_code"] == \
        ErrorCode.inconsistent_group_protocol
    assert answered(groups.sync("g", generation, member, None, {}, "consumer", "sticky"))["error_code"] == \
        ErrorCode.inconsistent_group_protocol
    assert answered(groups.sync("g", generation, member, None, {}, "consumer", "range"))["assignment"] == b"assigned"
