"""Planning a Spark read on the driver: options and pushed filters into OffsetRange input partitions.

The driver plans from segment file names, sparse index entries and the batch headers after the
last index entry (:mod:`logstore.store.views`); no record is read there. Each input partition is a
picklable :class:`OffsetRange` that an executor reads with :func:`logstore.spark.read.read_range`.

A tiered partition (tiered storage, KIP-405) keeps its older offsets only in the object store:
the planner cuts them into remote ranges (one per remote segment, neighbours together up to
:data:`REMOTE_RANGE_BYTES`, a larger segment cut at its remote offset index's entries), from the
remote segments' metadata in ``__remote_log_metadata`` (:meth:`StoreView.remote_tier
<logstore.store.views.StoreView.remote_tier>`), pruned as local ranges are (offsets, and a
timestamp lower bound by each segment's newest timestamp); each executor reads its remote range
from the object store itself. A range is local, remote, or (only where a timestamp search must
not be cut) remote below ``local_from`` and local from there; the rest of planning and reading is
the same for all.

Thread-safety: Spark creates a Planner per query; nothing is shared.
"""

from __future__ import annotations

import math
import os
from bisect import bisect_left
from dataclasses import dataclass, field, replace
from typing import Any, Iterator

from pyspark.sql.datasource import (
    EqualTo,
    Filter,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    InputPartition,
    IsNotNull,
    LessThan,
    LessThanOrEqual,
)
from pyspark.sql.types import StructType

from ..store.views import DataLossError, LogEnd, PartitionView, StoreView
from ..tiered.metadata import RemoteLogSegmentMetadata
from .options import (
    EARLIEST,
    LATEST,
    NEVER_NULL,
    READ_OPTION_PREFIXES,
    READ_OPTIONS,
    SparkOptionError,
    bool_option,
    int_option,
    parse_options,
    per_partition,
    reader_option,
    schema_struct,
    timestamp_ms,
    topic_partitions,
)

__all__ = ["schema_columns", "OffsetRange", "Planner", "REMOTE_RANGE_BYTES"]

#: the bytes of remote segments one input partition reads at most, unless one segment is more
#: and has no offset index entry to cut it at (as Spark's spark.sql.files.maxPartitionBytes)
REMOTE_RANGE_BYTES = 128 << 20


@dataclass(frozen=True)
class OffsetRange(InputPartition):
    """One input partition: the records ``start <= offset < end`` of ``topic-partition`` in the
    store at ``root``. ``segment``/``position`` say where to start reading (from the offset
    index); ``find_start_ts`` / ``find_end_ts`` make the reader begin at / stop before the first
    record whose timestamp is at least that (the range covers where it must be)."""

    root: str
    topic: str
    partition: int
    start: int
    end: int
    segment: int = -1
    position: int = 0
    find_start_ts: int | None = None
    find_end_ts: int | None = None
    fail_on_data_loss: bool = True
    include_headers: bool = False
    #: the columns to build, in the schema's order (empty: the source's, by include_headers)
    columns: tuple[str, ...] = ()
    #: when ``end`` is the log end: its segment and the byte position after its last batch,
    #: past which the reader never looks (-1: the range ends before the log end)
    stop_segment: int = -1
    stop_position: int = 0
    #: leave out the records of aborted transactions (``kafka.isolation.level=read_committed``;
    #: the range already ends at or below the last stable offset)
    read_committed: bool = False
    #: tiered storage: the offsets below ``local_from`` are read from these remote segments
    #: (ascending; offsets none of them holds were pruned), the rest from the local segments
    #: (-1: the whole range is local)
    local_from: int = -1
    remote_segments: tuple[RemoteLogSegmentMetadata, ...] = ()
    #: the object store of the remote segments (URL) and its options (out of the repr: they
    #: may hold credentials)
    remote_storage: str | None = None
    remote_options: tuple[tuple[str, str], ...] = field(default=(), repr=False)

    def stopping_at(self, log_end: LogEnd) -> "OffsetRange":
        """This range, told where the log ended when it was planned (see stop_segment)."""
        if self.end != log_end.offset or log_end.segment < 0:
            return self
        return replace(self, stop_segment=log_end.segment, stop_position=log_end.position)


def schema_columns(schema: StructType | None, include_headers: bool) -> tuple[str, ...]:
    """The columns a read builds: the source's schema, or the columns a user-specified schema
    names (``spark.read.format("logstore").schema("value binary")``), each with the source's
    type for it, in any order. pyspark's Python data source API does not tell a source which
    columns a query uses, so a schema is how a query that needs few of them says so: the others
    are neither built nor handed to the JVM.

    Raises:
        SparkOptionError: a field the source does not have, of another type, or named twice.
    """
    full = schema_struct(include_headers)
    if schema is None or schema == full:
        return tuple(full.fieldNames())
    known = {f.name: f.dataType for f in schema_struct(True).fields}
    names = [f.name for f in schema.fields]
    wrong = [f.simpleString() for f in schema.fields if known.get(f.name) != f.dataType]
    if wrong or not names or len(set(names)) != len(names):
        raise SparkOptionError(
            f"a user-specified schema must name columns of the logstore source's schema "
            f"{schema_struct(True).simpleString()} with their types, each once; "
            f"got {schema.simpleString()}" + (f" ({', '.join(wrong)} not in the source's schema)" if wrong else ""))
    return tuple(names)


class Planner:
    """Turns options (and pushed filters) into OffsetRanges, on the driver."""

    def __init__(self, options: Any, schema: StructType, streaming: bool) -> None:
        self.opts = parse_options(options, READ_OPTIONS, READ_OPTION_PREFIXES)
        self.root = os.path.abspath(self.opts["path"])
        #: the object store of tiered topics' remote segments (None: the one the store remembers)
        self.remote_storage = self.opts.get("remotestorage")
        self.remote_options = {k[len("remotestorage."):]: v for k, v in self.opts.items()
                               if k.startswith("remotestorage.")}
        self.store = StoreView(self.root, remote_storage=self.remote_storage,
                               remote_storage_options=self.remote_options)
        self.streaming = streaming
        reader_option(self.opts)
        self.partitions = topic_partitions(self.opts, self.store)
        self.include_headers = bool_option(self.opts, "includeheaders", False)
        self.fail_on_data_loss = bool_option(self.opts, "failondataloss", True)
        self.min_partitions = int_option(self.opts, "minpartitions", 1)
        self.max_records = int_option(self.opts, "maxrecordsperpartition", 1)
        self.max_per_trigger = int_option(self.opts, "maxoffsetspertrigger", 1)
        if self.max_per_trigger is not None and not streaming:
            raise SparkOptionError("option 'maxOffsetsPerTrigger' applies to streaming queries only")
        self.start_ts = int_option(self.opts, "startingtimestamp", -(2**63))
        self.end_ts = int_option(self.opts, "endingtimestamp", -(2**63))
        if streaming and self.end_ts is not None:
            raise SparkOptionError("option 'endingTimestamp' applies to batch queries only")
        if streaming and "endingoffsets" in self.opts:
            raise SparkOptionError("option 'endingOffsets' applies to batch queries only")
        self.starting = per_partition(self.opts, "startingoffsets", self.partitions,
                                       LATEST if streaming else EARLIEST,
                                       ("earliest", "latest") if streaming else ("earliest",))
        self.ending = per_partition(self.opts, "endingoffsets", self.partitions, LATEST, ("latest",))
        #: the columns the reader builds, in the order of the schema Spark expects
        self.columns = schema_columns(schema, self.include_headers)
        self.prune = bool_option(self.opts, "pruneonpushdown", False)
        isolation = self.opts.get("kafka.isolation.level", "read_uncommitted").strip().lower()
        if isolation not in ("read_uncommitted", "read_committed"):
            raise SparkOptionError(f"option 'kafka.isolation.level' must be read_uncommitted or read_committed, "
                                   f"not {isolation!r}")
        #: read_committed: ranges end at the last stable offset and leave aborted records out
        self.read_committed = isolation == "read_committed"
        self.reset_filters()

    def visible_end(self, topic: str, partition: int) -> int:
        """Where this query's view of a partition ends now: its high watermark, or its last
        stable offset with read_committed."""
        view = self.store.partition(topic, partition)
        segments = view.segments()
        log_end = view.log_end(segments)
        high = view.high_watermark(segments, log_end)
        return min(high, view.last_stable_offset(segments, log_end)) if self.read_committed else high

    def reset_filters(self) -> None:
        """Forget pushed filters (exact ones narrow these; timestamp_low only prunes)."""
        self.only_topics: set[str] | None = None
        self.only_partitions: set[int] | None = None
        self.offset_low = 0
        self.offset_high = 2**63 - 1
        self.timestamp_low: int | None = None

    # ------------------------------------------------------------------ filters
    def push(self, filters: list[Filter]) -> Iterator[Filter]:
        """Apply what can be applied; yield the filters Spark must still evaluate."""
        self.reset_filters()
        for f in filters:
            attribute: tuple[str, ...] = getattr(f, "attribute", ())
            column = attribute[0] if len(attribute) == 1 else None
            if isinstance(f, IsNotNull) and column in NEVER_NULL:
                continue  # always true
            if not hasattr(f, "value"):
                yield f
                continue
            if column == "topic" and self._push_set(f, str, "only_topics"):
                continue
            if column == "partition" and self._push_set(f, int, "only_partitions"):
                continue
            if column == "offset" and self._push_offset(f):
                continue
            if column == "timestamp":
                self._push_timestamp(f)
            yield f

    def _push_set(self, f: Filter, kind: type, attr: str) -> bool:
        if isinstance(f, EqualTo) and isinstance(f.value, kind):
            values = {f.value}
        elif isinstance(f, In) and all(isinstance(v, kind) for v in f.value):
            values = set(f.value)
        elif kind is int and isinstance(f, (GreaterThan, GreaterThanOrEqual, LessThan, LessThanOrEqual)) \
                and isinstance(f.value, int):
            v = f.value
            test = {GreaterThan: lambda p: p > v, GreaterThanOrEqual: lambda p: p >= v,
                    LessThan: lambda p: p < v, LessThanOrEqual: lambda p: p <= v}[type(f)]
            values = {p for _, p in self.partitions if test(p)}
        else:
            return False
        current = getattr(self, attr)
        setattr(self, attr, values if current is None else current & values)
        return True

    def _push_offset(self, f: Filter) -> bool:
        v: Any = getattr(f, "value", None)
        if isinstance(f, In):
            if v and all(isinstance(x, int) and not isinstance(x, bool) for x in v):
                self.offset_low = max(self.offset_low, min(v))
                self.offset_high = min(self.offset_high, max(v) + 1)
            return False  # the range is a superset: Spark keeps the IN
        if not isinstance(v, int) or isinstance(v, bool):
            return False
        if isinstance(f, EqualTo):
            self.offset_low, self.offset_high = max(self.offset_low, v), min(self.offset_high, v + 1)
        elif isinstance(f, GreaterThan):
            self.offset_low = max(self.offset_low, v + 1)
        elif isinstance(f, GreaterThanOrEqual):
            self.offset_low = max(self.offset_low, v)
        elif isinstance(f, LessThan):
            self.offset_high = min(self.offset_high, v)
        elif isinstance(f, LessThanOrEqual):
            self.offset_high = min(self.offset_high, v + 1)
        else:
            return False
        return True

    def _push_timestamp(self, f: Filter) -> None:
        ms = timestamp_ms(getattr(f, "value", None))
        if ms is None:
            return
        if isinstance(f, (GreaterThan, GreaterThanOrEqual, EqualTo)):
            self.timestamp_low = ms if self.timestamp_low is None else max(self.timestamp_low, ms)

    # ------------------------------------------------------------------ planning
    def selected(self) -> list[tuple[str, int]]:
        return [(t, p) for t, p in self.partitions
                if (self.only_topics is None or t in self.only_topics)
                and (self.only_partitions is None or p in self.only_partitions)]

    def bounds(self, tp: tuple[str, int], start: int | None = None) -> OffsetRange | None:
        """The whole range of one partition for this query (before splitting), or None."""
        topic, p = tp
        view = self.store.partition(topic, p)
        segments = view.segments()
        log_start = view.log_start_offset(segments)
        log_end = view.log_end(segments)
        high = view.high_watermark(segments, log_end)
        if self.read_committed:
            high = min(high, view.last_stable_offset(segments, log_end))
        find_start = find_end = None
        if start is None:
            wanted = self.starting[tp]
            start = log_start if wanted == EARLIEST else high if wanted == LATEST else wanted
            if self.start_ts is not None and not self.streaming:
                low, bound = view.timestamp_bounds(self.start_ts, segments)
                # (a segment's first offset may lie below the log start: a DeleteRecords inside it)
                start, find_start = max(low, log_start), self.start_ts
        if start > high:
            raise SparkOptionError(f"starting offset {start} of {topic}-{p} is past its end ({high})")
        if start < log_start:
            if self.fail_on_data_loss:
                raise DataLossError(f"{topic}-{p}: starting offset {start} is below the log start "
                                    f"{log_start} (deleted); set failOnDataLoss=false to skip to it")
            start = log_start
        wanted_end = self.ending[tp] if not self.streaming else LATEST
        end = high if wanted_end == LATEST else wanted_end
        if end > high:
            raise SparkOptionError(f"ending offset {end} of {topic}-{p} is past its end ({high})")
        if self.end_ts is not None:
            low, bound = view.timestamp_bounds(self.end_ts, segments)
            end, find_end = min(end, high if bound is None else bound + 1), self.end_ts
        if self.timestamp_low is not None and find_start is None:
            low, _ = view.timestamp_bounds(self.timestamp_low, segments)
            start = max(start, low)
        start = max(start, self.offset_low)
        end = min(end, self.offset_high)
        if end < start and wanted_end != LATEST and self.offset_high == 2**63 - 1 and self.end_ts is None:
            raise SparkOptionError(f"ending offset {end} of {topic}-{p} is before its starting offset {start}")
        if end <= start:
            return None
        r = OffsetRange(self.root, topic, p, start, end, find_start_ts=find_start, find_end_ts=find_end,
                        fail_on_data_loss=self.fail_on_data_loss, include_headers=self.include_headers,
                        columns=self.columns, read_committed=self.read_committed).stopping_at(log_end)
        return self.with_remote(r, view, segments)

    def with_remote(self, r: OffsetRange, view: PartitionView, segments: list[int]) -> OffsetRange:
        """``r`` told which of its offsets are in the remote tier (below the local segments) and
        which remote segments hold them, those whose records are all older than a pushed
        timestamp lower bound left out."""
        local = view.local_log_start_offset(segments)
        if view.remote is None or r.start >= local:
            return r
        upto = min(r.end, local)
        remote = view.remote.segments_in(r.start, upto)
        if not _covers(remote, r.start, upto):
            # Invariant: a segment leaves the local disk only once its copy is finished in the
            # metadata, so the two tiers hold every offset. A hole means the metadata was read
            # before a copy that the local listing, read after it, already shows: read it again.
            remote = self.store.partition(r.topic, r.partition).remote.segments_in(r.start, upto)  # type: ignore[union-attr]
            if not _covers(remote, r.start, upto):
                raise DataLossError(f"{r.topic}-{r.partition}: offsets from {r.start} to {upto - 1} are neither on "
                                    f"local disk nor all in the remote tier's metadata")
        if view.remote.url is None:
            raise SparkOptionError(f"{r.topic}-{r.partition}: offsets {r.start}..{upto - 1} are in a remote tier "
                                   f"the store at {self.root} does not name (no .remote-storage): give the option "
                                   f"remoteStorage (its URL) and remoteStorage.<name> options")
        if self.timestamp_low is not None:
            remote = [m for m in remote if m.max_timestamp_ms >= self.timestamp_low]
        return replace(r, local_from=local, remote_segments=tuple(remote), segment=-1, position=0,
                       remote_storage=view.remote.url, remote_options=tuple(sorted(view.remote.options.items())))

    def split(self, ranges: list[OffsetRange]) -> list[OffsetRange]:
        """Cut the remote part of each range from its local part and into pieces of about
        REMOTE_RANGE_BYTES of remote segments, then split ranges (maxRecordsPerPartition,
        minPartitions) at offset index entries."""
        ranges = [piece for r in ranges for piece in self._tiers(r)]
        counts = [r.end - r.start for r in ranges]
        pieces = [1] * len(ranges)
        if self.max_records is not None:
            pieces = [max(1, math.ceil(c / self.max_records)) for c in counts]
        total = sum(counts)
        if self.min_partitions is not None and sum(pieces) < self.min_partitions and total > 0:
            # Spread the missing pieces over the partitions in proportion to their size.
            for i, c in enumerate(counts):
                pieces[i] = max(pieces[i], math.ceil(self.min_partitions * c / total))
        out: list[OffsetRange] = []
        for r, n in zip(ranges, pieces):
            out.extend(self._split_one(r, n))
        return out

    # ------------------------------------------------------------------ tiered ranges
    def _tiers(self, r: OffsetRange) -> list[OffsetRange]:
        """``r`` cut where its local part begins and between its remote segments, each piece
        about REMOTE_RANGE_BYTES of them at most (a larger segment cut at its offset index's
        entries), wherever a timestamp search allows a cut."""
        if r.local_from < 0:
            return [r]
        cuts = [r.local_from]
        size = 0
        for m in r.remote_segments:
            if size and size + m.segment_size_in_bytes > REMOTE_RANGE_BYTES:
                cuts.append(m.start_offset)
                size = 0
            size += m.segment_size_in_bytes
            if m.segment_size_in_bytes > REMOTE_RANGE_BYTES:
                view = self.store.partition(r.topic, r.partition)
                mark = REMOTE_RANGE_BYTES
                for offset, position in view.remote.offset_index(m):  # type: ignore[union-attr]
                    if position >= mark:
                        cuts.append(offset)
                        mark = position + REMOTE_RANGE_BYTES
                cuts.append(m.end_offset + 1)
                size = 0
        return self._cut(r, cuts)

    def _cut(self, r: OffsetRange, cuts: list[int]) -> list[OffsetRange]:
        """``r`` in pieces starting at each offset of ``cuts`` strictly inside it where a
        timestamp search allows (never inside the offsets where one runs)."""
        allowed = self._cuttable(r)
        points = sorted({c for c in cuts if r.start < c < r.end and allowed(c)})
        out = []
        for a, b in zip([r.start, *points], [*points, r.end]):
            remote = a < r.local_from
            out.append(replace(
                r, start=a, end=b, find_start_ts=r.find_start_ts if a == r.start else None,
                find_end_ts=r.find_end_ts if b == r.end else None,
                segment=r.segment if a == r.start else -1, position=r.position if a == r.start else 0,
                stop_segment=r.stop_segment if b == r.end else -1, stop_position=r.stop_position if b == r.end else 0,
                local_from=r.local_from if remote else -1,
                remote_segments=tuple(m for m in r.remote_segments if m.end_offset >= a and m.start_offset < b)
                if remote else ()))
        return out

    def _cuttable(self, r: OffsetRange) -> Any:
        """Where ``r`` may be cut: above the offsets where its starting timestamp's record may
        be, at or below the first where its ending timestamp's may be."""
        if r.find_start_ts is None and r.find_end_ts is None:
            return lambda c: True
        view = self.store.partition(r.topic, r.partition)
        floor, ceiling = r.start, r.end
        if r.find_start_ts is not None:
            _, bound = view.timestamp_bounds(r.find_start_ts)
            floor = r.end if bound is None else bound + 1
        if r.find_end_ts is not None:
            ceiling, _ = view.timestamp_bounds(r.find_end_ts)
        return lambda c: floor <= c <= ceiling

    def _split_remote(self, r: OffsetRange, pieces: int) -> list[OffsetRange]:
        """A range with a remote part in about ``pieces`` pieces of equal offsets, cut at its
        remote segments' starts and, when they are too few, their offset index entries."""
        points = [m.start_offset for m in r.remote_segments] + [r.local_from]
        if len([p for p in points if r.start < p < r.end]) < pieces - 1:
            view = self.store.partition(r.topic, r.partition)
            for m in r.remote_segments:
                points.extend(offset for offset, _ in view.remote.offset_index(m))  # type: ignore[union-attr]
        offsets = sorted({p for p in points if r.start < p < r.end})
        if not offsets:
            return [r]
        step = (r.end - r.start) / pieces
        cuts = {offsets[min(bisect_left(offsets, r.start + k * step), len(offsets) - 1)] for k in range(1, pieces)}
        return self._cut(r, sorted(cuts))

    def _split_one(self, r: OffsetRange, pieces: int) -> list[OffsetRange]:
        if r.local_from >= 0:
            return self._split_remote(r, pieces) if pieces > 1 else [r]
        view = self.store.partition(r.topic, r.partition)
        segments = view.segments()
        first = view.seek(r.start, segments)
        head = replace(r, segment=first.segment, position=first.position)
        if pieces <= 1:
            return [head]
        # Boundaries at index entries (a read may start there without decoding what precedes),
        # never inside the region where a timestamp search runs.
        floor = r.start
        if r.find_start_ts is not None:
            _, bound = view.timestamp_bounds(r.find_start_ts, segments)
            if bound is None:
                return [head]
            floor = bound + 1
        points = [(o, s, p) for o, s, p in view.index_positions(segments) if floor < o < r.end]
        if r.find_end_ts is not None:
            low, _ = view.timestamp_bounds(r.find_end_ts, segments)
            points = [pt for pt in points if pt[0] <= low]
        if not points:
            return [head]
        offsets = [o for o, _, _ in points]
        cuts: list[tuple[int, int, int]] = []
        step = (r.end - r.start) / pieces
        for k in range(1, pieces):
            i = bisect_left(offsets, r.start + k * step)
            i = min(i, len(points) - 1)
            if not cuts or points[i][0] > cuts[-1][0]:
                cuts.append(points[i])
        out = []
        begin = head
        for offset, segment, position in cuts:
            out.append(replace(begin, end=offset, find_end_ts=None))
            begin = replace(r, start=offset, segment=segment, position=position, find_start_ts=None)
        out.append(begin)
        return [x for x in out if x.end > x.start]


def _covers(segments: list[RemoteLogSegmentMetadata], start: int, end: int) -> bool:
    """Whether ``segments`` (ascending) hold every offset of [start, end)."""
    for m in segments:
        if m.start_offset > start:
            return False
        start = max(start, m.end_offset + 1)
    return start >= end
