"""ProducerStateManager: a Log's producer state, kept current, and its ``.snapshot`` files.

The table itself (each idempotent producer's epoch and last five batches, the check of a new
batch, the snapshot format) is :mod:`~logstore.log.producerstate`'s. This module keeps one Log's
table true to its log, as Kafka's ProducerStateManager does, and owns the partition directory's
``NNNNNNNNNNNNNNNNNNNN.snapshot`` files (20-digit offset, Kafka's names and format): the file
named N holds the producer state of the log below offset N.

Loading. The table is loaded when it is first needed (the first idempotent batch appended or
checked), not at open: a log that never sees a producer id pays nothing, neither at open nor at
a roll or close, and has no snapshot files. Loading reads the newest snapshot usable (at or
below the log end, at or above the first segment's base) and replays the batch headers after
it to the log end (records are not decoded); a snapshot that cannot be read is deleted with a
warning and the next older one is tried, then a replay from the log start. Once loaded, every
append path teaches the table its batch (:meth:`learn`), so it stays current.

Invariant: a snapshot file N describes the log below N as it is now. It is written only after
everything below N was fsynced (at a roll, after the old segment was sealed; at a clean close,
after every segment was), and every change below N (a truncation, a restart of the log) deletes
it durably first. Hence after any crash every snapshot at or below the log end is sound; one
above the log end (recovery cut the tail it described) is deleted at open, before an append can
reach its offset again.

Writing and pruning. A loaded table is written as a snapshot when a segment rolls (at the new
segment's base offset) and at a clean close (at the log end), through
:meth:`FileOps.write_file_atomic <logstore._fileio.FileOps.write_file_atomic>` (temp file,
fsync, rename, directory fsync). A failed write costs only a longer load later: it is logged and
the log goes on. Snapshots below the first segment's base (their log is gone) are deleted, and
only the newest :data:`SNAPSHOTS_KEPT` are kept (Kafka keeps one per segment; the older ones
serve only a truncation far back, which replays from an older one or the log start instead),
except, with tiered storage, those of the segments not yet copied (``keep_after``): each copy
takes its segment's own, which a follower restarting past the tier loads.

Forgetting. A truncation deletes the snapshots above the new end and reloads the table when it
lost a batch (:meth:`ProducerStateTable.truncate_to` knows only five batches per producer); a
restart of the log empties it; when the log start moves, producers whose last batch is below it
are forgotten (Kafka's truncateHead).

Shared logs (several processes appending to one partition, see :mod:`~logstore.log.shared`): each
process has its own table and remembers the log end it has learnt up to. Before a check, under
the writers' lock, it replays the headers the other processes appended since (its own appends
advance it as they go); when another process changed the segment layout (a roll, a deletion, a
truncation) it reloads from the snapshots, which the writer of a roll or close wrote from a
table brought current the same way. So a process never checks a batch against a stale table.

Thread-safety: not thread-safe; the owning Log calls it with its lock (and for a shared log its
writers' lock) held.
"""

from __future__ import annotations

import logging
import os
from typing import Any, Callable

from .. import _fileio
from ..errors import LogstoreError
from ..index import AbortedTxn
from .producerstate import CompletedTxn, CorruptSnapshotError, ProducerStateTable, replay
from .filenames import SNAPSHOT_SUFFIX, parse_segment_name, segment_name

__all__ = ["ProducerStateManager", "SNAPSHOTS_KEPT", "snapshot_offsets", "snapshot_path"]

logger = logging.getLogger("logstore.log.log")

#: How many snapshot files a partition keeps (the newest ones).
SNAPSHOTS_KEPT = 3


def snapshot_path(directory: str, offset: int) -> str:
    """The path of the producer state snapshot at ``offset`` in a partition directory."""
    return os.path.join(directory, segment_name(offset) + SNAPSHOT_SUFFIX)


def snapshot_offsets(directory: str) -> list[int]:
    """The offsets of the ``.snapshot`` files in a partition directory, ascending."""
    return sorted(parsed[0] for name in _fileio.ops.listdir(directory)
                  if (parsed := parse_segment_name(name)) is not None and parsed[1] == SNAPSHOT_SUFFIX)


class ProducerStateManager:
    """A Log's :class:`~logstore.log.producerstate.ProducerStateTable`, loaded on first use and kept
    current, and the ``NNN.snapshot`` files of its partition directory (see the module
    docstring).

    Args:
        path: the partition directory.
        segments: the Log's :class:`~logstore.log.segments.LogSegments` (read for replays).
        shared: the log is shared by several processes.

    Thread-safety: not thread-safe; the Log serialises every call under its lock.
    """

    def __init__(self, path: str, segments: Any, shared: bool = False) -> None:
        self.path = path
        self._segments = segments
        self._shared = shared
        #: the table, None until loaded (or after something made it stale)
        self.table: ProducerStateTable | None = None
        #: the log end and start the table has learnt up to
        self._end = 0
        self._start = 0
        #: the offset the table's replay began at (its snapshot's): what lies below is known
        #: only as the snapshot summarised it (not the markers, say)
        self._replayed_from = 0
        #: snapshot offsets on disk (an exclusive log's own record; a shared log lists the directory)
        self._offsets: list[int] | None = None
        #: tiered storage: returns the offset past which every snapshot is kept, whatever their
        #: count (those of the segments not yet copied: the copy takes each segment's own)
        self.keep_after: Callable[[], int] | None = None

    # ------------------------------------------------------------------ files
    def _file(self, offset: int) -> str:
        return snapshot_path(self.path, offset)

    def _snapshots(self) -> list[int]:
        if self._offsets is None or self._shared:
            self._offsets = snapshot_offsets(self.path)
        return self._offsets

    def _delete(self, offsets: list[int], durable: bool = False) -> None:
        if not offsets:
            return
        known = self._snapshots()
        for offset in offsets:
            try:
                _fileio.ops.unlink(self._file(offset))
            except FileNotFoundError:
                pass
            if offset in known:
                known.remove(offset)
        if durable:
            _fileio.ops.fsync_dir(self.path)

    def _prune(self) -> None:
        """Delete the snapshots below the first segment's base and all but the newest few."""
        offsets = self._snapshots()
        first = self._segments.first.base_offset
        doomed = [o for o in offsets if o < first]
        kept = [o for o in offsets if o >= first]
        old = kept[:-SNAPSHOTS_KEPT]
        if old and self.keep_after is not None:
            try:
                after = self.keep_after()
            except LogstoreError as exc:  # (the remote tier is closing): the usual count
                logger.debug("%s: %s", self.path, exc)
            else:
                old = [o for o in old if o <= after]
        self._delete(doomed + old)

    # ------------------------------------------------------------------ open
    def open(self, log_end: int) -> None:
        """The log was loaded (and recovered) and ends at ``log_end``: delete the snapshots above
        it (recovery cut what they describe) and prune the rest; the table loads on first use."""
        self.table = None
        self._offsets = None
        offsets = self._snapshots()
        above = [o for o in offsets if o > log_end]
        if above:
            logger.info("%s: deleting producer snapshots above the log end %d: %s", self.path, log_end, above)
        self._delete(above, durable=True)
        self._prune()

    # ------------------------------------------------------------------ the table
    def current(self, log_start: int, log_end: int) -> ProducerStateTable:
        """The table, loaded if it was not and brought up to ``log_end`` (a shared log's other
        processes may have appended) and ``log_start``.

        Raises:
            CorruptRecordError: a batch on the way cannot be read (a damaged segment).
        """
        table = self.table
        if table is None:
            return self._load(log_start, log_end)
        if self._shared and self._end != log_end:
            if self._end > log_end:  # (a truncation elsewhere changes the layout, which invalidates)
                return self._load(log_start, log_end)
            replay(table, self._segments.read_raw, self._end, log_end)  # what the other processes appended
            self._end = log_end
        if log_start != self._start:
            table.truncate_head(log_start)
            self._start = log_start
        return table

    def current_at(self, log_end: int) -> bool:
        """Would :meth:`current` at ``log_end`` read nothing (the table loaded, and for a shared
        log already brought up to ``log_end``)?"""
        return self.table is not None and (not self._shared or self._end == log_end)

    def _load(self, log_start: int, log_end: int, rebuild_from: int | None = None) -> ProducerStateTable:
        """Load the newest usable snapshot and replay the log after it to ``log_end``. With
        ``rebuild_from``, the snapshot is one at or below it, and every transaction index from
        the segment at ``rebuild_from`` on is written anew from the markers replayed."""
        first_base = self._segments.first.base_offset
        limit = log_end if rebuild_from is None else min(log_end, rebuild_from)
        table = None
        start = log_start
        for offset in reversed(list(self._snapshots())):
            if offset > limit:
                continue  # (a shared log's peer deletes these under the writers' lock)
            if offset < first_base:
                break
            path = self._file(offset)
            try:
                table = ProducerStateTable.from_snapshot(_fileio.ops.read_file(path), path)
            except FileNotFoundError:
                continue
            except CorruptSnapshotError as exc:
                logger.warning("%s; deleting it and loading the producer state from an older one", exc)
                self._delete([offset])
                continue
            start = offset
            break
        if table is None:
            table = ProducerStateTable()
        if rebuild_from is None:
            replay(table, self._segments.read_raw, start, log_end)
        else:
            replay(table, self._segments.read_raw, start, limit)
            rebuilt = [s for s in self._segments.values() if s.base_offset >= rebuild_from]
            for segment in rebuilt:
                segment.txn_index.reset()
            replay(table, self._segments.read_raw, limit, log_end, on_complete=self._index_abort)
            for segment in rebuilt:
                segment.txn_index.flush()
        table.truncate_head(log_start)
        self.table = table
        self._start, self._end = log_start, log_end
        self._replayed_from = start
        return table

    def _index_abort(self, txn: CompletedTxn, stable_offset: int) -> None:
        """Write an aborted transaction to the index of the segment holding its marker."""
        if txn.aborted:
            segment = self._segments.holding(txn.last_offset)
            segment.txn_index.append(AbortedTxn(txn.producer_id, txn.first_offset, txn.last_offset, stable_offset))

    def rebuild_txn_indexes(self, from_base: int, log_start: int, log_end: int) -> None:
        """Write the transaction indexes of the segment at ``from_base`` and every later one anew
        from the log's markers (recovery found markers in segments it scanned, or a damaged
        index): the producer state as of ``from_base`` comes from a snapshot at or below it and
        the batch headers up to it, and the replay on to ``log_end`` indexes every abort. The
        table is left loaded and current. Durable on return (each index is fsynced)."""
        logger.info("%s: rebuilding the transaction indexes from offset %d", self.path, from_base)
        self._load(log_start, log_end, rebuild_from=from_base)

    @property
    def loaded(self) -> bool:
        """Whether the table is loaded (appends teach it their batches only then)."""
        return self.table is not None

    def invalidate(self) -> None:
        """Another process changed the segment layout: reload the table before its next use."""
        self.table = None

    def learn(self, producer_id: int, header: Any, first_offset: int,
              control: tuple[int, int] | None = None) -> tuple[CompletedTxn, int] | None:
        """A batch of producer ``producer_id`` (>= 0) with header fields ``header`` (a
        BatchHeader or C header) was appended at ``first_offset``: remember it. Nothing to do
        before the table is loaded (the load replays the batch); a shared log's table learns
        only what follows what it knows (the rest is replayed before its next use).

        For a transaction marker, ``control`` is its (control type, coordinator epoch); the
        transaction it completes is returned with the last stable offset it leaves (the caller
        indexes an abort in the segment it appended the marker to)."""
        table = self.table
        if table is None:
            return None
        if self._shared:
            if first_offset != self._end:
                return None
            self._end = first_offset + header.last_offset_delta + 1
        txn = table.record_header(header, first_offset, control)
        if txn is None:
            return None
        stable = table.stable_offset_after(txn)
        table.complete(txn)
        return txn, stable

    def passed(self, first_offset: int, end_offset: int) -> None:
        """Batches without a producer id were appended at ``first_offset`` up to
        ``end_offset`` (exclusive) by this process: a shared log's table that knew everything
        before them is current after them (nothing to learn: they are not replayed at its next
        use, which reads them under the log's lock). Nothing for an unshared log."""
        if self._shared and self._end == first_offset:
            self._end = end_offset

    def last_stable_offset(self, log_start: int, log_end: int, high_watermark: int) -> int:
        """The log's last stable offset: the first offset of its earliest unstable transaction
        (open, or completed by a marker at or above the high watermark), capped by
        ``high_watermark``. Loads the table on first use."""
        first = self.current(log_start, log_end).first_unstable_offset(high_watermark)
        return high_watermark if first is None else min(first, high_watermark)

    # ------------------------------------------------------------------ snapshots
    def take_snapshot(self, log_start: int, offset: int) -> None:
        """Write the table as the snapshot at ``offset`` (the log end now, everything below it
        fsynced; a segment just rolled there, or the log is closing) and prune. Nothing when the
        table is not loaded or the snapshot exists. A failure is logged, never raised: the
        snapshot only shortens a later load."""
        if self.table is None:
            return
        try:
            if offset in self._snapshots():
                return
            data = self.current(log_start, offset).to_snapshot()
        except LogstoreError as exc:  # a batch that cannot be read (shared logs replay)
            logger.warning("%s: no producer snapshot at %d: %s", self.path, offset, exc)
            return
        self.write_snapshot(offset, data)

    def snapshot_data(self, log_start: int, log_end: int) -> bytes | None:
        """The snapshot of the table at ``log_end`` (None when not loaded), computed while the
        segments are still open (a clean close writes it after closing them)."""
        if self.table is None or log_end in self._snapshots():
            return None
        try:
            return self.current(log_start, log_end).to_snapshot()
        except LogstoreError as exc:
            logger.warning("%s: no producer snapshot at close: %s", self.path, exc)
            return None

    def write_snapshot(self, offset: int, data: bytes | None) -> None:
        """Write ``data`` (from :meth:`snapshot_data`) as the snapshot at ``offset`` and prune;
        log a failure."""
        if data is None:
            return
        try:
            _fileio.ops.write_file_atomic(self._file(offset), data)
            offsets = self._snapshots()
            if offset not in offsets:
                offsets.append(offset)
                offsets.sort()
            self._prune()
        except OSError as exc:
            logger.warning("%s: could not write the producer snapshot at %d: %s", self.path, offset, exc)
            self._offsets = None
            try:
                _fileio.ops.unlink(self._file(offset) + ".tmp")
            except OSError:
                pass

    # ------------------------------------------------------------------ the log's ends move
    def before_truncation(self, offset: int) -> None:
        """The log is about to be truncated to end at ``offset``: delete the snapshots above it,
        durably, before any segment changes (see the invariant in the module docstring)."""
        self._delete([o for o in self._snapshots() if o > offset], durable=True)

    def truncated(self, log_end: int) -> None:
        """The log was truncated to end at ``log_end``: forget what went, reloading the table
        from a snapshot when it lost a batch."""
        table = self.table
        if table is not None and (table.truncate_to(log_end) or log_end < self._replayed_from):
            self.table = None  # (below its snapshot, a cut marker may reopen a transaction)
        else:
            self._end = min(self._end, log_end)

    def restarted(self, offset: int) -> None:
        """The log was emptied and restarted at ``offset``: no producer is known, and no
        snapshot describes this log."""
        self._delete(list(self._snapshots()), durable=True)
        if self.table is not None:
            self.table.clear()
        self._start = self._end = offset

    def log_start_moved(self) -> None:
        """The log start moved (retention, DeleteRecords): delete the snapshots below the first
        segment (the producers wholly below the log start are forgotten by the table's next
        use, :meth:`current`)."""
        if self.table is not None or self._offsets:
            self._prune()
