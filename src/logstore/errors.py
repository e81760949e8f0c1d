"""The exception hierarchy of logstore.

Every error that logstore raises on purpose derives from :class:`LogstoreError`, except bad
arguments, which stay :class:`TypeError` / :class:`ValueError` as in any Python library. Messages
name the file, the offset or position, and what was expected against what was found.

These classes hold no state beyond their attributes and are safe to share between threads.
"""

from __future__ import annotations

__all__ = [
    "LogstoreError",
    "CorruptRecordError",
    "CorruptIndexError",
    "OffsetOutOfRangeError",
    "RecordTooLargeError",
    "LogClosedError",
    "InvalidRecordError",
    "LogLockedError",
    "LogOfflineError",
    "InvalidTopicError",
    "UnsupportedCodecError",
    "InvalidConfigError",
    "UnknownTopicOrPartitionError",
    "TopicExistsError",
]


class LogstoreError(Exception):
    """Root of every error logstore raises on purpose."""


class CorruptRecordError(LogstoreError):
    """A batch failed validation: bad CRC, impossible length, or malformed records.

    Attributes:
        path: the file holding the batch, or None when unknown (for example inside a codec).
        position: byte position of the batch in ``path``, or None.
        reason: what was wrong, in words.
        stored_crc / computed_crc: set when the failure is a CRC mismatch.
    """

    def __init__(
        self,
        path: str | None,
        position: int | None,
        reason: str,
        stored_crc: int | None = None,
        computed_crc: int | None = None,
    ) -> None:
        self.path = path
        self.position = position
        self.reason = reason
        self.stored_crc = stored_crc
        self.computed_crc = computed_crc
        where = path if path is not None else "<buffer>"
        if position is not None:
            where = f"{where} at position {position}"
        message = f"Record is corrupt in {where}: {reason}"
        if stored_crc is not None and computed_crc is not None:
            message += f" (stored crc = {stored_crc:#010x}, computed crc = {computed_crc:#010x})"
        super().__init__(message)

    def __reduce__(self):  # keep pickling (multiprocessing) faithful
        return (
            type(self),
            (self.path, self.position, self.reason, self.stored_crc, self.computed_crc),
        )


class CorruptIndexError(LogstoreError):
    """An index file failed its sanity check. Recovery catches this and rebuilds the index."""

    def __init__(self, path: str, reason: str) -> None:
        self.path = path
        self.reason = reason
        super().__init__(f"Corrupt index {path}: {reason}")

    def __reduce__(self):
        return (type(self), (self.path, self.reason))


class OffsetOutOfRangeError(LogstoreError):
    """An offset outside ``[log_start_offset, log_end_offset]`` was asked for.

    Attributes:
        offset: the offset asked for.
        log_start_offset / log_end_offset: the valid range at the time of the call.
    """

    def __init__(self, offset: int, log_start_offset: int, log_end_offset: int, what: str = "") -> None:
        self.offset = offset
        self.log_start_offset = log_start_offset
        self.log_end_offset = log_end_offset
        self.what = what
        prefix = f"{what}: " if what else ""
        super().__init__(
            f"{prefix}offset {offset} is out of range; valid offsets are "
            f"[{log_start_offset}, {log_end_offset}]"
        )

    def __reduce__(self):
        return (type(self), (self.offset, self.log_start_offset, self.log_end_offset, self.what))


class RecordTooLargeError(LogstoreError):
    """A batch is larger than ``max_message_bytes``; nothing was written."""

    def __init__(self, size: int, limit: int) -> None:
        self.size = size
        self.limit = limit
        super().__init__(
            f"batch of {size} bytes is larger than max_message_bytes = {limit}; nothing was written"
        )

    def __reduce__(self):
        return (type(self), (self.size, self.limit))


class InvalidRecordError(LogstoreError, ValueError):
    """A record the log's settings forbid, e.g. a record without a key in a compacted log
    (Kafka rejects those too: compaction keeps the latest record per key). Nothing is written."""


class LogClosedError(LogstoreError):
    """The log was used after ``close()``."""


class LogOfflineError(LogstoreError):
    """An I/O error left the log's files in an unknown state; the log refuses further use.

    As Kafka takes a log directory offline after an I/O error, the log must be closed and
    opened again, which recovers it from what is on disk.
    """


class LogLockedError(LogstoreError):
    """Another process holds the log open for writing."""


class InvalidTopicError(LogstoreError, ValueError):
    """A topic or partition directory name breaks Kafka's naming rules."""


class UnsupportedCodecError(LogstoreError):
    """A compression codec is known but its library is not installed (lz4)."""


class InvalidConfigError(LogstoreError, ValueError):
    """A configuration value is out of range or of the wrong kind."""


class UnknownTopicOrPartitionError(LogstoreError, KeyError):
    """The store has no such topic, or the topic has no such partition (Kafka's
    UnknownTopicOrPartitionException)."""

    def __str__(self) -> str:  # KeyError would show the message quoted
        return str(self.args[0]) if self.args else ""


class TopicExistsError(LogstoreError):
    """create_topic() of a topic that already exists (Kafka's TopicExistsException)."""
