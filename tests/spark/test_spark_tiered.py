"""The "logstore" Spark source over tiered topics (tiered storage, KIP-405): the first half of each
partition only in the object store, read by the executors straight from it (a local directory,
and S3 through SeaweedFS). Spark must return exactly the rows Log.read_arrow returns; the
planner's remote ranges are checked without Spark."""

from __future__ import annotations

import datetime

import pyarrow as pa
import pytest

from logstore import LogStore
from logstore.spark.plan import Planner
from logstore.spark.read import read_range

T0 = 1_700_000_000_000
TOPIC_CONFIG = dict(segment_bytes=4096, index_interval_bytes=512, remote_storage_enable=True,
                    local_retention_bytes=0, retention_ms=-1, local_retention_ms=-1)
SCHEMA = ["key", "value", "topic", "partition", "offset", "timestamp", "timestampType", "headers"]


def fill(root, remote_storage, remote_storage_options=None, partitions=2, n=800):
    """Topic "t": n records per partition (null keys and values, headers, timestamps that go
    back now and then), the first half copied to the remote tier and dropped locally; returns
    {partition: Log.read_arrow() with headers} and the first local offsets."""
    expected, local = {}, {}
    with LogStore(root, maintenance=False, remote_storage=remote_storage,
                  remote_storage_options=remote_storage_options) as store:
        store.create_topic("t", partitions, **TOPIC_CONFIG)
        for half in range(2):
            for p in range(partitions):
                log = store.partition("t", p)
                for start in range(half * n // 2, (half + 1) * n // 2, 20):
                    ids = range(start, start + 20)
                    log.append_batch([None if i % 13 == 5 else b"%d-%d " % (p, i) + b"v" * (i % 70) for i in ids],
                                     [None if i % 4 == 0 else b"k%d" % (i % 50) for i in ids],
                                     [[("h", b"%d" % i), ("none", None)] if i % 9 == 0 else [] for i in ids],
                                     timestamps=[T0 + 1000 * i - (5000 if i % 100 == 7 else 0) for i in ids])
            if half == 0:
                done = store.run_maintenance()
                assert done["remote_errors"] == 0 and done["remote_segments_copied"] >= partitions * 2
        for p in range(partitions):
            log = store.partition("t", p)
            local[p] = log.local_log_start_offset
            assert log.log_start_offset == 0 and n // 2 - 100 < local[p] <= n // 2
            expected[p] = log.read_arrow(columns=SCHEMA)
    return expected, local


@pytest.fixture(scope="module")
def tiered(tmp_path_factory):
    base = tmp_path_factory.mktemp("spark-tiered")
    root = str(base / "store")
    expected, local = fill(root, f"file://{base / 'remote'}")
    return root, expected, local


def read(spark, root, **options):
    reader = spark.read.format("logstore").option("path", root).option("subscribe", "t").option("includeHeaders", "true")
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load()


def rows_of(table: pa.Table) -> list[tuple]:
    """The rows as Spark collects them (timestamps naive UTC, headers as (key, value) pairs)."""
    out = []
    for r in table.to_pylist():
        ts = r["timestamp"].astimezone(datetime.timezone.utc).replace(tzinfo=None)
        headers = [(h["key"], h["value"]) for h in r["headers"]]
        out.append((r["key"], r["value"], r["topic"], r["partition"], r["offset"], ts, r["timestampType"], headers))
    return out


def collected(df) -> list[tuple]:
    return sorted((((r.key and bytes(r.key)), (r.value and bytes(r.value)), r.topic, r.partition, r.offset,
                    r.timestamp, r.timestampType, [(h.key, h.value and bytes(h.value)) for h in r.headers])
                   for r in df.collect()), key=by_offset)


def by_offset(row: tuple) -> tuple[int, int]:
    return row[3], row[4]


def plan(planner):
    return planner.split([r for tp in planner.selected() if (r := planner.bounds(tp)) is not None])


def test_spark_reads_every_column_of_a_tiered_topic_as_log_read_arrow(spark, tiered):
    root, expected, _ = tiered
    want = sorted((row for p in expected for row in rows_of(expected[p])), key=by_offset)
    assert collected(read(spark, root)) == want
    # pushed filters on offset and timestamp prune remote and local ranges alike
    low_ts = datetime.datetime.fromtimestamp((T0 + 300_000) / 1000, datetime.timezone.utc)
    filtered = read(spark, root, pruneOnPushdown="true").where("offset >= 120 AND offset < 700") \
        .where(f"timestamp >= TIMESTAMP '{low_ts.strftime('%Y-%m-%d %H:%M:%S')}'")
    cutoff = low_ts.replace(tzinfo=None)
    assert collected(filtered) == [row for row in want if 120 <= row[4] < 700 and row[5] >= cutoff]


def test_remote_ranges_are_planned_per_segment_and_pruned(tiered):
    root, expected, local = tiered
    planner = Planner({"path": root, "subscribe": "t", "includeHeaders": "true"}, None, False)
    ranges = plan(planner)
    for p in expected:
        mine = sorted((r for r in ranges if r.partition == p), key=lambda r: r.start)
        remote = [r for r in mine if r.local_from >= 0]
        # small segments go together (up to 128 MiB): one remote range, then the local one
        assert [(r.start, r.end, r.local_from) for r in mine] == [(0, local[p], local[p]), (local[p], 800, -1)]
        assert remote[0].remote_segments[0].start_offset == 0 and remote[0].remote_storage.startswith("file://")
        got = pa.Table.from_batches([b for r in mine for b in read_range(r)])
        assert got.equals(expected[p])
    # maxRecordsPerPartition cuts the remote part at segment starts and remote index entries
    planner = Planner({"path": root, "assign": '{"t":[0]}', "maxRecordsPerPartition": "30"}, None, False)
    ranges = plan(planner)
    assert len([r for r in ranges if r.local_from >= 0]) >= local[0] // 30
    assert [o for r in ranges for b in read_range(r) for o in b.column("offset").to_pylist()] == list(range(800))
    import pickle

    assert pickle.loads(pickle.dumps(planner)).split(ranges[:1]) == ranges[:1]  # (Spark ships the planner)
    # a pushed timestamp lower bound leaves out the remote segments whose records are all older
    planner = Planner({"path": root, "assign": '{"t":[0]}', "pruneOnPushdown": "true"}, None, False)
    from pyspark.sql.datasource import GreaterThanOrEqual

    list(planner.push([GreaterThanOrEqual(("timestamp",), T0 + 250_000)]))
    (remote, rest) = plan(planner)
    kept = remote.remote_segments
    assert kept and all(m.max_timestamp_ms >= T0 + 250_000 for m in kept) and kept[0].start_offset > 0
    offsets = [o for r in (remote, rest) for b in read_range(r) for o in b.column("offset").to_pylist()]
    assert offsets[0] <= 250 and offsets[-1] == 799 and offsets == sorted(set(offsets))
    # startingTimestamp and endingTimestamp inside the remote part
    planner = Planner({"path": root, "assign": '{"t":[1]}', "startingTimestamp": str(T0 + 100_000),
                       "endingTimestamp": str(T0 + 600_000)}, None, False)
    offsets = [o for r in plan(planner) for b in read_range(r) for o in b.column("offset").to_pylist()]
    assert offsets == list(range(100, 600))


def test_a_remote_tier_the_store_does_not_name_is_asked_for_when_planning(tiered, tmp_path):
    import os
    import shutil

    from logstore.spark.options import SparkOptionError

    root, _, _ = tiered
    copy = str(tmp_path / "copy")
    shutil.copytree(root, copy)
    os.unlink(os.path.join(copy, ".remote-storage"))
    with pytest.raises(SparkOptionError, match="remoteStorage"):
        plan(Planner({"path": copy, "subscribe": "t"}, None, False))
    planner = Planner({"path": copy, "subscribe": "t", "remoteStorage": f"file://{os.path.dirname(root)}/remote",
                       "remoteStorage.secret_access_key": "hush"}, None, False)
    ranges = plan(planner)
    assert ranges[0].remote_storage.endswith("/remote") and "hush" not in repr(ranges[0])


def test_read_committed_over_remote_transaction_indexes(tmp_path):
    root = str(tmp_path / "txn")
    with LogStore(root, maintenance=False, remote_storage=f"file://{tmp_path / 'remote'}") as store:
        store.create_topic("t", 1, **{**TOPIC_CONFIG, "segment_bytes": 2048})
        log = store.partition("t", 0)
        seq = {1: 0, 2: 0}
        for i in range(60):
            pid = 1 + i % 2
            log.append_batch([b"t%d-%d" % (i, j) for j in range(3)], producer_id=pid, producer_epoch=0,
                             base_sequence=seq[pid], transactional=True)
            seq[pid] += 3
            log.append(b"plain %d" % i)
            log.append_txn_marker(pid, 0, commit=i % 3 != 0)
        store.run_maintenance()
        assert log.local_log_start_offset > 100
        committed = [(r.offset, r.value) for r in log.iter(isolation_level="read_committed")]
    planner = Planner({"path": root, "subscribe": "t", "kafka.isolation.level": "read_committed"}, None, False)
    ranges = plan(planner)
    assert ranges[0].local_from > 0 and ranges[0].read_committed
    got = [(o, v) for r in ranges for b in read_range(r)
           for o, v in zip(b.column("offset").to_pylist(), b.column("value").to_pylist())]
    assert got == committed and len(got) == 60 * 3 * 2 // 3 + 60


@pytest.fixture(scope="module")
def s3_server(tmp_path_factory):
    from tiered.conftest import seaweedfs_or_skip  # the tiered tests' SeaweedFS (tests/ is on sys.path)

    server = seaweedfs_or_skip(str(tmp_path_factory.mktemp("seaweedfs")))
    try:
        yield server
    finally:
        server.kill()


def test_spark_reads_a_tiered_topic_from_s3(spark, s3_server, tmp_path):
    root = str(tmp_path / "store")
    url = f"s3://{s3_server.create_bucket()}"
    expected, local = fill(root, url, s3_server.options(), partitions=2, n=400)
    # The store remembers the URL and endpoint, not the credentials: the job gives them.
    credentials = {f"remoteStorage.{k}": v for k, v in s3_server.options().items() if k not in ("endpoint", "region")}
    df = read(spark, root, **credentials)
    assert collected(df) == sorted((row for p in expected for row in rows_of(expected[p])), key=by_offset)
    with pytest.raises(Exception, match="remote segment t-"):
        read(spark, root).count()  # no credentials: the object store refuses, naming the segment


def test_a_local_range_whose_segments_moved_to_the_remote_tier_meanwhile_reads_from_there(tmp_path):
    root = str(tmp_path / "moving")
    with LogStore(root, maintenance=False, remote_storage=f"file://{tmp_path / 'remote'}") as store:
        store.create_topic("t", 1, **TOPIC_CONFIG)
        log = store.partition("t", 0)
        for i in range(500):
            log.append(b"record %d " % i + b"x" * 40, timestamp=T0 + i)
        ranges = plan(Planner({"path": root, "subscribe": "t", "maxRecordsPerPartition": "200"}, None, False))
        assert all(r.local_from < 0 for r in ranges) and len(ranges) > 1  # planned while all local
        store.run_maintenance()  # copied, then dropped from the local disk
        assert log.local_log_start_offset > 300
        expected = [r.value for r in log.iter()]
    got = [v for r in ranges for b in read_range(r) for v in b.column("value").to_pylist()]
    assert got == expected


# ------------------------------------------------------------------ the second review's findings


def _plan_all(options):
    planner = Planner(options, None, False)
    planner.push([])
    ranges = [r for tp in planner.selected() if (r := planner.bounds(tp)) is not None]
    return planner.split(ranges)


def test_read_committed_hides_an_aborted_transaction_whose_marker_is_local(tmp_path):
    """The transaction's records are remote, its ABORT marker (and so its index entry) local."""
    with LogStore(tmp_path / "data", maintenance=False, remote_storage=f"file://{tmp_path}/remote") as store:
        store.create_topic("t", segment_bytes=1024, remote_storage_enable=True, local_retention_bytes=0,
                           retention_ms=-1, local_retention_ms=-1)
        log = store.partition("t", 0)
        for i in range(60):
            log.append(b"plain %d" % i + b"y" * 50)
        for i in range(20):
            log.append_batch([b"aborted-%d" % i + b"x" * 50], producer_id=1, producer_epoch=0, base_sequence=i,
                             transactional=True)
        log.append_txn_marker(1, 0, commit=False)
        store.run_maintenance()
        assert log.local_log_start_offset > 60  # the aborted records are remote, the marker local
        for i in range(5):
            log.append(b"tail %d" % i)
        committed = [(r.offset, r.value) for r in log.iter(isolation_level="read_committed")]
    for extra in ({}, {"maxRecordsPerPartition": "20"}):
        ranges = _plan_all({"path": str(tmp_path / "data"), "subscribe": "t",
                            "kafka.isolation.level": "read_committed", **extra})
        got = [(o, v) for r in ranges for b in read_range(r)
               for o, v in zip(b.column("offset").to_pylist(), b.column("value").to_pylist())]
        assert got == committed, extra


def test_a_read_committed_range_whose_segments_moved_during_the_task_reads_once(tmp_path, monkeypatch):
    """Local retention takes the range's segments (copied meanwhile) during the task, and the
    query's columns have no offset: the rest comes from the tier, filtered once."""
    from dataclasses import replace

    import logstore.spark.read as read

    store = LogStore(tmp_path / "data", maintenance=False, remote_storage=f"file://{tmp_path}/remote")
    try:
        store.create_topic("t", segment_bytes=1024, remote_storage_enable=True, local_retention_bytes=0,
                           retention_ms=-1, local_retention_ms=-1)
        log = store.partition("t", 0)
        for i in range(40):
            log.append_batch([b"a%d" % i + b"x" * 50], producer_id=1, producer_epoch=0, base_sequence=i,
                             transactional=True)
            if i % 10 == 9:
                log.append_txn_marker(1, 0, commit=(i // 10) % 2 == 1)
        for i in range(40):
            log.append(b"p%d" % i + b"y" * 50)
        committed = [r.value for r in log.iter(isolation_level="read_committed")]
        ranges = [replace(r, columns=("value",)) for r in _plan_all(
            {"path": str(tmp_path / "data"), "subscribe": "t", "kafka.isolation.level": "read_committed"})]
        assert all(r.local_from < 0 for r in ranges)  # planned all local
        computed = read._aborted_batches

        def then_tier(r):
            out = computed(r)
            store.run_maintenance()  # the segments are copied and leave the local disk right now
            return out

        monkeypatch.setattr(read, "_aborted_batches", then_tier)
        got = [v for r in ranges for b in read_range(r) for v in b.column("value").to_pylist()]
        assert log.local_log_start_offset > 0
        assert got == committed
    finally:
        store.close()


@pytest.mark.parametrize("tiered", [False, True])
def test_a_starting_timestamp_inside_a_segment_cut_by_delete_records(tmp_path, tiered):
    config = dict(segment_bytes=1024, retention_ms=-1)
    if tiered:
        config.update(remote_storage_enable=True, local_retention_bytes=0, local_retention_ms=-1)
    with LogStore(tmp_path / "data", maintenance=False, remote_storage=f"file://{tmp_path}/remote") as store:
        store.create_topic("t", **config)
        log = store.partition("t", 0)
        for i in range(100):
            log.append(b"v%d" % i + b"y" * 50, timestamp=1000 + i)
        store.run_maintenance()
        log.delete_records_before(3)
    ranges = _plan_all({"path": str(tmp_path / "data"), "subscribe": "t", "startingTimestamp": "1001"})
    got = [o for r in ranges for b in read_range(r) for o in b.column("offset").to_pylist()]
    assert got == list(range(3, 100))  # ListOffsets' answer for 1001 is the log start, 3
