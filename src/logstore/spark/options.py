"""The Spark source's schema and options: their names, parsing and checks (driver and writer side).

The schema is Spark's Kafka source's (see :mod:`logstore.spark.source`); the options are parsed here
into plain values, and every unknown option or bad value raises :class:`SparkOptionError`.
:mod:`logstore.spark.source` re-exports the public names. Thread-safe: pure functions and constants.
"""

from __future__ import annotations

import calendar
import datetime
import json
import math
import re
from typing import Any

from pyspark.sql.types import (ArrayType, BinaryType, IntegerType, LongType, StringType, StructField,
                               StructType, TimestampType)

from ..errors import LogstoreError
from ..store.views import StoreView

__all__ = ["SCHEMA", "SCHEMA_WITH_HEADERS", "schema_struct", "SparkOptionError", "EARLIEST", "LATEST",
           "READ_OPTIONS", "READ_OPTION_PREFIXES", "WRITE_OPTIONS", "NEVER_NULL", "parse_options", "reader_option", "bool_option", "int_option",
           "json_option", "topic_partitions", "per_partition", "timestamp_ms"]

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


EARLIEST, LATEST = -2, -1  # offsets in startingOffsets/endingOffsets JSON, as Kafka spells them
READ_OPTIONS = {
    "path", "subscribe", "subscribepattern", "assign", "startingoffsets", "endingoffsets",
    "startingtimestamp", "endingtimestamp", "failondataloss", "includeheaders", "minpartitions",
    "maxrecordsperpartition", "maxoffsetspertrigger", "pruneonpushdown", "kafka.isolation.level", "remotestorage",
    "reader",
}
#: prefixes of the read options named freely: ``remoteStorage.<name>`` is the object store's
#: option ``<name>`` (obstore's names: endpoint, region, access_key_id, allow_http, ...)
READ_OPTION_PREFIXES = ("remotestorage.",)
WRITE_OPTIONS = {"path", "topic"}
NEVER_NULL = ("topic", "partition", "offset", "timestamp", "timestampType")


class SparkOptionError(LogstoreError, ValueError):
    """An option of the "logstore" Spark source is unknown, missing or has a bad value."""


def parse_options(raw: Any, allowed: set[str], prefixes: tuple[str, ...] = ()) -> dict[str, str]:
    """Spark's options as {lower-case name: value}; unknown names (neither in ``allowed`` nor
    starting with one of ``prefixes``) and a missing path raise."""
    opts = {str(k).lower(): str(v) for k, v in dict(raw).items()}
    unknown = sorted(k for k in set(opts) - allowed if not any(k.startswith(p) and len(k) > len(p) for p in prefixes))
    if unknown:
        raise SparkOptionError(f"unknown option(s) {', '.join(unknown)} for the logstore source; "
                               f"known: {', '.join(sorted(allowed) + [p + '<name>' for p in prefixes])}")
    if not opts.get("path"):
        raise SparkOptionError("option 'path' (the store's root directory) is required")
    return opts


def reader_option(opts: dict[str, str]) -> str:
    """The option ``reader``: who reads a batch, ``auto`` (default), ``jvm`` or ``python`` (see
    :mod:`logstore.spark.source`). The Python source serves ``auto`` and ``python``; ``jvm`` here
    means the JVM reader's jar is not on the classpath."""
    value = opts.get("reader", "auto").strip().lower()
    if value not in ("auto", "jvm", "python"):
        raise SparkOptionError(f"option 'reader' must be auto, jvm or python, got {opts['reader']!r}")
    if value == "jvm":
        raise SparkOptionError("option reader=jvm needs the JVM reader's jar on spark.jars "
                               "(logstore.spark.jar_path(); built by `make jar`)")
    return value


def bool_option(opts: dict[str, str], name: str, default: bool) -> bool:
    """Option ``name`` as a bool ("true"/"false", any case), ``default`` when absent."""
    value = opts.get(name)
    if value is None:
        return default
    if value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    raise SparkOptionError(f"option {name!r} must be true or false, got {value!r}")


def int_option(opts: dict[str, str], name: str, minimum: int) -> int | None:
    """Option ``name`` as an int of at least ``minimum``, None when absent."""
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


def json_option(opts: dict[str, str], name: str) -> Any:
    """Option ``name`` parsed as JSON."""
    try:
        return json.loads(opts[name])
    except json.JSONDecodeError as exc:
        raise SparkOptionError(f"option {name!r} is not valid JSON ({exc.msg} at character {exc.pos}): "
                               f"{opts[name]!r}") from None


def topic_partitions(opts: dict[str, str], store: StoreView) -> list[tuple[str, int]]:
    """The partitions the options subscribe to, sorted."""
    given = [k for k in ("subscribe", "subscribepattern", "assign") if k in opts]
    if len(given) != 1:
        raise SparkOptionError("exactly one of the options 'subscribe', 'subscribePattern' and 'assign' "
                               f"is required, got {len(given)}")
    how = given[0]
    if how == "assign":
        spec = json_option(opts, "assign")
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


def per_partition(opts: dict[str, str], name: str, partitions: list[tuple[str, int]],
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
    spec = json_option(opts, name)
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


def timestamp_ms(value: Any) -> int | None:
    """A filter literal for the timestamp column as ms since the epoch (None: unusable)."""
    if isinstance(value, datetime.datetime):
        if value.tzinfo is None:
            return calendar.timegm(value.timetuple()) * 1000 + value.microsecond // 1000
        return math.floor(value.timestamp() * 1000)
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    return None
