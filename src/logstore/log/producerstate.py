"""Producer state of one partition: each idempotent producer's epoch and last five batches, the
check of a new batch against them, and the ``.snapshot`` file format that stores them.

A producer that sets a producer id, an epoch and a base sequence in its batch headers (Kafka's
idempotent producer; logstore's replication ``Client`` too) may send a batch again when it did
not hear the answer. The partition keeps, per producer id, the producer's latest epoch and the
metadata of its last :data:`BATCHES_RETAINED` batches (sequences, offsets, largest timestamp):
Kafka's ``ProducerStateEntry``, five because a Kafka producer has at most five produce requests
in flight, so its retries always fall among its last five batches.

The rules for a client's batch with producer id P >= 0, epoch E and sequences [f, l] (Kafka's
``ProducerAppendInfo``, the part that concerns non-transactional producers):

* It is a *duplicate* iff P's epoch is E and one of P's retained batches has exactly the
  sequences [f, l]. A duplicate is not appended again: the caller answers with the offsets that
  batch already has (Kafka answers success with the original base offset).
* Otherwise it may be appended iff P is unknown (never seen, or its batches have left the log:
  any epoch and sequence is then accepted, as Kafka does), or E is newer than P's epoch and f is
  0, or E is P's epoch and f follows P's last sequence (last + 1, with 2^31 - 1 followed by 0).
* An older epoch is refused with :class:`~logstore.errors.InvalidProducerEpochError` (Kafka's
  error 47) and any other sequence with :class:`~logstore.errors.OutOfOrderSequenceError` (45).
* A batch without a producer id (-1) is neither checked nor remembered.

Batches that are copied rather than produced (a follower's copy of its leader's log, the
replay of a log at open) are remembered without being checked, as Kafka's replication origin.

Transactions (Kafka's KIP-98). A producer's first transactional batch (attribute bit 4) opens
its transaction at that batch's first offset; the producer's COMMIT or ABORT marker (a control
batch the log writes) closes it, which gives a :class:`CompletedTxn` from the first offset to
the marker. While a transaction is open, a non-transactional batch of the producer is refused
with :class:`~logstore.errors.InvalidTxnStateError`, and a marker from an older coordinator
epoch with :class:`~logstore.errors.TransactionCoordinatorFencedError`. The *first unstable
offset* is the smallest first offset of an open transaction, or of a completed one whose marker
is not yet below the high watermark (Kafka's unreplicated transactions); the log's last stable
offset is the smaller of it and the high watermark.

The table is derived data, like an index: learnt from batch headers as batches are appended or
copied, and rebuilt from the log (see :mod:`~logstore.log.producers`, which keeps a Log's table
current and its snapshot files). The snapshot format, Kafka's ``ProducerSnapshot`` version 1,
big-endian (a Kafka message "Struct" without flexible fields, so the array's length is an int32)::

    version                  int16   1
    crc                      uint32  CRC32C of every byte after this field
    producer count           int32
    per producer:
        producer_id          int64
        epoch                int16
        last_sequence        int32   of the producer's last batch
        last_offset          int64   of the producer's last batch (-1: no batch)
        offset_delta         int32   last_offset - first offset of that batch
        timestamp            int64   its largest timestamp
        coordinator_epoch    int32   of the producer's last marker (-1: none)
        current_txn_first_offset int64  first offset of its open transaction (-1: none)

Only the last batch of each producer is stored, as in Kafka: after a reload from a snapshot a
producer's earlier batches are not known, and a retry of one of them is refused as out of order
(Kafka answers the same), while a retry of its last batch is still recognised.

This module belongs to the log layer: it imports nothing above ``records``. Thread-safety:
nothing here is thread-safe; the owning Log serialises every call under its lock.
"""

from __future__ import annotations

import struct
from collections import deque
from typing import Any, Callable, Iterable, Iterator, NamedTuple, Protocol

from .._native import lib
from ..errors import (InvalidProducerEpochError, InvalidTxnStateError, LogstoreError, OutOfOrderSequenceError,
                      TransactionCoordinatorFencedError)
from ..records.batch import batch_headers
from ..records.control import ControlType, read_marker

__all__ = ["BATCHES_RETAINED", "NO_PRODUCER_ID", "NO_EPOCH", "NO_SEQUENCE", "BatchMetadata", "ProducerStateEntry",
           "ProducerStateTable", "CorruptSnapshotError", "CompletedTxn", "increment_sequence", "decrement_sequence",
           "replay"]

#: How many of a producer's latest batches are kept (Kafka's NUM_BATCHES_TO_RETAIN).
BATCHES_RETAINED = 5
NO_PRODUCER_ID = -1
NO_EPOCH = -1
NO_SEQUENCE = -1
#: Sequence numbers count modulo 2^31: 2^31 - 1 is followed by 0.
_SEQUENCES = 1 << 31
#: How many bytes of batches a replay reads at a time.
REPLAY_CHUNK_BYTES = 1 << 20

SNAPSHOT_VERSION = 1
_SNAPSHOT_HEAD = struct.Struct(">hIi")       # version, crc, producer count
_SNAPSHOT_ENTRY = struct.Struct(">qhiqiqiq")  # one producer (46 bytes)
_CRC_FROM = 6                                # the CRC covers everything after version and crc


class CorruptSnapshotError(LogstoreError):
    """A ``.snapshot`` file does not hold a valid producer state snapshot (wrong version, CRC
    mismatch, wrong length). The file is derived data: the log is replayed instead."""


def increment_sequence(sequence: int, delta: int) -> int:
    """``sequence`` advanced by ``delta`` records, wrapping at 2^31 (Kafka's incrementSequence).

    >>> increment_sequence(2**31 - 1, 1), increment_sequence(5, 2)
    (0, 7)
    """
    return (sequence + delta) % _SEQUENCES


def decrement_sequence(sequence: int, delta: int) -> int:
    """``sequence`` moved back by ``delta`` records, wrapping at 0 (Kafka's decrementSequence)."""
    return (sequence - delta) % _SEQUENCES


class BatchMetadata(NamedTuple):
    """Where one of a producer's batches landed (immutable): its first and last sequence, its
    first and last offset, and its largest timestamp."""

    first_sequence: int
    last_sequence: int
    first_offset: int
    last_offset: int
    max_timestamp: int


class CompletedTxn(NamedTuple):
    """A transaction a marker closed (immutable): its producer, its first offset (the marker's
    own when no data of it is known), the marker's offset, and whether it was aborted."""

    producer_id: int
    first_offset: int
    last_offset: int
    aborted: bool


class ProducerStateEntry:
    """One producer's state: its latest epoch and its last :data:`BATCHES_RETAINED` batches of
    that epoch, oldest first (Kafka's ProducerStateEntry), the first offset of its open
    transaction (-1: none) and the coordinator epoch of its last marker. A new epoch forgets
    the batches of the old one. Not thread-safe (the table's owner serialises)."""

    __slots__ = ("producer_id", "epoch", "batches", "last_timestamp", "current_txn_first_offset",
                 "coordinator_epoch")

    def __init__(self, producer_id: int, epoch: int = NO_EPOCH, batches: Iterable[BatchMetadata] = (),
                 last_timestamp: int = -1, current_txn_first_offset: int = -1, coordinator_epoch: int = -1) -> None:
        self.producer_id = producer_id
        self.epoch = epoch
        self.batches: deque[BatchMetadata] = deque(batches, BATCHES_RETAINED)
        self.last_timestamp = last_timestamp
        self.current_txn_first_offset = current_txn_first_offset
        self.coordinator_epoch = coordinator_epoch

    @property
    def last_batch(self) -> BatchMetadata | None:
        """The producer's latest batch, None when none is known in its epoch."""
        return self.batches[-1] if self.batches else None

    @property
    def last_sequence(self) -> int:
        """The last sequence of the latest batch, -1 when none is known."""
        return self.batches[-1].last_sequence if self.batches else NO_SEQUENCE

    def add_batch(self, epoch: int, batch: BatchMetadata) -> None:
        """Note a batch of ``epoch`` (the oldest retained one goes when five are kept)."""
        if epoch != self.epoch:
            self.batches.clear()
            self.epoch = epoch
        self.batches.append(batch)
        self.last_timestamp = batch.max_timestamp

    def find_duplicate(self, epoch: int, first_sequence: int, last_sequence: int) -> BatchMetadata | None:
        """The retained batch of ``epoch`` with exactly these sequences, or None."""
        if epoch == self.epoch:
            for batch in self.batches:
                if batch.first_sequence == first_sequence and batch.last_sequence == last_sequence:
                    return batch
        return None

    def copy(self) -> "ProducerStateEntry":
        """An independent copy."""
        return ProducerStateEntry(self.producer_id, self.epoch, self.batches, self.last_timestamp,
                                  self.current_txn_first_offset, self.coordinator_epoch)

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, ProducerStateEntry) and self.producer_id == other.producer_id
                and self.epoch == other.epoch and list(self.batches) == list(other.batches)
                and self.last_timestamp == other.last_timestamp
                and self.current_txn_first_offset == other.current_txn_first_offset
                and self.coordinator_epoch == other.coordinator_epoch)

    def __repr__(self) -> str:
        return (f"ProducerStateEntry(producer_id={self.producer_id}, epoch={self.epoch}, "
                f"batches={list(self.batches)}, last_timestamp={self.last_timestamp}, "
                f"current_txn_first_offset={self.current_txn_first_offset}, "
                f"coordinator_epoch={self.coordinator_epoch})")


class _Header(Protocol):
    """The batch header fields the table reads (a records.BatchHeader or a C ls_batch_header)."""

    base_offset: int
    attributes: int
    last_offset_delta: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int


class ProducerStateTable:
    """Producer id -> :class:`ProducerStateEntry` of one partition's log.

    Thread-safety: not thread-safe; the owner of the partition serialises every call (a Log
    holds its lock).

    >>> table = ProducerStateTable()
    >>> table.record(7, epoch=0, first_sequence=0, last_sequence=2, first_offset=10, last_offset=12)
    >>> table.check(7, epoch=0, first_sequence=0, last_sequence=2)   # a retry
    BatchMetadata(first_sequence=0, last_sequence=2, first_offset=10, last_offset=12, max_timestamp=-1)
    >>> table.check(7, epoch=0, first_sequence=3, last_sequence=3) is None   # the next batch
    True
    >>> table.check(7, epoch=0, first_sequence=5, last_sequence=5)
    Traceback (most recent call last):
    ...
    logstore.errors.OutOfOrderSequenceError: out of order sequence for producer 7 (epoch 0): the batch starts at 5, expected 3; nothing was written
    >>> table.truncate_to(11)   # the log now ends at 11: the batch is gone
    1
    >>> len(table)
    0
    """

    __slots__ = ("_entries", "_ongoing", "_unreplicated", "_last_marker")

    def __init__(self, entries: Iterable[ProducerStateEntry] = ()) -> None:
        self._entries: dict[int, ProducerStateEntry] = {e.producer_id: e for e in entries}
        #: producer id -> first offset of its open transaction
        self._ongoing: dict[int, int] = {e.producer_id: e.current_txn_first_offset
                                         for e in self._entries.values() if e.current_txn_first_offset >= 0}
        #: completed transactions whose marker may not be below the high watermark yet, in marker order
        self._unreplicated: list[CompletedTxn] = []
        #: the offset of the latest marker learnt (-1: none)
        self._last_marker = -1

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, producer_id: object) -> bool:
        return producer_id in self._entries

    def __iter__(self) -> Iterator[int]:
        return iter(self._entries)

    def entry(self, producer_id: int) -> ProducerStateEntry | None:
        """The producer's state, or None when it is unknown (the entry is live: do not change it)."""
        return self._entries.get(producer_id)

    def entries(self) -> list[ProducerStateEntry]:
        """Every producer's state, by producer id."""
        return [self._entries[pid] for pid in sorted(self._entries)]

    # ------------------------------------------------------------------ checking a client's batch
    def check(self, producer_id: int, epoch: int, first_sequence: int, last_sequence: int,
              check_sequence: bool = True, where: str = "", transactional: bool = False) -> BatchMetadata | None:
        """Check a client's batch against the producer's state (the rules in the module
        docstring); return the batch it duplicates, or None when it may be appended. Changes
        nothing: the caller :meth:`record`\\ s the batch once it is appended.

        ``check_sequence=False`` recognises duplicates and fences old epochs but accepts any
        sequence (a client whose sequence skips the numbers of refused batches).

        Raises:
            InvalidProducerEpochError: the epoch is older than the producer's.
            OutOfOrderSequenceError: the first sequence does not follow the producer's last.
            InvalidTxnStateError: a non-transactional batch while the producer's transaction is open.
        """
        if producer_id < 0:
            return None
        entry = self._entries.get(producer_id)
        if entry is None:
            return None  # unknown (or forgotten): anything goes
        known = entry.find_duplicate(epoch, first_sequence, last_sequence)
        if known is not None:
            return known
        if epoch < entry.epoch:
            raise InvalidProducerEpochError(producer_id, epoch, entry.epoch, where)
        if not transactional and entry.current_txn_first_offset >= 0:
            raise InvalidTxnStateError(f"{where + ': ' if where else ''}producer {producer_id} sent a "
                                       f"non-transactional batch while its transaction (from offset "
                                       f"{entry.current_txn_first_offset}) is open; nothing was written")
        if not check_sequence:
            return None
        if epoch != entry.epoch:
            if first_sequence != 0 and entry.epoch != NO_EPOCH:
                raise OutOfOrderSequenceError(producer_id, epoch, first_sequence, NO_SEQUENCE, where)
        elif entry.epoch != NO_EPOCH and first_sequence != (entry.last_sequence + 1) % _SEQUENCES:
            raise OutOfOrderSequenceError(producer_id, epoch, first_sequence, entry.last_sequence, where)
        return None

    def check_marker(self, producer_id: int, epoch: int, coordinator_epoch: int, where: str = "") -> None:
        """Check a transaction marker the log is about to write for ``producer_id``: its epoch may
        not be older than the producer's, nor its coordinator epoch older than the last marker's
        (Kafka's appendEndTxnMarker checks). Changes nothing.

        Raises:
            InvalidProducerEpochError: an older producer epoch.
            TransactionCoordinatorFencedError: an older coordinator epoch.
        """
        entry = self._entries.get(producer_id)
        if entry is None:
            return
        if epoch < entry.epoch:
            raise InvalidProducerEpochError(producer_id, epoch, entry.epoch, where)
        if coordinator_epoch < entry.coordinator_epoch:
            raise TransactionCoordinatorFencedError(producer_id, coordinator_epoch, entry.coordinator_epoch, where)

    # ------------------------------------------------------------------ learning
    def record(self, producer_id: int, epoch: int, first_sequence: int, last_sequence: int, first_offset: int,
               last_offset: int, max_timestamp: int = -1, transactional: bool = False) -> None:
        """Note a batch appended at [first_offset, last_offset] (ignored without a producer id);
        a transactional one opens the producer's transaction if none is open. Never raises:
        what is in the log is learnt as it is."""
        if producer_id < 0:
            return
        entry = self._entries.get(producer_id)
        if entry is None:
            entry = self._entries[producer_id] = ProducerStateEntry(producer_id, epoch)
        entry.add_batch(epoch, BatchMetadata(first_sequence, last_sequence, first_offset, last_offset,
                                             max_timestamp))
        if transactional and entry.current_txn_first_offset < 0:
            entry.current_txn_first_offset = first_offset
            self._ongoing[producer_id] = first_offset

    def record_header(self, header: _Header, base_offset: int | None = None, control: tuple[int, int] | None = None
                      ) -> CompletedTxn | None:
        """Note the batch whose header is ``header``, stored at ``base_offset`` (default: the
        header's). A control batch only moves the epoch, unless it is a transaction marker:
        ``control`` is then its (control type, coordinator epoch), and the producer's transaction
        completes; the :class:`CompletedTxn` is returned (the caller indexes an abort and passes
        it to :meth:`complete`)."""
        producer_id = header.producer_id
        if producer_id < 0:
            return None
        first = header.base_offset if base_offset is None else base_offset
        if header.attributes & lib.LS_ATTR_CONTROL:
            entry = self._entries.get(producer_id)
            if entry is None:
                entry = self._entries[producer_id] = ProducerStateEntry(producer_id, header.producer_epoch)
            elif entry.epoch != header.producer_epoch:
                entry.batches.clear()
                entry.epoch = header.producer_epoch
            entry.last_timestamp = header.max_timestamp
            if (control is None or not header.attributes & lib.LS_ATTR_TRANSACTIONAL
                    or control[0] not in (ControlType.ABORT, ControlType.COMMIT)):
                return None
            txn_first = entry.current_txn_first_offset if entry.current_txn_first_offset >= 0 else first
            entry.current_txn_first_offset = -1
            entry.coordinator_epoch = control[1]
            self._ongoing.pop(producer_id, None)
            self._last_marker = max(self._last_marker, first)
            return CompletedTxn(producer_id, txn_first, first, control[0] == ControlType.ABORT)
        delta = header.last_offset_delta
        self.record(producer_id, header.producer_epoch, header.base_sequence,
                    increment_sequence(header.base_sequence, delta), first, first + delta, header.max_timestamp,
                    bool(header.attributes & lib.LS_ATTR_TRANSACTIONAL))
        return None

    def record_batches(self, data: bytes | bytearray | memoryview, from_offset: int = 0,
                       on_complete: Callable[[CompletedTxn, int], None] | None = None,
                       to_offset: int | None = None) -> int:
        """Note every batch in ``data`` (whole consecutive batches with their offsets assigned,
        as read_raw returns them) that ends at or after ``from_offset`` and starts below
        ``to_offset`` (default: no bound), in order; return the offset after the last batch
        noted (``from_offset`` when there is none). Each transaction a marker completes is
        passed to ``on_complete`` with the last stable offset it leaves
        (:meth:`stable_offset_after`), then completed."""
        end = from_offset
        for position, header in batch_headers(data):
            if to_offset is not None and header.base_offset >= to_offset:
                break
            last = header.base_offset + header.last_offset_delta
            if last >= from_offset:
                control = None
                if header.attributes & lib.LS_ATTR_CONTROL and header.attributes & lib.LS_ATTR_TRANSACTIONAL \
                        and header.producer_id >= 0:
                    control = read_marker(data, position, header.size)
                txn = self.record_header(header, None, control)
                if txn is not None:
                    if on_complete is not None:
                        on_complete(txn, self.stable_offset_after(txn))
                    self.complete(txn)
            end = max(end, last + 1)
        return end

    # ------------------------------------------------------------------ transactions
    def complete(self, txn: CompletedTxn) -> None:
        """A completed transaction's marker is in the log: it stays unstable until the high
        watermark passes the marker (see :meth:`first_unstable_offset`)."""
        self._unreplicated.append(txn)

    def stable_offset_after(self, txn: CompletedTxn) -> int:
        """The last stable offset once ``txn`` completed, as its index entry records it: the
        first offset of the earliest transaction still open, else the offset after the marker."""
        return min(self._ongoing.values(), default=txn.last_offset + 1)

    def first_unstable_offset(self, high_watermark: int) -> int | None:
        """The smallest first offset of an open transaction, or of a completed one whose marker
        is at or above ``high_watermark``; None when there is none. Completed transactions below
        the high watermark are forgotten (it only moves forward until a truncation, which
        reloads the table)."""
        unreplicated = self._unreplicated
        if unreplicated and unreplicated[0].last_offset < high_watermark:
            self._unreplicated = unreplicated = [t for t in unreplicated if t.last_offset >= high_watermark]
        first = min(self._ongoing.values(), default=None)
        if unreplicated:
            earliest = min(t.first_offset for t in unreplicated)
            first = earliest if first is None else min(first, earliest)
        return first

    def ongoing(self) -> dict[int, int]:
        """Producer id -> first offset of each open transaction (a copy)."""
        return dict(self._ongoing)

    # ------------------------------------------------------------------ forgetting
    def truncate_to(self, offset: int) -> int:
        """The log was truncated to end at ``offset``: forget every batch that reaches it, and
        every producer left without a batch, and the transactions that opened at or after it.
        Returns how many batches and markers were forgotten. (A producer's batches older than
        the retained five, and a transaction a cut marker reopens, are not known here: the Log
        reloads its table from a snapshot instead whenever this forgets anything.)"""
        dropped = 0
        for pid in list(self._entries):
            entry = self._entries[pid]
            batches = entry.batches
            while batches and batches[-1].last_offset >= offset:
                batches.pop()
                dropped += 1
            if entry.current_txn_first_offset >= offset:
                entry.current_txn_first_offset = -1
                self._ongoing.pop(pid, None)
            if not batches and entry.current_txn_first_offset < 0:
                del self._entries[pid]
        if self._last_marker >= offset:
            dropped += 1
            self._unreplicated = [t for t in self._unreplicated if t.last_offset < offset]
            self._last_marker = max((t.last_offset for t in self._unreplicated), default=-1)
        return dropped

    def truncate_head(self, log_start_offset: int) -> int:
        """The log now starts at ``log_start_offset``: forget every producer whose last batch
        lies wholly below it and whose transaction is not open (retention or DeleteRecords
        removed it; Kafka's truncateHead). Returns how many producers were forgotten."""
        gone = [pid for pid, e in self._entries.items()
                if e.current_txn_first_offset < 0 and (not e.batches or e.batches[-1].last_offset < log_start_offset)]
        for pid in gone:
            del self._entries[pid]
        return len(gone)

    def clear(self) -> None:
        """Forget every producer and transaction."""
        self._entries.clear()
        self._ongoing.clear()
        self._unreplicated = []
        self._last_marker = -1

    # ------------------------------------------------------------------ snapshots
    def to_snapshot(self) -> bytes:
        """The table in Kafka's snapshot format (see the module docstring)."""
        entry_struct = _SNAPSHOT_ENTRY
        parts = [struct.pack(">i", len(self._entries))]
        for e in self.entries():
            last = e.last_batch
            if last is None:
                parts.append(entry_struct.pack(e.producer_id, e.epoch, NO_SEQUENCE, -1, 0, e.last_timestamp,
                                               e.coordinator_epoch, e.current_txn_first_offset))
            else:
                parts.append(entry_struct.pack(e.producer_id, e.epoch, last.last_sequence, last.last_offset,
                                               last.last_offset - last.first_offset, e.last_timestamp,
                                               e.coordinator_epoch, e.current_txn_first_offset))
        body = b"".join(parts)
        return struct.pack(">hI", SNAPSHOT_VERSION, lib.ls_crc32c(0, body, len(body))) + body

    @classmethod
    def from_snapshot(cls, data: bytes | bytearray | memoryview, what: str = "snapshot") -> "ProducerStateTable":
        """The table a snapshot holds: each producer with its epoch and its last batch.

        Raises:
            CorruptSnapshotError: not a version 1 snapshot, a CRC mismatch, or a wrong length.
        """
        data = bytes(data)
        if len(data) < _SNAPSHOT_HEAD.size:
            raise CorruptSnapshotError(f"{what}: {len(data)} bytes is shorter than a snapshot header")
        version, crc, count = _SNAPSHOT_HEAD.unpack_from(data)
        if version != SNAPSHOT_VERSION:
            raise CorruptSnapshotError(f"{what}: unknown snapshot version {version} (expected {SNAPSHOT_VERSION})")
        computed = lib.ls_crc32c(0, data[_CRC_FROM:], len(data) - _CRC_FROM)
        if computed != crc:
            raise CorruptSnapshotError(f"{what}: snapshot is corrupt (stored crc = {crc:#010x}, "
                                       f"computed crc = {computed:#010x})")
        if count < 0 or len(data) != _SNAPSHOT_HEAD.size + count * _SNAPSHOT_ENTRY.size:
            raise CorruptSnapshotError(f"{what}: {count} producers do not fill {len(data)} bytes")
        entries = []
        for (pid, epoch, last_seq, last_offset, delta, timestamp, coordinator_epoch, txn_first) in \
                _SNAPSHOT_ENTRY.iter_unpack(memoryview(data)[_SNAPSHOT_HEAD.size:]):
            if txn_first < -1:
                raise CorruptSnapshotError(f"{what}: producer {pid} has transaction first offset {txn_first}")
            if last_offset < 0:
                entries.append(ProducerStateEntry(pid, epoch, (), timestamp, txn_first, coordinator_epoch))
                continue
            if not 0 <= delta <= last_offset:
                raise CorruptSnapshotError(f"{what}: producer {pid} has offset delta {delta} at offset {last_offset}")
            batch = BatchMetadata(decrement_sequence(last_seq, delta), last_seq, last_offset - delta, last_offset,
                                  timestamp)
            entries.append(ProducerStateEntry(pid, epoch, (batch,), timestamp, txn_first, coordinator_epoch))
        return cls(entries)


def replay(table: ProducerStateTable, read_raw: Callable[[int, int], Any], start: int, end: int,
           chunk_bytes: int = REPLAY_CHUNK_BYTES,
           on_complete: Callable[[CompletedTxn, int], None] | None = None) -> None:
    """Teach ``table`` the batches of a log from ``start`` to ``end``: ``read_raw(offset,
    max_bytes)`` returns whole batches from the one holding ``offset`` on (as Log.read_raw
    does). Only batch headers are read (and a marker's one record); records are not decoded.
    ``on_complete`` as :meth:`ProducerStateTable.record_batches`."""
    offset = start
    while offset < end:
        data = read_raw(offset, chunk_bytes)
        if not data:
            break
        after = table.record_batches(data, offset, on_complete, end)
        if after <= offset:  # pragma: no cover - read_raw returns batches past offset
            break
        offset = after
