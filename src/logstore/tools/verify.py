"""``logstore verify``: a full scrub of a store's files, each problem named by file, position and offset.

:func:`verify` takes every segment's valid batches from the one walk
(:class:`~logstore.log.segmentscan.BatchWalk`, the rule recovery applies: header, CRC,
well-formed records, offsets increasing within the segment) and decodes each (compressed ones
decompressed); it checks offsets across segments, every index entry against the batch it names,
each ``.txnindex`` against the aborted transactions the segment's markers close (replaying the
partition's transactions from its first segment), and that checkpoints and producer snapshots
parse. What ends a segment's valid batches, other
than the zero tail of the last segment, is a problem with the walk's reason.

Everything here only reads (files are mapped read-only through ``_fileio``; nothing is locked,
repaired or created), so it may run on a store in use, on a copy, or on segments written by
Apache Kafka; recovery, which does change files, is :meth:`Log.open` itself (``logstore
recover``). A partition's last segment (perhaps a writer's active one, which a roll or close
trims) is read through :class:`~logstore.store.views.SegmentBatches`: its valid batches mapped,
what follows them read with ``pread`` to its end (every byte of it: an all-zero tail is no
problem, a non-zero byte anywhere in it is), never through a map a trim would make a SIGBUS.
Thread-safety: the functions share no state; call them from any thread.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from typing import Any

from .. import _fileio
from .._native import lib
from ..checkpoint import LEADER_EPOCH_CHECKPOINT, CheckpointFile, CorruptCheckpointError
from ..errors import CorruptRecordError, LogstoreError, RemoteStorageError
from ..log.filenames import SNAPSHOT_SUFFIX
from ..log.producers import snapshot_offsets
from ..log.producerstate import CompletedTxn, CorruptSnapshotError, ProducerStateTable
from ..records.batch import BatchHeader, RecordDecoder, batch_headers
from ..log.filenames import INDEX_SUFFIX, LOG_SUFFIX, TIMEINDEX_SUFFIX, TXNINDEX_SUFFIX, parse_segment_name, segment_name
from ..store.kafkadirs import looks_like_log_dir
from ..store.layout import TOPICS_DIR
from ..store.views import SegmentBatches, StoreView
from .dump import (OFFSET_CHECKPOINTS, index_entries, is_partition_dir, segment_base_offset, timeindex_entries,
                   txnindex_entries)
from .progress import SILENT, Progress

__all__ = ["verify", "Problem", "VerifyReport"]


@dataclass
class Problem:
    """One thing wrong, and where."""

    file: str
    what: str
    position: int | None = None
    offset: int | None = None

    def __str__(self) -> str:
        where = "".join([f" at position {self.position}" if self.position is not None else "",
                         f" (offset {self.offset})" if self.offset is not None else ""])
        return f"{self.file}{where}: {self.what}"


@dataclass
class VerifyReport:
    """What :func:`verify` looked at and found."""

    partitions: int = 0
    segments: int = 0
    batches: int = 0
    records: int = 0
    bytes: int = 0
    problems: list[Problem] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True when no problem was found."""
        return not self.problems

    def as_dict(self) -> dict[str, Any]:
        """The report as plain values (for JSON), with ``ok``."""
        out = asdict(self)
        out["ok"] = self.ok
        return out


def verify(path: str, progress: Progress = SILENT, remote: bool = False,
           remote_storage: str | None = None) -> VerifyReport:
    """Scrub ``path``: a store root, a Kafka log directory (every subdirectory holding
    segments, skipped ones included), a partition directory or one ``.log`` file. Reads only.

    With ``remote``, a store's tiered partitions' remote segments (tiered storage) are read
    from the object store too (``remote_storage``, else the one the store remembers): every
    batch's header and CRC, its records decoded, and the offsets each segment's metadata
    claims; a problem names the remote segment (its partition, offsets and id).

    Raises:
        LogstoreError: ``path`` is none of those.
    """
    report = VerifyReport()
    path = os.path.abspath(path)
    ops = _fileio.ops
    if os.path.isfile(path) and path.endswith(LOG_SUFFIX):
        _verify_segment(path, None, -1, True, report, progress)
        return report
    if not os.path.isdir(path):
        raise LogstoreError(f"{path}: not a store, a partition directory or a .log file")
    if ops.exists(os.path.join(path, TOPICS_DIR)) or (not is_partition_dir(path) and looks_like_log_dir(path)):
        dirs = [os.path.join(path, name) for name in sorted(ops.listdir(path))
                if os.path.isdir(os.path.join(path, name)) and is_partition_dir(os.path.join(path, name))]
        for name in OFFSET_CHECKPOINTS:
            checkpoint = os.path.join(path, name)
            try:
                CheckpointFile(checkpoint, 3).read()
            except CorruptCheckpointError as exc:
                report.problems.append(Problem(checkpoint, str(exc)))
    elif is_partition_dir(path):
        dirs = [path]
    else:
        raise LogstoreError(f"{path}: not a store (no {TOPICS_DIR}/), a Kafka log directory, a partition directory "
                            "or a .log file")
    total = sum(ops.size(os.path.join(d, n)) for d in dirs for n in ops.listdir(d) if n.endswith(LOG_SUFFIX))
    progress.start(f"verify {os.path.basename(path)}", total)
    try:
        for directory in dirs:
            _verify_partition(directory, report, progress)
    finally:
        progress.finish()
    if remote and ops.exists(os.path.join(path, TOPICS_DIR)):
        _verify_remote(StoreView(path, remote_storage=remote_storage), report)
    return report


def _verify_remote(view: StoreView, report: VerifyReport) -> None:
    """Read every remote segment of every tiered partition of the store, whole batches at a
    time (each validated by the read path: header and CRC), and decode its records."""
    for topic in view.topics():
        for p in range(view.partitions(topic)):
            tier = view.remote_tier(topic, p)
            if tier is None:
                continue
            with tier:
                for metadata in tier.segments:
                    _verify_remote_segment(tier, metadata, report)


def _verify_remote_segment(tier: Any, metadata: Any, report: VerifyReport) -> None:
    where = metadata.describe()
    report.segments += 1
    offset, first = metadata.start_offset, None
    decoder = RecordDecoder()
    try:
        while offset <= metadata.end_offset:
            raw = tier.reader.read_batches(metadata, offset, 8 << 20)
            if not raw:
                break
            records, _ = decoder.decode(raw, 0, len(raw), 0, -1, path=where)
            for _, header in batch_headers(raw):
                first = header.base_offset if first is None else first
                report.batches += 1
                offset = header.last_offset + 1
            report.records += len(records)
            report.bytes += len(raw)
    except (RemoteStorageError, CorruptRecordError) as exc:
        report.problems.append(Problem(where, str(exc), offset=offset))
        return
    if first != metadata.start_offset or offset != metadata.end_offset + 1:
        report.problems.append(Problem(where, f"its batches hold offsets {first}..{offset - 1}, its metadata says "
                                              f"{metadata.start_offset}..{metadata.end_offset}"))


def _verify_partition(directory: str, report: VerifyReport, progress: Progress) -> None:
    report.partitions += 1
    bases = sorted(parsed[0] for name in _fileio.ops.listdir(directory)
                   if (parsed := parse_segment_name(name)) and parsed[1] == LOG_SUFFIX)
    previous_last = -1
    # The partition's transactions, replayed from its first segment: the aborts each segment's
    # markers close (a transaction begun before the first segment has an unknown first offset).
    table = ProducerStateTable()
    for i, base in enumerate(bases):
        path = os.path.join(directory, segment_name(base) + LOG_SUFFIX)
        aborts: list[tuple[CompletedTxn, int]] = []
        last = _verify_segment(path, base, previous_last, i == len(bases) - 1, report, progress, table, aborts)
        if last >= 0:
            previous_last = last
        _verify_txnindex(path[: -len(LOG_SUFFIX)] + TXNINDEX_SUFFIX, aborts, bases[0] == 0, report)
    epochs = os.path.join(directory, LEADER_EPOCH_CHECKPOINT)
    try:
        CheckpointFile(epochs, 2).read()
    except CorruptCheckpointError as exc:
        report.problems.append(Problem(epochs, str(exc)))
    for offset in snapshot_offsets(directory):
        snapshot = os.path.join(directory, segment_name(offset) + SNAPSHOT_SUFFIX)
        try:
            ProducerStateTable.from_snapshot(_fileio.ops.read_file(snapshot), snapshot)
        except CorruptSnapshotError as exc:  # (the log deletes it and replays instead)
            report.problems.append(Problem(snapshot, str(exc)))


def _verify_segment(path: str, base: int | None, previous_last: int, last_segment: bool, report: VerifyReport,
                    progress: Progress, table: ProducerStateTable | None = None,
                    aborts: list[tuple[CompletedTxn, int]] | None = None) -> int:
    """Check one segment (base offset ``base``, or as :func:`segment_base_offset` finds it) and
    its indexes; return its last offset (-1 when it has no batch). With ``table``, its batches
    teach it the producers' transactions, and the aborted ones its markers close go to
    ``aborts`` with the last stable offset each leaves."""
    report.segments += 1
    decoder = RecordDecoder()
    batches: dict[int, BatchHeader] = {}
    max_ts_at: list[tuple[int, int]] = []  # (last offset, largest timestamp so far)
    largest_ts = -(2**63)
    last = -1
    base = segment_base_offset(path) if base is None else base
    # A segment before the last was trimmed when it rolled: mapped whole. The last one is mapped
    # up to its valid batches, and the bytes past them are read with pread (all of them).
    with SegmentBatches(path, base, sealed=not last_segment) as segment:
        data = segment.data
        for position, header in segment:
            try:
                records, _ = decoder.decode(data, position, position + header.size, path=path)
            except CorruptRecordError as exc:
                report.problems.append(Problem(path, f"invalid batch ({exc.reason}); {segment.size - position} "
                                                     "bytes from here are unreadable", position,
                                               last + 1 if last >= 0 else None))
                break
            if header.base_offset <= previous_last:  # (within the segment the walk checks it)
                report.problems.append(Problem(path, f"offsets go backwards: batch {header.base_offset}.."
                                                     f"{header.last_offset} after {previous_last}",
                                               position, header.base_offset))
            if header.base_offset < base:
                report.problems.append(Problem(path, f"batch offset {header.base_offset} is below the segment's "
                                                     f"base offset {base}", position, header.base_offset))
            batches[position] = header
            last = header.last_offset
            if table is not None:
                try:
                    table.record_batches(data[position:position + header.size], 0,
                                         None if aborts is None else (lambda t, lso: t.aborted and aborts.append((t, lso))))
                except CorruptRecordError as exc:
                    report.problems.append(Problem(path, f"a control batch that cannot be read ({exc.reason})",
                                                   position, header.base_offset))
            largest_ts = max(largest_ts, header.max_timestamp)
            max_ts_at.append((last, largest_ts))
            report.batches += 1
            report.records += len(records)
            report.bytes += header.size
            progress.advance(header.size)
        else:
            stop = segment.stop
            # Past the valid batches: nothing, the zero tail of the active segment, or damage.
            if stop.status != lib.LS_OK and not (last_segment and stop.status == lib.LS_ERR_ZERO):
                report.problems.append(Problem(path, f"invalid batch ({stop.reason}); {segment.size - stop.position} "
                                                     "bytes from here are unreadable", stop.position,
                                               last + 1 if last >= 0 else None))
    _verify_indexes(path, base, batches, max_ts_at, report)
    return last


def _verify_txnindex(path: str, aborts: list[tuple[CompletedTxn, int]], known_from_start: bool,
                     report: VerifyReport) -> None:
    """The ``.txnindex`` at ``path`` must hold exactly the aborted transactions the segment's
    markers close, in order: same producer and marker offset, and the same first offset and
    last stable offset where the replay knows them (always, when the log starts at offset 0)."""
    entries = txnindex_entries(path) if _fileio.ops.exists(path) else []
    if _fileio.ops.exists(path) and _fileio.ops.size(path) % 34:
        report.problems.append(Problem(path, f"file size {_fileio.ops.size(path)} is not a multiple of 34 bytes"))
    for n, (version, pid, first, last, lso) in enumerate(entries):
        if version != 0:
            report.problems.append(Problem(path, f"entry {n} has version {version} (Kafka writes 0)", None, last))
        if n >= len(aborts):
            report.problems.append(Problem(path, f"entry {n} (producer {pid}, aborted at {last}) has no ABORT marker "
                                                 "in the segment", None, last))
            continue
        txn, stable = aborts[n]
        if (pid, last) != (txn.producer_id, txn.last_offset):
            report.problems.append(Problem(path, f"entry {n} says producer {pid} aborted at {last}, but the "
                                                 f"segment's abort {n} is producer {txn.producer_id}'s at "
                                                 f"{txn.last_offset}", None, last))
            continue
        known = known_from_start or txn.first_offset != txn.last_offset
        if known and first != txn.first_offset:
            report.problems.append(Problem(path, f"entry {n} says the transaction began at {first}, the log says "
                                                 f"{txn.first_offset}", None, last))
        if known_from_start and lso != stable:
            report.problems.append(Problem(path, f"entry {n} has last stable offset {lso}, the log says {stable}",
                                           None, last))
    for txn, _ in aborts[len(entries):]:
        report.problems.append(Problem(path, f"missing entry: producer {txn.producer_id}'s transaction aborted at "
                                             f"{txn.last_offset}", None, txn.last_offset))


def _verify_indexes(path: str, base: int, batches: dict[int, BatchHeader], max_ts_at: list[tuple[int, int]],
                    report: VerifyReport) -> None:
    stem = path[: -len(LOG_SUFFIX)]
    index, timeindex = stem + INDEX_SUFFIX, stem + TIMEINDEX_SUFFIX
    if _fileio.ops.exists(index):
        previous = (-1, -1)
        for offset, position in index_entries(index, base):
            header = batches.get(position)
            if header is None:
                report.problems.append(Problem(index, "entry points at no batch boundary", position, offset))
            elif not header.base_offset <= offset <= header.last_offset:
                report.problems.append(Problem(index, f"entry names offset {offset} but the batch there holds "
                                                      f"{header.base_offset}..{header.last_offset}", position, offset))
            if (offset, position) <= previous or offset <= previous[0] or position <= previous[1]:
                report.problems.append(Problem(index, "entries are not increasing", position, offset))
            previous = (offset, position)
    if _fileio.ops.exists(timeindex):
        previous_ts = -(2**63)
        lasts = [o for o, _ in max_ts_at]
        entries = timeindex_entries(timeindex, base)
        if not lasts and entries == [(0, base)]:
            entries = []  # the zero-filled, preallocated time index of an empty active segment
        for timestamp, offset in entries:
            if timestamp <= previous_ts and previous_ts != -(2**63):
                report.problems.append(Problem(timeindex, "timestamps are not increasing", None, offset))
            previous_ts = timestamp
            i = next((k for k, o in enumerate(lasts) if o >= offset), None)
            if i is None:
                report.problems.append(Problem(timeindex, f"entry names offset {offset}, past the segment's last "
                                                          f"offset {lasts[-1] if lasts else base - 1}", None, offset))
            elif max_ts_at[i][1] != timestamp:
                report.problems.append(Problem(timeindex, f"entry says the largest timestamp up to offset {offset} is "
                                                          f"{timestamp}, but the log has {max_ts_at[i][1]}", None, offset))
