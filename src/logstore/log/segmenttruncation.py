"""Truncating a segment at an offset, made crash-safe by a truncation journal (``.truncating``).

:func:`truncate` is LogSegment.truncate_to's mechanism: it takes the segment and sets its
private state (only segment.py calls it). The journal functions are re-exported by
:mod:`logstore.segment`; the Log replays a journal left by a crash when it opens. Not
thread-safe, as LogSegment.

Crash safety: the change is first written to a journal (durably), then applied, then the journal
is removed (durably). A crash before the journal is complete leaves the segment untouched; a
crash after it lets the next open finish the truncation. Without it, a torn in-place rewrite
could destroy durable records below the truncation offset.
"""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING

from .. import _fileio
from .._native import lib
from ..records.batch import BatchBuilder, RecordDecoder, parse_header
from .filenames import TRUNCATION_SUFFIX
from .segmentscan import ZERO_CHUNK, scan, set_facts

if TYPE_CHECKING:  # annotations only: segment.py imports this module
    from ..segment import LogSegment

__all__ = ["truncate", "write_truncation_journal", "replay_truncation_journal"]

logger = logging.getLogger("logstore.segment")

_JOURNAL_MAGIC = b"LSTRUNC1"


def truncate(segment: LogSegment, offset: int, builder: BatchBuilder, decoder: RecordDecoder) -> int:
    """LogSegment.truncate_to: remove every record with offset >= ``offset`` (rewriting a batch
    that straddles it), durably; returns the bytes removed."""
    size = segment.size
    if size == 0 or offset >= segment.next_offset:
        return 0
    position = segment.find_position(offset) if offset > segment.base_offset else 0
    buf = segment.buffer
    while position < size:
        header = parse_header(buf, position)
        if header.last_offset >= offset:
            break
        position += header.size
    else:
        return 0
    replacement: bytes | bytearray | memoryview = b""
    if header.base_offset < offset:
        records, _ = decoder.decode(buf, position, position + header.size, 0, -1, None, segment.path)
        kept = [r for r in records if r.offset < offset]
        if kept:
            replacement = builder.build(
                [r.value for r in kept], [r.key for r in kept], [r.headers for r in kept],
                [r.timestamp for r in kept], codec=header.compression,
                timestamp_type=int(header.timestamp_type), base_offset=header.base_offset,
                offset_deltas=[r.offset - header.base_offset for r in kept],
                last_offset_delta=offset - 1 - header.base_offset,
                partition_leader_epoch=header.partition_leader_epoch, producer_id=header.producer_id,
                producer_epoch=header.producer_epoch, base_sequence=header.base_sequence,
                log_append_time=header.max_timestamp if header.timestamp_type else None,
            )
    new_size = position + len(replacement)
    journal = segment.path + TRUNCATION_SUFFIX  # see the module docstring
    write_truncation_journal(journal, position, bytes(replacement))
    segment.offset_index.truncate_to(offset)
    segment.time_index.truncate_to(offset)
    a = segment._appender
    if a is not None:
        mm = segment._mm
        assert mm is not None
        if replacement:
            mm[position:new_size] = replacement
        # Zero the removed bytes so that a later recovery scan cannot resurrect them.
        for start in range(new_size, size, ZERO_CHUNK):
            stop = min(size, start + ZERO_CHUNK)
            mm[start:stop] = bytes(stop - start)
        a.position = new_size
        segment._size = new_size
        _fileio.ops.fsync(segment._fd)
        res = scan(segment, write_indexes=False)
        a.next_offset = res.last_offset + 1 if res.last_offset >= 0 else segment.base_offset
        a.records = res.records
        segment._records_at_activation = 0
        a.max_timestamp = res.max_timestamp
        a.offset_of_max_timestamp = res.offset_of_max_timestamp
        a.index_entries = segment.offset_index.entries
        a.timeindex_entries = segment.time_index.entries
        a.last_timeindex_timestamp = segment.time_index.last_entry()[0] if segment.time_index.entries else -1
        a.bytes_since_last_entry = 0
    else:
        segment._unmap()
        if replacement:
            _fileio.ops.pwrite(segment._fd, replacement, position)
        _fileio.ops.ftruncate(segment._fd, new_size)
        _fileio.ops.fsync(segment._fd)
        segment._size = new_size
        set_facts(segment, scan(segment, write_indexes=False))
    # The journal must be gone for good before later appends: replaying it after them
    # would cut them off.
    _fileio.ops.unlink(journal)
    _fileio.ops.fsync_dir(segment.directory)
    return size - new_size


def write_truncation_journal(path: str, position: int, replacement: bytes) -> None:
    """Durably record "cut the log at ``position`` and write ``replacement`` there".

    Layout: magic ``LSTRUNC1``, position int64 BE, length int64 BE, the bytes, CRC32C (uint32
    BE) of everything before it.
    """
    body = _JOURNAL_MAGIC + position.to_bytes(8, "big") + len(replacement).to_bytes(8, "big") + replacement
    crc = lib.ls_crc32c(0, body, len(body))
    _fileio.ops.write_file_atomic(path, body + crc.to_bytes(4, "big"))


def replay_truncation_journal(journal: str, log_path: str) -> bool:
    """Finish a truncation that a crash interrupted (see LogSegment.truncate_to).

    A journal that is incomplete or fails its CRC was never acted on and is discarded.
    Returns True when the truncation was applied. Either way the journal is removed durably.
    """
    data = _fileio.ops.read_file(journal)
    ok = len(data) >= 28 and data[:8] == _JOURNAL_MAGIC
    if ok:
        position = int.from_bytes(data[8:16], "big")
        length = int.from_bytes(data[16:24], "big")
        ok = len(data) == 28 + length and lib.ls_crc32c(0, data[:-4], len(data) - 4) == int.from_bytes(data[-4:], "big")
    applied = False
    if ok and _fileio.ops.exists(log_path):
        fd = _fileio.ops.open(log_path, os.O_RDWR)
        try:
            if length:
                _fileio.ops.pwrite(fd, data[24 : 24 + length], position)
            _fileio.ops.ftruncate(fd, position + length)
            _fileio.ops.fsync(fd)
        finally:
            _fileio.ops.close(fd)
        applied = True
        logger.warning("%s: finished a truncation at position %d interrupted by a crash", log_path, position)
    _fileio.ops.unlink(journal)
    _fileio.ops.fsync_dir(os.path.dirname(journal))
    return applied
