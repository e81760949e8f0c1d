"""Log.try_append_idempotent: append_idempotent for a caller that must never wait (the Kafka
server's network loop). Where the append can be made at once it does what append_idempotent
does (offsets, duplicates, stamping in place, errors); where it would wait (the log held by
another thread or process, a roll or a map growth due, the producer state or another process's
appends to read, a flush policy on the append path, a policy that re-encodes the batch) it
returns None with nothing appended, and append_idempotent then makes the append."""

from __future__ import annotations

import contextlib
import threading

import pytest

from logstore import CorruptRecordError, Log
from logstore.records.batch import BatchBuilder, parse_header


def batch(values, pid=-1, seq=-1, timestamp=None):
    timestamps = None if timestamp is None else [timestamp] * len(values)
    return bytes(BatchBuilder().build(values, timestamps=timestamps, producer_id=pid,
                                      producer_epoch=0 if pid >= 0 else -1, base_sequence=seq))


def stored(log):
    return [(r.offset, r.value) for r in log.iter()]


@contextlib.contextmanager
def held_by_another_thread(log):
    """The block runs while another thread holds the log (``log.exclusive()``)."""
    entered, release = threading.Event(), threading.Event()

    def hold():
        with log.exclusive():
            entered.set()
            release.wait(10)

    t = threading.Thread(target=hold)
    t.start()
    try:
        assert entered.wait(10)
        yield
    finally:
        release.set()
        t.join()


def test_an_append_that_need_not_wait_is_made_as_append_idempotent_makes_it(tmp_path):
    with Log.open(str(tmp_path / "a-0")) as log:
        assert log.try_append_idempotent(batch([b"a", b"b"])) == (0, 1, False)
        frame = bytearray(batch([b"c"]))
        assert log.try_append_idempotent(frame, in_place=True) == (2, 2, False)
        assert parse_header(bytes(frame)).base_offset == 2  # stamped where it lies
        assert stored(log) == [(0, b"a"), (1, b"b"), (2, b"c")]


def test_a_bad_batch_raises_as_from_append_idempotent(tmp_path):
    with Log.open(str(tmp_path / "bad-0")) as log:
        damaged = bytearray(batch([b"x"]))
        damaged[-1] ^= 0xFF
        with pytest.raises(CorruptRecordError):
            log.try_append_idempotent(bytes(damaged))
        assert stored(log) == []


def test_a_log_another_thread_holds_is_not_waited_for(tmp_path):
    with Log.open(str(tmp_path / "held-0")) as log:
        log.append(b"first")
        with held_by_another_thread(log):
            assert log.try_append_idempotent(batch([b"x"])) is None
        assert stored(log) == [(0, b"first")]
        assert log.try_append_idempotent(batch([b"x"])) == (1, 1, False)
        with log.exclusive():  # this thread's own hold: re-entered
            assert log.try_append_idempotent(batch([b"y"])) == (2, 2, False)


def test_a_roll_due_for_room_is_left_to_append_idempotent(tmp_path):
    with Log.open(str(tmp_path / "roll-0"), segment_bytes=1024) as log:
        made = 0
        while log.try_append_idempotent(batch([b"v" * 200])) is not None:
            made += 1
            assert made < 10
        assert made >= 2 and len(log.segments) == 1 and log.log_end_offset == made  # nothing appended
        assert log.append_idempotent(batch([b"r" * 200])) == (made, made, False)
        assert len(log.segments) == 2
        assert log.try_append_idempotent(batch([b"after"])) == (made + 1, made + 1, False)


def test_a_roll_due_for_time_is_left_to_append_idempotent(tmp_path):
    with Log.open(str(tmp_path / "time-0"), segment_ms=60_000, segment_jitter_ms=0) as log:
        assert log.try_append_idempotent(batch([b"a"], timestamp=1_000_000)) == (0, 0, False)  # sets the deadline
        assert log.try_append_idempotent(batch([b"b"], timestamp=1_030_000)) == (1, 1, False)
        assert log.try_append_idempotent(batch([b"late"], timestamp=1_061_000)) is None
        assert log.log_end_offset == 2 and len(log.segments) == 1
        assert log.append_idempotent(batch([b"late"], timestamp=1_061_000)) == (2, 2, False)
        assert len(log.segments) == 2


def test_a_growth_of_the_map_is_left_to_append_idempotent(tmp_path):
    with Log.open(str(tmp_path / "grow-0")) as log:  # (1 GiB segments: the map grows in steps)
        big = batch([b"g" * (256 << 10)])
        made = 0
        while log.try_append_idempotent(big) is not None:
            made += 1
            assert made < 1000
        assert log.log_end_offset == made and made >= 1
        assert log.append_idempotent(big) == (made, made, False)  # grown, not rolled
        assert len(log.segments) == 1
        assert log.try_append_idempotent(big) == (made + 1, made + 1, False)


@pytest.mark.parametrize("config", [{"flush_messages": 10}, {"flush_ms": 60_000},
                                    {"cleanup_policy": "compact"}, {"message_timestamp_type": "LogAppendTime"},
                                    {"compression_type": "gzip"}])
def test_a_policy_that_acts_on_the_append_path_leaves_every_append_to_append_idempotent(tmp_path, config):
    with Log.open(str(tmp_path / "policy-0"), **config) as log:
        keyed = bytes(BatchBuilder().build([b"v"], keys=[b"k"]))
        assert log.try_append_idempotent(keyed) is None
        assert log.log_end_offset == 0
        assert log.append_idempotent(keyed) == (0, 0, False)


def test_a_producers_batches_wait_for_the_producer_state_then_are_checked_at_once(tmp_path):
    path = str(tmp_path / "idem-0")
    with Log.open(path) as log:
        log.append_idempotent(batch([b"r0"], pid=5, seq=0))
    with Log.open(path) as log:  # reopened: the producer state is loaded on first need (a read)
        assert log.try_append_idempotent(batch([b"r1"], pid=5, seq=1)) is None
        assert log.append_idempotent(batch([b"r1"], pid=5, seq=1)) == (1, 1, False)
        assert log.try_append_idempotent(batch([b"r2"], pid=5, seq=2)) == (2, 2, False)
        assert log.try_append_idempotent(batch([b"r1"], pid=5, seq=1)) == (1, 1, True)  # a retry: a duplicate
        assert stored(log) == [(0, b"r0"), (1, b"r1"), (2, b"r2")]


def test_a_shared_log_appends_at_once_only_while_no_other_process_wrote(tmp_path):
    path = str(tmp_path / "shared-0")
    with Log.open_shared(path) as mine, Log.open_shared(path) as other:
        # (two opens in one process share the log as two processes do: each its own writers' lock)
        assert mine.try_append_idempotent(batch([b"a"])) == (0, 0, False)
        assert mine.try_append_idempotent(batch([b"b"])) == (1, 1, False)
        other.append(b"theirs")  # published by the other: to adopt (a read of its state) first
        assert mine.try_append_idempotent(batch([b"c"])) is None
        assert mine.append_idempotent(batch([b"c"])) == (3, 3, False)
        assert mine.try_append_idempotent(batch([b"d"])) == (4, 4, False)
        with other.exclusive():  # the other holds the writers' lock
            assert mine.try_append_idempotent(batch([b"e"])) is None
        assert [v for _, v in stored(other)] == [b"a", b"b", b"theirs", b"c", b"d"]


def test_a_shared_logs_own_batches_without_a_producer_id_keep_its_producer_state_current(tmp_path):
    with Log.open_shared(str(tmp_path / "pids-0")) as log:
        assert log.append_idempotent(batch([b"p0"], pid=9, seq=0)) == (0, 0, False)  # loads the state
        assert log.try_append_idempotent(batch([b"plain"])) == (1, 1, False)
        assert log.append_idempotent(batch([b"plain too"])) == (2, 2, False)
        # Nothing to replay before the producer's next batch is checked: it is appended at once.
        assert log.try_append_idempotent(batch([b"p1"], pid=9, seq=1)) == (3, 3, False)
        assert log.try_append_idempotent(batch([b"p1"], pid=9, seq=1)) == (3, 3, True)
        assert log.last_stable_offset == 4


def test_exclusive_if_free_holds_the_log_only_where_that_needs_no_wait(tmp_path):
    with Log.open(str(tmp_path / "hold-0")) as log:
        with log.exclusive_if_free() as held:
            assert held is log
            appended = threading.Thread(target=log.append, args=(b"other",))
            appended.start()
            appended.join(0.2)
            assert appended.is_alive()  # another thread's append waits for the hold
        appended.join(10)
        assert stored(log) == [(0, b"other")]
        with held_by_another_thread(log), log.exclusive_if_free() as held:
            assert held is None
        with log.exclusive(), log.exclusive_if_free() as held:  # this thread's own hold: re-entered
            assert held is log


def test_exclusive_if_free_of_a_shared_log_waits_for_no_other_process(tmp_path):
    path = str(tmp_path / "sharedhold-0")
    with Log.open_shared(path) as mine, Log.open_shared(path) as other:
        mine.append(b"a")
        with mine.exclusive_if_free() as held:
            assert held is mine
        other.append(b"b")  # to be read before this process writes again
        with mine.exclusive_if_free() as held:
            assert held is None
        assert [v for _, v in stored(mine)] == [b"a", b"b"]
        with mine.exclusive_if_free() as held:  # (the read above caught up)
            assert held is mine
        with other.exclusive():
            with mine.exclusive_if_free() as held:
                assert held is None
