"""logview: read-only views of a store's files (what Spark's driver and executors use)."""

from __future__ import annotations

import os
import random

import pytest

from logstore import CorruptRecordError, LogStore, LogstoreError, UnknownTopicOrPartitionError
from logstore._native import lib
from logstore.store.views import DataLossError, LogEnd, PartitionView, SegmentPosition, StoreView


@pytest.fixture
def root(tmp_path):
    return str(tmp_path / "store")


class Rows:
    """A scan sink that keeps (offset, timestamp, key, value) of every row."""

    def __init__(self):
        self.rows = []

    def __call__(self, buf, out, n):
        for i in range(n):
            kl, vl = out.key_len[i], out.value_len[i]
            key = None if kl < 0 else bytes(buf[out.key_pos[i]:out.key_pos[i] + kl])
            value = None if vl < 0 else bytes(buf[out.value_pos[i]:out.value_pos[i] + vl])
            self.rows.append((out.offsets[i], out.timestamps[i], key, value))


def scan(view, start, end, **kw):
    sink = Rows()
    for _ in view.scan(start, end, sink, **kw):
        pass
    return [r for r in sink.rows if r[0] < end]


def fill(store, topic, n, *, codec=None, batch=None, seed=0, **config):
    store.create_topic(topic, 1, segment_bytes=16 << 10, index_interval_bytes=512,
                       **({"compression_type": codec} if codec else {}), **config)
    log = store.partition(topic, 0)
    rng = random.Random(seed)
    i = 0
    while i < n:
        k = min(n - i, batch or rng.randint(1, 40))
        log.append_batch([b"value-%d-" % j + b"x" * rng.randint(0, 300) for j in range(i, i + k)],
                         [b"key-%d" % j if j % 3 else None for j in range(i, i + k)],
                         timestamps=[1_000_000 + 10 * j for j in range(i, i + k)])
        i += k
    return log


def snapshot(path):
    out = {}
    for dirpath, _, files in os.walk(path):
        for name in files:
            st = os.stat(os.path.join(dirpath, name))
            out[os.path.join(dirpath, name)] = (st.st_size, st.st_mtime_ns)
    return out


@pytest.mark.parametrize("codec", [None, "zstd", "gzip"])
def test_scan_matches_log_reads_across_segments(root, codec):
    with LogStore(root, maintenance=False) as store:
        log = fill(store, "t", 3000, codec=codec)
        expected = [(r.offset, r.timestamp, r.key, r.value) for r in log.iter()]
        assert len(log.segments) > 3
        view = StoreView(root).partition("t", 0)
        assert view.log_end_offset() == log.log_end_offset == 3000
        assert view.log_start_offset() == 0
        assert scan(view, 0, 3000) == expected
        rng = random.Random(1)
        for _ in range(20):
            a = rng.randrange(0, 3000)
            b = rng.randrange(a, 3001)
            assert scan(view, a, b) == expected[a:b]
            # Any index entry is a valid place to start reading.
            for offset, segment, position in view.index_positions()[::7]:
                if a <= offset:
                    assert scan(view, offset, b, hint=SegmentPosition(segment, position)) == expected[offset:b]
                    break


def test_views_change_nothing_on_disk(root):
    with LogStore(root, maintenance=False) as store:
        fill(store, "t", 500)
        store.partition("t", 0).flush()
        before = snapshot(root)
        view = StoreView(root).partition("t", 0)
        view.log_end_offset()
        view.timestamp_bounds(1_000_500)
        scan(view, 0, 500)
        assert snapshot(root) == before


def test_log_end_ignores_a_torn_tail_and_the_zero_tail(root):
    with LogStore(root, maintenance=False) as store:
        log = fill(store, "t", 700)
        path = os.path.join(log.path, "%020d.log" % log.segments[-1].base_offset)
    view = StoreView(root).partition("t", 0)
    assert view.log_end_offset() == 700
    with open(path, "ab") as f:  # a batch header cut short, then garbage
        f.write(b"\0\0\0\0\0\0\x02\xbc\0\0\x01\0" + os.urandom(200))
    assert view.log_end_offset() == 700
    assert [r[0] for r in scan(view, 690, 700)] == list(range(690, 700))


@pytest.mark.parametrize("seed", range(3))
def test_log_end_of_a_long_tail_is_the_one_walk_of_the_segment(root, seed):
    # No offset index entry: the walk starts at 0 and reads the segment in many chunks, with
    # batches across their boundaries and some larger than a chunk.
    rng = random.Random(seed)
    with LogStore(root, maintenance=False) as store:
        store.create_topic("t", 1, segment_bytes=64 << 20, index_interval_bytes=1 << 30)
        log = store.partition("t", 0)
        while log.segments[-1].size < 3 << 20:
            if rng.random() < 0.05:
                log.append(b"L" * rng.randint(300 << 10, 900 << 10))
            else:
                log.append_batch([b"x" * rng.randint(0, 2000) for _ in range(rng.randint(1, 200))])
        expected = LogEnd(log.log_end_offset, 0, log.segments[-1].size)
        path = os.path.join(log.path, "%020d.log" % 0)
        assert os.path.getsize(path) > expected.position  # the active segment's zero tail
        assert StoreView(root).partition("t", 0).log_end() == expected
    view = StoreView(root).partition("t", 0)
    assert os.path.getsize(path) == expected.position  # trimmed at close
    assert view.log_end() == expected
    with open(path, "ab") as f:  # a torn header claiming 2 GiB (magic 2): no valid batch, no 2 GiB read
        f.write(bytes(8) + b"\x7f\xff\xff\xff" + bytes(4) + b"\x02" + os.urandom(100))
    assert view.log_end() == expected
    assert len(scan(view, expected.offset - 3, expected.offset)) == 3


def test_log_start_follows_delete_records(root):
    with LogStore(root, maintenance=False) as store:
        log = fill(store, "t", 1000)
        log.delete_records_before(123)
        view = StoreView(root).partition("t", 0)
        assert view.log_start_offset() == 123
        with pytest.raises(DataLossError, match="123"):
            scan(view, 100, 200)
        assert [r[0] for r in scan(view, 123, 130)] == list(range(123, 130))


def test_a_damaged_sealed_segment_is_reported_not_skipped(root):
    with LogStore(root, maintenance=False) as store:
        log = fill(store, "t", 3000, batch=10)
        first = log.segments[0]
        path = os.path.join(log.path, "%020d.log" % first.base_offset)
    with open(path, "r+b") as f:
        f.seek(first.size // 2)
        byte = f.read(1)
        f.seek(first.size // 2)
        f.write(bytes([byte[0] ^ 0x40]))
    view = StoreView(root).partition("t", 0)
    with pytest.raises(CorruptRecordError):
        scan(view, 0, 3000)


def test_timestamp_bounds_bracket_kafkas_list_offsets(root):
    with LogStore(root, maintenance=False) as store:
        log = fill(store, "t", 2000)
        view = StoreView(root).partition("t", 0)
        for target in [0, 1_000_000, 1_000_005, 1_003_333, 1_012_345, 1_019_990, 1_019_991, 10**12]:
            exact = log.offset_for_timestamp(target)
            low, high = view.timestamp_bounds(target)
            if exact is None:
                assert high is None
                continue
            assert low <= exact and (high is None or exact <= high), (target, low, exact, high)


def test_store_view_errors(root, tmp_path):
    with pytest.raises(LogstoreError, match="not a logstore data directory"):
        StoreView(str(tmp_path))
    with LogStore(root, maintenance=False) as store:
        store.create_topic("a", 2)
        store.create_topic("__internal", 1, internal=True)
    view = StoreView(root)
    assert view.topics() == ["a"] and view.topics(internal=True) == ["__internal", "a"]
    assert view.partitions("a") == 2
    with pytest.raises(UnknownTopicOrPartitionError):
        view.partitions("missing")
    with pytest.raises(UnknownTopicOrPartitionError):
        PartitionView(root, "a", 7)


def test_scan_raises_when_the_log_ends_before_the_planned_end(root):
    with LogStore(root, maintenance=False) as store:
        fill(store, "t", 100)
    view = StoreView(root).partition("t", 0)
    with pytest.raises(DataLossError, match="ends at offset 100"):
        scan(view, 50, 150)


def test_store_view_of_partition_directories_without_topic_files(tmp_path):
    from logstore import Log

    root = tmp_path / "dirs"
    for name, n in (("t-0", 3), ("t-2", 1)):
        with Log.open(root / name) as log:
            for i in range(n):
                log.append(b"%d" % i)
    before = snapshot(str(root))
    view = StoreView(str(root))
    assert view.kafka_log_dir and view.topics() == ["t"] and view.partitions("t") == 3
    ends = [view.partition("t", p).log_end_offset() for p in range(3)]
    assert ends == [3, 0, 1]
    assert scan(view.partition("t", 1), 0, 0) == []
    with pytest.raises(UnknownTopicOrPartitionError, match="has partitions 0..2; there is no partition 3"):
        view.partition("t", 3)
    assert snapshot(str(root)) == before and not (root / ".topics").exists()
    with LogStore(str(root), maintenance=False) as store:
        assert store.topics() == view.topics() and store.partitions_for("t") == view.partitions("t")
    assert not StoreView(str(root)).kafka_log_dir


def test_partition_view_of_a_directory_named_freely(tmp_path):
    from logstore import Log

    with Log.open(tmp_path / "audit") as log:
        log.append_batch([b"a", b"b"])
    view = PartitionView(str(tmp_path), "audit", -1, path=str(tmp_path / "audit"))
    assert (view.log_start_offset(), view.log_end_offset()) == (0, 2)
    assert [r[3] for r in scan(view, 0, 2)] == [b"a", b"b"]
    missing = PartitionView(str(tmp_path), "gone", 0, must_exist=False)
    assert missing.segments() == [] and missing.log_end() == LogEnd(0, -1, 0)


@pytest.mark.regression(reason="fixed: a view mapped a segment file by a size read just before a writer "
                               "trimmed it at a roll, and mmap refused the stale length (make test, Spark)")
def test_a_file_that_shrinks_before_it_is_mapped_is_mapped_as_it_is_now(tmp_path, monkeypatch):
    from logstore import _fileio
    from logstore.store import views

    path = tmp_path / "00000000000000000000.log"
    path.write_bytes(b"x" * 8192)
    real_fsize = _fileio.ops.fsize
    sizes = iter([16384])  # the first size read is stale: the file is shorter when it is mapped

    def fsize(fd):
        return next(sizes, None) or real_fsize(fd)

    monkeypatch.setattr(_fileio.ops, "fsize", fsize)
    with views._Mapped(str(path)) as data:
        assert len(data) == 8192


class _RollUnderTheView:
    """FileOps under which the writer rolls its active segment (trimming the .log to its
    data) right after a view first maps or preads a segment file: between the view learning
    the file's size and reading its bytes, the moment a writer in another process may pick."""

    @staticmethod
    def install(log, on=("mmap", "pread")):
        """``on``: the reads after which the writer rolls (the first of them)."""
        from logstore import _fileio

        class Ops(_fileio.FileOps):
            rolled = False

            def _roll_once(self, fd):
                active = os.path.join(log.path, "%020d.log" % log.segments[-1].base_offset)
                if not self.rolled and self.identity(fd) == self.path_identity(active):
                    self.rolled = True
                    log.roll()

            def mmap(self, fd, length, writable):
                mm = super().mmap(fd, length, writable)
                if not writable and "mmap" in on:
                    self._roll_once(fd)
                return mm

            def pread(self, fd, size, position):
                data = super().pread(fd, size, position)
                if "pread" in on:
                    self._roll_once(fd)
                return data

        return _fileio.install(Ops())


@pytest.mark.regression(reason="fixed: a view mapped the active segment whole, preallocated zero tail "
                               "included, and walked it to the end; a writer's roll trimmed the file to its "
                               "data meanwhile, and the walk touched pages past the new end: SIGBUS. Views "
                               "now map a segment only up to the end of its batches, found with pread")
@pytest.mark.parametrize("read", ["log_end", "last_stable_offset", "scan", "stats"])
def test_a_view_survives_the_writer_rolling_the_segment_under_it(tmp_path, read):
    def reader(log, directory, active):
        view = PartitionView(str(tmp_path), "t", 0)
        with _RollUnderTheView.install(log) as ops:
            if read == "log_end":
                answer = view.log_end_offset()
            elif read == "last_stable_offset":
                answer = view.last_stable_offset()
            elif read == "stats":  # (logstore stats, which walks every segment's batches)
                from logstore.tools.stats import stats

                found = stats(directory)[0]
                answer = found.log_end_offset if found.records == 100 else -1
            else:
                try:
                    scan(view, 0, 1 << 40)
                except DataLossError as exc:  # the range ends at the log end (the new segment
                    answer = 100 if "ends at offset 100" in str(exc) else -1  # was listed late)
        return ops.rolled and answer == 100

    _roll_under_a_reader(tmp_path, reader, "the view")


@pytest.mark.regression(reason="fixed: logstore dump and verify mapped a segment's .log whole, the active "
                               "segment's preallocated zero tail included, and walked it to the end; a writer's "
                               "roll trimmed the file meanwhile and the walk touched pages past the new end: "
                               "SIGBUS. They now map it only up to the end of its batches (views.SegmentBatches) "
                               "and read what follows with pread")
@pytest.mark.parametrize("moment", ["first read", "after the map"])
@pytest.mark.parametrize("tool", ["dump", "verify"])
def test_dump_and_verify_survive_the_writer_rolling_the_segment_under_them(tmp_path, tool, moment):
    from logstore.tools.dump import dump_file
    from logstore.tools.verify import verify

    def reader(log, directory, active):
        on = ("mmap", "pread") if moment == "first read" else ("mmap",)
        with _RollUnderTheView.install(log, on) as ops:
            if tool == "dump":
                items = list(dump_file(active, deep=True))
                records = sum(len(item["records"]) for item in items if item["kind"] == "batch")
                # (the roll trimmed the zero tail: nothing follows the batches any more)
                answer = records if [i["kind"] for i in items if i["kind"] != "batch"] == [] else -1
            else:
                report = verify(directory)
                answer = report.records if report.ok else -1
        return ops.rolled and answer == 100

    _roll_under_a_reader(tmp_path, reader, tool)


def _roll_under_a_reader(tmp_path, reader, what):
    """In a forked child (a SIGBUS kills it, not the test runner): a writer appends 100 records
    to t-0 (the active segment's file, an 8 MiB map, mostly zeros), then ``reader(log,
    directory, active segment path)`` reads while the writer rolls under it; the child exits 0
    when the reader said True and the log has rolled to two segments."""
    import signal

    from logstore import Log

    directory = str(tmp_path / "t-0")
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child: the writer and the reader, one after the other
        code = 1
        try:
            log = Log.open(directory)
            for i in range(100):
                log.append(b"v%03d" % i * 25)
            active = os.path.join(directory, "%020d.log" % 0)
            assert os.path.getsize(active) > 1 << 20
            code = 0 if reader(log, directory, active) and len(log.segments) == 2 else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert not os.WIFSIGNALED(status), f"{what} died of {signal.Signals(os.WTERMSIG(status)).name}"
    assert os.WEXITSTATUS(status) == 0


def test_segment_batches_of_a_log_that_grows_meanwhile_end_where_they_ended(tmp_path):
    # A batch appended after the valid batches were found is no damage past them.
    from logstore import Log
    from logstore.store.views import SegmentBatches

    with Log.open(str(tmp_path / "t-0")) as log:
        for i in range(10):
            log.append(b"v%d" % i)
        end = log.segments[-1].size
        with SegmentBatches(os.path.join(log.path, "%020d.log" % 0), 0) as segment:
            log.append(b"later")
            assert [h.base_offset for _, h in segment] == list(range(10))
            assert (segment.stop.position, segment.stop.status, len(segment.data)) == (end, lib.LS_OK, end)
        with SegmentBatches(os.path.join(log.path, "%020d.log" % 0), 0) as segment:
            # Not iterated first: the stop finds the last batch itself.
            assert segment.stop.status == lib.LS_ERR_ZERO and segment.stop.position == log.segments[-1].size


def _batch_ending_short_of(log, target):
    """Append one-record batches until the active segment is exactly ``target`` bytes long."""
    size = lambda: log.segments[-1].size  # noqa: E731
    while target - size() > 3000:
        log.append(b"f" * min(target - size() - 2000, 20000))
    before = size()
    log.append(b"p" * (target - before - 400))
    overhead = size() - before - (target - before - 400)
    log.append(b"q" * (target - size() - overhead))
    assert size() == target


@pytest.mark.parametrize("short", [1, 3, 6, 7, 12])
@pytest.mark.parametrize("open_writer", [False, True], ids=["closed", "writer-open"])
@pytest.mark.parametrize("interval", [1 << 30, 4096], ids=["no-index-entry", "indexed"])
def test_a_batch_starting_just_before_a_read_chunk_boundary_is_not_a_zero_tail(tmp_path, short, open_writer,
                                                                                interval):
    # The walk of a segment's tail reads it a chunk at a time. A batch starting fewer bytes
    # before a chunk's end than its header has, and whose first bytes there are zero (the high
    # bytes of a small base offset), left only zero bytes at the chunk's end: they were taken for
    # the active segment's zero tail and the walk ended there. The log's end was then that
    # position, and verify read 2**18 - 1 bytes of the segment and reported index entries past
    # them as damage (the transaction kill soak), or silently read less.
    from logstore import Log
    from logstore.store.views import _TAIL_CHUNK, SegmentBatches
    from logstore.tools.verify import verify

    path = str(tmp_path / "t-0")
    # Without index entries the log end's walk starts at 0 too; with them verify's still does,
    # and the entries past the early end were reported as damage.
    log = Log.open(path, index_interval_bytes=interval)
    try:
        _batch_ending_short_of(log, _TAIL_CHUNK - short)
        for i in range(50):
            log.append(b"after-%d" % i)
        end, records, size = log.log_end_offset, log.log_end_offset, log.segments[-1].size
        if not open_writer:
            log.close()
        assert PartitionView(str(tmp_path), "t", 0).log_end() == LogEnd(end, 0, size)
        with SegmentBatches(os.path.join(path, "%020d.log" % 0), 0) as segment:
            assert [h.last_offset for _, h in segment][-1] == end - 1
            assert segment.stop.position == size
        report = verify(path)
        assert report.ok, [str(p) for p in report.problems]
        assert (report.records, report.bytes) == (records, size)
    finally:
        log.close()
