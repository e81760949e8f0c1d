"""Unit tests of logstore.log.config: LogConfig defaults, Kafka names, coercion and validation."""

from __future__ import annotations

import dataclasses
import pickle

import pytest

from logstore.log.config import CLEANUP_POLICIES, LONG_MAX, LogConfig
from logstore.errors import InvalidConfigError, LogstoreError


# ---------------------------------------------------------------------- defaults
def test_defaults_are_kafkas_topic_defaults() -> None:
    c = LogConfig()
    assert c.segment_bytes == 1073741824
    assert c.segment_ms == 604800000
    assert c.segment_index_bytes == 10485760
    assert c.index_interval_bytes == 4096
    assert c.retention_ms == 604800000
    assert c.retention_bytes == -1
    assert c.flush_messages is None and c.flush_ms is None
    assert c.max_message_bytes == 1048588
    assert c.compression_type == "producer"
    assert c.message_timestamp_type == "CreateTime"
    assert c.file_delete_delay_ms == 60000
    assert c.preallocate is False
    assert c.cleanup_policy == "delete"
    assert c.min_cleanable_dirty_ratio == 0.5
    assert c.delete_retention_ms == 86400000
    assert c.max_compaction_lag_ms == LONG_MAX == 2**63 - 1


def test_config_is_frozen_hashable_and_picklable() -> None:
    c = LogConfig(segment_bytes=4096)
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.segment_bytes = 1  # type: ignore[misc]
    assert hash(c) == hash(LogConfig(segment_bytes=4096))
    assert pickle.loads(pickle.dumps(c)) == c


# ---------------------------------------------------------------------- from_kafka
def test_from_kafka_parses_property_file_strings() -> None:
    c = LogConfig.from_kafka({
        "segment.bytes": " 1048576 ",
        "retention.ms": "-1",
        "preallocate": "TRUE",
        "min.cleanable.dirty.ratio": "0.25",
        "compression.zstd.level": "9",
        "message.timestamp.type": "LogAppendTime",
        "cleanup.policy": "compact",
    })
    assert c.segment_bytes == 1048576
    assert c.retention_ms == -1
    assert c.preallocate is True
    assert c.min_cleanable_dirty_ratio == 0.25
    assert c.compression_zstd_level == 9
    assert c.message_timestamp_type == "LogAppendTime"
    assert c.timestamp_type_code == 1
    assert c.cleanup_policy == "compact"


@pytest.mark.parametrize("text, expected", [("true", True), ("false", False), ("False", False), (" true ", True)])
def test_from_kafka_parses_booleans(text: str, expected: bool) -> None:
    assert LogConfig.from_kafka({"preallocate": text}).preallocate is expected


def test_from_kafka_accepts_native_numbers_and_bools() -> None:
    c = LogConfig.from_kafka({"segment.bytes": 2048, "preallocate": True, "min.cleanable.dirty.ratio": 0.75})
    assert (c.segment_bytes, c.preallocate, c.min_cleanable_dirty_ratio) == (2048, True, 0.75)


@pytest.mark.parametrize("value", [str(LONG_MAX), LONG_MAX])
def test_long_max_in_flush_settings_means_never(value: object) -> None:
    c = LogConfig.from_kafka({"flush.messages": value, "flush.ms": value})
    assert c.flush_messages is None
    assert c.flush_ms is None


def test_long_max_is_kept_where_it_is_a_real_value() -> None:
    # max.compaction.lag.ms has no "None": Long.MAX_VALUE is its literal default.
    c = LogConfig.from_kafka({"max.compaction.lag.ms": str(LONG_MAX)})
    assert c.max_compaction_lag_ms == LONG_MAX


def test_from_kafka_rejects_unknown_names_naming_them() -> None:
    with pytest.raises(InvalidConfigError, match=r"unknown Kafka config 'segment\.byte'") as info:
        LogConfig.from_kafka({"segment.bytes": "1024", "segment.byte": "1024"})
    assert "segment.bytes" in str(info.value)  # the known names are listed to help with typos


def test_from_kafka_rejects_snake_case_names() -> None:
    with pytest.raises(InvalidConfigError, match="segment_bytes"):
        LogConfig.from_kafka({"segment_bytes": 1024})


@pytest.mark.parametrize("props, field", [
    ({"preallocate": "yes"}, "preallocate"),
    ({"segment.bytes": "1.5"}, "segment_bytes"),
    ({"segment.bytes": "ten"}, "segment_bytes"),
    ({"min.cleanable.dirty.ratio": "half"}, "min_cleanable_dirty_ratio"),
])
def test_from_kafka_unparsable_strings_name_the_field(props: dict, field: str) -> None:
    with pytest.raises(InvalidConfigError, match=field):
        LogConfig.from_kafka(props)


def test_from_kafka_and_build_reject_non_mappings_with_type_error() -> None:
    with pytest.raises(TypeError, match="mapping"):
        LogConfig.from_kafka([("segment.bytes", "1024")])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="config names must be str"):
        LogConfig.from_kafka({1: "x"})  # type: ignore[dict-item]
    with pytest.raises(TypeError, match="LogConfig or a mapping"):
        LogConfig.build([1])  # type: ignore[arg-type]


# ---------------------------------------------------------------------- to_kafka
def test_to_kafka_uses_dotted_names_and_string_values() -> None:
    out = LogConfig(preallocate=True, flush_messages=10).to_kafka()
    assert all(isinstance(v, str) for v in out.values())
    assert out["segment.bytes"] == "1073741824"
    assert out["preallocate"] == "true"
    assert out["flush.messages"] == "10"
    assert out["flush.ms"] == str(LONG_MAX)  # None is written as Kafka's "never"
    assert out["cleanup.policy"] == "delete"


@pytest.mark.parametrize("config", [
    LogConfig(),
    LogConfig(segment_bytes=4096, flush_messages=1, flush_ms=0, preallocate=True, cleanup_policy="delete,compact",
              compression_type="zstd", compression_zstd_level=-3, min_cleanable_dirty_ratio=0.1 + 0.2,
              message_timestamp_type="LogAppendTime", retention_bytes=123456789012),
    LogConfig(min_cleanable_dirty_ratio=1),
])
def test_to_kafka_round_trips_through_from_kafka(config: LogConfig) -> None:
    assert LogConfig.from_kafka(config.to_kafka()) == config


# ---------------------------------------------------------------------- cleanup policy
@pytest.mark.parametrize("policy, normal", [
    ("delete", "delete"),
    ("compact", "compact"),
    ("compact,delete", "compact,delete"),
    ("delete,compact", "compact,delete"),
    (" delete , compact ", "compact,delete"),
    (["delete", "compact"], "compact,delete"),
    (("compact",), "compact"),
])
def test_cleanup_policy_is_normalised(policy: object, normal: str) -> None:
    c = LogConfig(cleanup_policy=policy)  # type: ignore[arg-type]
    assert c.cleanup_policy == normal
    assert normal in CLEANUP_POLICIES


def test_cleanup_policy_normalised_from_kafka_string() -> None:
    c = LogConfig.from_kafka({"cleanup.policy": "delete,compact"})
    assert c.cleanup_policy == "compact,delete"
    assert c.compacted and c.deletes


def test_compacted_and_deletes_follow_the_policy() -> None:
    assert (LogConfig(cleanup_policy="compact").compacted, LogConfig(cleanup_policy="compact").deletes) == (True, False)
    assert (LogConfig().compacted, LogConfig().deletes) == (False, True)


@pytest.mark.parametrize("policy", ["", "compact,compact", "delete,delete", "remove", "compact,delete,x", [], 5])
def test_invalid_cleanup_policies_are_rejected(policy: object) -> None:
    with pytest.raises(InvalidConfigError, match="cleanup_policy"):
        LogConfig(cleanup_policy=policy)  # type: ignore[arg-type]


# ---------------------------------------------------------------------- validation
@pytest.mark.parametrize("field, value", [
    ("segment_bytes", 13),
    ("segment_bytes", 2**31),
    ("segment_ms", 0),
    ("segment_index_bytes", 7),
    ("index_interval_bytes", -1),
    ("retention_ms", -2),
    ("retention_bytes", -2),
    ("flush_messages", 0),
    ("flush_ms", -1),
    ("max_message_bytes", -1),
    ("compression_zstd_level", 23),
    ("compression_gzip_level", 10),
    ("compression_lz4_level", 0),
    ("file_delete_delay_ms", -1),
    ("delete_retention_ms", -1),
    ("min_compaction_lag_ms", -1),
    ("max_compaction_lag_ms", 0),
    ("segment_jitter_ms", -1),
    ("segment_ms", LONG_MAX + 1),
])
def test_out_of_range_values_name_the_field_and_value(field: str, value: int) -> None:
    with pytest.raises(InvalidConfigError, match=rf"{field} must be in \[.*\], got {value}"):
        LogConfig(**{field: value})


@pytest.mark.parametrize("field, value", [
    ("segment_bytes", "1024"),
    ("segment_bytes", 1024.0),
    ("segment_bytes", True),  # bool is an int subclass but never a size
    ("flush_messages", "1"),
    ("preallocate", 1),
    ("preallocate", "true"),
    ("min_cleanable_dirty_ratio", "0.5"),
    ("min_cleanable_dirty_ratio", True),
    ("compression_type", 4),
    ("message_timestamp_type", 0),
])
def test_wrong_types_name_the_field(field: str, value: object) -> None:
    with pytest.raises(InvalidConfigError, match=field):
        LogConfig(**{field: value})


def test_boundary_values_are_accepted() -> None:
    c = LogConfig(segment_bytes=14, segment_index_bytes=8, index_interval_bytes=0, retention_ms=-1,
                  flush_messages=1, flush_ms=0, max_message_bytes=0, min_cleanable_dirty_ratio=0.0)
    assert (c.segment_bytes, c.segment_index_bytes, c.flush_messages) == (14, 8, 1)
    assert LogConfig(segment_bytes=2**31 - 1, min_cleanable_dirty_ratio=1.0).segment_bytes == 2**31 - 1


@pytest.mark.parametrize("ratio", [-0.01, 1.01, float("nan"), float("inf")])
def test_dirty_ratio_outside_zero_one_is_rejected(ratio: float) -> None:
    with pytest.raises(InvalidConfigError, match="min_cleanable_dirty_ratio"):
        LogConfig(min_cleanable_dirty_ratio=ratio)


def test_unknown_compression_type_lists_the_known_ones() -> None:
    with pytest.raises(InvalidConfigError, match="compression_type.*'zstd'.*got 'brotli'"):
        LogConfig(compression_type="brotli")
    for codec in ("producer", "none", "gzip", "snappy", "lz4", "zstd"):
        assert LogConfig(compression_type=codec).compression_type == codec


def test_timestamp_type_is_case_sensitive_like_kafka() -> None:
    with pytest.raises(InvalidConfigError, match="message_timestamp_type.*'createtime'"):
        LogConfig(message_timestamp_type="createtime")
    assert LogConfig().timestamp_type_code == 0


def test_invalid_config_error_is_both_logstore_and_value_error() -> None:
    with pytest.raises(InvalidConfigError) as info:
        LogConfig(segment_bytes=1)
    assert isinstance(info.value, LogstoreError)
    assert isinstance(info.value, ValueError)


# ---------------------------------------------------------------------- replace / build
def test_replace_returns_validated_copy_and_leaves_original() -> None:
    base = LogConfig()
    changed = base.replace(segment_bytes=4096, cleanup_policy="delete,compact")
    assert changed.segment_bytes == 4096 and changed.cleanup_policy == "compact,delete"
    assert base.segment_bytes == 1073741824
    with pytest.raises(InvalidConfigError, match="segment_bytes"):
        base.replace(segment_bytes=0)


def test_replace_rejects_unknown_fields_naming_them() -> None:
    with pytest.raises(InvalidConfigError, match="segmnt_bytes"):
        LogConfig().replace(segmnt_bytes=1)


def test_build_from_none_config_and_overrides() -> None:
    assert LogConfig.build() == LogConfig()
    base = LogConfig(retention_ms=5)
    assert LogConfig.build(base) is base
    assert LogConfig.build(base, segment_bytes=2048) == LogConfig(retention_ms=5, segment_bytes=2048)


def test_build_merges_dotted_and_snake_case_mapping_keys() -> None:
    c = LogConfig.build({"segment.bytes": "2048", "retention_ms": 5}, flush_messages=3)
    assert (c.segment_bytes, c.retention_ms, c.flush_messages) == (2048, 5, 3)
    assert LogConfig.build({"retention_ms": 7}).retention_ms == 7


def test_build_rejects_unknown_names_from_either_spelling() -> None:
    with pytest.raises(InvalidConfigError, match="retention_msec"):
        LogConfig.build({"retention_msec": 1})
    with pytest.raises(InvalidConfigError, match="retention.msec"):
        LogConfig.build({"retention.msec": 1})
    with pytest.raises(InvalidConfigError, match="nope"):
        LogConfig.build(None, nope=1)
