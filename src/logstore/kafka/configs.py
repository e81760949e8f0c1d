"""DescribeConfigs: a topic's configuration (and the broker's) as Kafka describes it.

A topic's entries are its effective :class:`~logstore.log.config.LogConfig` by Kafka's names, each
with where its value comes from, as Kafka's ``ConfigSource``: the topic's own setting
(DYNAMIC_TOPIC_CONFIG), a default the store was opened with (STATIC_BROKER_CONFIG), or Kafka's
default (DEFAULT_CONFIG). With ``include_synonyms`` an entry lists its value at each level that
sets it, most specific first, as Kafka does. The broker's entries are the server's own settings.

Thread-safety: the functions are pure over what they are given (the store's describe() is
thread-safe).
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from ..log.config import LogConfig
from ..errors import InvalidTopicError, UnknownTopicOrPartitionError
from ..errorcodes import ErrorCode
from ..store.store import LogStore

__all__ = ["TOPIC", "BROKER", "NOT_TOPIC_CONFIGS", "describe_topic", "describe_broker"]

#: Kafka's ConfigResource types.
TOPIC = 2
BROKER = 4

# Kafka's ConfigSource.
DYNAMIC_TOPIC_CONFIG = 1
STATIC_BROKER_CONFIG = 4
DEFAULT_CONFIG = 5

# Kafka's ConfigDef types.
_BOOLEAN, _STRING, _INT, _LONG, _DOUBLE, _LIST = 1, 2, 3, 5, 6, 7
_TYPES = {"segment.bytes": _INT, "segment.index.bytes": _INT, "index.interval.bytes": _INT,
          "max.message.bytes": _INT, "compression.gzip.level": _INT, "compression.lz4.level": _INT,
          "compression.zstd.level": _INT, "log.cleaner.dedupe.buffer.size": _LONG, "cleanup.policy": _LIST,
          "compression.type": _STRING, "message.timestamp.type": _STRING, "preallocate": _BOOLEAN,
          "min.cleanable.dirty.ratio": _DOUBLE}
#: How Kafka writes the codecs' default levels (LogConfig keeps None, to_kafka a long's maximum).
_DEFAULT_LEVELS = {"compression.gzip.level": "-1", "compression.lz4.level": "9", "compression.zstd.level": "3"}


def _kafka_view(config: LogConfig) -> dict[str, str]:
    out = config.to_kafka()
    for name, default in _DEFAULT_LEVELS.items():
        if getattr(config, name.replace(".", "_")) is None:
            out[name] = default
    return out


_KAFKA_DEFAULTS = _kafka_view(LogConfig())
#: A topic config's broker-level synonym (the broker setting that gives its default).
_BROKER_NAMES = {
    "segment.bytes": "log.segment.bytes", "segment.ms": "log.roll.ms", "segment.jitter.ms": "log.roll.jitter.ms",
    "segment.index.bytes": "log.index.size.max.bytes", "index.interval.bytes": "log.index.interval.bytes",
    "retention.ms": "log.retention.ms", "retention.bytes": "log.retention.bytes",
    "flush.messages": "log.flush.interval.messages", "flush.ms": "log.flush.interval.ms",
    "max.message.bytes": "message.max.bytes", "message.timestamp.type": "log.message.timestamp.type",
    "file.delete.delay.ms": "log.segment.delete.delay.ms", "preallocate": "log.preallocate",
    "cleanup.policy": "log.cleanup.policy", "min.cleanable.dirty.ratio": "log.cleaner.min.cleanable.ratio",
    "delete.retention.ms": "log.cleaner.delete.retention.ms",
    "min.compaction.lag.ms": "log.cleaner.min.compaction.lag.ms",
    "max.compaction.lag.ms": "log.cleaner.max.compaction.lag.ms",
}

#: Settings a store keeps per topic that Kafka has only as broker settings: not among a topic's
#: configs as Kafka describes them.
NOT_TOPIC_CONFIGS = frozenset({"log.cleaner.dedupe.buffer.size"})


def _entry(name: str, value: str, source: int, synonyms: list[tuple[str, str, int]], include_synonyms: bool,
           read_only: bool = False) -> dict[str, Any]:
    return {"name": name, "value": value, "read_only": read_only, "config_source": source,
            "is_default": source == DEFAULT_CONFIG, "is_sensitive": False,
            "synonyms": [{"name": n, "value": v, "source": s} for n, v, s in synonyms] if include_synonyms else [],
            "config_type": _TYPES.get(name, _LONG if value.lstrip("-").isdigit() else _STRING),
            "documentation": None}


def describe_topic(store: LogStore, topic: str, keys: Sequence[str] | None,
                   include_synonyms: bool) -> tuple[int, str | None, list[dict[str, Any]]]:
    """(error code, error message, config entries) of a topic."""
    try:
        described = store.describe(topic)
    except (UnknownTopicOrPartitionError, InvalidTopicError):
        return ErrorCode.unknown_topic_or_partition, f"topic {topic!r} does not exist", []
    effective = _kafka_view(described.config)
    store_defaults = _kafka_view(store.defaults)
    entries = []
    for name, value in effective.items():
        if name in NOT_TOPIC_CONFIGS or (keys is not None and name not in keys):
            continue
        synonyms = []
        if name in described.overrides:
            synonyms.append((name, described.overrides[name], DYNAMIC_TOPIC_CONFIG))
        broker_name = _BROKER_NAMES.get(name, name)
        if store_defaults[name] != _KAFKA_DEFAULTS[name]:
            synonyms.append((broker_name, store_defaults[name], STATIC_BROKER_CONFIG))
        synonyms.append((broker_name, _KAFKA_DEFAULTS[name], DEFAULT_CONFIG))
        entries.append(_entry(name, value, synonyms[0][2], synonyms, include_synonyms))
    return ErrorCode.none, None, entries


def new_topic_configs(store: LogStore, configs: Mapping[str, str | None]) -> list[dict[str, Any]]:
    """CreateTopics v5+'s configs of a topic created (or validated) with ``configs`` (valid
    ones, by Kafka's names): every topic config with its value and source (KIP-525)."""
    effective = _kafka_view(LogConfig.from_kafka({**store.defaults.to_kafka(), **configs}))
    store_defaults = _kafka_view(store.defaults)
    entries = []
    for name, value in effective.items():
        if name in NOT_TOPIC_CONFIGS:
            continue
        if name in configs:
            source = DYNAMIC_TOPIC_CONFIG
        elif store_defaults[name] != _KAFKA_DEFAULTS[name]:
            source = STATIC_BROKER_CONFIG
        else:
            source = DEFAULT_CONFIG
        entries.append(_entry(name, value, source, [], False))
    return entries


def describe_broker(node_id: int, resource_name: str, settings: Mapping[str, Any], keys: Sequence[str] | None,
                    include_synonyms: bool) -> tuple[int, str | None, list[dict[str, Any]]]:
    """(error code, error message, config entries) of this broker (``resource_name`` is its id,
    or empty for the broker answering)."""
    if resource_name not in ("", str(node_id)):
        return ErrorCode.invalid_request, f"this is broker {node_id}, not {resource_name!r}", []
    entries = []
    for name, value in settings.items():
        if keys is None or name in keys:
            text = str(value).lower() if isinstance(value, bool) else str(value)
            entries.append(_entry(name, text, STATIC_BROKER_CONFIG, [(name, text, STATIC_BROKER_CONFIG)],
                                  include_synonyms, read_only=True))
    return ErrorCode.none, None, entries
