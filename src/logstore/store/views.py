"""Read-only views of a store's files, for readers that must not change anything.

A :class:`~logstore.store.store.LogStore` or :class:`~logstore.log.log.Log` owns its directory: opening one
takes locks, recovers torn tails and may rewrite files. Readers in other processes that only
look — Spark's driver planning a scan and its executors reading the segments (spark.py) — use
these views instead. They never open a file for writing, never take a lock and never repair:

* :class:`StoreView` lists a store's topics and partition counts from ``.topics/``, or those of a
  Kafka log directory from its partition directories (:mod:`logstore.store.kafkadirs`);
* :meth:`StoreView.remote_tier` gives a tiered partition's remote tier (tiered storage:
  :class:`~logstore.store.remoteview.RemotePartitionView`, its remote segments from the fold of
  ``__remote_log_metadata``, read from the object store);
* :class:`PartitionView` lists a partition's segments, finds its log start (segment files,
  ``log-start-offset-checkpoint`` and the remote tier's first offset) and log end (the valid batches after the last offset index
  entry of the last segment, as :class:`~logstore.log.segmentscan.BatchWalk` finds them for
  recovery: CRC included, so a torn tail is not counted),
  maps offsets and timestamps to byte positions through the sparse indexes, and decodes offset
  ranges into columns with the C decoder (:meth:`PartitionView.read_columns`).

A writer may append, roll, clean or delete segments while a view reads: an offset range that
retention removed in the meantime is reported (:class:`DataLossError`), a segment replaced by the
cleaner is read from whichever file the name held when it was opened (both hold the same
offsets' latest values), and bytes past the log end planned earlier are never looked at.

Invariant: a view maps a segment's ``.log`` only up to the end of its valid batches. The last
segment may be the writer's active one, preallocated with a zero tail that the writer trims
away when the segment rolls or the log closes (and recovery cuts a torn tail); a map is not told
of the cut, and touching a page of it wholly past the file's new end is a SIGBUS, which kills the
reading process. So the end of the last segment's batches is found with ``pread`` (a read past
the end comes back short, it never faults), and its map stops there; every cut leaves the file
at or past that end, since a writer trims to the end of its batches and recovery keeps the valid
ones, the very rule the view's walk applies. The segments before the last one were trimmed when
they rolled: their files are their batches. (The offset and time indexes are copied, not
mapped, for the same reason: ``OffsetIndex.open_readonly``.) The tools that walk a segment's
file (``logstore stats``, ``dump``, ``verify``) map it the same way: :meth:`PartitionView.segment_data`,
and :class:`SegmentBatches` for a file named by its path, which also says what follows the valid
batches, read with ``pread`` too.

Thread-safety: a view holds no open files between calls; one view may be used from any thread,
but a :class:`~logstore.records.batch.RecordDecoder` passed to :meth:`PartitionView.read_columns` must
not be shared between threads.
"""

from __future__ import annotations

import mmap
import os
import threading
import uuid
from dataclasses import dataclass, replace
from typing import Any, Callable, ContextManager, Iterator, Mapping

from .. import _fileio
from . import kafkadirs
from .._native import lib
from ..checkpoint import (
    LOG_START_OFFSET_CHECKPOINT,
    REPLICATION_OFFSET_CHECKPOINT,
    CorruptCheckpointError,
    OffsetCheckpoints,
)
from ..errors import CorruptRecordError, DataLossError, LogstoreError, UnknownTopicOrPartitionError
from ..index import AbortedBatches, AbortedTxn, OffsetIndex, TimeIndex, TransactionIndex
from ..log.producers import snapshot_offsets, snapshot_path
from ..log.producerstate import CorruptSnapshotError, ProducerStateTable
from ..log.segmentscan import BatchWalk, WalkStop, status_words
from ..records.batch import HEADER_SIZE, LOG_OVERHEAD, BatchHeader, RecordDecoder, parse_header
from ..log.filenames import INDEX_SUFFIX, LOG_SUFFIX, TIMEINDEX_SUFFIX, TXNINDEX_SUFFIX, parse_segment_name, segment_name
from .kafkadirs import is_internal_topic, validate_topic_name
from .layout import TOPICS_DIR, read_remote_storage, read_topic_entry, read_topic_file
from .remoteview import RemotePartitionView
from ..tiered.metadata import TopicIdPartition
from ..tiered.records import REMOTE_LOG_METADATA_TOPIC
from ..tiered.rlmm import RemotePartitionMetadataStore, apply_records
from .topicids import read_partition_metadata

__all__ = ["StoreView", "PartitionView", "SegmentBatches", "DataLossError", "LogEnd", "SegmentPosition"]

#: sink(buf, out, n): n decoded rows in ``out`` (an ``ls_records_out``), positions into ``buf``
ColumnSink = Callable[[Any, Any, int], None]


@dataclass(frozen=True)
class LogEnd:
    """The log end offset, the segment holding it (-1: no segment) and the byte position after
    that segment's last valid batch."""

    offset: int
    segment: int
    position: int


@dataclass(frozen=True)
class SegmentPosition:
    """Where to start reading for an offset: the segment's base offset and a byte position in
    its ``.log`` at or before the batch holding the offset (a batch boundary)."""

    segment: int
    position: int


class StoreView:
    """Read-only view of a LogStore data directory or of a Kafka log directory.

    A LogStore's topics come from ``.topics/``. A directory without ``.topics/`` that looks like
    one of Kafka's ``log.dirs`` (:func:`logstore.store.kafkadirs.looks_like_log_dir`) has its partition
    directories adopted in memory, by the rules of :mod:`logstore.store.kafkadirs` — the same topics a
    LogStore opened there would write into ``.topics/``, but nothing is written: a Kafka log
    directory stays loadable by Kafka. The directory is scanned once, on first use.

    Raises:
        LogstoreError: ``root`` is neither (the message says what is missing).
    """

    def __init__(self, root: str | os.PathLike[str], quiet: bool = False, *, remote_storage: str | None = None,
                 remote_storage_options: Mapping[str, str] | None = None) -> None:
        """``quiet``: do not log what a Kafka log directory's scan skips. ``remote_storage`` and
        ``remote_storage_options``: the object store of the store's remote tier (tiered
        storage), instead of the one the store remembers (``.remote-storage``), with its
        options on top of the remembered ones (see :meth:`remote_tier`)."""
        self.root = os.fspath(root)
        self._quiet = quiet
        self._adopted: dict[str, kafkadirs.AdoptedTopic] | None = None
        self._remote_storage = remote_storage
        self._remote_options = dict(remote_storage_options or {})
        self._remote_lock = threading.Lock()  # the fold below: catching up and reading it
        self._remote_metadata: RemotePartitionMetadataStore | None = None  # __remote_log_metadata's fold
        self._remote_read_to = 0  # ... up to this offset
        self._remote_views: dict[tuple[str, int], RemotePartitionView] = {}
        #: True when ``root`` is a Kafka log directory (no ``.topics/``) adopted in memory
        self.kafka_log_dir = not _fileio.ops.exists(os.path.join(self.root, TOPICS_DIR))
        if not self.kafka_log_dir:
            return
        if not os.path.isdir(self.root):
            raise LogstoreError(f"{self.root}: no such directory")
        if not kafkadirs.looks_like_log_dir(self.root):
            raise LogstoreError(f"{self.root} is not a logstore data directory (no {TOPICS_DIR}/) nor a Kafka log "
                                "directory (no meta.properties, checkpoint files or <topic>-<partition>/ directories)")

    def __getstate__(self) -> dict[str, Any]:
        """Pickled without the remote tier's fold, views and lock (Spark ships a planner's
        view to its workers): they are read again where they are used."""
        state = dict(self.__dict__)
        state.update(_remote_lock=None, _remote_metadata=None, _remote_read_to=0, _remote_views={})
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state, _remote_lock=threading.Lock())

    def _kafka_topics(self) -> dict[str, kafkadirs.AdoptedTopic]:
        if self._adopted is None:
            self._adopted = kafkadirs.scan(self.root, quiet=self._quiet).topics
        return self._adopted

    def topics(self, internal: bool = False) -> list[str]:
        """Topic names, sorted; internal ones (``__...``) only when asked."""
        if self.kafka_log_dir:
            names = list(self._kafka_topics())
        else:
            names = []
            for name in _fileio.ops.listdir(os.path.join(self.root, TOPICS_DIR)):
                try:
                    validate_topic_name(name)
                except LogstoreError:
                    continue
                names.append(name)
        return sorted(n for n in names if internal or not is_internal_topic(n))

    def _topic(self, topic: str) -> tuple[int, dict[str, str]]:
        validate_topic_name(topic)
        if self.kafka_log_dir:
            adopted = self._kafka_topics().get(topic)
            found = None if adopted is None else (adopted.partitions, dict(adopted.overrides))
        else:
            found = read_topic_file(os.path.join(self.root, TOPICS_DIR, topic))
        if found is None:
            raise UnknownTopicOrPartitionError(f"topic {topic!r} does not exist in {self.root}")
        return found

    def partitions(self, topic: str) -> int:
        """Partition count of ``topic``.

        Raises:
            UnknownTopicOrPartitionError: no such topic.
        """
        return self._topic(topic)[0]

    def overrides(self, topic: str) -> dict[str, str]:
        """The topic's config overrides by Kafka's names (an adopted Kafka topic has none,
        except ``__consumer_offsets``).

        Raises:
            UnknownTopicOrPartitionError: no such topic.
        """
        return self._topic(topic)[1]

    def topic_id(self, topic: str) -> uuid.UUID | None:
        """The topic's id (KIP-516): from its topic file in a store, from its partitions'
        ``partition.metadata`` in a Kafka log directory (or in a store written before topic
        ids, which gets one when a LogStore opens it); None when it has none yet.

        Raises:
            UnknownTopicOrPartitionError: no such topic.
            LogstoreError: a malformed topic file or ``partition.metadata``.
        """
        count = self.partitions(topic)
        if not self.kafka_log_dir:
            entry = read_topic_entry(os.path.join(self.root, TOPICS_DIR, topic))
            if entry is not None and entry.topic_id is not None:
                return entry.topic_id
        for p in range(count):
            found = read_partition_metadata(os.path.join(self.root, f"{topic}-{p}"))
            if found is not None:
                return found
        return None

    def partition(self, topic: str, partition: int) -> "PartitionView":
        """The view of one partition of the topic. A partition without a directory (a gap in
        an adopted Kafka topic, or a store partition not yet opened) reads as empty.

        Raises:
            UnknownTopicOrPartitionError: no such topic or partition.
        """
        count = self.partitions(topic)
        if isinstance(partition, bool) or not isinstance(partition, int) or not 0 <= partition < count:
            raise UnknownTopicOrPartitionError(
                f"topic {topic!r} has partitions 0..{count - 1}; there is no partition {partition!r}")
        return PartitionView(self.root, topic, partition, must_exist=False, remote=self.remote_tier(topic, partition))

    def remote_tier(self, topic: str, partition: int, remote_storage: str | None = None,
                    remote_storage_options: Mapping[str, str] | None = None) -> RemotePartitionView | None:
        """The remote tier of one partition (tiered storage, KIP-405), read-only: its finished,
        referenced remote segments as the store's ``__remote_log_metadata`` records them now
        (read through a :class:`PartitionView` up to its high watermark, and folded as the
        store's metadata manager folds them; each call reads what was appended since the last),
        and the object store they live in: ``remote_storage`` (with ``remote_storage_options``)
        when given, else the view's, else the one the store remembers (``.remote-storage``, its
        options beneath the given ones; credentials come from the environment). None when the
        topic neither enables ``remote.storage.enable`` nor has remote segments. The view of a
        partition whose segments did not change since the last call is the same object (its
        index cache serves again). Thread-safe.

        Raises:
            UnknownTopicOrPartitionError: no such topic.
            LogstoreError: a malformed topic file or ``.remote-storage``.
        """
        overrides = self.overrides(topic)
        if self.kafka_log_dir or is_internal_topic(topic):
            return None
        topic_id = self.topic_id(topic)
        tp = _topic_id_partition(topic_id, topic, partition)
        with self._remote_lock:
            store = self._remote_log_metadata()
            segments = [] if store is None or topic_id is None else store.referenced_segments(tp)
        if not segments and overrides.get("remote.storage.enable", "false").strip().lower() != "true":
            return None
        default = remote_storage is None and remote_storage_options is None
        known = self._remote_views.get((topic, partition)) if default else None
        if known is not None and known.segments == tuple(segments):
            return known
        url = remote_storage or self._remote_storage
        options = {**self._remote_options, **(remote_storage_options or {})}
        remembered = read_remote_storage(self.root)
        if url is None and remembered is not None:
            url, options = remembered[0], {**remembered[1], **options}
        view = RemotePartitionView(tp, segments, url, options)
        if default:
            self._remote_views[(topic, partition)] = view
        return view

    def _remote_log_metadata(self) -> RemotePartitionMetadataStore | None:
        """The fold of ``__remote_log_metadata-0`` up to its high watermark now (the records
        appended since the last call applied; all of them again when the log is shorter than
        what was applied: a replica's truncation), None for a store without one. Held: the
        remote lock."""
        try:
            self.partitions(REMOTE_LOG_METADATA_TOPIC)
        except UnknownTopicOrPartitionError:
            return None
        view = PartitionView(self.root, REMOTE_LOG_METADATA_TOPIC, 0, must_exist=False)
        end = view.high_watermark()
        if self._remote_metadata is None or end < self._remote_read_to:
            self._remote_metadata, self._remote_read_to = RemotePartitionMetadataStore(), 0
        if end > self._remote_read_to:
            apply_records(self._remote_metadata, view.records(self._remote_read_to, end))
            self._remote_read_to = end
        return self._remote_metadata


def _topic_id_partition(topic_id: uuid.UUID | None, topic: str, partition: int) -> TopicIdPartition:
    return TopicIdPartition(topic_id or uuid.UUID(int=0), topic, partition)


class PartitionView:
    """Read-only view of one partition directory ``<root>/<topic>-<partition>``, and of its
    remote tier when it has one (tiered storage: see :meth:`StoreView.remote_tier`)."""

    def __init__(self, root: str, topic: str, partition: int, *, path: str | None = None,
                 must_exist: bool = True, remote: RemotePartitionView | None = None) -> None:
        """``path`` (default ``<root>/<topic>-<partition>``) names a partition directory whose
        name is not of that form (keyed as partition -1 in ``root``'s checkpoints, as
        :class:`~logstore.log.log.Log` keys it). With ``must_exist`` false a missing directory
        reads as a partition with no segments. ``remote``: the partition's remote tier (tiered
        storage, :meth:`StoreView.remote_tier`), whose segments may hold the offsets below the
        local ones.

        Raises:
            UnknownTopicOrPartitionError: the directory does not exist (with ``must_exist``).
        """
        self.root = root
        self.topic = topic
        self.partition = partition
        #: the remote tier of a tiered partition (None: the local segments are all there is)
        self.remote = remote
        self.path = path if path is not None else os.path.join(root, f"{topic}-{partition}")
        if must_exist and not _fileio.ops.exists(self.path):
            raise UnknownTopicOrPartitionError(f"partition {topic}-{partition} has no directory in {root}")

    # ------------------------------------------------------------------ layout
    def segments(self) -> list[int]:
        """Base offsets of the live segments, ascending."""
        bases = []
        try:
            names = _fileio.ops.listdir(self.path)
        except FileNotFoundError:
            return []  # a partition without a directory (see StoreView.partition)
        for name in names:
            parsed = parse_segment_name(name)
            if parsed is not None and parsed[1] == LOG_SUFFIX:
                bases.append(parsed[0])
        return sorted(bases)

    def segment_file(self, base: int, suffix: str = LOG_SUFFIX) -> str:
        """The path of the file with ``suffix`` (``.log`` by default) of the segment at ``base``."""
        return os.path.join(self.path, segment_name(base) + suffix)

    def _checkpoint(self, name: str) -> int | None:
        try:
            return OffsetCheckpoints(self.root, name).get((self.topic, self.partition))
        except CorruptCheckpointError:
            return None  # a hint only: the segment files decide

    def log_start_offset(self, segments: list[int] | None = None) -> int:
        """First readable offset: the first segment's base offset, or the checkpointed log start
        when DeleteRecords/retention moved it inside that segment. With a remote tier whose
        segments start below the local ones, the first remote offset instead (not below the
        checkpointed start), as ``Log.attach_remote`` sets it."""
        segments = self.segments() if segments is None else segments
        remote_start = self.remote.start_offset if self.remote is not None else None
        if not segments and remote_start is None:
            return 0
        start = self._checkpoint(LOG_START_OFFSET_CHECKPOINT)
        first = segments[0] if segments else 2**63 - 1
        if remote_start is not None and remote_start < first:
            first = remote_start
        return max(first, start if start is not None else 0)

    def local_log_start_offset(self, segments: list[int] | None = None) -> int:
        """The first offset on local disk (``Log.local_log_start_offset``): the log start, or
        the first local segment's base when the older ones are only in the remote tier."""
        segments = self.segments() if segments is None else segments
        start = self.log_start_offset(segments)
        return max(start, segments[0]) if segments else start

    def log_end_offset(self, segments: list[int] | None = None) -> int:
        """The offset after the last valid batch (CRC checked) of the last segment."""
        return self.log_end(segments).offset

    def log_end(self, segments: list[int] | None = None) -> "LogEnd":
        """The log end offset and where it lies: the last segment and the byte position after
        its last valid batch (a reader must not look past it: a writer may cut the file there)."""
        segments = self.segments() if segments is None else segments
        if not segments:
            return LogEnd(0, -1, 0)
        base = segments[-1]
        hint = self._index_floor(base, 2**62)
        ops = _fileio.ops
        fd = ops.open(self.segment_file(base, LOG_SUFFIX), os.O_RDONLY)
        try:
            start = hint.position if hint.position < ops.fsize(fd) else 0
            offset, position = _valid_end(fd, base, start)
            if position == start and start > 0:
                # The index pointed at no valid batch: distrust it and walk from the start.
                offset, position = _valid_end(fd, base, 0)
        finally:
            ops.close(fd)
        return LogEnd(offset, base, position)

    def segment_data(self, base: int, segments: list[int] | None = None) -> ContextManager[Any]:
        """``with view.segment_data(base) as data:`` the bytes of the segment's ``.log``, mapped
        read-only up to the end of its valid batches (b"" when there are none): what a tool
        walks, safe while a writer rolls the segment (see the module's note).

        Raises:
            FileNotFoundError: the segment was deleted since it was listed.
        """
        segments = self.segments() if segments is None else segments
        if not segments or base > segments[-1]:
            segments = [*segments, base]  # (listed late: the last one, perhaps active)
        return self._map(base, segments)

    def _map(self, base: int, segments: list[int], bound: "LogEnd | SegmentPosition | None" = None) -> "_Mapped":
        """A read-only map of the segment's ``.log`` up to the end of its valid batches, never
        into the zero tail a writer may trim (see the module's note): up to ``bound`` when it is
        in this segment (a log end, or where a planned read stops), else the whole file for a
        segment before the last and up to the log end, found now, for the last one."""
        path = self.segment_file(base, LOG_SUFFIX)
        if bound is not None and bound.segment == base:
            return _Mapped(path, bound.position)
        if base != segments[-1]:
            return _Mapped(path)
        return _Mapped(path, self.log_end(segments).position)

    def high_watermark(self, segments: list[int] | None = None, log_end: LogEnd | None = None) -> int:
        """End of what consumers may read: the log end, capped by a replicated partition's
        checkpointed high watermark (``replication-offset-checkpoint``)."""
        end = (log_end or self.log_end(segments)).offset
        hw = self._checkpoint(REPLICATION_OFFSET_CHECKPOINT)
        return end if hw is None else min(end, max(hw, 0))

    # ------------------------------------------------------------------ transactions
    def _batches(self, segments: list[int], start: int, end: int,
                 log_end: LogEnd | None = None) -> Iterator[tuple[Any, int, Any]]:
        """(valid bytes of a segment, base, its batches' headers) of the segments that hold
        offsets in [start, end), oldest first; the bytes are valid only during the iteration.
        ``log_end``: the last segment's, when the caller has it."""
        for i, base in enumerate(segments):
            following = segments[i + 1] if i + 1 < len(segments) else None
            if base >= end or (following is not None and following <= start):
                continue
            with self._map(base, segments, log_end) as data:
                walk = BatchWalk(data, base)
                headers = list(walk)
                valid = headers[-1][0] + headers[-1][1].size if headers else 0
                with memoryview(data) as whole, whole[:valid] as view:
                    yield view, base, headers

    def last_stable_offset(self, segments: list[int] | None = None, log_end: LogEnd | None = None) -> int:
        """The last stable offset (read_committed readers stop there): the first offset of the
        earliest open transaction, else the high watermark. The producer state comes from the
        newest readable ``.snapshot`` at or below the end and the batch headers after it (the
        whole log when there is none), as the log loads it."""
        segments = self.segments() if segments is None else segments
        if not segments:
            return 0
        log_end = log_end or self.log_end(segments)
        hw = self.high_watermark(segments, log_end)
        table, start = ProducerStateTable(), segments[0]
        for offset in reversed(snapshot_offsets(self.path)):
            if offset > log_end.offset or offset < segments[0]:
                continue
            try:
                table = ProducerStateTable.from_snapshot(_fileio.ops.read_file(snapshot_path(self.path, offset)))
            except (FileNotFoundError, CorruptSnapshotError):
                continue
            start = offset
            break
        for data, _, _ in self._batches(segments, start, log_end.offset, log_end):
            table.record_batches(data, start, None, log_end.offset)
        first = table.first_unstable_offset(hw)
        return hw if first is None else min(first, hw)

    def aborted_transactions(self, start: int, end: int, segments: list[int] | None = None) -> list[AbortedTxn]:
        """The aborted transactions overlapping [start, end), from the segments' ``.txnindex``
        files (read only), as ``Log.aborted_transactions``."""
        segments = self.segments() if segments is None else segments
        found: list[AbortedTxn] = []
        for i, base in enumerate(segments):
            if i + 1 < len(segments) and segments[i + 1] <= start:
                continue
            txns, complete = TransactionIndex(self.segment_file(base, TXNINDEX_SUFFIX), base).collect(start, end)
            found.extend(txns)
            if complete:
                break
        return found

    def aborted_batches(self, start: int, end: int, segments: list[int] | None = None) -> list[tuple[int, int]]:
        """(first, last) offsets of the batches in [start, end) that belong to aborted
        transactions (what a read_committed reader leaves out), ascending; [] when none."""
        segments = self.segments() if segments is None else segments
        aborted = AbortedBatches(self.aborted_transactions(start, end, segments))
        if not aborted:
            return []
        out = []
        for _, _, headers in self._batches(segments, start, end):
            for _, header in headers:
                if (header.base_offset < end and header.last_offset >= start
                        and aborted.covers(header.producer_id, header.base_offset, header.attributes)):
                    out.append((header.base_offset, header.last_offset))
        return out

    # ------------------------------------------------------------------ index lookups
    def _index_floor(self, base: int, offset: int) -> SegmentPosition:
        path = self.segment_file(base, INDEX_SUFFIX)
        index = OffsetIndex.open_readonly(path, base)
        if index is None:
            return SegmentPosition(base, 0)
        try:
            _, position = index.lookup(offset)
        finally:
            index.close()
        return SegmentPosition(base, max(position, 0))

    def seek(self, offset: int, segments: list[int] | None = None) -> SegmentPosition:
        """The segment holding ``offset`` and a batch boundary at or before it, from the offset
        index (position 0 when the index is missing or unusable: indexes are only hints)."""
        segments = self.segments() if segments is None else segments
        if not segments:
            return SegmentPosition(0, 0)
        holder = segments[0]
        for base in segments:
            if base <= offset:
                holder = base
            else:
                break
        return self._index_floor(holder, offset)

    def index_positions(self, segments: list[int] | None = None) -> list[tuple[int, int, int]]:
        """Every offset index entry of every segment as (offset, segment, position): the points
        where a read may start without decoding what comes before (for splitting a scan)."""
        segments = self.segments() if segments is None else segments
        out: list[tuple[int, int, int]] = []
        for base in segments:
            out.append((base, base, 0))
            index = OffsetIndex.open_readonly(self.segment_file(base, INDEX_SUFFIX), base)
            if index is None:
                continue
            try:
                for slot in range(index.entries):
                    offset, position = index.entry(slot)  # the batch holding offset starts there
                    out.append((offset, base, position))
            finally:
                index.close()
        return out

    def timestamp_bounds(self, timestamp: int, segments: list[int] | None = None) -> tuple[int, int | None]:
        """Bounds on the first offset whose record has a timestamp >= ``timestamp`` (Kafka's
        ListOffsets), from the time indexes alone: it lies in [low, high] (high None: up to the
        log end). A reader finds it exactly by reading [low, high] (see read_columns)."""
        segments = self.segments() if segments is None else segments
        low = segments[0] if segments else 0
        if self.remote is not None and self.remote.segments:
            # The remote segments first: their newest timestamps bound the search, unread.
            found = self.remote.timestamp_bounds(timestamp)
            if found is not None and (not segments or found[0] < segments[0]):
                return found
            if not segments:
                return self.remote.segments[-1].end_offset + 1, None
        for base in segments:
            index = TimeIndex.open_readonly(self.segment_file(base, TIMEINDEX_SUFFIX), base)
            if index is None:
                low = base
                continue
            try:
                if index.entries == 0:
                    low = base
                    continue
                # An entry (ts, offset): the largest timestamp up to the batch holding offset.
                last_ts, last_offset = index.last_entry()
                if last_ts < timestamp:
                    low = last_offset  # every record up to here is older: keep looking
                    continue
                slot = lib.ls_timeindex_lookup(index.pointer, index.entries, max(timestamp - 1, -(2**63)))
                low = max(low, index.entry(slot)[1] if slot >= 0 else base)
                # The first entry with ts >= timestamp: a record up to its offset has one.
                return low, index.entry(slot + 1)[1]
            finally:
                index.close()
        return low, None

    # ------------------------------------------------------------------ reading
    def records(self, start: int, end: int) -> Iterator[tuple[int, bytes | None]]:
        """(offset, value) of the local records with ``start <= offset < end``, in offset order
        (control records left out): a small internal topic's, decoded whole segment by segment
        (every batch CRC-checked).

        Raises:
            CorruptRecordError: an invalid batch inside a segment's valid range.
        """
        segments = self.segments()
        decoder = RecordDecoder()
        for i, base in enumerate(segments):
            if base >= end or (i + 1 < len(segments) and segments[i + 1] <= start):
                continue
            try:
                mapped = self._map(base, segments)
            except FileNotFoundError:
                continue  # (deleted since it was listed: its records are gone)
            with mapped as data:
                found, _ = decoder.decode(data, 0, len(data), start, end, path=self.segment_file(base))
                for record in found:
                    if start <= record.offset < end:
                        yield record.offset, record.value

    def scan(self, start: int, end: int, sink: ColumnSink, decoder: RecordDecoder | None = None,
             hint: SegmentPosition | None = None, window: int = 8 << 20,
             stop_at: SegmentPosition | None = None) -> Iterator[None]:
        """Decode the records with ``start <= offset < end`` in offset order, handing each chunk
        of rows to ``sink(buf, out, n)`` as C columns (``ls_records_out``) with positions into
        ``buf``. Rows at or past ``end`` inside the last batch reach the sink too; it drops them.
        Every batch is validated, CRC included, before any of its rows is given.

        A generator: it yields after each ``window`` bytes of a segment, so that the caller can
        hand on what the sink built so far (memory stays bounded by the window), and stops once
        the range is read.

        ``stop_at`` (the :meth:`log_end` of the planning) bounds the bytes read in that segment:
        when ``end`` is the log end, nothing past its last batch is looked at, not even the
        header the decoder would peek at to see where the range stops. Without it, the last
        segment is read up to its log end now.

        Raises:
            DataLossError: ``start`` is below the log start (the records were deleted).
            CorruptRecordError: an invalid batch inside the range.
        """
        decoder = decoder or RecordDecoder()
        if start >= end:
            return
        segments = self.segments()
        log_start = self.log_start_offset(segments)
        if not segments or start < log_start:
            raise DataLossError(f"{self.topic}-{self.partition}: offsets from {start} are gone "
                                f"(the log starts at {log_start})")
        if start < segments[0]:
            raise DataLossError(f"{self.topic}-{self.partition}: offsets from {start} are no longer on local disk "
                                f"(its segments start at {segments[0]}; the older ones are in the remote tier)")
        if hint is None or hint.segment not in segments:
            hint = self.seek(start, segments)
        position = hint.position
        reached = start
        for base in segments:
            if base < hint.segment:
                continue
            if base >= end:
                return
            path = self.segment_file(base, LOG_SUFFIX)
            try:
                mapped = self._map(base, segments, stop_at)
            except FileNotFoundError:
                # Deleted (retention) or swapped (cleaner) since it was listed: list again.
                yield from self.scan(max(start, base), end, sink, decoder, None, window, stop_at)
                return
            with mapped as data:
                reached = max(reached, base)
                size = len(data)
                if position > size:
                    position = 0
                while position < size:
                    limit = min(size, position + window)
                    stop = decoder.decode_columns(data, position, limit, sink, min_offset=start,
                                                  max_offset=end, path=path)
                    if decoder.last_batch_offset >= 0:
                        reached = decoder.last_batch_offset + 1
                    if decoder.last_stop == lib.LS_STOP_MAX_OFFSET or reached >= end:
                        return
                    if decoder.last_stop == lib.LS_STOP_ERROR:
                        cut = _batch_end(data, stop)
                        if limit < size and cut > limit:
                            # The window cut a batch: the next window starts with it, whole.
                            window = max(window, cut - stop)
                        elif BatchWalk(data, base, stop, size).stop.status == lib.LS_ERR_ZERO:
                            position = size  # the zero tail of an active or unsealed segment
                            break
                        else:
                            raise CorruptRecordError(path, stop, "invalid batch inside a sealed segment")
                    position = stop
                    yield None
            position = 0
        if reached < end:
            raise DataLossError(f"{self.topic}-{self.partition}: the log ends at offset {reached}, "
                                f"before the planned end {end} (truncated since it was planned?)")


def _batch_end(data: Any, position: int) -> int:
    """Where the batch starting at ``position`` claims to end (its length field), or past the
    data when its header is not all there."""
    if len(data) - position < HEADER_SIZE:
        return len(data) + 1
    return position + max(parse_header(data, position).size, LOG_OVERHEAD)


class _Mapped:
    """A read-only map of a file, whole or of its first ``limit`` bytes (b"" when there are none).
    ``path``: the file's path, or a descriptor open on it (left open)."""

    def __init__(self, path: str | int, limit: int | None = None) -> None:
        ops = _fileio.ops
        fd = ops.open(path, os.O_RDONLY) if isinstance(path, str) else path
        try:
            self._mm: mmap.mmap | None = None
            for attempt in range(3):
                size = ops.fsize(fd) if limit is None else min(ops.fsize(fd), limit)
                try:
                    self._mm = ops.mmap(fd, size, False) if size > 0 else None
                    break
                except ValueError:
                    # The file shrank between its size and the map: a writer trimmed the segment
                    # it rolled (its preallocated tail). Map what is there now.
                    if attempt == 2:
                        raise
        finally:
            if isinstance(path, str):
                ops.close(fd)

    def __enter__(self) -> Any:
        return self._mm if self._mm is not None else b""

    def __exit__(self, *exc: object) -> None:
        if self._mm is not None:
            try:
                self._mm.close()
            except BufferError:
                pass  # a view of it is still alive somewhere: the map goes with it


#: bytes read at a time by the walk of a segment's tail (the tail from the last index entry is
#: about index_interval_bytes: one read)
_TAIL_CHUNK = 256 << 10


def _valid_end(fd: int, base: int, start: int) -> tuple[int, int]:
    """The offset after the valid batches of the ``.log`` open as ``fd`` from ``start`` (a batch
    boundary; ``base`` when there are none) and the position after them: a torn tail or the zero
    tail of the active segment ends them. The bytes are read with pread, a chunk at a time, never
    through a map: a writer trimming the file meanwhile can only end the walk (see the module's
    note). The rule is :class:`BatchWalk`'s over the whole range; a chunk's walk starts afresh,
    so the rule that offsets increase is checked across chunks here."""
    ops = _fileio.ops
    position, last, want = start, -1, _TAIL_CHUNK
    while True:
        data = ops.pread(fd, want, position)
        res = BatchWalk(data, base).scan()
        if res.batches and parse_header(data, 0).base_offset <= last:
            break  # offsets go backwards at the chunk's first batch: the valid batches end before it
        if res.last_offset >= 0:
            last = res.last_offset
        position += res.valid_bytes
        if res.status == lib.LS_ERR_ZERO and len(data) == want and len(data) - res.valid_bytes < HEADER_SIZE:
            # Fewer zero bytes than a batch header where the chunk ends: the start of a batch the
            # chunk cut (its base offset's high bytes are zero) as well as a zero tail. Read on.
            want = _TAIL_CHUNK
            continue
        if len(data) < want or res.status not in (lib.LS_OK, lib.LS_ERR_TRUNCATED):
            break  # the end of the file, the zero tail or an invalid batch
        if res.status == lib.LS_OK:
            want = _TAIL_CHUNK  # the chunk ended with a whole batch: read on
            continue
        rest = len(data) - res.valid_bytes
        need = parse_header(data, res.valid_bytes).size if rest >= HEADER_SIZE else HEADER_SIZE
        if need <= rest or position + need > ops.fsize(fd):
            break  # a whole batch that is invalid, or one the file cannot hold: no valid batch
        want = max(_TAIL_CHUNK, need)  # the chunk ends inside a batch: read on, the whole of it
    return (last + 1 if last >= 0 else base), position


class SegmentBatches:
    """The valid batches of one segment's ``.log``, named by its path, for a tool that walks the
    file while a writer may use it (``logstore dump``, ``logstore verify``), and what follows
    them in the file.

    ``with SegmentBatches(path, base) as segment:`` maps the file read-only up to the end of its
    valid batches, found with ``pread`` (the module's note: a map reaching into the zero tail a
    writer may trim is a SIGBUS); a ``sealed`` segment (one before the partition's last when it
    was listed: trimmed when it rolled) is mapped whole, as :class:`PartitionView` maps it.
    Iterating gives each valid batch's position and header (the walk of
    :class:`~logstore.log.segmentscan.BatchWalk`, over :attr:`data`); :attr:`stop` then says
    where the valid batches end and why, as the one walk over the whole file would: the bytes
    past them are read with ``pread``, never mapped, and all of them are looked at, since an
    all-zero tail ends the data while a tail with a non-zero byte anywhere is damage that a
    scrub must report.

    A writer may append, roll or close the log meanwhile: the batches read are those the file
    held when it was opened, and what it appended since is not reported as damage (a valid
    batch where they ended reads as their end). Reads only. Not thread-safe: one thread walks
    a segment.

    Raises:
        FileNotFoundError: no such file.
    """

    def __init__(self, path: str, base: int, sealed: bool = False) -> None:
        ops = _fileio.ops
        self.path = path
        self.base = base
        self._sealed = sealed
        self._fd = ops.open(path, os.O_RDONLY)
        try:
            #: the file's size when it was opened, then as the read of its tail found it
            self.size = ops.fsize(self._fd)
            self._mapped = _Mapped(self._fd, None if sealed else _valid_end(self._fd, base, 0)[1])
        except BaseException:
            ops.close(self._fd)
            raise
        #: the valid batches' bytes (mapped read-only; b"" when there are none); a sealed
        #: segment's whole file
        self.data: Any = self._mapped.__enter__()
        self._walk = BatchWalk(self.data, base)
        self._last = -1  # the position of the last valid batch, once the iteration saw them all
        self._stop: WalkStop | None = None

    def __enter__(self) -> "SegmentBatches":
        return self

    def __exit__(self, *exc: object) -> None:
        self._mapped.__exit__()
        if self._fd >= 0:
            _fileio.ops.close(self._fd)
            self._fd = -1

    def __iter__(self) -> Iterator[tuple[int, BatchHeader]]:
        """(position, header) of each valid batch, in order."""
        last = -1
        for position, header in self._walk:
            last = position
            yield position, header
        self._last = last

    @property
    def stop(self) -> WalkStop:
        """Where the file's valid batches end, and why (:class:`~logstore.log.segmentscan.WalkStop`);
        :attr:`size` is then the file's size as its tail was read."""
        if self._stop is None:
            stop = self._walk.stop
            if self._sealed or stop.status != lib.LS_OK:
                self._stop = stop  # (the map is the whole file, or ends at that batch)
            else:
                last = self._last
                if last < 0 and stop.position > 0:  # (the iteration stopped early: find the last batch)
                    last = max(position for position, _ in self._walk)
                before = bytes(self.data[last:stop.position]) if last >= 0 else b""
                self._stop, self.size = _stop_after(self._fd, self.base, stop.position, before)
        return self._stop


def _stop_after(fd: int, base: int, end: int, before: bytes) -> tuple[WalkStop, int]:
    """Where the valid batches of the ``.log`` open as ``fd`` end, and why, given that they end
    at ``end`` (:func:`_valid_end`'s) with the batch ``before`` (b"" when there is none), and
    the file's size as read: the stop of :class:`BatchWalk` over the whole file, from the bytes
    past ``end`` read with pread.

    The walk's verdict on the batch at a position depends on that batch's bytes (its header
    alone when it claims more than the file holds), on the previous batch's last offset (offsets
    increase) and, for an all-zero tail, on whether every byte to the end of the file is zero.
    So the walk here runs over ``before``, then that batch's bytes; when they are all zero the
    rest of the file is read too, a chunk at a time, and a non-zero byte found there is passed
    on as one byte after them (the batch's verdict does not change: the walk judges a batch by
    its own bytes; the tail is then no zero tail, as over the whole file)."""
    ops = _fileio.ops
    ok = WalkStop(end, lib.LS_OK, status_words(lib.LS_OK))
    header = ops.pread(fd, HEADER_SIZE, end)
    if not header:
        return ok, end  # the file ends with its valid batches
    size = ops.fsize(fd)
    claimed = parse_header(header, 0).size if len(header) == HEADER_SIZE else HEADER_SIZE
    piece = ops.pread(fd, claimed, end) if HEADER_SIZE < claimed <= size - end else header
    after = b""
    if piece.count(0) == len(piece):  # a zero tail, if every byte to the end is zero
        position = end + len(piece)
        while True:
            chunk = ops.pread(fd, _ZERO_CHUNK, position)
            if chunk.count(0) != len(chunk):
                after = b"\x01"
                break
            position += len(chunk)
            if len(chunk) < _ZERO_CHUNK:
                size = position  # (the end of the file now: a writer may have trimmed it)
                break
    stop = BatchWalk(before + piece + after, base).stop
    if stop.position > len(before):
        return ok, max(size, end)  # a valid batch there: appended since the valid batches were found
    return replace(stop, position=end), max(size, end + len(piece))


#: bytes read at a time to see whether a segment's tail is all zero
_ZERO_CHUNK = 1 << 20
