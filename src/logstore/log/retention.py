"""Retention: which whole segments time, size and the log start offset let go.

Kafka's rules, for a log whose cleanup policy includes "delete":

* time (``retention.ms``): a segment goes when its newest record is older than retention_ms,
  oldest first, stopping at the first segment that is not expired (or empty). The active
  segment goes too once it has expired; the log rolls first so that appends have somewhere to go;
* size (``retention.bytes``): the oldest sealed segments go while the log, without them, stays at
  or above retention_bytes;
* whatever the policy: a segment wholly below the log start offset (moved by
  ``delete_records_before``, Kafka's DeleteRecords) goes.

With remote storage (tiered storage, KIP-405) these rules decide only what leaves the *local*
disk, by the local retention settings (``local.retention.ms``/``.bytes``), and only among the
sealed segments already copied (every offset at or below the remote tier's copied end): a
segment that is not copied stays whatever retention says, so nothing is lost while the object
store is unreachable. The log start does not move: the records stay readable from the remote
tier, whose own retention (by the total settings) is the remote log manager's.

The functions here decide; :class:`~logstore.log.log.Log` moves the log start and deletes through
its segment set. Pure functions: no I/O, no locks.
"""

from __future__ import annotations

from typing import Any

from .segments import LogSegments
from ..segment import LogSegment

__all__ = ["segments_to_delete", "log_start_after"]


def segments_to_delete(segments: LogSegments, log_start_offset: int, config: Any, now_ms: int,
                       copied_through: int = -1) -> list[LogSegment]:
    """The segments retention removes now, oldest first (the active one among them when it
    expired: the caller rolls before deleting it). ``copied_through``: with remote storage, the
    last offset the remote tier holds (see the module docstring)."""
    doomed: list[LogSegment] = segments.below(log_start_offset)
    if not config.deletes:
        return doomed
    if config.remote_storage_enable:  # only copied sealed segments, by the local settings
        copied = [s for s in segments.sealed() if s.next_offset - 1 <= copied_through]
        return doomed + _past_retention(segments, copied, doomed, config.local_retention_ms_effective,
                                        config.local_retention_bytes_effective, now_ms)
    return doomed + _past_retention(segments, list(segments.values()), doomed, config.retention_ms,
                                    config.retention_bytes, now_ms)


def _past_retention(segments: LogSegments, candidates: list[LogSegment], doomed: list[LogSegment],
                    retention_ms: int, retention_bytes: int, now_ms: int) -> list[LogSegment]:
    """Of ``candidates`` (oldest first), those time and size retention let go besides
    ``doomed``: by time, the oldest whose newest record is older than ``retention_ms`` (up to
    the first that is not, or is empty); by size, the oldest sealed ones while the log, without
    them, stays at or above ``retention_bytes`` (-1: no such limit)."""
    out: list[LogSegment] = []
    if retention_ms >= 0:
        for segment in candidates:
            if segment.size == 0 or segment.max_timestamp >= now_ms - retention_ms:
                break
            if segment not in doomed:
                out.append(segment)
    if retention_bytes >= 0:
        excess = segments.size_in_bytes - sum(s.size for s in doomed + out) - retention_bytes
        for segment in candidates:
            if segment is segments.active or segment in doomed or segment in out:
                continue
            if excess - segment.size < 0:
                break
            excess -= segment.size
            out.append(segment)
    return out


def log_start_after(segments: LogSegments, doomed: list[LogSegment], log_start_offset: int) -> int:
    """The log start offset once ``doomed`` is gone: the first surviving segment's base, or the
    current start if that is later."""
    gone = {segment.base_offset for segment in doomed}
    first = next((base for base in segments.bases() if base not in gone), log_start_offset)
    return max(first, log_start_offset)
