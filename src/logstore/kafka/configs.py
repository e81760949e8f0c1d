"""DescribeConfigs and the changes of AlterConfigs and IncrementalAlterConfigs: a topic's
configuration (and the broker's) as Kafka describes and changes it. The one home of the config
tables the Kafka listener uses.

A topic's entries are its effective :class:`~logstore.log.config.LogConfig` by Kafka's names, each
with where its value comes from, as Kafka's ``ConfigSource``: the topic's own setting
(DYNAMIC_TOPIC_CONFIG), a default the store was opened with (STATIC_BROKER_CONFIG), or Kafka's
default (DEFAULT_CONFIG). With ``include_synonyms`` an entry lists its value at each level that
sets it, most specific first, as Kafka does. The broker's entries are the server's own settings.

A change is checked as Kafka's ``ConfigAdminManager`` checks it (:func:`check_topic_changes`: a
key named twice, a null value, an operation a config's type does not allow, an unknown name)
and applied to a topic's overrides by :func:`apply_changes`: AlterConfigs replaces the whole
set, IncrementalAlterConfigs SETs, DELETEs, and APPENDs to or SUBTRACTs from a list config
(``cleanup.policy``) starting from its current value (the override, or the store's default).
The broker's dynamic configs are the store's dynamic defaults (:func:`alter_broker`); its other
settings are fixed when the server starts.

A group's configs (resource type GROUP, KIP-848) are the consumer group protocol's
``consumer.session.timeout.ms`` and ``consumer.heartbeat.interval.ms``
(:data:`GROUP_CONFIGS`): :func:`describe_group` gives each with its source (the group's own
setting, GROUP_CONFIG; else the broker's ``group.consumer.*``), and :func:`alter_group` checks a
change as Kafka's ``GroupConfig`` does (a whole number of at least 1, within the broker's
``group.consumer.min/max.*`` bounds, :class:`GroupConfigBounds`, the session longer than the
heartbeat interval) before the caller keeps it. Kafka's share and streams group configs
(``share.*``, ``streams.*``) belong to group types this broker does not serve: they are not
described, and a change of one is INVALID_CONFIG saying so, rather than a setting kept that
nothing would ever apply.

Thread-safety: the functions are pure over what they are given (the store's describe() is
thread-safe).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from ..log.config import KAFKA_NAMES, LogConfig
from ..errors import InvalidConfigError, InvalidTopicError, UnknownTopicOrPartitionError
from ..errorcodes import ErrorCode
from ..store.store import LogStore

__all__ = ["TOPIC", "BROKER", "GROUP", "GROUP_CONFIGS", "GroupConfigBounds", "describe_group", "alter_group",
           "NOT_TOPIC_CONFIGS", "DYNAMIC_BROKER_CONFIGS", "SET", "DELETE", "APPEND", "SUBTRACT", "describe_topic",
           "describe_broker", "check_topic_changes", "apply_changes", "store_keywords", "alter_broker"]

#: Kafka's ConfigResource types.
TOPIC = 2
BROKER = 4
GROUP = 32

#: IncrementalAlterConfigs' operations (Kafka's AlterConfigOp.OpType).
SET, DELETE, APPEND, SUBTRACT = 0, 1, 2, 3
_OPERATIONS = {SET: "set", DELETE: "delete", APPEND: "append", SUBTRACT: "subtract"}

# Kafka's ConfigSource.
DYNAMIC_TOPIC_CONFIG = 1
DYNAMIC_BROKER_CONFIG = 2
STATIC_BROKER_CONFIG = 4
DEFAULT_CONFIG = 5
GROUP_CONFIG = 8

# Kafka's ConfigDef types.
_BOOLEAN, _STRING, _INT, _LONG, _DOUBLE, _LIST = 1, 2, 3, 5, 6, 7
_TYPES = {"segment.bytes": _INT, "segment.index.bytes": _INT, "index.interval.bytes": _INT,
          "max.message.bytes": _INT, "compression.gzip.level": _INT, "compression.lz4.level": _INT,
          "compression.zstd.level": _INT, "log.cleaner.dedupe.buffer.size": _LONG, "cleanup.policy": _LIST,
          "compression.type": _STRING, "message.timestamp.type": _STRING, "preallocate": _BOOLEAN,
          "min.cleanable.dirty.ratio": _DOUBLE, "remote.storage.enable": _BOOLEAN}
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
    "local.retention.ms": "log.local.retention.ms", "local.retention.bytes": "log.local.retention.bytes",
}

#: Settings a store keeps per topic that Kafka has only as broker settings: not among a topic's
#: configs as Kafka describes them.
NOT_TOPIC_CONFIGS = frozenset({"log.cleaner.dedupe.buffer.size"})
#: The broker's dynamic configs (Kafka's ``DynamicLogConfig``: a default of every topic's
#: config, changed per broker without a restart) -> the topic config each is the default of:
#: the store's dynamic defaults (``LogStore.alter_defaults``).
DYNAMIC_BROKER_CONFIGS = {_BROKER_NAMES.get(name, name): name for name in KAFKA_NAMES}


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
    entries = []
    for name, value in effective.items():
        if name in NOT_TOPIC_CONFIGS or (keys is not None and name not in keys):
            continue
        synonyms = []
        if name in described.overrides:
            synonyms.append((name, described.overrides[name], DYNAMIC_TOPIC_CONFIG))
        synonyms += _default_levels(store, name)
        entries.append(_entry(name, value, synonyms[0][2], synonyms, include_synonyms))
    return ErrorCode.none, None, entries


def _default_levels(store: LogStore, name: str) -> list[tuple[str, str, int]]:
    """The levels that give topic config ``name`` its default, most specific first, as
    (broker config name, value, source): the store's dynamic default, the default it was
    opened with, Kafka's."""
    broker_name = _BROKER_NAMES.get(name, name)
    levels = []
    dynamic = store.dynamic_defaults
    if name in dynamic:
        levels.append((broker_name, _kafka_view(store.defaults)[name], DYNAMIC_BROKER_CONFIG))
    static = _kafka_view(store.static_defaults)[name]
    if static != _KAFKA_DEFAULTS[name]:
        levels.append((broker_name, static, STATIC_BROKER_CONFIG))
    levels.append((broker_name, _KAFKA_DEFAULTS[name], DEFAULT_CONFIG))
    return levels


def new_topic_configs(store: LogStore, configs: Mapping[str, str | None]) -> list[dict[str, Any]]:
    """CreateTopics v5+'s configs of a topic created (or validated) with ``configs`` (valid
    ones, by Kafka's names): every topic config with its value and source (KIP-525)."""
    effective = _kafka_view(LogConfig.from_kafka({**store.defaults.to_kafka(), **configs}))
    entries = []
    for name, value in effective.items():
        if name in NOT_TOPIC_CONFIGS:
            continue
        source = DYNAMIC_TOPIC_CONFIG if name in configs else _default_levels(store, name)[0][2]
        entries.append(_entry(name, value, source, [], False))
    return entries


def describe_broker(node_id: int, resource_name: str, settings: Mapping[str, Any], keys: Sequence[str] | None,
                    include_synonyms: bool, store: LogStore | None = None) -> tuple[int, str | None, list[dict[str, Any]]]:
    """(error code, error message, config entries) of this broker (``resource_name`` is its id,
    or empty for the broker answering): its fixed settings (read-only) and, given the store, its
    dynamic configs (the defaults of the topics' configs)."""
    if resource_name not in ("", str(node_id)):
        return ErrorCode.invalid_request, f"this is broker {node_id}, not {resource_name!r}", []
    entries = []
    for broker_name, name in (DYNAMIC_BROKER_CONFIGS.items() if store is not None else ()):
        if keys is None or broker_name in keys:
            levels = _default_levels(store, name)  # type: ignore[arg-type]
            entry = _entry(broker_name, levels[0][1], levels[0][2], levels, include_synonyms)
            entry["config_type"] = _TYPES.get(name, entry["config_type"])
            entries.append(entry)
    for name, value in settings.items():
        if keys is None or name in keys:
            text = str(value).lower() if isinstance(value, bool) else str(value)
            entries.append(_entry(name, text, STATIC_BROKER_CONFIG, [(name, text, STATIC_BROKER_CONFIG)],
                                  include_synonyms, read_only=True))
    return ErrorCode.none, None, entries


def check_topic_changes(changes: Sequence[tuple[str, int, str | None]], incremental: bool,
                        broker: bool = False) -> tuple[int, str] | None:
    """Why a topic's (name, operation, value) changes are refused before they are tried, as
    (error code, message), or None. ``broker``: the changes of the broker's dynamic configs,
    by their topic config names (which may include the broker-only dedupe buffer)."""
    refused = _check_shape(changes, incremental, "topic")
    if refused is not None:
        return refused
    for name, operation, value in changes:
        if name not in KAFKA_NAMES or (name in NOT_TOPIC_CONFIGS and not broker):
            return ErrorCode.invalid_config, f"Unknown topic config name: {name}"
        if operation in (APPEND, SUBTRACT) and _TYPES.get(name) != _LIST:
            return ErrorCode.invalid_config, (f"Config value {_OPERATIONS[operation]} is not allowed for config key: "
                                              f"{name}")
    return None


def _check_shape(changes: Sequence[tuple[str, int, str | None]], incremental: bool,
                 kind: str) -> tuple[int, str] | None:
    """Why changes of a ``kind`` resource are refused whatever their names: a key named twice,
    an unknown operation, a null value to set."""
    names = [name for name, _, _ in changes]
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        return ErrorCode.invalid_request, f"Error due to duplicate config keys: {', '.join(twice)}"
    for name, operation, value in changes:
        if operation not in _OPERATIONS:
            return ErrorCode.invalid_request, f"unknown config operation {operation} for {name}"
        if value is None and operation != DELETE:
            if incremental:
                return ErrorCode.invalid_request, f"Null value not supported for : {name}"
            return ErrorCode.invalid_config, f"null value not supported for {kind} configs: {name}"
    return None


def apply_changes(defaults: LogConfig, current: Mapping[str, str], changes: Sequence[tuple[str, int, str | None]],
                  incremental: bool) -> dict[str, str | None]:
    """A topic's new overrides (Kafka's names) after ``changes`` (checked by
    :func:`check_topic_changes`) to its ``current`` ones; ``defaults`` give a list config's
    value when the topic does not override it."""
    if not incremental:
        return {name: value for name, _, value in changes}
    out: dict[str, str | None] = dict(current)
    for name, operation, value in changes:
        if operation == SET:
            out[name] = value
        elif operation == DELETE:
            out.pop(name, None)
        else:
            base = out.get(name)
            items = [i for i in (base if base is not None else defaults.to_kafka()[name]).split(",") if i]
            given = [i.strip() for i in (value or "").split(",") if i.strip()]
            if operation == APPEND:
                items += [i for i in given if i not in items]
            else:
                items = [i for i in items if i not in given]
            out[name] = ",".join(items)
    return out


def store_keywords(configs: Mapping[str, str | None]) -> dict[str, Any]:
    """Overrides by Kafka's names as :meth:`LogStore.create_topic` and
    :meth:`~LogStore.alter_topic_config` take them: a dotted name's string as it is, the one
    name without a dot (``preallocate``, also a LogConfig field) as its typed value.

    Raises:
        InvalidConfigError: a value of the wrong kind for its name.
    """
    return {name: value if "." in name else getattr(LogConfig.from_kafka({name: value}), KAFKA_NAMES[name])
            for name, value in configs.items()}


def alter_broker(store: LogStore, node_id: int, resource_name: str, settings: Mapping[str, Any],
                 changes: Sequence[tuple[str, int, str | None]], incremental: bool,
                 validate_only: bool) -> tuple[int, str | None]:
    """(error code, message) of a change to this broker's configs. Its dynamic configs
    (:data:`DYNAMIC_BROKER_CONFIGS`: ``log.retention.ms``, ``log.segment.bytes``,
    ``message.max.bytes``, ``log.cleanup.policy``, ...) are the store's dynamic defaults
    (:meth:`LogStore.alter_defaults`: durable, and every topic that does not override one takes
    it at once); AlterConfigs replaces the whole set, as Kafka's. The other settings are fixed
    when the server starts (``logstore serve``'s options): a change of one, or of a name the
    broker does not know, is INVALID_CONFIG, as Kafka refuses a config it cannot update."""
    if resource_name not in ("", str(node_id)):
        return ErrorCode.invalid_request, f"this is broker {node_id}, not {resource_name!r}"
    fixed = sorted(name for name, _, _ in changes if name in settings and name not in DYNAMIC_BROKER_CONFIGS)
    if fixed:
        return ErrorCode.invalid_config, (f"Cannot update these configs dynamically: {', '.join(fixed)} "
                                          "(set when logstore serve starts)")
    unknown = sorted(name for name, _, _ in changes if name not in DYNAMIC_BROKER_CONFIGS)
    if unknown:
        return ErrorCode.invalid_config, f"Unknown broker config name: {', '.join(unknown)}"
    as_topic = [(DYNAMIC_BROKER_CONFIGS[name], operation, value) for name, operation, value in changes]
    refused = check_topic_changes(as_topic, incremental, broker=True)
    if refused is not None:
        return refused
    try:
        store.alter_defaults(lambda current: store_keywords(apply_changes(store.static_defaults, current, as_topic,
                                                                          incremental)),
                             validate_only=validate_only)
    except (InvalidConfigError, TypeError, ValueError) as exc:
        return ErrorCode.invalid_config, str(exc)
    return ErrorCode.none, None


# ---------------------------------------------------------------------- group configs
#: A group's configs (Kafka's ``GroupConfig``) that apply to the groups this broker serves ->
#: the broker setting that gives its default, and the broker's lower and upper bounds of it.
GROUP_CONFIGS = {
    "consumer.session.timeout.ms": ("group.consumer.session.timeout.ms", "group.consumer.min.session.timeout.ms",
                                    "group.consumer.max.session.timeout.ms"),
    "consumer.heartbeat.interval.ms": ("group.consumer.heartbeat.interval.ms",
                                       "group.consumer.min.heartbeat.interval.ms",
                                       "group.consumer.max.heartbeat.interval.ms"),
}
#: Kafka's defaults of the broker's group settings named in :data:`GROUP_CONFIGS`.
_GROUP_KAFKA_DEFAULTS = {"group.consumer.session.timeout.ms": 45000, "group.consumer.heartbeat.interval.ms": 5000}
#: Kafka's group configs of the group types this broker does not serve, by their prefix.
_UNSERVED_GROUP_TYPES = {"share.": "share", "streams.": "streams"}
_INT_MAX = 2 ** 31 - 1
#: What Java's Integer.parseInt reads (no underscores, no other digits than ASCII's)
_JAVA_INT = re.compile(r"([+-]?)0*([0-9]{1,10})")  # (longer: no INT; Python's int() refuses 4300+ digits)


@dataclass(frozen=True)
class GroupConfigBounds:
    """The broker's bounds of a consumer group's configs, by Kafka's settings of the same names:
    ``group.consumer.min.session.timeout.ms`` (45000), ``group.consumer.max.session.timeout.ms``
    (60000), ``group.consumer.min.heartbeat.interval.ms`` (5000) and
    ``group.consumer.max.heartbeat.interval.ms`` (15000). Immutable; fixed when the server starts.
    """

    min_session_timeout_ms: int = 45000
    max_session_timeout_ms: int = 60000
    min_heartbeat_interval_ms: int = 5000
    max_heartbeat_interval_ms: int = 15000

    def __post_init__(self) -> None:
        if not 1 <= self.min_session_timeout_ms <= self.max_session_timeout_ms:
            raise ValueError("group.consumer.min.session.timeout.ms must be at least 1 and at most "
                             "group.consumer.max.session.timeout.ms")
        if not 1 <= self.min_heartbeat_interval_ms <= self.max_heartbeat_interval_ms:
            raise ValueError("group.consumer.min.heartbeat.interval.ms must be at least 1 and at most "
                             "group.consumer.max.heartbeat.interval.ms")

    def settings(self, session_timeout_ms: int, heartbeat_interval_ms: int) -> dict[str, int]:
        """The bounds by Kafka's names, each widened to take in the broker's own default
        (``session_timeout_ms``, ``heartbeat_interval_ms``): Kafka refuses to start with a
        default outside its bounds; logstore serves a lower default (as tests do) and keeps a
        group that leaves the config unset valid. Also the defaults, by their names."""
        return {"group.consumer.session.timeout.ms": session_timeout_ms,
                "group.consumer.heartbeat.interval.ms": heartbeat_interval_ms,
                "group.consumer.min.session.timeout.ms": min(self.min_session_timeout_ms, session_timeout_ms),
                "group.consumer.max.session.timeout.ms": max(self.max_session_timeout_ms, session_timeout_ms),
                "group.consumer.min.heartbeat.interval.ms": min(self.min_heartbeat_interval_ms,
                                                                heartbeat_interval_ms),
                "group.consumer.max.heartbeat.interval.ms": max(self.max_heartbeat_interval_ms,
                                                                heartbeat_interval_ms)}


def describe_group(group: str, overrides: Mapping[str, str], broker: Mapping[str, int], keys: Sequence[str] | None,
                   include_synonyms: bool) -> tuple[int, str | None, list[dict[str, Any]]]:
    """(error code, error message, config entries) of a group (it need not exist, as in
    Kafka): each of :data:`GROUP_CONFIGS` with the group's own value (GROUP_CONFIG) or the
    broker's (``broker``: :meth:`GroupConfigBounds.settings`), whose synonyms are the broker's
    setting (STATIC_BROKER_CONFIG when it is not Kafka's default) and Kafka's default."""
    if not group:
        return ErrorCode.invalid_request, "Group name must not be empty", []
    entries = []
    for name, (broker_name, _, _) in GROUP_CONFIGS.items():
        if keys is not None and name not in keys:
            continue
        levels = []
        if name in overrides:
            levels.append((name, overrides[name], GROUP_CONFIG))
        if broker[broker_name] != _GROUP_KAFKA_DEFAULTS[broker_name]:
            levels.append((broker_name, str(broker[broker_name]), STATIC_BROKER_CONFIG))
        levels.append((broker_name, str(_GROUP_KAFKA_DEFAULTS[broker_name]), DEFAULT_CONFIG))
        entry = _entry(name, levels[0][1], levels[0][2], levels, include_synonyms)
        entry["config_type"] = _INT
        entries.append(entry)
    return ErrorCode.none, None, entries


def alter_group(group: str, current: Mapping[str, str], changes: Sequence[tuple[str, int, str | None]],
                incremental: bool, broker: Mapping[str, int]) -> tuple[int, str | None, dict[str, str]]:
    """(error code, message, the group's new overrides) of ``changes`` to a group whose own
    configs are ``current``, checked as Kafka's ``GroupConfig`` checks them against the broker's
    settings (``broker``: :meth:`GroupConfigBounds.settings`); AlterConfigs replaces the whole
    set, IncrementalAlterConfigs SETs and DELETEs. The caller keeps the result when the code is
    NONE."""
    if not group:
        return ErrorCode.invalid_request, "Default group resources are not allowed.", {}
    refused = _check_shape(changes, incremental, "group")
    if refused is not None:
        return (*refused, {})
    for name, operation, _ in changes:
        if name not in GROUP_CONFIGS:
            kind = next((k for prefix, k in _UNSERVED_GROUP_TYPES.items() if name.startswith(prefix)), None)
            if kind is not None:
                return ErrorCode.invalid_config, (f"{name} is a {kind} group config, and this broker serves no "
                                                  f"{kind} groups (only classic and consumer groups)"), {}
            return ErrorCode.invalid_config, f"Unknown group config name: {name}", {}
        if operation in (APPEND, SUBTRACT):
            return ErrorCode.invalid_config, (f"Config value {_OPERATIONS[operation]} is not allowed for config key: "
                                              f"{name}"), {}
    new: dict[str, str] = {} if not incremental else dict(current)
    for name, operation, value in changes:
        if operation == DELETE:
            new.pop(name, None)
        else:
            new[name] = (value or "").strip()
    values = {}
    for name, (broker_name, _, _) in GROUP_CONFIGS.items():
        text = new.get(name)
        if text is None:
            values[name] = broker[broker_name]
            continue
        digits = _JAVA_INT.fullmatch(text)
        number = int(digits[1] + digits[2]) if digits else None
        invalid = f"Invalid value {text} for configuration {name}"
        if number is None or not -_INT_MAX - 1 <= number <= _INT_MAX:
            return ErrorCode.invalid_config, f"{invalid}: Not a number of type INT", {}
        if number < 1:
            return ErrorCode.invalid_config, f"{invalid}: Value must be at least 1", {}
        new[name] = str(number)
        values[name] = number
    for name, (_, low, high) in GROUP_CONFIGS.items():
        if values[name] < broker[low]:
            return ErrorCode.invalid_config, f"{name} must be greater than or equal to {low} ({broker[low]})", {}
        if values[name] > broker[high]:
            return ErrorCode.invalid_config, f"{name} must be less than or equal to {high} ({broker[high]})", {}
    if values["consumer.session.timeout.ms"] <= values["consumer.heartbeat.interval.ms"]:
        return ErrorCode.invalid_config, ("consumer.session.timeout.ms must be greater than "
                                          "consumer.heartbeat.interval.ms"), {}
    return ErrorCode.none, None, new
