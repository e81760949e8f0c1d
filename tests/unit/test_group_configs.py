"""Group configs' file (kafka.groupconfigfile: durable, shared between processes, an invalid file
refused or kept out) and rules (kafka.configs.alter_group, describe_group, GroupConfigBounds);
the consumer group coordinator's per-group timeouts. The clients' view:
tests/kafka_clients/test_group_configs.py."""

from __future__ import annotations

import logging
import os

import pytest

from logstore.errorcodes import ErrorCode
from logstore.kafka import configs
from logstore.kafka.configs import APPEND, DELETE, SET, GroupConfigBounds, alter_group, describe_group
from logstore.kafka.groupconfigfile import GROUP_CONFIG_FILE, GroupConfigFile, GroupConfigFileError

SESSION, HEARTBEAT = "consumer.session.timeout.ms", "consumer.heartbeat.interval.ms"
BROKER = GroupConfigBounds().settings(45000, 5000)


def test_the_file_keeps_each_groups_configs_and_another_instance_sees_a_change(tmp_path):
    first, second = GroupConfigFile(tmp_path), GroupConfigFile(tmp_path)
    assert first.of("g") == {} and not (tmp_path / GROUP_CONFIG_FILE).exists()
    assert first.update("g", lambda current: ({**current, SESSION: "50000"}, "done")) == "done"
    assert second.of("g") == {SESSION: "50000"}  # re-read: the file moved
    second.update("h", lambda current: ({HEARTBEAT: "6000"}, None))
    assert first.current() == {"g": {SESSION: "50000"}, "h": {HEARTBEAT: "6000"}}
    first.update("g", lambda current: ({}, None))  # its last config gone: the group leaves the file
    assert GroupConfigFile(tmp_path).current() == {"h": {HEARTBEAT: "6000"}}
    stamp = os.stat(tmp_path / GROUP_CONFIG_FILE).st_mtime_ns
    first.update("h", lambda current: (None, None))  # None: unchanged, nothing written
    assert os.stat(tmp_path / GROUP_CONFIG_FILE).st_mtime_ns == stamp


def test_an_invalid_file_is_logged_at_open_kept_out_once_open_and_never_overwritten(tmp_path, caplog):
    live = GroupConfigFile(tmp_path)
    live.update("g", lambda current: ({SESSION: "50000"}, None))
    bad = '{"version": 1, "groups": {"g": {"consumer.session.timeout.ms": 5}}}'
    (tmp_path / GROUP_CONFIG_FILE).write_text(bad)
    with caplog.at_level(logging.ERROR, logger="logstore"):
        opened = GroupConfigFile(tmp_path)  # a server starts (a replica node, a classic-only broker): defaults
    assert opened.of("g") == {} and "not a group config file" in caplog.text
    assert live.of("g") == {SESSION: "50000"}  # the configs read before
    for reader in (live, opened):
        with pytest.raises(GroupConfigFileError):
            reader.update("g", lambda current: ({}, None))
    assert (tmp_path / GROUP_CONFIG_FILE).read_text() == bad  # nothing overwritten
    (tmp_path / GROUP_CONFIG_FILE).write_text("not json")
    assert GroupConfigFile(tmp_path).of("g") == {}
    (tmp_path / GROUP_CONFIG_FILE).write_text('{"version": 1, "groups": {"g": {"consumer.session.timeout.ms": "50000"}}}')
    assert opened.of("g") == {SESSION: "50000"}  # replaced by a valid one: read


@pytest.mark.regression
def test_a_value_of_thousands_of_digits_is_invalid_config_not_a_crash():
    """Python's int() refuses strings of 4300+ digits (ValueError): before, such a value crashed
    the handler and closed the connection."""
    for text in ("9" * 5000, "0" * 5000 + "45000", "12345678901"):
        code, message, _ = alter_group("g", {}, [(SESSION, SET, text)], True, BROKER)
        if text.endswith("45000"):
            assert code == ErrorCode.none
        else:
            assert code == ErrorCode.invalid_config and "Not a number of type INT" in message


def test_alter_group_sets_deletes_and_replaces():
    assert alter_group("g", {}, [(SESSION, SET, " 50000 ")], True, BROKER) == (ErrorCode.none, None, {SESSION: "50000"})
    assert alter_group("g", {SESSION: "50000"}, [(HEARTBEAT, SET, "+6000")], True, BROKER)[2] == {
        SESSION: "50000", HEARTBEAT: "6000"}
    assert alter_group("g", {SESSION: "50000"}, [(SESSION, DELETE, None)], True, BROKER)[2] == {}
    assert alter_group("g", {SESSION: "50000"}, [(HEARTBEAT, SET, "6000")], False, BROKER)[2] == {HEARTBEAT: "6000"}


@pytest.mark.parametrize("changes, code, words", [
    ([(SESSION, SET, "1"), (SESSION, DELETE, None)], ErrorCode.invalid_request, "duplicate config keys"),
    ([(SESSION, SET, None)], ErrorCode.invalid_request, "Null value"),
    ([(SESSION, 9, "1")], ErrorCode.invalid_request, "unknown config operation"),
    ([(SESSION, APPEND, "1")], ErrorCode.invalid_config, "append is not allowed"),
    ([("share.record.lock.duration.ms", SET, "30000")], ErrorCode.invalid_config, "no share groups"),
    ([("consumer.assignment.interval.ms", SET, "1000")], ErrorCode.invalid_config, "Unknown group config name"),
    ([(SESSION, SET, "4.5e4")], ErrorCode.invalid_config, "Not a number of type INT"),
    ([(SESSION, SET, "٤٥٠٠٠")], ErrorCode.invalid_config, "Not a number of type INT"),  # not ASCII digits
    ([(SESSION, SET, "2147483648")], ErrorCode.invalid_config, "Not a number of type INT"),
    ([(SESSION, SET, "-1")], ErrorCode.invalid_config, "at least 1"),
    ([(HEARTBEAT, SET, "60000"), (SESSION, SET, "60000")], ErrorCode.invalid_config, "must be less than or equal"),
])
def test_alter_group_refuses_as_kafka(changes, code, words):
    error, message, new = alter_group("g", {}, changes, True, BROKER)
    assert error == code and words in message and new == {}


def test_the_bounds_take_in_the_brokers_own_defaults():
    """A broker whose default lies outside Kafka's bounds (a short test session) keeps a group
    that sets only the other config valid."""
    broker = GroupConfigBounds().settings(3000, 250)
    assert broker["group.consumer.min.session.timeout.ms"] == 3000
    assert broker["group.consumer.min.heartbeat.interval.ms"] == 250
    assert alter_group("g", {}, [(HEARTBEAT, SET, "1000")], True, broker)[0] == ErrorCode.none
    assert alter_group("g", {}, [(SESSION, SET, "2999")], True, broker)[0] == ErrorCode.invalid_config
    with pytest.raises(ValueError):
        GroupConfigBounds(min_session_timeout_ms=70_000)


def test_describe_group_names_the_sources():
    error, _, entries = describe_group("g", {SESSION: "50000"}, BROKER, None, True)
    by_name = {e["name"]: e for e in entries}
    assert error == ErrorCode.none and set(by_name) == {SESSION, HEARTBEAT}
    assert by_name[SESSION]["config_source"] == configs.GROUP_CONFIG and by_name[SESSION]["value"] == "50000"
    assert [s["source"] for s in by_name[SESSION]["synonyms"]] == [configs.GROUP_CONFIG, configs.DEFAULT_CONFIG]
    assert by_name[HEARTBEAT]["config_source"] == configs.DEFAULT_CONFIG and by_name[HEARTBEAT]["is_default"]
    assert describe_group("g", {}, BROKER, [HEARTBEAT], False)[2][0]["synonyms"] == []
    assert describe_group("", {}, BROKER, None, False)[0] == ErrorCode.invalid_request


def test_the_coordinator_asks_each_heartbeat_for_the_groups_timeouts(tmp_path):
    """A member's heartbeat answer carries its group's interval; a session timeout lowered
    while it runs counts from its next heartbeat, before the longer timer it had."""
    import time
    import uuid

    from logstore import LogStore
    from logstore.groups.consumergroup import ConsumerGroupConfig, ConsumerGroupCoordinator, HeartbeatRequest
    from logstore.groups.offsets import offset_store
    from logstore.net.purgatory import Purgatory

    store = LogStore(str(tmp_path / "s"), maintenance=False)
    purgatory = Purgatory("test")
    own = {"g": (600_000, 700)}
    c = ConsumerGroupCoordinator(offset_store(store), purgatory, lambda: {"t": (uuid.UUID(int=9), 2)},
                                 ConsumerGroupConfig(session_timeout_ms=600_000, heartbeat_interval_ms=5000),
                                 timeouts=lambda group: own.get(group, (600_000, 5000)))
    try:
        joined = c.heartbeat(HeartbeatRequest("g", "a", 0, rebalance_timeout_ms=30000, subscribed_topic_names=("t",),
                                              owned={}))
        assert joined["heartbeat_interval"] == 700
        other = c.heartbeat(HeartbeatRequest("h", "b", 0, rebalance_timeout_ms=30000, subscribed_topic_names=("t",),
                                             owned={}))
        assert other["heartbeat_interval"] == 5000
        own["g"] = (300, 100)
        again = c.heartbeat(HeartbeatRequest("g", "a", joined["member_epoch"]))
        assert again["error_code"] == 0 and again["heartbeat_interval"] == 100
        deadline = time.monotonic() + 30
        while c.describe("g")["members"]:
            assert time.monotonic() < deadline, "the member was never fenced by its group's session timeout"
            time.sleep(0.05)
        assert [m["member_id"] for m in c.describe("h")["members"]] == ["b"]  # the broker's ten minutes
    finally:
        c.close()
        purgatory.close()
        store.close()
