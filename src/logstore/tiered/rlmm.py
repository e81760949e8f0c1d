"""The remote log metadata manager (KIP-405's RemoteLogMetadataManager), and Kafka's default one
over the ``__remote_log_metadata`` topic.

:class:`RemoteLogMetadataManager` is the interface the remote tier's copier, readers and
deleters use, a class a user may replace (Kafka's ``remote.log.metadata.manager.class.name``):
it records each remote segment's life (COPY_SEGMENT_STARTED, COPY_SEGMENT_FINISHED,
DELETE_SEGMENT_STARTED, DELETE_SEGMENT_FINISHED) and each partition's deletion, durably, and
answers which remote segment holds an offset.

:class:`TopicBasedRemoteLogMetadataManager` keeps those events as Kafka's does: one record each
(:mod:`logstore.tiered.records`, byte for byte Kafka's) in a log it is handed (the store's
``__remote_log_metadata`` partition, or a replica set's replicated one), so they are as
crash-safe and replicated as any record; its memory is the fold of that log, in log order,
through a :class:`RemotePartitionMetadataStore`.

The rules, as Kafka's RemoteLogMetadataCache and RemotePartitionMetadataStore keep them:

- A segment enters at COPY_SEGMENT_STARTED (added), then moves by updates along
  :func:`~logstore.tiered.metadata.is_valid_transition`; at DELETE_SEGMENT_FINISHED it is
  forgotten. Only COPY_SEGMENT_FINISHED segments serve reads; listings show every state kept.
- By leader epoch (Kafka's RemoteLogLeaderEpochState): each epoch maps the first offset of that
  epoch in each finished segment to the segment. A segment finishing at or below the start of
  the epoch's last mapped segments replaces them when it reaches at least as far as the epoch's
  highest offset so far (a new leader's upload of a range the old one had uploaded: the later
  copy wins, the earlier becomes unreferenced, left for the deleter). The epoch's highest
  offset never moves back.
- By offset alone (what a reader asks, :meth:`RemoteLogMetadataManager.segment_for_offset`):
  the *referenced* finished segments, where none lies inside another: a finished segment
  covering others (start at or before theirs, end at or after theirs) replaces them, one lying
  inside a referenced one is not referenced. Their ends then ascend with their starts, so the
  segment holding an offset is the last one starting at or before it, if it reaches the offset.
- A partition's deletion moves DELETE_PARTITION_MARKED -> STARTED -> FINISHED (a repeat of the
  current state is allowed: a retried request). Once marked, no new segment is added; at
  FINISHED every segment of the partition is forgotten, its deletion state kept until
  :meth:`RemoteLogMetadataManager.forget_partition`.
"""

from __future__ import annotations

import abc
import logging
import threading
from typing import Any, Callable, Iterable

from sortedcontainers import SortedDict, SortedList

from ..errors import LogClosedError, OffsetOutOfRangeError, RemoteResourceNotFoundError
from .metadata import (
    RemoteLogSegmentId,
    RemoteLogSegmentMetadata,
    RemoteLogSegmentMetadataUpdate,
    RemoteLogSegmentState,
    RemotePartitionDeleteMetadata,
    RemotePartitionDeleteState,
    TopicIdPartition,
)
from .records import REMOTE_LOG_METADATA_TOPIC, RemoteLogMetadata, RemoteLogMetadataRecordError, decode, encode

__all__ = ["RemoteLogMetadataManager", "RemotePartitionMetadataStore", "TopicBasedRemoteLogMetadataManager",
           "apply_records"]

logger = logging.getLogger(__name__)

_S = RemoteLogSegmentState
_P = RemotePartitionDeleteState
_NEXT_DELETE_STATE = {None: {_P.DELETE_PARTITION_MARKED},
                      _P.DELETE_PARTITION_MARKED: {_P.DELETE_PARTITION_MARKED, _P.DELETE_PARTITION_STARTED},
                      _P.DELETE_PARTITION_STARTED: {_P.DELETE_PARTITION_STARTED, _P.DELETE_PARTITION_FINISHED},
                      _P.DELETE_PARTITION_FINISHED: {_P.DELETE_PARTITION_FINISHED}}


class RemoteLogMetadataManager(abc.ABC):
    """Where the remote tier keeps the facts of its remote segments (Kafka's
    RemoteLogMetadataManager). Replaceable: a subclass implements every method.

    Durability: the three writes are durable when they return (the order of a copy depends on
    it: "started" is durable before the upload begins, "finished" after it ended). Reads answer
    from what this manager has applied: its own writes, and what :meth:`catch_up` read of
    others'. Thread-safety: implementations are thread-safe.
    """

    @abc.abstractmethod
    def add_remote_log_segment_metadata(self, metadata: RemoteLogSegmentMetadata) -> None:
        """Record a new remote segment, in state COPY_SEGMENT_STARTED; durable on return.

        Raises:
            ValueError: the state is not COPY_SEGMENT_STARTED, the segment id is known already,
                or the partition is being deleted (nothing written).
        """

    @abc.abstractmethod
    def update_remote_log_segment_metadata(self, update: RemoteLogSegmentMetadataUpdate) -> None:
        """Move a known remote segment to ``update.state``; durable on return.

        Raises:
            RemoteResourceNotFoundError: no such segment is known (never added, or deleted).
            ValueError: the move is no valid transition (nothing written).
        """

    @abc.abstractmethod
    def put_remote_partition_delete_metadata(self, metadata: RemotePartitionDeleteMetadata) -> None:
        """Record a partition's deletion state; durable on return.

        Raises:
            ValueError: the move is no valid transition (nothing written).
        """

    @abc.abstractmethod
    def remote_log_segment_metadata(self, tp: TopicIdPartition, leader_epoch: int,
                                    offset: int) -> RemoteLogSegmentMetadata | None:
        """The COPY_SEGMENT_FINISHED segment holding ``offset`` among its records of
        ``leader_epoch`` (Kafka's rule, see the module docstring), or None."""

    @abc.abstractmethod
    def highest_offset_for_epoch(self, tp: TopicIdPartition, leader_epoch: int) -> int | None:
        """The highest offset of ``leader_epoch`` any segment of ``tp`` that reached
        COPY_SEGMENT_FINISHED held (never lowered by deletions), or None."""

    @abc.abstractmethod
    def list_remote_log_segments(self, tp: TopicIdPartition,
                                 leader_epoch: int | None = None) -> list[RemoteLogSegmentMetadata]:
        """Every segment of ``tp`` kept (COPY_SEGMENT_STARTED, COPY_SEGMENT_FINISHED,
        DELETE_SEGMENT_STARTED), or only those holding records of ``leader_epoch``, by ascending
        start offset (equal starts: in the order they were added)."""

    @abc.abstractmethod
    def remote_log_size(self, tp: TopicIdPartition) -> int:
        """The bytes of the COPY_SEGMENT_FINISHED segments of ``tp``."""

    @abc.abstractmethod
    def partition_delete_state(self, tp: TopicIdPartition) -> RemotePartitionDeleteState | None:
        """How far the deletion of ``tp`` went, or None when it was never marked (or forgotten)."""

    @abc.abstractmethod
    def segment_for_offset(self, tp: TopicIdPartition, offset: int) -> RemoteLogSegmentMetadata | None:
        """The referenced COPY_SEGMENT_FINISHED segment of ``tp`` holding ``offset``, whatever
        its epoch (what a reader asks), or None."""

    @abc.abstractmethod
    def remote_log_start_offset(self, tp: TopicIdPartition) -> int | None:
        """The first offset the referenced finished segments of ``tp`` hold, or None."""

    @abc.abstractmethod
    def remote_log_end_offset(self, tp: TopicIdPartition) -> int | None:
        """The last offset (inclusive) the referenced finished segments of ``tp`` hold, or None."""

    @abc.abstractmethod
    def forget_partition(self, tp: TopicIdPartition) -> None:
        """Drop what is kept of ``tp`` once its deletion reached DELETE_PARTITION_FINISHED
        (nothing when nothing is kept).

        Raises:
            ValueError: the partition's deletion has not finished.
        """

    @abc.abstractmethod
    def partitions(self) -> list[TopicIdPartition]:
        """The partitions anything is kept of (a segment not yet DELETE_SEGMENT_FINISHED, or a
        deletion state), sorted: the remote log manager looks among them for the partitions of
        topics deleted while their remote deletion was cut short."""

    @abc.abstractmethod
    def catch_up(self) -> int:
        """Apply the events others recorded since this manager last looked (a follower's copy);
        return how many were applied."""

    @abc.abstractmethod
    def close(self) -> None:
        """Stop; later calls raise :class:`~logstore.errors.LogClosedError`. Idempotent."""


class _EpochState:
    """One leader epoch of one partition (Kafka's RemoteLogLeaderEpochState): the epoch's first
    offset in each referenced finished segment -> that segment, and the highest offset of the
    epoch any finished segment held."""

    __slots__ = ("offset_to_id", "highest")

    def __init__(self) -> None:
        self.offset_to_id: SortedDict = SortedDict()
        self.highest: int | None = None


class _PartitionState:
    """What is kept of one partition. Invariants: ``segments`` holds every segment not yet
    DELETE_SEGMENT_FINISHED, ``ordered`` the same as (start, sequence, id); ``referenced`` maps
    start offsets to COPY_SEGMENT_FINISHED segments none of which lies inside another (so their
    ends ascend); ``finished_bytes`` is the size of the COPY_SEGMENT_FINISHED ones."""

    __slots__ = ("segments", "sequence", "ordered", "referenced", "epochs", "finished_bytes", "deletion", "added")

    def __init__(self) -> None:
        self.deletion: RemotePartitionDeleteMetadata | None = None
        self.clear_segments()

    def clear_segments(self) -> None:
        """Forget every segment (the partition's deletion finished); keep the deletion state."""
        self.segments: dict[RemoteLogSegmentId, RemoteLogSegmentMetadata] = {}
        self.sequence: dict[RemoteLogSegmentId, int] = {}
        self.ordered: SortedList = SortedList()
        self.referenced: SortedDict = SortedDict()
        self.epochs: dict[int, _EpochState] = {}
        self.finished_bytes = 0
        self.added = 0


def _epoch_end(segment: RemoteLogSegmentMetadata, epoch: int) -> int:
    """The last offset of ``epoch`` in ``segment``: the next epoch's first offset - 1, or its end."""
    later = [(e, offset) for e, offset in segment.segment_leader_epochs.items() if e > epoch]
    return min(later)[1] - 1 if later else segment.end_offset


class RemotePartitionMetadataStore:
    """The remote log metadata of every partition in memory (Kafka's RemotePartitionMetadataStore
    with its RemoteLogMetadataCache per partition): events are validated and applied, lookups by
    offset and epoch take O(log n). The rules are the module docstring's.

    No I/O. Not thread-safe: its owner serialises calls (the manager's state lock).
    """

    def __init__(self) -> None:
        self._partitions: dict[TopicIdPartition, _PartitionState] = {}
        # Partitions forgotten after their deletion finished: every later event of theirs is
        # refused, as the log's fold would refuse it (after DELETE_PARTITION_FINISHED), so the
        # state stays the fold of the log. A partition's name and id only; none come back
        # (a topic created again has a new id).
        self._forgotten: set[TopicIdPartition] = set()

    # ------------------------------------------------------------------ events
    def validate(self, event: RemoteLogMetadata) -> None:
        """Check that :meth:`apply` would take ``event``; change nothing.

        Raises:
            RemoteResourceNotFoundError: an update of a segment not kept.
            ValueError: a segment not added at COPY_SEGMENT_STARTED, added twice or to a
                partition being deleted; an invalid transition of a segment or a partition.
            TypeError: ``event`` is none of the three kinds.
        """
        if isinstance(event, (RemoteLogSegmentMetadata, RemotePartitionDeleteMetadata)) \
                and event.topic_id_partition in self._forgotten:
            raise ValueError(f"partition {event.topic_id_partition} was deleted (DELETE_PARTITION_FINISHED) and "
                             "forgotten: nothing more is recorded of it")
        if isinstance(event, RemoteLogSegmentMetadata):
            part = self._partitions.get(event.topic_id_partition)
            if event.state != _S.COPY_SEGMENT_STARTED:
                raise ValueError(f"{event.describe()}: a new segment is added at COPY_SEGMENT_STARTED, "
                                 f"not {event.state.name}")
            if part is not None and event.segment_id in part.segments:
                raise ValueError(f"{event.describe()} is known already "
                                 f"({part.segments[event.segment_id].state.name})")
            if part is not None and part.deletion is not None:
                raise ValueError(f"{event.describe()}: partition {event.topic_id_partition} is being deleted "
                                 f"({part.deletion.state.name}): no segment is added to it")
        elif isinstance(event, RemoteLogSegmentMetadataUpdate):
            part = self._partitions.get(event.segment_id.topic_id_partition)
            current = None if part is None else part.segments.get(event.segment_id)
            if current is None:
                raise RemoteResourceNotFoundError(f"no remote log segment metadata for {event.segment_id} "
                                                  f"(update to {event.state.name})")
            current.with_update(event)  # raises ValueError for an invalid transition
        elif isinstance(event, RemotePartitionDeleteMetadata):
            part = self._partitions.get(event.topic_id_partition)
            state = None if part is None or part.deletion is None else part.deletion.state
            if event.state not in _NEXT_DELETE_STATE[state]:
                raise ValueError(f"partition {event.topic_id_partition}: deletion "
                                 f"{'not marked' if state is None else state.name} -> {event.state.name} "
                                 "is no valid transition")
        else:
            raise TypeError(f"a remote log metadata event, not {type(event).__name__}")

    def apply(self, event: RemoteLogMetadata) -> None:
        """Apply ``event`` after :meth:`validate` (its errors, nothing changed)."""
        self.validate(event)
        if isinstance(event, RemoteLogSegmentMetadata):
            part = self._partitions.setdefault(event.topic_id_partition, _PartitionState())
            part.segments[event.segment_id] = event
            part.sequence[event.segment_id] = part.added
            part.ordered.add((event.start_offset, part.added, event.segment_id))
            part.added += 1
        elif isinstance(event, RemoteLogSegmentMetadataUpdate):
            part = self._partitions[event.segment_id.topic_id_partition]
            old = part.segments[event.segment_id]
            new = old.with_update(event)
            if new.state == _S.DELETE_SEGMENT_FINISHED:
                del part.segments[event.segment_id]
                part.ordered.remove((new.start_offset, part.sequence.pop(event.segment_id), event.segment_id))
                return
            part.segments[event.segment_id] = new
            if new.state == _S.COPY_SEGMENT_FINISHED:
                part.finished_bytes += new.segment_size_in_bytes
                self._reference(part, new)
            elif new.state == _S.DELETE_SEGMENT_STARTED:
                if old.state == _S.COPY_SEGMENT_FINISHED:
                    part.finished_bytes -= old.segment_size_in_bytes
                self._unreference(part, new)
        else:
            part = self._partitions.setdefault(event.topic_id_partition, _PartitionState())
            part.deletion = event
            if event.state == _P.DELETE_PARTITION_FINISHED:
                part.clear_segments()

    @staticmethod
    def _reference(part: _PartitionState, segment: RemoteLogSegmentMetadata) -> None:
        """A segment reached COPY_SEGMENT_FINISHED: map it by epoch and by offset."""
        segment_id = segment.segment_id
        for epoch, first in segment.segment_leader_epochs.items():
            state = part.epochs.setdefault(epoch, _EpochState())
            end = _epoch_end(segment, epoch)
            mapped = state.offset_to_id
            # Kafka's rule: a copy reaching the epoch's highest offset replaces the copies
            # mapped at or after its first offset (a new leader's upload of the same range).
            if state.highest is not None and state.highest <= end:
                while mapped and mapped.peekitem(-1)[0] >= first:
                    mapped.popitem(-1)
            mapped[first] = segment_id
            if state.highest is None or end > state.highest:
                state.highest = end
        referenced = part.referenced
        # Invariant: no referenced segment lies inside another. Drop those this one covers
        # (they start at or after it, and their ends ascend: a prefix of them), then keep this
        # one unless the last one starting at or before it covers it.
        i = referenced.bisect_left(segment.start_offset)
        while i < len(referenced) and part.segments[referenced.peekitem(i)[1]].end_offset <= segment.end_offset:
            referenced.popitem(i)
        i = referenced.bisect_right(segment.start_offset) - 1
        if i >= 0 and part.segments[referenced.peekitem(i)[1]].end_offset >= segment.end_offset:
            return
        referenced[segment.start_offset] = segment_id

    @staticmethod
    def _unreference(part: _PartitionState, segment: RemoteLogSegmentMetadata) -> None:
        """A segment is being deleted: no lookup finds it any more."""
        segment_id = segment.segment_id
        for epoch, first in segment.segment_leader_epochs.items():
            state = part.epochs.get(epoch)
            if state is not None and state.offset_to_id.get(first) == segment_id:
                del state.offset_to_id[first]
        if part.referenced.get(segment.start_offset) == segment_id:
            del part.referenced[segment.start_offset]

    def forget_partition(self, tp: TopicIdPartition) -> None:
        """Drop ``tp`` once its deletion finished (see RemoteLogMetadataManager.forget_partition)."""
        part = self._partitions.get(tp)
        if part is None:
            return
        if part.deletion is None or part.deletion.state != _P.DELETE_PARTITION_FINISHED:
            state = "not marked" if part.deletion is None else part.deletion.state.name
            raise ValueError(f"partition {tp} is forgotten only after DELETE_PARTITION_FINISHED, its deletion "
                             f"is {state}")
        del self._partitions[tp]
        self._forgotten.add(tp)

    # ------------------------------------------------------------------ lookups
    def remote_log_segment_metadata(self, tp: TopicIdPartition, leader_epoch: int,
                                    offset: int) -> RemoteLogSegmentMetadata | None:
        part = self._partitions.get(tp)
        state = None if part is None else part.epochs.get(leader_epoch)
        if state is None:
            return None
        i = state.offset_to_id.bisect_right(offset) - 1
        if i < 0:
            return None
        segment = part.segments[state.offset_to_id.peekitem(i)[1]]  # type: ignore[union-attr]
        return segment if offset <= _epoch_end(segment, leader_epoch) else None

    def highest_offset_for_epoch(self, tp: TopicIdPartition, leader_epoch: int) -> int | None:
        part = self._partitions.get(tp)
        state = None if part is None else part.epochs.get(leader_epoch)
        return None if state is None else state.highest

    def list_remote_log_segments(self, tp: TopicIdPartition,
                                 leader_epoch: int | None = None) -> list[RemoteLogSegmentMetadata]:
        part = self._partitions.get(tp)
        if part is None:
            return []
        found = (part.segments[segment_id] for _, _, segment_id in part.ordered)
        if leader_epoch is None:
            return list(found)
        return [segment for segment in found if leader_epoch in segment.segment_leader_epochs]

    def remote_log_size(self, tp: TopicIdPartition) -> int:
        part = self._partitions.get(tp)
        return 0 if part is None else part.finished_bytes

    def partition_delete_state(self, tp: TopicIdPartition) -> RemotePartitionDeleteState | None:
        part = self._partitions.get(tp)
        return None if part is None or part.deletion is None else part.deletion.state

    def segment_for_offset(self, tp: TopicIdPartition, offset: int) -> RemoteLogSegmentMetadata | None:
        part = self._partitions.get(tp)
        if part is None:
            return None
        i = part.referenced.bisect_right(offset) - 1
        if i < 0:
            return None
        segment = part.segments[part.referenced.peekitem(i)[1]]
        return segment if offset <= segment.end_offset else None

    def remote_log_start_offset(self, tp: TopicIdPartition) -> int | None:
        part = self._partitions.get(tp)
        return None if part is None or not part.referenced else part.referenced.peekitem(0)[0]

    def referenced_segments(self, tp: TopicIdPartition) -> list[RemoteLogSegmentMetadata]:
        """The referenced COPY_SEGMENT_FINISHED segments of ``tp`` (what readers read: none
        lies inside another), by ascending start offset; their ends ascend too."""
        part = self._partitions.get(tp)
        return [] if part is None else [part.segments[segment_id] for segment_id in part.referenced.values()]

    def remote_log_end_offset(self, tp: TopicIdPartition) -> int | None:
        part = self._partitions.get(tp)
        if part is None or not part.referenced:
            return None
        return part.segments[part.referenced.peekitem(-1)[1]].end_offset

    def partitions(self) -> list[TopicIdPartition]:
        """The partitions anything is kept of, sorted."""
        return sorted(self._partitions)


class TopicBasedRemoteLogMetadataManager(RemoteLogMetadataManager):
    """The remote log metadata as Kafka's TopicBasedRemoteLogMetadataManager keeps it: one record
    per event (null key; the value :func:`logstore.tiered.records.encode`'s) in ``log``, the
    store's ``__remote_log_metadata`` partition.

    Args:
        log: an open log with the shape of :class:`~logstore.log.log.Log` that
            ``ReplicatedLog`` also has (``log_start_offset``, ``log_end_offset``,
            ``read(offset, max_offset=...)``, ``append_batch(values, keys)``, ``flush()``). Its
            owner opens and closes it; this manager is its only writer.
        read_to: how far to read the log (default: its log end offset). A follower's manager
            over its own replica passes the replica's high watermark, so that it never applies
            a record a new leader may truncate.

    Loading: every record from the log start is read and applied at construction, in log
    order. A record that cannot be decoded (damaged, a newer Kafka's version) or that its
    state refuses (an invalid transition, an update of an unknown segment: what a crash between
    two writers, or two leaders, may leave) is logged and skipped, never fatal: the store opens
    with the rest. The same rule applies to what :meth:`catch_up` reads, so the state is always
    the fold of the log.

    Durability: each write validates the event against the state (after reading what others
    appended meanwhile), appends one record, flushes the log (``ReplicatedLog.flush``: a
    majority holds it), then reads it back and applies it. Nothing is written when validation
    fails; when the append or flush raises, the record may or may not be in the log, and the
    state shows it once a later write or :meth:`catch_up` reads it.

    Thread-safety: thread-safe. Two locks: the write lock serialises writers, catch-up and the
    load, and is held while the log is read, written and flushed; the state lock guards the
    in-memory state and is held only to validate, apply and look up, never across log I/O, so
    readers never wait for a write's flush. Order: write lock, then state lock; the log's own
    lock is taken inside its calls, below both, and the log never calls back.
    """

    def __init__(self, log: Any, *, read_to: Callable[[], int] | None = None) -> None:
        self._log = log
        self._read_to = read_to if read_to is not None else (lambda: log.log_end_offset)
        self._write_lock = threading.Lock()
        self._state_lock = threading.Lock()
        self._store = RemotePartitionMetadataStore()
        self._closed = False
        self._next_offset = log.log_start_offset
        with self._write_lock:
            applied = self._catch_up_locked()
        logger.info("loaded %d %s records (up to offset %d): %d partitions", applied, REMOTE_LOG_METADATA_TOPIC,
                    self._next_offset, len(self._store.partitions()))

    @property
    def next_offset(self) -> int:
        """The next offset of the log this manager will read (everything below it is applied)."""
        with self._write_lock:
            return self._next_offset

    # ------------------------------------------------------------------ writes
    def add_remote_log_segment_metadata(self, metadata: RemoteLogSegmentMetadata) -> None:
        self._write(metadata)

    def update_remote_log_segment_metadata(self, update: RemoteLogSegmentMetadataUpdate) -> None:
        self._write(update)

    def put_remote_partition_delete_metadata(self, metadata: RemotePartitionDeleteMetadata) -> None:
        self._write(metadata)

    def _write(self, event: RemoteLogMetadata) -> None:
        with self._write_lock:
            self._check_open()
            self._catch_up_locked()
            with self._state_lock:
                self._store.validate(event)
            value = encode(event)
            self._log.append_batch([value], [None])
            self._log.flush()
            self._catch_up_locked()

    def catch_up(self) -> int:
        """See :meth:`RemoteLogMetadataManager.catch_up`. Raises what the log's reads raise."""
        with self._write_lock:
            self._check_open()
            return self._catch_up_locked()

    def _catch_up_locked(self) -> int:
        """Apply the records from ``_next_offset`` to the read limit (held: the write lock)."""
        end = self._read_to()
        if end < self._next_offset:
            # The log was truncated below what was applied (a follower's replica after a
            # leader change): what was applied may be gone, so the state is rebuilt.
            logger.warning("%s ends at %d, below the %d records applied: loading it again", REMOTE_LOG_METADATA_TOPIC,
                           end, self._next_offset)
            with self._state_lock:
                self._store = RemotePartitionMetadataStore()
            self._next_offset = self._log.log_start_offset
        applied = 0
        position = self._next_offset
        while position < end:
            try:
                records = self._log.read(position, max_offset=end)
            except OffsetOutOfRangeError as exc:
                if exc.log_start_offset <= position:
                    raise
                # Retention removed records never applied ("__remote_log_metadata" keeps
                # them forever by default): what is left is applied from its start.
                logger.warning("%s records %d..%d are gone (the log starts at %d): skipped",
                               REMOTE_LOG_METADATA_TOPIC, position, exc.log_start_offset - 1, exc.log_start_offset)
                position = self._next_offset = exc.log_start_offset
                continue
            if not records:  # only control records are left below the limit
                position = end
                break
            events = [(record.offset, self._decoded(record)) for record in records]
            with self._state_lock:
                applied += self._apply_all(events)
            position = self._next_offset = records[-1].offset + 1
        self._next_offset = max(self._next_offset, position)
        return applied

    @staticmethod
    def _decoded(record: Any) -> RemoteLogMetadata | None:
        return _decoded(record.offset, record.value)

    def _apply_all(self, events: Iterable[tuple[int, RemoteLogMetadata | None]]) -> int:
        """Apply each decoded event (held: the state lock); an event the state refuses is skipped."""
        return _apply_all(self._store, events)

    def close(self) -> None:
        """See :meth:`RemoteLogMetadataManager.close`. The log stays open (its owner closes it)."""
        with self._write_lock, self._state_lock:
            self._closed = True
            self._store = RemotePartitionMetadataStore()

    def _check_open(self) -> None:
        if self._closed:
            raise LogClosedError(f"the {REMOTE_LOG_METADATA_TOPIC} manager is closed")

    # ------------------------------------------------------------------ lookups
    def _lookup(self, method: Callable[..., Any], *args: Any) -> Any:
        with self._state_lock:
            self._check_open()
            return method(self._store, *args)

    def remote_log_segment_metadata(self, tp: TopicIdPartition, leader_epoch: int,
                                    offset: int) -> RemoteLogSegmentMetadata | None:
        return self._lookup(RemotePartitionMetadataStore.remote_log_segment_metadata, tp, leader_epoch, offset)

    def highest_offset_for_epoch(self, tp: TopicIdPartition, leader_epoch: int) -> int | None:
        return self._lookup(RemotePartitionMetadataStore.highest_offset_for_epoch, tp, leader_epoch)

    def list_remote_log_segments(self, tp: TopicIdPartition,
                                 leader_epoch: int | None = None) -> list[RemoteLogSegmentMetadata]:
        return self._lookup(RemotePartitionMetadataStore.list_remote_log_segments, tp, leader_epoch)

    def remote_log_size(self, tp: TopicIdPartition) -> int:
        return self._lookup(RemotePartitionMetadataStore.remote_log_size, tp)

    def partition_delete_state(self, tp: TopicIdPartition) -> RemotePartitionDeleteState | None:
        return self._lookup(RemotePartitionMetadataStore.partition_delete_state, tp)

    def segment_for_offset(self, tp: TopicIdPartition, offset: int) -> RemoteLogSegmentMetadata | None:
        return self._lookup(RemotePartitionMetadataStore.segment_for_offset, tp, offset)

    def remote_log_start_offset(self, tp: TopicIdPartition) -> int | None:
        return self._lookup(RemotePartitionMetadataStore.remote_log_start_offset, tp)

    def remote_log_end_offset(self, tp: TopicIdPartition) -> int | None:
        return self._lookup(RemotePartitionMetadataStore.remote_log_end_offset, tp)

    def forget_partition(self, tp: TopicIdPartition) -> None:
        """See :meth:`RemoteLogMetadataManager.forget_partition`: in memory only, so a manager
        loaded again from the log sees the partition's DELETE_PARTITION_FINISHED state (and no
        segment) until it forgets it too."""
        self._lookup(RemotePartitionMetadataStore.forget_partition, tp)

    def partitions(self) -> list[TopicIdPartition]:
        """The partitions anything is kept of, sorted."""
        return self._lookup(RemotePartitionMetadataStore.partitions)  # type: ignore[no-any-return]


def _decoded(offset: int, value: bytes | None) -> RemoteLogMetadata | None:
    """The event of the record at ``offset``, None (logged) when it has no value or cannot be
    decoded."""
    if value is None:
        logger.warning("skipping the record at offset %d of %s: it has no value", offset, REMOTE_LOG_METADATA_TOPIC)
        return None
    try:
        return decode(value)
    except RemoteLogMetadataRecordError as exc:
        logger.warning("skipping the record at offset %d of %s: %s", offset, REMOTE_LOG_METADATA_TOPIC, exc.detail)
        return None


def _apply_all(store: RemotePartitionMetadataStore, events: Iterable[tuple[int, RemoteLogMetadata | None]]) -> int:
    applied = 0
    for offset, event in events:
        if event is None:
            continue
        try:
            store.apply(event)
        except (ValueError, RemoteResourceNotFoundError) as exc:
            logger.warning("skipping the record at offset %d of %s: %s", offset, REMOTE_LOG_METADATA_TOPIC, exc)
            continue
        applied += 1
    return applied


def apply_records(store: RemotePartitionMetadataStore, records: Iterable[tuple[int, bytes | None]]) -> int:
    """Fold ``__remote_log_metadata`` records, (offset, value) in log order, into ``store`` by
    the rule of :class:`TopicBasedRemoteLogMetadataManager`'s load (the one statement of it): a
    record that cannot be decoded, or whose event the state refuses, is logged and skipped.
    Returns how many were applied. Not thread-safe (as ``store``)."""
    return _apply_all(store, ((offset, _decoded(offset, value)) for offset, value in records))
