"""PySpark data source "logstore": Spark reads and writes a store's segment files directly.

::

    from logstore.spark import LogstoreDataSource
    spark.dataSource.register(LogstoreDataSource)
    df = (spark.read.format("logstore").option("path", "/data/store")
          .option("subscribe", "events").load())

(With the package installed, ``pyspark_logstore`` registers the source by itself: Spark looks
for top-level ``pyspark_*`` modules exposing ``DefaultSource``.)

The schema and options follow Spark's Kafka source, so that a query written for Kafka runs
against a store with ``format("logstore")`` and a ``path``:

=================== ===========================================================================
column              type
=================== ===========================================================================
key, value          binary (null for a null key; a null value is a tombstone)
topic               string
partition           int
offset              long
timestamp           timestamp (UTC; the record's CreateTime, or LogAppendTime)
timestampType       int (0 CreateTime, 1 LogAppendTime)
headers             array<struct<key:string,value:binary>>, with ``includeHeaders=true``
=================== ===========================================================================

Options: ``path`` (the store's root; required), exactly one of ``subscribe`` (topics, comma
separated), ``subscribePattern`` (a Java-style regular expression over topic names) or ``assign``
(JSON ``{"topic":[0,1]}``); ``startingOffsets`` / ``endingOffsets`` ("earliest", "latest" or JSON
``{"topic":{"0":23,"1":-2}}`` with -2 earliest and -1 latest); ``startingTimestamp`` /
``endingTimestamp`` (ms since the epoch: the range starts at / ends before the first record of
each partition whose timestamp is at least this, as Kafka's ListOffsets finds it);
``failOnDataLoss`` (default true: offsets below the log start are an error, else skipped);
``includeHeaders``; ``minPartitions`` and ``maxRecordsPerPartition`` (split large partitions
into offset ranges at sparse index entries); ``pruneOnPushdown`` (see below). Streaming reads
add ``maxOffsetsPerTrigger`` and honour ``Trigger.AvailableNow``. Writes take ``topic`` (or a
``topic`` column) and the columns ``value`` and optionally ``key`` (binary or string),
``partition``, ``headers`` and ``timestamp``. Unknown options and bad values raise
:class:`SparkOptionError`.

How it runs: the driver plans input partitions from segment file names, sparse index entries
and the batch headers after the last index entry (:mod:`logstore.logview`); no record is read
on the driver. Each input partition is a picklable :class:`OffsetRange`; the executor that
runs it maps the segment files read-only, decodes the batches with the C decoder (every batch's
CRC checked) and builds Arrow record batches straight from the decoded columns (keys and values
gathered by C into Arrow buffers). Executors therefore need the store's directory at the same
path (local mode, or a shared mount).

Filter pushdown: with ``spark.sql.python.filterPushdown.enabled`` and ``pruneOnPushdown=true``,
predicates on ``topic``, ``partition`` and ``offset`` are applied exactly by the planner, and a
lower bound on ``timestamp`` prunes through the time indexes (Spark still applies it). The option
is off by default for two reasons in pyspark itself: a reader that implements pushdown is refused
when the Spark setting is off, and pyspark 4.1 to 4.3 keep the partitions planned under a pushdown
on the relation, so a later query of the same DataFrame without filters would read only what the
earlier filter selected. Turn it on for DataFrames that serve one query.

Durability of writes: each write task appends its rows and fsyncs before it reports success,
so a committed Spark write survives power loss. Reads see what was written before planning.

Thread-safety: Spark creates these objects per query and per task; nothing is shared.
"""

from __future__ import annotations

import calendar
import datetime
import json
import math
import os
import re
import time
from bisect import bisect_left
from dataclasses import dataclass, replace
from typing import Any, Iterable, Iterator, Sequence

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceReader,
    DataSourceStreamReader,
    EqualTo,
    Filter,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    InputPartition,
    IsNotNull,
    LessThan,
    LessThanOrEqual,
    WriterCommitMessage,
)
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows, SupportsTriggerAvailableNow
from pyspark.sql.types import (ArrayType, BinaryType, IntegerType, LongType, StringType, StructField,
                               StructType, TimestampType)

from ._native import ffi, lib
from .errors import LogstoreError
from .logview import DataLossError, LogEnd, PartitionView, SegmentPosition, StoreView
from .records import RecordDecoder

__all__ = ["LogstoreDataSource", "OffsetRange", "SparkOptionError", "SCHEMA", "SCHEMA_WITH_HEADERS", "schema_struct"]

SCHEMA = ("key binary, value binary, topic string, partition int, offset long, "
          "timestamp timestamp, timestampType int")
SCHEMA_WITH_HEADERS = SCHEMA + ", headers array<struct<key:string,value:binary>>"


def schema_struct(include_headers: bool) -> StructType:
    """The source's schema as a StructType (built without a SparkContext, which executors and
    Spark's planning workers do not have)."""
    fields = [StructField("key", BinaryType()), StructField("value", BinaryType()),
              StructField("topic", StringType()), StructField("partition", IntegerType()),
              StructField("offset", LongType()), StructField("timestamp", TimestampType()),
              StructField("timestampType", IntegerType())]
    if include_headers:
        fields.append(StructField("headers", ArrayType(StructType(
            [StructField("key", StringType()), StructField("value", BinaryType())]))))
    return StructType(fields)

EARLIEST, LATEST = -2, -1
_READ_OPTIONS = {
    "path", "subscribe", "subscribepattern", "assign", "startingoffsets", "endingoffsets",
    "startingtimestamp", "endingtimestamp", "failondataloss", "includeheaders", "minpartitions",
    "maxrecordsperpartition", "maxoffsetspertrigger", "pruneonpushdown",
}
_WRITE_OPTIONS = {"path", "topic"}
_NEVER_NULL = ("topic", "partition", "offset", "timestamp", "timestampType")


class SparkOptionError(LogstoreError, ValueError):
    """An option of the "logstore" Spark source is unknown, missing or has a bad value."""


# ---------------------------------------------------------------------- input partitions
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
    #: when ``end`` is the log end: its segment and the byte position after its last batch,
    #: past which the reader never looks (-1: the range ends before the log end)
    stop_segment: int = -1
    stop_position: int = 0

    def stopping_at(self, log_end: LogEnd) -> "OffsetRange":
        """This range, told where the log ended when it was planned (see stop_segment)."""
        if self.end != log_end.offset or log_end.segment < 0:
            return self
        return replace(self, stop_segment=log_end.segment, stop_position=log_end.position)


# ---------------------------------------------------------------------- options
def _options(raw: Any, allowed: set[str]) -> dict[str, str]:
    opts = {str(k).lower(): str(v) for k, v in dict(raw).items()}
    unknown = sorted(set(opts) - allowed)
    if unknown:
        raise SparkOptionError(f"unknown option(s) {', '.join(unknown)} for the logstore source; "
                               f"known: {', '.join(sorted(allowed))}")
    if not opts.get("path"):
        raise SparkOptionError("option 'path' (the store's root directory) is required")
    return opts


def _bool(opts: dict[str, str], name: str, default: bool) -> bool:
    value = opts.get(name)
    if value is None:
        return default
    if value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    raise SparkOptionError(f"option {name!r} must be true or false, got {value!r}")


def _int(opts: dict[str, str], name: str, minimum: int) -> int | None:
    value = opts.get(name)
    if value is None:
        return None
    try:
        number = int(value)
    except ValueError:
        raise SparkOptionError(f"option {name!r} must be an integer, got {value!r}") from None
    if number < minimum:
        raise SparkOptionError(f"option {name!r} must be at least {minimum}, got {number}")
    return number


def _json(opts: dict[str, str], name: str) -> Any:
    try:
        return json.loads(opts[name])
    except json.JSONDecodeError as exc:
        raise SparkOptionError(f"option {name!r} is not valid JSON ({exc.msg} at character {exc.pos}): "
                               f"{opts[name]!r}") from None


def _topic_partitions(opts: dict[str, str], store: StoreView) -> list[tuple[str, int]]:
    """The partitions the options subscribe to, sorted."""
    given = [k for k in ("subscribe", "subscribepattern", "assign") if k in opts]
    if len(given) != 1:
        raise SparkOptionError("exactly one of the options 'subscribe', 'subscribePattern' and 'assign' "
                               f"is required, got {len(given)}")
    how = given[0]
    if how == "assign":
        spec = _json(opts, "assign")
        if not isinstance(spec, dict) or not all(isinstance(v, list) for v in spec.values()):
            raise SparkOptionError(f"option 'assign' must be JSON like {{\"topic\":[0,1]}}, got {opts['assign']!r}")
        out = []
        for topic, parts in spec.items():
            count = store.partitions(topic)
            for p in parts:
                if not isinstance(p, int) or isinstance(p, bool) or not 0 <= p < count:
                    raise SparkOptionError(f"option 'assign': topic {topic!r} has partitions 0..{count - 1}, "
                                           f"got {p!r}")
                out.append((topic, p))
        return sorted(set(out))
    if how == "subscribe":
        topics = [t.strip() for t in opts["subscribe"].split(",") if t.strip()]
        if not topics:
            raise SparkOptionError("option 'subscribe' names no topic")
    else:
        try:
            pattern = re.compile(opts["subscribepattern"])
        except re.error as exc:
            raise SparkOptionError(f"option 'subscribePattern' is not a valid pattern: {exc}") from None
        topics = [t for t in store.topics() if pattern.fullmatch(t)]
    return sorted((t, p) for t in topics for p in range(store.partitions(t)))


def _per_partition(opts: dict[str, str], name: str, partitions: list[tuple[str, int]],
                   default: int, allowed: tuple[str, ...]) -> dict[tuple[str, int], int]:
    """startingOffsets/endingOffsets as {(topic, partition): offset or EARLIEST/LATEST}."""
    value = opts.get(name)
    if value is None:
        return {tp: default for tp in partitions}
    word = value.strip().lower()
    if word in ("earliest", "latest"):
        if word not in allowed:
            raise SparkOptionError(f"option {name!r} cannot be {word!r} for this query")
        return {tp: EARLIEST if word == "earliest" else LATEST for tp in partitions}
    spec = _json(opts, name)
    if not isinstance(spec, dict):
        raise SparkOptionError(f"option {name!r} must be 'earliest', 'latest' or JSON like "
                               f"{{\"topic\":{{\"0\":23}}}}, got {value!r}")
    out = {tp: default for tp in partitions}
    for topic, offsets in spec.items():
        if not isinstance(offsets, dict):
            raise SparkOptionError(f"option {name!r}: topic {topic!r} needs an object of partition: offset")
        for key, offset in offsets.items():
            try:
                tp = (topic, int(key))
            except ValueError:
                raise SparkOptionError(f"option {name!r}: {key!r} is not a partition number") from None
            if tp not in out:
                raise SparkOptionError(f"option {name!r} names {topic}-{key}, which the query does not read")
            if not isinstance(offset, int) or isinstance(offset, bool) or offset < -2:
                raise SparkOptionError(f"option {name!r}: offset {offset!r} of {topic}-{key} must be "
                                       ">= 0, -2 (earliest) or -1 (latest)")
            if (offset == EARLIEST and "earliest" not in allowed) or (offset == LATEST and "latest" not in allowed):
                raise SparkOptionError(f"option {name!r}: offset {offset} of {topic}-{key} is not allowed here")
            out[tp] = offset
    return out


def _timestamp_ms(value: Any) -> int | None:
    """A filter literal for the timestamp column as ms since the epoch (None: unusable)."""
    if isinstance(value, datetime.datetime):
        if value.tzinfo is None:
            return calendar.timegm(value.timetuple()) * 1000 + value.microsecond // 1000
        return math.floor(value.timestamp() * 1000)
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    return None


# ---------------------------------------------------------------------- the data source
class LogstoreDataSource(DataSource):
    """The "logstore" data source: ``spark.read.format("logstore")``, ``spark.readStream`` and
    ``df.write.format("logstore")`` over a store's files (see the module docstring)."""

    @classmethod
    def name(cls) -> str:
        """The format name: ``spark.read.format("logstore")``.

        Called by ``spark.dataSource.register`` on the driver: with a local master, a worker
        interpreter that cannot import logstore raises :class:`LogstoreError` here, naming it
        and the fix (``PYSPARK_PYTHON``; see :mod:`logstore.sparkenv`), instead of every task
        failing later inside Spark with "No module named 'logstore'"."""
        from .sparkenv import check_driver

        check_driver()
        return "logstore"

    def schema(self) -> StructType:
        """Spark's Kafka source schema, with ``headers`` when includeHeaders=true."""
        opts = {str(k).lower(): str(v) for k, v in dict(self.options).items()}
        return schema_struct(opts.get("includeheaders", "false").strip().lower() == "true")

    def reader(self, schema: StructType) -> DataSourceReader:
        """The batch reader (with filter pushdown when pruneOnPushdown=true)."""
        reader = _BatchReader(self.options, schema)
        # Spark refuses a reader with pushFilters() when spark.sql.python.filterPushdown.enabled
        # is off, so only the opt-in reader has one (see _PruningReader).
        return _PruningReader(reader.planner) if reader.planner.prune else reader

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        """The micro-batch reader (offsets as JSON per partition)."""
        return _StreamReader(self.options, schema)

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceArrowWriter:
        """The append-only writer (overwrite is refused)."""
        if overwrite:
            raise SparkOptionError("the logstore source only appends: use mode('append')")
        return _Writer(self.options, schema)


class _Planner:
    """Turns options (and pushed filters) into OffsetRanges, on the driver."""

    def __init__(self, options: Any, schema: StructType, streaming: bool) -> None:
        self.opts = _options(options, _READ_OPTIONS)
        self.root = os.path.abspath(self.opts["path"])
        self.store = StoreView(self.root)
        self.streaming = streaming
        self.partitions = _topic_partitions(self.opts, self.store)
        self.include_headers = _bool(self.opts, "includeheaders", False)
        self.fail_on_data_loss = _bool(self.opts, "failondataloss", True)
        self.min_partitions = _int(self.opts, "minpartitions", 1)
        self.max_records = _int(self.opts, "maxrecordsperpartition", 1)
        self.max_per_trigger = _int(self.opts, "maxoffsetspertrigger", 1)
        if self.max_per_trigger is not None and not streaming:
            raise SparkOptionError("option 'maxOffsetsPerTrigger' applies to streaming queries only")
        self.start_ts = _int(self.opts, "startingtimestamp", -(2**63))
        self.end_ts = _int(self.opts, "endingtimestamp", -(2**63))
        if streaming and self.end_ts is not None:
            raise SparkOptionError("option 'endingTimestamp' applies to batch queries only")
        if streaming and "endingoffsets" in self.opts:
            raise SparkOptionError("option 'endingOffsets' applies to batch queries only")
        self.starting = _per_partition(self.opts, "startingoffsets", self.partitions,
                                       LATEST if streaming else EARLIEST,
                                       ("earliest", "latest") if streaming else ("earliest",))
        self.ending = _per_partition(self.opts, "endingoffsets", self.partitions, LATEST, ("latest",))
        expected = schema_struct(self.include_headers)
        if schema is not None and schema != expected:
            raise SparkOptionError(f"the logstore source has the fixed schema {expected.simpleString()}; "
                                   f"a user-specified schema {schema.simpleString()} is not supported")
        self.prune = _bool(self.opts, "pruneonpushdown", False)
        self.reset_filters()

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
            if isinstance(f, IsNotNull) and column in _NEVER_NULL:
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
        ms = _timestamp_ms(getattr(f, "value", None))
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
        find_start = find_end = None
        if start is None:
            wanted = self.starting[tp]
            start = log_start if wanted == EARLIEST else high if wanted == LATEST else wanted
            if self.start_ts is not None and not self.streaming:
                low, bound = view.timestamp_bounds(self.start_ts, segments)
                start, find_start = low, self.start_ts
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
        return OffsetRange(self.root, topic, p, start, end, find_start_ts=find_start, find_end_ts=find_end,
                           fail_on_data_loss=self.fail_on_data_loss,
                           include_headers=self.include_headers).stopping_at(log_end)

    def split(self, ranges: list[OffsetRange]) -> list[OffsetRange]:
        """Split ranges (maxRecordsPerPartition, minPartitions) at offset index entries."""
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

    def _split_one(self, r: OffsetRange, pieces: int) -> list[OffsetRange]:
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


# ---------------------------------------------------------------------- reading
class _BatchReader(DataSourceReader):
    def __init__(self, options: Any, schema: StructType) -> None:
        self.planner = _Planner(options, schema, streaming=False)

    def partitions(self) -> Sequence[InputPartition]:
        ranges = [r for tp in self.planner.selected() if (r := self.planner.bounds(tp)) is not None]
        planned = self.planner.split(ranges)
        return planned or [OffsetRange(self.planner.root, "", -1, 0, 0)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, OffsetRange)
        return read_range(partition)


class _PruningReader(_BatchReader):
    """The batch reader with filter pushdown, chosen by the option ``pruneOnPushdown=true``
    (which needs ``spark.sql.python.filterPushdown.enabled``).

    Opt-in because pyspark 4.1.0 to 4.3.0 keep the partitions planned during a pushdown on the
    relation (``PythonDataSourceV2.setReadInfo``): a later query on the same DataFrame without
    filters reuses them and reads only what the earlier filter selected. Prune only on a
    DataFrame that serves one query (or on a pyspark that scopes pushdown to the scan)."""

    def __init__(self, planner: _Planner) -> None:
        self.planner = planner

    def pushFilters(self, filters: list[Filter]) -> Iterable[Filter]:
        return list(self.planner.push(filters))


def arrow_schema(include_headers: bool) -> pa.Schema:
    """The Arrow schema Spark expects of the source's record batches."""
    return to_arrow_schema(schema_struct(include_headers), timezone="UTC")


_ROWS_PER_BATCH = 32768  # rows per Arrow record batch (the decoder's chunk)


def read_range(r: OffsetRange) -> Iterator[pa.RecordBatch]:
    """Decode one OffsetRange into Arrow record batches (what an executor runs)."""
    if r.end <= r.start:
        return
    builder = _ArrowBuilder(r)
    view = PartitionView(r.root, r.topic, r.partition)
    start = r.start
    hint = SegmentPosition(r.segment, r.position) if r.segment >= 0 else None
    stop_at = SegmentPosition(r.stop_segment, r.stop_position) if r.stop_segment >= 0 else None
    try:
        for _ in view.scan(start, r.end, builder.sink, RecordDecoder(capacity=_ROWS_PER_BATCH), hint,
                           stop_at=stop_at):
            yield from builder.take()
            if builder.done:
                return
    except DataLossError:
        if r.fail_on_data_loss:
            raise
        # The records are gone: read what is left of the range, if anything.
        restart = max(start, builder.next_offset, view.log_start_offset())
        if restart < r.end and restart > start:
            yield from read_range(replace(r, start=restart, segment=-1, position=0))
            return
    yield from builder.take()


class _ArrowBuilder:
    """The sink of PartitionView.scan: decoded C columns in, Arrow record batches out."""

    def __init__(self, r: OffsetRange) -> None:
        self.r = r
        self.schema = arrow_schema(r.include_headers)
        self._topic_scalar = pa.scalar(r.topic, pa.string())
        self._partition_scalar = pa.scalar(r.partition, pa.int32())
        self.batches: list[pa.RecordBatch] = []
        self.started = r.find_start_ts is None
        self.done = False
        self.next_offset = r.start
        self._headers_type = self.schema.field("headers").type if r.include_headers else None

    def take(self) -> list[pa.RecordBatch]:
        out, self.batches = self.batches, []
        return out

    def sink(self, buf: Any, out: Any, n: int) -> None:
        if self.done:
            return
        r = self.r
        offsets = ffi.buffer(out.offsets, 8 * n)
        first, last = 0, n
        # Rows past the range's end (inside its last batch) go.
        end_view = memoryview(offsets).cast("q")
        last = bisect_left(end_view, r.end)
        if last < n:
            self.done = True
        if not self.started:
            i = lib.ls_first_at_least(out.timestamps, last, r.find_start_ts)
            if i < 0:
                return
            self.started = True
            first = i
        if r.find_end_ts is not None:
            i = lib.ls_first_at_least(out.timestamps + first, last - first, r.find_end_ts)
            if i >= 0:
                last = first + i
                self.done = True
        if last <= first:
            return
        self.next_offset = end_view[last - 1] + 1
        self.batches.append(self._batch(buf, out, first, last))

    def _batch(self, buf: Any, out: Any, first: int, last: int) -> pa.RecordBatch:
        k = last - first
        cbuf = ffi.from_buffer(buf)
        try:
            keys = _binary(cbuf, len(buf), out.key_pos + first, out.key_len + first, k)
            values = _binary(cbuf, len(buf), out.value_pos + first, out.value_len + first, k)
            headers = self._headers(buf, out, first, last) if self._headers_type is not None else None
        finally:
            ffi.release(cbuf)
        offsets = pa.Array.from_buffers(pa.int64(), k, [None, pa.py_buffer(ffi.buffer(out.offsets + first, 8 * k)[:])])
        us = ffi.new("int64_t[]", k)
        lib.ls_ms_to_us(out.timestamps + first, k, us)
        timestamps = pa.Array.from_buffers(self.schema.field("timestamp").type, k, [None, pa.py_buffer(ffi.buffer(us))])
        types32 = ffi.new("int32_t[]", k)
        lib.ls_widen_int8(out.timestamp_types + first, k, types32)
        ttypes = pa.Array.from_buffers(pa.int32(), k, [None, pa.py_buffer(ffi.buffer(types32))])
        topic = pa.repeat(self._topic_scalar, k)
        partition = pa.repeat(self._partition_scalar, k)
        columns = [keys, values, topic, partition, offsets, timestamps, ttypes]
        if headers is not None:
            columns.append(headers)
        return pa.RecordBatch.from_arrays(columns, schema=self.schema)

    def _headers(self, buf: Any, out: Any, first: int, last: int) -> pa.Array:
        rows: list[list[dict[str, Any]]] = []
        for i in range(first, last):
            count = out.header_count[i]
            if count == 0:
                rows.append([])
                continue
            pairs = RecordDecoder._headers(buf, out.headers_pos[i], out.headers_len[i], count)
            rows.append([{"key": k, "value": v} for k, v in pairs])
        return pa.array(rows, type=self._headers_type)


def _binary(cbuf: Any, size: int, pos: Any, lens: Any, k: int) -> pa.Array:
    """Gather k spans of the decoded buffer into an Arrow binary array (nulls for length -1)."""
    total = lib.ls_binary_size(lens, k)
    if total < 0:
        raise LogstoreError("decoded record lengths are invalid")
    data = ffi.new("char[]", max(total, 1))
    offsets = ffi.new("int32_t[]", k + 1)
    validity = ffi.new("uint8_t[]", (k + 7) // 8 or 1)
    nulls = ffi.new("int32_t *")
    rc = lib.ls_gather_binary(cbuf, size, pos, lens, k, offsets, validity, data, total, nulls)
    if rc < 0:
        raise LogstoreError(f"cannot gather decoded records into Arrow buffers (error {rc})")
    # Zero-copy: each ffi.buffer keeps its cffi allocation alive for as long as Arrow holds it.
    bitmap = pa.py_buffer(ffi.buffer(validity, (k + 7) // 8)) if nulls[0] else None
    return pa.Array.from_buffers(pa.binary(), k, [bitmap, pa.py_buffer(ffi.buffer(offsets)),
                                                  pa.py_buffer(ffi.buffer(data, total))], null_count=nulls[0])


# ---------------------------------------------------------------------- streaming
class _StreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batches over offsets; an offset is JSON ``{"topic": {"partition": next offset}}``."""

    def __init__(self, options: Any, schema: StructType) -> None:
        self.planner = _Planner(options, schema, streaming=True)
        self.target: dict[tuple[str, int], int] | None = None

    def prepareForTriggerAvailableNow(self) -> None:
        """Trigger.AvailableNow: read up to the high watermarks of now, then stop."""
        self.target = {tp: self.planner.store.partition(*tp).high_watermark() for tp in self.planner.partitions}

    def initialOffset(self) -> dict:
        out: dict[str, dict[str, int]] = {}
        for tp in self.planner.partitions:
            view = self.planner.store.partition(*tp)
            segments = view.segments()
            wanted = self.planner.starting[tp]
            if self.planner.start_ts is not None:
                offset, _ = view.timestamp_bounds(self.planner.start_ts, segments)
            elif wanted == EARLIEST:
                offset = view.log_start_offset(segments)
            elif wanted == LATEST:
                offset = view.high_watermark(segments)
            else:
                offset = wanted
            out.setdefault(tp[0], {})[str(tp[1])] = offset
        return out

    def getDefaultReadLimit(self) -> Any:
        limit = self.planner.max_per_trigger
        return ReadAllAvailable() if limit is None else ReadMaxRows(limit)

    def latestOffset(self, start: dict | None = None, limit: Any = None) -> dict:
        ends: dict[tuple[str, int], int] = {}
        for tp in self.planner.partitions:
            ends[tp] = self.planner.store.partition(*tp).high_watermark()
            if self.target is not None:
                ends[tp] = min(ends[tp], self.target[tp])
        budget = getattr(limit, "max_rows", None)
        if budget is None or start is None:
            return _nest(ends)
        # Share maxOffsetsPerTrigger among the partitions in proportion to their backlog.
        begin = {tp: int(start.get(tp[0], {}).get(str(tp[1]), ends[tp])) for tp in ends}
        backlog = {tp: max(0, ends[tp] - begin[tp]) for tp in ends}
        total = sum(backlog.values())
        if total <= budget:
            return _nest(ends)
        shares = {tp: backlog[tp] * budget // total for tp in ends}
        # Hand what rounding left to the largest backlogs, so that every trigger moves on.
        for tp in sorted(ends, key=lambda t: backlog[t] - shares[t], reverse=True)[:budget - sum(shares.values())]:
            shares[tp] += 1
        return _nest({tp: begin[tp] + shares[tp] for tp in ends})

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        ranges = []
        for tp in self.planner.partitions:
            begin = int(start.get(tp[0], {}).get(str(tp[1]), 0))
            stop = int(end.get(tp[0], {}).get(str(tp[1]), begin))
            if stop <= begin:
                continue
            view = self.planner.store.partition(*tp)
            log_start = view.log_start_offset()
            if begin < log_start:
                if self.planner.fail_on_data_loss:
                    raise DataLossError(f"{tp[0]}-{tp[1]}: offsets {begin}..{log_start - 1} were deleted "
                                        "before the stream read them; set failOnDataLoss=false to skip them")
                begin = log_start
            if stop > begin:
                ranges.append(OffsetRange(self.planner.root, tp[0], tp[1], begin, stop,
                                          fail_on_data_loss=self.planner.fail_on_data_loss,
                                          include_headers=self.planner.include_headers).stopping_at(view.log_end()))
        return self.planner.split(ranges)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, OffsetRange)
        return read_range(partition)

    def commit(self, end: dict) -> None:
        """Nothing to release: the store keeps records by its own retention."""


def _nest(flat: dict[tuple[str, int], int]) -> dict:
    out: dict[str, dict[str, int]] = {}
    for (topic, p), offset in sorted(flat.items()):
        out.setdefault(topic, {})[str(p)] = offset
    return out


# ---------------------------------------------------------------------- writing
def _stamps(cols: dict[str, list[Any]], rows: list[int]) -> list[int] | None:
    if "timestamp" not in cols:
        return None
    now = time.time_ns() // 1_000_000
    return [now if cols["timestamp"][i] is None else cols["timestamp"][i] for i in rows]


def _column(array: pa.Array, encode: bool) -> list[Any]:
    """An Arrow column as Python values for append_batch: strings become UTF-8 bytes when
    ``encode`` (keys and values), timestamps ms since the epoch."""
    if encode and (pa.types.is_string(array.type) or pa.types.is_large_string(array.type)):
        return [None if v is None else v.encode() for v in array.to_pylist()]
    if pa.types.is_timestamp(array.type):
        micros = array.cast(pa.timestamp("us", tz=array.type.tz)).cast(pa.int64()).to_pylist()
        return [None if v is None else v // 1000 for v in micros]
    return array.to_pylist()


@dataclass
class _Written(WriterCommitMessage):
    records: int


class _Writer(DataSourceArrowWriter):
    """Appends rows to the store: each task opens the store (multi-process mode, so tasks on one
    machine share it safely), appends one batch per partition per Arrow batch through the C
    encoder, fsyncs, and reports its record count."""

    def __init__(self, options: Any, schema: StructType) -> None:
        self.opts = _options(options, _WRITE_OPTIONS)
        self.root = os.path.abspath(self.opts["path"])
        self.topic = self.opts.get("topic")
        types = {f.name: f.dataType for f in schema.fields}
        if "value" not in types:
            raise SparkOptionError("writing to logstore needs a 'value' column")
        if self.topic is None and "topic" not in types:
            raise SparkOptionError("writing to logstore needs the option 'topic' or a 'topic' column")
        allowed = {"key": (BinaryType, StringType), "value": (BinaryType, StringType), "topic": (StringType,),
                   "partition": (IntegerType,), "timestamp": (TimestampType,), "headers": (ArrayType,)}
        for name, kind in types.items():
            if name not in allowed:
                raise SparkOptionError(f"column {name!r} cannot be written to logstore "
                                       f"(known: {', '.join(allowed)})")
            if not isinstance(kind, allowed[name]):
                raise SparkOptionError(f"column {name!r} has type {kind.simpleString()}; expected "
                                       + " or ".join(t.typeName() for t in allowed[name]))
        if "headers" in types and types["headers"] != schema_struct(True)["headers"].dataType:
            raise SparkOptionError(f"column 'headers' must be array<struct<key:string,value:binary>>, got "
                                   f"{types['headers'].simpleString()}")
        StoreView(self.root)  # the store must exist: fail on the driver, not in every task

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        from .producer import default_partition
        from .store import LogStore

        written = 0
        with LogStore(self.root, maintenance=False) as store:
            touched = set()
            partitions: dict[str, int] = {}
            for batch in iterator:
                n = batch.num_rows
                cols = {name: _column(batch.column(i), name in ("key", "value"))
                        for i, name in enumerate(batch.schema.names)}
                values, keys = cols["value"], cols.get("key")
                groups: dict[tuple[str, int], list[int]] = {}
                for i in range(n):
                    topic = self.topic if self.topic is not None else cols["topic"][i]
                    if topic is None:
                        raise SparkOptionError(f"a row to write has a null topic (row {i} of its batch)")
                    count = partitions.get(topic)
                    if count is None:
                        count = partitions[topic] = store.partitions_for(topic)
                    part = cols["partition"][i] if "partition" in cols else None
                    if part is None:
                        key = keys[i] if keys is not None else None
                        part = default_partition(key, count) if key is not None else (written + i) % count
                    groups.setdefault((topic, part), []).append(i)
                for (topic, part), rows in groups.items():
                    log = store.partition(topic, part)
                    headers = None
                    if "headers" in cols:
                        headers = [[(h["key"], h["value"]) for h in (cols["headers"][i] or [])] for i in rows]
                    log.append_batch([values[i] for i in rows], None if keys is None else [keys[i] for i in rows],
                                     headers, _stamps(cols, rows))
                    touched.add((topic, part))
                written += n
            for topic, part in touched:
                store.partition(topic, part).flush()
        return _Written(written)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        """Every task appended and fsynced before reporting: nothing left to do."""

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        """An append log cannot take records back: rows of tasks that succeeded stay."""
