"""The remote tier of a tiered partition as the read-only readers see it (tiered storage, KIP-405).

A topic with ``remote.storage.enable`` keeps its older segments only in the object store; the
store's own logs read them through :class:`~logstore.tiered.manager.RemotePartition`. The readers
that open no store (Spark's driver and executors, ``logstore stats``/``dump``/``verify``) read
them through a :class:`RemotePartitionView` instead: the partition's finished remote segments,
Kafka's *referenced* ones (none lies inside another, so their offsets ascend) as a
:class:`~logstore.tiered.rlmm.RemotePartitionMetadataStore` folds them from the store's
``__remote_log_metadata`` records (read by :meth:`StoreView.remote_tier
<logstore.store.views.StoreView.remote_tier>`), and the object store they live in, opened on first
use from a URL (the one the caller gives, else the one the store remembers in
``.remote-storage``). Its reads are :class:`~logstore.tiered.manager.RemoteSegmentReader`'s, the
store's own read path: whole batches from a segment's offset index and a ranged get, every batch
CRC-checked, then decoded by the C decoder like a local segment's.

A view is a snapshot of the metadata when it was made: a remote segment that retention deletes
meanwhile reads as lost (:class:`~logstore.errors.DataLossError`), never as wrong bytes, since a
remote segment's objects are immutable and named by the copy's unique id.

Thread-safety: thread-safe (the object store and the index cache are); a
:class:`~logstore.records.batch.RecordDecoder` passed to :meth:`RemotePartitionView.scan` must not
be shared between threads.
"""

from __future__ import annotations

import logging
import struct
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable, Iterator, Mapping, Sequence

from .._native import lib
from ..errors import DataLossError, LogstoreError, RemoteResourceNotFoundError, RemoteStorageError
from ..index import AbortedBatches, AbortedTxn
from ..records.batch import RecordDecoder, batch_headers, end_offset_of
from ..tiered.manager import RemoteIndexCache, RemoteSegmentReader
from ..tiered.metadata import IndexType, RemoteLogSegmentMetadata, TopicIdPartition
from ..tiered.storage import RemoteStorageManager

__all__ = ["RemotePartitionView", "REMOTE_READ_BYTES"]

logger = logging.getLogger(__name__)

#: bytes of whole batches one ranged get of a scan asks for (measured: 4 MiB and 16 MiB read a
#: SeaweedFS on loopback at the same speed; 8 MiB bounds a reader's memory like a local window)
REMOTE_READ_BYTES = 8 << 20
#: the bound of the remote indexes one view keeps (a Spark task reads one or a few segments)
_INDEX_CACHE_BYTES = 64 << 20
_OFFSET_ENTRY = struct.Struct(">ii")

#: sink(buf, out, n): n decoded rows in ``out`` (an ``ls_records_out``), positions into ``buf``
ColumnSink = Callable[[Any, Any, int], None]


class RemotePartitionView:
    """Read-only view of one partition's remote tier: its finished, referenced remote segments
    (ascending, as the metadata held them when the view was made) and reads of them from the
    object store (see the module docstring).

    Args:
        tp: the partition, by topic id and name.
        segments: its referenced COPY_SEGMENT_FINISHED segments, by ascending start offset (a
            planned read's subset of them, for a Spark executor).
        storage: the object store's URL (``file:///...``, ``s3://bucket``, ...), opened on the
            first read; None when it is not known (a read then raises, naming the fix), or a
            :class:`~logstore.tiered.storage.RemoteStorageManager` to read through (not closed
            by :meth:`close`).
        options: the object store's options (obstore's names; credentials may come from the
            environment instead).

    Reads only: nothing is written anywhere. Thread-safe.
    """

    def __init__(self, tp: TopicIdPartition, segments: Sequence[RemoteLogSegmentMetadata],
                 storage: str | RemoteStorageManager | None, options: Mapping[str, str] | None = None) -> None:
        self.tp = tp
        #: the remote segments, by ascending start offset
        self.segments: tuple[RemoteLogSegmentMetadata, ...] = tuple(segments)
        self.url = storage if isinstance(storage, str) else None
        self.options = dict(options or {})
        self._given = storage if isinstance(storage, RemoteStorageManager) else None
        self._opened: RemoteStorageManager | None = None
        self._reader: RemoteSegmentReader | None = None

    # ------------------------------------------------------------------ offsets
    @property
    def start_offset(self) -> int | None:
        """The first offset the remote segments hold, None when there are none."""
        return self.segments[0].start_offset if self.segments else None

    @property
    def end_offset(self) -> int | None:
        """The last offset (inclusive) the remote segments hold, None when there are none."""
        return self.segments[-1].end_offset if self.segments else None

    @property
    def size_in_bytes(self) -> int:
        """The bytes of the remote segments."""
        return sum(m.segment_size_in_bytes for m in self.segments)

    def segments_in(self, start: int, end: int) -> list[RemoteLogSegmentMetadata]:
        """The remote segments holding offsets in [start, end), ascending."""
        return [m for m in self.segments if m.end_offset >= start and m.start_offset < end]

    def timestamp_bounds(self, timestamp: int) -> tuple[int, int] | None:
        """Bounds [low, high] on the first remote offset whose record has a timestamp >=
        ``timestamp``, from the segments' newest timestamps alone (the first segment with one
        that recent holds it), None when no remote record is that recent."""
        for metadata in self.segments:
            if metadata.max_timestamp_ms >= timestamp:
                return metadata.start_offset, metadata.end_offset
        return None

    # ------------------------------------------------------------------ the object store
    @property
    def reader(self) -> RemoteSegmentReader:
        """The read path over the object store, opened on first use.

        Raises:
            LogstoreError: the object store is not known (the store remembers none and none
                was given).
            InvalidConfigError: its URL or an option is not understood.
        """
        if self._reader is None:
            rsm = self._given
            if rsm is None:
                if self.url is None:
                    raise LogstoreError(f"{self.tp}: its older records are in a remote tier this store does not "
                                        f"name (no .remote-storage): give the object store's URL "
                                        f"(Spark: the option remoteStorage)")
                rsm = self._opened = RemoteStorageManager.from_url(self.url, self.options)
            self._reader = RemoteSegmentReader(rsm, RemoteIndexCache(_INDEX_CACHE_BYTES))
        return self._reader

    def close(self) -> None:
        """Close the object store this view opened. Idempotent."""
        if self._opened is not None:
            self._opened.close()
            self._opened = None
        self._reader = None

    def __enter__(self) -> "RemotePartitionView":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def offset_index(self, metadata: RemoteLogSegmentMetadata) -> list[tuple[int, int]]:
        """The entries (offset, byte position of the batch holding it) of a remote segment's
        offset index: where a read may start without decoding what precedes.

        Raises:
            RemoteStorageError: the object store failed.
        """
        data = self.reader.index(metadata, IndexType.OFFSET)
        usable = len(data) - len(data) % _OFFSET_ENTRY.size
        return [(metadata.start_offset + rel, position) for rel, position in _OFFSET_ENTRY.iter_unpack(data[:usable])
                if rel > 0 or position > 0]

    # ------------------------------------------------------------------ reading
    def read_batches(self, offset: int, max_bytes: int) -> bytes:
        """Whole batches, byte for byte as the log wrote them, from the remote batch holding
        ``offset`` on (about ``max_bytes``, at least one batch, all from one segment), each
        CRC-checked; b"" when no remote segment of the view holds ``offset``.

        Raises:
            RemoteStorageError: the object store failed, or a batch fails its checks (the
                message names the remote segment).
        """
        for metadata in self.segments:
            if metadata.start_offset <= offset <= metadata.end_offset:
                return self.reader.read_batches(metadata, offset, max_bytes)
        return b""

    def scan(self, start: int, end: int, sink: ColumnSink, decoder: RecordDecoder | None = None,
             window: int = REMOTE_READ_BYTES, skip_lost: bool = False) -> Iterator[None]:
        """Decode the records with ``start <= offset < end`` of the view's segments in offset
        order, handing each chunk of rows to ``sink(buf, out, n)`` as
        :meth:`PartitionView.scan <logstore.store.views.PartitionView.scan>` does (rows past
        ``end`` in the last batch reach the sink too; it drops them). Each ranged get is of
        whole batches, about ``window`` bytes, every one CRC-checked twice over (by the read
        path, then by the decoder) before any row of it is given. A generator: it yields after
        each get's rows. Offsets no segment of the view holds are skipped.

        The next get runs in a thread of its own while this one's bytes are decoded and the
        caller takes the rows (obstore releases the GIL while it waits): the object store's
        latency overlaps the work on the bytes before. At most two windows are held.

        Raises:
            DataLossError: a segment's objects are gone (retention deleted it since the view was
                made), unless ``skip_lost``: then a warning is logged and the scan goes on.
            RemoteStorageError: the object store failed, or a batch is damaged (naming the remote
                segment and the byte).
        """
        decoder = decoder or RecordDecoder()
        segments = self.segments_in(start, end)
        if not segments:
            return
        reader = self.reader
        pool = ThreadPoolExecutor(1, thread_name_prefix="logstore-remote-read")
        try:
            i, offset = 0, max(start, segments[0].start_offset)
            pending: Future | None = pool.submit(reader.batches_view, segments[0], offset, window)
            while pending is not None:
                metadata = segments[i]
                try:
                    raw = pending.result()
                except RemoteResourceNotFoundError as exc:
                    if not skip_lost:
                        raise DataLossError(f"{self.tp}: offsets {offset}..{metadata.end_offset} are gone from the "
                                            f"remote tier (deleted since the read was planned?): {exc}") from exc
                    logger.warning("%s: skipping offsets %d..%d, gone from the remote tier: %s", self.tp, offset,
                                   metadata.end_offset, exc)
                    raw = memoryview(b"")
                # The next get: on in this segment after these batches, else the next segment.
                after = end_offset_of(raw, offset) if len(raw) else metadata.end_offset + 1
                pending = None
                if after < end and after <= metadata.end_offset:
                    pending = pool.submit(reader.batches_view, metadata, after, window)
                elif after < end and i + 1 < len(segments):
                    i += 1
                    after = max(start, segments[i].start_offset)
                    pending = pool.submit(reader.batches_view, segments[i], after, window)
                offset = after
                if not len(raw):
                    continue
                where = metadata.describe()
                stop = decoder.decode_columns(raw, 0, len(raw), sink, min_offset=start, max_offset=end, path=where)
                if decoder.last_stop == lib.LS_STOP_ERROR:
                    raise RemoteStorageError(f"{where}: the batch at byte {stop} of a ranged get of whole batches "
                                             f"does not decode")
                yield None
                if decoder.last_stop == lib.LS_STOP_MAX_OFFSET:
                    return
        finally:
            pool.shutdown(wait=True, cancel_futures=True)

    def aborted_transactions(self, start: int, end: int) -> list[AbortedTxn]:
        """The aborted transactions the remote segments' transaction indexes list that overlap
        [start, end), as ``Log.aborted_transactions``.

        Raises:
            RemoteStorageError: the object store failed, or an index is damaged.
        """
        return self.reader.aborted_transactions(list(self.segments), start, end)

    def aborted_batches(self, start: int, end: int, more: Sequence[AbortedTxn] = ()) -> list[tuple[int, int]]:
        """(first, last) offsets of the remote batches in [start, end) that belong to aborted
        transactions (what a read_committed reader leaves out), ascending; [] when none. Reads
        the batches' headers only when an aborted transaction overlaps the range. ``more``:
        aborted transactions found elsewhere (the local segments' indexes: a transaction's
        entry lives with its ABORT marker, which may be local).

        Raises:
            RemoteStorageError: as :meth:`scan`.
        """
        aborted = AbortedBatches(self.aborted_transactions(start, end) + list(more))
        if not aborted:
            return []
        out = []
        for metadata in self.segments_in(start, end):
            offset = max(start, metadata.start_offset)
            while offset <= metadata.end_offset and offset < end:
                raw = self.reader.read_batches(metadata, offset, REMOTE_READ_BYTES)
                if not raw:
                    break
                for _, header in batch_headers(raw):
                    if (header.base_offset < end and header.last_offset >= start
                            and aborted.covers(header.producer_id, header.base_offset, header.attributes)):
                        out.append((header.base_offset, header.last_offset))
                    offset = max(offset, header.last_offset + 1)
        return out

    def offset_for_timestamp(self, timestamp: int) -> int | None:
        """The first remote offset whose record's timestamp is >= ``timestamp``, None when no
        remote record is that recent (as ``Log.offset_for_timestamp`` below its local segments).

        Raises:
            RemoteStorageError: as :meth:`scan`.
        """
        return self.reader.offset_for_timestamp(list(self.segments), timestamp)
