"""One log segment: a ``.log`` file of record batches plus its indexes.

LogSegment owns ``NNN.log``, ``NNN.index``, ``NNN.timeindex`` and (once a transaction aborted in
it) ``NNN.txnindex`` where NNN is the segment's base offset in 20 digits, and
``NNN.log.truncating``, the journal of a truncation under way. Not
thread-safe; :class:`logstore.log.log.Log` serialises writers and readers.

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

Validity rules (:class:`logstore.log.segmentscan.BatchWalk`, the C scan): a segment's bytes are
valid iff they are a sequence of valid batches (header sanity, CRC32C, well-formed records) whose
offsets increase and whose last offsets are within ``base_offset + INT32_MAX``.

The class is the one owner of the segment's state: its descriptor, its map and C appender, its
sizes and facts (next offset, record count, max timestamp), and its indexes. It holds the hot
paths (append, read), the making and keeping of the active segment (appender, writable map,
growth, shared views), the scans (recovery, index rebuilds and checks, a sealed segment's tail)
and truncation with its journal. Pure pieces that need none of that state live below it: the
file names in :mod:`logstore.log.filenames`, the walk of valid batches in
:mod:`logstore.log.segmentscan`, the point-read state in :mod:`logstore.log.pointread`.
"""

from __future__ import annotations

import errno
import logging
import mmap
import os
import threading
import weakref
from dataclasses import dataclass
from typing import Any

from . import _fileio
from ._native import ffi, lib
from .errors import CorruptIndexError, CorruptRecordError
from .index import OffsetIndex, TimeIndex, TransactionIndex
from .log.filenames import INDEX_SUFFIX, LOG_SUFFIX, TIMEINDEX_SUFFIX, TRUNCATION_SUFFIX, TXNINDEX_SUFFIX, segment_name
from .log.pointread import PointReads
from .log.segmentscan import BatchWalk, RecoveryResult, status_words
from .pinnedmap import PinnedMap, in_place_allowed, replace_file
from .records.batch import HEADER_SIZE, BatchBuilder, Record, RecordDecoder, parse_header

__all__ = ["LogSegment", "SegmentInfo", "RecoveryResult", "write_truncation_journal", "replay_truncation_journal"]

logger = logging.getLogger("logstore.segment")

_APPENDER_SIZE = ffi.sizeof("ls_appender")
_GROWTH_STEP = 8 << 20  # first map of a non-preallocated active segment; doubles after
_ZERO_CHUNK = 1 << 20  # bytes read or zeroed at a time when walking or clearing a tail
#: The batch size limit reads validate against: none beyond the segment's bytes (0). A topic's
#: max.message.bytes governs appends only, as in Kafka: lowered on a live log, it must not
#: make the larger batches already written unreadable (a Fetch of them would fail as corrupt).
#: Every batch a read checks is bounded by the bytes the segment holds, as at recovery
#: (:class:`~logstore.log.segmentscan.BatchWalk`) and in the record decoder.
READ_BATCH_LIMIT = 0
_JOURNAL_MAGIC = b"LSTRUNC1"


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
    """LogSegment owns NNN.log, NNN.index, NNN.timeindex, NNN.txnindex and NNN.log.truncating.
    Not thread-safe; Log serialises access (except :meth:`flush_data`, which may run beside it).

    Create new segments with :meth:`create`; open existing ones with :meth:`open`.

    Invariants: while active (``appender`` is not None) the appender is the truth of the size,
    next offset, record count and max timestamp, and the map is writable and at least
    ``appender.log_capacity`` long; sealed, ``_size`` is the .log's valid length and the other
    facts are either known or learnt on demand (``None`` until then).
    """

    def __init__(self, directory: str, base_offset: int, *, segment_bytes: int, index_bytes: int,
                 index_interval_bytes: int, max_batch_bytes: int, preallocate: bool, leader_epoch: int = -1,
                 new: bool = False) -> None:
        """Open (creating them if missing) the segment's files, sealed; with ``new`` the segment
        is being created (:meth:`create`): it must hold no data and starts active and empty.

        Raises:
            FileExistsError: ``new`` and the ``.log`` already holds data.
        """
        self.directory = directory
        self.base_offset = base_offset
        self.segment_bytes = segment_bytes
        self.index_interval_bytes = index_interval_bytes
        #: the largest batch an append may write (the topic's max.message.bytes); never applied
        #: to reads (see READ_BATCH_LIMIT)
        self.max_batch_bytes = max_batch_bytes
        self.preallocate = preallocate
        stem = os.path.join(directory, segment_name(base_offset))
        self.path = stem + LOG_SUFFIX
        self._fd = _fileio.ops.open(self.path, os.O_RDWR | os.O_CREAT)
        # Held while a descriptor of the segment is synced or closed: the Log's group-commit
        # flusher syncs outside the log's lock (flush_data) while a truncation may replace the
        # .log's descriptor (_take_fd) or abandon the segment; a closed descriptor's number can be
        # reused by the next open (it would sync some other file).
        self._fd_lock = threading.Lock()
        self.offset_index = OffsetIndex(stem + INDEX_SUFFIX, base_offset, index_bytes, writable=False)
        self.time_index = TimeIndex(stem + TIMEINDEX_SUFFIX, base_offset, index_bytes, writable=False)
        #: the aborted transactions whose ABORT marker is in this segment
        self.txn_index = TransactionIndex(stem + TXNINDEX_SUFFIX, base_offset)
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
        self._pinned: Any = None  # weak reference to the last PinnedMap made (view_map)
        self.closed = False
        if new:
            if self._size:
                self.close()
                raise FileExistsError(f"segment {self.path} already exists with {self._size} bytes")
            self._next_offset = base_offset
            self._records = 0
            self._max_timestamp = -1
            if self.txn_index.exists:
                self.txn_index.reset()  # a leftover of an earlier segment at this offset
            self.activate()

    # ------------------------------------------------------------------ construction
    @classmethod
    def create(cls, directory: str, base_offset: int, **settings: Any) -> "LogSegment":
        """Create an empty active segment; the caller fsyncs the directory.

        Raises:
            FileExistsError: the segment's ``.log`` already holds data.
        """
        return cls(directory, base_offset, new=True, **settings)

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

    def _drop_appender(self) -> None:
        """Forget the appender. Its struct may still be held by a Log's fast path
        (``_records.RecordAppender``) while the map it writes into is about to go: it is emptied
        first, so that an append through it fails (LS_ERR_ARG, the Log's slow path decides)
        instead of writing into unmapped memory."""
        a = self._appender
        if a is not None:
            a.log = ffi.NULL
            a.log_capacity = 0
            a.position = 0
        self._appender = None

    def _map_readonly(self) -> None:
        self._unmap()
        if self._size > 0:
            self._mm = _fileio.ops.mmap(self._fd, self._size, False)
            self._ptr = ffi.from_buffer(self._mm)

    def _map_writable(self, capacity: int, reserve_indexes: bool = True) -> None:
        """Map ``capacity`` bytes of the .log writable, its blocks (and the index room) reserved first."""
        # Reserve the blocks first: if the disk is full this fails while the old map is valid.
        # The first store into a page allocates every block of the page that lies inside the file
        # (a block can be smaller than a page), and the file may be longer than the map (a segment
        # file from an earlier life): reserve to the end of the last page, within the file.
        in_page = -(-capacity // mmap.PAGESIZE) * mmap.PAGESIZE
        if in_page > capacity:
            in_page = max(capacity, min(in_page, _fileio.ops.fsize(self._fd)))
        _fileio.ops.fallocate(self._fd, in_page)
        if reserve_indexes:
            self._reserve_index_room(capacity)
        written = self._size if self._appender is None else self._appender.position
        self._unmap()
        mm = self._mm = _fileio.ops.mmap(self._fd, capacity, True)
        # Fault the unwritten pages in ahead: first-touch stores into fresh pages of a shared
        # map cost a page fault each (measured: 0.7 GB/s for plain stores, 2.4-2.8 GB/s after
        # WILLNEED). Only the part past the data: advising the whole map again at every growth
        # step made appends slower as the segment grew.
        start = written - written % mmap.PAGESIZE
        try:
            mm.madvise(mmap.MADV_WILLNEED, start, capacity - start)
        except (AttributeError, OSError, ValueError):  # pragma: no cover - not on every platform
            pass
        self._ptr = ffi.from_buffer(mm)

    def _reserve_index_room(self, log_bytes: int) -> None:
        """Allocate index blocks for every entry ``log_bytes`` of batches can produce (one per
        index_interval_bytes), so that no index store hits an unallocated page (see
        OffsetIndex.reserve)."""
        entries = log_bytes // max(self.index_interval_bytes, 1) + 2
        self.offset_index.reserve(entries)
        self.time_index.reserve(entries)

    def _initial_capacity(self, needed: int) -> int:
        if self.preallocate:
            return max(self.segment_bytes, needed)
        capacity = min(self.segment_bytes, _GROWTH_STEP)
        while capacity < needed:
            capacity *= 2
        return max(capacity, needed, 4096)

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

    def _new_appender(self) -> Any:
        """An appender over the segment's current map and indexes, with its fixed settings."""
        a = ffi.new("ls_appender *")
        a.log = self._ptr
        a.base_offset = self.base_offset
        a.index = self.offset_index.pointer
        a.index_capacity = self.offset_index.capacity
        a.timeindex = self.time_index.pointer
        a.timeindex_capacity = self.time_index.capacity
        a.index_interval_bytes = self.index_interval_bytes
        a.max_batch_bytes = self.max_batch_bytes
        return a

    def activate(self) -> None:
        """Make this the active segment, mapped for appends after its current data.

        The segment's facts (next offset, max timestamp) must be known: from :meth:`create`,
        :meth:`recover`, or a clean open (:meth:`next_offset` walks the tail on demand).
        """
        valid_bytes = self._size
        next_offset = self.next_offset
        max_ts, offset_of_max = self._max_timestamp_and_offset()
        records_before = self._records
        self.offset_index.make_writable()
        self.time_index.make_writable()
        try:
            self._map_writable(self._initial_capacity(valid_bytes))
        except OSError as exc:
            existing = _fileio.ops.fsize(self._fd)
            if exc.errno != errno.ENOSPC or existing < max(valid_bytes, 1):
                raise
            # A full disk: map only the blocks the file already has, so the log still opens and
            # reads; the first append that needs more room fails with ENOSPC (and takes the log
            # offline) instead of the open.
            logger.warning("%s: no space to reserve room for appends; opening with %d bytes", self.path, existing)
            # The bytes there have their index entries already; the first append needs more
            # room, and growing reserves the index room with it (or fails with ENOSPC).
            self._map_writable(existing, reserve_indexes=False)
        a = self._new_appender()
        a.log_capacity = min(len(self._mm), max(self.segment_bytes, valid_bytes))  # type: ignore[arg-type]
        a.position = valid_bytes
        a.next_offset = next_offset
        a.index_entries = self.offset_index.entries
        a.timeindex_entries = self.time_index.entries
        a.bytes_since_last_entry = 0
        a.max_timestamp = max_ts
        a.offset_of_max_timestamp = offset_of_max
        a.last_timeindex_timestamp = self.time_index.last_entry()[0] if self.time_index.entries else -1
        a.partition_leader_epoch = self._leader_epoch
        a.records = 0
        # Records already present are counted lazily (a full scan) only if someone asks.
        self._records_at_activation = records_before
        self._size_at_activation = valid_bytes
        self._appender = a

    # ------------------------------------------------------------------ shared (multi-process) mode
    def activate_shared(self, view: Any) -> None:
        """Make this the active segment as described by a published shared view (another
        process may have appended to it): no scan, the appender's state comes from ``view``."""
        self.offset_index.make_writable()
        self.time_index.make_writable()
        self._size = view.position
        self._map_writable(max(_fileio.ops.fsize(self._fd), self._initial_capacity(view.position)))
        self._appender = self._new_appender()
        self._records_at_activation = None
        self._size_at_activation = 0
        self.adopt(view)

    def adopt(self, view: Any) -> None:
        """Take the active segment's state from a published shared view, remapping when another
        process grew the file past this process's map."""
        a = self._appender
        if view.position > len(self._mm):  # type: ignore[arg-type]
            self._map_writable(max(_fileio.ops.fsize(self._fd), view.position))
            a.log = self._ptr
        a.log_capacity = min(len(self._mm), max(self.segment_bytes, view.position))  # type: ignore[arg-type]
        lib.ls_appender_adopt(a, view)
        self._records_at_activation = 0  # view.records counts the whole segment
        self.offset_index.entries = view.index_entries
        self.time_index.entries = view.timeindex_entries
        self.txn_index.refresh()  # (the other process may have indexed an abort)

    def export(self, view: Any) -> None:
        """Copy the active segment's appender state into ``view`` (for publishing)."""
        if self._records_at_activation is None:
            self.record_count  # noqa: B018 - counts the records present at activation (once)
        lib.ls_view_from_appender(view, self._appender, self._records_at_activation)

    def deactivate(self) -> None:
        """Another process sealed this segment (trimmed its files): drop the appender and map
        the files read-only as they are now (the facts are learnt again on demand)."""
        if self._appender is None:
            return
        self._drop_appender()
        self._unmap()
        self._size = _fileio.ops.fsize(self._fd)
        self._next_offset = None
        self._records = None
        self._max_timestamp = None
        self.offset_index.reload_sealed()
        self.time_index.reload_sealed()

    def identity(self) -> tuple[int, int]:
        """(device, inode) of the open .log file: tells whether the path still names it."""
        return _fileio.ops.identity(self._fd)

    def view_map(self) -> PinnedMap | None:
        """A pinned read-only map of the segment's written bytes (:class:`~logstore.pinnedmap.PinnedMap`)
        for Arrow views into them, shared with the other live views of the same bytes; None
        when the segment is empty or the file cannot be pinned now (the caller copies). While
        it lives, truncations of this file replace it instead of changing it in place."""
        size = self.size
        if size <= 0:
            return None
        identity = self.identity()
        pinned = self._pinned() if self._pinned is not None else None
        if pinned is None or pinned.size < size or pinned.identity != identity:
            try:
                pinned = PinnedMap(self.path, identity, size)
            except OSError as exc:
                logger.debug("%s: not pinned for Arrow views (%s); copying", self.path, exc)
                return None
            self._pinned = weakref.ref(pinned)
        return pinned

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
        self._drop_appender()
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
            self._load_tail()
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
                self._records_at_activation = self._scan(end=self._size_at_activation).records
            return self._records_at_activation + a.records
        if self._records is None:
            self._records = self._scan().records
        return self._records

    def _max_timestamp_and_offset(self) -> tuple[int, int]:
        if self._max_timestamp is None:
            self._learn_max_timestamp()
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
        self._load_tail(strict=True)

    def info(self) -> SegmentInfo:
        """Read-only facts about the segment (Log.segments)."""
        return SegmentInfo(self.base_offset, self.size, self.record_count, self.max_timestamp,
                           self.next_offset, self.active)

    def _set_facts(self, res: Any) -> None:
        """Take a whole-log scan's result as the segment's facts (next offset, records, max timestamp)."""
        self._next_offset = res.last_offset + 1 if res.last_offset >= 0 else self.base_offset
        self._records = res.records
        self._max_timestamp = res.max_timestamp
        self._offset_of_max_timestamp = res.offset_of_max_timestamp

    def _learn_max_timestamp(self) -> None:
        """Set the max timestamp (and its offset) from the closing time index entry when that
        entry matches the log, else from a rebuild or a walk of the tail."""
        # Sealed segments end their time index with (max timestamp, its offset), as Kafka's do; the
        # entry is checked against the log before it is believed (a lost or damaged closing entry
        # would otherwise mislead time lookups and time retention).
        if self.time_index.entries and self._closing_time_entry_matches():
            self._max_timestamp, self._offset_of_max_timestamp = self.time_index.last_entry()
        elif self.time_index.entries:
            logger.warning("%s: last entry does not match the log", self.time_index.path)
            self.rebuild_indexes()
            if self._max_timestamp is None:
                self._load_tail()
        else:
            self._load_tail()

    def _closing_time_entry_matches(self) -> bool:
        """The last time index entry (T, O) must name the batch ending at O with max timestamp T,
        and no batch after the last offset index entry may be newer than T."""
        timestamp, offset = self.time_index.last_entry()
        if self.buffer is None:
            return False
        position = self.find_position(offset)
        buf = self.buffer  # find_position may have rebuilt and remapped
        while position + HEADER_SIZE <= self._size:
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
        _, tail_position = self.offset_index.last_entry() if self.offset_index.entries else (0, 0)
        return self._scan(start=min(tail_position, self._size)).max_timestamp <= timestamp

    def _load_tail(self, strict: bool = False) -> None:
        """Learn the next offset by walking from the last offset index entry to the end.

        Not strict, an invalid batch ends the walk with a warning: the facts then describe the
        readable prefix, and reads reaching the damage raise CorruptRecordError. Strict, it raises
        CorruptRecordError (check_tail).
        """
        _, position = self.offset_index.last_entry() if self.offset_index.entries else (0, 0)
        if position >= self._size or (position and not self._entry_matches(*self.offset_index.last_entry())):
            position = 0
        res = self._scan(start=position)
        if strict and res.status == lib.LS_ERR_ZERO:
            # Zeros where a trimmed segment must end with a batch: the file was grown for
            # appends and never trimmed (a crash during open or close). Recover it.
            raise CorruptRecordError(self.path, position + res.valid_bytes, "zero-filled tail in a closed segment")
        if res.status not in (lib.LS_OK, lib.LS_ERR_ZERO):
            where = position + res.valid_bytes
            why = f"invalid batch while reading the segment tail: {status_words(res.status)}"
            if strict:
                crc = res.status == lib.LS_ERR_CRC
                raise CorruptRecordError(self.path, where, why, res.stored_crc if crc else None,
                                         res.computed_crc if crc else None)
            logger.warning("%s at position %d: %s", self.path, where, why)
        self._next_offset = res.last_offset + 1 if res.last_offset >= 0 else self.base_offset
        if self._max_timestamp is None or res.max_timestamp > self._max_timestamp:
            if position == 0 or not self.time_index.entries:
                self._max_timestamp = res.max_timestamp
                self._offset_of_max_timestamp = res.offset_of_max_timestamp
            else:
                ts, off = self.time_index.last_entry()
                if res.max_timestamp > ts:
                    self._max_timestamp, self._offset_of_max_timestamp = res.max_timestamp, res.offset_of_max_timestamp
                else:
                    self._max_timestamp, self._offset_of_max_timestamp = ts, off
        if position == 0:
            self._records = res.records

    # ------------------------------------------------------------------ appends
    def append_batch(self, batch: bytes | bytearray | memoryview, any_size: bool = False, remap: bool = True) -> int:
        """Append one encoded batch; return its base offset or a negative LS_ERR_ code.

        LS_ERR_FULL means the segment must roll (the caller's policy); a map that is merely too
        small is grown here. A writable batch is stamped in place and written with pwrite (see
        ls_appender_append_batch_external); a read-only one is copied through the map.
        ``any_size``: the batch is not held to ``max_batch_bytes`` (a batch the server writes
        itself, such as a control batch, or one a follower copies from its leader: Kafka checks
        max.message.bytes on clients' batches only). ``remap=False``: LS_ERR_FULL where the map
        would have to grow (a new mapping of the file: see :meth:`grow_for`).
        """
        a = self._appender
        n = len(batch)
        writable = not isinstance(batch, bytes) and not (isinstance(batch, memoryview) and batch.readonly)
        limit = a.max_batch_bytes
        if any_size:
            a.max_batch_bytes = 0
        try:
            rc = self._append_once(a, batch, n, writable)
            if rc == lib.LS_ERR_FULL and self.grow_for(n, remap):
                rc = self._append_once(a, batch, n, writable)
        finally:
            if any_size:
                a.max_batch_bytes = limit
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

    def grow_for(self, needed: int, remap: bool = True) -> bool:
        """Try to make room for a batch of ``needed`` bytes; False when the segment must roll
        (or, ``remap=False``, when the room would take a larger map of the file: I/O).

        Invariant: the appender's log_capacity never exceeds segment_bytes, except for an
        empty segment taking one batch larger than that (which then sits alone in it).
        """
        a = self._appender
        if self.offset_index.capacity <= a.index_entries or self.time_index.capacity <= a.timeindex_entries:
            return False
        end = a.position + needed
        if a.position > 0 and end > self.segment_bytes:
            return False
        if end <= a.log_capacity:
            return False  # FULL for another reason (offset range): roll
        map_len = len(self._mm)  # type: ignore[arg-type]
        if end > map_len:
            if not remap:
                return False
            self._map_writable(max(min(map_len * 2, self.segment_bytes), end))
            a.log = self._ptr
        a.log_capacity = max(min(len(self._mm), self.segment_bytes), end)  # type: ignore[arg-type]
        return True

    def apply_limits(self, segment_bytes: int, max_batch_bytes: int) -> None:
        """Take a new size limit and largest batch (a topic's config changed): an active
        segment's appender takes them at once, so the next append past ``segment_bytes`` rolls.
        The index settings stay those the segment was made with (its index blocks are reserved
        for its interval). Called under the log's lock."""
        self.segment_bytes = segment_bytes
        self.max_batch_bytes = max_batch_bytes
        a = self._appender
        if a is not None:
            a.max_batch_bytes = max_batch_bytes
            # Invariant kept (see grow_for): the capacity only shrinks, never below what is written.
            a.log_capacity = min(a.log_capacity, max(segment_bytes, a.position))

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
        return self._position_after_bad_entry(offset, entry_offset, position)

    def _position_after_bad_entry(self, offset: int, entry_offset: int, position: int) -> int:
        """find_position's answer when the index floor (entry_offset, position) does not match the log.

        A damaged batch at a plausible entry leaves the entry trusted (the read reports the damage);
        otherwise a sealed segment rebuilds its indexes and looks again, and the answer falls back to
        position 0, from where a read skips nothing.
        """
        if not self._header_plausible(position) and self._is_damaged_batch_start(position):
            return position  # the index is right; the batch there is damaged: the read reports it
        logger.warning("%s: index entry (%d, %d) does not match the log", self.offset_index.path,
                       entry_offset, position)
        if self._appender is None:
            self.rebuild_indexes()
            entry_offset, position = self.offset_index.lookup(offset)
            if position == 0 or self._entry_matches(entry_offset, position):
                return position
        return 0

    def _header_plausible(self, position: int) -> bool:
        """True if a batch header with magic 2 and a length inside the segment starts here."""
        buf = self.buffer
        if buf is None or position + HEADER_SIZE > self.size:
            return False
        header = parse_header(buf, position)
        return header.magic == lib.LS_MAGIC and header.batch_length >= lib.LS_BATCH_MIN_LENGTH and \
            position + header.size <= self.size

    def _is_damaged_batch_start(self, position: int) -> bool:
        """True if the batches from position 0 are valid up to exactly ``position``."""
        return self._scan().valid_bytes == position

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
                n = lib.ls_batch_validate(ptr + end, size - end, READ_BATCH_LIMIT, hdr, crc)
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
        header = parse_header(buf, position)
        return header.magic == lib.LS_MAGIC and header.last_offset == entry_offset

    def _point_memo(self) -> Any:
        """The memo of the batches that reads of a few records validated whole (see
        :mod:`logstore.log.pointread`): made on first use, dropped at truncation."""
        if self._points is None:
            self._points = self._new_point_reads()
        return self._points.memo

    def _new_point_reads(self) -> PointReads:
        """The memo sized for the segment: the active one may grow to segment_bytes."""
        return PointReads(READ_BATCH_LIMIT, self.segment_bytes if self._appender is not None else self.size)

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

    # ------------------------------------------------------------------ scans
    def _scan(self, start: int = 0, end: int | None = None, indexes: bool = False) -> Any:
        """The C scan of [start, end) of the log (the one walk, :class:`BatchWalk`), through the
        map when it covers the range, else through a read-only map of its own; with ``indexes``
        (from position 0 only) it writes both indexes on the way. Returns the ls_scan_result."""
        size = self.size if end is None else end
        if size - start <= 0:
            return BatchWalk(b"", self.base_offset).scan()
        mm = self._mm if self._mm is not None and len(self._mm) >= size else None
        own = mm is None
        if own:
            mm = _fileio.ops.mmap(self._fd, size, False)
        try:
            walk = BatchWalk(mm, self.base_offset, start, size)
            if indexes:
                return walk.scan(self.index_interval_bytes, self.offset_index, self.time_index)
            return walk.scan(self.index_interval_bytes)
        finally:
            if own:
                mm.close()  # type: ignore[union-attr]

    # ------------------------------------------------------------------ recovery
    def recover(self) -> RecoveryResult:
        """Validate every batch, truncate at the first invalid one, rebuild both indexes.

        A torn or garbled tail is the expected result of a crash during append, not corruption:
        it is cut off, and the number of bytes dropped is returned. An all-zero tail is the
        unwritten part of a preallocated or mapped segment and counts as no loss. Leaves the
        segment sealed with trimmed indexes; the Log activates the last one. Durability: the
        cut is fsynced before returning.
        """
        self._size = _fileio.ops.fsize(self._fd)
        res = self._scan_into_fresh_indexes()
        valid = res.valid_bytes
        file_size = self._size
        if res.status == lib.LS_ERR_MAGIC and valid == 0 and self._old_format_at_start():
            raise CorruptRecordError(
                self.path, 0, "segment is in Kafka's message format v0/v1 (magic 0 or 1), which "
                "logstore does not read; convert the log with Kafka first (nothing was changed)")
        truncated = 0 if res.status in (lib.LS_OK, lib.LS_ERR_ZERO) else self._data_end(valid, file_size) - valid
        if valid < file_size:
            # Cut the tail so that stale batches past the valid prefix can never be scanned
            # back into the log by a later recovery (a new map re-extends the file with zeros).
            with in_place_allowed(self.path) as in_place:
                if in_place:
                    _fileio.ops.ftruncate(self._fd, valid)
                    _fileio.ops.fsync(self._fd)
                else:  # Arrow views pin the file: leave its bytes as they are
                    self._take_fd(replace_file(self.path, self._fd, valid))
        self._size = valid
        self._finish_index_rebuild(res)
        if truncated:
            logger.warning("%s: recovery truncated %d bytes at position %d (%s)", self.path,
                           truncated, valid, status_words(res.status))
        if res.txn_markers == 0:
            self.txn_index.reset()  # no marker: no aborted transaction can end here
        else:
            self.txn_index.truncate_to(res.last_offset + 1 if res.last_offset >= 0 else self.base_offset)
        return RecoveryResult(valid, truncated, res.status, res.last_offset, res.records, res.txn_markers)

    def _old_format_at_start(self) -> bool:
        head = _fileio.ops.pread(self._fd, 17, 0)
        return len(head) == 17 and head[16] in (0, 1)

    def _data_end(self, start: int, end: int) -> int:
        """Position after the last non-zero byte in [start, end) (a preallocated tail is zero)."""
        while end > start:
            chunk_start = max(start, end - _ZERO_CHUNK)
            chunk = _fileio.ops.pread(self._fd, end - chunk_start, chunk_start).rstrip(b"\0")
            if chunk:
                return chunk_start + len(chunk)
            end = chunk_start
        return start

    def check_indexes(self) -> None:
        """Raise CorruptIndexError unless both indexes pass Kafka's sanity checks.

        Entries sorted and whole, relative offsets within the segment, and no offset index
        entry pointing at or past the end of the log.
        """
        max_rel = 2**31 - 1
        self.offset_index.sanity_check(max_rel)
        self.time_index.sanity_check(max_rel)
        if self.offset_index.entries:
            _, position = self.offset_index.last_entry()
            if position >= self._size:
                raise CorruptIndexError(self.offset_index.path,
                                        f"last entry points at position {position}, past the log's {self._size} bytes")
        if self.time_index.entries and self.offset_index.entries == 0 and self._size == 0:
            raise CorruptIndexError(self.time_index.path, "entries for an empty segment")

    def rebuild_indexes(self, reason: str | None = "damaged or missing") -> None:
        """Rebuild both indexes of a sealed segment from its log (logged with ``reason``, which
        is None for a routine build, e.g. of a segment the cleaner just wrote)."""
        if reason is not None:
            logger.warning("%s: rebuilding the offset and time indexes (%s)", self.path, reason)
        res = self._scan_into_fresh_indexes()
        damaged = res.status not in (lib.LS_OK, lib.LS_ERR_ZERO) and res.valid_bytes < self._size
        if damaged:
            # The indexes cover the valid prefix only; the segment's facts stay as they were
            # (or are found lazily) rather than shrinking to that prefix.
            logger.error("%s: batch at position %d is invalid (%s); reads reaching it raise "
                         "CorruptRecordError", self.path, res.valid_bytes, status_words(res.status))
        self._finish_index_rebuild(res, with_facts=not damaged)

    def _scan_into_fresh_indexes(self) -> Any:
        """Empty both indexes and let the C scan write them anew while validating the log."""
        self._unmap()
        for index in (self.offset_index, self.time_index):
            index.make_writable()
            index.reset()
        self._reserve_index_room(_fileio.ops.fsize(self._fd))
        res = self._scan(indexes=True)
        self.offset_index.entries = res.index_entries
        self.time_index.entries = res.timeindex_entries
        return res

    def _finish_index_rebuild(self, res: Any, with_facts: bool = True) -> None:
        """Record the scan's facts, add the closing time entry, trim both indexes (sealed)."""
        if with_facts:
            self._set_facts(res)
        if res.max_timestamp > (self.time_index.last_entry()[0] if self.time_index.entries else -1):
            self.time_index.append(res.max_timestamp, res.offset_of_max_timestamp)
        self.offset_index.trim()
        self.time_index.trim()

    # ------------------------------------------------------------------ truncation
    def truncate_to(self, offset: int, builder: BatchBuilder, decoder: RecordDecoder) -> int:
        """Remove every record with offset >= ``offset``; returns bytes removed.

        Truncation is at batch granularity, as in Kafka, except that a batch straddling
        ``offset`` is rewritten in place with only its records below ``offset`` (same codec,
        timestamps, producer fields and offsets), so the log ends exactly at ``offset``.
        Durability: the change is fsynced before returning.

        Crash safety: the change is first written to the truncation journal (durably), then
        applied, then the journal is removed (durably). A crash before the journal is complete
        leaves the segment untouched; a crash after it lets the next open finish the truncation
        (:func:`replay_truncation_journal`). Without it, a torn in-place rewrite could destroy
        durable records below the truncation offset.
        """
        self._points = None
        size = self.size
        if size == 0 or offset >= self.next_offset:
            return 0
        position = self.find_position(offset) if offset > self.base_offset else 0
        buf = self.buffer
        while position < size:
            header = parse_header(buf, position)
            if header.last_offset >= offset:
                break
            position += header.size
        else:
            return 0
        replacement: bytes | bytearray | memoryview = b""
        if header.base_offset < offset:
            records, _ = decoder.decode(buf, position, position + header.size, 0, -1, None, self.path)
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
                    transactional=bool(header.attributes & lib.LS_ATTR_TRANSACTIONAL),
                    log_append_time=header.max_timestamp if header.timestamp_type else None,
                )
        new_size = position + len(replacement)
        journal = self.path + TRUNCATION_SUFFIX
        write_truncation_journal(journal, position, bytes(replacement))
        a = self._appender
        if a is not None:  # the appender counts an active segment's index entries, not the indexes
            self.offset_index.entries = a.index_entries
            self.time_index.entries = a.timeindex_entries
        self.offset_index.truncate_to(offset)
        self.time_index.truncate_to(offset)
        self.txn_index.truncate_to(offset)
        with in_place_allowed(self.path) as in_place:
            if not in_place:  # Arrow views pin the file: a new file, the pinned one left as it is
                self._replace_tail(position, replacement)
            elif a is not None:
                self._truncate_active(a, position, replacement, size)
            else:
                self._unmap()
                if replacement:
                    _fileio.ops.pwrite(self._fd, replacement, position)
                _fileio.ops.ftruncate(self._fd, new_size)
                _fileio.ops.fsync(self._fd)
                self._size = new_size
                self._set_facts(self._scan())
        # The journal must be gone for good before later appends: replaying it after them
        # would cut them off.
        _fileio.ops.unlink(journal)
        _fileio.ops.fsync_dir(self.directory)
        return size - new_size

    def _truncate_active(self, a: Any, position: int, replacement: Any, size: int) -> None:
        """truncate_to's change of the active segment in place, through its map."""
        new_size = position + len(replacement)
        mm = self._mm
        assert mm is not None
        if replacement:
            mm[position:new_size] = replacement
        # Zero the removed bytes so that a later recovery scan cannot resurrect them.
        for start in range(new_size, size, _ZERO_CHUNK):
            stop = min(size, start + _ZERO_CHUNK)
            mm[start:stop] = bytes(stop - start)
        a.position = new_size
        self._size = new_size
        _fileio.ops.fsync(self._fd)
        res = self._scan()
        a.next_offset = res.last_offset + 1 if res.last_offset >= 0 else self.base_offset
        a.records = res.records
        self._records_at_activation = 0
        a.max_timestamp = res.max_timestamp
        a.offset_of_max_timestamp = res.offset_of_max_timestamp
        a.index_entries = self.offset_index.entries
        a.timeindex_entries = self.time_index.entries
        a.last_timeindex_timestamp = self.time_index.last_entry()[0] if self.time_index.entries else -1
        a.bytes_since_last_entry = 0

    def _replace_tail(self, position: int, replacement: Any) -> None:
        """truncate_to's change made as a new file (the bytes before ``position``, then
        ``replacement``) renamed over the pinned one; an active segment is active again after,
        its appender keeping the settings its owner gave the old one (the leader epoch it
        stamps, the largest batch). The indexes are already truncated (their entry counts are
        the indexes' own: the old appender's are not taken back)."""
        old = self._appender
        if old is not None:
            epoch, max_batch_bytes = old.partition_leader_epoch, old.max_batch_bytes
            self._drop_appender()
        self._unmap()
        self._take_fd(replace_file(self.path, self._fd, position, replacement))
        self._size = position + len(replacement)
        self._set_facts(self._scan())
        if old is not None:
            self.activate()
            a = self._appender
            a.partition_leader_epoch = epoch
            a.max_batch_bytes = max_batch_bytes

    def _take_fd(self, fd: int) -> None:
        """Use ``fd``, the descriptor of a new file renamed over the .log, instead of the old one
        (after any sync of the old one under way: see ``_fd_lock``)."""
        with self._fd_lock:
            old, self._fd = self._fd, fd
            self._pinned = None
            _fileio.ops.close(old)

    # ------------------------------------------------------------------ durability / lifecycle
    def flush(self) -> None:
        """fsync the log (mapped writes included) and its indexes."""
        _fileio.ops.fsync(self._fd)
        self.offset_index.flush()
        self.time_index.flush()
        self.txn_index.flush()

    def flush_data(self) -> None:
        """fdatasync the log (enough for durability of appended records) and the transaction
        index, which read_committed readers need to skip aborted records. Thread-safe against a
        truncation replacing the .log's descriptor and against close/abandon (nothing to do once
        closed): the Log's group commit calls it outside the log's lock."""
        with self._fd_lock:
            if self._fd < 0:
                return
            _fileio.ops.fdatasync(self._fd)
            self.txn_index.flush()

    def close(self, trim: bool = True) -> None:
        """Seal (trimming files to their data) and release descriptors and maps."""
        if self.closed:
            return
        if self._appender is not None:
            if trim:
                self.seal(fsync=True)
            else:
                self._sync_from_appender()
                self._drop_appender()
        self._unmap()
        self.offset_index.close()
        self.time_index.close()
        with self._fd_lock:
            self.txn_index.flush()
            self.txn_index.close()
            _fileio.ops.close(self._fd)
            self._fd = -1
        self.closed = True

    def abandon(self) -> None:
        """Release maps and descriptors without sealing (simulated crash in tests)."""
        if self.closed:
            return
        self._drop_appender()
        self._unmap()
        self.offset_index.close()
        self.time_index.close()
        with self._fd_lock:
            self.txn_index.close()
            _fileio.ops.close(self._fd)
            self._fd = -1
        self.closed = True

    def file_paths(self) -> list[str]:
        """Paths of the segment's .log, .index and .timeindex files, and its .txnindex when it
        has one."""
        paths = [self.path, self.offset_index.path, self.time_index.path]
        if self.txn_index.exists:
            paths.append(self.txn_index.path)
        return paths

    def rename_suffix(self, suffix: str) -> None:
        """Rename all its files to ``<name><own suffix><suffix>`` (``.deleted``, ``.swap``)."""
        new_log = self.path + suffix
        _fileio.ops.rename(self.path, new_log)
        self.path = new_log
        for index in (self.offset_index, self.time_index):
            if _fileio.ops.exists(index.path):
                index.rename_to(index.path + suffix)
        self.txn_index.rename_to(self.txn_index.path + suffix)

    def __repr__(self) -> str:
        return f"LogSegment(base_offset={self.base_offset}, size={self.size}, active={self.active})"


# ---------------------------------------------------------------------- the truncation journal
# NNN.log.truncating says "cut NNN.log at a position and write these bytes there": LogSegment.truncate_to
# writes it durably before it changes the log and removes it durably after; the Log's loader
# replays one that a crash left behind before it opens the segment.


def write_truncation_journal(path: str, position: int, replacement: bytes) -> None:
    """Durably record "cut the log at ``position`` and write ``replacement`` there".

    Layout: magic ``LSTRUNC1``, position int64 BE, length int64 BE, the bytes, CRC32C (uint32
    BE) of everything before it. Durability: written to a temporary file, fsynced and renamed
    into place (the directory fsynced) before it returns.
    """
    body = _JOURNAL_MAGIC + position.to_bytes(8, "big") + len(replacement).to_bytes(8, "big") + replacement
    crc = lib.ls_crc32c(0, body, len(body))
    _fileio.ops.write_file_atomic(path, body + crc.to_bytes(4, "big"))


def replay_truncation_journal(journal: str, log_path: str) -> bool:
    """Finish a truncation that a crash interrupted (see LogSegment.truncate_to).

    A journal that is incomplete or fails its CRC was never acted on and is discarded.
    Returns True when the truncation was applied. Either way the journal is removed durably.
    Not thread-safe: the Log's loader runs it before anything opens the segment.
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
            with in_place_allowed(log_path) as in_place:
                if in_place:
                    if length:
                        _fileio.ops.pwrite(fd, data[24 : 24 + length], position)
                    _fileio.ops.ftruncate(fd, position + length)
                    _fileio.ops.fsync(fd)
                else:  # Arrow views of an earlier open pin the file: a new file instead
                    _fileio.ops.close(replace_file(log_path, fd, position, data[24 : 24 + length]))
        finally:
            _fileio.ops.close(fd)
        applied = True
        logger.warning("%s: finished a truncation at position %d interrupted by a crash", log_path, position)
    _fileio.ops.unlink(journal)
    _fileio.ops.fsync_dir(os.path.dirname(journal))
    return applied
