"""The slow paths of a Log's appends: rolls for time and room, full and too-large records, batches from a leader.

:class:`~logstore.log.Log` keeps the append fast path (one lock, one clock read, one C call into
the active segment's map) and its public append methods. What they fall back to lives here, as
functions of the log: rolling when a record is past the segment's time limit (Kafka's
segment.ms), making room when the active segment reports FULL (grow its map, or roll),
explaining a record too large for max_message_bytes, appending one encoded batch, and copying a
leader's batches byte for byte with their offsets and epochs (a follower's append, which may
jump over a compacted leader's gaps).

Thread-safety: every function runs with the log's lock and writers' lock held (the caller's);
they read and set the log's offsets and active segment, as its own methods would.
"""

from __future__ import annotations

from typing import Any

from ._native import check, ffi, lib
from .batching import one_record_batch_size
from .epochs import LeaderEpochCache
from .errors import OffsetOutOfRangeError, RecordTooLargeError
from .flusher import NEVER
from .records import parse_header

__all__ = ["DEADLINE_UNSET", "roll_for_time", "append_record_slow", "make_room", "append_encoded_locked",
           "append_replicated_locked"]

#: below every timestamp: the next append computes the real roll deadline
DEADLINE_UNSET = -(2**63)
_append_record = lib.ls_appender_append_record
_NULL = ffi.NULL


def _deadline_after(log: Any, first_timestamp: int) -> int:
    """Kafka's segment.ms rule: roll once a record is newer than the segment's first batch's
    max timestamp by more than segment_ms - segment_jitter_ms."""
    return min(NEVER, first_timestamp + log.config.segment_ms - log.config.segment_jitter_ms)


def roll_for_time(log: Any, timestamp: int) -> None:
    """An append with ``timestamp`` passed the roll deadline, or the deadline is unset."""
    log._check_open()
    segment = log._segments.active
    assert segment is not None
    if log._roll_deadline == DEADLINE_UNSET:
        if segment.size == 0:  # the record about to be appended sets the deadline
            log._roll_deadline = _deadline_after(log, timestamp)
            return
        log._roll_deadline = _deadline_after(log, parse_header(segment.buffer, 0).max_timestamp)
        if timestamp <= log._roll_deadline:
            return
    log._roll()
    log._roll_deadline = _deadline_after(log, timestamp)


def append_record_slow(log: Any, rc: int, ts: int, key: bytes | None, value: bytes | None,
                       hbytes: Any, hcount: int) -> int:
    """Handle FULL (roll or grow, then retry) and TOO_LARGE for the single-record path."""
    log._check_open()
    hlen = 0 if hcount == 0 else len(hbytes)
    needed = (lib.LS_BATCH_HEADER_SIZE + lib.LS_RECORD_MAX_OVERHEAD + (len(key) if key else 0)
              + (len(value) if value else 0) + hlen)
    for _ in range(3):
        if rc == lib.LS_ERR_TOO_LARGE:
            raise RecordTooLargeError(one_record_batch_size(key, value, hlen, hcount),
                                      log.config.max_message_bytes)
        if rc != lib.LS_ERR_FULL:
            check(rc, log._active.path if log._active else None)
        make_room(log, needed)
        rc = _append_record(
            log._appender, ts, log._record_attrs,
            _NULL if key is None else key, -1 if key is None else len(key),
            _NULL if value is None else value, -1 if value is None else len(value),
            hbytes, hlen, hcount,
        )
        if rc >= 0:
            return rc
    raise AssertionError(f"append still failing after rolling ({rc})")  # pragma: no cover


def make_room(log: Any, needed: int) -> None:
    """The active segment reported FULL for a batch of about ``needed`` bytes: grow its map,
    or roll when it should (segment_bytes) or cannot grow."""
    segment = log._segments.active
    assert segment is not None
    with log._io_guard():
        if segment.should_roll_for(needed) or not segment.grow_for(needed):
            log._roll()


def append_encoded_locked(log: Any, batch: Any, max_timestamp: int) -> int:
    """Append one encoded batch to the active segment (rolling for time or room first);
    return its base offset."""
    if max_timestamp > log._roll_deadline:
        roll_for_time(log, max_timestamp)
    offset = log._active.append_batch(batch)
    if offset == lib.LS_ERR_FULL:
        make_room(log, len(batch))
        offset = log._active.append_batch(batch)
    if offset < 0:
        check(offset, log._active.path, size=len(batch), limit=log.config.max_message_bytes)
    return offset


def append_replicated_locked(log: Any, view: memoryview, cache: LeaderEpochCache) -> None:
    """Append the batches in ``view`` as a leader stored them (offsets, timestamps and
    partitionLeaderEpoch kept), teaching ``cache`` every new epoch. Each batch is validated
    first; the valid batches before an invalid one stay appended.

    Raises:
        CorruptRecordError: a batch is invalid.
        OffsetOutOfRangeError: a batch starts below the log end.
    """
    n = len(view)
    hdr = ffi.new("ls_batch_header *")
    crc = ffi.new("uint32_t *")
    limit = log.config.max_message_bytes
    position = 0
    while position < n:
        chunk = view[position:]
        size = lib.ls_batch_validate(ffi.from_buffer(chunk), n - position, limit, hdr, crc)
        if size < 0:
            check(size, "<replicated data>", position, stored_crc=hdr.crc, computed_crc=crc[0],
                  size=hdr.batch_length + lib.LS_LOG_OVERHEAD, limit=limit)
        end = log._appender.next_offset
        if hdr.base_offset < end:
            raise OffsetOutOfRangeError(hdr.base_offset, log._log_start_offset, end,
                                        f"replicated batch for {log.path} overlaps the log")
        epoch = hdr.partition_leader_epoch
        if epoch > cache.latest_epoch:
            cache.assign(epoch, hdr.base_offset)
        if hdr.base_offset > end:
            _skip_to(log, hdr.base_offset, hdr.last_offset_delta)
        log._appender.partition_leader_epoch = epoch
        batch = bytes(chunk[:size])
        offset = log._active.append_batch(batch)
        if offset == lib.LS_ERR_FULL:
            make_room(log, size)
            log._appender.partition_leader_epoch = epoch
            offset = log._active.append_batch(batch)
        if offset < 0:
            check(offset, log._active.path, size=size, limit=limit)
        position += size


def _skip_to(log: Any, base: int, last_offset_delta: int) -> None:
    """A replicated batch at ``base`` after a gap (a compacted leader): the log end jumps
    there. Offsets of one segment must stay within 2^31 of its base, so a non-empty active
    segment rolls when the batch would not fit, and an empty one is replaced."""
    active = log._segments.active
    assert active is not None
    if active.size > 0 and base - active.base_offset > 2**31 - 1 - last_offset_delta:
        log._roll()
        active = log._segments.active
        assert active is not None
    if active.size == 0 and active.base_offset != base:
        log._set_active(log._segments.replace_empty_active(base, log._appender.partition_leader_epoch))
        if len(log._segments) == 1:  # the log was empty: it now starts at base
            log._log_start_offset = base
            log._recovery_point = max(log._recovery_point, base)
            log._flushed_offset = max(log._flushed_offset, base)
    else:
        log._appender.next_offset = base
