"""LogLoader: recovery of a partition at open, from its files and the log directory's checkpoints.

At open, a partition directory may hold the leftovers of anything a crash interrupted: a
truncation journal (``.log.truncating``), compaction output that never replaced anything
(``.cleaned``), finished output whose rename was cut short (``.swap``), files already removed
from the log (``.deleted``), indexes without their log, and an active segment with a torn tail.
The loader finishes or rolls back each of these, then scans the segments that may hold unflushed
data (from the one holding the recovery point on, or every one without a clean-shutdown marker
or recovery point) and truncates the first invalid batch and everything after it. It owns the
``.kafka_cleanshutdown`` marker and reads this partition's entries of the log directory's
``recovery-point-offset-checkpoint`` and ``log-start-offset-checkpoint`` files.

Thread-safety: not thread-safe; used by :class:`~logstore.log.log.Log` while it opens (or, for a
shared log whose writer died mid-change, repairs) the partition under its locks.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any

from .. import _fileio
from .._native import ffi, lib
from ..checkpoint import LEADER_EPOCH_CHECKPOINT, CorruptCheckpointError, OffsetCheckpoints
from .epochs import LeaderEpochCache
from ..errors import CorruptIndexError, CorruptRecordError
from .segments import LogSegments
from ..segment import LogSegment, replay_truncation_journal
from .filenames import (
    CLEANED_SUFFIX,
    DELETED_SUFFIX,
    INDEX_SUFFIX,
    LOG_SUFFIX,
    SWAP_SUFFIX,
    TIMEINDEX_SUFFIX,
    TRUNCATION_SUFFIX,
    TXNINDEX_SUFFIX,
    parse_segment_name,
    segment_name,
)

__all__ = ["LogLoader", "LoadedLog", "RecoveryReport", "CLEAN_SHUTDOWN_FILE"]

logger = logging.getLogger("logstore.log.log")

CLEAN_SHUTDOWN_FILE = ".kafka_cleanshutdown"


@dataclass(frozen=True)
class RecoveryReport:
    """What opening the log found and did."""

    clean_shutdown: bool
    segments_recovered: int
    bytes_truncated: int
    segments_deleted: int
    indexes_rebuilt: int


@dataclass(frozen=True)
class LoadedLog:
    """The offsets a load established (Kafka's LoadedLogOffsets)."""

    log_start_offset: int
    recovery_point: int
    #: the log start was past everything on disk: the caller restarts the log there
    start_past_end: bool
    report: RecoveryReport
    #: the base of the first segment whose transaction index must be written anew (recovery
    #: found markers in it, or its index is damaged), None when every index can be trusted
    txn_rebuild_from: int | None = None
    #: the log start came from the checkpoint file (False: it had no entry, or was unreadable,
    #: and the first segment's base stands in; a tiered log then takes its remote tier's start)
    start_checkpointed: bool = True


class LogLoader:
    """Loads and recovers the segments of one partition directory into a :class:`LogSegments`.

    Args:
        segments: the (empty) segment set to fill.
        key: (topic, partition), this partition's key in the checkpoint files.
        recovery_points, start_offsets: the log directory's checkpoint files.
    """

    def __init__(self, segments: LogSegments, key: tuple[str, int], recovery_points: OffsetCheckpoints,
                 start_offsets: OffsetCheckpoints) -> None:
        self.path = segments.path
        self.segments = segments
        self.key = key
        self.recovery_points = recovery_points
        self.start_offsets = start_offsets

    def load(self, recovery_point: int | None = None, log_start_offset: int | None = None,
             start_below_segments: bool = False) -> LoadedLog:
        """Load the segments and recover what needs it. ``recovery_point``/``log_start_offset``
        replace the checkpoint files' values (repair of a shared log after a writer died).
        ``start_below_segments``: the log start checkpoint may lie below the first segment
        (tiered storage: the older segments are remote; the log checks it against its remote
        tier when one is attached).

        On return the set holds at least one segment; the last one may still be sealed (the
        caller activates it) and segments it recovered are fsynced.
        """
        ops = _fileio.ops
        segments = self.segments
        marker = os.path.join(self.path, CLEAN_SHUTDOWN_FILE)
        clean = ops.exists(marker)
        if clean:
            # Invariant: the marker is gone (durably) before any file changes, so a crash from
            # here on is seen as unclean by the next open and the active segment is recovered.
            ops.unlink(marker)
            ops.fsync_dir(self.path)
        names = ops.listdir(self.path)
        self.finish_interrupted_operations(names)
        names = ops.listdir(self.path)
        bases = sorted({parsed[0] for name in names if (parsed := parse_segment_name(name)) and parsed[1] == LOG_SUFFIX})
        for name in names:  # indexes without their log are leftovers of a deletion
            parsed = parse_segment_name(name)
            if parsed and parsed[1] in (INDEX_SUFFIX, TIMEINDEX_SUFFIX, TXNINDEX_SUFFIX) and parsed[0] not in bases:
                ops.unlink(os.path.join(self.path, name))
        if recovery_point is None:
            recovery_point, start_checkpoint = self.read_checkpoints()
        else:
            clean = False
            start_checkpoint = log_start_offset
        if recovery_point is None:
            clean = False  # without a recovery point, every segment is scanned
            recovery_point = 0
        recovered = truncated = deleted = rebuilt = 0
        recovered_segments: list[LogSegment] = []
        txn_rebuild_from: int | None = None
        for base in bases:
            has_indexes = all(ops.exists(os.path.join(self.path, segment_name(base) + s))
                              for s in (INDEX_SUFFIX, TIMEINDEX_SUFFIX))
            segment = segments.open_segment(base)
            if not has_indexes:
                segment.rebuild_indexes()
                rebuilt += 1
        # Segments from the one holding the recovery point on may hold unflushed data.
        first_unflushed = len(segments) if clean else segments.floor_index(recovery_point)
        bases = list(segments.bases())
        for i, base in enumerate(bases):
            segment = segments[base]
            last = i == len(bases) - 1
            if i >= first_unflushed:
                result = segment.recover()
                recovered += 1
                recovered_segments.append(segment)
                if result.txn_markers and txn_rebuild_from is None:
                    txn_rebuild_from = base
                if result.truncated_bytes:
                    truncated += result.truncated_bytes
                    # Everything after a torn batch is suspect: drop the later segments.
                    for later in bases[i + 1 :]:
                        segments.pop(later).abandon()
                        segments.delete_files_now(later)
                        deleted += 1
                    break
                continue
            if segment.txn_index.damage and txn_rebuild_from is None:
                logger.warning("%s: %s; rebuilding the transaction indexes from here",
                               segment.txn_index.path, segment.txn_index.damage)
                txn_rebuild_from = base
            try:
                segment.check_indexes()
                if last:
                    segment.check_tail()  # a bad batch at the end of the log means recover
            except CorruptIndexError as exc:
                logger.warning("%s; rebuilding", exc)
                segment.rebuild_indexes()
                rebuilt += 1
            except CorruptRecordError as exc:
                logger.warning("%s: tail invalid after a clean shutdown (%s); recovering the segment",
                               segment.path, exc)
                result = segment.recover()
                recovered += 1
                recovered_segments.append(segment)
                truncated += result.truncated_bytes
                if result.txn_markers and txn_rebuild_from is None:
                    txn_rebuild_from = base
        segments.link_next_offsets()
        if not len(segments):
            segments.create_segment(start_checkpoint or 0)
        end_offset = segments.last.next_offset
        start = segments.first.base_offset
        if start_checkpoint is not None:
            start = start_checkpoint if start_below_segments else max(start, start_checkpoint)
        report = RecoveryReport(clean, recovered, truncated, deleted, rebuilt)
        if start > end_offset:
            # The log start moved past everything on disk: the log starts over there (Kafka's
            # truncateFullyAndStartAt).
            return LoadedLog(start, start, True, report, start_checkpointed=start_checkpoint is not None)
        if txn_rebuild_from is not None and txn_rebuild_from not in segments:
            txn_rebuild_from = None  # (its segment was dropped after a torn batch before it)
        if recovered:
            # Recovered bytes may still be only in the page cache; segments below the recovery
            # point were fsynced when they rolled.
            for segment in recovered_segments:
                if not segment.closed:
                    segment.flush()
            recovery_point = end_offset
        elif clean:
            recovery_point = end_offset
        else:
            recovery_point = min(max(recovery_point, start), end_offset)
        return LoadedLog(start, recovery_point, False, report, txn_rebuild_from, start_checkpoint is not None)

    def read_checkpoints(self) -> tuple[int | None, int | None]:
        """(recovery point, log start offset) from the log directory's checkpoint files.

        A damaged checkpoint file costs a longer recovery, not the log: it is read as absent
        (recovery point None: scan everything) and rewritten after the open.
        """
        try:
            recovery_point = self.recovery_points.get(self.key)
        except CorruptCheckpointError as exc:
            logger.warning("%s; recovering every segment", exc)
            recovery_point = None
        else:
            recovery_point = recovery_point or 0
        try:
            start = self.start_offsets.get(self.key)
        except CorruptCheckpointError as exc:
            logger.warning("%s; the log starts at its first segment", exc)
            start = None
        return recovery_point, start

    def load_leader_epochs(self, start: int, end: int) -> LeaderEpochCache:
        """Read leader-epoch-checkpoint and drop what recovery truncated. A damaged file is
        dropped with a warning: epochs are learnt again from the next assignment or
        replicated batch."""
        try:
            cache = LeaderEpochCache(self.path)
        except CorruptCheckpointError as exc:
            logger.warning("%s; starting an empty leader epoch cache", exc)
            _fileio.ops.unlink(os.path.join(self.path, LEADER_EPOCH_CHECKPOINT))
            cache = LeaderEpochCache(self.path)
        cache.truncate_from_end(end)
        cache.truncate_from_start(start)
        return cache

    def finish_interrupted_operations(self, names: list[str]) -> None:
        """Complete or roll back file operations that a crash interrupted.

        A ``.log.truncating`` journal is a truncation that may have been half applied: it is
        finished (or, if the journal itself is incomplete, dropped). Then Kafka's suffix
        protocol:

        ``.deleted`` files were already removed from the log: unlink them. ``.cleaned`` files
        are unfinished compaction output that never replaced anything: unlink them. A ``.log.swap``
        file is finished output whose rename was interrupted: the live segments it covers are
        deleted and every ``.swap`` file of its base is renamed into place. A ``.txnindex.swap``
        without a ``.log.swap`` is the rest of a swap that committed (its log went live) when the
        replaced segment's ``.log.deleted`` is still there: it is renamed into place; otherwise
        it is the leftover of a pass that failed before its commit, and is unlinked. The
        completed renames are made durable before any ``.deleted`` file goes (see
        :func:`logstore.cleaner.swap_in`).
        """
        ops = _fileio.ops
        for name in names:
            if name.endswith(LOG_SUFFIX + TRUNCATION_SUFFIX):
                full = os.path.join(self.path, name)
                replay_truncation_journal(full, full[: -len(TRUNCATION_SUFFIX)])
        names = ops.listdir(self.path)
        present = set(names)
        swaps = sorted(name for name in names if name.endswith(SWAP_SUFFIX))
        completed = set()
        for name in swaps:
            parsed = parse_segment_name(name)
            if parsed is None or parsed[1] != LOG_SUFFIX + SWAP_SUFFIX:
                continue
            base = parsed[0]
            swap_path = os.path.join(self.path, name)
            next_offset = _swap_next_offset(swap_path, base)
            for other in ops.listdir(self.path):
                op = parse_segment_name(other)
                if op and op[1] in (LOG_SUFFIX, INDEX_SUFFIX, TIMEINDEX_SUFFIX, TXNINDEX_SUFFIX) and base <= op[0] < next_offset:
                    ops.unlink(os.path.join(self.path, other))
            for other in ops.listdir(self.path):
                op = parse_segment_name(other)
                if op and op[0] == base and other.endswith(SWAP_SUFFIX):
                    ops.rename(os.path.join(self.path, other), os.path.join(self.path, other[: -len(SWAP_SUFFIX)]))
                    completed.add(other)
        for name in swaps:
            parsed = parse_segment_name(name)
            if name in completed or parsed is None or parsed[1] != TXNINDEX_SUFFIX + SWAP_SUFFIX:
                continue
            full = os.path.join(self.path, name)
            if segment_name(parsed[0]) + LOG_SUFFIX + DELETED_SUFFIX in present:
                ops.rename(full, full[: -len(SWAP_SUFFIX)])
            else:
                logger.warning("dropping %s: the leftover of a compaction pass that did not commit", full)
                ops.unlink(full)
        if swaps:
            ops.fsync_dir(self.path)
        for name in ops.listdir(self.path):
            if name.endswith(DELETED_SUFFIX) or name.endswith(CLEANED_SUFFIX) or name.endswith(".tmp"):
                ops.unlink(os.path.join(self.path, name))
        ops.fsync_dir(self.path)

    def write_clean_shutdown_marker(self) -> None:
        """Durably create ``.kafka_cleanshutdown``: the next open trusts the segments up to the
        recovery point checkpoint without scanning them."""
        marker = os.path.join(self.path, CLEAN_SHUTDOWN_FILE)
        fd = _fileio.ops.open(marker, os.O_WRONLY | os.O_CREAT)
        try:
            _fileio.ops.fsync(fd)
        finally:
            _fileio.ops.close(fd)
        _fileio.ops.fsync_dir(self.path)


def _swap_next_offset(path: str, base: int) -> int:
    """Next offset after the batches of a ``.swap`` log file (to find what it replaces)."""
    data: Any = _fileio.ops.read_file(path)
    res = ffi.new("ls_scan_result *")
    lib.ls_segment_scan(data, len(data), base, 1 << 30, 0, ffi.NULL, 0, ffi.NULL, 0, res)
    return res.last_offset + 1 if res.last_offset >= 0 else base
