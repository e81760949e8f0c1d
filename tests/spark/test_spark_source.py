"""The "logstore" PySpark data source against Log.read, on a local SparkSession (real pyspark).

Every expectation is computed from the store through logstore's own Log API; Spark must return
the same records through the source, which reads the segment files on its own."""

from __future__ import annotations

import datetime
import os
import json
import zlib

import pytest

from logstore import LogStore

T0 = 1_700_000_000_000  # ms


def read(spark, root, **options):
    reader = spark.read.format("logstore").option("path", root)
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load()


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """Topics of several codecs, partitions and segments, with null keys and values, headers,
    explicit timestamps and a compacted topic with gaps; returns (root, expected records)."""
    root = str(tmp_path_factory.mktemp("spark") / "store")
    expected = {}
    with LogStore(root, maintenance=False) as s:
        s.create_topic("plain", 3, segment_bytes=16 << 10, index_interval_bytes=1024)
        for codec in ("zstd", "gzip", "snappy", "lz4"):
            s.create_topic(codec, 2, compression_type=codec, segment_bytes=16 << 10)
        s.create_topic("compacted", 1, cleanup_policy="compact", segment_bytes=4 << 10)
        for topic in ("plain", "zstd", "gzip", "snappy", "lz4"):
            for p in range(s.partitions_for(topic)):
                log = s.partition(topic, p)
                n = 0
                for b in range(30):
                    size = 1 + (b * 7 + p) % 40
                    log.append_batch(
                        [None if (n + i) % 17 == 5 else b"%s-%d-%d " % (topic.encode(), p, n + i) + b"v" * ((n + i) % 90)
                         for i in range(size)],
                        [None if (n + i) % 4 == 0 else b"k%d" % ((n + i) % 50) for i in range(size)],
                        [[("h", b"%d" % (n + i)), ("empty", None)] if (n + i) % 9 == 0 else [] for i in range(size)],
                        timestamps=[T0 + 1000 * (n + i) for i in range(size)])
                    n += size
        log = s.partition("compacted", 0)
        for i in range(600):
            log.append(b"value-%d" % i, key=b"key-%d" % (i % 40), timestamp=T0 + i)
        log.roll()
        log.compact()
        for topic in s.topics():
            for p in range(s.partitions_for(topic)):
                expected[(topic, p)] = list(s.partition(topic, p).iter())
    assert len(expected[("compacted", 0)]) < 600  # the cleaner left gaps
    return root, expected


def checksums(records):
    return (len(records), sum(r.offset for r in records),
            sum(zlib.crc32(r.value) for r in records if r.value is not None),
            sum(r.key is None for r in records))


def test_count_offsets_and_value_checksums_match_log_reads(spark, store):
    """Per topic (every codec, and a compacted log with gaps), one Spark job."""
    root, expected = store
    topics = ["plain", "zstd", "gzip", "snappy", "lz4", "compacted"]
    rows = read(spark, root, subscribe=",".join(topics)).groupBy("topic").agg(
        {"*": "count", "offset": "sum"}).collect()
    extra = read(spark, root, subscribe=",".join(topics)).selectExpr(
        "topic", "crc32(value) AS crc", "CAST(key IS NULL AS INT) AS nokey").groupBy("topic").sum("crc", "nokey").collect()
    got = {r["topic"]: (r["count(1)"], r["sum(offset)"]) for r in rows}
    got2 = {r["topic"]: (r["sum(crc)"] or 0, r["sum(nokey)"]) for r in extra}
    for topic in topics:
        records = [r for (t, _), rs in expected.items() if t == topic for r in rs]
        count, offsets, crcs, nokeys = checksums(records)
        assert got[topic] == (count, offsets), topic
        assert got2[topic] == (crcs, nokeys), topic


def test_every_field_of_every_row_with_headers(spark, store):
    root, expected = store
    rows = read(spark, root, subscribe="plain,zstd", includeHeaders="true").collect()
    got = sorted(((r.topic, r.partition, r.offset), (r.key, r.value, r.timestamp, r.timestampType,
                                                     [(h.key, h.value) for h in r.headers])) for r in rows)
    want = sorted(((t, p, r.offset), (r.key, r.value, datetime.datetime.fromtimestamp(r.timestamp / 1000, datetime.timezone.utc).replace(tzinfo=None),
                                      int(r.timestamp_type), list(r.headers)))
                  for (t, p), rs in expected.items() if t in ("plain", "zstd") for r in rs)
    assert got == want


def test_offset_ranges_from_json(spark, store):
    root, expected = store
    start = {"plain": {"0": 10, "1": -2}}
    end = {"plain": {"0": 50, "1": -1, "2": 7}}
    rows = read(spark, root, subscribe="plain", startingOffsets=json.dumps(start),
                endingOffsets=json.dumps(end)).select("partition", "offset").collect()
    got = sorted((r.partition, r.offset) for r in rows)
    ends = {p: len(expected[("plain", p)]) for p in range(3)}
    want = sorted([(0, o) for o in range(10, 50)] + [(1, o) for o in range(ends[1])] + [(2, o) for o in range(7)])
    assert got == want


def test_timestamp_range_follows_list_offsets(spark, store):
    root, expected = store
    lo, hi = T0 + 1000 * 123 + 1, T0 + 1000 * 400
    rows = read(spark, root, subscribe="plain", startingTimestamp=str(lo), endingTimestamp=str(hi),
                maxRecordsPerPartition="50").select("partition", "offset").collect()
    want = []
    for p in range(3):
        records = expected[("plain", p)]
        first = next((r.offset for r in records if r.timestamp >= lo), len(records))
        last = next((r.offset for r in records if r.timestamp >= hi), len(records))
        want += [(p, o) for o in range(first, last)]
    assert sorted((r.partition, r.offset) for r in rows) == sorted(want)


def test_compacted_log_with_gaps(spark, store):
    root, expected = store
    rows = read(spark, root, subscribe="compacted").select("offset", "key", "value").collect()
    assert [(r.offset, r.key, r.value) for r in sorted(rows)] == [(r.offset, r.key, r.value) for r in expected[("compacted", 0)]]


def test_large_partitions_split_into_offset_ranges(spark, store):
    root, expected = store
    df = read(spark, root, subscribe="plain", maxRecordsPerPartition="100", minPartitions="8")
    assert df.rdd.getNumPartitions() >= 8
    records = [r for (t, _), rs in expected.items() if t == "plain" for r in rs]
    row = read(spark, root, subscribe="plain", maxRecordsPerPartition="100", minPartitions="8").selectExpr(
        "count(*)", "sum(offset)", "sum(crc32(value))", "sum(cast(key is null as int))").first()
    assert tuple(x or 0 for x in row) == checksums(records)


def test_subscribe_pattern_and_assign(spark, store):
    root, expected = store
    topics = {r.topic for r in read(spark, root, subscribePattern="(gzip|lz4)").select("topic").distinct().collect()}
    assert topics == {"gzip", "lz4"}
    rows = read(spark, root, assign=json.dumps({"zstd": [1], "plain": [2]})).select("topic", "partition").distinct().collect()
    assert sorted((r.topic, r.partition) for r in rows) == [("plain", 2), ("zstd", 1)]


def test_pruning_with_pushed_filters(spark, store):
    root, expected = store
    query = "partition = 1 AND offset >= 20 AND offset < 60 AND timestamp >= TIMESTAMP '{}'".format(
        datetime.datetime.fromtimestamp((T0 + 1000 * 30) / 1000, datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S"))
    pruned = read(spark, root, subscribe="plain", pruneOnPushdown="true").where(query)
    assert pruned.rdd.getNumPartitions() == 1  # partitions 0 and 2 were never planned
    got = sorted(r.offset for r in read(spark, root, subscribe="plain", pruneOnPushdown="true").where(query).collect())
    want = [r.offset for r in expected[("plain", 1)] if 20 <= r.offset < 60 and r.timestamp >= T0 + 1000 * 30]
    assert got == want
    # Without the option Spark filters everything itself, with the same result.
    assert sorted(r.offset for r in read(spark, root, subscribe="plain").where(query).collect()) == want


def test_fail_on_data_loss(spark, tmp_path):
    root = str(tmp_path / "s")
    with LogStore(root, maintenance=False) as s:
        s.create_topic("t", 1)
        log = s.partition("t", 0)
        log.append_batch([b"%d" % i for i in range(100)])
        log.delete_records_before(40)
    starting = json.dumps({"t": {"0": 10}})
    with pytest.raises(Exception, match="below the log start"):
        read(spark, root, subscribe="t", startingOffsets=starting).count()
    rows = read(spark, root, subscribe="t", startingOffsets=starting, failOnDataLoss="false").select("offset").collect()
    assert sorted(r.offset for r in rows) == list(range(40, 100))


@pytest.mark.parametrize("options, message", [
    (dict(subscribe="nope"), "does not exist"),
    (dict(subscribe="plain", startingOffsets='{"plain":{"0":100000}}'), "past its end"),
    (dict(subscribe="plain", startingOffsets='{"plain":{"0":'), "not valid JSON"),
    (dict(subscribe="plain", startingOffsets='{"plain":{"9":1}}'), "does not read"),
    (dict(subscribe="plain", startingOffsets="latest"), "cannot be 'latest'"),
    (dict(subscribe="plain", bogus="1"), "unknown option"),
    (dict(subscribe="plain", assign='{"plain":[0]}'), "exactly one of"),
    (dict(subscribe="plain", includeHeaders="yes"), "true or false"),
    (dict(subscribe="plain", maxRecordsPerPartition="0"), "at least 1"),
    (dict(assign='{"plain":[3]}'), "partitions 0..2"),
    (dict(subscribe="plain", maxOffsetsPerTrigger="5"), "streaming queries only"),
])
def test_bad_options_fail_with_a_clear_message(spark, store, options, message):
    root, _ = store
    with pytest.raises(Exception, match=message):
        read(spark, root, **options).count()


def test_missing_path_and_bad_store(spark, tmp_path):
    with pytest.raises(Exception, match="'path'"):
        spark.read.format("logstore").option("subscribe", "t").load().count()
    with pytest.raises(Exception, match="not a logstore data directory"):
        read(spark, str(tmp_path), subscribe="t").count()


def test_write_then_read_back(spark, tmp_path):
    root = str(tmp_path / "w")
    with LogStore(root, maintenance=False) as s:
        s.create_topic("out", 3)
    rows = [(b"k%d" % (i % 10) if i % 5 else None, b"v%d" % i if i % 11 else None,
             i % 3 if i % 2 else None, [("n", b"%d" % i)] if i % 7 == 0 else []) for i in range(400)]
    df = spark.createDataFrame(rows, "key binary, value binary, partition int, headers array<struct<key:string,value:binary>>")
    df.write.format("logstore").option("path", root).option("topic", "out").mode("append").save()
    back = read(spark, root, subscribe="out", includeHeaders="true").collect()
    assert sorted((r.key or b"", r.value or b"", [(h.key, h.value) for h in r.headers]) for r in back) == \
        sorted((k or b"", v or b"", h) for k, v, _, h in rows)
    # Rows with a partition column went to that partition; keyed rows went where Kafka puts them.
    from logstore.client.producer import default_partition
    for r in back:
        n = int(r.value[1:]) if r.value else None
        if n is not None and n % 2:
            assert r.partition == n % 3
        elif n is not None and r.key is not None:
            assert r.partition == default_partition(r.key, 3)
    with pytest.raises(Exception, match="append"):
        df.write.format("logstore").option("path", root).option("topic", "out").mode("overwrite").save()


def test_write_strings_timestamps_and_a_topic_column(spark, tmp_path):
    root = str(tmp_path / "w2")
    with LogStore(root, maintenance=False) as s:
        s.create_topic("a", 1)
        s.create_topic("b", 2)
    df = spark.sql("SELECT IF(id % 2 = 0, 'a', 'b') AS topic, CAST(id AS STRING) AS key, "
                   "CONCAT('v', CAST(id AS STRING)) AS value, TIMESTAMP_MILLIS(1700000000000 + id) AS timestamp "
                   "FROM range(300)")
    df.write.format("logstore").option("path", root).mode("append").save()
    with LogStore(root, maintenance=False) as s:
        got = sorted((t, r.key, r.value, r.timestamp) for t in ("a", "b") for p in range(s.partitions_for(t))
                     for r in s.partition(t, p).iter())
    assert got == sorted(("a" if i % 2 == 0 else "b", b"%d" % i, b"v%d" % i, 1700000000000 + i) for i in range(300))
    bad = spark.sql("SELECT 1 AS value")
    with pytest.raises(Exception, match="'value' has type int"):
        bad.write.format("logstore").option("path", root).option("topic", "a").mode("append").save()
    with pytest.raises(Exception, match="cannot be written"):
        spark.sql("SELECT 'x' AS value, 2 AS extra").write.format("logstore").option("path", root) \
            .option("topic", "a").mode("append").save()


def test_stream_reads_everything_once_in_bounded_micro_batches(spark, tmp_path):
    root = str(tmp_path / "st")
    with LogStore(root, maintenance=False) as s:
        s.create_topic("in", 2)
        for p in range(2):
            s.partition("in", p).append_batch([b"%d-%d" % (p, i) for i in range(450)])
    query = (spark.readStream.format("logstore").option("path", root).option("subscribe", "in")
             .option("startingOffsets", "earliest").option("maxOffsetsPerTrigger", "250").load()
             .writeStream.format("memory").queryName("stream_once")
             .option("checkpointLocation", str(tmp_path / "ckpt")).trigger(availableNow=True).start())
    query.awaitTermination(120)
    sizes = [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]
    assert sum(sizes) == 900 and max(sizes) <= 250
    row = spark.sql("select count(*), count(distinct partition, offset) from stream_once").first()
    assert tuple(row) == (900, 900)


def test_explicit_registration(spark, store):
    from logstore.spark.source import LogstoreDataSource
    spark.dataSource.register(LogstoreDataSource)
    root, expected = store
    assert read(spark, root, subscribe="lz4").count() == sum(len(v) for (t, _), v in expected.items() if t == "lz4")


def test_reads_a_store_that_is_being_written(spark, tmp_path):
    """A writer appends (and rolls small segments) while Spark plans and reads: every read is a
    dense prefix of each partition with the right values, never a torn or partial batch."""
    import threading

    root = str(tmp_path / "live")
    stop = threading.Event()
    with LogStore(root, maintenance=False) as s:
        s.create_topic("live", 2, segment_bytes=8 << 10)

        def write():
            i = 0
            while not stop.is_set():
                for p in range(2):
                    s.partition("live", p).append_batch([b"%d:%d" % (p, i + j) for j in range(25)])
                i += 25

        writer = threading.Thread(target=write)
        writer.start()
        try:
            seen = []
            for _ in range(3):
                rows = read(spark, root, subscribe="live").select("partition", "offset", "value").collect()
                for p in range(2):
                    mine = sorted((r.offset, r.value) for r in rows if r.partition == p)
                    assert [o for o, _ in mine] == list(range(len(mine)))
                    assert all(v == b"%d:%d" % (p, o) for o, v in mine)
                seen.append(len(rows))
        finally:
            stop.set()
            writer.join()
    assert seen == sorted(seen) and seen[-1] > 0


def test_registering_with_workers_that_cannot_import_logstore_names_the_fix(spark, tmp_path):
    from logstore import LogstoreError
    from logstore.spark.source import LogstoreDataSource

    bare = tmp_path / "python3"
    bare.write_text("#!/bin/sh\necho \"ModuleNotFoundError: No module named 'logstore'\" >&2\nexit 1\n")
    os.chmod(bare, 0o755)
    sc = spark.sparkContext
    saved = sc.pythonExec
    sc.pythonExec = str(bare)
    try:
        with pytest.raises(LogstoreError, match="PYSPARK_PYTHON=.*before the SparkSession starts"):
            spark.dataSource.register(LogstoreDataSource)
    finally:
        sc.pythonExec = saved
    spark.dataSource.register(LogstoreDataSource)  # the session's own interpreter is fine


def test_reads_a_kafka_log_directory_without_writing_into_it(spark, tmp_path):
    import pathlib
    import shutil

    fixture = pathlib.Path(__file__).resolve().parents[1] / "fixtures" / "kafka" / "cluster-metadata-00000000000000000000.log"
    root = tmp_path / "kafka"
    root.mkdir()
    (root / "meta.properties").write_text("version=1\nnode.id=1\ncluster.id=abc\n")
    for name in ("orders-0", "orders-2"):  # partition 1 is on another broker
        (root / name).mkdir()
        shutil.copyfile(fixture, root / name / "00000000000000000000.log")
    before = sorted((str(p), p.stat().st_mtime_ns) for p in root.rglob("*"))
    rows = (spark.read.format("logstore").option("path", str(root)).option("subscribe", "orders").load()
            .select("partition", "offset", "value").collect())
    assert sorted((r.partition, r.offset) for r in rows) == [(p, o) for p in (0, 2) for o in range(4)]
    assert sorted(len(r.value) for r in rows if r.partition == 0) == [23, 24, 65, 65]
    assert sorted((str(p), p.stat().st_mtime_ns) for p in root.rglob("*")) == before


def test_reads_what_kafka_clients_produced_to_a_served_store(spark, tmp_path):
    """confluent-kafka (librdkafka's encoder, not ours) produces compressed, keyed records with
    headers to a served store; Spark reads them back from the files."""
    ck = pytest.importorskip("confluent_kafka")
    from logstore.kafka.server import KafkaServer

    root = str(tmp_path / "served")
    with KafkaServer(root, ("127.0.0.1", 0)) as server:
        server.store.create_topic("clients", 2)
        p = ck.Producer({"bootstrap.servers": server.bootstrap_servers, "compression.type": "zstd",
                         "linger.ms": 20, "enable.idempotence": True})
        for i in range(300):
            p.produce("clients", key=b"k%d" % (i % 10), value=b"value %d" % i, partition=i % 2,
                      headers=[("n", b"%d" % i)], timestamp=T0 + i)
        assert p.flush(20) == 0
    rows = read(spark, root, subscribe="clients", includeHeaders="true").collect()
    got = sorted((r.partition, r.offset, r.key, r.value, [(h.key, h.value) for h in r.headers]) for r in rows)
    want = sorted((i % 2, i // 2, b"k%d" % (i % 10), b"value %d" % i, [("n", b"%d" % i)]) for i in range(300))
    assert got == want
    assert {int(r.timestamp.replace(tzinfo=datetime.timezone.utc).timestamp() * 1000) - T0 for r in rows} == \
        set(range(300))



def test_reads_a_store_while_it_is_served(spark, tmp_path):
    """A served store stays readable by Spark: a read sees what Kafka clients have produced so
    far, and a later read sees what they produced after it."""
    kafka = pytest.importorskip("kafka")
    from logstore.kafka.server import KafkaServer

    root = str(tmp_path / "served")
    with KafkaServer(root, ("127.0.0.1", 0)) as server:
        producer = kafka.KafkaProducer(bootstrap_servers=server.bootstrap_servers)
        try:
            for i in range(50):
                producer.send("live", value=b"first %d" % i)
            producer.flush(10)
            first = read(spark, root, subscribe="live").collect()
            for i in range(20):
                producer.send("live", value=b"second %d" % i)
            producer.flush(10)
            second = read(spark, root, subscribe="live").collect()
        finally:
            producer.close()
    assert sorted((r.offset, r.value) for r in first) == [(i, b"first %d" % i) for i in range(50)]
    assert sorted((r.offset, r.value) for r in second) == \
        [(i, b"first %d" % i) for i in range(50)] + [(50 + i, b"second %d" % i) for i in range(20)]


def test_a_user_specified_schema_reads_only_its_columns(spark, store):
    """pyspark's Python source API has no column pruning; a schema naming some of the source's
    columns (any order) makes the source build and hand over only those."""
    root, expected = store
    df = (spark.read.format("logstore").option("path", root).option("subscribe", "plain")
          .schema("value binary, offset long").load())
    assert df.columns == ["value", "offset"]
    got = sorted(((row.offset, row.value or b"") for row in df.collect()))
    want = sorted((r.offset, r.value or b"") for p in range(3) for r in expected[("plain", p)])
    assert got == want
    total = df.selectExpr("count(*) AS n", "sum(length(value)) AS bytes").first()
    assert (total.n, total.bytes) == (len(want), sum(len(r.value) for p in range(3) for r in expected[("plain", p)]
                                                     if r.value is not None))
    with pytest.raises(Exception, match="user-specified schema"):
        (spark.read.format("logstore").option("path", root).option("subscribe", "plain")
         .schema("value string").load().count())


def test_read_committed_leaves_out_aborted_and_open_transactions(spark, tmp_path):
    """kafka.isolation.level=read_committed (as Spark's Kafka source): the rows are what
    Log.iter(isolation_level="read_committed") returns, over aborted transactions in several
    segments and an open one; read_uncommitted (the default) returns every data record."""
    root = str(tmp_path / "txn")
    with LogStore(root, maintenance=False) as s:
        s.create_topic("t", 2, segment_bytes=2048)
        for p in range(2):
            log = s.partition("t", p)
            seq = {1: 0, 2: 0}
            for i in range(40):
                pid = 1 + i % 2
                log.append_batch([b"t%d-%d-%d" % (p, i, j) for j in range(3)], producer_id=pid, producer_epoch=0,
                                 base_sequence=seq[pid], transactional=True)
                seq[pid] += 3
                log.append(b"plain %d-%d" % (p, i))
                log.append_txn_marker(pid, 0, commit=i % 3 != 0)
            log.append_batch([b"open %d" % p], producer_id=3, producer_epoch=0, base_sequence=0, transactional=True)
            log.append(b"after the open one %d" % p)
        committed = {p: [(r.offset, r.value) for r in s.partition("t", p).iter(isolation_level="read_committed")]
                     for p in range(2)}
        everything = {p: [(r.offset, r.value) for r in s.partition("t", p).iter()] for p in range(2)}
    rows = read(spark, root, subscribe="t", **{"kafka.isolation.level": "read_committed"}) \
        .select("partition", "offset", "value").collect()
    got = {p: sorted((r.offset, bytes(r.value)) for r in rows if r.partition == p) for p in range(2)}
    assert got == committed and all(len(v) > 40 for v in got.values())
    values_only = read(spark, root, subscribe="t", **{"kafka.isolation.level": "read_committed"}).select("value")
    assert sorted(bytes(r.value) for r in values_only.collect()) == sorted(v for p in range(2) for _, v in committed[p])
    rows = read(spark, root, subscribe="t").select("partition", "offset", "value").collect()
    assert {p: sorted((r.offset, bytes(r.value)) for r in rows if r.partition == p) for p in range(2)} == everything
    with pytest.raises(Exception, match="read_uncommitted or read_committed"):
        read(spark, root, subscribe="t", **{"kafka.isolation.level": "serializable"}).count()
