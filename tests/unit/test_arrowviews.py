"""read_arrow / iter_arrow with ``views=True``: BinaryView keys and values pointing into pinned
maps of the segment files (logstore.pinnedmap). The same records as Log.read; tables that outlive
every change of the files they point into (truncation, recovery, compaction, retention, closing,
growth, sealing), checked in a subprocess so that a SIGBUS shows; pandas, polars and DuckDB
answering the same queries as over the binary table; the C view writer's bounds checks."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pa = pytest.importorskip("pyarrow")

from logstore import Log, LogStore  # noqa: E402
from logstore._native import ffi, lib  # noqa: E402
from logstore.pinnedmap import PinnedMap, in_place_allowed, replace_file  # noqa: E402
from logstore.records.arrow import COLUMNS, schema  # noqa: E402

SRC = os.path.join(os.path.dirname(__file__), "..", "..", "src")


def records_of(log, start=None):
    """(offset, key, value, headers) of every record from ``start``, through Log.read."""
    out = []
    offset = log.log_start_offset if start is None else start
    while offset < log.log_end_offset:
        got = log.read(offset, 1 << 20)
        if not got:
            break
        out.extend((r.offset, r.key, r.value, [(k, v) for k, v in r.headers]) for r in got)
        offset = got[-1].offset + 1
    return out


def rows_of(table):
    d = table.to_pydict()
    headers = d.get("headers", [[]] * table.num_rows)
    return [(o, k, v, [(h["key"], h["value"]) for h in hs])
            for o, k, v, hs in zip(d["offset"], d["key"], d["value"], headers)]


value_strategy = st.one_of(st.none(), st.binary(max_size=12), st.binary(min_size=13, max_size=120))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(sizes=st.lists(st.integers(1, 60), min_size=1, max_size=6), data=st.data())
def test_views_hold_what_log_read_returns(tmp_path_factory, monkeypatch, sizes, data):
    """Random logs (batch sizes, null keys and values, short values inline and long ones in the
    data buffer, headers, codecs, several segments, small decoder chunks so that chunk pairs and
    segment ends fall anywhere): the view table's rows are Log.read's records, and it equals the
    binary table cast to binary_view. Segments that cannot be pinned are copied, one span per
    chunk, with the same result."""
    from logstore.records import arrow as arrowread
    from logstore.segment import LogSegment

    if data.draw(st.booleans()):
        monkeypatch.setattr(LogSegment, "view_map", lambda self: None)

    monkeypatch.setattr(arrowread, "ROWS_PER_BATCH", data.draw(st.sampled_from([7, 100, 32768])))
    if data.draw(st.booleans()):
        monkeypatch.setattr("os.cpu_count", lambda: 1)  # the serial loop
    with Log.open(str(tmp_path_factory.mktemp("views")), segment_bytes=data.draw(st.sampled_from([4096, 1 << 20]))) as log:
        for n in sizes:
            values = data.draw(st.lists(value_strategy, min_size=n, max_size=n))
            keys = data.draw(st.lists(value_strategy, min_size=n, max_size=n))
            headers = data.draw(st.lists(st.lists(st.tuples(st.text(max_size=3), st.binary(max_size=8)), max_size=1),
                                         min_size=n, max_size=n))
            log.append_batch(values, keys=keys, headers=headers,
                             compression=data.draw(st.sampled_from([None, None, "zstd", "lz4", "gzip"])))
        start = data.draw(st.integers(0, log.log_end_offset))
        table = log.read_arrow(start, columns=list(COLUMNS), views=True)
        table.validate(full=True)
        assert table.schema == schema(COLUMNS, views=True)
        assert rows_of(table) == records_of(log, start)
        binary = log.read_arrow(start, columns=list(COLUMNS))
        assert table.equals(binary.cast(schema(COLUMNS, views=True)))


def test_views_point_into_the_segment_not_into_copies(tmp_path):
    """An uncompressed table's long values lie in one data buffer per segment: the pinned map,
    as long as the segment file (no copy was made); a compressed batch's into its decompressed
    bytes; both iter_arrow and the store's read_arrow give views."""
    with LogStore(str(tmp_path / "s")) as store:
        store.create_topic("t", 1, segment_bytes=1 << 20)
        log = store.partition("t", 0)
        for _ in range(30):
            log.append_batch([os.urandom(100) for _ in range(100)], keys=[b"key-%016d" % i for i in range(100)])
        log.append_batch([b"z" * 200] * 100, compression="zstd")
        table = store.read_arrow("t", views=True)
        assert table.schema.field("value").type == pa.binary_view()
        chunks = table.column("value").chunks
        plain = {c.buffers()[2].address for c in chunks[:-1]}
        assert len(plain) == 1 and chunks[0].buffers()[2].size == log.segments[0].size  # the active segment, pinned
        assert 100 * 200 < chunks[-1].buffers()[2].size < 100 * 220  # the decompressed records
        batches = list(log.iter_arrow(columns=["key"], views=True))
        assert batches[0].schema.field("key").type == pa.binary_view()
        assert rows_of(table) == records_of(log)


# ---------------------------------------------------------------------- tables outliving changes
_SCRIPT = textwrap.dedent(r"""
    import os, sys, gc
    from logstore import Log
    scenario, path = sys.argv[1], sys.argv[2]
    prealloc = scenario in ("seal_trim", "recovery")
    if scenario.startswith("store_"):  # a LogStore's logs are shared by the processes opening it
        from logstore import LogStore
        store = LogStore(path)
        store.create_topic("t", 1, segment_bytes=200_000)
        log = store.partition("t", 0)
    else:
        log = Log.open(path, segment_bytes=200_000, file_delete_delay_ms=0, preallocate=prealloc,
                       cleanup_policy="compact" if scenario == "compaction" else "delete")
    for b in range(40):
        log.append_batch([b"value-%d-%d-" % (b, i) * (1 + i % 9) for i in range(100)],
                         keys=[b"k%d" % (i % 10) if i % 7 or scenario == "compaction" else None for i in range(100)])
    table = log.read_arrow(views=True)
    before = table.to_pylist()
    sealed = log.segments[1].base_offset + 150  # inside a sealed segment, mid-batch
    if scenario == "truncate_sealed":
        log.truncate_to(sealed)
        for b in range(40):  # new bytes where the old ones were
            log.append_batch([b"X" * 500] * 100)
    elif scenario == "truncate_active":
        log.truncate_to(log.log_end_offset - 150)
        log.append_batch([b"Y" * 500] * 300)
    elif scenario == "truncate_twice":  # a pinned sealed segment made active again, cut again
        log.truncate_to(log.segments[1].next_offset)
        log.truncate_to(sealed)
        log.append_batch([b"W" * 500] * 300)
    elif scenario == "store_truncate":
        log.truncate_to(log.log_end_offset - 150)
        log.truncate_to(sealed)
        log.append_batch([b"S" * 500] * 300)
    elif scenario == "store_other_process":  # another process cuts the files this one maps
        import subprocess
        other = ("import sys; from logstore import LogStore\n"
                 "with LogStore(sys.argv[1]) as s:\n"
                 "    log = s.partition('t', 0)\n"
                 "    log.truncate_to(log.log_end_offset - 150)\n"
                 "    log.truncate_to(int(sys.argv[2]))\n"
                 "    log.append_batch([b'O' * 500] * 300)\n")
        subprocess.run([sys.executable, "-c", other, path, str(sealed)], check=True)
        assert log.read(sealed, 1000)[0].value == b"O" * 500
    elif scenario == "truncate_fully":
        log.truncate_fully_and_start_at(7)
        log.append_batch([b"Z" * 500] * 300)
    elif scenario == "compaction":
        log.roll()
        log.compact(now_ms=2**62)
        log.run_due_tasks()
    elif scenario == "retention":
        log.delete_records_before(log.log_end_offset - 10)
        log.enforce_retention()
        log.run_due_tasks()
    elif scenario == "growth":
        for b in range(400):
            log.append_batch([b"G" * 1000] * 100)
    elif scenario == "seal_trim":
        log.roll()
    elif scenario == "closed":
        log.close()
        import shutil; shutil.rmtree(path)
    elif scenario == "recovery":  # the process 'dies', the log is opened again and recovered
        log._abandon()
        log = Log.open(path, segment_bytes=200_000, preallocate=True)
        log.truncate_to(sealed)
        log.append_batch([b"R" * 500] * 300)
        log.close()
    else:
        raise SystemExit("unknown scenario " + scenario)
    gc.collect()
    after = table.to_pylist()
    table.validate(full=True)
    sys.exit(0 if after == before else 3)
""")


@pytest.mark.parametrize("scenario", ["truncate_sealed", "truncate_active", "truncate_twice", "truncate_fully",
                                      "store_truncate", "store_other_process",
                                      "compaction", "retention", "growth", "seal_trim", "closed", "recovery"])
def test_a_table_outlives_every_change_of_its_files(tmp_path, scenario):
    """Build a view table, change the log (truncate a sealed or the active segment and write
    new bytes over the cut, compact, delete by retention, grow the active map, seal a
    preallocated segment, close and remove the directory, recover after a crash), then read the
    whole table: it still holds what it held, and no SIGBUS (run in a child process). On a
    LogStore (shared logs) too, with another process truncating the files this one maps."""
    env = dict(os.environ, PYTHONPATH=os.path.abspath(SRC))
    done = subprocess.run([sys.executable, "-c", _SCRIPT, scenario, str(tmp_path / "log-0")], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"exit {done.returncode}: {done.stderr[-2000:]}"


def test_the_log_reads_the_truncated_file_not_the_pinned_one(tmp_path):
    """A truncation of a pinned file replaces it: the log reads and appends on the new file,
    reopens cleanly from it, and the table still reads the old one."""
    path = str(tmp_path / "p-0")
    with Log.open(path, segment_bytes=50_000) as log:
        for b in range(20):
            log.append_batch([b"v%d-%d" % (b, i) * 20 for i in range(50)])
        table = log.read_arrow(views=True)
        old = table.column("value").to_pylist()
        log.truncate_to(333)
        log.append_batch([b"new"] * 10)
        expected = records_of(log)
        assert [r[0] for r in expected] == list(range(343))
        assert [r[2] for r in expected[333:]] == [b"new"] * 10
    assert not [n for n in os.listdir(path) if n.endswith(".tmp")]
    with Log.open(path) as again:
        assert records_of(again) == expected
    assert table.column("value").to_pylist() == old


# ---------------------------------------------------------------------- the pin itself
def test_a_pinned_file_is_not_changed_in_place_in_this_process_or_another(tmp_path):
    path = str(tmp_path / "f")
    with open(path, "wb") as f:
        f.write(b"abcdefgh" * 1000)
    st = os.stat(path)
    with in_place_allowed(path) as free:
        assert free
    pinned = PinnedMap(path, (st.st_dev, st.st_ino), 8000)
    assert ffi.buffer(ffi.cast("char *", pinned.address), 8)[:] == b"abcdefgh"
    with in_place_allowed(path) as free:
        assert not free
    other = subprocess.run([sys.executable, "-c", "import sys; sys.path.insert(0, sys.argv[2]);"
                            "from logstore.pinnedmap import in_place_allowed\n"
                            "with in_place_allowed(sys.argv[1]) as free: sys.exit(7 if free else 0)", path,
                            os.path.abspath(SRC)], timeout=60)
    assert other.returncode == 0
    fd = os.open(path, os.O_RDWR)
    try:
        os.close(replace_file(path, fd, 4, b"XY"))
    finally:
        os.close(fd)
    with open(path, "rb") as f:
        assert f.read() == b"abcdXY"
    assert ffi.buffer(ffi.cast("char *", pinned.address), 16)[:] == b"abcdefgh" * 2  # the old inode
    del pinned
    with in_place_allowed(path) as free:
        assert free


def test_a_replaced_file_is_not_pinned_as_the_segment(tmp_path):
    path = str(tmp_path / "f")
    with open(path, "wb") as f:
        f.write(b"x" * 100)
    with pytest.raises(FileNotFoundError):
        PinnedMap(path, (0, 0), 100)
    st = os.stat(path)
    with pytest.raises(OSError):
        PinnedMap(path, (st.st_dev, st.st_ino), 101)


# ---------------------------------------------------------------------- other readers
def test_pandas_polars_and_duckdb_answer_the_same_over_views(tmp_path):
    with LogStore(str(tmp_path / "s")) as store:
        store.create_topic("clicks", 2, segment_bytes=20_000)
        for p in range(2):
            log = store.partition("clicks", p)
            for b in range(10):
                log.append_batch([b"page-%d-" % (i % 13) * (1 + i % 5) if i % 11 else None for i in range(100)],
                                 keys=[b"user-%d" % (i % 3) if i % 4 else None for i in range(100)],
                                 compression="zstd" if b % 3 == 0 else None)
        views = store.read_arrow("clicks", views=True)
        binary = store.read_arrow("clicks")
    pandas = pytest.importorskip("pandas")

    def frame_summary(t):
        f = t.to_pandas()
        return (len(f), f["value"].map(lambda v: -1 if v is None else len(v)).sum(),
                sorted(f["key"].map(lambda k: b"<null>" if k is None else bytes(k)).value_counts().to_dict().items()))

    assert frame_summary(views) == frame_summary(binary)
    assert isinstance(views.to_pandas(), pandas.DataFrame)
    polars = pytest.importorskip("polars")

    def polars_summary(t):
        df = polars.from_arrow(t)
        return (df.group_by("key").agg(polars.col("value").bin.size().sum(), polars.len()).sort("key").rows(),
                df.filter(polars.col("value").bin.starts_with(b"page-1")).height)

    assert polars_summary(views) == polars_summary(binary)
    duckdb = pytest.importorskip("duckdb")
    query = ('select key, "partition", count(*), sum(octet_length(value)), min(value), max("offset") '
             'from t group by all order by all')
    con = duckdb.connect()
    con.register("t", views)
    got = con.sql(query).fetchall()
    con.register("t", binary)
    assert got == con.sql(query).fetchall()


# ---------------------------------------------------------------------- the C view writer
def test_the_view_writer_checks_every_span():
    buf = b"0123456789abcdefghijklmnopqrstuv"
    pos = ffi.new("int32_t[]", [0, 4, 2, 0])
    lens = ffi.new("int32_t[]", [3, 20, -1, 0])
    views = ffi.new("uint8_t[]", 64)
    validity = ffi.new("uint8_t[]", 1)
    nulls = ffi.new("int32_t *")
    assert lib.ls_binary_views(buf, len(buf), 0, len(buf), pos, lens, 4, 0, views, validity, nulls) == 0
    out = bytes(ffi.buffer(views, 64))
    assert out[:16] == (3).to_bytes(4, "little") + b"012" + bytes(9)
    assert out[16:32] == (20).to_bytes(4, "little") + b"4567" + bytes(4) + (4).to_bytes(4, "little")
    assert out[32:48] == bytes(16) and out[48:] == bytes(16)
    assert validity[0] == 0b1011 and nulls[0] == 1
    # the decoder's own views, taken: lengths must agree, long values lie in the data buffer
    taken = ffi.new("uint8_t[]", 64)
    assert lib.ls_take_views(views, lens, 4, len(buf), taken, validity, nulls) == 0
    assert bytes(ffi.buffer(taken, 64)) == out and validity[0] == 0b1011 and nulls[0] == 1
    assert lib.ls_take_views(views, lens, 4, 23, taken, validity, nulls) == lib.LS_ERR_NOSPACE
    other = ffi.new("int32_t[]", [3, 21, -1, 0])
    assert lib.ls_take_views(views, other, 4, len(buf), taken, validity, nulls) == lib.LS_ERR_CORRUPT
    # a long value outside the data buffer [8, 32): the caller must copy
    assert lib.ls_binary_views(buf, len(buf), 8, 24, pos, lens, 4, 0, views, validity, nulls) == lib.LS_ERR_NOSPACE
    # spans outside the buffer, bad lengths, a data buffer past the bytes
    for p, n in ((30, 5), (-1, 2), (0, -2), (33, 0)):
        bad_pos, bad_len = ffi.new("int32_t[]", [p]), ffi.new("int32_t[]", [n])
        assert lib.ls_binary_views(buf, len(buf), 0, len(buf), bad_pos, bad_len, 1, 0, views, validity,
                                   nulls) == lib.LS_ERR_CORRUPT
    assert lib.ls_binary_views(buf, len(buf), 8, 25, pos, lens, 4, 0, views, validity, nulls) == lib.LS_ERR_ARG
    lo, hi = ffi.new("int64_t *"), ffi.new("int64_t *")
    assert lib.ls_view_span(pos, lens, 4, 24, lo, hi) == 0 and (lo[0], hi[0]) == (4, 24)
    assert lib.ls_view_span(pos, lens, 1, 24, lo, hi) == 0 and lo[0] == hi[0]
    assert lib.ls_view_span(pos, lens, 4, 23, lo, hi) == lib.LS_ERR_CORRUPT  # (past the buffer)
    assert lib.ls_view_span(pos, lens, 4, -1, lo, hi) == lib.LS_ERR_ARG


@pytest.mark.slow
def test_iterating_views_over_2_gib_holds_constant_memory(tmp_path):
    """iter_arrow(views=True) over 2.2 GiB (make soak): the batches hold maps of the segments,
    not copies, and once dropped they release them: the anonymous memory and the number of maps
    stay bounded whatever the log's size."""
    import gc

    from test_arrowread import _anonymous_kib

    value = b"m" * 1000
    with Log.open(str(tmp_path / "big-0"), segment_bytes=256 << 20) as log:
        for _ in range(2200):
            log.append_batch([value] * 1000)
        assert log.size_in_bytes > 2.2e9
        before = peak = _anonymous_kib()
        maps = 0
        rows = 0
        for i, batch in enumerate(log.iter_arrow(columns=["offset", "value"], views=True)):
            rows += batch.num_rows
            if i % 8 == 0:
                peak = max(peak, _anonymous_kib())
                maps = max(maps, sum(1 for o in gc.get_objects() if isinstance(o, PinnedMap)))
            del batch
        assert rows == log.log_end_offset
    assert peak - before < 200_000, f"iter_arrow(views=True) grew anonymous memory by {peak - before} KiB"
    assert maps <= 3, f"{maps} pinned maps alive at once"


# ---------------------------------------------------------------------- a pinned truncation's state
@pytest.mark.parametrize("pinned", [False, True])
def test_a_truncation_keeps_the_leader_epoch_stamped_on_appends(tmp_path, pinned):
    """The epoch the Log assigned is stamped on appends after a truncation, whether it cut the
    active file in place or replaced a pinned one (a new appender), or activated an earlier
    segment."""
    from logstore.records.batch import parse_header
    log = Log.open(str(tmp_path / "p"), segment_bytes=1024)
    log.assign_leader_epoch(3)
    for _ in range(20):
        log.append_batch([b"v" * 50] * 2)
    assert len(log.segments) > 2
    table = log.read_arrow(views=True) if pinned else None
    end = log.segments[-1].base_offset + 1
    log.truncate_to(end)  # (into the active segment)
    assert log.append_batch([b"z" * 50]) == end
    assert parse_header(log.read_raw(end), 0).partition_leader_epoch == 3
    log.truncate_to(3)  # (into the first, sealed segment)
    log.append(b"y")
    assert parse_header(log.read_raw(3), 0).partition_leader_epoch == 3
    assert table is None or table.num_rows == 40
    log.close()


@pytest.mark.parametrize("pinned", [False, True])
def test_a_truncation_of_the_active_segment_cuts_its_time_index(tmp_path, pinned):
    """The time index entries of removed records go with them (the appender's count of them
    is what truncates), so a time lookup finds the records appended after the truncation."""
    ts = 1_700_000_000_000
    v = b"y" * 200
    log = Log.open(str(tmp_path / "p"), segment_bytes=1 << 20, index_interval_bytes=512)
    for i in range(100):
        log.append_batch([v, v], keys=[b"k%d" % i, None], timestamps=[ts + i, ts + i])
    table = log.read_arrow(views=True) if pinned else None
    log.truncate_to(20)
    for i in range(5):
        log.append_batch([v, v], keys=[b"n%d" % i, None], timestamps=[ts + 500 + i] * 2)
    assert log.offset_for_timestamp(ts + 15) == 20
    assert log.offset_for_timestamp(ts + 501) == 22
    assert log.offset_for_timestamp(ts + 9) == 18
    assert [r.key for r in log.read(20, 1 << 20)][:2] == [b"n0", None]
    assert table is None or table.num_rows == 200
    log.close()
    with Log.open(str(tmp_path / "p")) as log:
        assert log.offset_for_timestamp(ts + 15) == 20


@pytest.mark.parametrize("pinned,segment_bytes", [(False, 1 << 20), (True, 1 << 20), (False, 2048)])
def test_a_group_commit_fsync_racing_a_truncation(tmp_path, pinned, segment_bytes):
    """A group-commit fsync runs outside the log's lock. A truncation meanwhile (replacing a
    pinned file's descriptor, cutting it in place, or removing the active segment for an
    earlier one) must neither let that fsync reach some other file that took the descriptor's
    number, nor let its target, read before the truncation, move the flushed offset and the
    recovery point past the new log end."""
    import threading
    import time

    from logstore import _fileio

    synced: list[str] = []
    started = threading.Event()

    class SlowSync(_fileio.FileOps):
        armed = False
        calls = 0

        def fdatasync(self, fd):
            SlowSync.calls += 1
            if SlowSync.armed and threading.current_thread().name == "appender":
                SlowSync.armed = False
                started.set()
                time.sleep(0.3)  # (a slow disk: the truncation runs now)
                synced.append(os.readlink(f"/proc/self/fd/{fd}"))
            os.fdatasync(fd)

    d = str(tmp_path / "p")
    with _fileio.install(SlowSync()):
        log = Log.open(d, flush_messages=1, segment_bytes=segment_bytes)
        for _ in range(50):
            log.append_batch([b"v" * 100] * 2)
        table = log.read_arrow(views=True) if pinned else None
        errors = []

        def append():
            try:
                SlowSync.armed = True
                log.append(b"x")
            except Exception as exc:  # (reported below)
                errors.append(exc)

        thread = threading.Thread(target=append, name="appender")
        thread.start()
        assert started.wait(10)
        log.truncate_to(10)
        thread.join()
        assert errors == []
        assert len(synced) == 1 and synced[0].split(" ")[0].endswith(".log"), synced
        assert log.log_end_offset == 10
        assert log.recovery_point <= 10
        calls = SlowSync.calls
        log.append(b"y")  # (flush.messages=1: fsynced, its offset not taken for flushed already)
        assert SlowSync.calls == calls + 1
        assert log.recovery_point == 11
        log.close()
    with Log.open(d) as log:
        assert [r.offset for r in log.read(0, 1 << 20)][-2:] == [9, 10]
    assert table is None or table.num_rows == 100


# ---------------------------------------------------------------------- pins: descriptors, checks, copies
def _open_fds():
    return len(os.listdir("/proc/self/fd"))


def test_a_pinned_map_holds_one_descriptor_and_keeps_its_lock(tmp_path):
    path = str(tmp_path / "f")
    with open(path, "wb") as f:
        f.write(b"abcdefgh" * 1000)
    st = os.stat(path)
    before = _open_fds()
    pinned = PinnedMap(path, (st.st_dev, st.st_ino), 8000)
    assert _open_fds() == before + 1  # (the map's own: the lock is on its open file description)
    with in_place_allowed(path) as free:
        assert not free
    del pinned
    assert _open_fds() == before
    with in_place_allowed(path) as free:
        assert free


def test_a_pin_check_that_cannot_open_the_file_replaces_it(tmp_path):
    """in_place_allowed cannot learn the pin state (EMFILE): it says no, and a truncation
    replaces the file (safe whatever the state) instead of failing or taking the log offline."""
    import errno

    from logstore import _fileio

    class NoDescriptors(_fileio.FileOps):
        armed = False

        def open(self, path, flags, mode=0o644):
            if NoDescriptors.armed and flags == os.O_RDONLY and path.endswith(".log"):
                raise OSError(errno.EMFILE, "Too many open files", path)
            return super().open(path, flags, mode)

    log = Log.open(str(tmp_path / "p"))
    for i in range(20):
        log.append_batch([b"v%d" % i * 20] * 2)
    [path] = [os.path.join(tmp_path, "p", n) for n in os.listdir(tmp_path / "p") if n.endswith(".log")]
    inode = os.stat(path).st_ino
    with _fileio.install(NoDescriptors()):
        NoDescriptors.armed = True
        with in_place_allowed(path) as free:
            assert not free
        log.truncate_to(15)
        NoDescriptors.armed = False
    assert os.stat(path).st_ino != inode  # (replaced, not cut in place)
    assert log.log_end_offset == 15
    assert log.append(b"x") == 15
    assert [r.offset for r in log.read(0, 1 << 20)] == list(range(16))
    log.close()


def test_replace_file_copies_without_the_kernel_copy_and_cleans_up_a_failure(tmp_path):
    import errno

    from logstore import _fileio

    path = str(tmp_path / "f")
    data = bytes(range(256)) * 9000  # (more than one pread chunk)
    with open(path, "wb") as f:
        f.write(data)

    class ShortCopy(_fileio.FileOps):
        """copy_file_range stopping early without an error (returns 0), fsync failing on demand."""
        fail_fsync = False

        def copy_range(self, src, dst, position, count):
            return 0 if position >= 4096 else super().copy_range(src, dst, position, min(count, 4096 - position))

        def fsync(self, fd):
            if ShortCopy.fail_fsync:
                raise OSError(errno.EIO, "I/O error")
            super().fsync(fd)

    fd = os.open(path, os.O_RDWR)
    try:
        with _fileio.install(ShortCopy()):
            ShortCopy.fail_fsync = True
            with pytest.raises(OSError):
                replace_file(path, fd, 5000, b"tail")
            assert os.listdir(tmp_path) == ["f"]  # (no .tmp left)
            with open(path, "rb") as f:
                assert f.read() == data
            ShortCopy.fail_fsync = False
            os.close(replace_file(path, fd, len(data) - 10, b"tail"))
        with open(path, "rb") as f:
            assert f.read() == data[:-10] + b"tail"
        with pytest.raises(OSError):  # (the descriptor's file is shorter than what is kept)
            replace_file(path, fd, len(data) + 1)
        assert sorted(os.listdir(tmp_path)) == ["f"]
    finally:
        os.close(fd)


def _pinned_segments(directory):
    pinned = []
    for name in sorted(os.listdir(directory)):
        if name.endswith(".log"):
            with in_place_allowed(os.path.join(directory, name)) as free:
                if not free:
                    pinned.append(name)
    return pinned


def test_a_table_pins_only_the_segments_its_long_values_point_into(tmp_path):
    """Keys and values of up to 12 bytes are held in their views: a table of them pins no
    segment file; one with a longer value pins the segment holding it."""
    d = str(tmp_path / "p")
    with Log.open(d, segment_bytes=4096) as log:
        for i in range(400):
            log.append_batch([b"short%d" % i] * 5, keys=[b"k"] * 5)
        log.append_batch([b"a value longer than twelve bytes"])
        assert len(log.segments) > 3
        short = log.read_arrow(views=True, end=log.log_end_offset - 1)
        assert _pinned_segments(d) == []
        assert rows_of(short) == records_of(log)[:-1]
        assert short.column("value").type == pa.binary_view()
        long = log.read_arrow(views=True, start=log.log_end_offset - 3)
        assert _pinned_segments(d) == [f"{log.segments[-1].base_offset:020d}.log"]
        assert rows_of(long) == records_of(log)[-3:]
