"""One log segment: a ``.log`` file of record batches plus its sparse indexes.

LogSegment owns ``NNN.log``, ``NNN.index`` and ``NNN.timeindex`` where NNN is the segment's base
offset in 20 digits. Not thread-safe; :class:`logstore.log.log.Log` serialises writers and readers.

The active (last) segment is written through a shared memory map of its preallocated ``.log``:
the C appender (``ls_appender``) copies each batch into the map and updates the mapped indexes,
so an append costs no system call and its bytes are in the OS page cache when it returns (they
survive the death of the process; fsync makes them survive the machine). The map grows in steps
up to ``segment_bytes`` (or is taken whole with ``preallocate``), and blocks are reserved with
``posix_fallocate`` so that a full disk fails the growth step with an exception instead of a
SIGBUS on a later store. The bytes past ``size`` are zero until written, which recovery
recognises as the end of the data rather than as corruption.

When the segment rolls, its ``.log`` is truncated to ``size``, its indexes are trimmed, and it is
fsynced and mapped read-only: a sealed segment looks exactly like one Kafka wrote.

Validity rules (enforced by the C scan at recovery): a segment's bytes are valid iff they are a
sequence of valid batches (header sanity, CRC32C, well-formed records) whose offsets increase
and whose last offsets are within ``base_offset + INT32_MAX``.

The class holds the segment's state, its facts and its hot paths (append, read). Its slow paths
live beside it as functions of the segment: :mod:`logstore.log.activation` (the active segment's
appender and writable map, growth, shared views), :mod:`logstore.log.segmentscan` (the C scan:
recovery, index rebuilds and checks, a sealed segment's tail) and :mod:`logstore.log.segmenttruncation`
(truncation and its journal). The file names are in :mod:`logstore.log.filenames`; this module
re-exports them, with RecoveryResult and the truncation journal's functions.
"""

from __future__ import annotations

import mmap
import os
import struct
from dataclasses import dataclass
from typing import Any

from . import _fileio
from .log import activation
from .log import segmentscan as segmentrecovery
from .log import segmenttruncation as truncation
from ._native import ffi, lib
from .errors import CorruptRecordError
from .index import OffsetIndex, TimeIndex
from .log.pointread import PointReads
from .records.batch import HEADER_SIZE, BatchBuilder, Record, RecordDecoder, parse_header
from .log.filenames import (
    CLEANED_SUFFIX,
    DELETED_SUFFIX,
    INDEX_SUFFIX,
    LOG_SUFFIX,
    SWAP_SUFFIX,
    TIMEINDEX_SUFFIX,
    TRUNCATION_SUFFIX,
    parse_segment_name,
    segment_name,
)
from .log.segmentscan import RecoveryResult, status_words
from .log.segmenttruncation import replay_truncation_journal, write_truncation_journal  # noqa: F401

__all__ = ["LogSegment", "SegmentInfo", "segment_name", "parse_segment_name", "RecoveryResult"]

_APPENDER_SIZE = ffi.sizeof("ls_appender")
#: A batch header's baseOffset, magic and lastOffsetDelta (positions 0, 16 and 23).
_OFFSETS_AND_MAGIC = struct.Struct(">q8xb6xi")


@dataclass(frozen=True)
class SegmentInfo:
    """Read-only facts about one segment, as reported by ``Log.segments``."""

    base_offset: int
    size: int
    record_count: int
    max_timestamp: int
    next_offset: int
    active: bool


class LogSegment:
    """LogSegment owns NNN.log, NNN.index and NNN.timeindex. Not thread-safe; Log serialises access.

    Create new segments with :meth:`create`; open existing ones with :meth:`open`.
    """

    def __init__(self, directory: str, base_offset: int, *, segment_bytes: int, index_bytes: int,
                 index_interval_bytes: int, max_batch_bytes: int, preallocate: bool, leader_epoch: int = -1) -> None:
        self.directory = directory
        self.base_offset = base_offset
        self.segment_bytes = segment_bytes
        self.index_interval_bytes = index_interval_bytes
        self.max_batch_bytes = max_batch_bytes
        self.preallocate = preallocate
        stem = os.path.join(directory, segment_name(base_offset))
        self.path = stem + LOG_SUFFIX
        self._fd = _fileio.ops.open(self.path, os.O_RDWR | os.O_CREAT)
        self.offset_index = OffsetIndex(stem + INDEX_SUFFIX, base_offset, index_bytes, writable=False)
        self.time_index = TimeIndex(stem + TIMEINDEX_SUFFIX, base_offset, index_bytes, writable=False)
        self._mm: mmap.mmap | None = None
        self._ptr: Any = ffi.NULL
        self._size = _fileio.ops.fsize(self._fd)
        self._next_offset: int | None = None
        self._records: int | None = None
        self._max_timestamp: int | None = None
        self._offset_of_max_timestamp = -1
        self._records_at_activation: int | None = 0
        self._size_at_activation = 0
        self._appender: Any = None
        self._saved = ffi.new("ls_appender *")
        self._position_out = ffi.new("int64_t *")
        self._leader_epoch = leader_epoch
        self._points: PointReads | None = None  # reads of one record (made on first use)
        self.closed = False

    # ------------------------------------------------------------------ construction
    @classmethod
    def create(cls, directory: str, base_offset: int, **settings: Any) -> "LogSegment":
        """Create an empty active segment; the caller fsyncs the directory."""
        segment = cls(directory, base_offset, **settings)
        if segment._size:
            segment.close()
            raise FileExistsError(f"segment {segment.path} already exists with {segment._size} bytes")
        segment._next_offset = base_offset
        segment._records = 0
        segment._max_timestamp = -1
        segment.activate()
        return segment

    @classmethod
    def open(cls, directory: str, base_offset: int, **settings: Any) -> "LogSegment":
        """Open an existing segment as sealed; the Log activates or recovers it afterwards."""
        return cls(directory, base_offset, **settings)

    # ------------------------------------------------------------------ mapping
    def _unmap(self) -> None:
        if self._ptr is not ffi.NULL:
            ffi.release(self._ptr)
            self._ptr = ffi.NULL
        if self._mm is not None:
            self._mm.close()
            self._mm = None

    def _map_readonly(self) -> None:
        self._unmap()
        if self._size > 0:
            self._mm = _fileio.ops.mmap(self._fd, self._size, False)
            self._ptr = ffi.from_buffer(self._mm)

    @property
    def buffer(self) -> Any:
        """The mapped bytes (mmap), or None for an empty sealed segment."""
        if self._mm is None and self._appender is None and self._size > 0:
            self._map_readonly()
        return self._mm

    # ------------------------------------------------------------------ activation / sealing
    @property
    def active(self) -> bool:
        """True while this is the log's active (last, writable) segment."""
        return self._appender is not None

    def activate(self) -> None:
        """Make this the active segment, mapped for appends after its current data.

        The segment's facts (next offset, max timestamp) must be known: from :meth:`create`,
        :meth:`recover`, or a clean open (:meth:`next_offset` walks the tail on demand).
        """
        activation.activate(self)

    # ------------------------------------------------------------------ shared (multi-process) mode
    def activate_shared(self, view: Any) -> None:
        """Make this the active segment as described by a published shared view (another
        process may have appended to it): no scan, the appender's state comes from ``view``."""
        activation.activate_shared(self, view)

    def adopt(self, view: Any) -> None:
        """Take the active segment's state from a published shared view, remapping when another
        process grew the file past this process's map."""
        activation.adopt(self, view)

    def export(self, view: Any) -> None:
        """Copy the active segment's appender state into ``view`` (for publishing)."""
        if self._records_at_activation is None:
            self.record_count  # noqa: B018 - counts the records present at activation (once)
        lib.ls_view_from_appender(view, self._appender, self._records_at_activation)

    def deactivate(self) -> None:
        """Another process sealed this segment (trimmed its files): drop the appender and map
        the files read-only as they are now."""
        activation.deactivate(self)

    def identity(self) -> tuple[int, int]:
        """(device, inode) of the open .log file: tells whether the path still names it."""
        return _fileio.ops.identity(self._fd)

    def _sync_from_appender(self) -> None:
        a = self._appender
        self._size = a.position
        self._next_offset = a.next_offset
        self._records = None if self._records_at_activation is None else self._records_at_activation + a.records
        self._max_timestamp = a.max_timestamp
        self._offset_of_max_timestamp = a.offset_of_max_timestamp
        self.offset_index.entries = a.index_entries
        self.time_index.entries = a.timeindex_entries

    def seal(self, fsync: bool = True) -> None:
        """Stop being active: final time index entry, trim files to their data, map read-only."""
        a = self._appender
        if a is None:
            return
        lib.ls_appender_seal(a)
        self._sync_from_appender()
        self._appender = None
        self._unmap()
        _fileio.ops.ftruncate(self._fd, self._size)
        self.offset_index.trim()
        self.time_index.trim()
        if fsync:
            self.flush()

    @property
    def appender(self) -> Any:
        """The C appender struct of the active segment (None when sealed)."""
        return self._appender

    # ------------------------------------------------------------------ facts
    @property
    def size(self) -> int:
        """Bytes of valid batches (published to readers)."""
        a = self._appender
        return a.position if a is not None else self._size

    @property
    def next_offset(self) -> int:
        """One past the last offset in this segment (base_offset when empty)."""
        a = self._appender
        if a is not None:
            return a.next_offset
        if self._next_offset is None:
            segmentrecovery.load_tail(self)
        return self._next_offset  # type: ignore[return-value]

    @property
    def max_timestamp(self) -> int:
        """Largest timestamp in the segment, -1 when empty."""
        a = self._appender
        if a is not None:
            return a.max_timestamp
        return self._max_timestamp_and_offset()[0]

    @property
    def record_count(self) -> int:
        """Records in the segment (a full walk the first time for a segment opened cleanly)."""
        a = self._appender
        if a is not None:
            if self._records_at_activation is None:
                head = segmentrecovery.scan(self, write_indexes=False, end=self._size_at_activation)
                self._records_at_activation = head.records
            return self._records_at_activation + a.records
        if self._records is None:
            res = segmentrecovery.scan(self, write_indexes=False)
            self._records = res.records
        return self._records

    def _max_timestamp_and_offset(self) -> tuple[int, int]:
        if self._max_timestamp is None:
            segmentrecovery.learn_max_timestamp(self)
        return self._max_timestamp, self._offset_of_max_timestamp  # type: ignore[return-value]

    def assume_next_offset(self, offset: int) -> None:
        """Take ``offset`` (the next segment's base) as this sealed segment's next offset unless
        it is already known: it saves a walk of the tail and does not depend on the tail being
        readable."""
        if self._appender is None and self._next_offset is None:
            self._next_offset = offset

    def check_tail(self) -> None:
        """Walk from the last offset index entry to the end, learning the next offset.

        Raises:
            CorruptRecordError: a batch on the way is invalid (the Log recovers the active
                segment then; for a sealed one it is corruption that reads will report).
        """
        segmentrecovery.load_tail(self, strict=True)

    def info(self) -> SegmentInfo:
        """Read-only facts about the segment (Log.segments)."""
        return SegmentInfo(self.base_offset, self.size, self.record_count, self.max_timestamp,
                           self.next_offset, self.active)

    # ------------------------------------------------------------------ appends
    def append_batch(self, batch: bytes | bytearray | memoryview) -> int:
        """Append one encoded batch; return its base offset or a negative LS_ERR_ code.

        LS_ERR_FULL means the segment must roll (the caller's policy); a map that is merely too
        small is grown here. A writable batch is stamped in place and written with pwrite (see
        ls_appender_append_batch_external); a read-only one is copied through the map.
        """
        a = self._appender
        n = len(batch)
        writable = not isinstance(batch, bytes) and not (isinstance(batch, memoryview) and batch.readonly)
        rc = self._append_once(a, batch, n, writable)
        if rc == lib.LS_ERR_FULL and activation.grow(self, n):
            rc = self._append_once(a, batch, n, writable)
        return rc

    def _append_once(self, a: Any, batch: Any, n: int, writable: bool) -> int:
        if not writable:
            return lib.ls_appender_append_batch(a, batch, n)
        ptr = ffi.from_buffer(batch, require_writable=True)
        saved = self._saved
        ffi.memmove(saved, a, _APPENDER_SIZE)
        try:
            rc = lib.ls_appender_append_batch_external(a, ptr, n, self._position_out)
        finally:
            ffi.release(ptr)
        if rc >= 0:
            try:
                _fileio.ops.pwrite(self._fd, batch, self._position_out[0])
            except BaseException:
                ffi.memmove(a, saved, _APPENDER_SIZE)  # nothing was published: undo
                raise
        return rc

    def grow_for(self, needed: int) -> bool:
        """Try to make room for ``needed`` more bytes; False when the segment must roll."""
        return activation.grow(self, needed)

    def should_roll_for(self, needed: int) -> bool:
        """Kafka's size rule: roll when this batch would take the segment past segment_bytes."""
        a = self._appender
        return a.position > 0 and a.position + needed > self.segment_bytes

    # ------------------------------------------------------------------ reads
    def find_position(self, offset: int) -> int:
        """Position of a batch at or before the one holding ``offset`` (index floor).

        The entry is checked against the log before it is trusted: the batch at an entry's
        position must end exactly at the entry's offset. An entry that fails (a damaged index
        that passed the sanity check, e.g. an understated offset or a position inside a batch)
        makes a sealed segment rebuild its indexes, and the lookup is redone; reads therefore
        never skip records because of the index, and damage to the data itself is left for
        the read to report.
        """
        if self._appender is not None:
            self.offset_index.entries = self._appender.index_entries
        entry_offset, position = self.offset_index.lookup(offset)
        if position == 0 or self._entry_matches(entry_offset, position):
            return position
        return segmentrecovery.position_after_bad_entry(self, offset, entry_offset, position)

    @property
    def fd(self) -> int:
        """The ``.log`` file's descriptor (the segment owns it: dup it to keep it)."""
        return self._fd

    def read_raw(self, offset: int, max_bytes: int) -> tuple[int, int]:
        """(position, length) of the whole batches from the one holding ``offset`` on: at least
        one batch when any holds offsets >= ``offset``, then more while the total stays within
        ``max_bytes`` (as a Kafka fetch returns them). Every batch is CRC-checked first.

        Raises:
            CorruptRecordError: a batch on the way is invalid.
        """
        size = self.size
        if size == 0 or offset >= self.next_offset:
            return 0, 0
        position = self.find_position(offset) if offset > self.base_offset else 0
        buf = self.buffer
        ptr = ffi.from_buffer(buf)
        hdr = ffi.new("ls_batch_header *")
        crc = ffi.new("uint32_t *")
        start = -1
        end = position
        try:
            while end < size:
                n = lib.ls_batch_validate(ptr + end, size - end, self.max_batch_bytes, hdr, crc)
                if n < 0:
                    stored = hdr.crc if n == lib.LS_ERR_CRC else None
                    raise CorruptRecordError(self.path, end, status_words(n), stored,
                                             crc[0] if n == lib.LS_ERR_CRC else None)
                last = hdr.base_offset + hdr.last_offset_delta
                if start < 0:
                    if last < offset:
                        end += n
                        position = end
                        continue
                    start = position
                elif end + n - start > max_bytes:
                    break
                end += n
        finally:
            ffi.release(ptr)
        return (start, end - start) if start >= 0 else (0, 0)

    def _check_not_beyond_end(self, buf: Any, position: int) -> None:
        """A batch inside this segment cannot start at or after the segment's end offset (the
        next segment's base, or the log end): if one does, its baseOffset (which the CRC does
        not cover) is damaged, and a read must not skip it silently."""
        header = parse_header(buf, position)
        end = self.next_offset
        if header.base_offset >= end:
            raise CorruptRecordError(self.path, position, f"batch base offset {header.base_offset} lies at or "
                                     f"beyond the segment's end offset {end}")

    def _entry_matches(self, entry_offset: int, position: int) -> bool:
        buf = self.buffer
        if buf is None or position + HEADER_SIZE > self.size:
            return False
        base_offset, magic, last_offset_delta = _OFFSETS_AND_MAGIC.unpack_from(buf, position)
        return magic == lib.LS_MAGIC and base_offset + last_offset_delta == entry_offset

    def _point_memo(self) -> Any:
        """The memo of the batches that reads of a few records validated whole (see
        :mod:`logstore.log.pointread`): made on first use, dropped at truncation."""
        if self._points is None:
            self._points = self._new_point_reads()
        return self._points.memo

    def _new_point_reads(self) -> PointReads:
        """The memo sized for the segment: the active one may grow to segment_bytes."""
        return PointReads(self.max_batch_bytes, self.segment_bytes if self._appender is not None else self.size)

    def point_entry(self) -> tuple[Any, int, int, Any, int, Any, int, int] | None:
        """What a log's :class:`~logstore.log.pointread.PointLog` reads this segment with (its
        ``describe``): the point-read state and, for the active segment, its appender (read at
        each call), else the map, size and offset index; None for an empty sealed segment. Maps a
        sealed segment on first use."""
        points = self._points
        if points is None:
            points = self._points = self._new_point_reads()
        a = self._appender
        if a is not None:
            if points.appender is not a:
                points.bind(a)
            return ((points, a), points.address, points.appender_address, self._mm, 0, None, 0, self.base_offset)
        buf = self.buffer
        if buf is None:
            return None
        index = self.offset_index
        return (points, points.address, 0, buf, self._size, index.data, index.entries, self.base_offset)

    def read(self, decoder: RecordDecoder, offset: int, max_bytes: int, max_offset: int,
             max_records: int | None) -> list[Record]:
        """Records with offset in [offset, max_offset) from about max_bytes of batches.

        At least one whole batch is decoded when any batch holds ``offset`` (KIP-74), so a
        batch larger than max_bytes is still returned. Returns [] only when no record at or
        after ``offset`` (and below max_offset) is left in this segment.

        Raises:
            CorruptRecordError: the first batch needed fails validation.
        """
        size = self.size
        if size == 0:
            return []
        start = self.find_position(offset)  # may rebuild the indexes (and remap) first
        buf = self.buffer
        budget = max(max_bytes, 1)
        memo = None if max_records is None else self._point_memo()
        while start < size:
            # The window starts at the index floor, up to index_interval_bytes before the batch
            # holding offset; widen it by that much so max_bytes counts from about there.
            end = min(size, start + budget + self.index_interval_bytes)
            records, stopped = decoder.decode(buf, start, end, offset, max_offset, max_records, self.path,
                                              partial_tail_ok=end < size, stop_before_damage=True, exact=True,
                                              memo=memo)
            if not records and decoder.last_stop == lib.LS_STOP_MAX_OFFSET:
                self._check_not_beyond_end(buf, stopped)
            if records or decoder.last_stop == lib.LS_STOP_MAX_OFFSET or stopped >= size:
                return records
            if stopped > start:
                start = stopped  # whole batches below offset: move on
                continue
            # The batch at `start` does not fit the window: decode it whole.
            if size - start < HEADER_SIZE:
                end = size
            else:
                header = parse_header(buf, start)
                if max_offset >= 0 and header.base_offset >= max_offset:
                    return []
                end = min(size, start + max(header.size, HEADER_SIZE))
            records, stopped = decoder.decode(buf, start, end, offset, max_offset, max_records, self.path,
                                              stop_before_damage=True, exact=True, memo=memo)
            if records or stopped <= start:
                return records
            start = stopped
        return []

    def offset_for_timestamp(self, decoder: RecordDecoder, timestamp: int, min_offset: int = 0) -> Record | None:
        """The first record at or after ``min_offset`` with timestamp >= ``timestamp``, or None."""
        if self.max_timestamp < timestamp:
            return None
        if self._appender is not None:
            self.time_index.entries = self._appender.timeindex_entries
        _, index_offset = self.time_index.lookup(timestamp)
        position = self.find_position(max(index_offset, min_offset))
        size = self.size
        buf = self.buffer
        while position < size:
            end = min(size, position + (1 << 20))
            records, stopped = decoder.decode(buf, position, end, min_offset, -1, None, self.path,
                                              partial_tail_ok=end < size)
            if stopped <= position:  # one batch larger than the window: take it whole
                end = min(size, position + parse_header(buf, position).size)
                records, stopped = decoder.decode(buf, position, end, min_offset, -1, None, self.path)
            for record in records:
                if record.timestamp >= timestamp:
                    return record
            if stopped <= position:
                break
            position = stopped
        return None

    # ------------------------------------------------------------------ recovery
    def recover(self) -> RecoveryResult:
        """Validate every batch, truncate at the first invalid one, rebuild both indexes.

        A torn or garbled tail is the expected result of a crash during append, not corruption:
        it is cut off, and the number of bytes dropped is returned. An all-zero tail is the
        unwritten part of a preallocated or mapped segment and counts as no loss. Leaves the
        segment sealed with trimmed indexes; the Log activates the last one.
        """
        return segmentrecovery.recover(self)

    def check_indexes(self) -> None:
        """Raise CorruptIndexError unless both indexes pass Kafka's sanity checks.

        Entries sorted and whole, relative offsets within the segment, and no offset index
        entry pointing at or past the end of the log.
        """
        segmentrecovery.check_indexes(self)

    def rebuild_indexes(self, reason: str | None = "damaged or missing") -> None:
        """Rebuild both indexes of a sealed segment from its log (logged with ``reason``, which
        is None for a routine build, e.g. of a segment the cleaner just wrote)."""
        segmentrecovery.rebuild_indexes(self, reason)

    # ------------------------------------------------------------------ truncation
    def truncate_to(self, offset: int, builder: BatchBuilder, decoder: RecordDecoder) -> int:
        """Remove every record with offset >= ``offset``; returns bytes removed.

        Truncation is at batch granularity, as in Kafka, except that a batch straddling
        ``offset`` is rewritten in place with only its records below ``offset`` (same codec,
        timestamps, producer fields and offsets), so the log ends exactly at ``offset``.
        Durability: the change is fsynced before returning.
        """
        self._points = None
        return truncation.truncate(self, offset, builder, decoder)

    # ------------------------------------------------------------------ durability / lifecycle
    def flush(self) -> None:
        """fsync the log (mapped writes included) and both indexes."""
        _fileio.ops.fsync(self._fd)
        self.offset_index.flush()
        self.time_index.flush()

    def flush_data(self) -> None:
        """fdatasync the log only: enough for durability of appended records."""
        _fileio.ops.fdatasync(self._fd)

    def close(self, trim: bool = True) -> None:
        """Seal (trimming files to their data) and release descriptors and maps."""
        if self.closed:
            return
        if self._appender is not None:
            if trim:
                self.seal(fsync=True)
            else:
                self._sync_from_appender()
                self._appender = None
        self._unmap()
        self.offset_index.close()
        self.time_index.close()
        _fileio.ops.close(self._fd)
        self._fd = -1
        self.closed = True

    def abandon(self) -> None:
        """Release maps and descriptors without sealing (simulated crash in tests)."""
        if self.closed:
            return
        self._appender = None
        self._unmap()
        self.offset_index.close()
        self.time_index.close()
        _fileio.ops.close(self._fd)
        self.closed = True

    def file_paths(self) -> list[str]:
        """Paths of the segment's .log, .index and .timeindex files."""
        return [self.path, self.offset_index.path, self.time_index.path]

    def rename_suffix(self, suffix: str) -> None:
        """Rename all three files to ``<name><own suffix><suffix>`` (``.deleted``, ``.swap``)."""
        new_log = self.path + suffix
        _fileio.ops.rename(self.path, new_log)
        self.path = new_log
        for index in (self.offset_index, self.time_index):
            if _fileio.ops.exists(index.path):
                index.rename_to(index.path + suffix)

    def __repr__(self) -> str:
        return f"LogSegment(base_offset={self.base_offset}, size={self.size}, active={self.active})"
