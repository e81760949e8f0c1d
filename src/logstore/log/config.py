"""Per-log configuration, with Kafka's names and defaults.

:class:`LogConfig` holds one field per Kafka topic-level setting that the log layer honours,
spelt in snake_case (``segment.bytes`` is ``segment_bytes``). :meth:`LogConfig.from_kafka` takes
Kafka's dotted names, with values as numbers or as the strings Kafka's properties files hold.

A LogConfig is immutable (a frozen dataclass) and therefore safe to share between threads.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Mapping

from ..records import compression
from ..records.compression import CODEC_NAMES
from ..errors import InvalidConfigError

__all__ = ["LogConfig", "CLEANUP_POLICIES", "TIMESTAMP_TYPES", "KAFKA_NAMES"]

#: Kafka's Long.MAX_VALUE, which Kafka uses for "never" in flush.* and max.compaction.lag.ms.
LONG_MAX = 2**63 - 1

CLEANUP_POLICIES = frozenset({"delete", "compact", "compact,delete"})
TIMESTAMP_TYPES = {"CreateTime": 0, "LogAppendTime": 1}
_COMPRESSION_TYPES = frozenset(CODEC_NAMES) | {"producer"}


def _int(minimum: int | None = None, maximum: int = LONG_MAX, allow_none: bool = False) -> dict:
    return {"kind": "int", "min": minimum, "max": maximum, "none": allow_none}


@dataclass(frozen=True)
class LogConfig:
    """Settings of one log (one partition). Defaults are Kafka's topic defaults.

    Attributes:
        segment_bytes: roll the active segment when it would exceed this size.
        segment_ms: roll the active segment when its first record is older than this.
        segment_index_bytes: size of each preallocated index file (offset index: 8-byte
            entries, time index: 12-byte entries); the segment rolls when either is full.
        index_interval_bytes: bytes of batches between two sparse index entries.
        retention_ms: delete sealed segments whose newest record is older than this; -1 keeps
            them forever.
        retention_bytes: delete the oldest sealed segments while the log is larger than this;
            -1 means no size limit.
        flush_messages: fsync after this many records; None never forces a flush (Kafka's
            default, leaving durability to the OS and to replication).
        flush_ms: fsync when the oldest unflushed record is older than this; None never.
        max_message_bytes: the largest batch accepted, after compression.
        compression_type: "producer" (keep the codec the caller asked for), or a codec name
            that every batch is written with: "none", "gzip", "snappy", "lz4", "zstd".
        compression_gzip_level, compression_lz4_level, compression_zstd_level: the level for
            each codec (Kafka's compression.<codec>.level, KIP-390); None for the codec's
            default, as Kafka's: gzip 6, lz4 9 (fast), zstd 3. zstd level 1 compresses this
            project's benchmark data about 1.6x faster for a 3% larger output.
        message_timestamp_type: "CreateTime" or "LogAppendTime".
        file_delete_delay_ms: how long a deleted segment lingers as ``.deleted`` before unlink.
        preallocate: map each new segment at its full segment_bytes up front.
        cleanup_policy: "delete", "compact" or "compact,delete".
        min_cleanable_dirty_ratio, delete_retention_ms, min_compaction_lag_ms,
        max_compaction_lag_ms: the cleaner's settings (see logstore.cleaner).
        cleaner_dedupe_buffer_size: memory for the key -> offset map of one compaction pass
            (20 bytes per slot); a dirty section with more keys is cleaned over several passes.
        remote_storage_enable: tiered storage (KIP-405): sealed segments are copied to the
            store's object store and read back from there once they leave the local disk. Once
            on, it stays on (Kafka refuses to turn it off); not with compaction.
        local_retention_ms, local_retention_bytes: with remote storage, how long (how much of)
            the sealed segments stay on local disk once copied; -2 (Kafka's default) means the
            same as retention_ms / retention_bytes. Never more than those. A segment leaves the
            local disk only once it is copied, whatever these say.
    """

    segment_bytes: int = 1073741824
    segment_ms: int = 604800000
    segment_jitter_ms: int = 0
    segment_index_bytes: int = 10485760
    index_interval_bytes: int = 4096
    retention_ms: int = 604800000
    retention_bytes: int = -1
    flush_messages: int | None = None
    flush_ms: int | None = None
    max_message_bytes: int = 1048588
    compression_type: str = "producer"
    compression_gzip_level: int | None = None
    compression_lz4_level: int | None = None
    compression_zstd_level: int | None = None
    message_timestamp_type: str = "CreateTime"
    file_delete_delay_ms: int = 60000
    preallocate: bool = False
    cleanup_policy: str = "delete"
    min_cleanable_dirty_ratio: float = 0.5
    delete_retention_ms: int = 86400000
    min_compaction_lag_ms: int = 0
    max_compaction_lag_ms: int = LONG_MAX
    cleaner_dedupe_buffer_size: int = 32 << 20
    remote_storage_enable: bool = False
    local_retention_ms: int = -2
    local_retention_bytes: int = -2

    def __post_init__(self) -> None:
        for name, spec in _FIELD_SPECS.items():
            value = getattr(self, name)
            _validate(name, value, spec)
        if self.compression_type not in _COMPRESSION_TYPES:
            raise InvalidConfigError(
                f"compression_type must be one of {sorted(_COMPRESSION_TYPES)}, "
                f"got {self.compression_type!r}"
            )
        if self.message_timestamp_type not in TIMESTAMP_TYPES:
            raise InvalidConfigError(
                "message_timestamp_type must be 'CreateTime' or 'LogAppendTime', "
                f"got {self.message_timestamp_type!r}"
            )
        policy = _normalise_policy(self.cleanup_policy)
        object.__setattr__(self, "cleanup_policy", policy)
        if not 0.0 <= float(self.min_cleanable_dirty_ratio) <= 1.0:
            raise InvalidConfigError(
                f"min_cleanable_dirty_ratio must be in [0, 1], got {self.min_cleanable_dirty_ratio!r}"
            )
        # Kafka's rules (LogConfig.validateRemoteStorageRetentionSize/Time and ...OnlyIfSupported)
        if self.retention_ms >= 0 and (self.local_retention_ms > self.retention_ms or self.local_retention_ms == -1):
            raise InvalidConfigError(f"local.retention.ms (local_retention_ms) {self.local_retention_ms} must not "
                                     f"exceed retention.ms {self.retention_ms}")
        if self.retention_bytes >= 0 and (self.local_retention_bytes > self.retention_bytes or
                                          self.local_retention_bytes == -1):
            raise InvalidConfigError(f"local.retention.bytes (local_retention_bytes) {self.local_retention_bytes} "
                                     f"must not exceed retention.bytes {self.retention_bytes}")
        if self.remote_storage_enable and self.compacted:
            raise InvalidConfigError("remote.storage.enable (remote_storage_enable) cannot be true with "
                                     f"cleanup.policy {self.cleanup_policy!r}: tiered storage is for topics that "
                                     "delete, not compact")

    # ------------------------------------------------------------------ conversions
    @classmethod
    def from_kafka(cls, props: Mapping[str, Any]) -> "LogConfig":
        """Build a LogConfig from Kafka's dotted topic config names.

        >>> LogConfig.from_kafka({"segment.bytes": "1048576", "cleanup.policy": "compact"}).segment_bytes
        1048576

        Values may be numbers or strings as in Kafka's properties files. Unknown names raise
        :class:`InvalidConfigError` naming them (a typo must not be silently ignored).
        """
        if not isinstance(props, Mapping):
            raise TypeError(f"from_kafka expects a mapping of Kafka config names, got {type(props).__name__}")
        kwargs: dict[str, Any] = {}
        for key, value in props.items():
            if not isinstance(key, str):
                raise TypeError(f"config names must be str, got {key!r}")
            name = KAFKA_NAMES.get(key)
            if name is None:
                raise InvalidConfigError(
                    f"unknown Kafka config {key!r}; known: {', '.join(sorted(KAFKA_NAMES))}"
                )
            kwargs[name] = _coerce(name, value)
        return cls(**kwargs)

    def to_kafka(self) -> dict[str, str]:
        """Return this config as Kafka's dotted names with string values."""
        out = {}
        for key, name in KAFKA_NAMES.items():
            value = getattr(self, name)
            if value is None:
                value = LONG_MAX
            out[key] = str(value).lower() if isinstance(value, bool) else str(value)
        return out

    def replace(self, **changes: Any) -> "LogConfig":
        """Return a copy with some fields changed (validated like the constructor)."""
        unknown = set(changes) - set(_FIELD_NAMES)
        if unknown:
            raise InvalidConfigError(f"unknown LogConfig field(s): {', '.join(sorted(unknown))}")
        return dataclasses.replace(self, **changes)

    @classmethod
    def build(cls, config: "LogConfig | Mapping[str, Any] | None" = None, **overrides: Any) -> "LogConfig":
        """Merge a LogConfig (or a mapping of snake_case or dotted names) with keyword overrides."""
        if config is None:
            base = cls()
        elif isinstance(config, LogConfig):
            base = config
        elif isinstance(config, Mapping):
            dotted = {k: v for k, v in config.items() if isinstance(k, str) and "." in k}
            plain = {k: v for k, v in config.items() if k not in dotted}
            base = cls.from_kafka(dotted).replace(**plain) if dotted else cls().replace(**plain)
        else:
            raise TypeError(f"config must be a LogConfig or a mapping, got {type(config).__name__}")
        return base.replace(**overrides) if overrides else base

    @property
    def timestamp_type_code(self) -> int:
        """0 for CreateTime, 1 for LogAppendTime (the batch attribute bit)."""
        return TIMESTAMP_TYPES[self.message_timestamp_type]

    def level_for(self, codec: int) -> int | None:
        """The configured level for ``codec`` (a compression id), None for its default."""
        return {
            compression.GZIP: self.compression_gzip_level,
            compression.LZ4: self.compression_lz4_level,
            compression.ZSTD: self.compression_zstd_level,
        }.get(codec)

    @property
    def compacted(self) -> bool:
        """True when the cleanup policy includes compaction."""
        return "compact" in self.cleanup_policy.split(",")

    @property
    def local_retention_ms_effective(self) -> int:
        """How long copied segments stay on local disk (-2 resolved to retention_ms; -1: kept)."""
        return self.retention_ms if self.local_retention_ms == -2 else self.local_retention_ms

    @property
    def local_retention_bytes_effective(self) -> int:
        """How many bytes of the log stay on local disk (-2 resolved to retention_bytes; -1: no limit)."""
        return self.retention_bytes if self.local_retention_bytes == -2 else self.local_retention_bytes

    @property
    def deletes(self) -> bool:
        """True when the cleanup policy includes time/size retention."""
        return "delete" in self.cleanup_policy.split(",")


_FIELD_SPECS: dict[str, dict] = {
    "segment_bytes": _int(14, 2**31 - 1),
    "segment_ms": _int(1),
    "segment_jitter_ms": _int(0),
    "segment_index_bytes": _int(8, 2**31 - 1),
    "index_interval_bytes": _int(0, 2**31 - 1),
    "retention_ms": _int(-1),
    "retention_bytes": _int(-1),
    "flush_messages": _int(1, allow_none=True),
    "flush_ms": _int(0, allow_none=True),
    "max_message_bytes": _int(0, 2**31 - 1),
    "compression_gzip_level": _int(-1, 9, allow_none=True),
    "compression_lz4_level": _int(1, 17, allow_none=True),
    "compression_zstd_level": _int(-(2**17), 22, allow_none=True),
    "file_delete_delay_ms": _int(0),
    "delete_retention_ms": _int(0),
    "min_compaction_lag_ms": _int(0),
    "max_compaction_lag_ms": _int(1),
    "cleaner_dedupe_buffer_size": _int(40, 2**40),
    "preallocate": {"kind": "bool"},
    "compression_type": {"kind": "str"},
    "message_timestamp_type": {"kind": "str"},
    "cleanup_policy": {"kind": "str"},
    "min_cleanable_dirty_ratio": {"kind": "float"},
    "remote_storage_enable": {"kind": "bool"},
    "local_retention_ms": _int(-2),
    "local_retention_bytes": _int(-2),
}
_FIELD_NAMES = tuple(_FIELD_SPECS)

#: Kafka's dotted topic-config names -> LogConfig field names
KAFKA_NAMES = {
    "segment.bytes": "segment_bytes",
    "segment.ms": "segment_ms",
    "segment.jitter.ms": "segment_jitter_ms",
    "segment.index.bytes": "segment_index_bytes",
    "index.interval.bytes": "index_interval_bytes",
    "retention.ms": "retention_ms",
    "retention.bytes": "retention_bytes",
    "flush.messages": "flush_messages",
    "flush.ms": "flush_ms",
    "max.message.bytes": "max_message_bytes",
    "compression.type": "compression_type",
    "compression.gzip.level": "compression_gzip_level",
    "compression.lz4.level": "compression_lz4_level",
    "compression.zstd.level": "compression_zstd_level",
    "message.timestamp.type": "message_timestamp_type",
    "file.delete.delay.ms": "file_delete_delay_ms",
    "preallocate": "preallocate",
    "cleanup.policy": "cleanup_policy",
    "min.cleanable.dirty.ratio": "min_cleanable_dirty_ratio",
    "delete.retention.ms": "delete_retention_ms",
    "min.compaction.lag.ms": "min_compaction_lag_ms",
    "max.compaction.lag.ms": "max_compaction_lag_ms",
    "log.cleaner.dedupe.buffer.size": "cleaner_dedupe_buffer_size",
    "remote.storage.enable": "remote_storage_enable",
    "local.retention.ms": "local_retention_ms",
    "local.retention.bytes": "local_retention_bytes",
}


def _normalise_policy(policy: Any) -> str:
    if isinstance(policy, (list, tuple, set, frozenset)):
        parts = sorted(str(p).strip() for p in policy)
    else:
        parts = sorted(p.strip() for p in str(policy).split(","))
    joined = ",".join(parts)
    if joined not in CLEANUP_POLICIES:
        raise InvalidConfigError(
            f"cleanup_policy must be 'delete', 'compact' or 'compact,delete', got {policy!r}"
        )
    return joined


def _validate(name: str, value: Any, spec: dict) -> None:
    kind = spec["kind"]
    if kind == "int":
        if value is None and spec["none"]:
            return
        if isinstance(value, bool) or not isinstance(value, int):
            raise InvalidConfigError(f"{name} must be an int, got {value!r}")
        lo, hi = spec["min"], spec["max"]
        if (lo is not None and value < lo) or value > hi:
            raise InvalidConfigError(f"{name} must be in [{lo}, {hi}], got {value}")
    elif kind == "bool":
        if not isinstance(value, bool):
            raise InvalidConfigError(f"{name} must be a bool, got {value!r}")
    elif kind == "float":
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise InvalidConfigError(f"{name} must be a number, got {value!r}")
    elif kind == "str":
        if name == "cleanup_policy" and isinstance(value, (list, tuple, set, frozenset)):
            return
        if not isinstance(value, str):
            raise InvalidConfigError(f"{name} must be a str, got {value!r}")


def _coerce(name: str, value: Any) -> Any:
    """Turn a Kafka properties value (often a string) into the field's Python type."""
    kind = _FIELD_SPECS[name]["kind"]
    try:
        if kind == "int" and isinstance(value, str):
            number = int(value.strip())
            if _FIELD_SPECS[name]["none"] and number >= LONG_MAX:
                return None
            return number
        if kind == "int" and isinstance(value, int) and _FIELD_SPECS[name]["none"] and value >= LONG_MAX:
            return None
        if kind == "bool" and isinstance(value, str):
            lowered = value.strip().lower()
            if lowered not in ("true", "false"):
                raise ValueError(value)
            return lowered == "true"
        if kind == "float" and isinstance(value, str):
            return float(value)
    except ValueError:
        raise InvalidConfigError(f"{name}: cannot parse {value!r} as {kind}") from None
    return value
