"""Log compaction: the offset map, a pass over a segment set and its swap, each log's compaction, the cleaner thread.

Semantics (Kafka's): a record with key K at offset O is obsolete iff the log holds a record with
key K at an offset O' > O. A cleaning pass first indexes the dirty section of the log into an
:class:`OffsetMap` (key -> latest offset), then copies each record whose offset is the one the
map holds for its key. The map is bounded by a memory budget (``cleaner_dedupe_buffer_size``);
when the dirty section has more distinct keys than fit, the pass cleans the prefix that fit and
the next pass continues.

The map itself is mechanism in C (``ls_offset_map_*``): open addressing with linear probing
over 20-byte slots (the key's 128-bit xxh3 hash and its offset relative to the pass's first
dirty offset as 32 bits), so memory per distinct key is 20 bytes / load factor (22.2 bytes at
Kafka's default load factor of 0.9). A pass hands the map each batch's decoded rows: the keys are
hashed (xxh3_128, the xxhash package's digest) and put or looked up in C, 32 at a time with their
slots prefetched; batches whose records all survive are copied as they are, in runs, and only
batches that lose records are rebuilt.

:class:`LogCompaction` is one log's side of it, behind ``Log.compact``, ``Log.dirty_ratio`` and
``Log.needs_compaction``: where the dirty section starts (its entry in
``cleaner-offset-checkpoint``), whether the log needs a pass, running one under the log's locks,
and what the last pass did. The :class:`Cleaner` thread picks the dirtiest log that needs one.

Transactions, as Kafka's cleaner treats them (``CleanedTransactionMetadata``): a pass cleans no
further than the log's last stable offset, so an open transaction's records are never touched;
records of aborted transactions (the segments' ``.txnindex`` names them) are neither indexed
into the map nor kept; a COMMIT or ABORT marker is kept while the pass met records of its
transaction (an aborted transaction whose marker is kept keeps its entry in the cleaned
segment's ``.txnindex``), and once none are left it gets a delete horizon
(now + ``delete_retention_ms``) and goes at the first pass after it, as tombstones do.
"""

from __future__ import annotations

import functools
import logging
import mmap
import os
import struct
import threading
import time
from dataclasses import dataclass, replace
from weakref import WeakKeyDictionary
from typing import Any, Callable, Iterable, Mapping, Sequence

import xxhash

from . import _fileio
from ._native import check, ffi, lib
from .checkpoint import OffsetCheckpoints
from .errors import CorruptRecordError, LogstoreError
from .index import AbortedBatches, AbortedTxn, TransactionIndex
from .log.segments import LogSegments
from .records.batch import BatchBuilder, BatchHeader, Record, RecordDecoder, batch_headers
from .records.control import ControlType, read_control_record
from .segment import LogSegment
from .log.filenames import CLEANED_SUFFIX, DELETED_SUFFIX, LOG_SUFFIX, SWAP_SUFFIX, TXNINDEX_SUFFIX, segment_name

__all__ = ["OffsetMap", "key_hash", "Cleaner", "CleanerReport", "CleanerState", "LogCompaction", "build_offset_map",
           "clean_batches", "compact_segments", "dirty_bytes", "section_map_bytes", "oldest_dirty_timestamp", "earliest_delete_horizon"]

logger = logging.getLogger("logstore.cleaner")

SLOT_SIZE: int = lib.LS_OFFSET_MAP_SLOT_SIZE
HASH_SIZE: int = lib.LS_OFFSET_MAP_HASH_SIZE

#: The 128-bit key hash the map stores (xxh3_128, as the xxhash package computes it).
key_hash = xxhash.xxh3_128_digest


class OffsetMap:
    """Key -> latest offset over a fixed memory budget, for one cleaning pass.

    Args:
        memory_bytes: the budget; the map holds ``memory_bytes // 20`` slots.
        load_factor: the fraction of slots that may hold keys (Kafka's
            ``log.cleaner.io.buffer.load.factor``, default 0.9).
        base_offset: the smallest offset the map will hold (offsets are stored relative to
            it in 32 bits; put() stops at base_offset + 2**32 - 2).

    Keys are bytes (a compacted log has no null keys). Not thread-safe: one pass owns a map.
    """

    def __init__(self, memory_bytes: int, load_factor: float = 0.9, base_offset: int = 0) -> None:
        if isinstance(memory_bytes, bool) or not isinstance(memory_bytes, int):
            raise TypeError(f"memory_bytes must be an int, got {type(memory_bytes).__name__}")
        if memory_bytes < 2 * SLOT_SIZE:
            raise ValueError(f"memory_bytes must be at least {2 * SLOT_SIZE}, got {memory_bytes}")
        if not 0.0 < load_factor <= 1.0:
            raise ValueError(f"load_factor must be in (0, 1], got {load_factor}")
        self._memory = _map_memory(memory_bytes)
        self._map = ffi.new("ls_offset_map *")
        self._permille = max(1, round(load_factor * 1000))
        if base_offset < 0:
            raise ValueError(f"base_offset must be >= 0, got {base_offset}")
        self._base_offset = base_offset
        self.clear()

    @staticmethod
    def bytes_for(keys: int, load_factor: float = 0.9) -> int:
        """The memory of the smallest map whose max_size is at least ``keys``."""
        permille = max(1, round(load_factor * 1000))

        def max_size(capacity: int) -> int:  # as ls_offset_map_init computes it
            return min(capacity // 1000 * permille + capacity % 1000 * permille // 1000, capacity - 1)

        capacity = max(2, -(-max(keys, 0) * 1000 // permille))
        while max_size(capacity) < keys:
            capacity += 1
        return capacity * SLOT_SIZE

    def clear(self) -> None:
        """Forget every key (the memory is reused)."""
        check(lib.ls_offset_map_init(self._map, ffi.from_buffer(self._memory), len(self._memory), self._permille,
                                     self._base_offset))

    def __len__(self) -> int:
        return self._map.size

    @property
    def capacity(self) -> int:
        """Slots in the map."""
        return self._map.capacity

    @property
    def max_size(self) -> int:
        """Distinct keys the map accepts before put() stops."""
        return self._map.max_size

    @property
    def full(self) -> bool:
        """True when no more keys fit (the pass stops at the first key that does not)."""
        return self._map.size >= self._map.max_size

    @property
    def probes(self) -> int:
        """Slots examined so far by puts and gets (a measure of clustering)."""
        return self._map.probes

    @property
    def memory_bytes(self) -> int:
        """Bytes the map's slots take."""
        return len(self._memory)

    def put(self, keys: Sequence[bytes], offsets: Sequence[int]) -> int:
        """Record each key's offset in order (a later, larger offset wins).

        Returns how many (key, offset) pairs were recorded: fewer than given when the map
        filled up, in which case the caller cleans up to the first pair not recorded.
        """
        if len(keys) != len(offsets):
            raise ValueError(f"{len(keys)} keys but {len(offsets)} offsets")
        if not keys:
            return 0
        hashes = _hashes(keys)
        packed = ffi.new("int64_t[]", list(offsets))
        return check(lib.ls_offset_map_put(self._map, hashes, packed, len(keys)))

    def get(self, keys: Iterable[bytes]) -> list[int]:
        """The offset recorded for each key, -1 for a key not in the map."""
        keys = list(keys)
        if not keys:
            return []
        out = ffi.new("int64_t[]", len(keys))
        check(lib.ls_offset_map_get(self._map, _hashes(keys), out, len(keys)))
        return ffi.unpack(out, len(keys))

    def put_batches(self, decoder: RecordDecoder, buf: Any, start: int, end: int, first_offset: int,
                    end_offset: int, skipped: Sequence[tuple[int, int]] = (), path: str | None = None) -> int:
        """Record the key of every record of the batches in ``buf[start, end)`` (a segment's
        bytes from a batch boundary) with an offset in [first_offset, end_offset) and outside the
        ``skipped`` (first, last) offset ranges (sorted, disjoint), in order. The keys are hashed
        and recorded in C as the decoder hands over each batch's rows (validated, CRC included).

        Returns ``end_offset`` when every such record was recorded, else the offset of the first
        one the map could not take (the pass cleans up to there).

        Raises:
            CorruptRecordError: an invalid batch in the range.
        """
        stopped = ffi.new("int64_t *", -1)
        flat = [offset for pair in skipped for offset in pair]
        skip = ffi.new("int64_t[]", flat) if flat else ffi.NULL
        state = [-1]

        def sink(rows_buf: Any, rows: Any, n: int) -> None:
            if state[0] >= 0:
                return  # the map is full: the rest of the segment is not indexed
            with ffi.from_buffer(rows_buf) as ptr:
                check(lib.ls_offset_map_put_rows(self._map, ptr, len(rows_buf), rows, n, end_offset, skip,
                                                 len(flat) // 2, stopped), path)
            state[0] = stopped[0]

        _decode_rows(decoder, buf, start, end, sink, first_offset, end_offset, path)
        return end_offset if state[0] < 0 else state[0]

    def classify_batches(self, decoder: RecordDecoder, buf: Any, start: int, end: int, end_offset: int,
                         path: str | None = None) -> bytes:
        """One code per record of the batches in ``buf[start, end)`` whose base offset is below
        ``end_offset``, in order (``records_count`` codes per data batch, none for a control
        batch): ``LS_ROW_OBSOLETE`` (a later record of its key lies below end_offset),
        ``LS_ROW_LIVE``, ``LS_ROW_TOMBSTONE`` (a null value below end_offset) or
        ``LS_ROW_TOMBSTONE_PAST_END``. Keys are hashed and looked up in C as the decoder hands
        over each batch's rows (validated, CRC included).

        Raises:
            CorruptRecordError: an invalid batch in the range.
        """
        codes = bytearray()

        def sink(rows_buf: Any, rows: Any, n: int) -> None:
            chunk = bytearray(n)
            with ffi.from_buffer(rows_buf) as ptr, ffi.from_buffer(chunk) as out:
                check(lib.ls_offset_map_classify_rows(self._map, ptr, len(rows_buf), rows, n, end_offset,
                                                      ffi.cast("int8_t *", out)), path)
            codes.extend(chunk)

        _decode_rows(decoder, buf, start, end, sink, 0, end_offset, path)
        return bytes(codes)


def section_map_bytes(offsets: int, budget: int) -> int:
    """The memory of a pass's offset map for a dirty section of ``offsets`` offsets, within
    ``budget`` bytes (``log.cleaner.dedupe.buffer.size``).

    Room for twice the keys the section could hold: a section of distinct keys then fills its
    map to half the load factor at most, where looking up a key the map lacks (each key of the
    clean section before it, and of the dirty part past a full map) ends within a few probes; at
    the full 0.9 such a lookup walks ~50 slots. No bigger than that: a small section takes little
    memory to zero. With the budget smaller, the map fills exactly when the budget's would have.
    """
    return min(budget, OffsetMap.bytes_for(2 * offsets))


def _map_memory(size: int) -> Any:
    """Zeroed memory for a map: anonymous pages, in huge pages where the kernel offers them on
    request (a key's slot is a random place in tens of MB: 4 KiB pages would miss the TLB at
    almost every key)."""
    memory = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)  # shared memory gets no huge pages
    if hasattr(mmap, "MADV_HUGEPAGE"):
        try:
            memory.madvise(mmap.MADV_HUGEPAGE)
        except OSError:
            pass  # no transparent huge pages here: 4 KiB pages work, only slower
    return memory


def _decode_rows(decoder: RecordDecoder, buf: Any, start: int, end: int, sink: Callable[[Any, Any, int], None],
                 min_offset: int, max_offset: int, path: str | None) -> None:
    """decoder.decode_columns over ``buf[start, end)``, raising for an invalid batch as
    decode_keys does (the decode from the bad batch reports it)."""
    position = decoder.decode_columns(buf, start, end, sink, min_offset, max_offset, path)
    if decoder.last_stop == lib.LS_STOP_ERROR:
        decoder.decode_keys(buf, position, end, min_offset, max_offset, path)
        raise CorruptRecordError(path, position, "batch offsets go backwards")


def _hashes(keys: Sequence[bytes]) -> bytes:
    try:
        return b"".join(map(key_hash, keys))
    except TypeError:
        bad = next(k for k in keys if not isinstance(k, (bytes, bytearray, memoryview)))
        raise TypeError(f"offset map keys must be bytes, got {type(bad).__name__}") from None


# ====================================================================== one cleaning pass
@dataclass(frozen=True)
class CleanerReport:
    """What one compaction pass did (returned by ``Log.compact()``)."""

    bytes_read: int = 0
    bytes_written: int = 0
    records_kept: int = 0
    records_dropped: int = 0
    tombstones_dropped: int = 0
    duration_s: float = 0.0
    first_dirty_offset: int = 0
    cleaned_up_to: int = 0
    segments_cleaned: int = 0


@dataclass(frozen=True)
class CleanerState:
    """Per-log cleaner health: when it last ran, what it did, and why it stopped (if it did)."""

    last_run_ms: int | None = None
    last_report: CleanerReport | None = None
    uncleanable_reason: str | None = None


class LogCompaction:
    """One log's compaction: its first dirty offset, whether it needs a pass, running one.

    Args:
        key: the log's (topic, partition), its key in the checkpoint file.
        checkpoints: the log directory's ``cleaner-offset-checkpoint`` file.

    The owning :class:`~logstore.log.log.Log` calls every method with its lock held (a pass
    also with its writers' lock) and hands over what the method reads: its segments, log
    start and config. Thread-safety: as the log's lock; :attr:`state` is replaced whole,
    never changed in place.
    """

    def __init__(self, key: tuple[str, int], checkpoints: OffsetCheckpoints) -> None:
        self.key = key
        self.checkpoints = checkpoints
        #: the cleaner's view of the log: last run, last report, uncleanable reason
        self.state = CleanerState()
        #: passes run since the log was opened
        self.runs = 0

    def first_dirty_offset(self, log_start_offset: int) -> int:
        """Where the dirty section starts: the checkpointed offset, or the log start if later."""
        return max(self.checkpoints.get(self.key) or 0, log_start_offset)

    def compact(self, segments: LogSegments, config: Any, decoder: RecordDecoder, builder: BatchBuilder,
                log_start_offset: int, now_ms: int | None,
                producers_last_batches: Callable[[], dict[int, int]],
                last_stable_offset: Callable[[], int] | None = None) -> CleanerReport:
        """Log.compact: one pass (:func:`compact_segments`) from the first dirty offset, then
        the checkpoint of where the next one starts. ``producers_last_batches`` gives producer
        id -> last offset of its last batch (asked only when a pass would drop a batch that
        carries a producer id, at most once); the pass cleans nothing at or past
        ``last_stable_offset()`` (asked only when the dirty section holds a transactional batch)."""
        started = time.monotonic()
        now = time.time_ns() // 1_000_000 if now_ms is None else now_ms
        first_dirty = self.first_dirty_offset(log_start_offset)
        report = compact_segments(segments, config, decoder, builder, first_dirty, now, started,
                                  functools.cache(producers_last_batches), last_stable_offset)
        if report.cleaned_up_to > first_dirty:
            self.checkpoints.update({self.key: report.cleaned_up_to})
        self.runs += 1
        self.state = replace(self.state, last_run_ms=now, last_report=report)
        return report

    def dirty_ratio(self, segments: LogSegments, log_start_offset: int) -> float:
        """Log.dirty_ratio: dirty over all bytes of the sealed segments."""
        dirty, total = dirty_bytes(segments, self.first_dirty_offset(log_start_offset))
        return dirty / total if total else 0.0

    def eligible(self, config: Any) -> bool:
        """A compacted log not marked uncleanable: the cleaner may pick it at all."""
        return bool(config.compacted) and self.state.uncleanable_reason is None

    def needs_compaction(self, segments: LogSegments, config: Any, log_start_offset: int,
                         now_ms: int | None) -> bool:
        """Log.needs_compaction: the dirty ratio, the oldest dirty segment's age, or a passed
        delete horizon (KIP-534) says so, for an :meth:`eligible` log."""
        now = time.time_ns() // 1_000_000 if now_ms is None else now_ms
        if not self.eligible(config):
            return False
        ratio = self.dirty_ratio(segments, log_start_offset)
        if ratio > 0 and ratio >= config.min_cleanable_dirty_ratio:
            return True
        first_dirty = self.first_dirty_offset(log_start_offset)
        oldest = oldest_dirty_timestamp(segments, first_dirty)
        if oldest is not None and now - oldest > config.max_compaction_lag_ms:
            return True
        horizon = earliest_delete_horizon(segments, first_dirty)
        return horizon is not None and horizon <= now

    def mark_uncleanable(self, reason: str) -> None:
        """Keep the cleaner away from this log until it is reopened (Kafka's KIP-346)."""
        self.state = replace(self.state, uncleanable_reason=reason)


class Cleaner:
    """The background cleaner: a thread that, every ``interval_s``, compacts the registered log
    with the highest dirty ratio among those that need it (see ``Log.needs_compaction``).

    An error while cleaning one log marks that log uncleanable (Kafka's KIP-346) and the
    cleaner carries on with the others. Logs are registered with :meth:`add`; anything with
    ``needs_compaction()``, ``dirty_ratio()``, ``compact()`` and ``mark_uncleanable()`` works.
    Thread-safe; :meth:`stop` waits for a running pass to finish.
    """

    def __init__(self, interval_s: float = 15.0) -> None:
        self.interval_s = interval_s
        self._logs: list[Any] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def add(self, log: Any) -> None:
        """Let the cleaner pick ``log`` from now on."""
        with self._lock:
            if log not in self._logs:
                self._logs.append(log)

    def remove(self, log: Any) -> None:
        """Stop considering ``log`` (it is being closed or deleted)."""
        with self._lock:
            if log in self._logs:
                self._logs.remove(log)

    def run_once(self, now_ms: int | None = None) -> CleanerReport | None:
        """Clean the dirtiest log that needs it; returns its report, or None if none did."""
        with self._lock:
            logs = list(self._logs)
        candidates = []
        for log in logs:
            try:
                if log.needs_compaction(now_ms):
                    candidates.append((log.dirty_ratio(), log))
            except LogstoreError:
                continue  # closed or offline: nothing to clean
        if not candidates:
            return None
        _, log = max(candidates, key=lambda c: c[0])
        try:
            return log.compact(now_ms)
        except Exception as exc:  # noqa: BLE001 - one log's failure must not stop the cleaner
            log.mark_uncleanable(f"{type(exc).__name__}: {exc}")
            return None

    def start(self) -> None:
        """Start the background thread (a daemon)."""
        if self._thread is not None:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="logstore-cleaner", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the background thread and wait for it."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                while not self._stop.is_set() and self.run_once() is not None:
                    pass
            except Exception:  # noqa: BLE001 - keep the thread alive, say why
                logger.exception("cleaner pass failed")


def dirty_bytes(segments: LogSegments, first_dirty: int) -> tuple[int, int]:
    """(dirty, total) bytes of the sealed segments: dirty ones end past ``first_dirty``."""
    sealed = segments.sealed()
    total = sum(s.size for s in sealed)
    dirty = sum(s.size for s in sealed if s.next_offset > first_dirty)
    return dirty, total


def oldest_dirty_timestamp(segments: LogSegments, first_dirty: int) -> int | None:
    """The max timestamp of the oldest sealed segment past ``first_dirty`` (None: none)."""
    for segment in segments.sealed():
        if segment.next_offset > first_dirty:
            return segment.max_timestamp
    return None


def earliest_delete_horizon(segments: LogSegments, first_dirty: int) -> int | None:
    """The earliest delete horizon among the batches of the clean section (wholly below
    ``first_dirty``) that carry one, or None. A batch carries a horizon iff a pass kept a
    tombstone in it; once the horizon passes, the tombstones go (Kafka's KIP-534), even when
    nothing is dirty."""
    earliest = None
    for segment in segments.sealed():
        if segment.base_offset >= first_dirty:
            break
        for horizon, last_offset, _ in _horizon_batches(segment):
            if last_offset < first_dirty and (earliest is None or horizon < earliest):
                earliest = horizon
    return earliest


#: sealed segment -> [(delete horizon, last offset, is a control batch)] of its batches that
#: carry a horizon. A sealed segment's batches never change while its object lives (a pass
#: swaps in a new one).
_HORIZONS: "WeakKeyDictionary[LogSegment, list[tuple[int, int, bool]]]" = WeakKeyDictionary()
_HORIZONS_LOCK = threading.Lock()


def _horizon_batches(segment: LogSegment) -> list[tuple[int, int, bool]]:
    with _HORIZONS_LOCK:
        found = _HORIZONS.get(segment)
    if found is None:
        found = [(header.base_timestamp, header.base_offset + header.last_offset_delta,
                  bool(header.attributes & lib.LS_ATTR_CONTROL))
                 for _, header in _batches(segment) if header.attributes & lib.LS_ATTR_DELETE_HORIZON]
        with _HORIZONS_LOCK:
            _HORIZONS[segment] = found
    return found


def compact_segments(segments: LogSegments, config: Any, decoder: RecordDecoder, builder: BatchBuilder,
                     first_dirty: int, now: int, started: float,
                     last_batches: Callable[[], Mapping[int, int]] | None = None,
                     last_stable_offset: Callable[[], int] | None = None) -> CleanerReport:
    """One compaction pass over the sealed segments of ``segments`` from ``first_dirty`` on.

    The dirty section ends at the active segment, or earlier at the first segment holding
    records younger than min_compaction_lag_ms, at ``last_stable_offset()`` (an open
    transaction's records stay as they are), or where the offset map filled up. The last stable
    offset is asked for only when the dirty section holds a transactional batch: an open
    transaction starts in it or later (earlier passes stopped at the LSO of their time), so
    without one the LSO lies past it. Segments
    from the oldest through the one holding the end of the section are rewritten, grouping
    neighbours while their total stays under segment_bytes, and swapped in (:func:`swap_in`).
    With nothing dirty, the segments of the clean section holding tombstones whose delete
    horizon passed are rewritten without them. The report's ``cleaned_up_to`` is the new first
    dirty offset; the caller checkpoints it. ``last_batches()`` (producer id -> last offset of its
    last batch) names the batches kept even when emptied (see :func:`clean_batches`).
    """
    sealed = segments.sealed()
    nothing = CleanerReport(first_dirty_offset=first_dirty, cleaned_up_to=first_dirty)
    if not config.compacted or not sealed:
        return nothing
    # Segments holding records younger than min_compaction_lag_ms are not cleanable yet.
    dirty_end = segments.last.base_offset
    for segment in sealed if config.min_compaction_lag_ms > 0 else ():
        if segment.next_offset > first_dirty and segment.max_timestamp > now - config.min_compaction_lag_ms:
            dirty_end = segment.base_offset
            break
    if last_stable_offset is not None and _holds_transactional(sealed, first_dirty, dirty_end):
        dirty_end = min(dirty_end, last_stable_offset())
    end = first_dirty
    aborted = segments.aborted_transactions(sealed[0].base_offset, max(dirty_end, first_dirty))
    if first_dirty < dirty_end:
        memory = section_map_bytes(dirty_end - first_dirty, config.cleaner_dedupe_buffer_size)
        offset_map = OffsetMap(memory, base_offset=first_dirty)
        end = build_offset_map(sealed, decoder, offset_map, first_dirty, dirty_end, aborted)
    groups: list[list[LogSegment]] = []
    if end > first_dirty:
        groups = _groups(sealed, end, config.segment_bytes)
    else:
        # Nothing dirty: an empty map keeps every record, so the pass drops exactly the
        # tombstones and markers whose horizon passed, in the segments that hold them (from
        # the log's start through them, when a marker is among them: whether its transaction
        # left records is known only from its start).
        offset_map = OffsetMap(2 * SLOT_SIZE, base_offset=first_dirty)
        marker_due = False
        for segment in sealed:
            if segment.base_offset >= first_dirty:
                break
            due = [(h, last, marker) for h, last, marker in _horizon_batches(segment) if h <= now and last < first_dirty]
            if due:
                groups.append([segment])
                marker_due = marker_due or any(marker for _, _, marker in due)
        if marker_due:
            groups = _groups(sealed, groups[-1][-1].next_offset, config.segment_bytes)
        if not groups:
            return nothing
    read = written = kept = dropped = tombstones = 0
    transactions = _Transactions(aborted)
    for group in groups:
        data = bytearray()
        r, k, d, t = clean_batches(group, decoder, builder, offset_map, end, now, config.delete_retention_ms, data,
                                   last_batches, transactions)
        read, kept, dropped, tombstones = read + r, kept + k, dropped + d, tombstones + t
        written += len(data)
        # The group's aborted transactions whose markers lie at or past the end were not
        # cleaned: their markers are copied as they are, and so are their index entries.
        carried = [t for segment in group for t in segment.txn_index.entries if t.last_offset >= end]
        swap_in(segments, group, data, transactions.take_retained() + carried)
    return CleanerReport(read, written, kept, dropped, tombstones, time.monotonic() - started,
                         first_dirty, end, sum(len(g) for g in groups))


def _holds_transactional(sealed: Sequence[LogSegment], start: int, end: int) -> bool:
    """Whether a batch of the sealed segments in [start, end) is transactional (a header walk)."""
    for segment in sealed:
        if segment.next_offset <= start or segment.size == 0:
            continue
        if segment.base_offset >= end:
            return False
        for _, header in batch_headers(segment.buffer, segment.find_position(max(start, segment.base_offset)),
                                       segment.size):
            if header.base_offset >= end:
                return False
            if header.attributes & lib.LS_ATTR_TRANSACTIONAL:
                return True
    return False


def _groups(sealed: Sequence[LogSegment], end: int, segment_bytes: int) -> list[list[LogSegment]]:
    """The sealed segments below ``end`` from the oldest, grouped while a group stays within
    ``segment_bytes`` (each group becomes one segment)."""
    groups: list[list[LogSegment]] = []
    total = 0
    for segment in sealed:
        if segment.base_offset >= end:
            break
        if groups and total + segment.size <= segment_bytes:
            groups[-1].append(segment)
            total += segment.size
        else:
            groups.append([segment])
            total = segment.size
    return groups


def swap_in(segments: LogSegments, group: list[LogSegment], data: bytearray,
            aborted: Sequence[AbortedTxn] = ()) -> None:
    """Replace ``group`` by one segment holding ``data`` (and ``aborted`` as its transaction
    index): .cleaned, .swap, old .deleted, live.

    Invariant: at every step the files on disk describe the log before the swap or after it,
    whatever order unsynced directory operations reach the disk. The rename of the ``.log.swap``
    is the commit point: before it, the open-time completion of a ``.log.swap`` renames every
    ``.swap`` file of its base (the ``.txnindex.swap`` with the log); after it (durably), the
    ``.txnindex.swap`` follows, and the open adopts a ``.txnindex.swap`` without a ``.log.swap``
    only while the old ``<base>.log.deleted`` shows the commit happened (else it drops it).
    A pass that fails before the old segments are touched removes the files it made.
    """
    ops = _fileio.ops
    directory = segments.path
    segments.on_layout_change()
    base = group[0].base_offset
    live = os.path.join(directory, segment_name(base) + LOG_SUFFIX)
    cleaned, swap = live + CLEANED_SUFFIX, live + SWAP_SUFFIX
    txn_live = os.path.join(directory, segment_name(base) + TXNINDEX_SUFFIX)
    txn_cleaned, txn_swap = txn_live + CLEANED_SUFFIX, txn_live + SWAP_SUFFIX
    if ops.exists(txn_swap):
        # An earlier pass at this base failed without removing it: this swap must not take it.
        ops.unlink(txn_swap)
        ops.fsync_dir(directory)
    try:
        if aborted:
            ops.write_new_file(txn_cleaned, b"".join(TransactionIndex.ENTRY.pack(TransactionIndex.VERSION, *t)
                                                     for t in aborted))
            ops.rename(txn_cleaned, txn_swap)
        ops.write_new_file(cleaned, data)
        ops.rename(cleaned, swap)
        ops.fsync_dir(directory)
    except Exception:
        _remove_quietly((txn_cleaned, txn_swap, cleaned, swap))
        raise
    names = []
    for segment in group:
        segments.pop(segment.base_offset)
        segment.close(trim=False)
        for path in segment.file_paths():
            if ops.exists(path):
                ops.rename(path, path + DELETED_SUFFIX)
                names.append(path + DELETED_SUFFIX)
    # The renames above must be durable before the one below: a file system may persist
    # directory operations in any order between fsyncs, and a live cleaned segment next to
    # an old segment it replaced would give offsets that go backwards. While the .swap
    # exists, the open-time completion deletes whatever old segment survived.
    ops.fsync_dir(directory)
    ops.rename(swap, live)
    if aborted:
        # The commit must be durable before the new .txnindex goes live: next to a .log.swap,
        # the open would take it for the old segment's and delete it.
        ops.fsync_dir(directory)
        ops.rename(txn_swap, txn_live)
    ops.fsync_dir(directory)
    segment = LogSegment.open(directory, base, **segments.settings)
    segment.rebuild_indexes(reason=None)
    segments.swap_in_place(segment)
    for name in names:
        ops.unlink(name)


def _remove_quietly(paths: Iterable[str]) -> None:
    """Unlink those of ``paths`` that exist, logging (not raising) a failure: the caller is
    already failing with the error that matters, and the open drops what stays behind."""
    ops = _fileio.ops
    for path in paths:
        try:
            if ops.exists(path):
                ops.unlink(path)
        except OSError as exc:
            logger.warning("could not remove %s after a failed compaction pass: %s", path, exc)


def build_offset_map(segments: Sequence[LogSegment], decoder: RecordDecoder, offset_map: OffsetMap,
                     start: int, end: int, aborted: Sequence[AbortedTxn] = ()) -> int:
    """Index the records with offsets in [start, end) into ``offset_map``, oldest first, but
    those of the ``aborted`` transactions (Kafka's cleaner leaves them out: they never were).

    Returns the offset up to which the map is complete: ``end``, or the offset of the first
    record whose (new) key no longer fit, so that the pass cleans only what the map covers.
    """
    covered = AbortedBatches(list(aborted))
    for segment in segments:
        if segment.next_offset <= start or segment.base_offset >= end or segment.size == 0:
            continue
        position = segment.find_position(max(start, segment.base_offset))
        # A batch straddling `end` comes whole; its records from `end` on are not part of this pass.
        skipped = _aborted_batches(segment, position, end, covered) if covered else []
        stopped = offset_map.put_batches(decoder, segment.buffer, position, segment.size, start, end, skipped,
                                         segment.path)
        if stopped < end:
            return stopped
    return end


def _aborted_batches(segment: LogSegment, position: int, end: int, covered: AbortedBatches) -> list[tuple[int, int]]:
    """(first, last) offsets of the batches of ``segment`` from ``position`` (below ``end``)
    that belong to an aborted transaction."""
    out = []
    for _, header in batch_headers(segment.buffer, position, segment.size):
        if header.base_offset >= end:
            break
        if covered.covers(header.producer_id, header.base_offset, header.attributes):
            out.append((header.base_offset, header.last_offset))
    return out


class _Transactions:
    """What one pass knows of the transactions it walks through, in offset order (Kafka's
    CleanedTransactionMetadata): the aborted ones (from the ``.txnindex`` files), which
    producers' transactions it met records of, and the aborted transactions whose markers it
    keeps (the cleaned segment's index)."""

    def __init__(self, aborted: Sequence[AbortedTxn]) -> None:
        self._aborted = sorted(aborted, key=lambda t: (t.first_offset, t.last_offset))
        self._next = 0
        #: producer id -> [its aborted transaction, whether the pass met a batch of it]
        self._open_aborted: dict[int, list[Any]] = {}
        self._open_committed: set[int] = set()
        self._retained: list[AbortedTxn] = []

    def _reach(self, offset: int) -> None:
        while self._next < len(self._aborted) and self._aborted[self._next].first_offset <= offset:
            txn = self._aborted[self._next]
            self._open_aborted[txn.producer_id] = [txn, False]
            self._next += 1

    def data_batch(self, header: BatchHeader) -> bool:
        """A data batch: True when its records belong to an aborted transaction (dropped)."""
        if not header.attributes & lib.LS_ATTR_TRANSACTIONAL or header.producer_id < 0:
            return False
        self._reach(header.last_offset)
        found = self._open_aborted.get(header.producer_id)
        if found is not None and found[0].first_offset <= header.base_offset <= found[0].last_offset:
            found[1] = True
            return True
        self._open_committed.add(header.producer_id)
        return False

    def marker(self, header: BatchHeader, kind: int) -> bool:
        """A COMMIT or ABORT marker: True when its transaction left no record the pass met (the
        marker may go once its delete horizon passes)."""
        self._reach(header.last_offset)
        pid = header.producer_id
        if kind == ControlType.ABORT:
            found = self._open_aborted.pop(pid, None)
            if found is not None and found[1]:
                self._retained.append(found[0])
                return False
            return True
        if kind == ControlType.COMMIT:
            if pid in self._open_committed:
                self._open_committed.discard(pid)
                return False
            return True
        return False

    def take_retained(self) -> list[AbortedTxn]:
        """The aborted transactions whose markers the group just cleaned keeps (for its index)."""
        out, self._retained = self._retained, []
        return out


def clean_batches(segments: Sequence[LogSegment], decoder: RecordDecoder, builder: BatchBuilder,
                  offset_map: OffsetMap, end: int, now_ms: int, delete_retention_ms: int,
                  out: bytearray,
                  last_batches: Callable[[], Mapping[int, int]] | None = None,
                  transactions: _Transactions | None = None) -> tuple[int, int, int, int]:
    """Append to ``out`` the surviving batches of ``segments`` (oldest first).

    Survivors keep their offsets, timestamps, codec and producer fields. A tombstone survives
    until the delete horizon of its batch has passed; a batch holding tombstones gets a horizon
    (now + delete_retention_ms, attribute bit 6 with the horizon as base timestamp) the first
    time it is cleaned. A batch emptied entirely is dropped, except the group's last batch,
    which is kept as an empty batch so that the group still ends at the same offset, and an
    idempotent producer's last batch (its producer id maps to the batch's last offset in
    ``last_batches()``, called only when such a batch would be dropped), kept as Kafka's cleaner
    keeps it: the producer's state can still be rebuilt from the log (its epoch and last
    sequence), so that a retry of that batch is known as a duplicate even without a producer
    state snapshot. With ``transactions`` (the pass's view, in offset order), the records of
    aborted transactions are dropped and the markers treated as the module docstring says.

    Returns (bytes read, records kept, records dropped, tombstones dropped).
    """
    bytes_read = kept_n = dropped = tombstones = 0
    copy = _Copier(out)
    all_batches = [(segment, _batches(segment)) for segment in segments]
    # the group's last batch (kept even when emptied, so that the group ends where it did)
    last = max(((s, len(batches) - 1) for s, (_, batches) in enumerate(all_batches) if batches), default=None)
    for s, (segment, batches) in enumerate(all_batches):
        buf = segment.buffer
        # One decode of the segment's batches below `end`: a code per record, keys hashed and
        # looked up in C (see OffsetMap.classify_batches); Records are built only for a batch
        # that must be rewritten (most batches survive whole or not at all).
        codes = b""
        if batches and batches[0][1].base_offset < end:
            codes = offset_map.classify_batches(decoder, buf, 0, segment.size, end, segment.path)
        at = 0
        for b, (position, header) in enumerate(batches):
            bytes_read += header.size
            if header.base_offset >= end:
                copy(buf, position, header.size)
                continue
            horizon_set = bool(header.attributes & lib.LS_ATTR_DELETE_HORIZON)
            if header.attributes & lib.LS_ATTR_CONTROL:  # its record gets no code (reads pass over it)
                cleaned = _clean_control(buf, position, header, transactions, builder, now_ms, delete_retention_ms,
                                         last_batches, segment.path)
                if cleaned is None:
                    copy(buf, position, header.size)
                else:
                    copy.append(cleaned)
                continue
            n = header.records_count
            rows, at = codes[at:at + n], at + n
            expired = horizon_set and header.base_timestamp <= now_ms
            if transactions is not None and transactions.data_batch(header):
                n_keep, has_tombstone = 0, False  # an aborted transaction's records
            else:
                gone = rows.count(lib.LS_ROW_OBSOLETE)
                live_tombstones = rows.count(lib.LS_ROW_TOMBSTONE)
                if expired:
                    tombstones += live_tombstones
                    gone += live_tombstones
                    live_tombstones = 0
                n_keep = n - gone
                has_tombstone = live_tombstones + rows.count(lib.LS_ROW_TOMBSTONE_PAST_END) > 0
            kept_n += n_keep
            dropped += n - n_keep
            if n_keep == n and (horizon_set or not has_tombstone):
                copy(buf, position, header.size)  # unchanged: copy the bytes as they are
                continue
            if n_keep == 0 and (s, b) != last and not (
                    last_batches is not None and header.producer_id >= 0
                    and last_batches().get(header.producer_id) == header.base_offset + header.last_offset_delta):
                continue
            survivors = []
            if n_keep:
                records, _ = decoder.decode(buf, position, position + header.size, 0, -1, None, segment.path)
                dropped_codes = (lib.LS_ROW_OBSOLETE, lib.LS_ROW_TOMBSTONE) if expired else (lib.LS_ROW_OBSOLETE,)
                survivors = [record for record, code in zip(records, rows) if code not in dropped_codes]
            horizon = header.base_timestamp if horizon_set else now_ms + delete_retention_ms
            copy.append(_rebuild(builder, header, survivors, horizon if has_tombstone else None))
    copy.flush()
    return bytes_read, kept_n, dropped, tombstones


class _Copier:
    """Appends to a pass's output: runs of neighbouring batches copied as they are go in as one
    slice of their segment's bytes, rebuilt batches as given."""

    def __init__(self, out: bytearray) -> None:
        self._out = out
        self._buf: Any = None
        self._start = self._end = 0

    def __call__(self, buf: Any, position: int, size: int) -> None:
        """Copy buf[position, position + size) (after whatever came before)."""
        if buf is self._buf and position == self._end:
            self._end += size
            return
        self.flush()
        self._buf, self._start, self._end = buf, position, position + size

    def append(self, data: bytes) -> None:
        """Append rebuilt bytes."""
        self.flush()
        self._out += data

    def flush(self) -> None:
        """Write out the pending run."""
        if self._buf is not None and self._end > self._start:
            with memoryview(self._buf) as view:
                self._out += view[self._start:self._end]
        self._buf = None
        self._start = self._end = 0


def _clean_control(buf: Any, position: int, header: BatchHeader, transactions: _Transactions | None,
                   builder: BatchBuilder, now_ms: int, delete_retention_ms: int,
                   last_batches: Callable[[], Mapping[int, int]] | None, path: str) -> bytes | None:
    """What a pass writes for a control batch: a transaction marker whose transaction left no
    record gets a delete horizon, and goes once the horizon passed (kept empty when it is its
    producer's last batch); every other control batch is kept as it is (None: copy it whole)."""
    if (transactions is None or header.producer_id < 0
            or not header.attributes & lib.LS_ATTR_TRANSACTIONAL or header.records_count != 1):
        return None
    kind, value = read_control_record(buf, position, header.size, path)
    if kind not in (ControlType.ABORT, ControlType.COMMIT) or not transactions.marker(header, kind):
        return None
    if not header.attributes & lib.LS_ATTR_DELETE_HORIZON:
        key = _CONTROL_KEY.pack(0, kind)
        return builder.build([value], [key], [None], [header.max_timestamp], base_offset=header.base_offset,
                             partition_leader_epoch=header.partition_leader_epoch, producer_id=header.producer_id,
                             producer_epoch=header.producer_epoch, base_sequence=header.base_sequence,
                             last_offset_delta=header.last_offset_delta, control=True, transactional=True,
                             delete_horizon=now_ms + delete_retention_ms)
    if header.base_timestamp > now_ms:
        return None  # its horizon has not passed yet
    if last_batches is not None and last_batches().get(header.producer_id) == header.last_offset:
        return _empty_batch(header)
    return b""


_CONTROL_KEY = struct.Struct(">hh")


def _batches(segment: LogSegment) -> list[tuple[int, BatchHeader]]:
    return list(batch_headers(segment.buffer, 0, segment.size))


def _rebuild(builder: BatchBuilder, header: BatchHeader, records: list[Record], horizon: int | None) -> bytes:
    base = header.base_offset
    if not records:
        return _empty_batch(header)
    batch = bytearray(builder.build(
        [r.value for r in records], [r.key for r in records], [r.headers for r in records],
        [r.timestamp for r in records], codec=header.compression,
        timestamp_type=int(header.timestamp_type), base_offset=base,
        offset_deltas=[r.offset - base for r in records], last_offset_delta=header.last_offset_delta,
        partition_leader_epoch=header.partition_leader_epoch, producer_id=header.producer_id,
        producer_epoch=header.producer_epoch, base_sequence=header.base_sequence,
        transactional=bool(header.attributes & lib.LS_ATTR_TRANSACTIONAL),
        log_append_time=header.max_timestamp if header.timestamp_type else None,
        delete_horizon=horizon,
    ))
    return bytes(batch)


def _empty_batch(header: BatchHeader) -> bytes:
    """A batch with no records that keeps the source batch's offsets span (Kafka keeps these)."""
    batch = bytearray(lib.LS_BATCH_HEADER_SIZE)
    hdr = ffi.new("ls_batch_header *")
    hdr.base_offset = header.base_offset
    hdr.partition_leader_epoch = header.partition_leader_epoch
    hdr.attributes = header.attributes & ~lib.LS_ATTR_COMPRESSION_MASK & ~lib.LS_ATTR_DELETE_HORIZON
    hdr.last_offset_delta = header.last_offset_delta
    hdr.base_timestamp = header.base_timestamp
    hdr.max_timestamp = header.max_timestamp
    hdr.producer_id = header.producer_id
    hdr.producer_epoch = header.producer_epoch
    hdr.base_sequence = header.base_sequence
    hdr.records_count = 0
    check(lib.ls_batch_finish(ffi.from_buffer(batch), len(batch), hdr))
    return bytes(batch)
