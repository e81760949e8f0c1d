"""A store's remote tier (KIP-405): :class:`RemoteLogManager` and each partition's
:class:`RemotePartition`.

The manager is Kafka's RemoteLogManager for one store. It is given a RemoteStorageManager (the
object store) and a RemoteLogMetadataManager (the remote segments' facts, kept in
``__remote_log_metadata``), and is handed each log whose topic enables remote storage
(:meth:`RemoteLogManager.attach`). For each such log it:

* copies (:meth:`~RemoteLogManager.copy_segments`, Kafka's RLMCopyTask) every sealed segment
  whose records all lie below the high watermark and the last stable offset, oldest first, each
  under a new segment id: "COPY_SEGMENT_STARTED" durable, the upload, "COPY_SEGMENT_FINISHED"
  durable. A copy that fails is marked for deletion and retried from scratch later (with
  backoff while the object store is down); the local segment stays until a copy finishes.
* expires (:meth:`~RemoteLogManager.expire_segments`, Kafka's RLMExpirationTask) the remote
  segments past the topic's total retention (``retention.ms``, ``retention.bytes`` counting the
  local segments not yet copied) or below the log start (DeleteRecords): the log start moves past
  them durably first, then each goes through DELETE_SEGMENT_STARTED, the object store's delete
  and DELETE_SEGMENT_FINISHED. Copies a crash cut short (COPY_SEGMENT_STARTED and nobody copying)
  and deletions it cut short (DELETE_SEGMENT_STARTED) are finished the same way: no orphan stays.
* serves the log's reads below its local segments through a :class:`RemotePartition` (the log's
  :class:`~logstore.log.remote.RemoteTier`): the remote segment holding an offset, its offset
  index (cached, bounded by bytes), a ranged get of whole batches, every batch CRC-checked.

Crash safety: at every step of a copy or a deletion the records are readable from one of the two
tiers; the next run finishes or undoes what was cut short (see above).

Thread-safety: thread-safe. One background thread (``logstore-remote-log[<name>]``, when
:meth:`RemoteLogManager.start` ran) runs the tasks every ``task_interval_ms``; a partition's copy
and expiration hold that partition's task lock; reads take no lock but the index cache's.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections import OrderedDict
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable

from .._native import lib
from ..errors import CorruptRecordError, LogClosedError, LogstoreError, RemoteResourceNotFoundError, RemoteStorageError
from ..index import AbortedTxn, collect_aborted, offset_index_lookup, parse_txn_entries, time_index_lookup
from ..log.remote import CopyableSegment, RemoteTier
from ..records.batch import HEADER_SIZE, RecordDecoder, parse_header, validate_batch
from .metadata import (
    IndexType,
    LogSegmentData,
    RemoteLogSegmentId,
    RemoteLogSegmentMetadata,
    RemoteLogSegmentMetadataUpdate,
    RemoteLogSegmentState,
    RemotePartitionDeleteMetadata,
    RemotePartitionDeleteState,
    TopicIdPartition,
)
from .rlmm import RemoteLogMetadataManager
from .storage import RemoteStorageManager

__all__ = ["RemoteLogManager", "RemoteLogManagerConfig", "RemotePartition", "RemoteIndexCache", "RemoteSegmentReader",
           "ReadAheadBuffers"]

logger = logging.getLogger(__name__)

STARTED = RemoteLogSegmentState.COPY_SEGMENT_STARTED
FINISHED = RemoteLogSegmentState.COPY_SEGMENT_FINISHED
DELETE_STARTED = RemoteLogSegmentState.DELETE_SEGMENT_STARTED
DELETE_FINISHED = RemoteLogSegmentState.DELETE_SEGMENT_FINISHED
#: threads of the sequential readers' read-ahead (each holds one range in flight at a time)
READ_AHEAD_THREADS = 4
#: the least a sequential reader's ranged get asks for. Measured on SeaweedFS on loopback (64
#: MiB of 200 KB batches read in 1 MiB reads): ranges of 1 MiB 0.35 s, 2 MiB 0.27-0.30 s,
#: 4 MiB 0.21-0.23 s, 8 MiB 0.23 s (an object store's cost is per request as much as per byte)
READ_AHEAD_BYTES = 4 << 20
#: what a remote log manager's sequential readers keep between reads, in all (tails and ranges
#: fetched ahead): 16 partitions read at once at full speed, more with smaller ranges
READ_AHEAD_BUFFER_BYTES = 64 << 20


@dataclass(frozen=True)
class RemoteLogManagerConfig:
    """The store's remote tier settings, by Kafka's broker config names.

    Attributes:
        task_interval_ms: ``remote.log.manager.task.interval.ms``: how often each partition's
            copy and expiration run (Kafka's default 30 s).
        fetch_max_wait_ms: ``remote.fetch.max.wait.ms``: how long a Kafka fetch waits for a
            remote read before it answers with what it has.
        index_cache_size_bytes: ``remote.log.index.file.cache.total.size.bytes``: the bound of
            the remote indexes kept in memory (Kafka's default 1 GiB).
        retry_backoff_ms, retry_backoff_max_ms: ``remote.log.manager.task.retry.backoff.ms`` and
            ``.max.ms``: a partition whose copy failed waits this long (doubling, with 20%
            jitter) before it tries again.
        broker_id: the node named in the metadata events (0 for a store that is no replica set).
    """

    task_interval_ms: int = 30_000
    fetch_max_wait_ms: int = 500
    index_cache_size_bytes: int = 1 << 30
    retry_backoff_ms: int = 500
    retry_backoff_max_ms: int = 30_000
    broker_id: int = 0

    def __post_init__(self) -> None:
        for name in ("task_interval_ms", "fetch_max_wait_ms", "retry_backoff_ms", "retry_backoff_max_ms"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.index_cache_size_bytes < 1:
            raise ValueError(f"index_cache_size_bytes must be >= 1, got {self.index_cache_size_bytes}")


class RemoteIndexCache:
    """The remote segments' indexes a reader fetched, by (segment id, index type), least
    recently used first out once their bytes pass ``max_bytes`` (Kafka's RemoteIndexCache, in
    memory). Thread-safe: one lock, never held while an index is fetched."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        self._entries: OrderedDict[tuple[Any, IndexType], bytes] = OrderedDict()
        self._bytes = 0
        self.hits = self.misses = 0

    def get(self, metadata: RemoteLogSegmentMetadata, index_type: IndexType,
            fetch: Callable[[RemoteLogSegmentMetadata, IndexType], bytes]) -> bytes:
        """The index, from the cache or fetched (outside the lock) and kept."""
        key = (metadata.segment_id.id, index_type)
        with self._lock:
            data = self._entries.get(key)
            if data is not None:
                self._entries.move_to_end(key)
                self.hits += 1
                return data
            self.misses += 1
        data = fetch(metadata, index_type)
        with self._lock:
            if key not in self._entries and len(data) <= self.max_bytes:
                self._entries[key] = data
                self._bytes += len(data)
                while self._bytes > self.max_bytes:
                    _, dropped = self._entries.popitem(last=False)
                    self._bytes -= len(dropped)
        return data

    def forget(self, segment_id: RemoteLogSegmentId) -> None:
        """Drop a deleted segment's indexes."""
        with self._lock:
            for index_type in IndexType:
                data = self._entries.pop((segment_id.id, index_type), None)
                if data is not None:
                    self._bytes -= len(data)

    @property
    def size_in_bytes(self) -> int:
        with self._lock:
            return self._bytes


class _Meter:
    """Totals behind the Kafka rate metrics of the remote tier (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.values: dict[str, int] = {name: 0 for name in (
            "RemoteCopyBytesPerSec", "RemoteCopyRequestsPerSec", "RemoteCopyErrorsPerSec",
            "RemoteFetchBytesPerSec", "RemoteFetchRequestsPerSec", "RemoteFetchErrorsPerSec",
            "RemoteDeleteRequestsPerSec", "RemoteDeleteErrorsPerSec")}

    def add(self, name: str, amount: int = 1) -> None:
        with self._lock:
            self.values[name] += amount

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self.values)


class RemoteSegmentReader:
    """The one read path of remote segments, for every reader: the store's logs (through
    :class:`RemotePartition`) and the read-only readers that have no store open (Spark's
    executors, the tools: :mod:`logstore.store.remoteview`). Given a segment's metadata, it
    answers whole batches from the one holding an offset (its offset index, cached, then one
    ranged get, each batch CRC-checked), the first offset at or after a timestamp, and the
    aborted transactions of the segments' transaction indexes.

    Args:
        rsm: the object store's RemoteStorageManager (not closed here).
        cache: the indexes fetched, shared with other readers or not.
        count: called with a metric's name and an amount for each fetch (Kafka's
            ``RemoteFetchBytesPerSec``, ``RemoteFetchRequestsPerSec``), or None.

    Thread-safety: thread-safe (the cache has its lock; nothing else is kept).
    """

    def __init__(self, rsm: RemoteStorageManager, cache: RemoteIndexCache,
                 count: Callable[[str, int], None] | None = None) -> None:
        self.rsm = rsm
        self.cache = cache
        self._count = count

    def index(self, metadata: RemoteLogSegmentMetadata, index_type: IndexType) -> bytes:
        """One of the segment's indexes, from the cache or fetched."""
        return self.cache.get(metadata, index_type, self.rsm.fetch_index)

    def fetch(self, metadata: RemoteLogSegmentMetadata, start: int, end: int) -> bytes:
        """Bytes [start, end) of the segment's ``.log`` (end clipped to its size).

        Raises:
            RemoteStorageError: the object store failed, or answered fewer bytes.
        """
        end = min(end, metadata.segment_size_in_bytes)
        if end <= start:
            return b""
        data = self.rsm.fetch_log_segment(metadata, start, end - 1)
        if self._count is not None:
            self._count("RemoteFetchBytesPerSec", len(data))
            self._count("RemoteFetchRequestsPerSec", 1)
        if len(data) != end - start:
            raise RemoteStorageError(f"{metadata.describe()}: asked for bytes {start}..{end} and got {len(data)}")
        return data

    def read_batches(self, metadata: RemoteLogSegmentMetadata, offset: int, max_bytes: int) -> bytes:
        """Whole batches of ``metadata`` from the one holding ``offset`` (or the first after
        it): about ``max_bytes``, at least one batch, each validated (CRC included); b"" when
        the segment holds nothing at or after ``offset``.

        Raises:
            RemoteStorageError: the object store failed, or a batch fails its checks (the
                message names the remote segment and the byte).
        """
        found = self.batches_view(metadata, offset, max_bytes)
        return found.obj if len(found) == len(found.obj) else bytes(found)  # type: ignore[return-value]

    def batches_view(self, metadata: RemoteLogSegmentMetadata, offset: int, max_bytes: int) -> memoryview:
        """:meth:`read_batches`'s batches as a view of the fetched bytes, without the copy a
        slice of them would take (a scan's ranged gets end inside a batch, which the next one
        fetches again: a copy of every byte, a quarter of the remote read's time)."""
        _, position = offset_index_lookup(self.index(metadata, IndexType.OFFSET), metadata.start_offset, offset)
        want = max(max_bytes, HEADER_SIZE)
        data, start, end, _, _ = self._walk(metadata, offset, want, position,
                                            self.fetch(metadata, position, position + want))
        return memoryview(data)[start:end]

    def read_on(self, metadata: RemoteLogSegmentMetadata, offset: int, max_bytes: int,
                tail: tuple[int, int, bytes] | None,
                more: Callable[[int, int], bytes]) -> tuple[bytes, tuple[int, int, bytes] | None, bool]:
        """:meth:`read_batches` for a sequential reader, which goes on where its last read
        stopped: ``tail`` is (position, the offset of the batch starting there, bytes) that a
        read of this segment fetched past its whole batches, or None; it is used when it starts
        at or before the batch holding ``offset`` and at or after the offset index's floor
        (every batch before it ends below ``offset``), followed by ``more(position, want)`` when
        it holds fewer than ``max_bytes``. Returns (the batches, the tail of this read or None,
        whether ``tail`` was used)."""
        _, position = offset_index_lookup(self.index(metadata, IndexType.OFFSET), metadata.start_offset, offset)
        size = metadata.segment_size_in_bytes
        want = max(max_bytes, HEADER_SIZE)
        sequential = tail is not None and tail[1] <= offset and tail[0] >= position
        if sequential:
            position, data = tail[0], tail[2]  # type: ignore[index]
            if len(data) < want and position + len(data) < size:
                data = data + more(position + len(data), want)
        else:
            data = self.fetch(metadata, position, position + want)
        data, start, end, base, after = self._walk(metadata, offset, want, position, data)
        left = (base + end, after, bytes(data[end:])) if end > start and len(data) > end else None
        return bytes(data[start:end]), left, sequential

    def _walk(self, metadata: RemoteLogSegmentMetadata, offset: int, want: int, base: int,
              data: bytes) -> tuple[bytes, int, int, int, int]:
        """The batches wanted in ``data`` (the segment's bytes from position ``base``, fetched
        on as needed): (data, start, end, base, the offset after the last batch) with
        ``data[start:end]`` the whole batches from the one holding ``offset``, at least one,
        about ``want`` bytes, each validated; start == end when the segment holds nothing at or
        after ``offset``."""
        size = metadata.segment_size_in_bytes
        start = 0  # where the batch looked at begins in data
        while True:
            if len(data) - start < HEADER_SIZE:
                at = base + start  # the next batch's position (past what was fetched, maybe)
                if at + HEADER_SIZE > size:
                    return data, 0, 0, base, offset  # nothing at or after offset in this segment
                base, data, start = at, self.fetch(metadata, at, at + want), 0
                continue
            header = parse_header(data, start)
            if header.size < HEADER_SIZE or base + start + header.size > size:
                raise RemoteStorageError(f"{metadata.describe()}: a batch at byte {base + start} claims "
                                         f"{header.size} bytes, past the segment's {size}")
            if header.last_offset >= offset:
                break
            start += header.size
        if start + header.size > len(data):  # the first batch wanted, whole
            data = data[start:] + self.fetch(metadata, base + len(data), base + start + header.size)
            base, start = base + start, 0
        end, after = start, offset
        while end + HEADER_SIZE <= len(data):
            header = parse_header(data, end)
            if header.size < HEADER_SIZE or end + header.size > len(data) or \
                    (end > start and end + header.size - start > want):
                break
            try:
                validate_batch(data, end, path=metadata.describe())
            except CorruptRecordError as exc:
                raise RemoteStorageError(f"{metadata.describe()}: {exc}") from exc
            end += header.size
            after = header.last_offset + 1
        return data, start, end, base, after

    def offset_for_timestamp(self, segments: list[RemoteLogSegmentMetadata], timestamp: int,
                             start_offset: int = 0) -> int | None:
        """The first offset at or above ``start_offset`` of ``segments`` (oldest first) whose
        record's timestamp is at or after ``timestamp`` (a segment whose newest record is older
        is skipped unread); None when none is that recent."""
        for metadata in segments:
            if metadata.max_timestamp_ms < timestamp or metadata.end_offset < start_offset:
                continue
            found = self._offset_in_segment(metadata, timestamp, start_offset)
            if found is not None:
                return found
        return None

    def _offset_in_segment(self, metadata: RemoteLogSegmentMetadata, timestamp: int, start_offset: int) -> int | None:
        """The first offset of ``metadata`` at or above ``start_offset`` whose record's
        timestamp is >= ``timestamp``."""
        entry_ts, entry_offset = time_index_lookup(self.index(metadata, IndexType.TIMESTAMP),
                                                   metadata.start_offset, timestamp - 1)
        # every record up to the entry's offset is at most entry_ts old, below timestamp
        offset = max(entry_offset if entry_ts >= 0 else metadata.start_offset, start_offset)
        decoder = RecordDecoder()
        while offset <= metadata.end_offset:
            raw = self.read_batches(metadata, offset, 1 << 20)
            if not raw:
                return None
            position = 0
            while position < len(raw):
                header = parse_header(raw, position)
                if header.max_timestamp >= timestamp and not header.attributes & lib.LS_ATTR_CONTROL:
                    records, _ = decoder.decode(raw, position, position + header.size, offset, header.last_offset + 1,
                                                None, metadata.describe())
                    for record in records:
                        if record.timestamp >= timestamp and record.offset >= start_offset:
                            return record.offset
                position += header.size
                offset = header.last_offset + 1
        return None

    def aborted_transactions(self, segments: list[RemoteLogSegmentMetadata], start: int,
                             upper: int) -> list[AbortedTxn]:
        """The aborted transactions the transaction indexes of ``segments`` (oldest first) list
        that overlap the offsets [start, upper): searched from the segment holding ``start`` on,
        past ``upper`` too (a transaction's entry is in the segment of its ABORT marker, which
        may come later than its records), until an entry's last stable offset shows that no
        later segment holds one (Kafka's collectAbortedTransactions), or the segments end.

        Raises:
            RemoteStorageError: the object store failed, or an index is damaged.
        """
        out: list[AbortedTxn] = []
        for metadata in segments:
            if metadata.txn_index_empty or metadata.end_offset < start:
                continue
            entries, damage = parse_txn_entries(self.index(metadata, IndexType.TRANSACTION), metadata.start_offset)
            if damage:
                raise RemoteStorageError(f"{metadata.describe()}: its transaction index: {damage}")
            found, complete = collect_aborted(entries, start, upper)
            out.extend(found)
            if complete:
                break
        return out


class ReadAheadBuffers:
    """What sequential readers of remote segments keep between their reads, per partition: the
    bytes a read fetched past its whole batches (its tail) and the range fetched ahead (its
    Future), at most ``max_bytes`` in all (a range in flight counts its size); the least
    recently used partitions' go first. Thread-safe: one lock, never held while fetching."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        #: partition -> [tail or None, ahead or None, bytes]
        self._entries: OrderedDict[TopicIdPartition, list[Any]] = OrderedDict()
        self._bytes = 0

    def take(self, tp: TopicIdPartition) -> tuple[Any, Any]:
        """(tail, ahead) of ``tp``, forgotten here (the reader puts back what it keeps)."""
        with self._lock:
            entry = self._entries.pop(tp, None)
            if entry is None:
                return None, None
            self._bytes -= entry[2]
            return entry[0], entry[1]

    def put(self, tp: TopicIdPartition, tail: Any, ahead: Any, nbytes: int) -> None:
        """Keep ``tail`` and ``ahead`` (``nbytes`` in all) for ``tp``'s next read, dropping the
        least recently used partitions' over the bound (``tp``'s own too if it alone is)."""
        with self._lock:
            old = self._entries.pop(tp, None)
            if old is not None:
                self._bytes -= old[2]
                if old[1] is not ahead:
                    _cancel(old[1])
            self._entries[tp] = [tail, ahead, nbytes]
            self._bytes += nbytes
            while self._bytes > self.max_bytes and self._entries:
                _, dropped = self._entries.popitem(last=False)
                self._bytes -= dropped[2]
                _cancel(dropped[1])  # (a range not fetched yet is not fetched for nobody)

    @property
    def size_in_bytes(self) -> int:
        with self._lock:
            return self._bytes


def _cancel(ahead: tuple[Any, int, Future] | None) -> None:
    """Cancel a read-ahead no reader will take (a no-op once it runs or ran)."""
    if ahead is not None:
        ahead[2].cancel()


class RemotePartition(RemoteTier):
    """One partition's remote segments as its log reads them (see the module docstring),
    through a :class:`RemoteSegmentReader`.

    A read keeps the bytes it fetched past its whole batches in ``buffers`` for the partition's
    next read. With ``read_ahead`` (an executor; None: none), once a reader reads sequentially
    (a read starts where the last one stopped) the next range of the segment, at least
    :data:`READ_AHEAD_BYTES`, is fetched in the background while the reader works on what it
    got, one range per partition at a time. ``buffers`` bounds what all this holds (None: a
    partition's own bound of :data:`READ_AHEAD_BUFFER_BYTES`). Thread-safe."""

    def __init__(self, tp: TopicIdPartition, rsm: RemoteStorageManager, rlmm: RemoteLogMetadataManager,
                 cache: RemoteIndexCache, meter: _Meter, read_ahead: Executor | None = None,
                 buffers: ReadAheadBuffers | None = None) -> None:
        self.tp = tp
        self._rlmm = rlmm
        self._meter = meter
        self._reader = RemoteSegmentReader(rsm, cache, meter.add)
        self._read_ahead = read_ahead
        #: tail: (segment id, the position of the bytes a read fetched past its whole batches,
        #: the offset of the batch starting there, the bytes); ahead: (segment id, its position,
        #: the Future of its bytes)
        self._buffers = buffers if buffers is not None else ReadAheadBuffers(READ_AHEAD_BUFFER_BYTES)

    def start_offset(self) -> int | None:
        self._rlmm.catch_up()  # (another process of a shared store may have copied)
        return self._rlmm.remote_log_start_offset(self.tp)

    def copied_through(self) -> int:
        end = self._rlmm.remote_log_end_offset(self.tp)
        return -1 if end is None else end

    def size_in_bytes(self) -> int:
        return self._rlmm.remote_log_size(self.tp)

    def max_timestamp(self) -> int:
        return max((m.max_timestamp_ms for m in self.finished_segments()), default=-1)

    def finished_segments(self) -> list[RemoteLogSegmentMetadata]:
        """The readable remote segments, oldest first."""
        return [m for m in self._rlmm.list_remote_log_segments(self.tp) if m.state == FINISHED]

    def read_raw(self, offset: int, max_bytes: int) -> bytes:
        metadata = self._rlmm.segment_for_offset(self.tp, offset)
        if metadata is None and self._rlmm.catch_up():  # copied by another process meanwhile?
            metadata = self._rlmm.segment_for_offset(self.tp, offset)
        if metadata is None:
            # No remote segment holds it: the next one does, if any (a gap is skipped as a
            # compacted range would be, and said; past the last one the local segments go on).
            later = [m for m in self.finished_segments() if m.start_offset > offset]
            if not later:
                return b""
            metadata = min(later, key=lambda m: m.start_offset)
            logger.warning("%s: no remote segment holds offset %d; reading on from %s", self.tp, offset,
                           metadata.describe())
            offset = metadata.start_offset
        try:
            return self._read_batches(metadata, offset, max_bytes)
        except RemoteResourceNotFoundError:
            self._rlmm.catch_up()  # (another process may have expired it)
            if self._rlmm.segment_for_offset(self.tp, offset) is None:
                return b""  # deleted meanwhile (retention): the caller finds the log start moved
            self._meter.add("RemoteFetchErrorsPerSec")
            raise
        except RemoteStorageError:
            self._meter.add("RemoteFetchErrorsPerSec")
            raise

    def _read_batches(self, metadata: RemoteLogSegmentMetadata, offset: int, max_bytes: int) -> bytes:
        """Whole batches of ``metadata`` from the one holding ``offset`` (RemoteSegmentReader's
        ``read_on``): a sequential reader goes on where its last read stopped, with the bytes it
        fetched past its whole batches, then a ranged get of at least max_bytes more, so the
        segment is fetched once (with 1 MiB reads of 200 KB batches, fetching those bytes again
        made 1.56x the ranged gets of a raw reader: 0.51x its speed); and, with a read-ahead
        executor, the next range is fetched while the reader works on this one."""
        want = max(max_bytes, HEADER_SIZE)
        tail, ahead = self._buffers.take(self.tp)
        mine = tail[1:] if tail is not None and tail[0] == metadata.segment_id else None
        try:
            batches, left, sequential = self._reader.read_on(
                metadata, offset, max_bytes, mine,
                lambda start, n: self._fetch_next(metadata, start, max(n, READ_AHEAD_BYTES), ahead))
        finally:
            _cancel(ahead)  # taken now, or never: not fetched for nobody
        if left is not None:
            kept, end = left[2], left[0] + len(left[2])
            ahead = None
            if sequential and self._read_ahead is not None and len(kept) < want and \
                    end < metadata.segment_size_in_bytes:
                ahead = self._fetch_ahead(metadata, end, max(want, READ_AHEAD_BYTES))
            self._buffers.put(self.tp, (metadata.segment_id, *left), ahead,
                              len(kept) + (0 if ahead is None else max(want, READ_AHEAD_BYTES)))
        return batches

    def _fetch_next(self, metadata: RemoteLogSegmentMetadata, start: int, want: int,
                    ahead: tuple[RemoteLogSegmentId, int, Future] | None) -> bytes:
        """Bytes [start, start + want) of the segment: those fetched ahead when they are these."""
        if ahead is not None and ahead[0] == metadata.segment_id and ahead[1] == start:
            try:
                data = ahead[2].result()
            except (RemoteStorageError, LogstoreError):
                pass  # fetched again below: its failure is this read's
            else:
                if len(data) >= min(want, metadata.segment_size_in_bytes - start):
                    return data
                return data + self._reader.fetch(metadata, start + len(data), start + want)
        return self._reader.fetch(metadata, start, start + want)

    def _fetch_ahead(self, metadata: RemoteLogSegmentMetadata, start: int,
                     want: int) -> tuple[RemoteLogSegmentId, int, Future] | None:
        """Start fetching [start, start + want) in the background (a sequential reader's next
        range); None when the executor refuses (closed)."""
        try:
            future = self._read_ahead.submit(self._reader.fetch, metadata, start, start + want)  # type: ignore[union-attr]
        except RuntimeError:  # the manager is closing
            return None
        return metadata.segment_id, start, future

    def offset_for_timestamp(self, timestamp: int, start_offset: int = 0) -> int | None:
        return self._reader.offset_for_timestamp(self.finished_segments(), timestamp, start_offset)

    def aborted_transactions(self, start: int, upper: int) -> list[AbortedTxn]:
        return self._reader.aborted_transactions(self.finished_segments(), start, upper)


class _Attached:
    """A log the manager tiers: its partition, its task lock, its copy backoff."""

    def __init__(self, log: Any, partition: RemotePartition) -> None:
        self.log = log
        self.partition = partition
        self.lock = threading.Lock()
        self.retry_at = 0.0
        self.backoff_ms = 0
        self.copy_lag_bytes = 0
        self.copy_lag_segments = 0
        #: no longer tiered (its log closes, or its topic is deleted): tasks leave it alone
        self.detached = False


class RemoteLogManager:
    """A store's remote tier (see the module docstring). Thread-safe.

    Args:
        rsm: the object store's RemoteStorageManager (closed by :meth:`close`).
        rlmm: the remote segments' metadata manager (closed by :meth:`close`).
        config: the settings.
        name: names the background thread.
        may_run: asked before each round's copies and expirations: False while another process
            of a shared store is the one that runs them (this one then only follows the metadata).
        before_round: called at the start of each round this process runs (the store opens, and
            so attaches, every partition of its tiered topics: some may be written only by
            other processes).
        leads: asked with a partition's log before each round copies and expires it: False when
            another node of a replica set leads the partition (that node copies and expires it;
            here the round only applies local retention, which drops the segments the tier
            holds, and reads below the local segments go to the tier). None: every partition.
        partition_exists: asked at each round of the partitions the metadata keeps segments of
            that no log attached: False when its topic (that name with that id) is gone. Their
            remote segments are then deleted (a topic deletion a crash cut short before its
            remote deletion began). Without it only deletions the metadata marked are resumed.
    """

    def __init__(self, rsm: RemoteStorageManager, rlmm: RemoteLogMetadataManager,
                 config: RemoteLogManagerConfig | None = None, name: str = "",
                 may_run: Callable[[], bool] | None = None, before_round: Callable[[], None] | None = None,
                 leads: Callable[[Any], bool] | None = None,
                 partition_exists: Callable[[TopicIdPartition], bool] | None = None) -> None:
        self._may_run = may_run
        self._leads = leads
        self._before_round = before_round
        self._partition_exists = partition_exists
        #: serialises partition deletions (a round's and a topic deletion's, of the same partition)
        self._deleting = threading.Lock()
        self.rsm = rsm
        self.rlmm = rlmm
        self.config = config or RemoteLogManagerConfig()
        self.name = name
        self.cache = RemoteIndexCache(self.config.index_cache_size_bytes)
        self._meter = _Meter()
        self._lock = threading.Lock()
        self._attached: dict[TopicIdPartition, _Attached] = {}
        self._in_flight: set[RemoteLogSegmentId] = set()
        #: partitions of deleted topics whose remote segments are still to go
        self._doomed: set[TopicIdPartition] = set()
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._closed = False
        #: the sequential readers' read-ahead (RemotePartition), threads started as used
        self._read_ahead = ThreadPoolExecutor(READ_AHEAD_THREADS, thread_name_prefix="logstore-remote-read-ahead")
        self._buffers = ReadAheadBuffers(READ_AHEAD_BUFFER_BYTES)

    # ------------------------------------------------------------------ partitions
    def attach(self, log: Any, topic_id: Any) -> RemotePartition:
        """Tier ``log`` (a :class:`~logstore.log.log.Log` whose config enables remote storage),
        of the topic with id ``topic_id``: its reads below its local segments go to the remote
        tier from now on, and the tasks copy and expire its segments. Thread-safe."""
        tp = TopicIdPartition(topic_id, log.topic, log.partition)
        partition = RemotePartition(tp, self.rsm, self.rlmm, self.cache, self._meter, self._read_ahead, self._buffers)
        log.attach_remote(partition)
        with self._lock:
            self._attached[tp] = _Attached(log, partition)
        self._wake.set()
        return partition

    def detach(self, log: Any) -> None:
        """Stop tiering ``log`` (it is closing); waits for a task running on it. Thread-safe."""
        with self._lock:
            found = [a for tp, a in self._attached.items() if a.log is log]
            for a in found:
                self._attached.pop(a.partition.tp, None)
                a.detached = True
        for a in found:
            with a.lock:  # (a task running on it stops after its current segment)
                pass

    def partitions(self) -> list[TopicIdPartition]:
        with self._lock:
            return sorted(self._attached)

    def _get(self, log: Any) -> _Attached:
        with self._lock:
            for a in self._attached.values():
                if a.log is log:
                    return a
        raise LogstoreError(f"{getattr(log, 'path', log)} is not attached to the remote tier")

    # ------------------------------------------------------------------ copying
    def copy_segments(self, log: Any, on_copied: Callable[[CopyableSegment], None] | None = None) -> int:
        """Copy every sealed segment of ``log`` the tier may take (see the module docstring);
        return how many were copied. Each is durable in the tier when counted (and handed to
        ``on_copied``: a command's progress).

        Raises:
            RemoteStorageError: a copy failed (the segment stays local; the ones before it are
                copied).
        """
        attached = self._get(log)
        with attached.lock:
            return self._copy(attached, on_copied)

    def waiting(self, log: Any) -> list[CopyableSegment]:
        """The sealed segments of ``log`` a copy would take now, oldest first."""
        attached = self._get(log)
        return log.segments_to_copy(attached.partition.copied_through() + 1)  # type: ignore[no-any-return]

    def leading(self) -> bool:
        """Whether this process is the one of its store that copies and expires (see
        ``may_run``); a command that copies asks first."""
        return self._may_run is None or self._may_run()

    def _copy(self, attached: _Attached, on_copied: Callable[[CopyableSegment], None] | None = None) -> int:
        tp, log = attached.partition.tp, attached.log
        copied = 0
        through = attached.partition.copied_through()
        for segment in log.segments_to_copy(through + 1):
            if segment.end_offset <= through:
                continue
            if attached.detached:
                break  # (its topic is being deleted, or the log closes)
            if self._leads is not None and not self._leads(log):
                break  # (another node leads it now: that node copies on)
            self._copy_one(tp, segment)
            copied += 1
            through = segment.end_offset
            if on_copied is not None:
                on_copied(segment)
        return copied

    def _copy_one(self, tp: TopicIdPartition, segment: CopyableSegment) -> None:
        metadata = RemoteLogSegmentMetadata(
            RemoteLogSegmentId.generate(tp), segment.base_offset, segment.end_offset, segment.max_timestamp,
            self.config.broker_id, _now_ms(), segment.size, dict(segment.leader_epochs), STARTED, None,
            segment.txn_index_path is None)
        data = LogSegmentData(segment.log_path, segment.offset_index_path, segment.time_index_path,
                              segment.txn_index_path, segment.producer_snapshot_path, segment.leader_epoch_checkpoint)
        with self._lock:
            self._in_flight.add(metadata.segment_id)
        try:
            self.rlmm.add_remote_log_segment_metadata(metadata)  # durable before the upload
            try:
                custom = self.rsm.copy_log_segment_data(metadata, data)
            except Exception as exc:
                self._meter.add("RemoteCopyErrorsPerSec")
                logger.warning("%s: copy failed: %s", metadata.describe(), exc)
                try:  # undo now; if this fails too, the expiration task finishes it later
                    self._delete(metadata)
                except LogstoreError as undo:
                    logger.warning("%s: its partial copy stays until the next expiration: %s", metadata.describe(),
                                   undo)
                if isinstance(exc, RemoteStorageError):
                    raise
                # (a local file gone meanwhile: a DeleteRecords or the topic's deletion took it)
                raise RemoteStorageError(f"{metadata.describe()}: copy failed: {exc}") from exc
            self.rlmm.update_remote_log_segment_metadata(RemoteLogSegmentMetadataUpdate(
                metadata.segment_id, _now_ms(), FINISHED, self.config.broker_id, custom))
            self._meter.add("RemoteCopyBytesPerSec", segment.size)
            self._meter.add("RemoteCopyRequestsPerSec")
            logger.debug("%s: copied (%d bytes)", metadata.describe(), segment.size)
        finally:
            with self._lock:
                self._in_flight.discard(metadata.segment_id)

    # ------------------------------------------------------------------ expiration
    def expire_segments(self, log: Any, now_ms: int | None = None) -> int:
        """Delete the remote segments of ``log`` past its topic's total retention or below its
        log start, and finish copies and deletions a crash cut short; return how many remote
        segments were deleted. The log start moves past the expired ones, durably, first.

        Raises:
            RemoteStorageError: a deletion failed (the segment stays DELETE_SEGMENT_STARTED and
                is deleted again at the next run).
        """
        attached = self._get(log)
        with attached.lock:
            return self._expire(attached, _now_ms() if now_ms is None else now_ms)

    def _expire(self, attached: _Attached, now_ms: int) -> int:
        if attached.detached:
            return 0
        tp, log = attached.partition.tp, attached.log
        config = log.config
        segments = self.rlmm.list_remote_log_segments(tp)
        with self._lock:
            in_flight = set(self._in_flight)
        leftovers = [m for m in segments if (m.state == STARTED and m.segment_id not in in_flight)
                     or m.state == DELETE_STARTED]
        finished = [m for m in segments if m.state == FINISHED]
        start = log.log_start_offset
        doomed = [m for m in finished if m.end_offset < start]
        rest = [m for m in finished if m.end_offset >= start]
        if config.deletes and config.retention_ms >= 0:
            while rest and rest[0].max_timestamp_ms < now_ms - config.retention_ms:
                doomed.append(rest.pop(0))
        if config.deletes and config.retention_bytes >= 0:
            through = rest[-1].end_offset if rest else (doomed[-1].end_offset if doomed else -1)
            local_only = sum(s.size for s in log.segments if s.base_offset > through)
            total = sum(m.segment_size_in_bytes for m in rest) + local_only
            while rest and total - rest[0].segment_size_in_bytes >= config.retention_bytes:
                total -= rest[0].segment_size_in_bytes
                doomed.append(rest.pop(0))
        new_start = max((m.end_offset + 1 for m in doomed), default=start)
        if new_start > start:
            log.delete_records_before(new_start)  # durable before any remote segment goes
        deleted = 0
        for metadata in leftovers + doomed:
            self._delete(metadata)
            if metadata.state == FINISHED:
                deleted += 1
        return deleted

    def _delete(self, metadata: RemoteLogSegmentMetadata) -> None:
        """DELETE_SEGMENT_STARTED (unless it is already), the objects, DELETE_SEGMENT_FINISHED."""
        if metadata.state != DELETE_STARTED:
            self.rlmm.update_remote_log_segment_metadata(RemoteLogSegmentMetadataUpdate(
                metadata.segment_id, _now_ms(), DELETE_STARTED, self.config.broker_id))
        try:
            self.rsm.delete_log_segment_data(metadata)
        except RemoteStorageError:
            self._meter.add("RemoteDeleteErrorsPerSec")
            raise
        self._meter.add("RemoteDeleteRequestsPerSec")
        self.cache.forget(metadata.segment_id)
        self.rlmm.update_remote_log_segment_metadata(RemoteLogSegmentMetadataUpdate(
            metadata.segment_id, _now_ms(), DELETE_FINISHED, self.config.broker_id))

    def delete_partitions(self, topic_id: Any, topic: str, partitions: list[int]) -> int:
        """Delete the remote segments of these partitions of a deleted topic (as
        :meth:`delete_partition`); a partition whose deletion fails now is retried at each
        round until it is done. Returns how many segments went now."""
        deleted = 0
        for p in partitions:
            tp = TopicIdPartition(topic_id, topic, p)
            with self._lock:
                self._doomed.add(tp)
            try:
                deleted += self.delete_partition(tp)
            except RemoteStorageError as exc:
                logger.warning("%s: the remote segments of the deleted partition stay until a later round: %s", tp, exc)
        return deleted

    def delete_partition(self, tp: TopicIdPartition) -> int:
        """Delete every remote segment of ``tp`` (its topic was deleted): marked, each segment
        deleted, finished; return how many segments went. Durable at each step: an interrupted
        deletion is finished by calling again (the rounds do, after a restart too: see
        :meth:`run_once`); a finished one is not repeated."""
        with self._lock:
            attached = self._attached.pop(tp, None)
            if attached is not None:
                attached.detached = True
        if attached is not None:
            with attached.lock:
                pass
        with self._deleting:
            state = self.rlmm.partition_delete_state(tp)
            deleted = 0
            if state != RemotePartitionDeleteState.DELETE_PARTITION_FINISHED:
                for step in (RemotePartitionDeleteState.DELETE_PARTITION_MARKED,
                             RemotePartitionDeleteState.DELETE_PARTITION_STARTED):
                    if state is None or state.value < step.value:
                        self.rlmm.put_remote_partition_delete_metadata(RemotePartitionDeleteMetadata(
                            tp, step, _now_ms(), self.config.broker_id))
                for metadata in self.rlmm.list_remote_log_segments(tp):
                    if metadata.state != DELETE_FINISHED:
                        self._delete(metadata)
                        deleted += 1
                self.rlmm.put_remote_partition_delete_metadata(RemotePartitionDeleteMetadata(
                    tp, RemotePartitionDeleteState.DELETE_PARTITION_FINISHED, _now_ms(), self.config.broker_id))
        with self._lock:
            self._doomed.discard(tp)
        return deleted

    def _find_unfinished_deletions(self) -> None:
        """Add to the partitions to delete those the metadata shows a deletion of that did not
        finish, and those of a topic that is gone (``partition_exists``) with segments kept:
        what a crash (or a failure) left of a topic deletion."""
        with self._lock:
            attached = set(self._attached)
            doomed = set(self._doomed)
        found = []
        for tp in self.rlmm.partitions():
            if tp in attached or tp in doomed:
                continue
            state = self.rlmm.partition_delete_state(tp)
            if state == RemotePartitionDeleteState.DELETE_PARTITION_FINISHED:
                continue
            if state is not None or (self._partition_exists is not None and self.rlmm.list_remote_log_segments(tp)
                                     and not self._partition_exists(tp)):
                found.append(tp)
        if found:
            logger.info("resuming the deletion of the remote segments of %s", ", ".join(map(str, found)))
            with self._lock:
                self._doomed.update(found)

    # ------------------------------------------------------------------ the tasks
    def run_once(self, now_ms: int | None = None) -> dict[str, int]:
        """One round of every attached partition's copy and expiration (a partition in its
        copy backoff skips its copy), and of the deletions of deleted topics' partitions;
        returns counts: copied, deleted, errors. A partition's failure is logged and counted,
        never raised, and never keeps the others waiting."""
        copied = deleted = errors = 0
        if self._may_run is not None and not self._may_run():
            self.rlmm.catch_up()  # another process copies: follow what it records
            return {"copied": 0, "deleted": 0, "errors": 0}
        self.rlmm.catch_up()
        if self._before_round is not None:
            try:
                self._before_round()
            except Exception:  # noqa: BLE001 - the round goes on with what is attached
                logger.exception("remote log manager: attaching the tiered partitions failed")
        try:
            self._find_unfinished_deletions()
        except LogstoreError as exc:
            errors += 1
            logger.warning("looking for unfinished remote deletions failed: %s", exc)
        with self._lock:
            attached = list(self._attached.values())
            doomed = sorted(self._doomed)
        for tp in doomed:
            try:
                deleted += self.delete_partition(tp)
            except Exception as exc:  # noqa: BLE001 - retried at the next round
                errors += 1
                logger.warning("%s: deleting the remote segments of the deleted partition failed: %s", tp, exc)
        for a in attached:
            if self._stop.is_set():
                break
            copied_now, deleted_now, failed = self._round(a, now_ms)
            copied += copied_now
            deleted += deleted_now
            errors += failed
        return {"copied": copied, "deleted": deleted, "errors": errors}

    def _round(self, a: _Attached, now_ms: int | None) -> tuple[int, int, int]:
        """One partition's copy (unless in its backoff) and expiration: (copied, deleted, errors)."""
        copied = deleted = errors = 0
        with a.lock:
            if a.detached or a.log.closed:
                return 0, 0, 0
            if self._leads is not None and not self._leads(a.log):
                try:  # another node copies and expires it: what the tier holds may leave the disk
                    a.log.enforce_retention()
                except LogClosedError:
                    pass
                except Exception as exc:  # noqa: BLE001 - retried at the next round
                    errors += 1
                    logger.warning("%s: local retention failed: %s", a.partition.tp, exc)
                return 0, 0, errors
            try:
                if time.monotonic() >= a.retry_at:
                    copied = self._copy(a)
                    a.backoff_ms = 0
                    a.retry_at = 0.0
                    if copied:
                        a.log.enforce_retention()  # the copied segments may leave the local disk now
            except LogClosedError:
                return copied, 0, 0
            except Exception as exc:  # noqa: BLE001 - a store that is down, a log offline: back off
                errors += 1
                a.backoff_ms = min(self.config.retry_backoff_max_ms,
                                   max(self.config.retry_backoff_ms, a.backoff_ms * 2))
                a.retry_at = time.monotonic() + a.backoff_ms * random.uniform(0.8, 1.2) / 1000
                logger.warning("%s: copy to the remote tier failed (next try in %d ms): %s", a.partition.tp,
                               a.backoff_ms, exc)
            try:
                deleted = self._expire(a, _now_ms() if now_ms is None else now_ms)
                waiting = a.log.segments_to_copy(a.partition.copied_through() + 1)
                a.copy_lag_bytes, a.copy_lag_segments = sum(s.size for s in waiting), len(waiting)
            except LogClosedError:
                pass
            except Exception as exc:  # noqa: BLE001 - retried at the next round
                errors += 1
                logger.warning("%s: remote expiration failed: %s", a.partition.tp, exc)
        return copied, deleted, errors

    def start(self) -> None:
        """Run the tasks in the background every ``task_interval_ms`` (and soon after a log is
        attached) until :meth:`close`."""
        if self._thread is not None:
            return
        self._thread = threading.Thread(target=self._run, name=f"logstore-remote-log[{self.name}]", daemon=True)
        self._thread.start()

    def wake(self) -> None:
        """Run the tasks soon (a segment rolled)."""
        self._wake.set()

    def _run(self) -> None:
        interval = self.config.task_interval_ms / 1000
        while not self._stop.is_set():
            try:
                self.run_once()
            except Exception:  # noqa: BLE001 - the thread must survive a bug in one round
                logger.exception("remote log manager round failed")
            self._wake.wait(interval)
            self._wake.clear()

    def metrics(self) -> dict[str, int]:
        """Kafka's remote tier metrics (BrokerTopicMetrics' names) for the whole store: the
        ``...PerSec`` entries are totals since the start (a rate is their difference over
        time), ``RemoteCopyLagBytes`` the bytes of local segments waiting for a copy (at the last
        round), ``RemoteLogSizeBytes`` the bytes held in the tier."""
        out = self._meter.snapshot()
        with self._lock:
            attached = list(self._attached.values())
        out["RemoteCopyLagBytes"] = sum(a.copy_lag_bytes for a in attached)
        out["RemoteLogSizeBytes"] = sum(a.partition.size_in_bytes() for a in attached)
        out["RemoteLogIndexCacheBytes"] = self.cache.size_in_bytes
        return out

    def partition_metrics(self) -> dict[str, dict[tuple[str, int], int]]:
        """Kafka's per-partition remote tier gauges, ``{name: {(topic, partition): value}}``:
        ``RemoteCopyLagBytes`` and ``RemoteCopyLagSegments`` (local segments waiting for a
        copy, at the last round), ``RemoteLogSizeBytes`` and ``RemoteLogMetadataCount`` (the
        finished remote segments)."""
        with self._lock:
            attached = list(self._attached.values())
        out: dict[str, dict[tuple[str, int], int]] = {name: {} for name in (
            "RemoteCopyLagBytes", "RemoteCopyLagSegments", "RemoteLogSizeBytes", "RemoteLogMetadataCount")}
        for a in attached:
            key = (a.partition.tp.topic, a.partition.tp.partition)
            out["RemoteCopyLagBytes"][key] = a.copy_lag_bytes
            out["RemoteCopyLagSegments"][key] = a.copy_lag_segments
            out["RemoteLogSizeBytes"][key] = a.partition.size_in_bytes()
            out["RemoteLogMetadataCount"][key] = len(a.partition.finished_segments())
        return out

    def close(self) -> None:
        """Stop the background thread (waiting for its round) and close both managers."""
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join()
        self._read_ahead.shutdown(wait=False, cancel_futures=True)  # (a fetch in flight ends by its timeout)
        self.rlmm.close()
        self.rsm.close()


def _now_ms() -> int:
    return time.time_ns() // 1_000_000
