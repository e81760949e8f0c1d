"""Reads of a few records at an offset (Log.read(offset, max_records=k)): the C walk returns
only the rows asked for (``ls_cursor.partial``), validates a batch whole the first time and
remembers it (``ls_crc_memo``: position, stored CRC and record marks), and never trusts what
the memo says beyond what it can check against the bytes."""

from __future__ import annotations

import os
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from logstore import Log
from logstore.errors import CorruptRecordError, OffsetOutOfRangeError
from logstore.log.pointread import PointReads, read_point, read_point_active
from logstore._native import ffi
from logstore.records.batch import BatchBuilder, RecordDecoder, parse_header


def make_memo(slots: int = 64, marks: int = 4, nexts: bool = False):
    memo = ffi.new("ls_crc_memo *")
    arrays = (ffi.new("int64_t[]", slots), ffi.new("uint32_t[]", slots), ffi.new("int32_t[]", max(1, slots * marks)))
    memo.positions, memo.crcs, memo.marks = arrays
    memo.slots, memo.nmarks = slots, marks
    if nexts:
        arrays += (ffi.new("int64_t[]", slots),)
        memo.nexts = arrays[-1]
    return memo, arrays


def segment(specs) -> tuple[bytes, list[int]]:
    """Batches from specs: (count, gaps, with_headers, codec) each; returns (bytes, offsets)."""
    out, offsets, base = b"", [], 0
    builder = BatchBuilder()
    for i, (count, gaps, with_headers, codec) in enumerate(specs):
        deltas = [2 * j for j in range(count)] if gaps else None
        values = [b"v%d-%d" % (i, j) * (j % 5 + 1) if j % 7 != 3 else None for j in range(count)]
        keys = [b"k%d" % j if j % 2 else None for j in range(count)]
        headers = [[("h", b"%d" % j)] if with_headers and j % 3 == 0 else None for j in range(count)]
        batch = bytes(builder.build(values, keys, headers, base_offset=base, codec=codec, offset_deltas=deltas))
        last = base + (deltas[-1] if deltas else count - 1)
        offsets += [base + d for d in (deltas or range(count))]
        out += batch
        base = last + 1 + (i % 2)  # and sometimes a gap between batches
    return out, offsets


specs_st = st.lists(st.tuples(st.integers(1, 40), st.booleans(), st.booleans(), st.sampled_from([0, 0, 0, 4])),
                    min_size=1, max_size=6)


@settings(max_examples=60, deadline=None)
@given(specs_st, st.integers(1, 4), st.sampled_from([(64, 4), (1, 1), (2, 0), (8, 16)]), st.booleans())
def test_partial_reads_return_what_a_whole_read_returns_first_time_and_when_remembered(specs, k, shape, nexts):
    buf, offsets = segment(specs)
    whole, _ = RecordDecoder().decode(buf, 0, len(buf))
    assert [r.offset for r in whole] == offsets
    memo, _keep = make_memo(*shape, nexts=nexts)
    decoder = RecordDecoder()
    for _ in range(2):  # the second pass finds the batches in the memo
        for offset in range(offsets[-1] + 2):
            expected = [r for r in whole if r.offset >= offset][:k]
            got, _ = decoder.decode(buf, 0, len(buf), offset, -1, k, exact=True, memo=memo)
            assert got == expected, offset
    if any(codec == 0 for *_, codec in specs):  # compressed batches are decoded whole, not remembered
        assert any(memo.positions[i] for i in range(shape[0]))


def _dense_segment(batches: int = 4, count: int = 50) -> bytes:
    builder = BatchBuilder()
    return b"".join(bytes(builder.build([b"value-%d-%d" % (b, j) for j in range(count)], base_offset=b * count))
                    for b in range(batches))


def test_a_remembered_batch_is_validated_again_when_rewritten_at_its_position():
    buf = bytearray(_dense_segment())
    memo, _keep = make_memo()
    decoder = RecordDecoder()
    assert decoder.decode(buf, 0, len(buf), 70, -1, 1, exact=True, memo=memo)[0][0].value == b"value-1-20"
    # The same position now holds another batch with the same offsets (a truncation and new
    # appends): another CRC, so it is validated again and read as it is now.
    second = parse_header(buf, 0).size
    other = bytes(BatchBuilder().build([b"VALUE-%d-%d" % (1, j) for j in range(50)], base_offset=50))
    assert len(other) == parse_header(buf, second).size
    buf[second : second + len(other)] = other
    assert decoder.decode(buf, 0, len(buf), 70, -1, 1, exact=True, memo=memo)[0][0].value == b"VALUE-1-20"
    # Damage under a new CRC is found: the batch is not trusted.
    damaged = bytearray(other)
    damaged[-3] ^= 0x01
    damaged[17:21] = (int.from_bytes(other[17:21], "big") ^ 1).to_bytes(4, "big")
    buf[second : second + len(other)] = damaged
    with pytest.raises(CorruptRecordError, match="CRC"):
        decoder.decode(buf, 0, len(buf), 70, -1, 1, exact=True, memo=memo)


def _slot(position: int, slots: int) -> int:
    """A memo slot of the bucket of a batch position (scan.c's memo_bucket; with 4 slots or
    fewer, the memo is one bucket)."""
    return ((position * 0x9E3779B97F4A7C15) % 2**64 >> 32) & (slots - 1)


def test_garbage_in_the_memo_never_reads_outside_the_batch():
    buf = _dense_segment()
    whole, _ = RecordDecoder().decode(buf, 0, len(buf))
    rnd = random.Random(7)
    trusted = 0
    for _ in range(300):
        memo, (positions, crcs, marks) = make_memo(slots=4, marks=4)
        position = 0
        while position < len(buf):  # trust the batches (as if validated), marks are anything
            header = parse_header(buf, position)
            slot = _slot(position, 4)
            positions[slot], crcs[slot] = position + 1, header.crc
            position += header.size
        for i in range(16):
            marks[i] = rnd.choice([-1, 0, 1, 5, 61, 200, 2**31 - 1, -2**31, rnd.randrange(0, 5000)])
        offset = rnd.randrange(0, 200)
        try:
            got, _ = RecordDecoder().decode(buf, 0, len(buf), offset, -1, 1, exact=True, memo=memo)
        except CorruptRecordError:
            continue
        trusted += 1
        # A mark inside the batch lands on bytes of this batch, read field by field within its
        # bounds: a record comes back (maybe not the one asked for), never bytes from elsewhere.
        assert len(got) == 1 and got[0].offset >= offset
        assert got[0].value is None or got[0].value in buf
    assert trusted > 0


def test_a_memo_of_unusable_shape_is_refused():
    buf = _dense_segment(1)
    for slots, marks in [(3, 0), (0, 0), (64, -1)]:
        memo, _keep = make_memo(max(slots, 1), max(marks, 0))
        memo.slots, memo.nmarks = slots, marks
        with pytest.raises(ValueError):
            RecordDecoder().decode(buf, 0, len(buf), 5, -1, 1, exact=True, memo=memo)


def test_a_partial_read_finds_a_base_offset_damaged_into_the_next_batch(tmp_path):
    """baseOffset lies outside the CRC. Raised by one, the batch overlaps the next one: the read
    that stops after it still looks at the next header, as a walk over whole batches would."""
    buf = bytearray(_dense_segment(3, 10))
    second = parse_header(buf, 0).size
    buf[second : second + 8] = (11).to_bytes(8, "big")  # was 10: now overlaps offset 20
    with pytest.raises(CorruptRecordError):
        RecordDecoder().decode(bytes(buf), 0, len(buf), 12, -1, 1, exact=True)


def test_a_remembered_batch_skips_the_next_header_only_while_its_last_offset_is_the_one_checked():
    """With ``nexts`` the memo notes that the batch after a remembered one was found above it, and
    later point reads of the batch skip that header: until the batch's own base offset (outside
    the CRC) changes, when the next header is looked at again and the overlap is found."""
    buf = bytearray(_dense_segment(3, 10))
    first, second = parse_header(buf, 0).size, parse_header(buf, parse_header(buf, 0).size).size
    memo, arrays = make_memo(slots=4, nexts=True)
    nexts = arrays[3]
    decoder = RecordDecoder()
    assert decoder.decode(bytes(buf), 0, len(buf), 12, -1, 1, exact=True, memo=memo)[0][0].offset == 12
    assert sorted(nexts[i] for i in range(4) if nexts[i]) == [20]  # batch [10, 19] checked against the next
    assert decoder.decode(bytes(buf), 0, len(buf), 25, -1, 1, exact=True, memo=memo)[0][0].offset == 25
    assert 30 not in [nexts[i] for i in range(4)]  # the last batch: no header after it yet
    # The third batch's header damaged downwards: the remembered second batch is read without it.
    damaged = bytearray(buf)
    damaged[first + second : first + second + 8] = (15).to_bytes(8, "big")
    assert decoder.decode(bytes(damaged), 0, len(damaged), 12, -1, 1, exact=True, memo=memo)[0][0].offset == 12
    # The second batch's own base offset raised (it now overlaps the third): its last offset is
    # not the one noted, so the next header is looked at and the overlap found.
    raised = bytearray(buf)
    raised[first : first + 8] = (11).to_bytes(8, "big")
    with pytest.raises(CorruptRecordError):
        decoder.decode(bytes(raised), 0, len(raised), 12, -1, 1, exact=True, memo=memo)


def test_log_point_reads_equal_iteration_across_segments_compression_and_headers(tmp_path):
    log = Log.open(os.path.join(tmp_path, "p-0"), segment_bytes=64 << 10)
    rnd = random.Random(3)
    try:
        for i in range(60):
            n = rnd.randrange(1, 300)
            log.append_batch([os.urandom(rnd.randrange(0, 300)) for _ in range(n)],
                             [b"k%d" % j for j in range(n)] if i % 2 else None,
                             headers=[[("i", b"%d" % i)]] * n if i % 5 == 0 else None,
                             compression="zstd" if i % 7 == 0 else None)
        everything = list(log.iter())
        assert len(log.segments) > 3
        for _ in range(2):
            for offset in rnd.sample(range(len(everything)), 2000):
                assert log.read(offset, max_records=1) == [everything[offset]]
                three = log.read(offset, max_records=3)  # within one segment: maybe fewer
                assert three and three == everything[offset : offset + len(three)]
    finally:
        log.close()


def test_the_memo_keeps_batches_that_share_a_bucket():
    """The memo is set associative: four batches hashing to one bucket (a 4-slot memo is one
    bucket) are all remembered, where a direct-mapped memo made them evict each other; a fifth
    replaces one of them, and every read stays right."""
    buf = _dense_segment(batches=5, count=20)
    whole, _ = RecordDecoder().decode(buf, 0, len(buf))
    positions, position = [], 0
    while position < len(buf):
        positions.append(position)
        position += parse_header(buf, position).size
    memo, (remembered, crcs, _marks) = make_memo(slots=4, marks=4)
    decoder = RecordDecoder()
    for b in range(4):
        assert decoder.decode(buf, 0, len(buf), b * 20 + 7, -1, 1, exact=True, memo=memo)[0] == [whole[b * 20 + 7]]
    assert sorted(remembered[i] for i in range(4)) == [p + 1 for p in positions[:4]]
    for offset in [99, 3, 45, 81, 60, 17]:
        assert decoder.decode(buf, 0, len(buf), offset, -1, 1, exact=True, memo=memo)[0] == [whole[offset]]
    assert len({remembered[i] for i in range(4)} - {0}) == 4


# ---------------------------------------------------------------------- the short path (pointread)
def _filled(tmp_path, name="p-0", batches=30, count=100, **config):
    log = Log.open(os.path.join(tmp_path, name), **config)
    for b in range(batches):
        log.append_batch([b"value-%d-%d" % (b, j) for j in range(count)], [b"k%d" % (j % 7) for j in range(count)])
    return log


def _general(log, offset):
    """The general read's answer for max_records=1 (max_records=2 never takes the short path)."""
    return log.read(offset, max_records=2)[:1]


def test_the_short_path_answers_as_the_general_read_in_active_and_sealed_segments(tmp_path):
    log = _filled(tmp_path, segment_bytes=8 << 10)
    try:
        assert len(log.segments) > 3
        end = log.log_end_offset
        for offset in range(0, end, 37):
            assert log.read(offset, max_records=1) == _general(log, offset)
        assert log.read(end, max_records=1) == []
        with pytest.raises(OffsetOutOfRangeError):
            log.read(end + 1, max_records=1)
        log.roll()  # the active segment's appender, bound by the short path, is gone
        log.append_batch([b"after-roll"])
        assert log.read(end, max_records=1)[0].value == b"after-roll"
        assert log.read(end - 1, max_records=1) == _general(log, end - 1)
    finally:
        log.close()
    log = Log.open(os.path.join(tmp_path, "p-0"), segment_bytes=8 << 10)
    try:  # reopened: every segment is read through its map and copy of the index
        for offset in range(3, log.log_end_offset, 41):
            assert log.read(offset, max_records=1) == _general(log, offset)
    finally:
        log.close()


def test_the_short_path_respects_the_log_start_gaps_and_truncation(tmp_path):
    log = _filled(tmp_path, cleanup_policy="compact", segment_bytes=16 << 10)
    try:
        log.delete_records_before(150)  # inside a segment: records below stay in the file
        with pytest.raises(OffsetOutOfRangeError):
            log.read(149, max_records=1)
        assert log.read(150, max_records=1)[0].offset == 150
        log.roll()
        log.compact(now_ms=2**62)  # keeps the last record of each key: gaps everywhere
        offsets = [r.offset for r in log.iter()]
        assert len(offsets) < 100
        for offset in range(log.log_start_offset, log.log_end_offset):
            expected = [r for r in offsets if r >= offset][:1]
            assert [r.offset for r in log.read(offset, max_records=1)] == expected
        log.truncate_to(offsets[-1])  # the memo of the segment cut is dropped
        log.append_batch([b"new"], [b"k1"])
        assert log.read(offsets[-1], max_records=1)[0].value == b"new"
    finally:
        log.close()


def test_the_short_path_hands_damage_to_the_general_read(tmp_path):
    log = _filled(tmp_path, batches=10)
    path = [s.path for s in log._segments][0]
    log.close()
    with open(path, "r+b") as f:  # a value byte of the fourth batch (records 300..399)
        data = f.read()
        at = data.index(b"value-3-50")
        f.seek(at)
        f.write(b"VALUE")
    log = Log.open(os.path.join(tmp_path, "p-0"))
    try:
        assert log.read(250, max_records=1)[0].value == b"value-2-50"
        with pytest.raises(CorruptRecordError):
            log.read(350, max_records=1)
    finally:
        log.close()


def test_the_short_path_refuses_bad_arguments():
    points = PointReads(1 << 20)
    buf = _dense_segment(2, 10)
    assert read_point(buf, len(buf), None, 0, 0, 13, -1, points.address).value == b"value-1-3"
    assert read_point(buf, len(buf), None, 0, 0, 20, -1, points.address) is None  # nothing at or after 20
    for args, error in [((buf, len(buf) + 1, None, 0, 0, 3, -1, points.address), ValueError),
                        ((buf, -1, None, 0, 0, 3, -1, points.address), ValueError),
                        ((buf, len(buf), b"\0" * 8, 2, 0, 3, -1, points.address), ValueError),
                        ((buf, len(buf), None, -1, 0, 3, -1, points.address), ValueError),
                        ((buf, len(buf), None, 0, 0, 3, -1, 0), ValueError),
                        ((buf, len(buf), None, 0, 0, 3, -1, -1), OverflowError),
                        ((buf, len(buf), None, 0, 0, "3", -1, points.address), TypeError),
                        ((buf, len(buf), None, 0, 0, 3, -1), TypeError)]:
        with pytest.raises(error):
            read_point(*args)
    with pytest.raises(ValueError):
        read_point_active(0, points.address, 3, -1, buf)
    with pytest.raises(OverflowError):
        read_point_active(-5, points.address, 3, -1, buf)


def test_an_index_entry_that_does_not_match_its_batch_is_not_followed():
    """ls_point_read checks the floor entry (an entry is a batch's last offset and position)
    against the batch at its position: an entry that points inside a batch, or at a batch
    ending elsewhere, sends the read to the general path, which rebuilds the index."""
    buf = _dense_segment(3, 10)
    second = parse_header(buf, 0).size
    points = PointReads(1 << 20)
    good = (19).to_bytes(4, "big") + second.to_bytes(4, "big")
    assert read_point(buf, len(buf), good, 1, 0, 25, -1, points.address).value == b"value-2-5"
    for entry in [(19).to_bytes(4, "big") + (second + 5).to_bytes(4, "big"),   # inside the batch
                  (12).to_bytes(4, "big") + second.to_bytes(4, "big"),        # wrong offset
                  (19).to_bytes(4, "big") + (len(buf) - 10).to_bytes(4, "big"),  # no room for a header
                  (19).to_bytes(4, "big") + (2**31 + 5).to_bytes(4, "big")]:   # negative position
        assert read_point(buf, len(buf), entry, 1, 0, 25, -1, points.address) is None


def test_the_memo_is_sized_by_the_segment(tmp_path):
    assert [PointReads(1 << 20, size).memo.slots for size in (0, 32 << 10, 1 << 20, 100 << 20, 1 << 40)] == \
        [16, 16, 32, 1024, 1024]
    log = _filled(tmp_path, segment_bytes=4 << 20)  # about 75 kB of records
    try:
        log.roll()
        log.append_batch([b"after"])
        log.read(5, max_records=1)
        log.read(log.log_end_offset - 1, max_records=1)
        sealed, active = log._segments.first, log._segments.last
        assert sealed._points.memo.slots == 16  # by its size
        assert active._points.memo.slots == 128  # by what it may grow to: 4 MiB / 32 KiB
    finally:
        log.close()


@pytest.mark.regression(reason="fixed: a read with max_records above the decoder's row capacity (4,096) "
                               "skipped the rest of the batch that filled the rows (a partial walk moves past "
                               "its batch), e.g. 905 of every 5,000 records of a consumer with "
                               "max_poll_records=10000; found by the mirror's kill -9 test")
@pytest.mark.parametrize("max_records", [4095, 4096, 4097, 5000, 115_000])
def test_reads_of_more_records_than_the_decoder_holds_skip_none(tmp_path, max_records):
    log = _filled(tmp_path, batches=40, count=1000)
    try:
        for start in (0, 12_345):
            records = log.read(start, max_bytes=512 << 10, max_records=max_records)
            assert [r.offset for r in records] == list(range(start, start + len(records)))
            assert 0 < len(records) <= max_records
        offset, seen = 7, []
        while offset < log.log_end_offset:
            records = log.read(offset, max_bytes=1 << 20, max_records=max_records)
            seen += [r.offset for r in records]
            offset = records[-1].offset + 1
        assert seen == list(range(7, log.log_end_offset))
    finally:
        log.close()


@settings(max_examples=40, deadline=None)
@given(specs_st, st.integers(1, 60), st.integers(1, 16))
def test_a_decoder_with_few_rows_returns_every_record_asked_for(specs, k, capacity):
    buf, offsets = segment(specs)
    whole, _ = RecordDecoder().decode(buf, 0, len(buf))
    decoder = RecordDecoder(capacity=capacity)
    memo, _keep = make_memo()
    for start in range(0, offsets[-1] + 1, 3):
        got, _ = decoder.decode(buf, 0, len(buf), start, -1, k, exact=True, memo=memo)
        assert got == [r for r in whole if r.offset >= start][:k]


def test_read_region_stops_below_max_offset_at_a_batch_boundary(tmp_path):
    """Log.read_region(max_offset=) (a replica's high watermark): whole batches below it only;
    a batch that reaches it is not taken."""
    from logstore import Log

    def bases(data):
        out, pos = [], 0
        while pos < len(data):
            out.append(int.from_bytes(data[pos:pos + 8], "big"))
            pos += 12 + int.from_bytes(data[pos + 8:pos + 12], "big")
        assert pos == len(data)  # whole batches only
        return out

    log = Log.open(str(tmp_path / "t-0"))
    try:
        for i in range(4):
            log.append_batch([b"a%d" % i, b"b%d" % i, b"c%d" % i])  # batches at 0, 3, 6, 9
        for start, max_offset, expected in ((0, None, [0, 3, 6, 9]), (0, 12, [0, 3, 6, 9]), (0, 9, [0, 3, 6]),
                                            (0, 8, [0, 3]), (0, 3, [0]), (3, 9, [3, 6]), (4, 9, [3, 6])):
            region = log.read_region(start, 1 << 20, max_offset=max_offset)
            assert region is not None
            try:
                assert bases(region.read()) == expected, (start, max_offset)
            finally:
                region.close()
        for start, max_offset in ((0, 2), (0, 0), (6, 8)):  # the first batch reaches max_offset: none
            assert log.read_region(start, 1 << 20, max_offset=max_offset) is None
    finally:
        log.close()
