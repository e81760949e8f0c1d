"""Spark writes into a store: the append-only Arrow writer of the "logstore" source.

Each write task opens the store in multi-process mode (tasks on one machine share it safely),
appends one batch per partition per Arrow batch through the C encoder, and fsyncs before it
reports success, so a committed Spark write survives power loss. An append log cannot take
records back: an aborted write leaves the rows of tasks that succeeded. Thread-safety: Spark
creates a Writer per query and calls it per task; nothing is shared.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any, Iterator

import pyarrow as pa
from pyspark.sql.datasource import DataSourceArrowWriter, WriterCommitMessage
from pyspark.sql.types import ArrayType, BinaryType, IntegerType, StringType, StructType, TimestampType

from ..store.views import StoreView
from .options import WRITE_OPTIONS, SparkOptionError, parse_options, schema_struct

__all__ = ["Writer"]


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


class Writer(DataSourceArrowWriter):
    """Appends rows to the store: each task opens the store (multi-process mode, so tasks on one
    machine share it safely), appends one batch per partition per Arrow batch through the C
    encoder, fsyncs, and reports its record count."""

    def __init__(self, options: Any, schema: StructType) -> None:
        self.opts = parse_options(options, WRITE_OPTIONS)
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
        from ..client.producer import default_partition
        from ..store.store import LogStore

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
