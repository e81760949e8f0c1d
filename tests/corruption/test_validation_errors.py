"""One test per validation rule of the C core that data on disk can break, reached through Log
(the rules of ``ls_batch_validate`` and ``ls_records_walk`` in logstore.h: "a batch is valid iff
...").

Each damage is made to one known batch; where the rule is inside the CRC-covered bytes the CRC is
recomputed (``fix_crc``) so that the structural check itself is what must catch it. Every case runs
twice: in a sealed segment, where a read must raise CorruptRecordError naming the file, the batch
position and the broken rule; and in the active segment after a crash, where recovery must keep
exactly the batches before it and report the bytes it dropped.
"""

from __future__ import annotations

import random
import struct
from dataclasses import dataclass
from typing import Callable

import pytest

from logstore import CorruptRecordError

from .helpers import (
    POS_BASE_OFFSET,
    POS_BATCH_LENGTH,
    POS_LAST_OFFSET_DELTA,
    POS_MAGIC,
    POS_RECORDS,
    POS_RECORDS_COUNT,
    BatchInfo,
    Rec,
    Written,
    as_rec,
    assert_append_continues,
    batch_positions,
    computed_crc,
    deadline,
    dropped_bytes,
    ensure_room,
    fix_crc,
    flip,
    open_log,
    read_bytes,
    read_everything,
    record_layout,
    remove_clean_marker,
    index_entries,
    index_path,
    segment_base,
    segment_logs,
    set_bytes,
    set_varint,
    stored_crc,
    timestamp_of,
    write_records,
)

KNOWN_COUNT = 4


def _append_known_batch(log, written: Written, codec: str | None = None) -> int:
    """Four small records (every varint one byte) with keys and a header, as one batch."""
    first = log.log_end_offset
    values = [b"value-%d" % i for i in range(KNOWN_COUNT)]
    keys = [b"k%d" % i for i in range(KNOWN_COUNT)]
    headers = [[("h", b"x%d" % i)] for i in range(KNOWN_COUNT)]
    stamps = [timestamp_of(first + i) for i in range(KNOWN_COUNT)]
    assert log.append_batch(values, keys=keys, headers=headers, timestamps=stamps, compression=codec) == first
    written.records += [Rec(first + i, stamps[i], keys[i], values[i], headers[i]) for i in range(KNOWN_COUNT)]
    written.batches.append((first, first + KNOWN_COUNT - 1))
    return first


@dataclass
class Known:
    path: str
    written: Written
    segment: str
    batch: BatchInfo
    segment_end: int  # one past the damaged segment's last offset

    def layout(self):
        return record_layout(self.segment, self.batch.position)


def _log_with_known_batch(tmp_path, where: str, codec: str | None = None) -> Known:
    """``sealed``: the known batch sits in a sealed segment with segments on both sides; the log
    is closed cleanly. ``active``: it sits in the active segment, followed by a few batches; the
    log is closed and its clean-shutdown marker removed, so the next open recovers it."""
    rng = random.Random(17)
    path = str(tmp_path / "t-0")
    log = open_log(path)
    written = write_records(log, rng, 70)
    ensure_room(log, rng, written, 2000)
    # A batch of more than index_interval_bytes right before: the known batch gets an index entry.
    o = log.log_end_offset
    assert log.append(b"p" * 150, timestamp=timestamp_of(o)) == o
    written.records.append(Rec(o, timestamp_of(o), None, b"p" * 150, []))
    written.batches.append((o, o))
    first = _append_known_batch(log, written, codec)
    written.extend(write_records(log, rng, 3))
    if where == "sealed":
        log.roll()
        written.extend(write_records(log, rng, 40))
        assert log.segments[-1].base_offset > first
    else:
        assert log.segments[-1].base_offset <= first
    log.close()
    segment = [p for p in segment_logs(path) if segment_base(p) <= first][-1]
    batch = next(b for b in batch_positions(segment) if b.base_offset == first)
    assert batch.records_count == KNOWN_COUNT and batch.position > 0
    assert (batch.last_offset, batch.position) in index_entries(index_path(segment), segment_base(segment))
    if where == "active":
        remove_clean_marker(path)
    return Known(path, written, segment, batch, batch_positions(segment)[-1].last_offset + 1)


# ---------------------------------------------------------------- the damage, one rule each
# Each function damages k.batch and returns the words the error's reason must contain.


def bad_magic(k: Known) -> str:
    set_bytes(k.segment, k.batch.position + POS_MAGIC, b"\x01")
    return "magic"


def batch_length_below_minimum(k: Known) -> str:
    set_bytes(k.segment, k.batch.position + POS_BATCH_LENGTH, struct.pack(">i", 48))
    return "malformed"


def batch_length_negative(k: Known) -> str:
    set_bytes(k.segment, k.batch.position + POS_BATCH_LENGTH, struct.pack(">i", -100))
    return "malformed"


def batch_length_past_end_of_file(k: Known) -> str:
    size = len(read_bytes(k.segment))
    set_bytes(k.segment, k.batch.position + POS_BATCH_LENGTH, struct.pack(">i", size))
    return "truncated"


def crc_mismatch(k: Known) -> str:
    flip(k.segment, k.batch.position + POS_RECORDS + 3, 2)
    return "CRC"


def negative_base_offset(k: Known) -> str:
    flip(k.segment, k.batch.position + POS_BASE_OFFSET, 7)
    return "malformed"


def records_count_one_more(k: Known) -> str:
    set_bytes(k.segment, k.batch.position + POS_RECORDS_COUNT, struct.pack(">i", KNOWN_COUNT + 1))
    fix_crc(k.segment, k.batch.position)
    return "malformed"


def records_count_one_less(k: Known) -> str:
    set_bytes(k.segment, k.batch.position + POS_RECORDS_COUNT, struct.pack(">i", KNOWN_COUNT - 1))
    fix_crc(k.segment, k.batch.position)
    return "malformed"


def records_count_negative(k: Known) -> str:
    set_bytes(k.segment, k.batch.position + POS_RECORDS_COUNT, struct.pack(">i", -1))
    fix_crc(k.segment, k.batch.position)
    return "malformed"


def records_count_beyond_batch_bytes(k: Known) -> str:
    """recordsCount * 7 > the records section (lastOffsetDelta raised to allow the count)."""
    set_bytes(k.segment, k.batch.position + POS_LAST_OFFSET_DELTA, struct.pack(">i", 10**6))
    set_bytes(k.segment, k.batch.position + POS_RECORDS_COUNT, struct.pack(">i", 10**6))
    fix_crc(k.segment, k.batch.position)
    return "malformed"


def last_offset_delta_negative(k: Known) -> str:
    set_bytes(k.segment, k.batch.position + POS_LAST_OFFSET_DELTA, struct.pack(">i", -1))
    fix_crc(k.segment, k.batch.position)
    return "malformed"


def last_offset_delta_below_record_count(k: Known) -> str:
    set_bytes(k.segment, k.batch.position + POS_LAST_OFFSET_DELTA, struct.pack(">i", KNOWN_COUNT - 2))
    fix_crc(k.segment, k.batch.position)
    return "malformed"


def record_length_past_records_section(k: Known) -> str:
    """The last record claims more bytes than the batch has left."""
    last = k.layout()[-1]
    set_varint(k.segment, last.length, 63)
    fix_crc(k.segment, k.batch.position)
    return "truncated"


def record_length_longer_than_its_fields(k: Known) -> str:
    first = k.layout()[0]
    set_varint(k.segment, first.length, first.length.value + 1)
    fix_crc(k.segment, k.batch.position)
    return "malformed"


def record_length_shorter_than_its_fields(k: Known) -> str:
    first = k.layout()[0]
    set_varint(k.segment, first.length, first.length.value - 1)
    fix_crc(k.segment, k.batch.position)
    return "malformed"


def record_length_negative(k: Known) -> str:
    set_varint(k.segment, k.layout()[1].length, -2)
    fix_crc(k.segment, k.batch.position)
    return "malformed"


def key_length_past_record(k: Known) -> str:
    first = k.layout()[0]
    set_varint(k.segment, first.key_length, first.length.value)
    fix_crc(k.segment, k.batch.position)
    return "malformed"


def value_length_below_minus_one(k: Known) -> str:
    set_varint(k.segment, k.layout()[2].value_length, -2)
    fix_crc(k.segment, k.batch.position)
    return "malformed"


def offset_delta_not_increasing(k: Known) -> str:
    set_varint(k.segment, k.layout()[1].offset_delta, 0)
    fix_crc(k.segment, k.batch.position)
    return "malformed"


def offset_delta_beyond_last_offset_delta(k: Known) -> str:
    set_varint(k.segment, k.layout()[-1].offset_delta, KNOWN_COUNT + 3)
    fix_crc(k.segment, k.batch.position)
    return "malformed"


def header_count_negative(k: Known) -> str:
    set_varint(k.segment, k.layout()[0].header_count, -1)
    fix_crc(k.segment, k.batch.position)
    return "malformed"


def header_count_beyond_record(k: Known) -> str:
    set_varint(k.segment, k.layout()[0].header_count, 40)
    fix_crc(k.segment, k.batch.position)
    return "malformed"


RULES: dict[str, Callable[[Known], str]] = {f.__name__: f for f in (
    bad_magic, batch_length_below_minimum, batch_length_negative, batch_length_past_end_of_file,
    crc_mismatch, negative_base_offset, records_count_one_more, records_count_one_less,
    records_count_negative, records_count_beyond_batch_bytes, last_offset_delta_negative,
    last_offset_delta_below_record_count, record_length_past_records_section,
    record_length_longer_than_its_fields, record_length_shorter_than_its_fields,
    record_length_negative, key_length_past_record, value_length_below_minus_one,
    offset_delta_not_increasing, offset_delta_beyond_last_offset_delta, header_count_negative,
    header_count_beyond_record,
)}


def test_known_batch_layout_is_what_the_rules_assume(tmp_path):
    k = _log_with_known_batch(tmp_path, "sealed")
    layout = k.layout()
    assert len(layout) == KNOWN_COUNT
    assert [r.offset_delta.value for r in layout] == list(range(KNOWN_COUNT))
    assert all(r.length.size == 1 and r.key_length.value == 2 and r.header_count.value == 1 for r in layout)
    assert stored_crc(k.segment, k.batch.position) == computed_crc(k.segment, k.batch.position)
    # fix_crc on an intact batch is a no-op: it computes what the writer stored.
    before = read_bytes(k.segment)
    fix_crc(k.segment, k.batch.position)
    assert read_bytes(k.segment) == before


@pytest.mark.parametrize("rule", sorted(RULES))
def test_rule_broken_in_sealed_segment_raises_on_read(tmp_path, rule):
    k = _log_with_known_batch(tmp_path, "sealed")
    words = RULES[rule](k)
    expected = k.written.by_offset()
    with open_log(k.path) as log:
        assert log.recovery_report.clean_shutdown
        for offset in range(k.batch.base_offset, k.batch.last_offset + 1):
            with pytest.raises(CorruptRecordError) as info:
                log.read(offset)
            exc = info.value
            assert exc.path == k.segment
            assert exc.position == k.batch.position
            assert words in exc.reason and words in str(exc)
            if rule == "crc_mismatch":
                assert exc.stored_crc == stored_crc(k.segment, k.batch.position)
                assert exc.computed_crc == computed_crc(k.segment, k.batch.position) != exc.stored_crc
        # Segments other than the damaged one read normally.
        for rec in k.written.records:
            if not segment_base(k.segment) <= rec.offset < k.segment_end:
                assert as_rec(log.read(rec.offset, max_records=1)[0]) == expected[rec.offset]


_SKIP_BUG = pytest.mark.regression(reason="fixed: read(offset, max_bytes=1) at a corrupt batch "
                              "returns the next segment's records: the cut-off byte window is taken for "
                              "a partial tail, the segment yields [] and Log.read moves on")
_HANG_BUG = pytest.mark.regression(reason="fixed: read(offset, max_bytes=1 or 100) never returns "
                              "when a CRC-valid batch has a record whose length runs past the records "
                              "section: the records walk's LS_ERR_TRUNCATED is taken for a partial tail "
                              "and LogSegment.read retries the same window forever")


def _small_window_cases():
    for rule in sorted(RULES):
        yield pytest.param(rule, 100, marks=[_HANG_BUG] if rule == "record_length_past_records_section" else [],
                           id=f"{rule}-100")
    yield pytest.param("bad_magic", 1, marks=[_SKIP_BUG], id="bad_magic-1")
    yield pytest.param("record_length_past_records_section", 1, marks=[_HANG_BUG], id="record_length_past_records_section-1")


@pytest.mark.parametrize("rule,max_bytes", list(_small_window_cases()))
def test_rule_broken_in_sealed_segment_raises_on_read_with_small_max_bytes(tmp_path, rule, max_bytes):
    """A small byte budget must not hide the damage (nor loop on it). The read starts at the
    damaged batch (its last offset has an index entry there)."""
    k = _log_with_known_batch(tmp_path, "sealed")
    words = RULES[rule](k)
    offset = k.batch.last_offset
    with open_log(k.path) as log:
        with pytest.raises(CorruptRecordError) as info, deadline(1, f"read({offset}, max_bytes={max_bytes})"):
            log.read(offset, max_bytes=max_bytes)
        assert info.value.path == k.segment
        assert info.value.position == k.batch.position
        assert words in info.value.reason


@pytest.mark.parametrize("rule", sorted(RULES))
def test_rule_broken_in_active_segment_is_truncated_by_recovery(tmp_path, rule):
    k = _log_with_known_batch(tmp_path, "active")
    RULES[rule](k)
    data = read_bytes(k.segment)
    survivors = k.written.upto(k.batch.base_offset)
    with open_log(k.path) as log:
        report = log.recovery_report
        assert not report.clean_shutdown
        assert report.bytes_truncated == dropped_bytes(data, k.batch.position) > 0
        assert log.log_end_offset == k.batch.base_offset
        assert log.segments[-1].size == k.batch.position
        assert read_everything(log) == survivors
        assert_append_continues(log, survivors)


@pytest.mark.parametrize("codec", ["gzip", "zstd"])
def test_compressed_batch_with_garbage_payload_and_valid_crc_raises_on_read(tmp_path, codec):
    k = _log_with_known_batch(tmp_path, "sealed", codec=codec)
    rng = random.Random(codec)
    set_bytes(k.segment, k.batch.position + POS_RECORDS, rng.randbytes(k.batch.size - POS_RECORDS))
    fix_crc(k.segment, k.batch.position)
    with open_log(k.path) as log:
        for offset in range(k.batch.base_offset, k.batch.last_offset + 1):
            with pytest.raises(CorruptRecordError) as info:
                log.read(offset)
            assert info.value.path == k.segment
            assert info.value.position == k.batch.position
