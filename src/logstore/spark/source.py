"""PySpark data source "logstore": Spark reads and writes a store's segment files directly.

::

    from logstore.spark.source import LogstoreDataSource
    spark.dataSource.register(LogstoreDataSource)
    df = (spark.read.format("logstore").option("path", "/data/store")
          .option("subscribe", "events").load())

(With the package installed, ``pyspark_logstore`` registers the source by itself: Spark looks
for top-level ``pyspark_*`` modules exposing ``DefaultSource``.)

The JVM reader: with the jar of :func:`logstore.spark.jar_path` on ``spark.jars``,
``format("logstore")`` is a Spark DataSource V2 in Java (``jvm/``), since Spark 4.3 resolves a
format name through Java's ``DataSourceRegister`` services before Python data sources. It reads
batches itself (column pruning, filter pushdown, columnar batches, no Python worker) and hands
writes and streaming reads to this source, unchanged; with the option ``reader=auto`` (default)
also the batch reads only this source can do (a tiered store, a Kafka log directory,
``kafka.isolation.level=read_committed``). ``reader=python`` reads with this source,
``reader=jvm`` insists on the JVM reader (here, without its jar, an error).

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
into offset ranges at sparse index entries); ``pruneOnPushdown`` (see below); ``remoteStorage``
and ``remoteStorage.<name>`` (a tiered topic's object store and its options, instead of the one
the store remembers: see :mod:`logstore.spark.plan`). Streaming reads
add ``maxOffsetsPerTrigger`` and honour ``Trigger.AvailableNow``; ``reader`` (see above). Writes take ``topic`` (or a
``topic`` column) and the columns ``value`` and optionally ``key`` (binary or string),
``partition``, ``headers`` and ``timestamp``. Unknown options and bad values raise
:class:`SparkOptionError`.

Columns: pyspark's Python data source API does not tell a source which columns a query uses. A
user-specified schema naming some of the source's columns with their types, in any order
(``.schema("value binary, offset long")``), is read as asked: only those columns are built and
handed to the JVM. Any other schema raises :class:`SparkOptionError`.

How it runs: the driver plans input partitions from segment file names, sparse index entries
and the batch headers after the last index entry (:mod:`logstore.store.views`); no record is read
on the driver. Each input partition is a picklable :class:`OffsetRange`; the executor that
runs it maps the segment files read-only, decodes the batches with the C decoder (every batch's
CRC checked) and builds Arrow record batches straight from the decoded columns (keys and values
gathered by C into Arrow buffers). Executors therefore need the store's directory at the same
path (local mode, or a shared mount). The older offsets of a tiered topic (tiered storage) they
read from the object store themselves, with ranged gets of whole batches, each CRC-checked.

Filter pushdown: with ``spark.sql.python.filterPushdown.enabled`` and ``pruneOnPushdown=true``,
predicates on ``topic``, ``partition`` and ``offset`` are applied exactly by the planner, and a
lower bound on ``timestamp`` prunes through the time indexes (Spark still applies it). The option
is off by default for two reasons in pyspark itself: a reader that implements pushdown is refused
when the Spark setting is off, and pyspark 4.1 to 4.3 keep the partitions planned under a pushdown
on the relation, so a later query of the same DataFrame without filters would read only what the
earlier filter selected. Turn it on for DataFrames that serve one query.

Durability of writes: each write task appends its rows and fsyncs before it reports success,
so a committed Spark write survives power loss. Reads see what was written before planning.

Layout: this module holds the data source and its batch and streaming readers;
:mod:`logstore.spark.options` the schema and option parsing, :mod:`logstore.spark.plan` the
driver's planning (:class:`OffsetRange`), :mod:`logstore.spark.read` the executors' decoding into
Arrow, and :mod:`logstore.spark.write` the writer. The public names are all importable from here.

Thread-safety: Spark creates these objects per query and per task; nothing is shared.
"""

from __future__ import annotations

from typing import Any, Iterable, Iterator, Sequence

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceReader,
    DataSourceStreamReader,
    Filter,
    InputPartition,
)
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows, SupportsTriggerAvailableNow
from pyspark.sql.types import StructType

from ..store.views import DataLossError
from .options import EARLIEST, LATEST, SCHEMA, SCHEMA_WITH_HEADERS, SparkOptionError, schema_struct  # noqa: F401
from .plan import OffsetRange, Planner
from .read import arrow_schema, read_range  # noqa: F401 - arrow_schema is re-exported
from .write import Writer

__all__ = ["LogstoreDataSource", "OffsetRange", "SparkOptionError", "SCHEMA", "SCHEMA_WITH_HEADERS", "schema_struct"]


# ---------------------------------------------------------------------- the data source
class LogstoreDataSource(DataSource):
    """The "logstore" data source: ``spark.read.format("logstore")``, ``spark.readStream`` and
    ``df.write.format("logstore")`` over a store's files (see the module docstring)."""

    @classmethod
    def name(cls) -> str:
        """The format name: ``spark.read.format("logstore")``.

        Called by ``spark.dataSource.register`` on the driver: with a local master, a worker
        interpreter that cannot import logstore raises :class:`LogstoreError` here, naming it
        and the fix (``PYSPARK_PYTHON``; see :mod:`logstore.spark.env`), instead of every task
        failing later inside Spark with "No module named 'logstore'"."""
        from .env import check_driver

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
        return Writer(self.options, schema)


# ---------------------------------------------------------------------- reading
class _BatchReader(DataSourceReader):
    def __init__(self, options: Any, schema: StructType) -> None:
        self.planner = Planner(options, schema, streaming=False)

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

    def __init__(self, planner: Planner) -> None:
        self.planner = planner

    def pushFilters(self, filters: list[Filter]) -> Iterable[Filter]:
        return list(self.planner.push(filters))


# ---------------------------------------------------------------------- streaming
class _StreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batches over offsets; an offset is JSON ``{"topic": {"partition": next offset}}``."""

    def __init__(self, options: Any, schema: StructType) -> None:
        self.planner = Planner(options, schema, streaming=True)
        self.target: dict[tuple[str, int], int] | None = None

    def prepareForTriggerAvailableNow(self) -> None:
        """Trigger.AvailableNow: read up to the high watermarks of now, then stop."""
        self.target = {tp: self.planner.visible_end(*tp) for tp in self.planner.partitions}

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
                offset = self.planner.visible_end(*tp)
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
            ends[tp] = self.planner.visible_end(*tp)
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
                segments = view.segments()
                ranges.append(self.planner.with_remote(OffsetRange(
                    self.planner.root, tp[0], tp[1], begin, stop, fail_on_data_loss=self.planner.fail_on_data_loss,
                    include_headers=self.planner.include_headers,
                    columns=self.planner.columns).stopping_at(view.log_end(segments)), view, segments))
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
