"""LogSegments: a partition's segments in offset order, the active one, rolls and deletions.

LogSegments owns the segment files of one partition directory (``NNN.log``, ``NNN.index``,
``NNN.timeindex``) while they are live, and their ``.deleted`` names until they are unlinked.
It knows where an offset lives, creates the next segment at a roll, cuts and replaces segments
for truncation, and removes segments with Kafka's delay (``file.delete.delay.ms``). It keeps no
offsets of the partition (log start, recovery point, high watermark): :class:`~logstore.log.log.Log`
holds those and decides when segments roll or go.

Every change of the set of files starts with ``on_layout_change()``: a log shared by several
processes flags the change in its shared page there, so that a process dying in the middle is
repaired by the next writer (see shared.py).

Thread-safety: not thread-safe; the owning Log calls it with its lock held (a deletion's timer
takes that lock itself).
"""

from __future__ import annotations

import os
import threading
import time
from bisect import bisect_left
from operator import attrgetter
from typing import Any, Callable, Iterator, NamedTuple

from sortedcontainers import SortedDict

from .. import _fileio
from .._native import lib
from ..errors import CorruptRecordError, LogOfflineError
from .pointread import PointLog
from ..records.batch import BatchBuilder, Record, RecordDecoder
from ..index import AbortedTxn
from ..segment import LogSegment, SegmentInfo
from .filenames import (DELETED_SUFFIX, INDEX_SUFFIX, LOG_SUFFIX, TIMEINDEX_SUFFIX, TXNINDEX_SUFFIX, parse_segment_name,
                        segment_name)

__all__ = ["LogSegments", "ColumnsFrom", "decode_columns_from"]

_offset_of = attrgetter("offset")


def _nothing() -> None:
    pass


class ColumnsFrom(NamedTuple):
    """Where a decode of one segment's columns starts: its mapped bytes, the position of the
    batch to start at, its size and its path (for errors)."""

    buffer: Any
    position: int
    size: int
    path: str


def _columns_from(segment: LogSegment, offset: int) -> ColumnsFrom | None:
    if offset >= segment.next_offset:
        return None
    position = segment.find_position(offset) if offset > segment.base_offset else 0
    return ColumnsFrom(segment.buffer, position, segment.size, segment.path)


def decode_columns_from(decoder: RecordDecoder, at: ColumnsFrom, offset: int, limit: int,
                        sink: Callable[[Any, Any, int], None]) -> int | None:
    """Decode one segment's rows from ``offset`` on (as :meth:`LogSegments.decode_columns`)
    from where ``at`` says; returns the offset to go on from, or None when the segment holds
    nothing from ``offset`` on below ``limit``'s batch. Touches nothing but the bytes, the
    decoder and the sink: another thread may run it while the log's lock is held for it.

    Raises:
        CorruptRecordError: an invalid batch among the segment's written bytes.
    """
    stop = decoder.decode_columns(at.buffer, at.position, at.size, sink, min_offset=offset, max_offset=limit,
                                  path=at.path)
    if decoder.last_stop == lib.LS_STOP_ERROR:
        raise CorruptRecordError(at.path, stop, "an invalid batch among the log's written bytes")
    if decoder.last_batch_offset >= offset:
        return decoder.last_batch_offset + 1
    if decoder.last_stop == lib.LS_STOP_MAX_OFFSET:
        return limit  # the next batch starts at limit or later
    return None


class LogSegments:
    """The ordered segments of one partition directory; the last one is the active segment.

    Args:
        path: the partition directory.
        settings: LogSegment keyword settings (segment and index sizes, index interval,
            largest batch, preallocation).
        lock: the owning Log's lock (taken by the timer that unlinks deleted files).
        file_delete_delay_ms: how long ``.deleted`` files stay before they are unlinked.
        timers: False when the owner calls :meth:`unlink_due` itself instead of timer threads.
    """

    def __init__(self, path: str, settings: dict[str, Any], lock: Any, file_delete_delay_ms: int,
                 timers: bool = True) -> None:
        self.path = path
        self.settings = settings
        self._lock = lock
        self._delete_delay_ms = file_delete_delay_ms
        self._timers_enabled = timers
        self._segments: SortedDict = SortedDict()
        #: reads of one record (:class:`~logstore.log.pointread.PointLog`), made by
        #: :meth:`point_reader` and dropped at any change of the set
        self.points: PointLog | None = None
        #: the segment appends go to (the last one), None while the log is closed
        self.active: LogSegment | None = None
        #: called before any change of the segment files (shared logs flag it, see shared.py)
        self.on_layout_change: Callable[[], None] = _nothing
        self._pending_deletes: list[tuple[float, list[str]]] = []
        self._timers: set[threading.Timer] = set()
        self._closed = False

    @classmethod
    def for_config(cls, path: str, config: Any, lock: Any, timers: bool = True) -> "LogSegments":
        """The segment set of a log with LogConfig ``config``."""
        segments = cls(path, {}, lock, config.file_delete_delay_ms, timers)
        segments.configure(config)
        return segments

    def configure(self, config: Any) -> None:
        """Take a changed LogConfig: segments created from now on get its sizes, the active one
        its size limit and largest batch (:meth:`LogSegment.apply_limits`), and deleted files
        wait its file_delete_delay_ms. Called under the log's lock."""
        self.settings = dict(segment_bytes=config.segment_bytes, index_bytes=config.segment_index_bytes,
                             index_interval_bytes=config.index_interval_bytes,
                             max_batch_bytes=config.max_message_bytes, preallocate=config.preallocate)
        self._delete_delay_ms = config.file_delete_delay_ms
        if self.active is not None:
            self.active.apply_limits(config.segment_bytes, config.max_message_bytes)

    # ------------------------------------------------------------------ the set
    def __len__(self) -> int:
        return len(self._segments)

    def __iter__(self) -> Iterator[LogSegment]:
        return iter(self._segments.values())

    def __contains__(self, base: int) -> bool:
        return base in self._segments

    def __getitem__(self, base: int) -> LogSegment:
        return self._segments[base]

    def bases(self) -> Any:
        """The base offsets, ascending (a live view)."""
        return self._segments.keys()

    def values(self) -> Any:
        """The segments, oldest first (a live view)."""
        return self._segments.values()

    def sealed(self) -> list[LogSegment]:
        """Every segment but the last (the active) one, oldest first."""
        return list(self._segments.values())[:-1]

    @property
    def first(self) -> LogSegment:
        return self._segments.peekitem(0)[1]

    @property
    def last(self) -> LogSegment:
        return self._segments.peekitem(-1)[1]

    def floor_index(self, offset: int) -> int:
        """Index of the segment that would hold ``offset`` (the last one based at or below it)."""
        return max(0, self._segments.bisect_right(offset) - 1)

    def holding(self, offset: int) -> LogSegment:
        """The segment that holds ``offset`` (the last one based at or below it; the first
        segment for an offset below every base)."""
        return self._segments.peekitem(self.floor_index(offset))[1]

    def following_base(self, base: int) -> int | None:
        """Base offset of the segment after the one based at ``base``, None for the last."""
        i = self._segments.bisect_right(base)
        return self._segments.keys()[i] if i < len(self._segments) else None

    def add(self, segment: LogSegment) -> None:
        self._put(segment)

    def pop(self, base: int) -> LogSegment:
        return self._remove(base)

    def _put(self, segment: LogSegment) -> None:
        self._segments[segment.base_offset] = segment
        self.points = None

    def _remove(self, base: int) -> LogSegment:
        self.points = None
        return self._segments.pop(base)

    def open_segment(self, base: int) -> LogSegment:
        """Open the existing segment at ``base`` (sealed) and add it."""
        segment = LogSegment.open(self.path, base, **self.settings)
        self._put(segment)
        return segment

    def create_segment(self, base: int, **extra: Any) -> LogSegment:
        """Create an empty segment at ``base``, fsync the directory, and add it."""
        segment = LogSegment.create(self.path, base, **extra, **self.settings)
        _fileio.ops.fsync_dir(self.path)
        self._put(segment)
        return segment

    def link_next_offsets(self) -> None:
        """Tell each segment where the next one starts (its end offset, without a scan)."""
        keys = list(self._segments.keys())
        for base, next_base in zip(keys, keys[1:]):
            self._segments[base].assume_next_offset(next_base)

    def below(self, log_start_offset: int) -> list[LogSegment]:
        """Segments wholly below ``log_start_offset`` (never the last one)."""
        keys = self._segments.keys()
        out = []
        for i in range(len(keys) - 1):
            if keys[i + 1] <= log_start_offset:
                out.append(self._segments[keys[i]])
            else:
                break
        return out

    @property
    def size_in_bytes(self) -> int:
        return sum(segment.size for segment in self._segments.values())

    def infos(self) -> list[SegmentInfo]:
        return [segment.info() for segment in self._segments.values()]

    # ------------------------------------------------------------------ reads
    def read(self, decoder: RecordDecoder, offset: int, max_bytes: int, limit: int,
             max_records: int | None) -> list[Record]:
        """Records from ``offset`` (below ``limit``) out of the first segment that has any."""
        segments = self._segments
        i = self.floor_index(offset)
        keys = segments.keys()
        while i < len(keys):
            records = segments[keys[i]].read(decoder, offset, max_bytes, limit, max_records)
            if records:
                if records[-1].offset >= limit:
                    # A batch straddling the limit comes whole from the segment.
                    del records[bisect_left(records, limit, key=_offset_of):]
                if max_records is not None and len(records) > max_records:
                    del records[max_records:]
                return records
            i += 1
            if i < len(keys):
                offset = max(offset, keys[i])
                if offset >= limit:
                    break
        return []

    def point_reader(self) -> PointLog:
        """The reader of one record by offset over the segments as they are now (kept as
        :attr:`points` until the set changes)."""
        self.points = PointLog(list(self._segments.keys()), list(self._segments.values()), LogSegment.point_entry)
        return self.points

    def decode_columns(self, decoder: RecordDecoder, offset: int, limit: int,
                       sink: Callable[[Any, Any, int], None]) -> int:
        """Hand the rows from ``offset`` on, out of the first segment that has any, to ``sink``
        as C columns (:meth:`RecordDecoder.decode_columns`), up to the first batch whose base
        offset is ``limit`` or more; rows of a batch straddling ``limit`` reach the sink too.
        Returns the offset to go on from: after the last batch decoded, or ``limit`` when no
        segment holds anything from ``offset`` on.

        Raises:
            CorruptRecordError: an invalid batch among the log's written bytes.
        """
        segments = self._segments
        i = self.floor_index(offset)
        keys = segments.keys()
        while i < len(keys):
            at = _columns_from(segments[keys[i]], offset)
            if at is not None:
                after = decode_columns_from(decoder, at, offset, limit, sink)
                if after is not None:
                    return after
            i += 1
            if i < len(keys):
                offset = max(offset, keys[i])
                if offset >= limit:
                    break
        return limit

    def view_maps(self, offset: int, limit: int) -> list[tuple[Any, Any]]:
        """(segment map, :class:`~logstore.pinnedmap.PinnedMap`) of every segment a decode of
        [offset, limit] may read (see :meth:`ArrowBuilder.add_maps
        <logstore.records.arrow.ArrowBuilder.add_maps>`), the active one's written bytes too."""
        segments = self._segments
        keys = segments.keys()
        out = []
        i = first = self.floor_index(offset)
        while i < len(keys) and (i == first or keys[i] <= limit):
            segment = segments[keys[i]]
            out.append((segment.buffer, segment.view_map()))
            i += 1
        return out

    def columns_from(self, offset: int) -> ColumnsFrom | None:
        """Where a decode of the columns from ``offset`` on starts in the segment that would
        hold it (its map made and its index entry checked here), for :func:`decode_columns_from`
        in another thread while the caller holds the log's lock; None when that segment ends at
        or before ``offset``."""
        return _columns_from(self._segments.peekitem(self.floor_index(offset))[1], offset)

    def read_raw(self, offset: int, max_bytes: int) -> bytes:
        """Whole batches as stored, from the one holding ``offset`` on (b"" past the end)."""
        segment, position, length = self.locate_raw(offset, max_bytes)
        return bytes(segment.buffer[position:position + length]) if segment is not None else b""

    def locate_raw(self, offset: int, max_bytes: int) -> tuple[LogSegment | None, int, int]:
        """(segment, position, length) of the whole batches :meth:`read_raw` returns, all in one
        segment, each CRC-checked; (None, 0, 0) past the end."""
        segments = self._segments
        i = self.floor_index(offset)
        keys = segments.keys()
        while i < len(keys):
            segment = segments[keys[i]]
            position, length = segment.read_raw(offset, max_bytes)
            if length:
                return segment, position, length
            i += 1
        return None, 0, 0

    def aborted_transactions(self, start: int, upper: int) -> list[AbortedTxn]:
        """The aborted transactions that overlap [start, upper), from the transaction indexes of
        the segment holding ``start`` and the later ones, until an entry's last stable offset
        shows that no later segment holds one (Kafka's collectAbortedTransactions)."""
        found: list[AbortedTxn] = []
        for segment in self._segments.values()[self.floor_index(start):]:
            txns, complete = segment.txn_index.collect(start, upper)
            found.extend(txns)
            if complete:
                break
        return found

    def offset_for_timestamp(self, decoder: RecordDecoder, timestamp: int, start: int) -> int | None:
        """The earliest offset >= ``start`` whose timestamp is >= ``timestamp``, or None."""
        for segment in self._segments.values()[self.floor_index(start):]:
            if segment.max_timestamp < timestamp:
                continue
            record = segment.offset_for_timestamp(decoder, timestamp, start)
            if record is not None:
                return record.offset
        return None

    # ------------------------------------------------------------------ layout changes
    def roll(self, leader_epoch: int) -> LogSegment:
        """Seal (trim + fsync) the active segment and create the next one at its end offset;
        return the new segment (the caller makes it active)."""
        old = self.active
        assert old is not None
        self.on_layout_change()
        old.seal(fsync=True)
        return self.create_segment(old.next_offset, leader_epoch=leader_epoch)

    def replace_all(self, base: int) -> LogSegment:
        """Delete every segment now and create one empty segment at ``base`` (Kafka's
        truncateFullyAndStartAt); return it."""
        self.on_layout_change()
        for b in list(self._segments.keys()):
            self._remove(b).abandon()
            self.delete_files_now(b)
        return self.create_segment(base)

    def replace_empty_active(self, base: int, leader_epoch: int) -> LogSegment:
        """The empty active segment gives way to one based at ``base``; return the new one."""
        self.on_layout_change()
        old = self.active
        assert old is not None and old.size == 0
        self._remove(old.base_offset)
        old.abandon()
        self.delete_files_now(old.base_offset)
        return self.create_segment(base, leader_epoch=leader_epoch)

    def truncate_to(self, offset: int, builder: BatchBuilder, decoder: RecordDecoder) -> LogSegment:
        """Remove every record at or after ``offset`` (which lies above the first segment's
        base): later segments are deleted now, the one holding ``offset`` is cut and becomes
        the active segment, which is returned. The caller fsyncs the directory."""
        self.on_layout_change()
        doomed = [base for base in self._segments.keys() if base >= offset]
        if doomed and doomed[0] == self._segments.keys()[0]:
            doomed = doomed[1:]
        for base in reversed(doomed):
            self._remove(base).abandon()
            self.delete_files_now(base)
        last = self.last
        self.points = None  # its memo is dropped below
        if not last.active:
            last.activate()
        last.truncate_to(offset, builder, decoder)
        return last

    def swap_in_place(self, segment: LogSegment) -> None:
        """Put ``segment`` (compaction output, already live on disk) in the set, telling it
        where the next segment starts."""
        following = self.following_base(segment.base_offset)
        if following is not None:
            segment.assume_next_offset(following)
        self._put(segment)

    def reload(self, view: Any) -> LogSegment:
        """Another process changed the segment files (a shared log): reopen what changed, keep
        the rest; return the published active segment, adopted from ``view``."""
        ops = _fileio.ops
        bases = {parsed[0] for name in ops.listdir(self.path)
                 if (parsed := parse_segment_name(name)) and parsed[1] == LOG_SUFFIX}
        for base in list(self._segments.keys()):
            segment = self._segments[base]
            if (base not in bases or base > view.active_base
                    or ops.path_identity(segment.path) != segment.identity()):
                self._remove(base).abandon()
        for base in sorted(bases):
            if base <= view.active_base and base not in self._segments:
                self.open_segment(base)
        if view.active_base not in self._segments:
            raise LogOfflineError(f"{self.path}: the active segment {segment_name(view.active_base)}"
                                  f"{LOG_SUFFIX} published by another process is missing")
        keys = list(self._segments.keys())
        for base, next_base in zip(keys, keys[1:]):
            segment = self._segments[base]
            segment.deactivate()
            segment.assume_next_offset(next_base)
        active = self._segments[view.active_base]
        if active.active:
            active.adopt(view)
        else:
            active.activate_shared(view)
        return active

    # ------------------------------------------------------------------ deletion
    def delete(self, doomed: list[LogSegment], in_order: bool = False) -> None:
        """Remove ``doomed`` (never the active segment) from the set: rename their files
        ``.deleted`` now, fsync the directory, unlink them after file_delete_delay_ms.

        Invariant: the caller made the new log start durable first, so a crash that keeps
        some of the renames and not others leaves a hole the reopened log starts past. Where
        the log start does not move (tiered storage: copied segments leave the local disk, their
        records stay readable remotely), the caller asks for ``in_order`` (``doomed`` oldest
        first): the directory is fsynced after each segment's renames, so a crash leaves a
        prefix of them deleted, never a hole between local segments.
        """
        for segment in doomed:
            if in_order and segment is not doomed[0]:
                _fileio.ops.fsync_dir(self.path)
            self._remove(segment.base_offset)
            segment.close(trim=False)
            names = []
            for path in segment.file_paths():
                if _fileio.ops.exists(path):
                    _fileio.ops.rename(path, path + DELETED_SUFFIX)
                    names.append(path + DELETED_SUFFIX)
            due = time.monotonic() + self._delete_delay_ms / 1000.0
            self._pending_deletes.append((due, names))
        _fileio.ops.fsync_dir(self.path)
        if self._delete_delay_ms == 0:
            self.unlink_due()
        elif self._timers_enabled:
            timer = threading.Timer(self._delete_delay_ms / 1000.0, self._deferred_unlink)
            timer.daemon = True
            self._timers.add(timer)
            timer.start()

    @property
    def deletes_pending(self) -> bool:
        return bool(self._pending_deletes)

    def _deferred_unlink(self) -> None:
        with self._lock:
            self._timers = {t for t in self._timers if t.is_alive() and t is not threading.current_thread()}
            if not self._closed:
                self.unlink_due()

    def unlink_due(self, everything: bool = False) -> None:
        """Unlink the ``.deleted`` files whose delay passed (all of them with ``everything``)."""
        now = time.monotonic()
        keep = []
        for due, names in self._pending_deletes:
            if everything or due <= now:
                for name in names:
                    try:
                        _fileio.ops.unlink(name)
                    except FileNotFoundError:
                        pass
            else:
                keep.append((due, names))
        self._pending_deletes = keep

    def delete_files_now(self, base: int) -> None:
        """Unlink the files of the segment at ``base`` (no longer in the set) at once."""
        stem = os.path.join(self.path, segment_name(base))
        for suffix in (LOG_SUFFIX, INDEX_SUFFIX, TIMEINDEX_SUFFIX, TXNINDEX_SUFFIX):
            if _fileio.ops.exists(stem + suffix):
                _fileio.ops.unlink(stem + suffix)

    # ------------------------------------------------------------------ closing
    def cancel_timers(self) -> None:
        for timer in self._timers:
            timer.cancel()
        self._timers.clear()

    def close_all(self) -> None:
        """Trim and fsync every segment, then unlink every pending ``.deleted`` file."""
        self.points = None
        for segment in self._segments.values():
            segment.close(trim=True)
        self.unlink_due(everything=True)

    def abandon_all(self, closing: bool = False) -> None:
        """Release every map and descriptor without flushing (segments not closed yet are
        abandoned); with ``closing`` the set is done for good."""
        self.points = None
        for segment in self._segments.values():
            segment.abandon()
        if closing:
            self._closed = True
            self.active = None
        else:
            self._segments.clear()
            self.active = None
