"""Operator tools over a store's files: dump, verify (a full scrub) and stats.

Everything here only reads (files are mapped read-only through ``_fileio``; nothing is locked,
repaired or created), so the tools may run on a store that is in use, on a copy, or on segments
written by Apache Kafka. The ``logstore`` command (cli.py) prints what these functions return,
as text or JSON; recovery, which does change files, is :meth:`Log.open` itself (``logstore
recover``).

* :func:`dump_file` - the batches and records of a ``.log`` file (like kafka-dump-log), the
  entries of ``.index`` / ``.timeindex`` files, the producers of a ``.snapshot`` file, or the
  entries of a checkpoint file;
* :func:`verify` - every batch of every segment validated (CRC) and decoded (compressed ones
  decompressed), offsets increasing within and across segments, every index entry pointing at
  the batch it names, checkpoints and producer snapshots parseable; each problem names file,
  position and offset;
* :func:`stats` - per partition: offsets, segments, bytes, records, compression ratio, dirty
  ratio of compacted topics and the lag of every consumer group.

Thread-safety: the functions share no state; call them from any thread.
"""

from __future__ import annotations

import mmap
import os
import re
import struct
from dataclasses import asdict, dataclass, field
from typing import Any, Iterator

from .. import _fileio
from ..records import compression
from .._native import lib
from ..checkpoint import (
    CLEANER_OFFSET_CHECKPOINT,
    LEADER_EPOCH_CHECKPOINT,
    LOG_START_OFFSET_CHECKPOINT,
    RECOVERY_POINT_CHECKPOINT,
    REPLICATION_OFFSET_CHECKPOINT,
    CheckpointFile,
    CorruptCheckpointError,
    OffsetCheckpoints,
)
from ..errors import CorruptRecordError, LogstoreError
from ..store.kafkadirs import looks_like_log_dir
from ..log.producers import snapshot_offsets
from ..store.views import PartitionView, StoreView
from ..groups.offsets import OFFSETS_TOPIC, decode_offset_key, decode_offset_value
from ..log.producerstate import CorruptSnapshotError, ProducerStateTable
from .progress import SILENT, Progress
from ..records.batch import HEADER_SIZE, BatchHeader, RecordDecoder, validate_batch
from ..segment import INDEX_SUFFIX, LOG_SUFFIX, TIMEINDEX_SUFFIX, parse_segment_name, segment_name
from ..log.filenames import SNAPSHOT_SUFFIX
from ..store.store import TOPICS_DIR

__all__ = ["dump_file", "verify", "stats", "partition_key", "Problem", "VerifyReport", "PartitionStats"]

_OFFSET_CHECKPOINTS = (RECOVERY_POINT_CHECKPOINT, LOG_START_OFFSET_CHECKPOINT, CLEANER_OFFSET_CHECKPOINT,
                       REPLICATION_OFFSET_CHECKPOINT)
_INDEX_ENTRY = struct.Struct(">ii")
_TIMEINDEX_ENTRY = struct.Struct(">qi")


def _base_offset(path: str) -> int:
    parsed = parse_segment_name(os.path.basename(path))
    return parsed[0] if parsed else 0


def _text(data: bytes | None) -> str | None:
    """A key or value for people: UTF-8 text when printable, else hex."""
    if data is None:
        return None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return data.hex()
    return text if text.isprintable() else data.hex()


# ---------------------------------------------------------------------- dump
def dump_file(path: str, *, print_data: bool = False, deep: bool = False,
              progress: Progress = SILENT) -> Iterator[dict[str, Any]]:
    """Describe the file at ``path`` as a stream of dicts (one per batch, index entry,
    checkpoint entry or producer of a snapshot). ``deep`` lists the records of every batch
    (compressed ones decompressed); ``print_data`` adds keys, values and headers (text when
    printable, else hex).

    Raises:
        LogstoreError: a file kind the tool does not know.
    """
    name = os.path.basename(path)
    if name.endswith(LOG_SUFFIX):
        yield from _dump_log(path, print_data=print_data, deep=deep or print_data, progress=progress)
    elif name.endswith(INDEX_SUFFIX):
        for i, (offset, position) in enumerate(_index_entries(path)):
            yield {"kind": "index", "slot": i, "offset": offset, "position": position}
    elif name.endswith(TIMEINDEX_SUFFIX):
        for i, (timestamp, offset) in enumerate(_timeindex_entries(path)):
            yield {"kind": "timeindex", "slot": i, "timestamp": timestamp, "offset": offset}
    elif name in _OFFSET_CHECKPOINTS:
        for entry in CheckpointFile(path, 3).read():
            yield {"kind": "checkpoint", "topic": entry[0], "partition": int(entry[1]), "offset": int(entry[2])}
    elif name == LEADER_EPOCH_CHECKPOINT:
        for entry in CheckpointFile(path, 2).read():
            yield {"kind": "leader-epoch", "epoch": int(entry[0]), "start_offset": int(entry[1])}
    elif name.endswith(SNAPSHOT_SUFFIX):
        for e in ProducerStateTable.from_snapshot(_fileio.ops.read_file(path), path).entries():
            last = e.last_batch
            yield {"kind": "producer", "producer_id": e.producer_id, "epoch": e.epoch,
                   "first_sequence": -1 if last is None else last.first_sequence, "last_sequence": e.last_sequence,
                   "last_offset": -1 if last is None else last.last_offset,
                   "offset_delta": 0 if last is None else last.last_offset - last.first_offset,
                   "last_timestamp": e.last_timestamp}
    else:
        raise LogstoreError(f"{path}: not a segment (.log), index (.index, .timeindex), producer snapshot "
                            "(.snapshot) or checkpoint file")


def _batch_dict(position: int, h: BatchHeader) -> dict[str, Any]:
    attrs = h.attributes
    return {
        "kind": "batch", "position": position, "base_offset": h.base_offset, "last_offset": h.last_offset,
        "count": h.records_count, "size": h.size, "crc": h.crc, "crc_valid": True,
        "codec": compression.codec_name(attrs & lib.LS_ATTR_COMPRESSION_MASK),
        "timestamp_type": "LogAppendTime" if attrs & lib.LS_ATTR_TIMESTAMP_TYPE else "CreateTime",
        "base_timestamp": h.base_timestamp, "max_timestamp": h.max_timestamp,
        "producer_id": h.producer_id, "producer_epoch": h.producer_epoch, "base_sequence": h.base_sequence,
        "partition_leader_epoch": h.partition_leader_epoch,
        "is_transactional": bool(attrs & lib.LS_ATTR_TRANSACTIONAL), "is_control": bool(attrs & lib.LS_ATTR_CONTROL),
        "delete_horizon": bool(attrs & lib.LS_ATTR_DELETE_HORIZON),
    }


def _dump_log(path: str, *, print_data: bool, deep: bool, progress: Progress) -> Iterator[dict[str, Any]]:
    data = _fileio.ops.map_file(path)
    decoder = RecordDecoder()
    position = 0
    progress.start(os.path.basename(path), len(data))
    try:
        while position < len(data):
            try:
                header = validate_batch(data, position, path=path)
            except CorruptRecordError as exc:
                zero = data[position:].count(0) == len(data) - position
                yield {"kind": "zero-tail" if zero else "invalid", "position": position,
                       "bytes": len(data) - position, **({} if zero else {"error": exc.reason})}
                return
            batch = _batch_dict(position, header)
            if deep:
                records, _ = decoder.decode(data, position, position + header.size, path=path)
                batch["records"] = [_record_dict(r, print_data) for r in records]
            yield batch
            position += header.size
            progress.advance(header.size)
    finally:
        progress.finish()
        if isinstance(data, mmap.mmap):
            data.close()


def _record_dict(r: Any, print_data: bool) -> dict[str, Any]:
    out = {"offset": r.offset, "timestamp": r.timestamp,
           "key_size": -1 if r.key is None else len(r.key),
           "value_size": -1 if r.value is None else len(r.value), "headers": len(r.headers)}
    if print_data:
        out["key"] = _text(r.key)
        out["value"] = _text(r.value)
        out["header_list"] = [{"key": k, "value": _text(v)} for k, v in r.headers]
    return out


def _index_entries(path: str) -> list[tuple[int, int]]:
    """(absolute offset, position) of each entry before the zero tail of a preallocated index."""
    base, data, out = _base_offset(path), _fileio.ops.read_file(path), []
    for i in range(len(data) // _INDEX_ENTRY.size):
        relative, position = _INDEX_ENTRY.unpack_from(data, i * _INDEX_ENTRY.size)
        if relative == 0 and position == 0:
            break
        out.append((base + relative, position))
    return out


def _timeindex_entries(path: str) -> list[tuple[int, int]]:
    """(timestamp, absolute offset) of each entry before the zero tail."""
    base, data, out = _base_offset(path), _fileio.ops.read_file(path), []
    for i in range(len(data) // _TIMEINDEX_ENTRY.size):
        timestamp, relative = _TIMEINDEX_ENTRY.unpack_from(data, i * _TIMEINDEX_ENTRY.size)
        if timestamp == 0 and relative == 0 and i > 0:
            break
        out.append((timestamp, base + relative))
    return out


# ---------------------------------------------------------------------- verify
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


def verify(path: str, progress: Progress = SILENT) -> VerifyReport:
    """Scrub ``path``: a store root, a Kafka log directory (every subdirectory holding
    segments, skipped ones included), a partition directory or one ``.log`` file.

    Raises:
        LogstoreError: ``path`` is none of those.
    """
    report = VerifyReport()
    path = os.path.abspath(path)
    ops = _fileio.ops
    if os.path.isfile(path) and path.endswith(LOG_SUFFIX):
        _verify_segment(path, _base_offset(path), -1, True, report, progress)
        return report
    if not os.path.isdir(path):
        raise LogstoreError(f"{path}: not a store, a partition directory or a .log file")
    if ops.exists(os.path.join(path, TOPICS_DIR)) or (not _is_partition_dir(path) and looks_like_log_dir(path)):
        dirs = [os.path.join(path, name) for name in sorted(ops.listdir(path))
                if os.path.isdir(os.path.join(path, name)) and _is_partition_dir(os.path.join(path, name))]
        for name in _OFFSET_CHECKPOINTS:
            checkpoint = os.path.join(path, name)
            try:
                CheckpointFile(checkpoint, 3).read()
            except CorruptCheckpointError as exc:
                report.problems.append(Problem(checkpoint, str(exc)))
    elif _is_partition_dir(path):
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
    return report


def _is_partition_dir(path: str) -> bool:
    return any(name.endswith(LOG_SUFFIX) and parse_segment_name(name) for name in _fileio.ops.listdir(path))


def _verify_partition(directory: str, report: VerifyReport, progress: Progress) -> None:
    report.partitions += 1
    bases = sorted(parsed[0] for name in _fileio.ops.listdir(directory)
                   if (parsed := parse_segment_name(name)) and parsed[1] == LOG_SUFFIX)
    previous_last = -1
    for i, base in enumerate(bases):
        path = os.path.join(directory, segment_name(base) + LOG_SUFFIX)
        last = _verify_segment(path, base, previous_last, i == len(bases) - 1, report, progress)
        if last >= 0:
            previous_last = last
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


def _verify_segment(path: str, base: int, previous_last: int, last_segment: bool, report: VerifyReport,
                    progress: Progress) -> int:
    """Check one segment and its indexes; return its last offset (-1 when it has no batch)."""
    report.segments += 1
    data = _fileio.ops.map_file(path)
    decoder = RecordDecoder()
    batches: dict[int, BatchHeader] = {}
    max_ts_at: list[tuple[int, int]] = []  # (last offset, largest timestamp so far)
    largest_ts = -(2**63)
    position = 0
    last = -1
    try:
        while position < len(data):
            try:
                header = validate_batch(data, position, path=path)
                records, _ = decoder.decode(data, position, position + header.size, path=path)
            except CorruptRecordError as exc:
                rest = len(data) - position
                if not (last_segment and data[position:].count(0) == rest):  # the active segment's zero tail
                    report.problems.append(Problem(path, f"invalid batch ({exc.reason}); {rest} bytes from here "
                                                         "are unreadable", position, last + 1 if last >= 0 else None))
                break
            if header.base_offset <= max(previous_last, last):
                report.problems.append(Problem(path, f"offsets go backwards: batch {header.base_offset}.."
                                                     f"{header.last_offset} after {max(previous_last, last)}",
                                               position, header.base_offset))
            if header.base_offset < base:
                report.problems.append(Problem(path, f"batch offset {header.base_offset} is below the segment's "
                                                     f"base offset {base}", position, header.base_offset))
            batches[position] = header
            last = header.last_offset
            largest_ts = max(largest_ts, header.max_timestamp)
            max_ts_at.append((last, largest_ts))
            report.batches += 1
            report.records += len(records)
            report.bytes += header.size
            position += header.size
            progress.advance(header.size)
    finally:
        if isinstance(data, mmap.mmap):
            data.close()
    _verify_indexes(path, base, batches, max_ts_at, report)
    return last


def _verify_indexes(path: str, base: int, batches: dict[int, BatchHeader], max_ts_at: list[tuple[int, int]],
                    report: VerifyReport) -> None:
    stem = path[: -len(LOG_SUFFIX)]
    index, timeindex = stem + INDEX_SUFFIX, stem + TIMEINDEX_SUFFIX
    if _fileio.ops.exists(index):
        previous = (-1, -1)
        for offset, position in _index_entries(index):
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
        entries = _timeindex_entries(timeindex)
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


# ---------------------------------------------------------------------- stats
@dataclass
class PartitionStats:
    """What :func:`stats` reports for one partition."""

    topic: str
    partition: int
    log_start_offset: int
    log_end_offset: int
    segments: int
    bytes: int
    batches: int
    records: int
    #: uncompressed record bytes / stored record bytes (1.0 when nothing is compressed)
    compression_ratio: float
    #: compacted topics: bytes of sealed segments not yet cleaned / all sealed bytes (else None)
    dirty_ratio: float | None
    #: consumer group -> committed offset lag (log end - committed)
    group_lag: dict[str, int] = field(default_factory=dict)


def stats(path: str, progress: Progress = SILENT) -> list[PartitionStats]:
    """Per-partition figures of ``path``: a store (internal topics included), a Kafka log
    directory (its partition directories adopted in memory, as :class:`StoreView` does) or a
    single partition directory. Writes nothing.

    A partition directory is keyed as :class:`~logstore.log.log.Log` keys it: ``<topic>-<n>``, or
    the whole name with partition -1; the checkpoints, topic settings and consumer offsets of
    its parent directory apply when the parent is a store or a Kafka log directory.

    Raises:
        LogstoreError: ``path`` is none of those.
    """
    path = os.path.abspath(path)
    if os.path.isdir(path) and _is_partition_dir(path):
        topic, partition = partition_key(path)
        parent = os.path.dirname(path)
        view: StoreView | None = None
        if _fileio.ops.exists(os.path.join(parent, TOPICS_DIR)) or looks_like_log_dir(parent, files_only=True):
            view = StoreView(parent, quiet=True)  # a store or a Kafka log dir: its settings and groups apply
        parts = [PartitionView(parent, topic, partition, path=path)]
        log_dir = parent
    else:
        view = StoreView(path)
        log_dir = path
        parts = [view.partition(t, p) for t in view.topics(internal=True) for p in range(view.partitions(t))]
    lags = _group_offsets(view) if view is not None else {}
    total = sum(_fileio.ops.size(pv._file(b, LOG_SUFFIX)) for pv in parts for b in pv.segments())
    progress.start(f"stats {os.path.basename(path)}", total)
    out = []
    try:
        try:
            cleaner = OffsetCheckpoints(log_dir, CLEANER_OFFSET_CHECKPOINT).read()
        except CorruptCheckpointError:
            cleaner = {}  # a hint for the dirty ratio only
        for pv in parts:
            out.append(_partition_stats(pv, _is_compacted(view, pv.topic), cleaner, lags, progress))
    finally:
        progress.finish()
    return out


def partition_key(path: str) -> tuple[str, int]:
    """(topic, partition) of a partition directory, as :class:`~logstore.log.log.Log` keys it:
    ``<topic>-<n>``, or the whole directory name with partition -1."""
    name = os.path.basename(os.path.normpath(path))
    m = re.match(r"^(.+)-(\d+)$", name)
    return (m.group(1), int(m.group(2))) if m else (name, -1)


def _partition_stats(view: PartitionView, compacted: bool, cleaner: dict[tuple[str, int], int],
                     lags: dict[tuple[str, int], dict[str, int]], progress: Progress) -> PartitionStats:
    segments = view.segments()
    end = view.log_end_offset(segments)
    start = view.log_start_offset(segments)
    stored = uncompressed = batches = records = size = 0
    sealed_sizes: list[tuple[int, int]] = []  # (next offset, bytes) of sealed segments
    for i, base in enumerate(segments):
        data = _fileio.ops.map_file(view._file(base, LOG_SUFFIX))
        position = seg_bytes = 0
        try:
            while position + HEADER_SIZE <= len(data):
                try:
                    header = validate_batch(data, position)
                except CorruptRecordError:
                    break
                body = header.size - HEADER_SIZE
                codec = header.attributes & lib.LS_ATTR_COMPRESSION_MASK
                stored += body
                if codec:
                    section = memoryview(data)[position + HEADER_SIZE: position + header.size]
                    try:
                        uncompressed += len(compression.decompress(codec, section, 1 << 30))
                    finally:
                        section.release()
                else:
                    uncompressed += body
                batches += 1
                records += header.records_count
                seg_bytes += header.size
                position += header.size
                progress.advance(header.size)
        finally:
            if isinstance(data, mmap.mmap):
                data.close()
        size += seg_bytes
        if i < len(segments) - 1:
            sealed_sizes.append((segments[i + 1], seg_bytes))
    dirty = None
    key = (view.topic, view.partition)
    if compacted:
        first_dirty = max(cleaner.get(key, 0), start)
        sealed = sum(b for _, b in sealed_sizes)
        dirty = sum(b for nxt, b in sealed_sizes if nxt > first_dirty) / sealed if sealed else 0.0
    return PartitionStats(view.topic, view.partition, start, end, len(segments), size, batches, records,
                          uncompressed / stored if stored else 1.0, dirty,
                          {group: max(0, end - offset) for group, offset in sorted(lags.get(key, {}).items())})


def _is_compacted(view: StoreView | None, topic: str) -> bool:
    if topic == OFFSETS_TOPIC:
        return True
    try:
        policy = view.overrides(topic).get("cleanup.policy", "") if view is not None else ""
    except LogstoreError:
        policy = ""  # a partition directory whose topic the parent does not know
    return "compact" in policy


def _group_offsets(view: StoreView) -> dict[tuple[str, int], dict[str, int]]:
    """{(topic, partition): {group: committed offset}} from ``__consumer_offsets``."""
    out: dict[tuple[str, int], dict[str, int]] = {}
    if OFFSETS_TOPIC not in view.topics(internal=True):
        return out
    for p in range(view.partitions(OFFSETS_TOPIC)):
        pv = view.partition(OFFSETS_TOPIC, p)
        latest: dict[tuple[str, str, int], int | None] = {}

        def sink(buf: Any, rows: Any, n: int) -> None:
            for i in range(n):
                kl, vl = rows.key_len[i], rows.value_len[i]
                if kl < 0:
                    continue
                key = decode_offset_key(bytes(buf[rows.key_pos[i]: rows.key_pos[i] + kl]))
                if key is None:
                    continue
                if vl < 0:
                    latest[key] = None
                else:
                    latest[key] = decode_offset_value(bytes(buf[rows.value_pos[i]: rows.value_pos[i] + vl]))[0]

        end = pv.log_end_offset()
        start = pv.log_start_offset()
        for _ in pv.scan(start, end, sink):
            pass
        for (group, topic, partition), offset in latest.items():
            if offset is not None:
                out.setdefault((topic, partition), {})[group] = offset
    return out
