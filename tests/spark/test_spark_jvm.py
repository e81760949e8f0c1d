"""The Spark JVM reader (logstore-spark.jar, Java) against the Python source and the store's own reads.

The session of conftest.py has the jar on ``spark.jars``, so ``format("logstore")`` is the JVM
provider: ``reader=jvm`` insists on its batch reader, ``reader=python`` asks for the Python
source's. Every expectation comes from ``Log.iter`` / ``Log.read`` or from the Python source;
the JVM reader is never its own oracle."""

from __future__ import annotations

import datetime
import json
import os
import re
import shutil
import struct
import zlib

import pytest

from logstore import LogStore
from logstore.spark import JarNotBuiltError, jar_path

try:
    jar_path()
except JarNotBuiltError as exc:  # (make builds it only when a Java JDK is there)
    pytest.skip(f"the Spark JVM reader is not built: {exc}", allow_module_level=True)

T0 = 1_700_000_000_000  # ms
CODECS = ("none", "gzip", "snappy", "lz4", "zstd")
ROW = ("key", "value", "topic", "partition", "offset", "timestamp", "timestampType", "headers")


def frame(spark, root, reader, **options):
    r = spark.read.format("logstore").option("path", root).option("reader", reader)
    for key, value in options.items():
        r = r.option(key, value)
    return r.load()


def rows(df):
    """The rows as plain tuples (headers as (key, value) tuples), sorted by topic, partition, offset."""
    out = []
    for r in df.collect():
        d = r.asDict()
        if d.get("headers") is not None:
            d["headers"] = [(h["key"], None if h["value"] is None else bytes(h["value"])) for h in d["headers"]]
        for name in ("key", "value"):
            if d.get(name) is not None:
                d[name] = bytes(d[name])
        out.append(tuple(d[c] for c in df.columns))
    order = [df.columns.index(c) for c in ("topic", "partition", "offset") if c in df.columns]
    return sorted(out, key=lambda t: tuple(t[i] for i in order))


def scan_of(df) -> str:
    return df._jdf.queryExecution().executedPlan().toString()


def utc(ms: int) -> datetime.datetime:
    return datetime.datetime.fromtimestamp(ms / 1000, datetime.timezone.utc).replace(tzinfo=None)


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """A topic per codec (2 partitions, small segments, dense index entries), a compacted topic
    with gaps and tombstones, a transactional topic (control records, an aborted transaction)
    and a LogAppendTime topic; returns (root, {(topic, partition): Log.iter() records})."""
    root = str(tmp_path_factory.mktemp("spark-jvm") / "store")
    expected = {}
    with LogStore(root, maintenance=False) as s:
        for codec in CODECS:
            s.create_topic(codec, 2, compression_type=codec, segment_bytes=8 << 10, index_interval_bytes=512)
            for p in range(2):
                log = s.partition(codec, p)
                n = 0
                for b in range(14):
                    size = 1 + (b * 5 + p) % 30
                    ids = range(n, n + size)
                    log.append_batch(
                        [None if i % 17 == 5 else b"%s-%d-%d " % (codec.encode(), p, i) + b"v" * (i % 80) for i in ids],
                        [None if i % 4 == 0 else b"k%d" % (i % 50) for i in ids],
                        [[("h", b"%d" % i), ("empty", None)] if i % 9 == 0 else [] for i in ids],
                        timestamps=[T0 + 1000 * i for i in ids])
                    n += size
        s.create_topic("compacted", 1, cleanup_policy="compact", segment_bytes=2 << 10)
        log = s.partition("compacted", 0)
        for i in range(400):
            key = b"key-%d" % (i % 30) if i % 7 else b"unique-%d" % i
            log.append(b"value-%d" % i, key=key, timestamp=T0 + i)
        log.append(None, key=b"key-1", timestamp=T0 + 400)  # a tombstone
        log.roll()
        log.compact()
        s.create_topic("txn", 1, segment_bytes=2048)
        log = s.partition("txn", 0)
        for i in range(20):
            log.append_batch([b"t-%d-%d" % (i, j) for j in range(3)], producer_id=1, producer_epoch=0,
                             base_sequence=3 * i, transactional=True)
            log.append(b"plain %d" % i)
            log.append_txn_marker(1, 0, commit=i % 3 != 0)
        s.create_topic("appendtime", 1, message_timestamp_type="LogAppendTime")
        s.partition("appendtime", 0).append_batch([b"a%d" % i for i in range(50)])
        for topic in s.topics():
            for p in range(s.partitions_for(topic)):
                expected[(topic, p)] = list(s.partition(topic, p).iter())
    offsets = [r.offset for r in expected[("compacted", 0)]]
    assert offsets != list(range(offsets[0], offsets[0] + len(offsets)))  # the cleaner left gaps
    return root, expected


def test_format_logstore_is_the_jvm_reader_when_its_jar_is_on_the_classpath(spark, store):
    root, _ = store
    assert "LogstoreJvmScan" in scan_of(frame(spark, root, "auto", subscribe="none"))
    assert "LogstoreJvmScan" not in scan_of(frame(spark, root, "python", subscribe="none"))
    assert os.path.isfile(jar_path())


def test_identical_rows_on_every_codec_with_headers(spark, store):
    """The JVM and Python readers and Log.iter agree on every field of every row: each codec,
    null keys and values, headers with null values, explicit timestamps."""
    root, expected = store
    options = dict(subscribe=",".join(CODECS), includeHeaders="true")
    jvm = rows(frame(spark, root, "jvm", **options))
    assert jvm == rows(frame(spark, root, "python", **options))
    want = sorted(((r.key, r.value, t, p, r.offset, utc(r.timestamp), 0, [(k, v) for k, v in r.headers])
                   for (t, p), rs in expected.items() if t in CODECS for r in rs), key=lambda row: row[2:5])
    assert jvm == want and len(want) > 500


def test_compacted_log_control_records_and_log_append_time(spark, store):
    """Gaps in offsets and tombstones, control records (transaction markers) left out, an
    aborted transaction's records kept with read_uncommitted, LogAppendTime batches."""
    root, expected = store
    options = dict(subscribe="compacted,txn,appendtime")
    jvm = rows(frame(spark, root, "jvm", **options))
    assert jvm == rows(frame(spark, root, "python", **options))
    want = sorted(((r.key, r.value, t, p, r.offset, utc(r.timestamp), r.timestamp_type)
                   for (t, p), rs in expected.items() if t in ("compacted", "txn", "appendtime") for r in rs),
                  key=lambda row: row[2:5])
    assert jvm == want
    assert any(r[1] is None for r in jvm if r[2] == "compacted")  # tombstones
    assert {r[6] for r in jvm if r[2] == "appendtime"} == {1}


def test_offset_and_timestamp_ranges(spark, store):
    root, expected = store
    start = {"zstd": {"0": 10, "1": -2}}
    end = {"zstd": {"0": 150, "1": 7}}
    for options in (dict(subscribe="zstd", startingOffsets=json.dumps(start), endingOffsets=json.dumps(end)),
                    dict(subscribe="gzip", startingTimestamp=str(T0 + 1000 * 123 + 1),
                         endingTimestamp=str(T0 + 1000 * 300), maxRecordsPerPartition="30")):
        jvm = rows(frame(spark, root, "jvm", **options).select("partition", "offset", "value"))
        assert jvm == rows(frame(spark, root, "python", **options).select("partition", "offset", "value"))
        assert jvm
        # the same planning: as many input partitions (timestamp-found ranges split outside the search)
        planned = frame(spark, root, "jvm", **options).rdd.getNumPartitions()
        assert planned == frame(spark, root, "python", **options).rdd.getNumPartitions()
    lo, hi = T0 + 1000 * 123 + 1, T0 + 1000 * 300
    got = rows(frame(spark, root, "jvm", subscribe="gzip", startingTimestamp=str(lo), endingTimestamp=str(hi))
               .select("partition", "offset"))
    want = []
    for p in range(2):
        records = expected[("gzip", p)]
        first = next((r.offset for r in records if r.timestamp >= lo), len(records))
        last = next((r.offset for r in records if r.timestamp >= hi), len(records))
        want += [(p, o) for o in range(first, last)]
    assert got == sorted(want)


def test_pruned_columns_are_the_only_ones_read(spark, store):
    root, expected = store
    df = frame(spark, root, "jvm", subscribe="lz4").select("value", "offset")
    plan = scan_of(df)
    assert "LogstoreJvmScan" in plan and "key#" not in plan and "timestamp#" not in plan
    got = sorted((r.offset, None if r.value is None else bytes(r.value)) for r in df.collect())
    assert got == sorted((r.offset, r.value) for (t, _), rs in expected.items() if t == "lz4" for r in rs)
    # a user-specified schema, in its own order
    df = spark.read.format("logstore").option("path", root).option("subscribe", "lz4").schema(
        "offset long, value binary").load()
    assert sorted((r.offset, r.value and bytes(r.value)) for r in df.collect()) == got
    assert df.selectExpr("count(*)").first()[0] == len(got)


def test_pushed_filters_prune_partitions_and_offsets(spark, store):
    root, expected = store
    query = "partition = 1 AND offset >= 20 AND offset < 60 AND timestamp >= TIMESTAMP '{}' AND topic = 'snappy'".format(
        utc(T0 + 1000 * 30).strftime("%Y-%m-%d %H:%M:%S"))
    df = frame(spark, root, "jvm", subscribe="snappy,zstd").where(query)
    assert df.rdd.getNumPartitions() == 1  # one partition of one topic planned
    got = sorted(r.offset for r in df.collect())
    want = [r.offset for r in expected[("snappy", 1)] if 20 <= r.offset < 60 and r.timestamp >= T0 + 1000 * 30]
    assert got == want
    wanted = sum(r.offset in (3, 5, 200) for p in range(2) for r in expected[("snappy", p)])
    assert frame(spark, root, "jvm", subscribe="snappy").where("offset IN (3, 5, 200)").count() == wanted >= 4


def test_partitions_split_by_max_records_per_partition(spark, store):
    root, expected = store
    df = frame(spark, root, "jvm", subscribe="none,snappy", maxRecordsPerPartition="60")
    assert df.rdd.getNumPartitions() >= sum(len(expected[(t, p)]) // 60 for t in ("none", "snappy") for p in range(2))
    got = rows(df.select("topic", "partition", "offset", "key"))
    assert got == rows(frame(spark, root, "python", subscribe="none,snappy").select("topic", "partition", "offset", "key"))
    assert len(got) == sum(len(expected[(t, p)]) for t in ("none", "snappy") for p in range(2))


def test_a_corrupted_batch_fails_the_task_naming_file_and_position(spark, store, tmp_path):
    root, _ = store
    copy = str(tmp_path / "store")
    shutil.copytree(root, copy)
    part = os.path.join(copy, "none-0")
    first = sorted(f for f in os.listdir(part) if f.endswith(".log"))[0]
    path = os.path.join(part, first)
    with open(path, "r+b") as f:  # a byte of the second batch's records: its CRC no longer matches
        data = f.read()
        second = 12 + int.from_bytes(data[8:12], "big")
        f.seek(second + 70)
        f.write(bytes([data[second + 70] ^ 0xFF]))
    with pytest.raises(Exception, match=f"Record is corrupt in {path} at position {second}: CRC mismatch"):
        frame(spark, copy, "jvm", subscribe="none").count()
    with pytest.raises(Exception, match="corrupt"):
        frame(spark, copy, "python", subscribe="none").count()


def test_a_tiered_store_is_read_by_the_python_source(spark, tmp_path):
    """The JVM reader has no object store: reader=jvm refuses a tiered topic naming the Python
    source, reader=auto (the default) hands the read to it, and it reads every record."""
    root = str(tmp_path / "tiered")
    with LogStore(root, maintenance=False, remote_storage=f"file://{tmp_path / 'remote'}") as s:
        s.create_topic("t", 1, segment_bytes=2048, remote_storage_enable=True, local_retention_bytes=0,
                       retention_ms=-1, local_retention_ms=-1)
        log = s.partition("t", 0)
        for i in range(30):
            log.append_batch([b"%d-%d" % (i, j) for j in range(10)])
        assert s.run_maintenance()["remote_segments_copied"] > 0
        assert log.local_log_start_offset > 0
    with pytest.raises(Exception, match="Python source"):
        frame(spark, root, "jvm", subscribe="t").count()
    df = frame(spark, root, "auto", subscribe="t")
    assert "LogstoreJvmScan" not in scan_of(df)
    assert sorted(r.offset for r in df.select("offset").collect()) == list(range(300))


def test_read_committed_is_read_by_the_python_source(spark, store):
    root, _ = store
    options = {"subscribe": "txn", "kafka.isolation.level": "read_committed"}
    with pytest.raises(Exception, match="read_committed; the Python source reads it"):
        frame(spark, root, "jvm", **options).count()
    df = frame(spark, root, "auto", **options)
    assert "LogstoreJvmScan" not in scan_of(df)
    assert rows(df.select("offset", "value")) == rows(frame(spark, root, "python", **options).select("offset", "value"))


def test_a_bad_reader_option_fails_with_a_clear_message(spark, store):
    root, _ = store
    with pytest.raises(Exception, match="option 'reader' must be auto, jvm or python"):
        frame(spark, root, "fast", subscribe="none").count()


# ---------------------------------------------------------------------------------------------
# Damaged and unusual batches, built by hand: the JVM reader's outcome is the Python source's.

def _varint(n: int) -> bytes:
    u = ((n << 1) ^ (n >> 63)) & ((1 << 64) - 1)
    out = bytearray()
    while True:
        b, u = u & 0x7F, u >> 7
        if not u:
            return bytes(out + bytes([b]))
        out.append(b | 0x80)


def _record(delta: int, key: bytes | None, value: bytes | None, headers: bytes = b"\x00") -> bytes:
    body = b"\x00" + _varint(0) + _varint(delta)
    body += _varint(-1 if key is None else len(key)) + (key or b"")
    body += _varint(-1 if value is None else len(value)) + (value or b"")
    return _varint(len(body + headers)) + body + headers


def _batch(base: int, section: bytes, count: int, last_delta: int, attributes: int = 0) -> bytes:
    """A record batch (magic 2) with a correct CRC around whatever ``section`` and header say."""
    from logstore._native import lib

    after_crc = struct.pack(">hiqqqhii", attributes, last_delta, T0, T0, -1, -1, -1, count) + section
    crc = lib.ls_crc32c(0, after_crc, len(after_crc))
    return struct.pack(">qiibI", base, 9 + len(after_crc), 0, 2, crc) + after_crc


def _good(base: int, n: int) -> bytes:
    return _batch(base, b"".join(_record(i, b"k%d" % (base + i), b"v%d" % (base + i)) for i in range(n)), n, n - 1)


def _hand_store(root: str, bad: bytes, sealed: bool) -> tuple[str, int]:
    """Topic t (1 partition): offsets 0-4, then ``bad`` at offset 5, in segment 0; with ``sealed``
    a segment 10 (offset 10) follows, so that ``bad`` lies inside the readable log, else it is the
    last segment's tail. Returns segment 0's path and ``bad``'s position in it."""
    with LogStore(root, maintenance=False) as s:
        s.create_topic("t", 1)
    part = os.path.join(root, "t-0")
    for name in os.listdir(part):
        os.remove(os.path.join(part, name))
    first = _good(0, 5)
    path = os.path.join(part, "%020d.log" % 0)
    with open(path, "wb") as f:
        f.write(first + bad)
    if sealed:
        with open(os.path.join(part, "%020d.log" % 10), "wb") as f:
            f.write(_good(10, 1))
    return path, len(first)


def _outcome(spark, root, reader, **options):
    try:
        return "rows", rows(frame(spark, root, reader, subscribe="t", **options).drop("timestamp"))
    except Exception as exc:  # (a Py4J or Spark error wrapping the reader's)
        return "error", str(exc)


def _gzip_bomb(size: int) -> bytes:
    z = zlib.compressobj(1, zlib.DEFLATED, 31)
    chunk = bytes(1 << 20)
    return b"".join(z.compress(chunk) for _ in range(size >> 20)) + z.flush()


_KEY_OVERFLOW = b"\x00" + _varint(0) + _varint(0) + _varint(2**31 - 1) + b"xx" + _varint(2) + b"vv" + b"\x00"
_HEADER_OVERFLOW = _record(0, b"kk", b"vv", headers=_varint(1) + _varint(2**31 - 1) + b"hh" + _varint(1) + b"x")
DAMAGED = {
    # a 257 MiB gzip bomb, and a raw snappy block declaring 1.9 GB: past the 256 MiB bound
    "gzip-bomb": lambda: _batch(5, _gzip_bomb(257 << 20), 1, 0, attributes=1),
    "snappy-declared-size": lambda: _batch(5, bytes([0x80, 0x80, 0x80, 0x8A, 0x07]) + bytes(4), 1, 0, attributes=2),
    # a record count far above what the section can hold (no column sized for it)
    "huge-count": lambda: _batch(5, _record(0, b"k", b"v"), 200_000_000, 199_999_999),
    "count-above-records": lambda: _batch(5, _record(0, b"k", b"v"), 3, 2),
    # lengths near 2^31 (no int overflow)
    "key-length-overflow": lambda: _batch(5, _varint(len(_KEY_OVERFLOW)) + _KEY_OVERFLOW, 1, 0),
    "header-key-overflow": lambda: _batch(5, _HEADER_OVERFLOW, 1, 0),
    # the store's records rule: increasing offset deltas, nothing after the last record
    "duplicate-offset-delta": lambda: _batch(5, _record(0, b"k", b"a") + _record(0, b"k", b"b"), 2, 1),
    "trailing-bytes": lambda: _batch(5, _record(0, b"k", b"a") + b"\x01\x02\x03", 1, 0),
    "varint-past-record": lambda: _batch(5, _varint(3) + b"\x00\x00\xff" + bytes(4), 1, 0),
}


@pytest.mark.parametrize("sealed", [True, False], ids=["inside-the-log", "last-segment-tail"])
@pytest.mark.parametrize("case", sorted(DAMAGED))
def test_damaged_batches_read_as_the_python_source_reads_them(spark, tmp_path, case, sealed):
    """Inside the readable log a damaged batch fails both readers, the JVM one naming file and
    position (never an OutOfMemoryError, an endless loop or an ArrayIndexOutOfBounds); at the
    last segment's tail the store's log-end rule (ls_segment_scan: an uncompressed batch's records
    walked too) ends the log before it for both."""
    root = str(tmp_path / "store")
    path, position = _hand_store(root, DAMAGED[case](), sealed)
    jvm, python = _outcome(spark, root, "jvm", includeHeaders="true"), _outcome(spark, root, "python", includeHeaders="true")
    # (the log end walks no compressed batch's records: a bomb at the tail is inside the log)
    inside = sealed or case in ("gzip-bomb", "snappy-declared-size")
    assert jvm[0] == python[0] == ("error" if inside else "rows"), (jvm, python)
    if inside:
        assert f"Record is corrupt in {path} at position {position}: " in jvm[1]
        assert "corrupt" in python[1].lower()
        if case in ("varint-past-record", "trailing-bytes", "key-length-overflow"):
            assert "of the records section" in jvm[1]  # the byte where it went wrong
    else:
        assert jvm == python and [r[4] for r in jvm[1]] == list(range(5))


@pytest.mark.parametrize("codec", [1, 2, 3, 4])
def test_an_empty_compressed_batch_reads_as_nothing(spark, tmp_path, codec):
    """Count 0, no records section, the codec bits kept (as Kafka's cleaner leaves a batch it
    emptied): valid (FORMAT.md §2), no rows, for every codec."""
    root = str(tmp_path / "store")
    _hand_store(root, _batch(5, b"", 0, 0, attributes=codec), sealed=True)
    jvm = _outcome(spark, root, "jvm")
    assert jvm == _outcome(spark, root, "python")
    assert jvm[0] == "rows" and [r[4] for r in jvm[1]] == [0, 1, 2, 3, 4, 10]


def test_the_decompression_bound_is_the_python_sources():
    """RangeReader.MAX_DECOMPRESSED and the Python decoder's bound are one number in two homes."""
    from logstore.records.batch import MAX_DECOMPRESSED_BYTES

    java = os.path.join(os.path.dirname(jar_path()), "jvm", "RangeReader.java")
    with open(java) as f:
        shift = re.search(r"static final int MAX_DECOMPRESSED = (\d+) << (\d+);", f.read())
    assert shift and int(shift.group(1)) << int(shift.group(2)) == MAX_DECOMPRESSED_BYTES == 256 << 20


def test_timestamps_at_the_bottom_of_the_long_range(spark, tmp_path):
    root = str(tmp_path / "store")
    with LogStore(root, maintenance=False) as s:
        s.create_topic("t", 1, index_interval_bytes=64)
        for i in range(20):
            s.partition("t", 0).append_batch([b"x" * 50], timestamps=[T0 + i])
    for option in ("startingTimestamp", "endingTimestamp"):
        jvm = _outcome(spark, root, "jvm", **{option: str(-2**63)})
        assert jvm == _outcome(spark, root, "python", **{option: str(-2**63)})
        assert jvm[0] == "rows" and len(jvm[1]) == (20 if option == "startingTimestamp" else 0)


def test_a_flipped_length_field_sizes_no_window(spark, tmp_path):
    """A batch length near 2^31 in a big sealed segment (sparse, 1 GiB) is a damaged batch: the
    JVM reader reads no more than its usual window for it, and fails naming file and position."""
    root = str(tmp_path / "store")
    bad = bytearray(_good(5, 2))
    bad[8:12] = struct.pack(">i", 0x7FFFFFF0)
    path, position = _hand_store(root, bytes(bad), sealed=True)
    os.truncate(path, 1 << 30)
    jvm, python = _outcome(spark, root, "jvm"), _outcome(spark, root, "python")
    assert jvm[0] == python[0] == "error" and "corrupt" in python[1].lower()
    assert f"Record is corrupt in {path} at position {position}: batch of {0x7FFFFFF0 + 12} bytes truncated" in jvm[1]


@pytest.mark.parametrize("fail_on_data_loss", [True, False])
def test_segments_deleted_during_a_read(spark, tmp_path, fail_on_data_loss):
    """Retention deletes the segments [0, 20100) while the read is in segment 0 (its file stays
    readable through the open descriptor): offsets 20000-20099 are gone before the reader got to
    them. With failOnDataLoss it fails naming them, as PartitionView.scan does; without, it reads
    on from the new log start, as the Python source does (both readers' outcome is compared)."""
    from logstore.spark.plan import OffsetRange
    from logstore.spark.read import read_range

    def retention(root, keep=20100):
        """What retention does: the segments below ``keep`` deleted, the log start checkpointed
        there (a nested function: a Spark Python worker runs it, without this module)."""
        import os

        part = os.path.join(root, "t-0")
        for name in os.listdir(part):
            if name[:20].isdigit() and int(name[:20]) < keep:
                os.remove(os.path.join(part, name))
        with open(os.path.join(root, "log-start-offset-checkpoint"), "w") as f:
            f.write(f"0\n1\nt 0 {keep}\n")

    def build(root):
        with LogStore(root, maintenance=False) as s:
            s.create_topic("t", 1)
            log = s.partition("t", 0)
            for _ in range(100):  # 20 MB: more than the pipes from the JVM reader to the Python worker hold
                log.append_batch([b"x" * 200] * 200)
            log.roll()
            log.append_batch([b"y"] * 100)
            log.roll()
            log.append_batch([b"z"] * 100)

    # The Python source: its generator, the segments deleted after its first batch.
    root = str(tmp_path / "python")
    build(root)
    python = []
    try:
        for b in read_range(OffsetRange(root, "t", 0, 0, 20200, fail_on_data_loss=fail_on_data_loss, columns=("offset",))):
            python += b.column("offset").to_pylist()
            if len(python) == b.num_rows:
                retention(root)
        python = ("rows", python)
    except Exception as exc:
        python = ("error", str(exc))

    # The JVM reader: the segments deleted by the Python worker that takes its first rows.
    root = str(tmp_path / "jvm")
    build(root)

    def delete_on_first_row(it, root=root):
        for i, row in enumerate(it):
            if i == 0:
                retention(root)
            yield row.offset

    df = frame(spark, root, "jvm", subscribe="t", failOnDataLoss=str(fail_on_data_loss).lower()).select("offset", "value")
    try:
        jvm = ("rows", df.rdd.mapPartitions(delete_on_first_row).collect())
    except Exception as exc:
        jvm = ("error", str(exc))
    if fail_on_data_loss:
        assert jvm[0] == python[0] == "error"
        assert "t-0: offsets from 20000 are gone (the log starts at 20100" in jvm[1]
        assert "t-0: offsets from 20000 are gone (the log starts at 20100)" in python[1]
    else:
        assert jvm == python == ("rows", list(range(20000)) + list(range(20100, 20200)))


def test_a_preallocated_index_zero_tail_reads_and_splits_as_the_python_source(spark, store, tmp_path):
    """The offset and time indexes of the partition, each given a preallocated index's zero tail
    (10 MB, sparse): the entries in use are the same for both readers (seek, split, timestamps)."""
    root, _ = store
    copy = str(tmp_path / "store")
    shutil.copytree(root, copy)
    part = os.path.join(copy, "gzip-0")
    for name in os.listdir(part):
        if name.endswith((".index", ".timeindex")):
            os.truncate(os.path.join(part, name), 10 << 20)
    for start in (dict(startingOffsets=json.dumps({"gzip": {"0": 40, "1": -2}})),
                  dict(startingTimestamp=str(T0 + 1000 * 123 + 1))):
        jvm = frame(spark, copy, "jvm", subscribe="gzip", maxRecordsPerPartition="25", **start)
        python = frame(spark, copy, "python", subscribe="gzip", maxRecordsPerPartition="25", **start)
        assert rows(jvm.select("partition", "offset")) == rows(python.select("partition", "offset"))
        assert jvm.rdd.getNumPartitions() == python.rdd.getNumPartitions() > 2
