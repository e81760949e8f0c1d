"""The leader epoch cache: ``<partition dir>/leader-epoch-checkpoint`` (Kafka's LeaderEpochFileCache).

Each entry ``(epoch, start offset)`` says that the leader of ``epoch`` wrote its first record at
``start offset``. Epochs strictly increase down the file and start offsets never decrease. The
file is a Kafka checkpoint file (version 0, count, one ``epoch offset`` line per entry), replaced
atomically on every change.

Replication uses it for KIP-101/KIP-279 truncation: a follower asks the leader for the end offset
of its last epoch (:meth:`LeaderEpochCache.end_offset_for`) and truncates its log there.

Thread-safety: not thread-safe; the owning Log serialises access.
"""

from __future__ import annotations

import os

from ..checkpoint import LEADER_EPOCH_CHECKPOINT, CheckpointFile, CorruptCheckpointError

__all__ = ["LeaderEpochCache", "UNDEFINED_EPOCH", "UNDEFINED_OFFSET"]

UNDEFINED_EPOCH = -1
UNDEFINED_OFFSET = -1


class LeaderEpochCache:
    """The (epoch, start offset) history of one partition.

    Durability: every change is written to the checkpoint file (fsynced) before it returns.
    """

    def __init__(self, directory: str) -> None:
        self._file = CheckpointFile(os.path.join(directory, LEADER_EPOCH_CHECKPOINT), fields=2)
        self.entries: list[tuple[int, int]] = []
        try:
            rows = self._file.read()
            entries = [(int(epoch), int(offset)) for epoch, offset in rows]
        except (CorruptCheckpointError, ValueError) as exc:
            raise CorruptCheckpointError(f"{self._file.path}: {exc}") from None
        for (e1, o1), (e2, o2) in zip(entries, entries[1:]):
            if e2 <= e1 or o2 < o1:
                raise CorruptCheckpointError(
                    f"{self._file.path}: entries must have increasing epochs and non-decreasing offsets, "
                    f"got ({e1}, {o1}) then ({e2}, {o2})")
        if any(e < 0 or o < 0 for e, o in entries):
            raise CorruptCheckpointError(f"{self._file.path}: negative epoch or offset")
        self.entries = entries

    @property
    def path(self) -> str:
        """The leader-epoch-checkpoint file."""
        return self._file.path

    @property
    def latest_epoch(self) -> int:
        """The newest epoch, or UNDEFINED_EPOCH (-1) when the cache is empty."""
        return self.entries[-1][0] if self.entries else UNDEFINED_EPOCH

    def assign(self, epoch: int, start_offset: int) -> bool:
        """Record that ``epoch`` starts at ``start_offset``; returns False when nothing changed.

        An epoch already known keeps its first start offset. Entries that the new one
        contradicts (same or later epoch, or a start offset at or past this one — a history the
        log has truncated away) are dropped first, as Kafka does.

        Raises:
            ValueError: a negative epoch or offset.
        """
        if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
            raise ValueError(f"leader epoch must be an int >= 0, got {epoch!r}")
        if start_offset < 0:
            raise ValueError(f"start offset must be >= 0, got {start_offset}")
        if self.entries and self.entries[-1][0] == epoch:
            return False
        kept = [(e, o) for e, o in self.entries if e < epoch and o < start_offset]
        kept.append((epoch, start_offset))
        self._store(kept)
        return True

    def end_offset_for(self, epoch: int, log_end_offset: int) -> tuple[int, int]:
        """(epoch, end offset) for a follower's OffsetsForLeaderEpoch request (KIP-101/KIP-279).

        For the latest epoch the end is the log end offset; for an older one, the start offset of
        the first later epoch, paired with the largest known epoch not above the one asked for
        (the follower truncates to that offset and retries with that epoch). Unknown epochs give
        (UNDEFINED_EPOCH, UNDEFINED_OFFSET).
        """
        if epoch == UNDEFINED_EPOCH or not self.entries:
            return UNDEFINED_EPOCH, UNDEFINED_OFFSET
        if epoch == self.latest_epoch:
            return epoch, log_end_offset
        higher = next(((e, o) for e, o in self.entries if e > epoch), None)
        if higher is None:
            return UNDEFINED_EPOCH, UNDEFINED_OFFSET
        floor = [(e, o) for e, o in self.entries if e <= epoch]
        if not floor:
            return epoch, higher[1]
        return floor[-1][0], higher[1]

    def epoch_for_offset(self, offset: int) -> int:
        """The epoch whose leader wrote ``offset`` (UNDEFINED_EPOCH before the first entry)."""
        found = UNDEFINED_EPOCH
        for e, o in self.entries:
            if o > offset:
                break
            found = e
        return found

    def truncate_from_end(self, end_offset: int) -> None:
        """The log was truncated to ``end_offset``: forget epochs that start at or after it."""
        kept = [(e, o) for e, o in self.entries if o < end_offset]
        if kept != self.entries:
            self._store(kept)

    def truncate_from_start(self, start_offset: int) -> None:
        """The log start moved to ``start_offset``: drop epochs that ended before it and move the
        start of the epoch holding it up to it."""
        if not self.entries or self.entries[0][1] >= start_offset:
            return
        kept = [(e, o) for e, o in self.entries if o >= start_offset]
        covering = [(e, o) for e, o in self.entries if o < start_offset]
        if covering and (not kept or kept[0][1] > start_offset):
            kept.insert(0, (covering[-1][0], start_offset))
        if kept != self.entries:
            self._store(kept)

    def clear(self) -> None:
        """Forget every epoch (durably)."""
        if self.entries:
            self._store([])

    def _store(self, entries: list[tuple[int, int]]) -> None:
        self._file.write(entries)
        self.entries = entries
