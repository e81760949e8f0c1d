"""Unit tests of logstore.log.segmentscan: the one walk of a segment's valid batches."""

from __future__ import annotations

import struct

import pytest

from logstore._native import lib
from logstore.log.segmentscan import BatchWalk, status_words
from logstore.records.batch import BatchBuilder, batch_headers


@pytest.fixture
def builder() -> BatchBuilder:
    return BatchBuilder()


def batches(builder: BatchBuilder, count: int, base: int = 0, per_batch: int = 2) -> tuple[bytes, list[int]]:
    """``count`` consecutive batches of ``per_batch`` records from offset ``base``, and where each starts."""
    out, starts = b"", []
    for i in range(count):
        starts.append(len(out))
        out += builder.build([b"v%d" % j for j in range(per_batch)], base_offset=base + i * per_batch,
                             timestamps=[1000 + i] * per_batch)
    return out, starts


def test_a_whole_valid_range_yields_every_batch_and_stops_ok(builder: BatchBuilder) -> None:
    data, starts = batches(builder, 3)
    walk = BatchWalk(data, 0)
    found = list(walk)
    assert found == list(batch_headers(data))
    assert [position for position, _ in found] == starts
    assert (walk.stop.position, walk.stop.status, walk.stop.reason) == (len(data), lib.LS_OK, "ok")


def test_the_scan_summary_agrees_with_the_batches(builder: BatchBuilder) -> None:
    data, _ = batches(builder, 4, base=10)
    res = BatchWalk(data, 10).scan()
    assert (res.valid_bytes, res.batches, res.records, res.last_offset, res.max_timestamp) == (len(data), 4, 8, 17, 1003)


def test_a_zero_tail_ends_the_batches_cleanly(builder: BatchBuilder) -> None:
    data, _ = batches(builder, 2)
    walk = BatchWalk(data + bytes(4096), 0)
    assert len(list(walk)) == 2
    stop = walk.stop
    assert (stop.position, stop.status, stop.reason, stop.crc_valid) == (
        len(data), lib.LS_ERR_ZERO, "zero-filled tail", False)


def test_a_torn_last_batch_is_truncated_not_crc_valid(builder: BatchBuilder) -> None:
    data, starts = batches(builder, 3)
    walk = BatchWalk(data[:-5], 0)
    assert [p for p, _ in walk] == starts[:2]
    assert (walk.stop.position, walk.stop.status, walk.stop.crc_valid) == (starts[2], lib.LS_ERR_TRUNCATED, False)


def test_a_flipped_bit_stops_the_walk_with_both_crcs(builder: BatchBuilder) -> None:
    data, starts = batches(builder, 3)
    damaged = bytearray(data)
    damaged[starts[1] + 70] ^= 0x01
    walk = BatchWalk(bytes(damaged), 0)
    assert [p for p, _ in walk] == starts[:1]
    stop = walk.stop
    assert (stop.position, stop.status, stop.reason, stop.crc_valid) == (starts[1], lib.LS_ERR_CRC,
                                                                          status_words(lib.LS_ERR_CRC), False)
    assert stop.stored_crc is not None and stop.computed_crc is not None and stop.stored_crc != stop.computed_crc


def test_a_whole_batch_whose_offsets_go_backwards_is_named_so(builder: BatchBuilder) -> None:
    data, starts = batches(builder, 2)
    walk = BatchWalk(data + data[: starts[1]], 0)
    assert len(list(walk)) == 2
    stop = walk.stop
    assert (stop.position, stop.status, stop.crc_valid) == (len(data), lib.LS_ERR_CORRUPT, True)
    assert stop.reason == "offsets go backwards: batch 0..1 after 3"


def test_a_batch_below_the_segment_base_offset_is_named_so(builder: BatchBuilder) -> None:
    data, _ = batches(builder, 1, base=3)
    stop = BatchWalk(data, 10).stop
    assert (stop.position, stop.crc_valid) == (0, True)
    assert stop.reason == "batch 3..4 lies below the segment's base offset 10"


def test_a_whole_batch_with_a_malformed_record_is_crc_valid(builder: BatchBuilder) -> None:
    data, starts = batches(builder, 2)
    bad = bytearray(data[starts[1]:])
    bad[61] = 0x7E  # the first record's length varint: 63 bytes, more than the batch holds
    bad[17:21] = struct.pack(">I", lib.ls_crc32c(0, bytes(bad[21:]), len(bad) - 21))
    stop = BatchWalk(data[: starts[1]] + bytes(bad), 0).stop
    assert (stop.position, stop.crc_valid) == (starts[1], True)
    assert stop.reason == status_words(stop.status)


def test_a_walk_from_a_position_gives_positions_in_the_whole_buffer(builder: BatchBuilder) -> None:
    data, starts = batches(builder, 3)
    walk = BatchWalk(data, 0, starts[1], starts[2])
    assert [(p, h.base_offset) for p, h in walk] == [(starts[1], 2)]
    assert (walk.stop.position, walk.stop.status) == (starts[2], lib.LS_OK)


def test_an_empty_range_has_no_batches() -> None:
    walk = BatchWalk(b"", 5)
    assert list(walk) == []
    res = walk.scan()
    assert (res.valid_bytes, res.last_offset, res.max_timestamp, res.status) == (0, -1, -1, lib.LS_OK)


def test_index_entries_are_written_only_by_a_walk_from_position_zero(builder: BatchBuilder) -> None:
    data, starts = batches(builder, 2)
    with pytest.raises(ValueError, match="starts there"):
        BatchWalk(data, 0, starts[1]).scan(0, object(), object())  # type: ignore[arg-type]
