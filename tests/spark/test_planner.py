"""The Spark source's planner without Spark: options, filters and splitting, from the files."""

from __future__ import annotations

import datetime

import pytest

pytest.importorskip("pyspark")

from pyspark.sql.datasource import (EqualTo, GreaterThan, GreaterThanOrEqual, In, IsNotNull, IsNull,  # noqa: E402
                                    LessThan, StringStartsWith)

from logstore import LogStore  # noqa: E402
from logstore.spark.plan import Planner  # noqa: E402
from logstore.spark.source import OffsetRange, SparkOptionError, read_range  # noqa: E402

T0 = 1_700_000_000_000


@pytest.fixture
def root(tmp_path):
    root = str(tmp_path / "store")
    with LogStore(root, maintenance=False) as s:
        s.create_topic("a", 3, segment_bytes=8 << 10, index_interval_bytes=256)
        s.create_topic("b", 1)
        for p in range(3):
            log = s.partition("a", p)
            for i in range(0, 1000, 10):
                log.append_batch([b"%d-%d" % (p, j) + b"x" * 50 for j in range(i, i + 10)],
                                 timestamps=[T0 + j for j in range(i, i + 10)])
        s.partition("b", 0).append(b"only")
    return root


def plan(planner):
    ranges = [r for tp in planner.selected() if (r := planner.bounds(tp)) is not None]
    return planner.split(ranges)


def offsets(ranges):
    return sorted((r.topic, r.partition, o) for r in ranges for batch in read_range(r)
                  for o in batch.column("offset").to_pylist())


def test_exact_filters_are_taken_and_the_rest_returned(root):
    planner = Planner({"path": root, "subscribe": "a,b", "pruneOnPushdown": "true"}, None, False)
    filters = [EqualTo(("partition",), 1), GreaterThanOrEqual(("offset",), 100), LessThan(("offset",), 250),
               In(("topic",), ("a",)), IsNotNull(("offset",)), IsNull(("key",)),
               StringStartsWith(("topic",), "a"), In(("offset",), (120, 130)),
               GreaterThan(("timestamp",), datetime.datetime(2023, 11, 14, 22, 13, 20, 100000, tzinfo=datetime.timezone.utc))]
    left = list(planner.push(filters))
    assert left == [filters[5], filters[6], filters[7], filters[8]]
    ranges = plan(planner)
    assert [(r.topic, r.partition) for r in {(r.topic, r.partition): r for r in ranges}.values()] == [("a", 1)]
    # offset IN (120, 130) narrows the range to [120, 131) (Spark still applies the IN), and
    # timestamp > T0+100 could only have moved the start up to offset 101.
    assert offsets(ranges) == [("a", 1, o) for o in range(120, 131)]


def test_a_timestamp_lower_bound_prunes_through_the_time_index(root):
    planner = Planner({"path": root, "subscribe": "a", "pruneOnPushdown": "true"}, None, False)
    ts = GreaterThanOrEqual(("timestamp",), T0 + 700)
    assert list(planner.push([ts])) == [ts]  # Spark applies it too
    got = offsets(plan(planner))
    for p in range(3):
        mine = [o for t, q, o in got if q == p]
        assert 600 < mine[0] <= 700 and mine[-1] == 999  # started near 700, not at 0


def test_pushed_filters_do_not_stick_to_the_next_push(root):
    planner = Planner({"path": root, "subscribe": "a", "pruneOnPushdown": "true"}, None, False)
    list(planner.push([EqualTo(("partition",), 2), LessThan(("offset",), 5)]))
    list(planner.push([]))
    assert len(offsets(plan(planner))) == 3000


def test_splitting_covers_each_partition_exactly_once(root):
    planner = Planner({"path": root, "subscribe": "a", "maxRecordsPerPartition": "90"}, None, False)
    ranges = plan(planner)
    assert len(ranges) >= 3 * 1000 // 90
    assert all(0 < r.end - r.start for r in ranges)
    assert offsets(ranges) == sorted(("a", p, o) for p in range(3) for o in range(1000))
    for r in ranges:  # every piece starts at a batch the index points at, or the partition start
        assert r.segment >= 0 and isinstance(r, OffsetRange)


def test_minimum_partitions_spread_by_size(root):
    planner = Planner({"path": root, "subscribe": "a,b", "minPartitions": "10"}, None, False)
    ranges = plan(planner)
    assert len(ranges) >= 10
    assert sum(r.topic == "b" for r in ranges) == 1  # one record: never split


@pytest.mark.parametrize("options, message", [
    ({"subscribe": "a", "startingTimestamp": "soon"}, "must be an integer"),
    ({"subscribe": "a", "endingOffsets": "earliest"}, "cannot be 'earliest'"),
    ({"subscribe": "a", "startingOffsets": '{"a":{"0":-3}}'}, "must be >= 0"),
    ({"subscribe": "a", "startingOffsets": '{"a":[1]}'}, "needs an object"),
    ({"subscribePattern": "("}, "not a valid pattern"),
    ({"subscribe": " , "}, "names no topic"),
    ({"assign": '["a"]'}, "must be JSON like"),
])
def test_bad_options(root, options, message):
    with pytest.raises(SparkOptionError, match=message):
        Planner({"path": root, **options}, None, False)


def test_ending_before_starting_is_an_error(root):
    planner = Planner({"path": root, "subscribe": "b", "startingOffsets": '{"b":{"0":1}}',
                        "endingOffsets": '{"b":{"0":0}}'}, None, False)
    with pytest.raises(SparkOptionError, match="before its starting offset"):
        planner.bounds(("b", 0))


def test_a_user_specified_schema_chooses_the_columns_built(root):
    """Spark's Python source API does not say which columns a query uses; a user-specified
    schema does: the ranges carry its columns and the reader builds those, in its order."""
    from pyspark.sql.types import BinaryType, LongType, StringType, StructField, StructType

    schema = StructType([StructField("offset", LongType()), StructField("value", BinaryType())])
    planner = Planner({"path": root, "subscribe": "a"}, schema, streaming=False)
    assert planner.columns == ("offset", "value")
    batches = [b for r in plan(planner) for b in read_range(r)]
    assert all(b.schema.names == ["offset", "value"] for b in batches)
    assert sum(b.num_rows for b in batches) == 3000
    assert sorted(o for b in batches for o in b.column("offset").to_pylist()) == sorted(list(range(1000)) * 3)
    values = {v for b in batches for v in b.column("value").to_pylist()}
    assert b"1-999" + b"x" * 50 in values
    full = Planner({"path": root, "subscribe": "a"}, None, streaming=False)
    assert full.columns == ("key", "value", "topic", "partition", "offset", "timestamp", "timestampType")
    for bad, message in [(StructType([StructField("offset", StringType())]), "offset:string not in"),
                         (StructType([StructField("nope", BinaryType())]), "nope"),
                         (StructType([StructField("value", BinaryType()), StructField("value", BinaryType())]),
                          "each once")]:
        with pytest.raises(SparkOptionError, match=message):
            Planner({"path": root, "subscribe": "a"}, bad, streaming=False)
