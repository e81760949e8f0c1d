"""Scans of a segment's log by the C scan: recovery, index rebuild and checks, the tail's facts.

Each function takes the :class:`~logstore.segment.LogSegment` it works on and reads and sets its
private state: they are the segment's slow paths (run at open, after a crash, when an index
entry disagrees with the log, or the first time a fact of a cleanly opened segment is asked
for), kept out of segment.py so that the class reads as the segment's state and its hot paths
(append, read). Only segment.py and truncation.py call them. Not thread-safe, as LogSegment.

``ls_segment_scan`` enforces the validity rules stated in :mod:`logstore.segment`. An all-zero
tail is the unwritten part of a preallocated or mapped segment: it ends the data and is no
corruption.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .. import _fileio
from .._native import ffi, lib, reason
from .activation import reserve_index_room
from ..errors import CorruptIndexError, CorruptRecordError
from ..records.batch import HEADER_SIZE, parse_header

if TYPE_CHECKING:  # annotations only: segment.py imports this module
    from ..segment import LogSegment

__all__ = ["RecoveryResult", "ZERO_CHUNK", "recover", "check_indexes", "rebuild_indexes", "scan", "set_facts",
           "status_words", "position_after_bad_entry", "learn_max_timestamp", "load_tail"]

logger = logging.getLogger("logstore.segment")

ZERO_CHUNK = 1 << 20  # bytes read or zeroed at a time when walking or clearing a tail


@dataclass
class RecoveryResult:
    """What recovering one segment found."""

    valid_bytes: int
    truncated_bytes: int
    status: int
    last_offset: int
    records: int


def status_words(status: int) -> str:
    """The reason an ``LS_ERR_*`` scan or validation status gives ("ok" for a success)."""
    return reason(status) if status < 0 else "ok"


def scan(segment: LogSegment, write_indexes: bool, start: int = 0, end: int | None = None) -> Any:
    """Run the C scan over [start, end) of the log (indexes written only from start 0).

    No batch size limit applies: max_message_bytes governs appends, and lowering it must
    never make recovery cut off batches that were valid when written (Kafka agrees).
    """
    res = ffi.new("ls_scan_result *")
    size = segment.size if end is None else end
    if size - start <= 0:
        res.last_offset = -1
        res.max_timestamp = -1
        res.offset_of_max_timestamp = -1
        res.status = lib.LS_OK
        return res
    mm = segment._mm if segment._mm is not None and len(segment._mm) >= size else None
    own = mm is None
    if own:
        mm = _fileio.ops.mmap(segment._fd, size, False)
    ptr = ffi.from_buffer(mm)
    try:
        if write_indexes:
            lib.ls_segment_scan(ptr, size, segment.base_offset, segment.index_interval_bytes,
                                0, segment.offset_index.pointer, segment.offset_index.capacity,
                                segment.time_index.pointer, segment.time_index.capacity, res)
        else:
            lib.ls_segment_scan(ptr + start, size - start, segment.base_offset, segment.index_interval_bytes,
                                0, ffi.NULL, 0, ffi.NULL, 0, res)
    finally:
        ffi.release(ptr)
        if own:
            mm.close()  # type: ignore[union-attr]
    return res


def set_facts(segment: LogSegment, res: Any) -> None:
    """Take a whole-log scan's result as the segment's facts (next offset, records, max timestamp)."""
    segment._next_offset = res.last_offset + 1 if res.last_offset >= 0 else segment.base_offset
    segment._records = res.records
    segment._max_timestamp = res.max_timestamp
    segment._offset_of_max_timestamp = res.offset_of_max_timestamp


# ---------------------------------------------------------------------- recovery
def recover(segment: LogSegment) -> RecoveryResult:
    """LogSegment.recover: validate every batch, truncate at the first invalid one, rebuild both
    indexes; durable (the cut is fsynced) and sealed when it returns."""
    segment._size = _fileio.ops.fsize(segment._fd)
    res = _scan_into_fresh_indexes(segment)
    valid = res.valid_bytes
    file_size = segment._size
    if res.status == lib.LS_ERR_MAGIC and valid == 0 and _old_format_at_start(segment):
        raise CorruptRecordError(
            segment.path, 0, "segment is in Kafka's message format v0/v1 (magic 0 or 1), which "
            "logstore does not read; convert the log with Kafka first (nothing was changed)")
    truncated = 0 if res.status in (lib.LS_OK, lib.LS_ERR_ZERO) else _data_end(segment, valid, file_size) - valid
    if valid < file_size:
        # Cut the tail so that stale batches past the valid prefix can never be scanned
        # back into the log by a later recovery (a new map re-extends the file with zeros).
        _fileio.ops.ftruncate(segment._fd, valid)
        _fileio.ops.fsync(segment._fd)
    segment._size = valid
    _finish_index_rebuild(segment, res)
    if truncated:
        logger.warning("%s: recovery truncated %d bytes at position %d (%s)", segment.path,
                       truncated, valid, status_words(res.status))
    return RecoveryResult(valid, truncated, res.status, res.last_offset, res.records)


def _old_format_at_start(segment: LogSegment) -> bool:
    head = _fileio.ops.pread(segment._fd, 17, 0)
    return len(head) == 17 and head[16] in (0, 1)


def _data_end(segment: LogSegment, start: int, end: int) -> int:
    """Position after the last non-zero byte in [start, end) (a preallocated tail is zero)."""
    while end > start:
        chunk_start = max(start, end - ZERO_CHUNK)
        chunk = _fileio.ops.pread(segment._fd, end - chunk_start, chunk_start).rstrip(b"\0")
        if chunk:
            return chunk_start + len(chunk)
        end = chunk_start
    return start


# ---------------------------------------------------------------------- indexes
def check_indexes(segment: LogSegment) -> None:
    """LogSegment.check_indexes: raise CorruptIndexError unless both indexes pass Kafka's sanity
    checks and the offset index's last entry lies inside the log."""
    max_rel = 2**31 - 1
    segment.offset_index.sanity_check(max_rel)
    segment.time_index.sanity_check(max_rel)
    if segment.offset_index.entries:
        _, position = segment.offset_index.last_entry()
        if position >= segment._size:
            raise CorruptIndexError(segment.offset_index.path,
                                    f"last entry points at position {position}, past the log's {segment._size} bytes")
    if segment.time_index.entries and segment.offset_index.entries == 0 and segment._size == 0:
        raise CorruptIndexError(segment.time_index.path, "entries for an empty segment")


def rebuild_indexes(segment: LogSegment, why: str | None) -> None:
    """LogSegment.rebuild_indexes: both indexes of a sealed segment anew from its log."""
    if why is not None:
        logger.warning("%s: rebuilding the offset and time indexes (%s)", segment.path, why)
    res = _scan_into_fresh_indexes(segment)
    damaged = res.status not in (lib.LS_OK, lib.LS_ERR_ZERO) and res.valid_bytes < segment._size
    if damaged:
        # The indexes cover the valid prefix only; the segment's facts stay as they were
        # (or are found lazily) rather than shrinking to that prefix.
        logger.error("%s: batch at position %d is invalid (%s); reads reaching it raise "
                     "CorruptRecordError", segment.path, res.valid_bytes, status_words(res.status))
    _finish_index_rebuild(segment, res, with_facts=not damaged)


def _scan_into_fresh_indexes(segment: LogSegment) -> Any:
    """Empty both indexes and let the C scan write them anew while validating the log."""
    segment._unmap()
    for index in (segment.offset_index, segment.time_index):
        index.make_writable()
        index.reset()
    reserve_index_room(segment, _fileio.ops.fsize(segment._fd))
    res = scan(segment, write_indexes=True)
    segment.offset_index.entries = res.index_entries
    segment.time_index.entries = res.timeindex_entries
    return res


def _finish_index_rebuild(segment: LogSegment, res: Any, with_facts: bool = True) -> None:
    """Record the scan's facts, add the closing time entry, trim both indexes (sealed)."""
    if with_facts:
        set_facts(segment, res)
    if res.max_timestamp > (segment.time_index.last_entry()[0] if segment.time_index.entries else -1):
        segment.time_index.append(res.max_timestamp, res.offset_of_max_timestamp)
    segment.offset_index.trim()
    segment.time_index.trim()


# ---------------------------------------------------------------------- index entries against the log
def position_after_bad_entry(segment: LogSegment, offset: int, entry_offset: int, position: int) -> int:
    """find_position's answer when the index floor (entry_offset, position) does not match the log.

    A damaged batch at a plausible entry leaves the entry trusted (the read reports the damage);
    otherwise a sealed segment rebuilds its indexes and looks again, and the answer falls back to
    position 0, from where a read skips nothing.
    """
    if not _header_plausible(segment, position) and _is_damaged_batch_start(segment, position):
        return position  # the index is right; the batch there is damaged: the read reports it
    logger.warning("%s: index entry (%d, %d) does not match the log", segment.offset_index.path,
                   entry_offset, position)
    if segment._appender is None:
        segment.rebuild_indexes()
        entry_offset, position = segment.offset_index.lookup(offset)
        if position == 0 or segment._entry_matches(entry_offset, position):
            return position
    return 0


def _header_plausible(segment: LogSegment, position: int) -> bool:
    """True if a batch header with magic 2 and a length inside the segment starts here."""
    buf = segment.buffer
    if buf is None or position + HEADER_SIZE > segment.size:
        return False
    header = parse_header(buf, position)
    return header.magic == lib.LS_MAGIC and header.batch_length >= lib.LS_BATCH_MIN_LENGTH and \
        position + header.size <= segment.size


def _is_damaged_batch_start(segment: LogSegment, position: int) -> bool:
    """True if the batches from position 0 are valid up to exactly ``position``."""
    return scan(segment, write_indexes=False).valid_bytes == position


# ---------------------------------------------------------------------- facts of a sealed segment
def learn_max_timestamp(segment: LogSegment) -> None:
    """Set the segment's max timestamp (and its offset) from its closing time index entry when
    that entry matches the log, else from a rebuild or a walk of the tail."""
    # Sealed segments end their time index with (max timestamp, its offset), as Kafka's do; the
    # entry is checked against the log before it is believed (a lost or damaged closing entry
    # would otherwise mislead time lookups and time retention).
    if segment.time_index.entries and _closing_time_entry_matches(segment):
        segment._max_timestamp, segment._offset_of_max_timestamp = segment.time_index.last_entry()
    elif segment.time_index.entries:
        logger.warning("%s: last entry does not match the log", segment.time_index.path)
        segment.rebuild_indexes()
        if segment._max_timestamp is None:
            load_tail(segment)
    else:
        load_tail(segment)


def _closing_time_entry_matches(segment: LogSegment) -> bool:
    """The last time index entry (T, O) must name the batch ending at O with max timestamp T,
    and no batch after the last offset index entry may be newer than T."""
    timestamp, offset = segment.time_index.last_entry()
    buf = segment.buffer
    if buf is None:
        return False
    position = segment.find_position(offset)
    buf = segment.buffer  # find_position may have rebuilt and remapped
    while position + HEADER_SIZE <= segment._size:
        header = parse_header(buf, position)
        if header.magic != lib.LS_MAGIC or header.batch_length < lib.LS_BATCH_MIN_LENGTH:
            return False
        if header.last_offset >= offset:
            if header.last_offset != offset or header.max_timestamp != timestamp:
                return False
            break
        position += header.size
    else:
        return False
    _, tail_position = segment.offset_index.last_entry() if segment.offset_index.entries else (0, 0)
    tail = scan(segment, write_indexes=False, start=min(tail_position, segment._size))
    return tail.max_timestamp <= timestamp


def load_tail(segment: LogSegment, strict: bool = False) -> None:
    """Learn the next offset by walking from the last offset index entry to the end.

    Not strict, an invalid batch ends the walk with a warning: the facts then describe the
    readable prefix, and reads reaching the damage raise CorruptRecordError. Strict, it raises
    CorruptRecordError (LogSegment.check_tail).
    """
    _, position = segment.offset_index.last_entry() if segment.offset_index.entries else (0, 0)
    if position >= segment._size or (position and not segment._entry_matches(*segment.offset_index.last_entry())):
        position = 0
    res = scan(segment, write_indexes=False, start=position)
    if strict and res.status == lib.LS_ERR_ZERO:
        # Zeros where a trimmed segment must end with a batch: the file was grown for
        # appends and never trimmed (a crash during open or close). Recover it.
        raise CorruptRecordError(segment.path, position + res.valid_bytes, "zero-filled tail in a closed segment")
    if res.status not in (lib.LS_OK, lib.LS_ERR_ZERO):
        where = position + res.valid_bytes
        why = f"invalid batch while reading the segment tail: {status_words(res.status)}"
        if strict:
            crc = res.status == lib.LS_ERR_CRC
            raise CorruptRecordError(segment.path, where, why, res.stored_crc if crc else None,
                                     res.computed_crc if crc else None)
        logger.warning("%s at position %d: %s", segment.path, where, why)
    segment._next_offset = res.last_offset + 1 if res.last_offset >= 0 else segment.base_offset
    if segment._max_timestamp is None or res.max_timestamp > segment._max_timestamp:
        if position == 0 or not segment.time_index.entries:
            segment._max_timestamp = res.max_timestamp
            segment._offset_of_max_timestamp = res.offset_of_max_timestamp
        else:
            ts, off = segment.time_index.last_entry()
            if res.max_timestamp > ts:
                segment._max_timestamp, segment._offset_of_max_timestamp = res.max_timestamp, res.offset_of_max_timestamp
            else:
                segment._max_timestamp, segment._offset_of_max_timestamp = ts, off
    if position == 0:
        segment._records = res.records
