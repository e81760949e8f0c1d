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
from logstore.errors import CorruptRecordError
from logstore._native import ffi
from logstore.records import BatchBuilder, RecordDecoder, parse_header


def make_memo(slots: int = 64, marks: int = 4):
    memo = ffi.new("ls_crc_memo *")
    arrays = (ffi.new("int64_t[]", slots), ffi.new("uint32_t[]", slots), ffi.new("int32_t[]", max(1, slots * marks)))
    memo.positions, memo.crcs, memo.marks = arrays
    memo.slots, memo.nmarks = slots, marks
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
@given(specs_st, st.integers(1, 4), st.sampled_from([(64, 4), (1, 1), (2, 0), (8, 16)]))
def test_partial_reads_return_what_a_whole_read_returns_first_time_and_when_remembered(specs, k, shape):
    buf, offsets = segment(specs)
    whole, _ = RecordDecoder().decode(buf, 0, len(buf))
    assert [r.offset for r in whole] == offsets
    memo, _keep = make_memo(*shape)
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
    """The memo slot of a batch position (scan.c's memo_slot)."""
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
