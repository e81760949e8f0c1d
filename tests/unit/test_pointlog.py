"""The log's reader of one record (``pointread.PointLog``, in pypoint.c): Log.read(offset,
max_records=1) makes one call into it. It keeps what each segment's ``point_entry`` said (a
map, an appender, an index) until the set of segments changes, and must notice by itself when
a segment moved on under it: a map closed by growth, sealing or truncation, an appender writing
into another map, an index trimmed. These tests drive each of those and check that every answer
equals the general read's, and that the reader never follows a stale pointer (ASan runs them
under `make asan`)."""

from __future__ import annotations

import errno
import gc
import mmap
import weakref

import pytest
from logstore import Log, LogOfflineError, _fileio
from logstore._fileio import FileOps
from logstore._native import ffi
from logstore.errors import LogClosedError, OffsetOutOfRangeError
from logstore.log.pointread import PointLog, PointReads
from logstore.records.batch import BatchBuilder
from logstore.segment import LogSegment


def _general(log, offset):
    """The general read's answer (max_records=2 never takes the short path)."""
    return log.read(offset, max_records=2)[:1]


def _append(log, batches, count=50, size=64, tag=b""):
    for b in range(batches):
        log.append_batch([tag + b"%d-%d-" % (b, j) + bytes(size) for j in range(count)])


def _describes(monkeypatch):
    """Count LogSegment.point_entry calls (what a reader made from now on asks when it
    (re)describes a segment), by base offset."""
    calls = []
    original = LogSegment.point_entry

    def counted(segment):
        calls.append(segment.base_offset)
        return original(segment)
    monkeypatch.setattr(LogSegment, "point_entry", counted)
    return calls


# ---------------------------------------------------------------------- through Log.read
def test_one_reader_serves_every_segment_until_the_set_changes(tmp_path):
    log = Log.open(str(tmp_path / "p-0"), segment_bytes=16 << 10)
    try:
        _append(log, 40)
        assert len(log.segments) > 4
        end = log.log_end_offset
        for offset in range(0, end, 13):
            assert log.read(offset, max_records=1) == _general(log, offset)
        points = log._segments.points
        assert isinstance(points, PointLog)
        log.read(5, max_records=1)
        assert log._segments.points is points  # no change of the set: the same reader
        log.roll()
        assert log._segments.points is None  # a new segment: made again at the next read
        log.append_batch([b"after"])
        assert log.read(end, max_records=1)[0].value == b"after"
        assert log._segments.points is not points
    finally:
        log.close()


def test_growth_of_the_active_map_is_noticed_without_a_new_reader(tmp_path):
    # Not preallocated, the active segment is first mapped 8 MiB and remapped larger as it
    # grows: the described map is closed then, and the reader describes the segment again.
    log = Log.open(str(tmp_path / "p-0"), segment_bytes=64 << 20, preallocate=False)
    try:
        _append(log, 1, count=10)
        assert log.read(3, max_records=1) == _general(log, 3)
        points = log._segments.points
        first_map = log._segments.active._mm
        _append(log, 50, count=100, size=2000, tag=b"big")  # ~10 MB more: past the first map
        assert log._segments.active._mm is not first_map and first_map.closed
        end = log.log_end_offset
        for offset in (3, 9, 10, end // 2, end - 1):
            assert log.read(offset, max_records=1) == _general(log, offset)
        assert log._segments.points is points
    finally:
        log.close()


def test_a_sealed_segment_is_described_once_and_again_only_after_its_map_closed(tmp_path, monkeypatch):
    log = Log.open(str(tmp_path / "p-0"), segment_bytes=16 << 10)
    try:
        _append(log, 20)
        log.read(0, max_records=1)  # make the reader
        calls = _describes(monkeypatch)
        log._segments.points = None  # a reader that sees the counting point_entry
        first = log.segments[0]
        for offset in (1, 2, 3, 4):
            assert log.read(offset, max_records=1) == _general(log, offset)
        assert calls.count(first.base_offset) == 1
        segment = log._segments[first.base_offset]
        segment._map_readonly()  # a new map: the one described is closed
        assert log.read(7, max_records=1) == _general(log, 7)
        assert calls.count(first.base_offset) == 2
    finally:
        log.close()


def test_truncation_into_a_sealed_segment_and_retention_change_the_reader(tmp_path):
    log = Log.open(str(tmp_path / "p-0"), segment_bytes=16 << 10)
    try:
        _append(log, 30)
        end = log.log_end_offset
        middle = log.segments[len(log.segments) // 2]
        cut = middle.base_offset + 5
        for offset in range(0, end, 17):
            log.read(offset, max_records=1)
        log.truncate_to(cut)  # the segment holding `cut` becomes the active one again
        assert log._segments.points is None
        assert log.read(cut, max_records=1) == []
        with pytest.raises(OffsetOutOfRangeError):
            log.read(cut + 1, max_records=1)
        log.append_batch([b"again-%d" % i for i in range(3)])
        assert [r.value for r in log.read(cut, max_records=1)] == [b"again-0"]
        assert log.read(cut - 1, max_records=1) == _general(log, cut - 1)
        log.delete_records_before(middle.base_offset)  # the segments below it go
        assert log._segments.points is None and log.segments[0].base_offset == middle.base_offset
        with pytest.raises(OffsetOutOfRangeError):
            log.read(middle.base_offset - 1, max_records=1)
        assert log.read(middle.base_offset, max_records=1) == _general(log, middle.base_offset)
    finally:
        log.close()


def test_the_active_segment_truncated_in_place_reads_what_is_there_now(tmp_path):
    log = Log.open(str(tmp_path / "p-0"))
    try:
        _append(log, 3, count=10)
        assert log.read(25, max_records=1)[0].value.startswith(b"2-5-")
        log.truncate_to(22)  # inside the last batch: rewritten in place, same map
        log.append_batch([b"new-%d" % i for i in range(5)])
        assert [r.value for r in log.read(22, max_records=1)] == [b"new-0"]
        assert log.read(21, max_records=1)[0].value.startswith(b"2-1-")
        for offset in range(0, log.log_end_offset):
            assert log.read(offset, max_records=1) == _general(log, offset)
    finally:
        log.close()


def test_closed_and_offline_logs_refuse_point_reads(tmp_path):
    log = Log.open(str(tmp_path / "p-0"))
    _append(log, 2)
    assert log.read(3, max_records=1)
    log.close()
    with pytest.raises(LogClosedError):
        log.read(3, max_records=1)

    class BrokenDisk(FileOps):
        def fdatasync(self, fd):
            raise OSError(errno.EIO, "injected EIO in fdatasync")

    log = Log.open(str(tmp_path / "p-0"))
    try:
        assert log.read(3, max_records=1)  # the reader is made while the log is well
        log.append(b"x")
        with _fileio.install(BrokenDisk()), pytest.raises(OSError):
            log.flush()  # the log goes offline
        with pytest.raises(LogOfflineError):
            log.read(3, max_records=1)
    finally:
        log.close()


def test_unusual_offsets_take_the_general_path(tmp_path):
    log = Log.open(str(tmp_path / "p-0"))
    try:
        _append(log, 2)

        class Offset(int):
            pass

        assert log.read(Offset(7), max_records=1) == _general(log, 7)
        with pytest.raises(TypeError):
            log.read(True, max_records=1)  # bool is refused, as by every read
        with pytest.raises(OffsetOutOfRangeError):
            log.read(-1, max_records=1)
        with pytest.raises(OffsetOutOfRangeError):
            log.read(2**70, max_records=1)
        with pytest.raises(TypeError):
            log.read("7", max_records=1)
    finally:
        log.close()


# ---------------------------------------------------------------------- PointLog itself
def _batches_map(count=20):
    data = bytes(BatchBuilder().build([b"value-%d" % i for i in range(count)], base_offset=0))
    mm = mmap.mmap(-1, len(data))
    mm[:] = data
    return mm


def test_describe_is_asked_lazily_and_its_none_means_the_general_read():
    mm = _batches_map()
    size = len(mm)
    points = PointReads(1 << 20)
    asked = []

    def describe(segment):
        asked.append(segment)
        if segment == "empty":
            return None
        return (points, points.address, 0, mm, size, None, 0, 0)

    reader = PointLog([0, 100], ["s0", "empty"], describe)
    assert asked == []
    assert reader.read(5, 0).value == b"value-5"
    assert reader.read(6, 0).value == b"value-6"
    assert asked == ["s0"]
    assert reader.read(100, 0) is None and reader.read(150, 0) is None
    assert asked == ["s0", "empty", "empty"]  # None is not remembered: asked again
    assert reader.read(20, 0) is None  # past the segment's records
    assert reader.read(5, 6) is None  # below the log start
    assert reader.read("5", 0) is None and reader.read(5.0, 0) is None and reader.read(2**64, 0) is None
    mm.close()  # the map described is closed: described again, and None when it stays closed
    assert reader.read(5, 0) is None
    assert asked.count("s0") == 2  # once more: then the general read decides


def test_an_appender_writing_into_another_map_is_described_again():
    mm = _batches_map()
    other = mmap.mmap(-1, len(mm))
    points = PointReads(1 << 20)
    a = ffi.new("ls_appender *")
    a.log = ffi.from_buffer(other)
    a.log_capacity = len(mm)
    a.position = len(mm)
    a.base_offset = 0
    asked = []

    def describe(segment):
        asked.append(segment)
        return ((points, a), points.address, int(ffi.cast("uintptr_t", a)), mm, 0, None, 0, 0)

    reader = PointLog([0], ["s"], describe)
    assert reader.read(3, 0) is None  # the appender does not write into the map described
    assert asked == ["s", "s"]
    a.log = ffi.from_buffer(mm)
    assert reader.read(3, 0).value == b"value-3"
    a.log_capacity = len(mm) + 1  # claims more than the map holds
    assert reader.read(3, 0) is None


@pytest.mark.parametrize("bad, error", [
    (lambda p, mm: "not a tuple", TypeError),
    (lambda p, mm: (p, p.address, 0, mm, 1), TypeError),
    (lambda p, mm: (p, 0, 0, mm, len(mm), None, 0, 0), ValueError),
    (lambda p, mm: (p, p.address, 0, mm, -1, None, 0, 0), ValueError),
    (lambda p, mm: (p, p.address, 0, mm, len(mm), None, -3, 0), ValueError),
    (lambda p, mm: (p, -1, 0, mm, len(mm), None, 0, 0), OverflowError),
    (lambda p, mm: (p, p.address, 0, mm, "size", None, 0, 0), TypeError),
])
def test_a_bad_description_is_refused(bad, error):
    mm = _batches_map()
    points = PointReads(1 << 20)
    reader = PointLog([0], ["s"], lambda segment: bad(points, mm))
    with pytest.raises(error):
        reader.read(3, 0)


def test_a_sealed_size_beyond_its_map_or_entries_beyond_the_index_are_not_trusted():
    mm = _batches_map()
    points = PointReads(1 << 20)
    reader = PointLog([0], ["s"], lambda s: (points, points.address, 0, mm, len(mm) + 1, None, 0, 0))
    assert reader.read(3, 0) is None
    reader = PointLog([0], ["s"], lambda s: (points, points.address, 0, mm, len(mm), b"\0" * 8, 2, 0))
    assert reader.read(3, 0) is None


def test_bad_construction_is_refused():
    with pytest.raises(ValueError):
        PointLog([0, 0], ["a", "b"], len)
    with pytest.raises(ValueError):
        PointLog([0, 1], ["a"], len)
    with pytest.raises(TypeError):
        PointLog([0], ["a"], "not callable")
    with pytest.raises(OverflowError):
        PointLog([2**64], ["a"], len)
    with pytest.raises(TypeError):
        PointLog((0,), ("a",), len)
    assert PointLog([], [], len).read(0, 0) is None


def test_a_reader_in_a_reference_cycle_is_collected():
    class Segment:
        pass

    segment = Segment()
    reader = PointLog([0], [segment], lambda s: None)
    segment.reader = reader  # segment -> reader -> segment
    gone = weakref.ref(segment)
    del segment, reader
    gc.collect()
    assert gone() is None


def test_threads_appending_while_others_read_random_offsets_get_every_record_whole(tmp_path):
    """Two threads append (one record per call, and batches of varied sizes that roll the small
    segments and grow the active map) while three read random offsets below the log end through
    the short path: every record read is the one at its offset, whole (its key is a digest of its
    value), whether its batch was validated by that read or remembered by the memo."""
    import hashlib
    import random
    import threading
    import time

    log = Log.open(str(tmp_path / "p-0"), segment_bytes=256 << 10)
    stop = threading.Event()
    errors: list[BaseException] = []

    def record(tag: int, n: int, size: int) -> tuple[bytes, bytes]:
        value = b"%d-%d-" % (tag, n) + bytes([n % 251]) * size
        return value, hashlib.blake2b(value, digest_size=16).digest()

    def appender(tag: int) -> None:
        rnd, n = random.Random(tag), 0
        try:
            while not stop.is_set():
                if rnd.random() < 0.5:
                    value, key = record(tag, n, rnd.randrange(0, 300))
                    log.append(value, key)
                    n += 1
                else:
                    items = [record(tag, n + i, rnd.randrange(0, 300)) for i in range(rnd.randrange(1, 400))]
                    log.append_batch([v for v, _ in items], [k for _, k in items])
                    n += len(items)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    reads = [0, 0, 0]

    def reader(i: int) -> None:
        rnd = random.Random(100 + i)
        try:
            while not stop.is_set():
                end = log.log_end_offset
                if end == 0:
                    continue
                offset = rnd.randrange(end)
                (got,) = log.read(offset, max_records=1)
                assert got.offset == offset
                assert got.key == hashlib.blake2b(got.value, digest_size=16).digest()
                reads[i] += 1
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=appender, args=(t,)) for t in (1, 2)]
    threads += [threading.Thread(target=reader, args=(i,)) for i in range(3)]
    try:
        for t in threads:
            t.start()
        time.sleep(2.0)
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=60)
    assert not errors, errors
    assert all(n > 0 for n in reads)
    assert len(log.segments) > 2  # the segments rolled under the readers
    for offset in random.Random(7).sample(range(log.log_end_offset), 500):
        (got,) = log.read(offset, max_records=1)
        assert got.offset == offset and got.key == hashlib.blake2b(got.value, digest_size=16).digest()
    log.close()
