"""Multi-process mode of Log (Log.open_shared, the .shared page).

flock locks belong to an open file description, so two shared Logs on one path in one process
contend exactly as two processes do; most tests use that, and the last ones use real processes.
"""

from __future__ import annotations

import multiprocessing
import os
import threading
import time

import pytest

from logstore import Log, LogClosedError, LogLockedError
from logstore._native import lib

SMALL = dict(segment_bytes=4096, index_interval_bytes=128, file_delete_delay_ms=0)


@pytest.fixture
def path(tmp_path):
    return str(tmp_path / "t-0")


def values(log):
    return [r.value for r in log.iter()]


def test_appends_in_one_are_read_by_the_other(path):
    a = Log.open_shared(path)
    b = Log.open_shared(path)
    try:
        assert a.append(b"a0") == 0
        assert b.log_end_offset == 1
        assert b.append(b"b1") == 1
        assert a.append_batch([b"a2", b"a3"]) == 2
        assert values(a) == values(b) == [b"a0", b"b1", b"a2", b"a3"]
        assert [r.offset for r in b.read(0)] == [0, 1, 2, 3]
    finally:
        a.close()
        b.close()


@pytest.mark.regression(reason="fixed: a flush() under the group commit's condition follows the other processes, "
                               "which takes the log's lock; an append inside exclusive() that reached "
                               "flush_messages held the log and waited for that condition: deadlock (review)")
def test_append_inside_exclusive_past_flush_messages_while_a_flush_follows(path, monkeypatch):
    follower: list[threading.Thread] = []
    paused, go = threading.Event(), threading.Event()
    follow_locked = Log._follow_locked

    def pausing_follow(log):
        # The follower holds the group commit's condition here, about to take the log's lock.
        if follower and threading.current_thread() is follower[0] and not paused.is_set():
            paused.set()
            go.wait(10)
        follow_locked(log)

    monkeypatch.setattr(Log, "_follow_locked", pausing_follow)  # (before the open binds the hook)
    log = Log.open_shared(path, flush_messages=2)
    log.append(b"a")  # below the threshold: not fsynced
    holding = threading.Event()
    durable = []

    def holder():
        with log.exclusive():
            holding.set()
            log.append(b"b")  # reaches flush_messages: durable on return
            durable.append(log.recovery_point)

    follower.append(threading.Thread(target=log.flush, daemon=True))
    follower[0].start()
    assert paused.wait(10)
    other = threading.Thread(target=holder, daemon=True)
    other.start()
    assert holding.wait(10)
    go.set()  # the follower now waits for the log's lock, which the holder has
    other.join(5)
    follower[0].join(5)
    stuck = other.is_alive() or follower[0].is_alive()
    if not stuck:
        log.close()
    assert not stuck, "the holder of exclusive() and the flush following the other processes deadlocked"
    assert durable == [2]


def test_rolls_by_one_process_are_followed_by_the_other(path):
    a = Log.open_shared(path, **SMALL)
    b = Log.open_shared(path, **SMALL)
    try:
        expected = []
        for i in range(300):
            writer = a if i % 3 else b
            value = f"v{i:04d}".encode() * 20
            assert writer.append(value) == i
            expected.append(value)
        assert len(a.segments) > 3
        assert [s.base_offset for s in a.segments] == [s.base_offset for s in b.segments]
        assert values(a) == expected
        assert values(b) == expected
        assert a.offset_for_timestamp(0) == b.offset_for_timestamp(0) == 0
    finally:
        a.close()
        b.close()
    with Log.open(path, **SMALL) as log:
        assert log.recovery_report.clean_shutdown
        assert values(log) == expected


def test_retention_truncation_and_compaction_are_seen_by_the_other(path):
    a = Log.open_shared(path, cleanup_policy="compact,delete", **SMALL)
    b = Log.open_shared(path, cleanup_policy="compact,delete", **SMALL)
    try:
        for i in range(200):
            a.append(b"x" * 100, key=str(i % 10).encode())
        b.delete_records_before(50)
        assert a.log_start_offset == 50
        assert a.read(50)[0].offset == 50
        report = b.compact()
        assert report.records_dropped > 0
        keys_a = {r.key: r.offset for r in a.iter()}
        keys_b = {r.key: r.offset for r in b.iter()}
        assert keys_a == keys_b
        assert {r.key for r in a.iter() if r.offset >= a.segments[-1].base_offset} <= set(keys_a)
        a.truncate_to(195)
        assert b.log_end_offset == 195
        assert b.append(b"after", key=b"k") == 195
        assert a.read(195)[0].value == b"after"
    finally:
        a.close()
        b.close()


def test_exclusive_and_shared_opens_exclude_each_other(path):
    with Log.open_shared(path):
        with pytest.raises(LogLockedError):
            Log.open(path)
    with Log.open(path):
        with pytest.raises(LogLockedError):
            Log.open_shared(path)
    with Log.open_shared(path) as log:  # both released their locks
        assert log.log_end_offset == 0


def test_only_the_last_process_out_writes_the_clean_shutdown_marker(path):
    a = Log.open_shared(path)
    b = Log.open_shared(path)
    a.append(b"one")
    a.close()
    assert not os.path.exists(os.path.join(path, ".kafka_cleanshutdown"))
    b.append(b"two")
    b.close()
    assert os.path.exists(os.path.join(path, ".kafka_cleanshutdown"))
    with Log.open_shared(path) as log:
        assert log.recovery_report.clean_shutdown
        assert values(log) == [b"one", b"two"]


def test_a_writer_dying_mid_append_leaves_nothing_visible(path):
    a = Log.open_shared(path)
    b = Log.open_shared(path)
    try:
        a.append(b"kept")
        # Simulate a process killed while copying a batch: bytes past the published position,
        # never published. The next writer overwrites them.
        seg = a._active
        seg.buffer[seg.size:seg.size + 100] = b"\xff" * 100
        a._abandon()
        assert values(b) == [b"kept"]
        assert b.append(b"next") == 1
        assert values(b) == [b"kept", b"next"]
    finally:
        b.close()
    with Log.open(path) as log:
        assert values(log) == [b"kept", b"next"]


def test_a_writer_dying_mid_roll_is_repaired_by_the_next(path):
    a = Log.open_shared(path, **SMALL)
    b = Log.open_shared(path, **SMALL)
    try:
        for i in range(20):
            a.append(b"y" * 200)
        # Die after sealing the active segment but before creating the next one and publishing.
        with a._lock, a._w:
            a._begin_layout_change()
            a._active.seal(fsync=False)
            state, a._share.state = a._share.state, None
            state.close()  # the process dies: its flock goes away with its descriptors
        a._abandon()
        assert b.append(b"after") == 20
        assert values(b) == [b"y" * 200] * 20 + [b"after"]
    finally:
        b.close()
    with Log.open(path, **SMALL) as log:
        assert values(log) == [b"y" * 200] * 20 + [b"after"]


def test_fsync_by_one_process_counts_for_all(path):
    a = Log.open_shared(path)
    b = Log.open_shared(path)
    try:
        a.append(b"x")
        b.flush()
        assert a.recovery_point == 1
        assert b.recovery_point == 1
    finally:
        a.close()
        b.close()


def test_long_poll_wakes_on_an_append_from_another_open(path):
    a = Log.open_shared(path)
    b = Log.open_shared(path)
    try:
        woke = []

        def wait():
            t0 = time.monotonic()
            woke.append((b.wait_for_append(0, timeout=5.0), time.monotonic() - t0))

        thread = threading.Thread(target=wait)
        thread.start()
        time.sleep(0.2)
        a.append(b"wake up")
        thread.join()
        ok, elapsed = woke[0]
        assert ok
        assert elapsed < 0.2 + 0.05 + 0.1  # woke within ~50 ms of the append (slack for CI)
        assert b.wait_for_append(0, timeout=0) is True
        assert b.wait_for_append(1, timeout=0.05) is False
    finally:
        a.close()
        b.close()


def test_long_poll_on_an_exclusive_log_and_close_releases_waiters(tmp_path):
    log = Log.open(str(tmp_path / "x-0"))
    results = []

    def wait(offset):
        try:
            results.append(log.wait_for_append(offset, timeout=10.0))
        except LogClosedError:
            results.append("closed")

    t1 = threading.Thread(target=wait, args=(0,))
    t1.start()
    time.sleep(0.1)
    t0 = time.monotonic()
    log.append(b"v")
    t1.join()
    assert results == [True]
    assert time.monotonic() - t0 < 1.0
    t2 = threading.Thread(target=wait, args=(5,))
    t2.start()
    time.sleep(0.1)
    log.close()
    t2.join(timeout=5)
    assert not t2.is_alive()
    assert results == [True, "closed"]


def _writer(path, wid, n):
    log = Log.open_shared(path, segment_bytes=64 << 10)
    try:
        for i in range(n):
            if i % 10 == 0:
                log.append_batch([f"{wid}:{i + j}".encode() for j in range(5)])
            elif i % 10 < 5:
                continue
            else:
                log.append(f"{wid}:{i}".encode(), key=str(wid).encode())
    finally:
        log.close()


def test_four_processes_append_concurrently_offsets_dense_nothing_lost(path):
    ctx = multiprocessing.get_context("fork")
    n = 2000
    procs = [ctx.Process(target=_writer, args=(path, w, n)) for w in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    with Log.open(path, segment_bytes=64 << 10) as log:
        records = list(log.iter())
        assert log.recovery_report.clean_shutdown
    assert [r.offset for r in records] == list(range(4 * n))
    seen: dict[int, list[int]] = {}
    for r in records:
        w, i = r.value.decode().split(":")
        seen.setdefault(int(w), []).append(int(i))
    for w in range(4):
        assert seen[w] == list(range(n))  # each writer's records in its own order, none lost


def test_shared_page_survives_a_writer_killed_while_holding_the_lock(path):
    ctx = multiprocessing.get_context("fork")
    a = Log.open_shared(path)
    try:
        a.append(b"before")

        def hold_and_die():
            log = Log.open_shared(path)
            log._w.__enter__()  # holds the writers' lock ...
            log._begin_layout_change()
            os._exit(0)  # ... and dies

        p = ctx.Process(target=hold_and_die)
        p.start()
        p.join(10)
        assert a.append(b"after") == 1
        assert values(a) == [b"before", b"after"]
        assert lib.ls_shared_dirty(a._share.state.page) == 0
    finally:
        a.close()


def test_opening_while_the_last_process_closes_is_never_refused(path):
    # The last one out holds .lock exclusively while it closes; releasing the writers' lock
    # (.shared) before .lock let an opener waiting on .shared find .lock still taken and give
    # up with LogLockedError. flocks belong to open files, so two threads with their own
    # Log objects race like two processes.
    Log.open_shared(path).close()
    errors = []

    def cycle():
        try:
            for _ in range(100):
                Log.open_shared(path).close()
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=cycle) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == []
    with Log.open(path) as log:
        assert log.recovery_report.clean_shutdown
