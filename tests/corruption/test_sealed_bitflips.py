"""Bit flips in sealed segments below the recovery point (Kafka LogSegmentTest's corrupt-record
reads, LevelDB log_test's ``ChecksumMismatch``).

Opening such a log does not rescan the segment (a clean shutdown, or a crash with the segment below
the recovery point), so the damage is met by reads. A read reaching the bad batch must raise
CorruptRecordError naming the file, the batch position, and the stored and computed CRC; it must
never return a record that was not written, and records elsewhere must stay readable.

baseOffset, batchLength, partitionLeaderEpoch and magic lie outside the CRC (it covers bytes
21..end): flips there are caught by structure checks or are harmless, but never yield wrong records.
"""

from __future__ import annotations

import random

import pytest

import logstore
from logstore import CorruptRecordError

from .helpers import (
    POS_ATTRIBUTES,
    POS_BASE_OFFSET,
    POS_BASE_SEQUENCE,
    POS_BASE_TIMESTAMP,
    POS_BATCH_LENGTH,
    POS_CRC,
    POS_LAST_OFFSET_DELTA,
    POS_LEADER_EPOCH,
    POS_MAGIC,
    POS_MAX_TIMESTAMP,
    POS_PRODUCER_EPOCH,
    POS_PRODUCER_ID,
    POS_RECORDS,
    POS_RECORDS_COUNT,
    BatchInfo,
    Written,
    as_rec,
    as_recs,
    batch_positions,
    computed_crc,
    flip,
    index_entries,
    index_path,
    make_log,
    open_log,
    read_bytes,
    read_everything,
    segment_logs,
    set_bytes,
    stored_crc,
)


class Sealed:
    """A closed log of several segments and one chosen multi-record batch in a sealed segment."""

    def __init__(self, path: str, written: Written, segment: str, batch: BatchInfo, batches: list[BatchInfo]):
        self.path = path
        self.written = written
        self.segment = segment
        self.batch = batch
        self.batches = batches
        self.expected = written.by_offset()
        self.segment_first = batches[0].base_offset
        self.segment_end = batches[-1].last_offset + 1

    def offsets_of_batch(self) -> range:
        return range(self.batch.base_offset, self.batch.last_offset + 1)

    def offsets_elsewhere(self) -> list[int]:
        """Offsets outside the target segment."""
        return [o for o in self.expected if not self.segment_first <= o < self.segment_end]

    def offsets_same_segment(self) -> list[int]:
        """Offsets of the target segment outside the bad batch."""
        return [o for o in range(self.segment_first, self.segment_end) if o not in self.offsets_of_batch()]


def _sealed_log(tmp_path, mode: str, seed: int = 11, at_index_entry: bool = False) -> Sealed:
    path = str(tmp_path / "t-0")
    log, written = make_log(path, random.Random(seed), 160)
    assert len(log.segments) >= 4
    if mode == "clean":
        log.close()
    else:
        # Sealed segments were fsynced when they rolled and lie below the recovery point; only
        # the active segment is rescanned after this crash.
        log._abandon()
    # A sealed segment with segments before and after it, holding many batches.
    segment = next(p for p in segment_logs(path)[1:-1] if len(batch_positions(p)) >= 12)
    batches = batch_positions(segment)
    middle = len(batches) // 2
    indexed = {pos for _, pos in index_entries(index_path(segment))}
    target = next(b for b in batches[middle:-1] + batches[1:middle]
                  if b.records_count >= 2 and (b.position in indexed or not at_index_entry))
    return Sealed(path, written, segment, target, batches)


def _reopen(s: Sealed, mode: str) -> logstore.Log:
    log = open_log(s.path)
    report = log.recovery_report
    assert report.clean_shutdown == (mode == "clean")
    assert report.bytes_truncated == 0 and report.segments_deleted == 0
    assert report.segments_recovered == (0 if mode == "clean" else 1)  # never the damaged one
    return log


def _assert_crc_error(exc: CorruptRecordError, s: Sealed) -> None:
    stored, computed = stored_crc(s.segment, s.batch.position), computed_crc(s.segment, s.batch.position)
    assert stored != computed
    assert exc.path == s.segment
    assert exc.position == s.batch.position
    assert exc.stored_crc == stored
    assert exc.computed_crc == computed
    message = str(exc)
    assert s.segment in message and str(s.batch.position) in message
    assert f"{stored:#010x}" in message and f"{computed:#010x}" in message


def _assert_never_wrong(records, start: int, s: Sealed) -> None:
    """A read from ``start`` returned only records that were written, from ``start`` on, with
    no offset skipped."""
    assert records, f"read({start}) returned nothing inside the log"
    got = as_recs(records)
    assert got[0].offset == start, f"read({start}) began at offset {got[0].offset}"
    for rec in got:
        assert rec == s.expected.get(rec.offset), f"read({start}) returned a record never written: {rec!r}"
    offsets = [r.offset for r in got]
    assert offsets == list(range(start, start + len(offsets))), f"read({start}) skipped offsets: {offsets}"


def read_everything_from(log: logstore.Log, start: int) -> list:
    return as_recs(list(log.iter(start)))


# Bytes covered by the CRC (21..end): a flip anywhere there must fail the CRC check.
CRC_COVERED = {
    "attributes": lambda b: b.position + POS_ATTRIBUTES + 1,
    "last_offset_delta": lambda b: b.position + POS_LAST_OFFSET_DELTA + 3,
    "base_timestamp": lambda b: b.position + POS_BASE_TIMESTAMP + 7,
    "max_timestamp": lambda b: b.position + POS_MAX_TIMESTAMP + 4,
    "producer_id": lambda b: b.position + POS_PRODUCER_ID,
    "producer_epoch": lambda b: b.position + POS_PRODUCER_EPOCH + 1,
    "base_sequence": lambda b: b.position + POS_BASE_SEQUENCE + 2,
    "records_count": lambda b: b.position + POS_RECORDS_COUNT + 3,
    "first_record_length": lambda b: b.position + POS_RECORDS,
    "record_body": lambda b: b.position + (b.size + POS_RECORDS) // 2,
    "last_byte": lambda b: b.end - 1,
}


@pytest.mark.parametrize("mode", ["clean", "crash"])
@pytest.mark.parametrize("bit", [0, 5])
@pytest.mark.parametrize("field", sorted(CRC_COVERED))
def test_flip_in_crc_covered_bytes_of_sealed_batch_raises_crc_error(tmp_path, field, bit, mode):
    s = _sealed_log(tmp_path, mode)
    flip(s.segment, CRC_COVERED[field](s.batch), bit)
    damaged = read_bytes(s.segment)
    with _reopen(s, mode) as log:
        for offset in s.offsets_of_batch():
            for kwargs in ({}, {"max_records": 1}):
                with pytest.raises(CorruptRecordError) as info:
                    log.read(offset, **kwargs)
                _assert_crc_error(info.value, s)
        # Other segments are untouched by the damage.
        for offset in s.offsets_elsewhere():
            assert as_rec(log.read(offset, max_records=1)[0]) == s.expected[offset]
        # A whole-log iteration stops at the bad batch, having yielded only true records.
        yielded = []
        with pytest.raises(CorruptRecordError) as info:
            for record in log.iter():
                yielded.append(as_rec(record))
        _assert_crc_error(info.value, s)
        assert yielded == s.written.records[: len(yielded)]
        assert all(r.offset < s.batch.base_offset for r in yielded)
        # Iteration from the next segment on is unaffected.
        assert read_everything_from(log, s.segment_end) == [r for r in s.written.records if r.offset >= s.segment_end]
    assert read_bytes(s.segment) == damaged, "a sealed segment must not be rewritten by reads"


@pytest.mark.regression(reason="fixed: read(offset, max_bytes=1) at a corrupt batch returns the "
                   "next segment's records instead of raising: the cut-off window is taken for a "
                   "partial tail, the segment yields [] and Log.read moves on")
@pytest.mark.parametrize("max_bytes", [1, 60])
def test_read_with_tiny_max_bytes_at_bad_batch_raises_instead_of_skipping(tmp_path, max_bytes):
    s = _sealed_log(tmp_path, "clean")
    flip(s.segment, CRC_COVERED["last_byte"](s.batch), 0)
    with _reopen(s, "clean") as log:
        outcomes = {}
        for offset in s.offsets_of_batch():
            try:
                outcomes[offset] = [r.offset for r in log.read(offset, max_bytes=max_bytes)]
            except CorruptRecordError as exc:
                _assert_crc_error(exc, s)
                outcomes[offset] = "raised"
        assert outcomes == {offset: "raised" for offset in s.offsets_of_batch()}


@pytest.mark.parametrize("mode", ["clean", "crash"])
@pytest.mark.parametrize("bit", range(8))
@pytest.mark.parametrize("byte", range(4))
def test_flip_in_stored_crc_of_sealed_batch_reports_both_crcs(tmp_path, byte, bit, mode):
    s = _sealed_log(tmp_path, mode)
    original = stored_crc(s.segment, s.batch.position)
    flip(s.segment, s.batch.position + POS_CRC + byte, bit)
    with _reopen(s, mode) as log:
        with pytest.raises(CorruptRecordError) as info:
            log.read(s.batch.base_offset)
        _assert_crc_error(info.value, s)
        assert info.value.computed_crc == original
        assert info.value.stored_crc == original ^ (1 << (8 * (3 - byte) + bit))


@pytest.mark.regression(reason="fixed: a read of a valid offset raises when a later batch in "
                   "its decode window (or between the index floor and the offset) is corrupt")
def test_records_of_damaged_segment_outside_bad_batch_stay_readable(tmp_path):
    s = _sealed_log(tmp_path, "clean")
    flip(s.segment, CRC_COVERED["record_body"](s.batch), 3)
    with _reopen(s, "clean") as log:
        unreadable = []
        for offset in s.offsets_same_segment():
            try:
                assert as_rec(log.read(offset, max_records=1)[0]) == s.expected[offset]
            except CorruptRecordError:
                unreadable.append(offset)
        assert unreadable == []


@pytest.mark.regression(reason="fixed: iter() raises at its first read window holding the "
                   "bad batch, so the valid records before it in that window are never yielded")
def test_iter_yields_every_record_before_bad_batch_then_raises(tmp_path):
    s = _sealed_log(tmp_path, "clean")
    flip(s.segment, CRC_COVERED["record_body"](s.batch), 3)
    with _reopen(s, "clean") as log:
        yielded = []
        with pytest.raises(CorruptRecordError) as info:
            for record in log.iter():
                yielded.append(as_rec(record))
        _assert_crc_error(info.value, s)
        assert yielded == s.written.upto(s.batch.base_offset)


def _read_every_offset_of_segment(log: logstore.Log, s: Sealed) -> None:
    for offset in range(s.segment_first, s.segment_end):
        try:
            log.read(offset, max_records=1)
        except CorruptRecordError:
            pass


@pytest.mark.regression(reason="fixed: a failed read at a batch an index entry points to "
                   "rebuilds the segment's indexes and resets its facts from a scan that stops at "
                   "the bad batch: next_offset, record_count and max_timestamp shrink")
def test_failed_reads_of_bad_batch_do_not_change_segment_facts(tmp_path):
    # A batch an index entry points at: a failed read there looks like a bad index entry.
    s = _sealed_log(tmp_path, "clean", at_index_entry=True)
    flip(s.segment, CRC_COVERED["record_body"](s.batch), 3)
    with _reopen(s, "clean") as log:
        before = log.segments
        _read_every_offset_of_segment(log, s)
        assert log.segments == before


@pytest.mark.regression(reason="fixed: after a failed read shrank the damaged segment's "
                   "max_timestamp, offset_for_timestamp skips the segment and answers with an "
                   "offset of the next segment")
def test_offset_for_timestamp_never_answers_wrongly_after_failed_reads(tmp_path):
    s = _sealed_log(tmp_path, "clean", at_index_entry=True)
    flip(s.segment, CRC_COVERED["record_body"](s.batch), 3)
    with _reopen(s, "clean") as log:
        _read_every_offset_of_segment(log, s)
        # Time lookups may raise at the bad batch, but never answer wrongly.
        wrong = {}
        for rec in s.written.records:
            try:
                got = log.offset_for_timestamp(rec.timestamp)
            except CorruptRecordError:
                continue
            if got != rec.offset:
                wrong[rec.offset] = got
        assert wrong == {}


def test_offset_for_timestamp_in_damaged_log_raises_or_answers_right(tmp_path):
    """The same sweep without failed reads before it."""
    s = _sealed_log(tmp_path, "clean", at_index_entry=True)
    flip(s.segment, CRC_COVERED["record_body"](s.batch), 3)
    with _reopen(s, "clean") as log:
        answered = 0
        for rec in s.written.records:
            try:
                got = log.offset_for_timestamp(rec.timestamp)
            except CorruptRecordError as exc:
                assert exc.path == s.segment
                continue
            assert got == rec.offset
            answered += 1
        assert answered >= len(s.offsets_elsewhere())


@pytest.mark.parametrize("mode", ["clean", "crash"])
@pytest.mark.parametrize("bit", [0, 3, 7])
@pytest.mark.parametrize("byte", range(4))
def test_flip_in_batch_length_of_sealed_batch_raises_and_never_returns_wrong_records(tmp_path, byte, bit, mode):
    s = _sealed_log(tmp_path, mode)
    flip(s.segment, s.batch.position + POS_BATCH_LENGTH + byte, bit)
    with _reopen(s, mode) as log:
        for offset in s.offsets_of_batch():
            with pytest.raises(CorruptRecordError) as info:
                log.read(offset)
            assert info.value.path == s.segment
            assert info.value.position == s.batch.position
        for offset in range(s.segment_first, s.segment_end):
            try:
                records = log.read(offset)
            except CorruptRecordError as exc:
                assert exc.path == s.segment
                continue
            _assert_never_wrong(records, offset, s)
        for offset in s.offsets_elsewhere():
            assert as_rec(log.read(offset, max_records=1)[0]) == s.expected[offset]


_BASE_OFFSET_BUG = pytest.mark.regression(reason="fixed: baseOffset lies outside the CRC and "
                                     "reads do not check that batch offsets increase within the "
                                     "segment's range: records come back with wrong offsets or are skipped")


@pytest.mark.parametrize("mode", ["clean", "crash"])
@pytest.mark.parametrize("byte,bit", [
    pytest.param(7, 0, marks=_BASE_OFFSET_BUG, id="lowest-bit"),
    pytest.param(7, 4, marks=_BASE_OFFSET_BUG, id="bit-4"),
    pytest.param(5, 1, marks=_BASE_OFFSET_BUG, id="bit-17"),
    pytest.param(0, 7, id="sign-bit"),
])
def test_flip_in_base_offset_of_sealed_batch_never_returns_wrong_records(tmp_path, byte, bit, mode):
    s = _sealed_log(tmp_path, mode)
    flip(s.segment, s.batch.position + POS_BASE_OFFSET + byte, bit)
    with _reopen(s, mode) as log:
        for offset in range(s.segment_first, s.segment_end):
            try:
                records = log.read(offset, max_records=1)
            except CorruptRecordError as exc:
                assert exc.path == s.segment
                continue
            _assert_never_wrong(records, offset, s)
        yielded = []
        try:
            for record in log.iter(s.segment_first, s.segment_end):
                yielded.append(as_rec(record))
        except CorruptRecordError:
            pass
        assert yielded == [s.expected[o] for o in range(s.segment_first, s.segment_first + len(yielded))]


@pytest.mark.parametrize("mode", ["clean", "crash"])
@pytest.mark.parametrize("value", [0, 1, 3, 0x7F, 0xFF])
def test_bad_magic_in_sealed_batch_raises_naming_magic(tmp_path, value, mode):
    s = _sealed_log(tmp_path, mode)
    set_bytes(s.segment, s.batch.position + POS_MAGIC, bytes([value]))
    with _reopen(s, mode) as log:
        for offset in s.offsets_of_batch():
            with pytest.raises(CorruptRecordError) as info:
                log.read(offset)
            assert info.value.path == s.segment
            assert info.value.position == s.batch.position
            assert "magic" in info.value.reason and "magic" in str(info.value)
        for offset in s.offsets_elsewhere():
            assert as_rec(log.read(offset, max_records=1)[0]) == s.expected[offset]


@pytest.mark.parametrize("mode", ["clean", "crash"])
@pytest.mark.parametrize("byte", range(4))
def test_flip_in_partition_leader_epoch_is_harmless(tmp_path, byte, mode):
    """The epoch is outside the CRC and not part of a Record: the data reads back unchanged."""
    s = _sealed_log(tmp_path, mode)
    flip(s.segment, s.batch.position + POS_LEADER_EPOCH + byte, 6)
    with _reopen(s, mode) as log:
        assert read_everything(log) == s.written.records
        for offset in s.offsets_of_batch():
            assert as_rec(log.read(offset, max_records=1)[0]) == s.expected[offset]


@pytest.mark.parametrize("seed", range(12))
def test_random_bit_flips_in_sealed_segment_never_return_wrong_records(tmp_path, seed):
    """A few flips anywhere in the CRC-covered bytes of a sealed segment's batches: every read
    either raises CorruptRecordError for that file or returns exactly what was written."""
    s = _sealed_log(tmp_path, "clean", seed=seed)
    rng = random.Random(seed)
    size = len(read_bytes(s.segment))
    covered = [p for b in s.batches for p in range(b.position + POS_ATTRIBUTES, b.end)]
    for _ in range(rng.randrange(1, 4)):
        flip(s.segment, rng.choice(covered), rng.randrange(8))
    with _reopen(s, "clean") as log:
        for offset in range(s.segment_first, s.segment_end):
            try:
                records = log.read(offset)
            except CorruptRecordError as exc:
                assert exc.path == s.segment and 0 <= exc.position < size
                continue
            _assert_never_wrong(records, offset, s)
        for offset in s.offsets_elsewhere():
            assert as_rec(log.read(offset, max_records=1)[0]) == s.expected[offset]


@pytest.mark.regression(reason="fixed: Log.segments raises CorruptRecordError when a sealed "
                   "segment's last batches (after its last index entry) are damaged: SegmentInfo "
                   "needs next_offset, which a clean open learns lazily by walking that tail")
@pytest.mark.parametrize("mode", ["clean", "crash"])
def test_segments_are_reported_when_a_sealed_segment_tail_batch_is_damaged(tmp_path, mode):
    path = str(tmp_path / "t-0")
    log, written = make_log(path, random.Random(11), 160)
    pristine = [(s.base_offset, s.size, s.next_offset) for s in log.segments]
    log.close() if mode == "clean" else log._abandon()
    segment = next(p for p in segment_logs(path)[1:-1] if len(batch_positions(p)) >= 12)
    last = batch_positions(segment)[-1]
    assert last.position >= max(pos for _, pos in index_entries(index_path(segment)))  # in the tail walk
    flip(segment, last.end - 1, 4)
    with open_log(path) as log:
        # Describing the log must not fail; reading the damaged batch must.
        assert [(s.base_offset, s.size, s.next_offset) for s in log.segments] == pristine
        with pytest.raises(CorruptRecordError):
            log.read(last.base_offset)
