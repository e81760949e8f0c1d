"""``logstore dump``: the contents of one file of a store, for people, and the file readers the
other tools share.

:func:`dump_file` describes the batches and records of a ``.log`` file (like kafka-dump-log),
the entries of ``.index`` / ``.timeindex`` / ``.txnindex`` files, the producers of a
``.snapshot`` file, or the entries of a checkpoint file, as a stream of dicts that cli.py prints as text or JSON. A
segment's batches are those of the one walk of valid batches
(:class:`~logstore.log.segmentscan.BatchWalk`, the rule recovery applies); what follows them is
reported as a zero tail or an invalid batch with the reason.

Everything here only reads (files are mapped read-only through ``_fileio``; nothing is locked,
repaired or created), so it may run on a store in use, on a copy, or on segments written by
Apache Kafka. A ``.log`` is read through :class:`~logstore.store.views.SegmentBatches`: mapped
only up to the end of its valid batches, what follows them read with ``pread``, since a writer
that rolls or closes the segment meanwhile trims its zero tail, and touching a map past a file's
new end is a SIGBUS. Thread-safety: the functions share no state; call them from any thread.
"""

from __future__ import annotations

import os
import struct
from typing import Any, Iterator

from .. import _fileio
from .._native import lib
from ..checkpoint import (
    CLEANER_OFFSET_CHECKPOINT,
    LEADER_EPOCH_CHECKPOINT,
    LOG_START_OFFSET_CHECKPOINT,
    RECOVERY_POINT_CHECKPOINT,
    REPLICATION_OFFSET_CHECKPOINT,
    CheckpointFile,
)
from ..errors import LogstoreError
from ..log.filenames import SNAPSHOT_SUFFIX
from ..log.producerstate import ProducerStateTable
from ..records import compression
from ..records.batch import HEADER_SIZE, BatchHeader, RecordDecoder, batch_headers, parse_header
from ..log.filenames import INDEX_SUFFIX, LOG_SUFFIX, TIMEINDEX_SUFFIX, TXNINDEX_SUFFIX, parse_segment_name
from ..records.control import ControlType, read_control_record, marker_coordinator_epoch
from ..store.views import SegmentBatches, StoreView
from ..tiered.storage import object_key
from .progress import SILENT, Progress

__all__ = ["dump_file", "dump_remote", "text_or_hex", "index_entries", "timeindex_entries", "txnindex_entries", "segment_base_offset",
           "is_partition_dir", "OFFSET_CHECKPOINTS"]

#: The checkpoint files of (topic, partition, offset) lines.
OFFSET_CHECKPOINTS = (RECOVERY_POINT_CHECKPOINT, LOG_START_OFFSET_CHECKPOINT, CLEANER_OFFSET_CHECKPOINT,
                      REPLICATION_OFFSET_CHECKPOINT)
_INDEX_ENTRY = struct.Struct(">ii")
_TIMEINDEX_ENTRY = struct.Struct(">qi")
_TXNINDEX_ENTRY = struct.Struct(">hqqqq")


def _name_base_offset(path: str) -> int | None:
    parsed = parse_segment_name(os.path.basename(path))
    return parsed[0] if parsed else None


def segment_base_offset(path: str, data: Any = None) -> int:
    """The base offset of the segment file at ``path``: from its name, else (a copy renamed
    freely) the first batch's base offset in ``data`` (by default the file's first bytes), else 0."""
    base = _name_base_offset(path)
    if base is not None:
        return base
    if data is None:
        ops = _fileio.ops
        fd = ops.open(path, os.O_RDONLY)
        try:
            data = ops.pread(fd, HEADER_SIZE, 0)
        finally:
            ops.close(fd)
    return parse_header(data, 0).base_offset if len(data) >= HEADER_SIZE else 0


def is_partition_dir(path: str) -> bool:
    """True when the directory ``path`` holds a segment (``NNN.log``)."""
    return any(name.endswith(LOG_SUFFIX) and parse_segment_name(name) for name in _fileio.ops.listdir(path))


def text_or_hex(data: bytes | None) -> str | None:
    """A key or value for people: UTF-8 text when printable, else hex (None stays None)."""
    if data is None:
        return None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return data.hex()
    return text if text.isprintable() else data.hex()


def index_entries(path: str, base: int | None = None) -> list[tuple[int, int]]:
    """(absolute offset, position) of each entry of the ``.index`` file at ``path`` before the
    zero tail of a preallocated index, as written (not sanity-checked); relative offsets count
    from ``base``, by default the base offset the file's name gives (else 0)."""
    base = (_name_base_offset(path) or 0) if base is None else base
    data, out = _fileio.ops.read_file(path), []
    for i in range(len(data) // _INDEX_ENTRY.size):
        relative, position = _INDEX_ENTRY.unpack_from(data, i * _INDEX_ENTRY.size)
        if relative == 0 and position == 0:
            break
        out.append((base + relative, position))
    return out


def timeindex_entries(path: str, base: int | None = None) -> list[tuple[int, int]]:
    """(timestamp, absolute offset) of each entry of the ``.timeindex`` file at ``path`` before
    the zero tail, as written; relative offsets count from ``base`` (as :func:`index_entries`)."""
    base = (_name_base_offset(path) or 0) if base is None else base
    data, out = _fileio.ops.read_file(path), []
    for i in range(len(data) // _TIMEINDEX_ENTRY.size):
        timestamp, relative = _TIMEINDEX_ENTRY.unpack_from(data, i * _TIMEINDEX_ENTRY.size)
        if timestamp == 0 and relative == 0:  # the zero tail (slot 0 too, as ls_index_entries counts)
            break
        out.append((timestamp, base + relative))
    return out


def txnindex_entries(path: str) -> list[tuple[int, int, int, int, int]]:
    """(version, producer id, first offset, last offset, last stable offset) of each whole
    entry of the ``.txnindex`` file at ``path``, as written (not checked)."""
    data = _fileio.ops.read_file(path)
    return list(_TXNINDEX_ENTRY.iter_unpack(data[: len(data) - len(data) % _TXNINDEX_ENTRY.size]))


def dump_file(path: str, *, print_data: bool = False, deep: bool = False,
              progress: Progress = SILENT) -> Iterator[dict[str, Any]]:
    """Describe the file at ``path`` as a stream of dicts (one per batch, index entry,
    checkpoint entry or producer of a snapshot). ``deep`` lists the records of every batch
    (compressed ones decompressed); ``print_data`` adds keys, values and headers (text when
    printable, else hex). Reads only.

    Raises:
        LogstoreError: a file kind the tool does not know.
    """
    name = os.path.basename(path)
    if name.endswith(LOG_SUFFIX):
        yield from _dump_log(path, print_data=print_data, deep=deep or print_data, progress=progress)
    elif name.endswith(INDEX_SUFFIX):
        for i, (offset, position) in enumerate(index_entries(path)):
            yield {"kind": "index", "slot": i, "offset": offset, "position": position}
    elif name.endswith(TIMEINDEX_SUFFIX):
        for i, (timestamp, offset) in enumerate(timeindex_entries(path)):
            yield {"kind": "timeindex", "slot": i, "timestamp": timestamp, "offset": offset}
    elif name.endswith(TXNINDEX_SUFFIX):
        for i, (version, pid, first, last, lso) in enumerate(txnindex_entries(path)):
            yield {"kind": "txnindex", "slot": i, "version": version, "producer_id": pid, "first_offset": first,
                   "last_offset": last, "last_stable_offset": lso}
    elif name in OFFSET_CHECKPOINTS:
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
                   "last_timestamp": e.last_timestamp, "coordinator_epoch": e.coordinator_epoch,
                   "current_txn_first_offset": e.current_txn_first_offset}
    else:
        raise LogstoreError(f"{path}: not a segment (.log), index (.index, .timeindex, .txnindex), producer snapshot "
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


def _control_dict(data: Any, position: int, header: BatchHeader) -> dict[str, Any]:
    """What a control batch says: its control type (a transaction marker's coordinator epoch)."""
    try:
        kind, value = read_control_record(data, position, header.size)
    except LogstoreError as exc:
        return {"control_type": None, "control_error": str(exc)}
    try:
        name = ControlType(kind).name
    except ValueError:
        name = str(kind)
    out: dict[str, Any] = {"control_type": name}
    if kind in (ControlType.ABORT, ControlType.COMMIT):
        try:
            out["coordinator_epoch"] = marker_coordinator_epoch(value)
        except LogstoreError as exc:
            out["control_error"] = str(exc)
    return out


def _dump_log(path: str, *, print_data: bool, deep: bool, progress: Progress) -> Iterator[dict[str, Any]]:
    decoder = RecordDecoder()
    with SegmentBatches(path, segment_base_offset(path)) as segment:
        data = segment.data
        progress.start(os.path.basename(path), segment.size)
        try:
            for position, header in segment:
                batch = _batch_dict(position, header)
                if header.attributes & lib.LS_ATTR_CONTROL:
                    batch.update(_control_dict(data, position, header))
                if deep:
                    records, _ = decoder.decode(data, position, position + header.size, path=path)
                    batch["records"] = [_record_dict(r, print_data) for r in records]
                yield batch
                progress.advance(header.size)
            stop = segment.stop
            if stop.status != lib.LS_OK:  # (the file goes on past its valid batches)
                zero = stop.status == lib.LS_ERR_ZERO
                yield {"kind": "zero-tail" if zero else "invalid", "position": stop.position,
                       "bytes": segment.size - stop.position, **({} if zero else {"error": stop.reason})}
        finally:
            progress.finish()


def _record_dict(r: Any, print_data: bool) -> dict[str, Any]:
    out = {"offset": r.offset, "timestamp": r.timestamp,
           "key_size": -1 if r.key is None else len(r.key),
           "value_size": -1 if r.value is None else len(r.value), "headers": len(r.headers)}
    if print_data:
        out["key"] = text_or_hex(r.key)
        out["value"] = text_or_hex(r.value)
        out["header_list"] = [{"key": k, "value": text_or_hex(v)} for k, v in r.headers]
    return out


def dump_remote(partition_dir: str, *, print_data: bool = False, deep: bool = False,
                remote_storage: str | None = None, progress: Progress = SILENT) -> Iterator[dict[str, Any]]:
    """Describe the remote segments of a store's tiered partition (tiered storage), read from
    the object store (``remote_storage``, else the one the store remembers): one
    ``remote-segment`` dict per remote segment (its id, offsets, size, newest timestamp, leader
    epochs and state as ``__remote_log_metadata`` records them, and its objects' key), then its
    batches as :func:`dump_file` gives a ``.log``'s (positions within the remote segment),
    every batch CRC-checked. Reads only.

    Raises:
        LogstoreError: ``partition_dir`` is no partition directory of a store, or its topic has
            no remote tier.
        RemoteStorageError: the object store failed, or a batch fails its checks.
    """
    path = os.path.abspath(partition_dir)
    root, name = os.path.dirname(path), os.path.basename(path)
    topic, _, number = name.rpartition("-")
    if not topic or not number.isdigit():
        raise LogstoreError(f"{partition_dir}: not a partition directory (<topic>-<partition>)")
    tier = StoreView(root, remote_storage=remote_storage).remote_tier(topic, int(number))
    if tier is None:
        raise LogstoreError(f"{partition_dir}: topic {topic} has no remote tier (remote.storage.enable is off)")
    decoder = RecordDecoder()
    progress.start(f"{name} (remote)", tier.size_in_bytes)
    try:
        for metadata in tier.segments:
            yield {"kind": "remote-segment", "segment_id": str(metadata.segment_id.id),
                   "start_offset": metadata.start_offset, "end_offset": metadata.end_offset,
                   "size": metadata.segment_size_in_bytes, "max_timestamp": metadata.max_timestamp_ms,
                   "leader_epochs": dict(metadata.segment_leader_epochs), "state": metadata.state.name,
                   "txn_index_empty": metadata.txn_index_empty, "object": object_key(metadata, LOG_SUFFIX)}
            offset, position = metadata.start_offset, 0
            while offset <= metadata.end_offset:
                raw = tier.reader.read_batches(metadata, offset, 8 << 20)
                if not raw:
                    break
                for at, header in batch_headers(raw):
                    batch = _batch_dict(position + at, header)
                    if header.attributes & lib.LS_ATTR_CONTROL:
                        batch.update(_control_dict(raw, at, header))
                    if deep or print_data:
                        records, _ = decoder.decode(raw, at, at + header.size, path=metadata.describe())
                        batch["records"] = [_record_dict(r, print_data) for r in records]
                    yield batch
                    offset = header.last_offset + 1
                position += len(raw)
                progress.advance(len(raw))
    finally:
        progress.finish()
        tier.close()
