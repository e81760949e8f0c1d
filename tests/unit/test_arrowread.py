"""Log.read_arrow / iter_arrow and LogStore.read_arrow: the same records as Log.iter, in the Spark
Kafka source's schema, for any range and choice of columns; bounded batches; errors; pandas,
polars and DuckDB on the result."""

from __future__ import annotations

import datetime

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pa = pytest.importorskip("pyarrow")

from logstore import LogStore  # noqa: E402
from logstore.records.arrow import COLUMNS, DEFAULT_COLUMNS, ROWS_PER_BATCH, schema  # noqa: E402
from logstore.errors import CorruptRecordError, OffsetOutOfRangeError  # noqa: E402

_UTC = datetime.timezone.utc


def expected(log, start=None, end=None, columns=DEFAULT_COLUMNS, max_records=None):
    """What read_arrow should hold, built from Log.iter's Records."""
    rows = list(log.iter(start, end))[:max_records]
    values = {
        "key": [r.key for r in rows], "value": [r.value for r in rows], "topic": [log.topic] * len(rows),
        "partition": [log.partition] * len(rows), "offset": [r.offset for r in rows],
        "timestamp": [datetime.datetime.fromtimestamp(r.timestamp / 1000, _UTC) for r in rows],
        "timestampType": [r.timestamp_type for r in rows],
        "headers": [[{"key": k, "value": v} for k, v in r.headers] for r in rows],
    }
    return {c: values[c] for c in columns}


@pytest.fixture
def store(tmp_path):
    with LogStore(str(tmp_path / "store")) as s:
        yield s


def fill(log, batches=5, per_batch=1000, codec=None):
    for b in range(batches):
        keys = [b"k%d" % i if i % 4 else None for i in range(per_batch)]
        values = [b"v%d-%d" % (b, i) * (1 + i % 7) if i % 9 else None for i in range(per_batch)]
        headers = [[("h", b"%d" % i)] if i % 5 == 0 else [] for i in range(per_batch)]
        log.append_batch(values, keys=keys, headers=headers, compression=codec)


def test_the_whole_log_as_a_table_holds_what_iter_reads(store):
    store.create_topic("t", 1, segment_bytes=60_000)  # several segments
    log = store.partition("t", 0)
    fill(log, 6)
    fill(log, 2, codec="zstd")
    fill(log, 2, codec="gzip")
    assert len(log.segments) > 2
    table = log.read_arrow()
    assert table.schema == schema() and table.num_rows == log.log_end_offset == 10_000
    assert table.to_pydict() == expected(log)
    with_headers = log.read_arrow(columns=list(COLUMNS))
    assert with_headers.to_pydict() == expected(log, columns=COLUMNS)


def test_ranges_columns_and_caps(store):
    store.create_topic("t", 1)
    log = store.partition("t", 0)
    fill(log, 3)
    assert log.read_arrow(1500, 2600).to_pydict() == expected(log, 1500, 2600)
    assert log.read_arrow(2999).column("offset").to_pylist() == [2999]
    assert log.read_arrow(10, max_records=5, columns=["value", "offset"]).to_pydict() == \
        expected(log, 10, 15, columns=["value", "offset"])
    # columns come in the schema's order whatever the order asked
    assert log.read_arrow(0, 2, columns=["offset", "key"]).schema.names == ["key", "offset"]
    empty = log.read_arrow(3000)
    assert empty.num_rows == 0 and empty.schema == schema()
    assert log.read_arrow(5, 5).num_rows == 0 and log.read_arrow(max_records=0).num_rows == 0
    assert log.read_arrow(2990, 10**9).num_rows == 10  # an end past the log end: the log end


def test_bad_arguments_are_refused_with_their_reason(store):
    store.create_topic("t", 1)
    log = store.partition("t", 0)
    fill(log, 1)
    with pytest.raises(ValueError, match="unknown column"):
        log.read_arrow(columns=["offset", "size"])
    with pytest.raises(ValueError, match="not the string"):
        log.read_arrow(columns="offset")
    with pytest.raises(ValueError, match="twice"):
        log.read_arrow(columns=["offset", "offset"])
    with pytest.raises(OffsetOutOfRangeError):
        log.read_arrow(1001)
    with pytest.raises(ValueError, match="max_records"):
        log.read_arrow(max_records=-1)


def test_batches_are_bounded_and_appends_after_the_call_are_not_read(store):
    store.create_topic("t", 1)
    log = store.partition("t", 0)
    fill(log, 100)  # 100,000 records
    batches = log.iter_arrow(columns=["offset"])
    first = next(batches)
    fill(log, 1)  # after the call: past its end
    sizes = [first.num_rows] + [b.num_rows for b in batches]
    assert sum(sizes) == 100_000
    assert max(sizes) <= ROWS_PER_BATCH + 1000  # one decoder chunk (plus the batch straddling it)
    assert len(sizes) >= 100_000 // (ROWS_PER_BATCH + 1000)


def test_retention_moving_the_log_start_past_a_reader_is_an_error(store):
    store.create_topic("t", 1, segment_bytes=100_000)
    log = store.partition("t", 0)
    fill(log, 100)  # more than two decoder chunks: the reader reads on after the deletion
    batches = log.iter_arrow(columns=["offset"])
    next(batches)
    log.delete_records_before(log.log_end_offset - 10)
    with pytest.raises(OffsetOutOfRangeError, match="log start moved"):
        list(batches)


def test_a_damaged_batch_is_reported_not_returned(store):
    store.create_topic("t", 1, segment_bytes=100_000)
    log = store.partition("t", 0)
    fill(log, 10)
    sealed = log.segments[0]
    log.close()
    path = f"{log.path}/{sealed.base_offset:020d}.log"
    with open(path, "r+b") as f:
        f.seek(5000)
        byte = f.read(1)
        f.seek(5000)
        f.write(bytes([byte[0] ^ 0xFF]))
    store.close()
    with LogStore(store.root) as again:
        with pytest.raises(CorruptRecordError):
            again.partition("t", 0).read_arrow(columns=["offset"])


def test_the_schema_is_the_spark_sources():
    pytest.importorskip("pyspark")
    from pyspark.sql.pandas.types import to_arrow_schema

    from logstore.spark.options import schema_struct

    assert schema(COLUMNS) == to_arrow_schema(schema_struct(True), timezone="UTC")
    assert schema() == to_arrow_schema(schema_struct(False), timezone="UTC")


def test_a_topic_by_partitions_offsets_and_timestamps(store):
    store.create_topic("t", 3)
    for p in range(3):
        log = store.partition("t", p)
        log.append_batch([b"early %d" % p] * 10, timestamps=[1_000 + i for i in range(10)])
        log.append_batch([b"late %d" % p] * 10, timestamps=[5_000 + i for i in range(10)])
    table = store.read_arrow("t")
    assert table.num_rows == 60 and table.column("partition").to_pylist() == [0] * 20 + [1] * 20 + [2] * 20
    assert store.read_arrow("t", partitions=[2], start=15).column("offset").to_pylist() == list(range(15, 20))
    some = store.read_arrow("t", start={1: 18}, end={0: 2, 2: 0}, columns=["partition", "offset"])
    assert list(zip(*some.to_pydict().values())) == [(0, 0), (0, 1), (1, 18), (1, 19)]
    late = store.read_arrow("t", start_timestamp=5_005, columns=["partition", "offset"])
    assert late.num_rows == 15 and set(late.column("offset").to_pylist()) == set(range(15, 20))
    early = store.read_arrow("t", end_timestamp=1_003, columns=["offset"])
    assert early.column("offset").to_pylist() == [0, 1, 2] * 3
    assert store.read_arrow("t", start_timestamp=9_999).num_rows == 0
    with pytest.raises(Exception, match="nowhere"):
        store.read_arrow("nowhere")


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(sizes=st.lists(st.integers(1, 300), min_size=1, max_size=6), data=st.data())
def test_any_range_and_columns_match_iter(tmp_path_factory, sizes, data):
    with LogStore(str(tmp_path_factory.mktemp("prop"))) as store:
        store.create_topic("p", 1, segment_bytes=data.draw(st.sampled_from([4096, 1 << 20])))
        log = store.partition("p", 0)
        for n in sizes:
            values = data.draw(st.lists(st.one_of(st.none(), st.binary(max_size=50)), min_size=n, max_size=n))
            keys = data.draw(st.lists(st.one_of(st.none(), st.binary(max_size=8)), min_size=n, max_size=n))
            log.append_batch(values, keys=keys, compression=data.draw(st.sampled_from([None, "zstd", "lz4"])))
        end = log.log_end_offset
        start = data.draw(st.integers(0, end))
        stop = data.draw(st.integers(start, end + 3))
        cap = data.draw(st.one_of(st.none(), st.integers(0, end)))
        columns = data.draw(st.lists(st.sampled_from(COLUMNS), min_size=1, unique=True))
        got = log.read_arrow(start, stop, columns, cap)
        ordered = [c for c in COLUMNS if c in columns]
        assert got.to_pydict() == expected(log, start, min(stop, end), ordered, cap)


def test_pandas_polars_and_duckdb_read_the_table(store):
    store.create_topic("clicks", 2)
    for p in range(2):
        store.partition("clicks", p).append_batch([b"x" * (p + 1)] * 100, keys=[b"user-%d" % (i % 3) for i in range(100)])
    table = store.read_arrow("clicks")
    pandas = pytest.importorskip("pandas")
    frame = table.to_pandas()
    assert isinstance(frame, pandas.DataFrame) and len(frame) == 200
    assert frame.groupby("partition")["value"].apply(lambda v: v.str.len().sum()).to_dict() == {0: 100, 1: 200}
    polars = pytest.importorskip("polars")
    counts = polars.from_arrow(table).group_by("key").len().sort("key")
    assert counts.rows() == [(b"user-0", 68), (b"user-1", 66), (b"user-2", 66)]
    duckdb = pytest.importorskip("duckdb")
    con = duckdb.connect()
    con.register("clicks", table)
    assert con.sql('select "partition", count(*), max("offset") from clicks group by 1 order by 1').fetchall() == \
        [(0, 100, 99), (1, 100, 99)]


def _anonymous_kib() -> int:
    """This process's anonymous resident memory (the mapped segment pages are file-backed and
    the kernel may drop them at will: they do not count)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1])
    raise AssertionError("no RssAnon in /proc/self/status")


@pytest.mark.slow
def test_reading_a_log_over_2_gib_holds_constant_memory(tmp_path):
    """Log.iter_arrow and Log.iter over 2.2 GiB of records (make soak): the anonymous memory
    stays within a few record batches' worth, whatever the log's size."""
    log_dir = tmp_path / "big-0"
    from logstore import Log

    value = b"m" * 1000
    with Log.open(str(log_dir), segment_bytes=256 << 20) as log:
        for _ in range(2200):
            log.append_batch([value] * 1000)
        total = log.log_end_offset
        assert log.size_in_bytes > 2.2e9
        before = _anonymous_kib()
        peak = before
        rows = 0
        for i, batch in enumerate(log.iter_arrow(columns=["offset", "value"])):
            rows += batch.num_rows
            if i % 8 == 0:
                peak = max(peak, _anonymous_kib())
            del batch
        assert rows == total
        arrow_growth = peak - before
        peak = before = _anonymous_kib()
        count = 0
        for count, _ in enumerate(log.iter(), 1):
            if count % 100_000 == 0:
                peak = max(peak, _anonymous_kib())
        assert count == total
        iter_growth = peak - before
    # One Arrow batch of 32k rows of 1 kB values is 32 MB; a log read held whole would be 2.2 GB.
    assert arrow_growth < 200_000, f"iter_arrow grew anonymous memory by {arrow_growth} KiB"
    assert iter_growth < 200_000, f"iter grew anonymous memory by {iter_growth} KiB"


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(sizes=st.lists(st.integers(1, 300), min_size=1, max_size=8), data=st.data())
def test_chunks_decoded_in_pairs_match_iter(tmp_path_factory, monkeypatch, sizes, data):
    """With small decoder chunks, read_arrow decodes many chunk pairs (the second in a helper
    thread): across batch and segment boundaries, compressed batches and compaction's gaps, the
    table is what iter reads; the serial loop (one core, or max_records) agrees."""
    from logstore.records import arrow as arrowread

    monkeypatch.setattr(arrowread, "ROWS_PER_BATCH", data.draw(st.sampled_from([1, 7, 64, 999])))
    with LogStore(str(tmp_path_factory.mktemp("pairs"))) as store:
        compact = data.draw(st.booleans())
        store.create_topic("p", 1, segment_bytes=data.draw(st.sampled_from([4096, 1 << 20])),
                           cleanup_policy="compact" if compact else "delete")
        log = store.partition("p", 0)
        for n in sizes:
            values = data.draw(st.lists(st.one_of(st.none(), st.binary(max_size=50)), min_size=n, max_size=n))
            keys = [b"k%d" % data.draw(st.integers(0, 20)) for _ in range(n)]
            log.append_batch(values, keys=keys, compression=data.draw(st.sampled_from([None, None, "zstd"])))
        if compact:
            log.roll()
            log.compact(now_ms=2**62)
        end = log.log_end_offset
        start = data.draw(st.integers(log.log_start_offset, end))
        assert log.read_arrow(start).to_pydict() == expected(log, start)
        monkeypatch.setattr("os.cpu_count", lambda: 1)  # the serial loop
        assert log.read_arrow(start).to_pydict() == expected(log, start)


def test_the_last_pair_of_chunks_is_split_evenly(store, monkeypatch):
    """Less than two chunks left, the two threads get half each (not a whole chunk and the
    rest), so that at a read's end neither waits the other's whole chunk out."""
    from logstore.log.log import _pair_mid
    from logstore.records import arrow as arrowread

    assert _pair_mid(0, 250, 100) == 100
    assert _pair_mid(200, 250, 100) == 225
    assert _pair_mid(200, 251, 100) == 226
    assert _pair_mid(200, 400, 100) == 300
    assert _pair_mid(7, 8, 100) == 8  # one row left: the first chunk takes it
    monkeypatch.setattr(arrowread, "ROWS_PER_BATCH", 100)
    store.create_topic("t", 1)
    log = store.partition("t", 0)
    fill(log, batches=5, per_batch=50)
    sizes = [b.num_rows for b in log.iter_arrow(columns=["offset"])]
    assert sizes == [100, 100, 25, 25]
    assert log.read_arrow().to_pydict() == expected(log, 0)


def test_damage_found_by_the_helper_thread_is_reported(store, monkeypatch):
    from logstore.records import arrow as arrowread

    monkeypatch.setattr(arrowread, "ROWS_PER_BATCH", 1000)
    store.create_topic("t", 1)
    log = store.partition("t", 0)
    fill(log, 6)  # batches of 1000: chunk pairs [0, 1000) + [1000, 2000), ...
    path = f"{log.path}/{log.segments[0].base_offset:020d}.log"
    store.close()
    with open(path, "r+b") as f:
        data = f.read()
        at = data.index(b"v3-10")  # in the fourth batch: the second chunk of the second pair
        f.seek(at)
        f.write(b"V")
    with LogStore(store.root) as again:
        with pytest.raises(CorruptRecordError):
            again.partition("t", 0).read_arrow(columns=["offset"])
        batches = again.partition("t", 0).iter_arrow(0, 3000, columns=["offset"])
        assert sum(b.num_rows for b in batches) == 3000  # the damage lies past the range
