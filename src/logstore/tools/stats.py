"""``logstore stats``: per partition, offsets, segments, bytes, records, compression and lag.

:func:`stats` reports, for every partition of a store (internal topics included), of a Kafka log
directory or of one partition directory: the log start and end offsets, segments, bytes,
batches and records (each segment's valid batches, from the one walk
:class:`~logstore.log.segmentscan.BatchWalk`), the compression ratio, the dirty ratio of a
compacted topic, the lag of every consumer group that committed offsets in
``__consumer_offsets``, and for a tiered partition (tiered storage) its remote segments and
bytes (from ``__remote_log_metadata``; the object store is not asked), its local log start and
the bytes of sealed local segments waiting to be copied.

Everything here only reads (files are mapped read-only through ``_fileio``; nothing is locked,
repaired or created), so it may run on a store in use, on a copy, or on segments written by
Apache Kafka. Thread-safety: the functions share no state; call them from any thread.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field


from .. import _fileio
from .._native import lib
from ..checkpoint import CLEANER_OFFSET_CHECKPOINT, CorruptCheckpointError, OffsetCheckpoints
from ..errors import LogstoreError
from ..groups.offsets import OFFSETS_TOPIC, OffsetsReplay
from ..log.segmentscan import BatchWalk
from ..records import compression
from ..records.batch import HEADER_SIZE
from ..store.kafkadirs import looks_like_log_dir
from ..store.layout import TOPICS_DIR
from ..store.views import PartitionView, StoreView
from .dump import is_partition_dir
from .progress import SILENT, Progress

__all__ = ["stats", "partition_key", "PartitionStats"]


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
    #: tiered storage (None for a partition without a remote tier): the first offset on local
    #: disk, the remote segments and their bytes, and the bytes of sealed local segments not
    #: yet copied (Kafka's RemoteCopyLagBytes, sealed segments only)
    local_log_start_offset: int | None = None
    remote_segments: int | None = None
    remote_bytes: int | None = None
    copy_lag_bytes: int | None = None


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
    if os.path.isdir(path) and is_partition_dir(path):
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
    total = sum(_fileio.ops.size(pv.segment_file(b)) for pv in parts for b in pv.segments())
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
        seg_bytes = 0
        with view.segment_data(base, segments) as data:
            for position, header in BatchWalk(data, base):
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
                progress.advance(header.size)
        size += seg_bytes
        if i < len(segments) - 1:
            sealed_sizes.append((segments[i + 1], seg_bytes))
    dirty = None
    key = (view.topic, view.partition)
    if compacted:
        first_dirty = max(cleaner.get(key, 0), start)
        sealed = sum(b for _, b in sealed_sizes)
        dirty = sum(b for nxt, b in sealed_sizes if nxt > first_dirty) / sealed if sealed else 0.0
    out = PartitionStats(view.topic, view.partition, start, end, len(segments), size, batches, records,
                         uncompressed / stored if stored else 1.0, dirty,
                         {group: max(0, end - offset) for group, offset in sorted(lags.get(key, {}).items())})
    if view.remote is not None:
        remote = view.remote
        copied = -1 if remote.end_offset is None else remote.end_offset
        out.local_log_start_offset = view.local_log_start_offset(segments)
        out.remote_segments = len(remote.segments)
        out.remote_bytes = remote.size_in_bytes
        out.copy_lag_bytes = sum(b for nxt, b in sealed_sizes if nxt - 1 > copied)
    return out


def _is_compacted(view: StoreView | None, topic: str) -> bool:
    if topic == OFFSETS_TOPIC:
        return True
    try:
        policy = view.overrides(topic).get("cleanup.policy", "") if view is not None else ""
    except LogstoreError:
        policy = ""  # a partition directory whose topic the parent does not know
    return "compact" in policy


def _group_offsets(view: StoreView) -> dict[tuple[str, int], dict[str, int]]:
    """{(topic, partition): {group: committed offset}} from ``__consumer_offsets``, as the
    store's consumers see them (:class:`~logstore.groups.offsets.OffsetsReplay`: transactional
    commits only once their COMMIT marker is there)."""
    out: dict[tuple[str, int], dict[str, int]] = {}
    if OFFSETS_TOPIC not in view.topics(internal=True):
        return out
    for p in range(view.partitions(OFFSETS_TOPIC)):
        pv = view.partition(OFFSETS_TOPIC, p)
        replay = OffsetsReplay()
        segments = pv.segments()
        start, end = pv.log_start_offset(segments), pv.log_end_offset(segments)
        for base in segments:
            with pv.segment_data(base, segments) as data:
                walk = BatchWalk(data, base)
                valid = 0
                for position, header in walk:
                    valid = position + header.size
                with memoryview(data) as whole, whole[:valid] as view:
                    replay.feed(view, start, end)
        for (group, topic, partition), (offset, _) in replay.offsets.items():
            out.setdefault((topic, partition), {})[group] = offset
    return out
