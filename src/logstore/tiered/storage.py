"""Kafka's RemoteStorageManager (KIP-405): a sealed segment's files to the object store, byte
ranges and indexes back, and their deletion.

:class:`RemoteStorageManager` is the interface, as Kafka's (a user may replace it with their own
class); :class:`ObjectStoreStorageManager` is the default, over an
:class:`~logstore.tiered.objectstore.ObjectStore`.

The default's layout: each copy of a segment is a set of objects under its partition's prefix,
named by the segment's first offset and the copy's unique id, one per file (the suffixes of
:class:`~logstore.tiered.metadata.IndexType`, and ``.log``)::

    {topic}-{topic id}/{partition}/{start offset, 20 digits}-{segment id}{suffix}

The ids are written in Kafka's text form of a Uuid (URL-safe base64, no padding: what Kafka's
tools print), as Kafka's tiered-storage plugins name their objects. :func:`object_key` is the one
home of this rule: every reader of remote objects (the Spark executors too) names them by it.

Invariants of the layout:

- A copy uploads its indexes first and its ``.log`` last, and a deletion removes the ``.log``
  first: a ``.log`` object exists only beside all the segment's other objects. A copy cut short
  leaves objects of its own id only (never touching a finished copy's), which the deletion of
  that id removes.
- Every copy has all six objects: a segment without a transaction index or a producer snapshot
  gets an empty object in its place, so :meth:`ObjectStoreStorageManager.fetch_index` answers
  b"" for it, and an absent object always means a lost or deleted one
  (:class:`~logstore.errors.RemoteResourceNotFoundError`).
"""

from __future__ import annotations

import abc
import base64
import uuid
from typing import Mapping

from ..errors import RemoteStorageError
from .metadata import IndexType, LogSegmentData, RemoteLogSegmentMetadata, TopicIdPartition
from .objectstore import DEFAULT_MAX_RETRIES, DEFAULT_REQUEST_TIMEOUT, ObjectStore, open_object_store

__all__ = [
    "RemoteStorageManager",
    "ObjectStoreStorageManager",
    "object_key",
    "partition_key_prefix",
    "LOG_SUFFIX",
    "SEGMENT_SUFFIXES",
]

#: The suffix of a remote segment's records (its ``.log`` file).
LOG_SUFFIX = ".log"
#: Every object of one remote segment, in the order a copy uploads them (``.log`` last).
SEGMENT_SUFFIXES: tuple[str, ...] = (
    IndexType.OFFSET.value,
    IndexType.TIMESTAMP.value,
    IndexType.TRANSACTION.value,
    IndexType.PRODUCER_SNAPSHOT.value,
    IndexType.LEADER_EPOCH.value,
    LOG_SUFFIX,
)


def _uuid_text(value: uuid.UUID) -> str:
    """Kafka's text form of a Uuid: its 16 bytes in URL-safe base64 without padding."""
    return base64.urlsafe_b64encode(value.bytes).decode("ascii").rstrip("=")


def partition_key_prefix(topic_id_partition: TopicIdPartition) -> str:
    """The key prefix of every remote object of a partition: ``{topic}-{topic id}/{partition}/``.

    >>> tp = TopicIdPartition(uuid.UUID(int=1), "orders", 3)
    >>> partition_key_prefix(tp)
    'orders-AAAAAAAAAAAAAAAAAAAAAQ/3/'
    """
    return (f"{topic_id_partition.topic}-{_uuid_text(topic_id_partition.topic_id)}/"
            f"{topic_id_partition.partition}/")


def object_key(metadata: RemoteLogSegmentMetadata, suffix: str) -> str:
    """The key of one object of a remote segment: its partition's prefix, then
    ``{start offset:020d}-{segment id}{suffix}``; ``suffix`` is one of :data:`SEGMENT_SUFFIXES`.

    Raises:
        ValueError: an unknown suffix.
    """
    if suffix not in SEGMENT_SUFFIXES:
        raise ValueError(f"remote segment object suffix {suffix!r}: one of {', '.join(SEGMENT_SUFFIXES)} is needed")
    return (f"{partition_key_prefix(metadata.topic_id_partition)}{metadata.start_offset:020d}-"
            f"{_uuid_text(metadata.segment_id.id)}{suffix}")


class RemoteStorageManager(abc.ABC):
    """Kafka's RemoteStorageManager: how a sealed segment's files reach the remote tier and
    come back. A user may replace it with their own subclass.

    Every method may be called from several threads at once (the copy task, readers, the
    deletion of expired segments); an implementation must be thread-safe. Each method raises
    :class:`~logstore.errors.RemoteStorageError` (an absent object:
    :class:`~logstore.errors.RemoteResourceNotFoundError`) naming the segment
    (``metadata.describe()``), and the caller retries later.
    """

    @abc.abstractmethod
    def copy_log_segment_data(self, metadata: RemoteLogSegmentMetadata, data: LogSegmentData) -> bytes | None:
        """Copy a sealed segment's files to the remote tier under ``metadata``'s segment id.

        Durable when it returns. A failed or interrupted copy may leave some objects of this
        id behind; it must never touch another id's, and :meth:`delete_log_segment_data` of
        this id removes them.

        Returns:
            custom metadata to keep with the segment (handed back in ``metadata`` to later
            fetches and the deletion), or None.
        """

    @abc.abstractmethod
    def fetch_log_segment(self, metadata: RemoteLogSegmentMetadata, start_position: int,
                          end_position: int | None = None) -> bytes:
        """The bytes of the segment's ``.log`` from ``start_position`` to ``end_position``
        inclusive (as Kafka's), or to its end when ``end_position`` is None; fewer when the
        segment ends first, b"" when ``start_position`` is at or past its end.

        Raises:
            ValueError: a negative start, or an end before the start.
        """

    @abc.abstractmethod
    def fetch_index(self, metadata: RemoteLogSegmentMetadata, index_type: IndexType) -> bytes:
        """One of the segment's indexes, whole (b"" for a transaction index or producer
        snapshot the segment did not have)."""

    @abc.abstractmethod
    def delete_log_segment_data(self, metadata: RemoteLogSegmentMetadata) -> None:
        """Delete every object of the segment's copy. Idempotent: deleting what is already
        gone (or was never fully copied) succeeds. Durable when it returns."""

    @abc.abstractmethod
    def close(self) -> None:
        """Release the manager's resources; it is not used afterwards. Idempotent."""

    def __enter__(self) -> "RemoteStorageManager":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @classmethod
    def from_url(cls, url: str, options: Mapping[str, str] | None = None, *,
                 request_timeout: float = DEFAULT_REQUEST_TIMEOUT,
                 max_retries: int = DEFAULT_MAX_RETRIES) -> "ObjectStoreStorageManager":
        """The default manager, an :class:`ObjectStoreStorageManager`, over the object store at
        ``url`` (see :class:`~logstore.tiered.objectstore.ObjectStore` for the URLs, options
        and limits).

        Raises:
            InvalidConfigError: the URL or an option is not understood.
        """
        return ObjectStoreStorageManager(open_object_store(url, options, request_timeout=request_timeout,
                                                           max_retries=max_retries))


class ObjectStoreStorageManager(RemoteStorageManager):
    """The default RemoteStorageManager: each remote segment is six objects of an
    :class:`~logstore.tiered.objectstore.ObjectStore`, named by :func:`object_key` (the layout
    and its invariants are in the module docstring). It returns no custom metadata.

    Durability: a copy and a deletion are durable when they return (each put and delete is).
    Thread-safety: thread-safe; it keeps no state but its store.
    """

    def __init__(self, store: ObjectStore) -> None:
        self._store = store

    @property
    def object_store(self) -> ObjectStore:
        """The object store the segments live in."""
        return self._store

    def copy_log_segment_data(self, metadata: RemoteLogSegmentMetadata, data: LogSegmentData) -> bytes | None:
        """Upload the segment's indexes, producer snapshot and leader epochs, then its ``.log``
        (see :meth:`RemoteStorageManager.copy_log_segment_data`). Returns None."""
        files = (data.offset_index, data.time_index, data.transaction_index, data.producer_snapshot_index)
        try:
            for suffix, path in zip(SEGMENT_SUFFIXES, files):
                key = object_key(metadata, suffix)
                if path is None:
                    self._store.put_bytes(key, b"")
                else:
                    self._store.put_file(key, path)
            self._store.put_bytes(object_key(metadata, IndexType.LEADER_EPOCH.value), data.leader_epoch_index)
            self._store.put_file(object_key(metadata, LOG_SUFFIX), data.log_segment)
        except RemoteStorageError as exc:
            raise self._failure(metadata, "copy", exc) from exc
        return None

    def fetch_log_segment(self, metadata: RemoteLogSegmentMetadata, start_position: int,
                          end_position: int | None = None) -> bytes:
        """A byte range of the segment's ``.log`` object (see
        :meth:`RemoteStorageManager.fetch_log_segment`); the segment's end is
        ``metadata.segment_size_in_bytes``.

        Raises:
            RemoteStorageError: also when the object holds fewer bytes than the metadata says.
        """
        if start_position < 0 or (end_position is not None and end_position < start_position):
            raise ValueError(f"{metadata.describe()}: positions {start_position}..{end_position} are no range")
        size = metadata.segment_size_in_bytes
        if start_position >= size:
            return b""
        stop = size if end_position is None else min(end_position + 1, size)
        key = object_key(metadata, LOG_SUFFIX)
        try:
            data = self._store.get_range(key, start_position, stop)
        except RemoteStorageError as exc:
            raise self._failure(metadata, f"fetch of positions {start_position}..{stop - 1}", exc) from exc
        if len(data) != stop - start_position:
            raise RemoteStorageError(f"{metadata.describe()}: {key!r} at {self._store.url} holds "
                                     f"{start_position + len(data)} bytes, the segment {size}")
        return data

    def fetch_index(self, metadata: RemoteLogSegmentMetadata, index_type: IndexType) -> bytes:
        """The whole index object (see :meth:`RemoteStorageManager.fetch_index`)."""
        try:
            return self._store.get(object_key(metadata, index_type.value))
        except RemoteStorageError as exc:
            raise self._failure(metadata, f"fetch of the {index_type.name} index", exc) from exc

    def delete_log_segment_data(self, metadata: RemoteLogSegmentMetadata) -> None:
        """Delete the ``.log`` object first, then the others (see
        :meth:`RemoteStorageManager.delete_log_segment_data`)."""
        try:
            for suffix in reversed(SEGMENT_SUFFIXES):
                self._store.delete(object_key(metadata, suffix))
        except RemoteStorageError as exc:
            raise self._failure(metadata, "delete", exc) from exc

    def close(self) -> None:
        """Close the object store. Idempotent."""
        self._store.close()

    @staticmethod
    def _failure(metadata: RemoteLogSegmentMetadata, what: str, exc: RemoteStorageError) -> RemoteStorageError:
        """``exc`` (its own class: not found stays not found) with the segment named first."""
        return type(exc)(f"{metadata.describe()}: {what} failed: {exc}")
