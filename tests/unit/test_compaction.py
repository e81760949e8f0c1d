"""Log.compact(): one cleaning pass, checked against a model of Kafka's compaction semantics."""

from __future__ import annotations

import os
import pathlib

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from logstore import Log
from logstore.log.filenames import parse_segment_name

KEYS = [b"k%d" % i for i in range(12)]


def expected_after_compaction(history, end):
    """Kafka's rule: a record at offset O with key K below the cleaned end survives iff no record
    of K at an offset O' > O was indexed (O' < end); records at or past end are untouched."""
    latest = {}
    for offset, key, _ in history:
        if offset < end:
            latest[key] = offset
    return [(o, k, v) for o, k, v in history if o >= end or latest.get(k) == o]


@settings(deadline=None, max_examples=40, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=st.lists(st.tuples(st.sampled_from(KEYS), st.one_of(st.none(), st.binary(min_size=1, max_size=40))),
                    min_size=1, max_size=150),
       segment_bytes=st.integers(300, 2000))
def test_compaction_keeps_the_latest_record_per_key_with_offsets_and_order(tmp_path_factory, ops, segment_bytes):
    path = tmp_path_factory.mktemp("c") / "t-0"
    history = []
    with Log.open(path, cleanup_policy="compact", segment_bytes=segment_bytes) as log:
        for key, value in ops:
            history.append((log.append(value, key=key), key, value))
        end = log.segments[-1].base_offset  # the active segment is never cleaned
        report = log.compact()
        assert report.cleaned_up_to == (end if end > 0 else report.first_dirty_offset)
        got = [(r.offset, r.key, r.value) for r in log.iter()]
        assert got == expected_after_compaction(history, report.cleaned_up_to)
        assert log.log_end_offset == len(history)
        assert report.records_kept + report.records_dropped == sum(1 for o, _, _ in history if o < report.cleaned_up_to)
    with Log.open(path, cleanup_policy="compact", segment_bytes=segment_bytes) as log:
        assert [(r.offset, r.key, r.value) for r in log.iter()] == got
        assert log.append(b"after", key=b"x") == len(history)
    names = os.listdir(path)
    assert not [n for n in names if n.endswith((".cleaned", ".swap", ".deleted"))]


def test_tombstones_survive_delete_retention_then_go(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "t-0"
    with Log.open(path, cleanup_policy="compact", segment_bytes=500, delete_retention_ms=1000) as log:
        for i in range(20):
            log.append(b"v%d" % i, key=b"a")
        log.append(None, key=b"a")  # tombstone for a
        for i in range(20):
            log.append(b"w%d" % i, key=b"b")
        log.roll()
        log.append(b"tail", key=b"c")
        first = log.compact(now_ms=10_000)
        assert first.tombstones_dropped == 0
        values = {r.key: r.value for r in log.iter()}
        assert values[b"a"] is None  # the tombstone is still there for consumers to see
        second = log.compact(now_ms=10_500)  # nothing dirty: the horizon has not passed anyway
        assert second.tombstones_dropped == 0
        # A later pass after the horizon (now + delete_retention_ms of the first pass) drops it.
        log.append(b"x", key=b"d")
        log.roll()
        log._cleaner_offsets.update({log._key: 0})  # re-clean everything from the start
        third = log.compact(now_ms=11_001)
        assert third.tombstones_dropped == 1
        assert b"a" not in {r.key for r in log.iter()}


def test_small_offset_map_cleans_over_several_passes(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "t-0"
    history = []
    with Log.open(path, cleanup_policy="compact", segment_bytes=400, cleaner_dedupe_buffer_size=20 * 12) as log:
        for round_ in range(3):
            for i in range(30):
                key = b"key-%02d" % i
                history.append((log.append(b"r%d" % round_, key=key), key, b"r%d" % round_))
        log.roll()
        passes = 0
        while True:
            report = log.compact()
            passes += 1
            if report.cleaned_up_to >= log.segments[-1].base_offset or passes > 50:
                break
        assert passes > 1  # 30 keys do not fit a map of 10 keys: several passes were needed
        got = {r.key: r.value for r in log.iter()}
        assert got == {b"key-%02d" % i: b"r2" for i in range(30)}


def test_compact_leaves_delete_policy_logs_alone(tmp_path: pathlib.Path) -> None:
    with Log.open(tmp_path / "t-0", segment_bytes=300) as log:
        for i in range(50):
            log.append(b"v", key=b"k")
        report = log.compact()
        assert report.segments_cleaned == 0
        assert len(list(log.iter())) == 50


def test_min_compaction_lag_keeps_young_segments_dirty(tmp_path: pathlib.Path) -> None:
    with Log.open(tmp_path / "t-0", cleanup_policy="compact", segment_bytes=300,
                  min_compaction_lag_ms=1000) as log:
        for i in range(40):
            log.append(b"v%d" % i, key=b"k", timestamp=5_000 + i)
        log.roll()
        assert log.compact(now_ms=5_500).segments_cleaned == 0  # every record is younger than the lag
        assert len(list(log.iter())) == 40
        report = log.compact(now_ms=10_000)
        assert report.segments_cleaned > 0
        assert [r.value for r in log.iter()] == [b"v39"]


@pytest.mark.parametrize("stop_after", ["cleaned", "swap", "deleted"])
def test_crash_inside_the_swap_leaves_before_or_after(tmp_path: pathlib.Path, stop_after: str) -> None:
    """Kill the pass (an exception from the file layer) after each rename of the protocol."""
    from logstore import _fileio

    path = tmp_path / "t-0"
    history = []
    with Log.open(path, cleanup_policy="compact", segment_bytes=400) as log:
        for i in range(60):
            key = b"k%d" % (i % 5)
            history.append((log.append(b"v%d" % i, key=key), key, b"v%d" % i))
        log.roll()

    class Crash(BaseException):
        pass

    class CrashAt(_fileio.FileOps):
        def rename(self, src: str, dst: str) -> None:
            super().rename(src, dst)
            if stop_after == "cleaned" and dst.endswith(".swap"):
                raise Crash
            if stop_after == "deleted" and dst.endswith(".deleted"):
                raise Crash

        def fsync_dir(self, path: str) -> None:
            super().fsync_dir(path)
            if stop_after == "swap" and any(n.endswith(".swap") for n in os.listdir(path)):
                raise Crash

    log = Log.open(path, cleanup_policy="compact", segment_bytes=400)
    before = [(r.offset, r.key, r.value) for r in log.iter()]
    with _fileio.install(CrashAt()):
        with pytest.raises(Crash):
            log.compact()
    log._abandon()
    with Log.open(path, cleanup_policy="compact", segment_bytes=400) as log:
        after = [(r.offset, r.key, r.value) for r in log.iter()]
        latest = {k: v for _, k, v in history}
        assert {k: v for _, k, v in after} == latest  # no key lost
        assert len({o for o, _, _ in after}) == len(after)  # none duplicated
        assert [o for o, _, _ in after] == sorted(o for o, _, _ in after)
        assert set(after) <= set(before)
        assert not [n for n in os.listdir(path) if parse_segment_name(n) and parse_segment_name(n)[1].endswith((".swap", ".cleaned", ".deleted"))]


def test_background_cleaner_picks_the_dirtiest_log_and_survives_a_failing_one(tmp_path: pathlib.Path) -> None:
    from logstore.cleaner import Cleaner

    logs = []
    for name, rounds in (("a-0", 2), ("b-0", 6)):
        log = Log.open(tmp_path / name, cleanup_policy="compact", segment_bytes=300, min_cleanable_dirty_ratio=0.1)
        for r in range(rounds):
            for i in range(10):
                log.append(b"r%d" % r, key=b"k%d" % i)
        log.roll()
        logs.append(log)

    class Broken:
        def needs_compaction(self, now_ms=None):
            return True

        def dirty_ratio(self):
            return 1.0  # the dirtiest: picked first

        def compact(self, now_ms=None):
            raise OSError("disk on fire")

        def mark_uncleanable(self, reason):
            self.reason = reason

    broken = Broken()
    cleaner = Cleaner(interval_s=0.01)
    cleaner.add(broken)  # ties on the dirty ratio go to the first registered
    for log in logs:
        cleaner.add(log)
    assert cleaner.run_once() is None  # the broken log failed ...
    assert "disk on fire" in broken.reason  # ... and was marked, the cleaner carries on
    cleaner.remove(broken)
    first = cleaner.run_once()
    assert first is not None and first.segments_cleaned > 0
    assert first in (logs[0].cleaner_state.last_report, logs[1].cleaner_state.last_report)
    cleaner.start()
    deadline = __import__("time").monotonic() + 10
    while any(log.needs_compaction() for log in logs) and __import__("time").monotonic() < deadline:
        __import__("time").sleep(0.02)
    cleaner.stop()
    for log, last_round in zip(logs, (b"r1", b"r5")):
        assert not log.needs_compaction()
        records = list(log.iter())
        assert {r.key: r.value for r in records} == {b"k%d" % i: last_round for i in range(10)}
        assert len(records) == 10  # one record per key is left
        log.close()


def test_max_compaction_lag_forces_a_pass_below_the_dirty_ratio(tmp_path: pathlib.Path) -> None:
    with Log.open(tmp_path / "t-0", cleanup_policy="compact", segment_bytes=300,
                  min_cleanable_dirty_ratio=1.0, max_compaction_lag_ms=1000) as log:
        for i in range(30):
            log.append(b"v", key=b"k", timestamp=1_000 + i)
        log.roll()
        log.compact(now_ms=1_500)
        for i in range(3):
            log.append(b"w", key=b"k", timestamp=2_000 + i)
        log.roll()
        assert 0 < log.dirty_ratio() < 1.0
        assert not log.needs_compaction(now_ms=2_500)
        assert log.needs_compaction(now_ms=3_100)  # the dirty records are older than the max lag


# ---------------------------------------------------------------------- KIP-534: expired tombstones
def _tombstoned_log(path: pathlib.Path, **config) -> Log:
    log = Log.open(path, cleanup_policy="compact", segment_bytes=4096, **config)
    for i in range(100):
        log.append(b"v", key=b"k%d" % i, timestamp=1_000)
    for i in range(100):
        log.append(None, key=b"k%d" % i, timestamp=1_000)
    log.append(b"live", key=b"kept", timestamp=1_000)
    log.roll()
    return log


def _tombstones(log: Log) -> int:
    return sum(1 for record in log.iter() if record.value is None)


def test_a_pass_with_nothing_dirty_removes_tombstones_past_their_horizon(tmp_path: pathlib.Path) -> None:
    with _tombstoned_log(tmp_path / "t-0", delete_retention_ms=0) as log:
        first = log.compact(now_ms=10_000)  # sets the horizon: now + 0
        assert (first.tombstones_dropped, _tombstones(log)) == (0, 100)
        assert log.dirty_ratio() == 0.0  # nothing dirty from here on
        assert log.needs_compaction(now_ms=10_000)  # the horizon (10_000) has passed
        second = log.compact(now_ms=10_000)
        assert second.tombstones_dropped == 100
        assert second.cleaned_up_to == first.cleaned_up_to  # the dirty section did not move
        assert _tombstones(log) == 0
        assert [(r.key, r.value) for r in log.iter()] == [(b"kept", b"live")]
        # Nothing left to do: the cleaner does not pick the log again and again.
        assert not log.needs_compaction(now_ms=10_000)
        assert log.compact(now_ms=10_000).segments_cleaned == 0


def test_tombstones_before_their_horizon_stay_when_nothing_is_dirty(tmp_path: pathlib.Path) -> None:
    with _tombstoned_log(tmp_path / "t-0", delete_retention_ms=5_000) as log:
        log.compact(now_ms=10_000)  # horizon 15_000
        assert not log.needs_compaction(now_ms=14_999)
        assert log.compact(now_ms=14_999).tombstones_dropped == 0
        assert _tombstones(log) == 100
        assert log.needs_compaction(now_ms=15_000)
        assert log.compact(now_ms=15_000).tombstones_dropped == 100
        offsets = [r.offset for r in log.iter()]
        assert offsets == [200]  # offsets never change


def test_expired_tombstones_are_found_again_after_reopening(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "t-0"
    with _tombstoned_log(path, delete_retention_ms=0) as log:
        log.compact(now_ms=10_000)
    with Log.open(path, cleanup_policy="compact", segment_bytes=4096, delete_retention_ms=0) as log:
        assert log.needs_compaction(now_ms=10_000)
        assert log.compact(now_ms=10_000).tombstones_dropped == 100
        assert _tombstones(log) == 0


def test_background_cleaner_picks_a_log_for_expired_tombstones_alone(tmp_path: pathlib.Path) -> None:
    from logstore.cleaner import Cleaner

    with _tombstoned_log(tmp_path / "t-0", delete_retention_ms=0, min_cleanable_dirty_ratio=0.99) as log:
        log.compact(now_ms=10_000)
        cleaner = Cleaner()
        cleaner.add(log)
        report = cleaner.run_once(now_ms=10_000)
        assert report is not None and report.tombstones_dropped == 100
        assert cleaner.run_once(now_ms=10_000) is None  # and then leaves it alone
        assert _tombstones(log) == 0
