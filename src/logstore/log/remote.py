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

from ..index import AbortedTxn

__all__ = ["RemoteTier"]


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
        ``offset`` on: at least one batch when a remote segment holds ``offset``, else about
        ``max_bytes``, all from one remote segment; every batch CRC-checked; b"" when no
        finished remote segment holds ``offset``.

        Raises:
            RemoteStorageError: the object store failed or returned bytes that fail their
                checks (the message names the remote segment).
        """

    @abc.abstractmethod
    def offset_for_timestamp(self, timestamp: int) -> int | None:
        """The first remote offset whose record's timestamp is at or after ``timestamp``, None
        when no remote record is that recent.

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
    def size_in_bytes(self) -> int:
        """The bytes of the finished remote segments."""
