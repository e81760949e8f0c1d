"""Moving a Log's ends: truncation at the end, and the log start's advance that deletes whole segments.

At the end, :func:`truncate_to` removes the records from an offset on (a follower whose log
diverged from its leader's) and :func:`truncate_fully_and_start_at` empties the log and restarts
it at any offset (a follower that fell behind the leader's log start). At the start,
:func:`delete_records_before` (Kafka's DeleteRecords) and :func:`enforce_retention` (what
:mod:`~logstore.log.retention` says ``retention.ms``, ``retention.bytes`` and the log start let go)
move the log start and remove the segments below it through :func:`delete_segments`.

Each is a function of the :class:`~logstore.log.log.Log` it implements a method of: it sets the
log's offsets (log start, recovery point, flushed offset, high watermark) and its active segment,
trims the leader epoch history and the producer state (:mod:`~logstore.log.producers`: the
snapshots above a new end go first) to match, and writes the checkpoints before returning, so
the change is durable on return.

Invariant: the log start moves durably before any segment below it goes, so a crash that keeps
some of the file renames and not others leaves a hole that the reopened log starts past.

Thread-safety: the public functions take the log's lock and writers' lock, as the Log's methods
say; :func:`delete_segments` runs with them held (the caller's).
"""

from __future__ import annotations

from typing import Any

from .. import _fileio
from ..records.batching import check_offset
from ..errors import OffsetOutOfRangeError
from .appends import roll_segment
from .retention import log_start_after, segments_to_delete
from ..segment import LogSegment

__all__ = ["truncate_to", "truncate_fully_and_start_at", "delete_records_before", "enforce_retention",
           "delete_segments"]


def truncate_to(log: Any, offset: int) -> None:
    """Log.truncate_to: remove every record at or after ``offset``."""
    offset = _non_negative(offset, "truncate to")
    with log._lock, log._w:
        log._check_open()
        if offset >= log._appender.next_offset:
            return
        with log._io_guard():
            log._begin_layout_change()
            log._producers.before_truncation(offset)  # (durably, before the segments change)
            if offset <= log._log_start_offset:
                log._set_active(log._segments.replace_all(offset))
                log._log_start_offset = offset
                log._producers.restarted(offset)
            else:
                log._set_active(log._segments.truncate_to(offset, log._builder, log._decoder))
            _fileio.ops.fsync_dir(log.path)
            end = log._appender.next_offset
            log._producers.truncated(end)
            log._recovery_point = min(log._recovery_point, end)
            log._flushed_offset = min(log._flushed_offset, log._recovery_point)
            if log._high_watermark is not None:
                log._high_watermark = min(log._high_watermark, end)
            if log.leader_epochs is not None:
                log.leader_epochs.truncate_from_end(end)
                if offset <= log._log_start_offset:
                    log.leader_epochs.truncate_from_start(offset)
            log._write_checkpoints()


def truncate_fully_and_start_at(log: Any, offset: int) -> None:
    """Log.truncate_fully_and_start_at: drop every record, restart the log empty at ``offset``."""
    offset = _non_negative(offset, "start a log at")
    with log._lock, log._w:
        log._check_open()
        with log._io_guard():
            log._producers.before_truncation(-1)  # every snapshot goes, durably, first
            log._set_active(log._segments.replace_all(offset))
            log._producers.restarted(offset)
            log._log_start_offset = offset
            log._recovery_point = log._flushed_offset = offset
            if log._high_watermark is not None:
                log._high_watermark = offset
            if log.leader_epochs is not None:
                log.leader_epochs.truncate_from_end(0)
            log._write_checkpoints()


def delete_records_before(log: Any, offset: int) -> int:
    """Log.delete_records_before: move the log start up to ``offset`` (at most the high
    watermark) and delete the segments wholly below it; return the log start."""
    offset = check_offset(offset)
    with log._lock, log._w:
        log._check_open()
        hw = log._high_watermark if log._high_watermark is not None else log._appender.next_offset
        if offset > hw or offset < 0:
            raise OffsetOutOfRangeError(offset, log._log_start_offset, hw, "delete_records_before")
        if offset <= log._log_start_offset:
            return log._log_start_offset
        log._log_start_offset = offset
        log._write_checkpoints()  # durable before the segments below it go
        delete_segments(log, log._segments.below(offset))
        return log._log_start_offset


def enforce_retention(log: Any, now_ms: int) -> int:
    """Log.enforce_retention: delete the segments retention lets go at ``now_ms``; return how
    many went."""
    with log._lock, log._w:
        log._check_open()
        doomed = segments_to_delete(log._segments, log._log_start_offset, log.config, now_ms)
        if not doomed:
            return 0
        delete_segments(log, doomed)
        log._segments.unlink_due()
        return len(doomed)


def _non_negative(offset: Any, what: str) -> int:
    offset = check_offset(offset)
    if offset < 0:
        raise ValueError(f"cannot {what} negative offset {offset}")
    return offset


def delete_segments(log: Any, doomed: list[LogSegment]) -> None:
    """Remove segments from the log (rolling first when the active one is among them): move the
    log start past them durably, then rename their files .deleted (unlinked after
    file_delete_delay_ms)."""
    with log._io_guard():
        log._begin_layout_change()
        doomed = sorted(doomed, key=lambda s: s.base_offset)
        if any(segment is log._segments.active for segment in doomed):
            roll_segment(log)
        first = log_start_after(log._segments, doomed, log._log_start_offset)
        if first > log._log_start_offset:
            # The renames may reach the disk in any order before the directory fsync; the
            # checkpoint written first is what the reopened log starts at (the invariant above).
            log._log_start_offset = first
            log._write_checkpoints()
        log._segments.delete(doomed)
        log._producers.log_start_moved()
