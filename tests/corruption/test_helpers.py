"""The corruption suite's own tools, checked against the library: a helper that misreads the
format would make every other test here meaningless.
"""

from __future__ import annotations

import os
import random

import pytest

from logstore.records.batch import validate_batch

from .helpers import (
    CONFIG,
    POS_CRC,
    batch_positions,
    computed_crc,
    crc32c,
    fix_crc,
    flip,
    garbage_tail,
    make_log,
    read_bytes,
    read_everything,
    record_layout,
    segment_base,
    segment_logs,
    set_bytes,
    shrink,
    stored_crc,
    varint_decode,
    varint_encode,
)


def test_crc32c_matches_rfc_3720_vectors():
    assert crc32c(bytes(32)) == 0x8A9136AA
    assert crc32c(b"\xff" * 32) == 0x62A8AB43
    assert crc32c(bytes(range(32))) == 0x46DD794E


@pytest.mark.parametrize("value", [0, 1, -1, 63, -64, 64, -65, 2**31 - 1, -(2**31), 2**63 - 1, -(2**63)])
def test_varint_round_trip(value):
    encoded = varint_encode(value)
    assert varint_decode(encoded + b"\x99", 0) == (value, len(encoded))


def test_batch_positions_and_record_layout_agree_with_the_log(tmp_path):
    path = str(tmp_path / "t-0")
    log, written = make_log(path, random.Random(2), 120)
    segments = log.segments
    log.close()
    walked = []
    for seg_path, info in zip(segment_logs(path), segments):
        data = read_bytes(seg_path)
        batches = batch_positions(seg_path)
        assert segment_base(seg_path) == info.base_offset
        assert batches[-1].end == len(data) == info.size
        assert sum(b.records_count for b in batches) == info.record_count
        for b in batches:
            header = validate_batch(data, b.position)
            assert (header.base_offset, header.last_offset, header.size) == (b.base_offset, b.last_offset, b.size)
            assert stored_crc(seg_path, b.position) == computed_crc(seg_path, b.position) == header.crc
            layout = record_layout(seg_path, b.position)
            assert [r.offset_delta.value for r in layout] == list(range(b.records_count))
            walked.append((b.base_offset, b.last_offset))
    assert walked == written.batches


def test_byte_mutations_do_what_they_say(tmp_path):
    path = tmp_path / "f"
    path.write_bytes(bytes(range(16)))
    flip(path, 3, 7)
    assert read_bytes(path)[3] == 3 ^ 0x80
    assert set_bytes(path, 4, b"ab") == bytes([4, 5])
    assert read_bytes(path)[4:6] == b"ab"
    shrink(path, 10)
    assert os.path.getsize(path) == 10
    garbage = garbage_tail(path, 6, random.Random(0))
    assert len(garbage) == 4 and read_bytes(path)[6:] == garbage


def test_fix_crc_makes_a_changed_batch_valid_again(tmp_path):
    path = str(tmp_path / "t-0")
    log, _ = make_log(path, random.Random(4), 10)
    log.close()
    seg = segment_logs(path)[0]
    batch = batch_positions(seg)[3]
    original = stored_crc(seg, batch.position)
    flip(seg, batch.end - 1, 0)
    assert computed_crc(seg, batch.position) != original
    new = fix_crc(seg, batch.position)
    assert new == computed_crc(seg, batch.position) == stored_crc(seg, batch.position) != original
    assert validate_batch(read_bytes(seg), batch.position).crc == new
    assert read_bytes(seg)[batch.position + POS_CRC : batch.position + POS_CRC + 4] == new.to_bytes(4, "big")


@pytest.mark.regression(reason="fixed: a size-based roll leaves the new segment's roll deadline at "
                   "-2**63 (_set_active); the next append then takes _roll_for_time and rolls the "
                   "one-batch segment, so every full segment is followed by a tiny one")
def test_writer_fills_each_segment_to_segment_bytes_before_rolling(tmp_path):
    """The suite relies on several full segments with dense indexes."""
    path = str(tmp_path / "t-0")
    log, written = make_log(path, random.Random(5), 170)
    with log:
        sizes = [s.size for s in log.segments]
        assert len(sizes) >= 4
        # A segment rolls only when the next batch (< 600 bytes here) would not fit.
        assert all(size > CONFIG["segment_bytes"] - 600 for size in sizes[:-1]), sizes
        assert read_everything(log) == written.records
