"""What a log sees of its remote segments (tiered storage, KIP-405): :class:`RemoteTier`.

A log whose config has ``remote_storage_enable`` keeps only a local tail of its segments; the
older ones live in an object store. The log does not know the object store: the store's remote
log manager (``logstore.tiered``) hands each such log a :class:`RemoteTier` (``Log.attach_remote``)
and the log asks it, outside its own lock, for the batches below its first local segment and
for the offsets the remote segments hold. The log's offsets then mean what Kafka's UnifiedLog's
do: ``log_start_offset`` is the first offset held anywhere (remote or local),
``local_log_start_offset`` the first one on local disk.

An abstract interface: no I/O of its own. Implementations are thread-safe (readers call them
from any thread, without the log's lock).
"""

from __future__ import annotations

import abc
from typing import Mapping, NamedTuple

from ..index import AbortedTxn

__all__ = ["RemoteTier", "CopyableSegment"]


class CopyableSegment(NamedTuple):
    """A sealed segment the remote tier may copy (``Log.segments_to_copy``): its offsets
    (``end_offset`` inclusive), its size and newest timestamp, the paths of its files (the
    ``.txnindex`` and the producer snapshot at its end None when there is none), the leader
    epochs it holds records of (epoch -> its first offset in the segment) and the leader-epoch
    checkpoint's bytes up to its end. Immutable."""

    base_offset: int
    end_offset: int
    size: int
    max_timestamp: int
    log_path: str
    offset_index_path: str
    time_index_path: str
    txn_index_path: str | None
    producer_snapshot_path: str | None
    leader_epochs: Mapping[int, int]
    leader_epoch_checkpoint: bytes


class RemoteTier(abc.ABC):
    """One partition's remote segments, as its log reads them. Thread-safe."""

    @abc.abstractmethod
    def start_offset(self) -> int | None:
        """The first offset the finished remote segments hold, None when there are none."""

    @abc.abstractmethod
    def copied_through(self) -> int:
        """The last offset copied (the end offset of the newest finished remote segment); -1
        when nothing is. Local segments at or below it may leave the local disk."""

    @abc.abstractmethod
    def read_raw(self, offset: int, max_bytes: int) -> bytes:
        """Whole batches, byte for byte as the log wrote them, from the remote batch holding
        ``offset`` on (when no remote segment holds it, from the first remote batch after it):
        at least one batch, else about ``max_bytes``, all from one remote segment; every batch
        CRC-checked; b"" when no finished remote segment holds ``offset`` or anything after it.

        Raises:
            RemoteStorageError: the object store failed or returned bytes that fail their
                checks (the message names the remote segment).
        """

    @abc.abstractmethod
    def offset_for_timestamp(self, timestamp: int, start_offset: int) -> int | None:
        """The first remote offset at or above ``start_offset`` (the log start) whose record's
        timestamp is at or after ``timestamp``, None when no such remote record is that recent.

        Raises:
            RemoteStorageError: as :meth:`read_raw`.
        """

    @abc.abstractmethod
    def aborted_transactions(self, start: int, upper: int) -> list[AbortedTxn]:
        """The aborted transactions the remote segments' transaction indexes list that overlap
        the offsets [start, upper) (as ``Log.aborted_transactions``).

        Raises:
            RemoteStorageError: as :meth:`read_raw`.
        """

    @abc.abstractmethod
    def max_timestamp(self) -> int:
        """The newest record timestamp the finished remote segments hold, -1 when none."""

    @abc.abstractmethod
    def size_in_bytes(self) -> int:
        """The bytes of the finished remote segments."""
