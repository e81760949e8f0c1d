"""The facts the remote tier keeps about each remote segment (KIP-405), by Kafka's names.

A sealed segment copied to the object store is a :class:`RemoteLogSegmentMetadata`: which
partition (:class:`TopicIdPartition`), a unique id per copy (:class:`RemoteLogSegmentId`: a copy
retried or cut short by a crash never overwrites a finished one), its first and last offsets, its
newest timestamp, its size, the leader epochs it spans, whether its transaction index is empty,
and its state. The state moves only forward, as Kafka's RemoteLogSegmentState:
COPY_SEGMENT_STARTED -> COPY_SEGMENT_FINISHED -> DELETE_SEGMENT_STARTED -> DELETE_SEGMENT_FINISHED
(a copy that never finished goes straight to DELETE_SEGMENT_STARTED). A partition's deletion
(its topic deleted) is a :class:`RemotePartitionDeleteMetadata`.

What the RemoteStorageManager is handed to copy is a :class:`LogSegmentData`: the paths of the
segment's files and the leader epochs' checkpoint bytes.

Plain immutable values: thread-safe, no I/O. Their durable form is the record codec of
:mod:`logstore.tiered.records`, kept in the store's ``__remote_log_metadata`` topic.
"""

from __future__ import annotations

import enum
import uuid
from dataclasses import dataclass, field, replace
from typing import Mapping

__all__ = [
    "TopicIdPartition",
    "RemoteLogSegmentId",
    "RemoteLogSegmentState",
    "RemotePartitionDeleteState",
    "RemoteLogSegmentMetadata",
    "RemoteLogSegmentMetadataUpdate",
    "RemotePartitionDeleteMetadata",
    "LogSegmentData",
    "IndexType",
    "is_valid_transition",
]


@dataclass(frozen=True, order=True)
class TopicIdPartition:
    """One partition, by its topic's id (KIP-516) and name."""

    topic_id: uuid.UUID
    topic: str
    partition: int

    def __str__(self) -> str:
        return f"{self.topic}-{self.partition}"


@dataclass(frozen=True)
class RemoteLogSegmentId:
    """A remote segment's identity: its partition and a random UUID made for each copy."""

    topic_id_partition: TopicIdPartition
    id: uuid.UUID

    @classmethod
    def generate(cls, topic_id_partition: TopicIdPartition) -> "RemoteLogSegmentId":
        """A new id for a new copy of a segment of ``topic_id_partition``."""
        return cls(topic_id_partition, uuid.uuid4())

    def __str__(self) -> str:
        return f"{self.topic_id_partition}:{self.id}"


class RemoteLogSegmentState(enum.IntEnum):
    """Kafka's RemoteLogSegmentState, with Kafka's ids (the byte in the metadata records)."""

    COPY_SEGMENT_STARTED = 0
    COPY_SEGMENT_FINISHED = 1
    DELETE_SEGMENT_STARTED = 2
    DELETE_SEGMENT_FINISHED = 3


_NEXT = {
    RemoteLogSegmentState.COPY_SEGMENT_STARTED: {RemoteLogSegmentState.COPY_SEGMENT_FINISHED,
                                                 RemoteLogSegmentState.DELETE_SEGMENT_STARTED},
    RemoteLogSegmentState.COPY_SEGMENT_FINISHED: {RemoteLogSegmentState.DELETE_SEGMENT_STARTED},
    RemoteLogSegmentState.DELETE_SEGMENT_STARTED: {RemoteLogSegmentState.DELETE_SEGMENT_FINISHED},
    RemoteLogSegmentState.DELETE_SEGMENT_FINISHED: set(),
}


def is_valid_transition(source: RemoteLogSegmentState | None, target: RemoteLogSegmentState) -> bool:
    """Whether a segment in state ``source`` (None: not known yet) may move to ``target``: a new
    segment starts at COPY_SEGMENT_STARTED, and every move is one of Kafka's."""
    if source is None:
        return target == RemoteLogSegmentState.COPY_SEGMENT_STARTED
    return target in _NEXT[source]


class RemotePartitionDeleteState(enum.IntEnum):
    """Kafka's RemotePartitionDeleteState, with Kafka's ids."""

    DELETE_PARTITION_MARKED = 0
    DELETE_PARTITION_STARTED = 1
    DELETE_PARTITION_FINISHED = 2


@dataclass(frozen=True)
class RemoteLogSegmentMetadata:
    """One remote segment (Kafka's RemoteLogSegmentMetadata).

    ``end_offset`` is inclusive (the last offset of its last batch), as Kafka's.
    ``segment_leader_epochs`` maps each leader epoch the segment holds records of to the first
    offset of that epoch in it, ascending. ``custom_metadata``: what the RemoteStorageManager
    returned from its copy, kept for its later fetches and deletion (None when it returned
    nothing). ``broker_id``: the node that made the event (0 for a store that is no replica set).
    """

    segment_id: RemoteLogSegmentId
    start_offset: int
    end_offset: int
    max_timestamp_ms: int
    broker_id: int
    event_timestamp_ms: int
    segment_size_in_bytes: int
    segment_leader_epochs: Mapping[int, int] = field(default_factory=dict)
    state: RemoteLogSegmentState = RemoteLogSegmentState.COPY_SEGMENT_STARTED
    custom_metadata: bytes | None = None
    txn_index_empty: bool = True

    def __post_init__(self) -> None:
        if self.start_offset < 0 or self.end_offset < self.start_offset:
            raise ValueError(f"remote segment {self.segment_id}: offsets {self.start_offset}..{self.end_offset} "
                             f"are no range")
        if self.segment_size_in_bytes < 0:
            raise ValueError(f"remote segment {self.segment_id}: size {self.segment_size_in_bytes} < 0")

    @property
    def topic_id_partition(self) -> TopicIdPartition:
        return self.segment_id.topic_id_partition

    def with_update(self, update: "RemoteLogSegmentMetadataUpdate") -> "RemoteLogSegmentMetadata":
        """This segment after ``update`` (its state, event time, broker and custom metadata).

        Raises:
            ValueError: the update names another segment, or moves the state backwards.
        """
        if update.segment_id != self.segment_id:
            raise ValueError(f"update of {update.segment_id} applied to {self.segment_id}")
        if not is_valid_transition(self.state, update.state):
            raise ValueError(f"remote segment {self.segment_id}: {self.state.name} -> {update.state.name} "
                             f"is no valid transition")
        return replace(self, state=update.state, event_timestamp_ms=update.event_timestamp_ms,
                       broker_id=update.broker_id,
                       custom_metadata=update.custom_metadata if update.custom_metadata is not None
                       else self.custom_metadata)

    def describe(self) -> str:
        """The segment as a message names it: partition, offsets, id."""
        return f"remote segment {self.segment_id.topic_id_partition} [{self.start_offset}..{self.end_offset}] " \
               f"id {self.segment_id.id}"


@dataclass(frozen=True)
class RemoteLogSegmentMetadataUpdate:
    """A remote segment's change of state (Kafka's RemoteLogSegmentMetadataUpdate)."""

    segment_id: RemoteLogSegmentId
    event_timestamp_ms: int
    state: RemoteLogSegmentState
    broker_id: int
    custom_metadata: bytes | None = None


@dataclass(frozen=True)
class RemotePartitionDeleteMetadata:
    """A partition whose remote segments all go (its topic was deleted), and how far that got."""

    topic_id_partition: TopicIdPartition
    state: RemotePartitionDeleteState
    event_timestamp_ms: int
    broker_id: int


@dataclass(frozen=True)
class LogSegmentData:
    """What a copy uploads (Kafka's LogSegmentData): the paths of a sealed segment's ``.log``,
    ``.index`` and ``.timeindex``, its ``.txnindex`` (None when the segment has none), the
    producer-state snapshot at its end (None when there is none), and the leader epochs'
    checkpoint bytes for the offsets up to its end."""

    log_segment: str
    offset_index: str
    time_index: str
    transaction_index: str | None
    producer_snapshot_index: str | None
    leader_epoch_index: bytes


class IndexType(enum.Enum):
    """The indexes a RemoteStorageManager fetches (Kafka's IndexType), with the file suffix each
    has on local disk."""

    OFFSET = ".index"
    TIMESTAMP = ".timeindex"
    PRODUCER_SNAPSHOT = ".snapshot"
    TRANSACTION = ".txnindex"
    LEADER_EPOCH = ".leader-epoch-checkpoint"
