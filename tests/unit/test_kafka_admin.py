"""kafka.admin and the change rules of kafka.configs, without a network: what an AlterConfigs or
IncrementalAlterConfigs does to a topic's overrides, what each refuses and why, and the answers
of a broker that refuses the admin changes by policy. (The APIs end to end, through real admin
clients: tests/kafka_clients/test_admin.py.)"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from logstore import InvalidConfigError, LogStore
from logstore.errorcodes import ErrorCode
from logstore.kafka import admin
from logstore.kafka.configs import APPEND, DELETE, DYNAMIC_BROKER_CONFIGS, SET, SUBTRACT, alter_broker, apply_changes, \
    check_topic_changes, store_keywords
from logstore.log.config import LogConfig

DEFAULTS = LogConfig()


def test_alter_configs_replaces_the_whole_set():
    assert apply_changes(DEFAULTS, {"retention.ms": "5"}, [("segment.ms", SET, "7")], incremental=False) == \
        {"segment.ms": "7"}


def test_incremental_changes_set_delete_append_and_subtract_from_the_current_or_default_value():
    current = {"retention.ms": "5", "segment.ms": "9"}
    changes = [("retention.ms", DELETE, None), ("segment.ms", SET, "10"), ("cleanup.policy", APPEND, "compact")]
    assert apply_changes(DEFAULTS, current, changes, incremental=True) == \
        {"segment.ms": "10", "cleanup.policy": "delete,compact"}  # appended to the default "delete"
    assert apply_changes(DEFAULTS, {"cleanup.policy": "compact,delete"}, [("cleanup.policy", SUBTRACT, "delete")],
                         incremental=True) == {"cleanup.policy": "compact"}
    assert apply_changes(DEFAULTS, {"cleanup.policy": "compact"}, [("cleanup.policy", APPEND, "compact")],
                         incremental=True) == {"cleanup.policy": "compact"}  # already there: once


@pytest.mark.parametrize("changes, incremental, expected", [
    ([("retention.ms", SET, "1"), ("retention.ms", DELETE, None)], True, ErrorCode.invalid_request),
    ([("retention.ms", SET, None)], True, ErrorCode.invalid_request),
    ([("retention.ms", SET, None)], False, ErrorCode.invalid_config),
    ([("retention.ms", 9, "1")], True, ErrorCode.invalid_request),
    ([("no.such.config", SET, "1")], True, ErrorCode.invalid_config),
    ([("log.cleaner.dedupe.buffer.size", SET, "1000")], True, ErrorCode.invalid_config),  # a broker setting
    ([("retention.ms", APPEND, "1")], True, ErrorCode.invalid_config),  # not a list
])
def test_refused_changes_get_kafkas_error(changes, incremental, expected):
    error, message = check_topic_changes(changes, incremental)
    assert error == expected and message


def test_good_changes_pass_the_checks():
    assert check_topic_changes([("cleanup.policy", SUBTRACT, "delete"), ("retention.ms", DELETE, None)], True) is None


def test_store_keywords_types_the_name_without_a_dot():
    assert store_keywords({"preallocate": "true", "segment.ms": "5"}) == {"preallocate": True, "segment.ms": "5"}
    with pytest.raises(InvalidConfigError):
        store_keywords({"preallocate": "maybe"})


def test_a_broker_config_is_dynamic_read_only_or_unknown(tmp_path):
    settings = {"num.partitions": 1}
    with LogStore(tmp_path, maintenance=False) as store:
        def alter(name, changes, incremental=True, validate_only=False):
            return alter_broker(store, 0, name, settings, changes, incremental, validate_only)

        assert alter("0", [("num.partitions", SET, "3")])[0] == ErrorCode.invalid_config
        error, message = alter("", [("made.up", SET, "3")])
        assert error == ErrorCode.invalid_config and "made.up" in message
        assert alter("4", [("num.partitions", SET, "3")])[0] == ErrorCode.invalid_request
        assert alter("0", [("log.retention.ms", SET, "5")], validate_only=True) == (ErrorCode.none, None)
        assert store.dynamic_defaults == {}
        assert alter("0", [("log.cleanup.policy", APPEND, "compact"), ("message.max.bytes", SET, "900"),
                           ("log.cleaner.dedupe.buffer.size", SET, "4096")]) == (ErrorCode.none, None)
        assert store.dynamic_defaults == {"cleanup.policy": "compact,delete", "max.message.bytes": "900",
                                          "log.cleaner.dedupe.buffer.size": "4096"}
        assert alter("0", [("log.roll.ms", SET, "1000")], incremental=False) == (ErrorCode.none, None)
        assert store.dynamic_defaults == {"segment.ms": "1000"}  # AlterConfigs replaces the set
        assert DYNAMIC_BROKER_CONFIGS["message.max.bytes"] == "max.message.bytes"


def test_a_refusing_broker_answers_each_item_with_policy_violation():
    def request(api_key, **body):
        return SimpleNamespace(api_key=api_key, body=SimpleNamespace(**body))

    grow = admin.refused(request(37, topics=[SimpleNamespace(name="t")]), "fixed")
    assert grow["results"] == [{"name": "t", "error_code": ErrorCode.policy_violation, "error_message": "fixed"}]
    alter = admin.refused(request(44, resources=[SimpleNamespace(resource_type=2, resource_name="t")]), "fixed")
    assert alter["responses"][0]["error_code"] == ErrorCode.policy_violation
    other = admin.refused(request(33, resources=[SimpleNamespace(resource_type=2, resource_name="t")]), "no leader",
                          ErrorCode.not_controller)
    assert other["responses"][0]["error_code"] == ErrorCode.not_controller
