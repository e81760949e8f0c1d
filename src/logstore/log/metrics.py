"""A Log's metrics: the meter of what was appended since the log opened, and the snapshot ``Log.metrics`` returns.

The names and their meanings are listed in :mod:`logstore.metrics`. The appended bytes are
counted from the segments' sizes (what the active segment grew by, plus what the segments it
replaced had grown by), so that appends, in any process, pay nothing for them.

Thread-safety: :class:`AppendMeter` is used with the log's lock held; :func:`log_metrics` takes
it.
"""

from __future__ import annotations

from typing import Any

from ..segment import LogSegment

__all__ = ["AppendMeter", "log_metrics"]


class AppendMeter:
    """Records and bytes appended to one log since this process opened it (by any process)."""

    __slots__ = ("end_at_open", "_sealed_bytes", "_counted_from")

    def __init__(self) -> None:
        #: the log end offset when the log was opened
        self.end_at_open = 0
        self._sealed_bytes = 0  # appended into segments that are no longer active
        self._counted_from = 0  # the size the active segment had when this process began counting it

    def switch(self, old: LogSegment | None, new: LogSegment) -> None:
        """``new`` becomes the active segment in place of ``old``."""
        if old is not None and old is not new:
            self._sealed_bytes += max(0, old.size - self._counted_from)
        self._counted_from = new.size

    def bytes_in(self, active: LogSegment) -> int:
        """Bytes of batches appended so far, ``active`` being the active segment."""
        return self._sealed_bytes + max(0, active.size - self._counted_from)


def log_metrics(log: Any) -> dict[str, Any]:
    """:meth:`Log.metrics`: this partition's metrics by name."""
    report = log.recovery_report
    with log._lock:
        log._check_open()
        log._follow()
        active = log._segments.active
        assert active is not None
        end = log._appender.next_offset
        out: dict[str, Any] = {
            "kafka.server:type=BrokerTopicMetrics,name=MessagesInPerSec": max(0, end - log._meter.end_at_open),
            "kafka.server:type=BrokerTopicMetrics,name=BytesInPerSec": log._meter.bytes_in(active),
            "kafka.server:type=BrokerTopicMetrics,name=BytesOutPerSec": log._decoder.bytes_decoded,
            "logstore:type=Log,name=MessagesOut": log._decoder.records_decoded,
            "kafka.log:type=Log,name=LogStartOffset": log._log_start_offset,
            "kafka.log:type=Log,name=LogEndOffset": end,
            "kafka.log:type=Log,name=Size": log._segments.size_in_bytes,
            "kafka.log:type=Log,name=NumLogSegments": len(log._segments),
            "kafka.log:type=LogFlushStats,name=LogFlushRateAndTimeMs": log._flusher.times.snapshot(),
            "logstore:type=Log,name=RecoveryTimeMs": log.recovery_seconds * 1000.0,
            "logstore:type=Log,name=RecoveryBytesTruncated": report.bytes_truncated if report else 0,
        }
    if log.config.compacted:
        out["logstore:type=LogCleaner,name=CleanerRuns"] = log._compaction.runs
        out["logstore:type=LogCleaner,name=DirtyRatio"] = log.dirty_ratio()
    return out
