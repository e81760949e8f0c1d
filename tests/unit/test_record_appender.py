"""The single-record append in one CPython call (``_records.RecordAppender``, pyappend.c), which
Log.append's fast path makes instead of a cffi call: its arguments' bounds and errors, what it
writes (read back by the general reader and by the C point reader), the closed log's appender,
and appends on several threads while others read random offsets (ASan runs these under
`make asan`)."""

from __future__ import annotations

import random
import threading

import pytest
from logstore import Log
from logstore._native import ffi, lib
from logstore._native._records import RecordAppender
from logstore.errors import LogClosedError
from logstore.records.batch import RecordDecoder

_FUNCTION = int(ffi.cast("uintptr_t", ffi.addressof(lib, "ls_appender_append_record")))


def _appender(log):
    """A RecordAppender of the log's active segment (the test holds the log's lock around it)."""
    a = log._segments.active.appender
    return RecordAppender(a, int(ffi.cast("uintptr_t", a)), _FUNCTION)


def test_appends_what_the_cffi_call_appends(tmp_path):
    with Log.open(str(tmp_path / "a-0")) as log:
        log.append(b"first")
        with log._lock:
            put = _appender(log)
            assert put(1_700_000_000_000, b"k", b"v") == 1
            assert put(-5, None, b"") == 2            # a null key, an empty value
            assert put(2**63 - 1, b"", None) == 3     # an empty key, a tombstone
        records = log.read(0)
        assert [(r.offset, r.timestamp, r.key, r.value) for r in records[1:]] == [
            (1, 1_700_000_000_000, b"k", b"v"), (2, -5, None, b""), (3, 2**63 - 1, b"", None)]
        assert [log.read(o, max_records=1)[0].value for o in (1, 2, 3)] == [b"v", b"", None]


@pytest.mark.parametrize("args, error", [
    ((), TypeError),
    ((1, b"k"), TypeError),
    ((1, b"k", b"v", b"x"), TypeError),
    (("1", b"k", b"v"), TypeError),
    ((1.5, b"k", b"v"), TypeError),
    ((2**63, b"k", b"v"), OverflowError),
    ((-(2**63) - 1, b"k", b"v"), OverflowError),
    ((1, "k", b"v"), TypeError),
    ((1, b"k", bytearray(b"v")), TypeError),
    ((1, memoryview(b"k"), b"v"), TypeError),
    ((1, b"k", 7), TypeError),
])
def test_arguments_the_core_cannot_take_are_refused_and_nothing_is_written(tmp_path, args, error):
    with Log.open(str(tmp_path / "a-0")) as log:
        with log._lock:
            put = _appender(log)
            with pytest.raises(error):
                put(*args)
        assert log.log_end_offset == 0


def test_keywords_are_refused():
    a = ffi.new("ls_appender *")
    put = RecordAppender(a, int(ffi.cast("uintptr_t", a)), _FUNCTION)
    with pytest.raises(TypeError):
        put(1, b"k", value=b"v")


@pytest.mark.parametrize("address, function, error", [
    (0, "core", ValueError), (1, 0, ValueError), (-1, "core", OverflowError),
    (1, -1, OverflowError), (2**64, "core", OverflowError), ("1", "core", TypeError),
])
def test_bad_construction_is_refused(address, function, error):
    with pytest.raises(error):
        RecordAppender(None, address, _FUNCTION if function == "core" else function)


def test_an_appender_without_a_map_is_refused_by_the_core():
    """The closed log's placeholder: the core answers LS_ERR_ARG, and Log.append then raises."""
    a = ffi.new("ls_appender *")
    put = RecordAppender(a, int(ffi.cast("uintptr_t", a)), _FUNCTION)
    assert put(1, b"k", b"v") == lib.LS_ERR_ARG


def test_the_struct_lives_as_long_as_its_appender(tmp_path):
    a = ffi.new("ls_appender *")
    put = RecordAppender(a, int(ffi.cast("uintptr_t", a)), _FUNCTION)
    del a  # the RecordAppender holds the owner: its address stays valid
    for _ in range(3):
        assert put(1, None, b"v") == lib.LS_ERR_ARG


def test_a_closed_log_refuses_appends_through_the_fast_path(tmp_path):
    log = Log.open(str(tmp_path / "a-0"))
    log.append(b"x")
    log.close()
    with pytest.raises(LogClosedError):
        log.append(b"y")


def test_the_fast_path_follows_rolls_and_growth(tmp_path):
    """The appender changes at each roll (a new active segment) and the map under it at growth:
    every record lands where the readers find it."""
    with Log.open(str(tmp_path / "a-0"), segment_bytes=64 << 10) as log:
        values = [b"%06d" % i * (1 + i % 40) for i in range(3000)]
        for i, value in enumerate(values):
            assert log.append(value, b"k%d" % i) == i
        assert len(log.segments) > 3
        assert [r.value for r in log.iter()] == values
        rnd = random.Random(3)
        for offset in rnd.sample(range(3000), 300):
            assert log.read(offset, max_records=1)[0].value == values[offset]
    with Log.open(str(tmp_path / "a-0")) as log:  # and after a restart
        assert [r.value for r in log.iter()] == values


def test_threads_append_while_others_read_random_offsets(tmp_path):
    """Writers on the fast path and readers of random offsets below the end they saw, at once:
    every record read is exactly the one written at its offset."""
    writers, per_writer, readers = 3, 1500, 2
    expected: dict[int, bytes] = {}
    errors: list[BaseException] = []
    done = threading.Event()
    with Log.open(str(tmp_path / "a-0"), segment_bytes=256 << 10) as log:
        def write(w: int) -> None:
            try:
                for i in range(per_writer):
                    value = b"w%d-%d-" % (w, i) + bytes(i % 200)
                    expected[log.append(value, b"key-%d" % w)] = value
            except BaseException as exc:  # pragma: no cover - reported below
                errors.append(exc)

        def read(seed: int) -> None:
            rnd = random.Random(seed)
            checked = 0
            try:
                while not done.is_set() or checked < 200:
                    end = log.log_end_offset
                    if end == 0:
                        continue
                    offset = rnd.randrange(end)
                    record = log.read(offset, max_records=1)[0]
                    assert record.offset == offset
                    value = expected.get(offset)
                    if value is not None:  # else the writer has not stored its answer yet
                        assert record.value == value
                    assert record.key == b"key-" + record.value[1:2]
                    checked += 1
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=write, args=(w,)) for w in range(writers)]
        threads += [threading.Thread(target=read, args=(r,)) for r in range(readers)]
        for t in threads:
            t.start()
        for t in threads[:writers]:
            t.join()
        done.set()
        for t in threads[writers:]:
            t.join()
        assert not errors, errors
        assert log.log_end_offset == writers * per_writer
        records = list(log.iter())
        assert [r.offset for r in records] == list(range(writers * per_writer))
        assert all(r.value == expected[r.offset] for r in records)
        # the bytes are batches the C decoder validates whole (CRC included)
        segment = log._segments.active
        decoded, _ = RecordDecoder().decode(segment.buffer, 0, segment.size)
        assert decoded and decoded[-1].offset == writers * per_writer - 1


def test_a_roll_interrupted_after_sealing_takes_the_log_offline_instead_of_appending_into_the_old_map(
        tmp_path, monkeypatch):
    """A roll seals the old segment (unmapping it) before it creates the next one. If the creation
    fails with anything, the fast path must not append through the sealed segment's appender (it
    wrote into unmapped memory: SIGSEGV); the log goes offline and says why."""
    from logstore.errors import LogOfflineError
    from logstore.log import segments as segments_module
    from logstore.log.config import LogConfig

    log = Log(str(tmp_path / "t-0"), LogConfig(segment_ms=1000, segment_jitter_ms=0))
    t0 = 1_700_000_000_000
    assert log.append(b"a", timestamp=t0) == 0

    def refuse(*args, **kwargs):
        raise RuntimeError("no next segment")

    with monkeypatch.context() as patch:
        patch.setattr(segments_module.LogSegments, "create_segment", refuse)
        with pytest.raises(RuntimeError, match="no next segment"):
            log.append(b"b", timestamp=t0 + 5000)  # rolls for time: sealed, then no next segment
    with pytest.raises(LogOfflineError, match="no next segment"):
        log.append(b"c" * 100, timestamp=t0 + 1)  # (no roll due: the fast path)
    log.close()
    reopened = Log(str(tmp_path / "t-0"), LogConfig(segment_ms=1000, segment_jitter_ms=0))
    assert [r.value for r in reopened.read(0, max_records=10)] == [b"a"]
    assert reopened.append(b"d", timestamp=t0 + 6000) == 1
    reopened.close()


def test_a_dropped_appender_refuses_appends(tmp_path):
    """The struct a RecordAppender holds is emptied when its segment stops being active (sealed,
    closed, abandoned): an append through it is refused by the core (LS_ERR_ARG), never written."""
    with Log.open(str(tmp_path / "t-0")) as log:
        log.append(b"x")
        appender = _appender(log)
        log._segments.active.seal()
        assert appender(0, None, b"y" * 64) == lib.LS_ERR_ARG


def test_a_large_record_is_appended_without_the_gil_and_reads_back(tmp_path):
    """Records of 16 KiB and more are copied with the GIL released (pyappend.c): the same bytes
    land, from several threads at once."""
    big = bytes(random.Random(7).randrange(256) for _ in range(200_000))
    with Log.open(str(tmp_path / "t-0")) as log:
        def writer(n: int) -> None:
            for i in range(20):
                log.append(big, key=b"%d-%d" % (n, i))

        threads = [threading.Thread(target=writer, args=(n,)) for n in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        got = list(log.read(0, max_records=100, max_bytes=1 << 30))
        assert [r.offset for r in got] == list(range(60)) and all(r.value == big for r in got)
        assert sorted(r.key for r in got) == sorted(b"%d-%d" % (n, i) for n in range(3) for i in range(20))
