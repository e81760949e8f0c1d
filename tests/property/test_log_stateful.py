"""A stateful machine drives a real Log against a list model (sortedcontainers' _check() style).

The model is the list of records physically held by the log's segments, oldest first, as
``(offset, key, value, headers, timestamp)``, plus the log start and end offsets. Records below
the log start stay in the model while their segment exists (delete_records_before moves the
start inside a segment), so the segments' record counts can be checked exactly.

Rules: append (one or several), append_batch (random codec), read (random max_bytes,
max_records or max_offset), iter over a random range, roll, enforce_retention (expected deletions
computed from the segments before the call), truncate_to (inside the log, or below its start),
delete_records_before, offset_for_timestamp, flush, clean reopen and crash reopen
(``_abandon()``: maps and descriptors dropped, no flush). Configurations vary segment_bytes
(1-4 KiB), index_interval_bytes, segment_index_bytes (a full index rolls), segment_ms,
retention, preallocate and flush_messages. Timestamps are explicit and
non-decreasing, so offset_for_timestamp has a single right answer. After every step the
invariants compare the log's offsets, segments, files and full contents with the model.
"""

from __future__ import annotations

import os
import shutil
import tempfile

import pytest
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from logstore import EARLIEST_TIMESTAMP, LATEST_TIMESTAMP, Log, OffsetOutOfRangeError
from logstore.records import compression

CODEC_NAMES = [compression.codec_name(c) for c in sorted(compression.available_codecs())]
T0 = 1_600_000_000_000

nullable_bytes = st.none() | st.binary(max_size=100) | st.binary(min_size=200, max_size=300)
headers_st = st.lists(st.tuples(st.text(max_size=6), st.none() | st.binary(max_size=12)), max_size=3)
record_st = st.tuples(nullable_bytes, nullable_bytes, headers_st, st.integers(0, 3000))  # key, value, headers, ts step


def rec_tuple(r):
    return (r.offset, r.key, r.value, r.headers, r.timestamp)


class LogMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.tmp = tempfile.mkdtemp(prefix="logstore-stateful-")
        self.path = os.path.join(self.tmp, "events-0")
        self.log: Log | None = None

    # ------------------------------------------------------------------ setup
    @initialize(
        segment_bytes=st.integers(1024, 4096),
        index_interval_bytes=st.sampled_from([0, 64, 64, 256]),
        segment_index_bytes=st.sampled_from([64, 256, 1 << 20]),
        segment_ms=st.sampled_from([20_000, 604_800_000]),
        retention_ms=st.sampled_from([-1, 15_000, 60_000]),
        retention_bytes=st.sampled_from([-1, 600, 2000, 6000]),
        preallocate=st.booleans(),
        flush_messages=st.sampled_from([None, None, 1, 7]),
    )
    def open_log(self, segment_bytes, index_interval_bytes, segment_index_bytes, segment_ms,
                 retention_ms, retention_bytes, preallocate, flush_messages):
        self.cfg = dict(
            segment_bytes=segment_bytes,
            index_interval_bytes=index_interval_bytes,
            segment_index_bytes=segment_index_bytes,
            segment_ms=segment_ms,
            retention_ms=retention_ms,
            retention_bytes=retention_bytes,
            # every batch fits a segment, so no segment may exceed segment_bytes
            max_message_bytes=segment_bytes,
            file_delete_delay_ms=0,
            preallocate=preallocate,
            flush_messages=flush_messages,
        )
        self.log = Log.open(self.path, **self.cfg)
        self.records: list[tuple] = []  # physically present, oldest first
        self.start = 0
        self.end = 0
        self.clock = T0

    def teardown(self) -> None:
        try:
            if self.log is not None:
                self.log.close()
        finally:
            shutil.rmtree(self.tmp, ignore_errors=True)

    # ------------------------------------------------------------------ model helpers
    def visible(self) -> list[tuple]:
        return [r for r in self.records if r[0] >= self.start]

    def slice(self, lo: int, hi: int) -> list[tuple]:
        return [r for r in self.records if lo <= r[0] < hi]

    def tick(self, step: int) -> int:
        self.clock += step
        return self.clock

    # ------------------------------------------------------------------ appends
    @rule(record=record_st)
    def append(self, record):
        key, value, headers, step = record
        ts = self.tick(step)
        offset = self.log.append(value, key=key, headers=headers, timestamp=ts)
        assert offset == self.end
        self.records.append((offset, key, value, [tuple(h) for h in headers], ts))
        self.end += 1

    @rule(records=st.lists(record_st, min_size=1, max_size=12))
    def append_many(self, records):
        """Several single appends in one step, so that logs grow enough to roll and expire."""
        for record in records:
            self.append(record)

    @rule(records=st.lists(record_st, min_size=1, max_size=8), codec=st.sampled_from(CODEC_NAMES))
    def append_batch(self, records, codec):
        keys = [r[0] for r in records]
        values = [r[1] for r in records]
        headers = [r[2] for r in records]
        timestamps = [self.tick(r[3]) for r in records]
        first = self.log.append_batch(values, keys, headers, timestamps, compression=codec)
        assert first == self.end
        for i, (k, v, h, _) in enumerate(records):
            self.records.append((first + i, k, v, [tuple(x) for x in h], timestamps[i]))
        self.end += len(records)

    # ------------------------------------------------------------------ reads
    @rule(data=st.data(), max_bytes=st.integers(1, 80) | st.integers(80, 5000) | st.just(1 << 20),
          max_records=st.none() | st.integers(1, 10))
    def read(self, data, max_bytes, max_records):
        offset = data.draw(st.integers(self.start, self.end), label="offset")
        got = self.log.read(offset, max_bytes=max_bytes, max_records=max_records)
        if offset == self.end:
            assert got == []
            return
        # at least one record (KIP-74: a whole batch even when max_bytes is tiny), a contiguous
        # run from the offset, never past the end, and no more than max_records
        assert got, f"read({offset}, max_bytes={max_bytes}, max_records={max_records}) returned nothing"
        assert [rec_tuple(r) for r in got] == self.slice(offset, offset + len(got))
        assert got[-1].offset < self.end
        if max_records is not None:
            assert len(got) <= max_records

    @rule(data=st.data(), max_bytes=st.integers(1, 80) | st.just(1 << 20))
    def read_below_max_offset(self, data, max_bytes):
        offset = data.draw(st.integers(self.start, self.end), label="offset")
        max_offset = data.draw(st.integers(offset, self.end), label="max_offset")
        got = self.log.read(offset, max_bytes=max_bytes, max_offset=max_offset)
        # "none at or above max_offset"; something whenever a record lies in [offset, max_offset)
        assert [rec_tuple(r) for r in got] == self.slice(offset, offset + len(got))
        assert all(r.offset < max_offset for r in got), f"read({offset}, max_offset={max_offset})"
        assert bool(got) == (offset < max_offset)

    @rule(data=st.data())
    def read_out_of_range(self, data):
        offset = data.draw(st.sampled_from([self.start - 1, self.end + 1]) | st.integers(self.end + 1, self.end + 100),
                           label="offset")
        if offset < 0:
            return
        with pytest.raises(OffsetOutOfRangeError):
            self.log.read(offset)

    @rule(data=st.data(), max_bytes=st.integers(1, 80) | st.just(1 << 20))
    def iterate(self, data, max_bytes):
        lo = data.draw(st.integers(self.start, self.end), label="lo")
        hi = data.draw(st.integers(lo, self.end), label="hi")
        got = [rec_tuple(r) for r in self.log.iter(lo, hi, max_bytes=max_bytes)]
        assert got == self.slice(lo, hi), f"iter({lo}, {hi})"

    @rule(data=st.data())
    def offset_for_timestamp(self, data):
        stamps = [r[4] for r in self.visible()]
        choices = st.integers(T0 - 10, self.clock + 10)
        if stamps:
            choices = choices | st.sampled_from(stamps).flatmap(lambda t: st.sampled_from([t - 1, t, t + 1]))
        t = data.draw(choices | st.sampled_from([EARLIEST_TIMESTAMP, LATEST_TIMESTAMP]), label="timestamp")
        got = self.log.offset_for_timestamp(t)
        if t == EARLIEST_TIMESTAMP:
            assert got == self.start
        elif t == LATEST_TIMESTAMP:
            assert got == self.end
        else:
            expected = next((r[0] for r in self.visible() if r[4] >= t), None)
            assert got == expected, f"offset_for_timestamp({t})"

    # ------------------------------------------------------------------ maintenance
    @rule()
    def roll(self):
        before = self.log.segments
        self.log.roll()
        after = self.log.segments
        if before[-1].size == 0:
            assert [s.base_offset for s in after] == [s.base_offset for s in before]
        else:
            assert [s.base_offset for s in after] == [s.base_offset for s in before] + [self.end]
            assert after[-1].active and after[-1].size == 0

    @rule()
    def flush(self):
        self.log.flush()
        assert self.log.recovery_point == self.end

    @rule(data=st.data())
    def enforce_retention(self, data):
        cfg = self.cfg
        horizon = max(cfg["retention_ms"], 10_000)
        now = data.draw(st.integers(self.clock - 5_000, self.clock + horizon + 5_000)
                        | st.integers(self.clock, self.clock + 3 * horizon), label="now_ms")
        segs = self.log.segments
        # What the docstring promises, computed from the segments before the call:
        # below the log start, then time (the active one too), then size (sealed ones only).
        doomed: list[int] = []
        for i in range(len(segs) - 1):
            if segs[i + 1].base_offset <= self.start:
                doomed.append(i)
            else:
                break
        if cfg["retention_ms"] >= 0:
            for i, s in enumerate(segs):
                if s.size == 0 or s.max_timestamp >= now - cfg["retention_ms"]:
                    break
                if i not in doomed:
                    doomed.append(i)
        if cfg["retention_bytes"] >= 0:
            excess = sum(s.size for s in segs) - sum(segs[i].size for i in doomed) - cfg["retention_bytes"]
            for i, s in enumerate(segs):
                if s.active or i in doomed:
                    continue
                if excess - s.size < 0:
                    break
                excess -= s.size
                doomed.append(i)
        assert sorted(doomed) == list(range(len(doomed))), "retention deletes a prefix of segments"

        deleted = self.log.enforce_retention(now_ms=now)
        event(f"enforce_retention deleted {min(deleted, 2)}{'+' if deleted >= 2 else ''} segment(s)"
              + (", the active one too" if deleted and len(doomed) == len(segs) else ""))
        assert deleted == len(doomed)
        after = self.log.segments
        if len(doomed) == len(segs):  # the active segment expired: the log restarts empty at its end
            assert [(s.base_offset, s.size) for s in after] == [(self.end, 0)]
        else:
            assert [s.base_offset for s in after] == [s.base_offset for s in segs[len(doomed):]]
        if deleted:
            # the log start is a segment base (or stays ahead of it after delete_records_before)
            assert self.log.log_start_offset == max(self.start, after[0].base_offset)
        self.start = max(self.start, after[0].base_offset)
        self.records = [r for r in self.records if r[0] >= after[0].base_offset]

    @rule(data=st.data())
    def truncate_to(self, data):
        offset = data.draw(st.integers(self.start, self.end + 2), label="offset")
        self.log.truncate_to(offset)
        if offset >= self.end:
            return
        if offset <= self.start:
            # below or at the log start: the log is emptied and restarts at offset
            self.records = []
            self.start = offset
        else:
            self.records = [r for r in self.records if r[0] < offset]
            event("truncate_to inside the log")
        self.end = offset
        assert self.log.log_end_offset == offset

    @rule(data=st.data())
    def truncate_below_start(self, data):
        if self.start == 0:
            return
        offset = data.draw(st.integers(0, self.start - 1), label="offset")
        self.log.truncate_to(offset)
        if offset < self.end:
            self.records = []
            self.start = self.end = offset
            assert [(s.base_offset, s.size) for s in self.log.segments] == [(offset, 0)]

    @rule(data=st.data())
    def delete_records_before(self, data):
        offset = data.draw(st.integers(0, self.end) | st.just(self.end), label="offset")
        bases = [s.base_offset for s in self.log.segments]
        new_start = self.log.delete_records_before(offset)
        assert new_start == max(self.start, offset)
        if new_start > self.start:
            event("delete_records_before moved the start"
                  + (" and deleted segments" if self.log.segments[0].base_offset > bases[0] else ""))
            # every segment wholly below the new start goes; the one holding it stays
            first = max(b for b in bases if b <= new_start)
            assert self.log.segments[0].base_offset == first
            self.records = [r for r in self.records if r[0] >= first]
        self.start = new_start

    @rule(data=st.data())
    def delete_records_out_of_range(self, data):
        offset = data.draw(st.integers(self.end + 1, self.end + 50) | st.just(-1), label="offset")
        with pytest.raises(OffsetOutOfRangeError):
            self.log.delete_records_before(offset)

    # ------------------------------------------------------------------ reopening
    @rule()
    def reopen_clean(self):
        self.log.close()
        self.log = None
        self.log = Log.open(self.path, **self.cfg)
        report = self.log.recovery_report
        assert report.clean_shutdown and report.bytes_truncated == 0 and report.segments_deleted == 0

    @rule()
    def reopen_after_crash(self):
        # _abandon drops the maps and descriptors without flushing: the appended bytes are in
        # the page cache, so with no fsync policy every acknowledged record must survive.
        self.log._abandon()
        self.log = None
        self.log = Log.open(self.path, **self.cfg)
        report = self.log.recovery_report
        event(f"crash reopen with {min(len(self.log.segments), 3)} segment(s)")
        assert not report.clean_shutdown
        assert report.bytes_truncated == 0 and report.segments_deleted == 0

    # ------------------------------------------------------------------ invariants
    @invariant()
    def offsets_match_the_model(self):
        if self.log is None:
            return
        event(f"segments: {min(len(self.log.segments), 5)}")
        assert self.log.log_end_offset == self.end
        assert self.log.log_start_offset == self.start
        assert self.log.high_watermark == self.end
        assert self.start <= self.end

    @invariant()
    def segments_are_sorted_contiguous_and_hold_the_model(self):
        if self.log is None:
            return
        segs = self.log.segments
        assert segs, "a log always has an active segment"
        assert [s.active for s in segs] == [False] * (len(segs) - 1) + [True]
        assert segs[0].base_offset <= self.start
        for a, b in zip(segs, segs[1:]):
            assert a.base_offset < b.base_offset
            assert a.next_offset == b.base_offset, f"gap or overlap between segments {a} and {b}"
            assert a.size > 0, f"empty sealed segment {a}"
        assert segs[-1].next_offset == self.end
        # the model holds exactly the records of the segments, including those below the start
        first = segs[0].base_offset
        assert all(r[0] >= first for r in self.records)
        assert sum(s.record_count for s in segs) == len(self.records)
        for s in segs:
            mine = self.slice(s.base_offset, s.next_offset)
            assert s.record_count == len(mine), f"record_count of {s}"
            assert s.max_timestamp == max((r[4] for r in mine), default=-1), f"max_timestamp of {s}"
            assert s.size <= self.cfg["segment_bytes"], f"{s} is over segment_bytes"
        assert self.log.size_in_bytes == sum(s.size for s in segs)

    @invariant()
    def files_on_disk_are_exactly_the_segments(self):
        if self.log is None:
            return
        names = os.listdir(self.path)
        bases = sorted(int(n[:20]) for n in names if n.endswith(".log"))
        assert bases == [s.base_offset for s in self.log.segments]
        leftovers = [n for n in names if n.endswith((".deleted", ".cleaned", ".swap", ".tmp"))]
        assert not leftovers, leftovers

    @invariant()
    def reading_everything_from_the_start_equals_the_model(self):
        if self.log is None:
            return
        visible = self.visible()
        assert [r[0] for r in visible] == list(range(self.start, self.end)), "model offsets are contiguous"
        assert [rec_tuple(r) for r in self.log.iter()] == visible


LogMachine.TestCase.settings = settings(
    max_examples=60,
    stateful_step_count=40,
    deadline=None,
    database=None,
    report_multiple_bugs=False,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
TestLogMachine = LogMachine.TestCase


# ---------------------------------------------------------------- minimal cases the machine found


def _log(tmp, **cfg) -> Log:
    return Log.open(os.path.join(tmp, "events-0"), **cfg)


@pytest.mark.regression(reason=(
    "fixed: Log.read(max_offset=m) and Log.iter(start, end) stopped only before a batch whose base "
    "offset is >= the limit (RecordDecoder's max_offset is batch-granular), so a batch that "
    "straddles the limit yields records at and above it; the docstrings promise 'none at or "
    "above max_offset' and 'end (exclusive)'"))
def test_read_and_iter_stop_before_max_offset_inside_a_batch(tmp_path):
    with _log(str(tmp_path)) as log:
        log.append_batch([b"a", b"b", b"c"], timestamps=[T0, T0, T0])
        assert [r.offset for r in log.read(0, max_offset=1)] == [0]
        assert [r.offset for r in log.iter(0, 2)] == [0, 1]


@pytest.mark.regression(reason=("fixed: Log.offset_for_timestamp searches records below log_start_offset too and clamps the "
    "answer to the log start (max(record.offset, log_start)): after delete_records_before it "
    "returns an offset whose record is older than the timestamp, or the log end when no record "
    "is left, instead of the first record at or after the log start with timestamp >= t (None "
    "when there is none; Kafka's LogSegment.findOffsetByTimestamp filters offset >= start)"))
def test_offset_for_timestamp_ignores_records_below_the_log_start(tmp_path):
    with _log(str(tmp_path)) as log:
        log.append(b"a", timestamp=T0 + 100)
        log.append(b"b", timestamp=T0 + 10)
        log.append(b"c", timestamp=T0 + 50)
        log.delete_records_before(1)
        # records from the start: offset 1 (ts +10) and 2 (ts +50); none is at or after +60
        assert log.offset_for_timestamp(T0 + 60) is None
        assert log.offset_for_timestamp(T0 + 20) == 2
        log.delete_records_before(3)
        assert log.offset_for_timestamp(T0) is None  # no record left at all
