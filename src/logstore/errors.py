"""The exception hierarchy of logstore.

Every error that logstore raises on purpose derives from :class:`LogstoreError`, except bad
arguments, which stay :class:`TypeError` / :class:`ValueError` as in any Python library. Messages
name the file, the offset or position, and what was expected against what was found.

These classes hold no state beyond their attributes and are safe to share between threads.
"""

from __future__ import annotations

__all__ = [
    "LogstoreError",
    "CorruptRecordError",
    "CorruptIndexError",
    "OffsetOutOfRangeError",
    "RecordTooLargeError",
    "LogClosedError",
    "InvalidRecordError",
    "LogLockedError",
    "LogOfflineError",
    "InvalidTopicError",
    "UnsupportedCodecError",
    "InvalidConfigError",
    "InvalidPartitionsError",
    "InvalidTxnStateError",
    "ProducerFencedError",
    "TransactionCoordinatorFencedError",
    "UnknownTopicOrPartitionError",
    "UnknownTopicIdError",
    "InconsistentTopicIdError",
    "TopicExistsError",
    "InvalidProducerEpochError",
    "OutOfOrderSequenceError",
    "CommitFailedError",
    "NotLeaderOrFollowerError",
    "RequestTimedOutError",
    "RemoteStorageError",
    "RemoteResourceNotFoundError",
    "OffsetMovedToTieredStorageError",
    "DataLossError",
]


class LogstoreError(Exception):
    """Root of every error logstore raises on purpose."""


class CorruptRecordError(LogstoreError):
    """A batch failed validation: bad CRC, impossible length, or malformed records.

    Attributes:
        path: the file holding the batch, or None when unknown (for example inside a codec).
        position: byte position of the batch in ``path``, or None.
        reason: what was wrong, in words.
        stored_crc / computed_crc: set when the failure is a CRC mismatch.
    """

    def __init__(
        self,
        path: str | None,
        position: int | None,
        reason: str,
        stored_crc: int | None = None,
        computed_crc: int | None = None,
    ) -> None:
        self.path = path
        self.position = position
        self.reason = reason
        self.stored_crc = stored_crc
        self.computed_crc = computed_crc
        where = path if path is not None else "<buffer>"
        if position is not None:
            where = f"{where} at position {position}"
        message = f"Record is corrupt in {where}: {reason}"
        if stored_crc is not None and computed_crc is not None:
            message += f" (stored crc = {stored_crc:#010x}, computed crc = {computed_crc:#010x})"
        super().__init__(message)

    def __reduce__(self):  # keep pickling (multiprocessing) faithful
        return (
            type(self),
            (self.path, self.position, self.reason, self.stored_crc, self.computed_crc),
        )


class CorruptIndexError(LogstoreError):
    """An index file failed its sanity check. Recovery catches this and rebuilds the index."""

    def __init__(self, path: str, reason: str) -> None:
        self.path = path
        self.reason = reason
        super().__init__(f"Corrupt index {path}: {reason}")

    def __reduce__(self):
        return (type(self), (self.path, self.reason))


class OffsetOutOfRangeError(LogstoreError):
    """An offset outside ``[log_start_offset, log_end_offset]`` was asked for.

    Attributes:
        offset: the offset asked for.
        log_start_offset / log_end_offset: the valid range at the time of the call.
    """

    def __init__(self, offset: int, log_start_offset: int, log_end_offset: int, what: str = "") -> None:
        self.offset = offset
        self.log_start_offset = log_start_offset
        self.log_end_offset = log_end_offset
        self.what = what
        prefix = f"{what}: " if what else ""
        super().__init__(
            f"{prefix}offset {offset} is out of range; valid offsets are "
            f"[{log_start_offset}, {log_end_offset}]"
        )

    def __reduce__(self):
        return (type(self), (self.offset, self.log_start_offset, self.log_end_offset, self.what))


class RecordTooLargeError(LogstoreError):
    """A batch is larger than ``max_message_bytes``; nothing was written."""

    def __init__(self, size: int, limit: int) -> None:
        self.size = size
        self.limit = limit
        super().__init__(
            f"batch of {size} bytes is larger than max_message_bytes = {limit}; nothing was written"
        )

    def __reduce__(self):
        return (type(self), (self.size, self.limit))


class InvalidRecordError(LogstoreError, ValueError):
    """A record the log's settings forbid, e.g. a record without a key in a compacted log
    (Kafka rejects those too: compaction keeps the latest record per key). Nothing is written."""


class LogClosedError(LogstoreError):
    """The log was used after ``close()``."""


class LogOfflineError(LogstoreError):
    """An I/O error left the log's files in an unknown state; the log refuses further use.

    As Kafka takes a log directory offline after an I/O error, the log must be closed and
    opened again, which recovers it from what is on disk.
    """


class LogLockedError(LogstoreError):
    """Another process holds the log open for writing."""


class InvalidTopicError(LogstoreError, ValueError):
    """A topic or partition directory name breaks Kafka's naming rules."""


class UnsupportedCodecError(LogstoreError):
    """A compression codec is known but its library is not installed (lz4)."""


class InvalidConfigError(LogstoreError, ValueError):
    """A configuration value is out of range or of the wrong kind."""


class InvalidPartitionsError(LogstoreError, ValueError):
    """A topic's new partition count does not grow it (Kafka's InvalidPartitionsException)."""


class UnknownTopicOrPartitionError(LogstoreError, KeyError):
    """The store has no such topic, or the topic has no such partition (Kafka's
    UnknownTopicOrPartitionException)."""

    def __str__(self) -> str:  # KeyError would show the message quoted
        return str(self.args[0]) if self.args else ""


class TopicExistsError(LogstoreError):
    """create_topic() of a topic that already exists (Kafka's TopicExistsException)."""


class UnknownTopicIdError(UnknownTopicOrPartitionError):
    """No topic has this id (KIP-516): it never existed, or its topic was deleted (perhaps
    created again under the same name, with another id). Kafka's UnknownTopicIdException."""


class InconsistentTopicIdError(LogstoreError):
    """A partition directory's ``partition.metadata`` names another topic id than its topic's
    (a directory left by a deleted topic of the same name, or copied in from elsewhere): it is
    not taken up as this topic's. Kafka's InconsistentTopicIdException."""


class CommitFailedError(LogstoreError):
    """A commit was refused: this process is no longer a member of the group's generation (its
    session ended, or the group rebalanced); its partitions may belong to another member now
    (Kafka's CommitFailedException)."""


class InvalidProducerEpochError(InvalidRecordError):
    """An idempotent producer's batch carries an epoch older than the producer's latest one in
    the partition: a fenced producer (Kafka's InvalidProducerEpochException, error 47
    INVALID_PRODUCER_EPOCH). Nothing is written.

    Attributes:
        producer_id: the batch's producer id.
        epoch: the batch's producer epoch.
        current_epoch: the producer's latest epoch in the partition.
    """

    def __init__(self, producer_id: int, epoch: int, current_epoch: int, where: str = "") -> None:
        self.producer_id = producer_id
        self.epoch = epoch
        self.current_epoch = current_epoch
        self.where = where
        prefix = f"{where}: " if where else ""
        super().__init__(f"{prefix}producer {producer_id} sent epoch {epoch}, older than its current epoch "
                         f"{current_epoch}; nothing was written")

    def __reduce__(self):
        return (type(self), (self.producer_id, self.epoch, self.current_epoch, self.where))


class OutOfOrderSequenceError(InvalidRecordError):
    """An idempotent producer's batch does not continue its sequence: its first sequence is not
    the producer's last one + 1 (or 0 with a new epoch), so a batch before it is missing (Kafka's
    OutOfOrderSequenceException, error 45 OUT_OF_ORDER_SEQUENCE_NUMBER). Nothing is written.

    Attributes:
        producer_id, epoch: the batch's producer id and epoch.
        first_sequence: the batch's first sequence number.
        last_sequence: the producer's last sequence in the partition (-1: none in this epoch).
    """

    def __init__(self, producer_id: int, epoch: int, first_sequence: int, last_sequence: int,
                 where: str = "") -> None:
        self.producer_id = producer_id
        self.epoch = epoch
        self.first_sequence = first_sequence
        self.last_sequence = last_sequence
        self.where = where
        prefix = f"{where}: " if where else ""
        expected = "0 (a new epoch)" if last_sequence < 0 else f"{(last_sequence + 1) % 2**31}"
        super().__init__(f"{prefix}out of order sequence for producer {producer_id} (epoch {epoch}): the batch "
                         f"starts at {first_sequence}, expected {expected}; nothing was written")

    def __reduce__(self):
        return (type(self), (self.producer_id, self.epoch, self.first_sequence, self.last_sequence, self.where))


class InvalidTxnStateError(InvalidRecordError):
    """A write that breaks a producer's transaction: a non-transactional batch from a producer
    whose transaction is open in the partition, or a transaction operation in the wrong state
    (Kafka's InvalidTxnStateException, error 48 INVALID_TXN_STATE). Nothing is written."""


class TransactionCoordinatorFencedError(InvalidRecordError):
    """A transaction marker from a coordinator older than the one that last wrote to the
    producer (Kafka's TransactionCoordinatorFencedException, error 52). Nothing is written.

    Attributes:
        producer_id: the marker's producer.
        coordinator_epoch: the marker's coordinator epoch.
        current: the producer's latest coordinator epoch in the partition.
    """

    def __init__(self, producer_id: int, coordinator_epoch: int, current: int, where: str = "") -> None:
        self.producer_id = producer_id
        self.coordinator_epoch = coordinator_epoch
        self.current = current
        self.where = where
        prefix = f"{where}: " if where else ""
        super().__init__(f"{prefix}a transaction marker for producer {producer_id} from coordinator epoch "
                         f"{coordinator_epoch}, older than {current}; nothing was written")

    def __reduce__(self):
        return (type(self), (self.producer_id, self.coordinator_epoch, self.current, self.where))


class NotLeaderOrFollowerError(LogstoreError):
    """A replicated write went to a node that no longer leads its partition (Kafka's
    NOT_LEADER_OR_FOLLOWER, error 6): it was not written, or it may be lost with this node's
    uncommitted tail. Retry on the partition's leader."""


class RequestTimedOutError(LogstoreError):
    """A replicated write was appended by the leader but a majority did not confirm it in time
    (Kafka's REQUEST_TIMED_OUT, error 7): it may still be committed later, or lost."""


class ProducerFencedError(LogstoreError):
    """A newer producer took the transactional id over (Kafka's PRODUCER_FENCED): this producer
    may write no more; close it. (Its open transaction was aborted.)"""


class RemoteStorageError(LogstoreError):
    """The remote tier (tiered storage, KIP-405) failed: the object store could not be reached,
    refused, timed out, or returned bytes that fail their checks. The message names the remote
    segment (its topic, partition, offsets and id) and what was asked of it. Nothing local is
    lost: a copy is retried later, and a read may be retried once the store answers (Kafka's
    RemoteStorageException)."""


class RemoteResourceNotFoundError(RemoteStorageError):
    """An object the remote tier's metadata names is not in the object store (Kafka's
    RemoteResourceNotFoundException): deleted meanwhile by retention, or lost by the store."""


class OffsetMovedToTieredStorageError(LogstoreError):
    """The offset asked for is no longer on local disk but in the remote tier (tiered storage;
    Kafka's OFFSET_MOVED_TO_TIERED_STORAGE, error 109). Raised by the zero-copy read of a local
    segment region (``Log.read_region``): read it with ``Log.read_raw`` instead, which fetches
    from the remote tier; a follower builds its state from the remote tier.

    Attributes:
        offset: the offset asked for.
        local_log_start_offset: the first offset on local disk.
    """

    def __init__(self, offset: int, local_log_start_offset: int, what: str = "") -> None:
        self.offset = offset
        self.local_log_start_offset = local_log_start_offset
        self.what = what
        prefix = f"{what}: " if what else ""
        super().__init__(f"{prefix}offset {offset} is in the remote tier; the local log starts at "
                         f"{local_log_start_offset}")

    def __reduce__(self):
        return (type(self), (self.offset, self.local_log_start_offset, self.what))


class DataLossError(LogstoreError):
    """Offsets a read-only reader (Spark, the tools: ``logstore.store.views``) planned to read
    are gone: retention or DeleteRecords removed them, locally or from the remote tier."""
