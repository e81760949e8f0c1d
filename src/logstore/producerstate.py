"""Producer state of one partition: each idempotent producer's last appended batch.

A producer that sets a producer id and a base sequence in its batch headers (Kafka's idempotent
producer; logstore's replication ``Client`` does) may send the same batch again when it did not
hear the answer. The partition recognises such a retry iff the producer's last batch in the log
has the same base sequence: it answers with the offsets that batch already took instead of
appending it twice. Only the latest batch of each producer is kept (a client retries only its
latest produce); Kafka keeps the last five, and this table grows into that later (issue 16)
without changing its callers.

The table is derived data, like an index: it is learnt from the batch headers as batches are
appended (by a leader) or copied (by a follower), forgotten from an offset when the log is
truncated, and rebuilt by scanning the log's batch headers when a partition is opened. It lives
in memory only (no snapshot files yet).

This module belongs to the log layer: it imports nothing above ``records``.
"""

from __future__ import annotations

from typing import Iterator, NamedTuple, Protocol

from .records import batch_headers, end_offset_of

__all__ = ["ProducerBatch", "ProducerStateTable"]

#: How many bytes of batches a rebuild reads at a time.
REBUILD_CHUNK_BYTES = 1 << 20


class ProducerBatch(NamedTuple):
    """Where a producer's batch landed: its base sequence and its first and last offsets
    (immutable)."""

    base_sequence: int
    first_offset: int
    last_offset: int


class _BatchSource(Protocol):
    """What :meth:`ProducerStateTable.rebuild` reads: a Log's offsets and raw batches."""

    @property
    def log_start_offset(self) -> int: ...

    @property
    def log_end_offset(self) -> int: ...

    def read_raw(self, offset: int, max_bytes: int) -> bytes: ...


class ProducerStateTable:
    """Producer id -> its last batch (:class:`ProducerBatch`) in one partition's log.

    Batches without a producer id or base sequence (-1: not idempotent) are not tracked.

    Thread-safety: not thread-safe; the owner of the partition serialises every call (the
    replication node holds the partition's lock).

    >>> table = ProducerStateTable()
    >>> table.record(producer_id=7, base_sequence=0, first_offset=10, last_offset=12)
    >>> table.duplicate_of(7, 0)
    ProducerBatch(base_sequence=0, first_offset=10, last_offset=12)
    >>> table.duplicate_of(7, 3) is None
    True
    >>> table.forget_from(11)
    >>> len(table)
    0
    """

    __slots__ = ("_last",)

    def __init__(self) -> None:
        self._last: dict[int, ProducerBatch] = {}

    def __len__(self) -> int:
        return len(self._last)

    def __contains__(self, producer_id: object) -> bool:
        return producer_id in self._last

    def __iter__(self) -> Iterator[int]:
        return iter(self._last)

    def last_batch(self, producer_id: int) -> ProducerBatch | None:
        """The producer's last batch in the log, or None when none is known."""
        return self._last.get(producer_id)

    def duplicate_of(self, producer_id: int, base_sequence: int) -> ProducerBatch | None:
        """The batch already appended that a batch with this (producer id, base sequence) would
        repeat, or None when it is new (or carries no producer id)."""
        if producer_id < 0:
            return None
        last = self._last.get(producer_id)
        return last if last is not None and last.base_sequence == base_sequence else None

    def record(self, producer_id: int, base_sequence: int, first_offset: int, last_offset: int) -> None:
        """Note a batch appended at [first_offset, last_offset] (ignored without a producer id
        or base sequence)."""
        if producer_id >= 0 and base_sequence >= 0:
            self._last[producer_id] = ProducerBatch(base_sequence, first_offset, last_offset)

    def record_batches(self, data: bytes | bytearray | memoryview) -> None:
        """Note every batch in ``data`` (whole consecutive batches with their offsets assigned,
        as a follower copies them), in order."""
        for _, h in batch_headers(data):
            self.record(h.producer_id, h.base_sequence, h.base_offset, h.last_offset)

    def forget_from(self, offset: int) -> None:
        """The log was truncated to end at ``offset``: forget every producer whose last batch
        reaches it or beyond. (Its earlier batch, if any survived, is not remembered; such a
        producer's retry is appended again, which is safe because a client retries only its
        latest produce.)"""
        self._last = {pid: batch for pid, batch in self._last.items() if batch.last_offset < offset}

    def clear(self) -> None:
        """Forget every producer."""
        self._last = {}

    @classmethod
    def rebuild(cls, log: _BatchSource, chunk_bytes: int = REBUILD_CHUNK_BYTES) -> "ProducerStateTable":
        """A table built by scanning the batch headers of ``log`` (a Log, or anything with
        ``log_start_offset``, ``log_end_offset`` and ``read_raw``) from its start to its end.
        Records are not decoded; it reads every batch once."""
        table = cls()
        offset = log.log_start_offset
        end = log.log_end_offset
        while offset < end:
            data = log.read_raw(offset, chunk_bytes)
            if not data:
                break
            table.record_batches(data)
            offset = end_offset_of(data, offset)
        return table
