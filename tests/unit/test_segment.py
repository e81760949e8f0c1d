"""Unit tests of logstore.segment: LogSegment's files, appends, reads, recovery and truncation."""

from __future__ import annotations

import os
import pathlib
import random
import struct
from typing import Any, Iterator

import pytest

from logstore.records import compression
from logstore._native import lib
from logstore.errors import CorruptIndexError, CorruptRecordError
from logstore.records.batch import HEADER_SIZE, BatchBuilder, RecordDecoder, TimestampType, parse_header
from logstore.log.filenames import parse_segment_name, segment_name
from logstore.segment import LogSegment, SegmentInfo

SETTINGS: dict[str, Any] = dict(segment_bytes=1 << 20, index_bytes=4096, index_interval_bytes=0,
                                max_batch_bytes=0, preallocate=False)


@pytest.fixture
def builder() -> BatchBuilder:
    return BatchBuilder()


@pytest.fixture
def decoder() -> RecordDecoder:
    return RecordDecoder()


@pytest.fixture
def segments(tmp_path: pathlib.Path) -> Iterator[Any]:
    """Factory: create/open segments in tmp_path; every one is released at teardown."""
    made: list[LogSegment] = []

    class Factory:

        def create(self, base: int = 0, directory: pathlib.Path = tmp_path, **overrides: Any) -> LogSegment:
            directory.mkdir(exist_ok=True)
            seg = LogSegment.create(str(directory), base, **{**SETTINGS, **overrides})
            made.append(seg)
            return seg

        def open(self, base: int = 0, **overrides: Any) -> LogSegment:
            seg = LogSegment.open(str(tmp_path), base, **{**SETTINGS, **overrides})
            made.append(seg)
            return seg

    yield Factory()
    for seg in made:
        seg.abandon()


def stem(tmp_path: pathlib.Path, base: int = 0) -> pathlib.Path:
    return tmp_path / segment_name(base)


def fill(seg: LogSegment, builder: BatchBuilder, n: int, per_batch: int = 3, ts0: int = 1000) -> list[int]:
    """Append n batches of per_batch records with increasing timestamps; return their positions."""
    positions = []
    for i in range(n):
        positions.append(seg.size)
        first = seg.next_offset
        rc = seg.append_batch(builder.build([b"v%d" % (first + j) for j in range(per_batch)],
                                            timestamps=[ts0 + 10 * (first + j) for j in range(per_batch)]))
        assert rc == first
    return positions


def offsets(seg: LogSegment, decoder: RecordDecoder, start: int = 0) -> list[int]:
    return [r.offset for r in seg.read(decoder, start, 1 << 24, -1, None)]


# ---------------------------------------------------------------------- names
def test_segment_name_is_twenty_zero_padded_digits() -> None:
    assert segment_name(0) == "0" * 20
    assert len(segment_name(0)) == 20
    assert segment_name(42) == "00000000000000000042"
    assert segment_name(2**63 - 1) == "09223372036854775807"


@pytest.mark.parametrize("filename, expected", [
    ("00000000000000000000.log", (0, ".log")),
    ("00000000000000000042.index", (42, ".index")),
    ("00000000000000000042.timeindex", (42, ".timeindex")),
    ("00000000000000000042.log.deleted", (42, ".log.deleted")),
    ("00000000000000000042.index.deleted", (42, ".index.deleted")),
    ("00000000000000000042.log.swap", (42, ".log.swap")),
    ("00000000000000000042.log.cleaned", (42, ".log.cleaned")),
    ("09223372036854775807.log", (2**63 - 1, ".log")),
])
def test_parse_segment_name_splits_base_and_suffixes(filename: str, expected: tuple) -> None:
    assert parse_segment_name(filename) == expected


@pytest.mark.parametrize("filename", [
    "leader-epoch-checkpoint",
    "partition.metadata",
    ".lock",
    "00000000000000000042",           # no suffix
    "0042.log",                        # too few digits
    "000000000000000000042.log",       # too many digits
    "0000000000000000004x.log",
    "-0000000000000000042.log",
    " 0000000000000000042.log",
    "",
])
def test_parse_segment_name_ignores_other_files(filename: str) -> None:
    assert parse_segment_name(filename) is None


@pytest.mark.parametrize("filename", ["²" * 20 + ".log", "０" * 20 + ".log"], ids=["superscript", "fullwidth"])
def test_parse_segment_name_ignores_non_ascii_digits(filename: str) -> None:
    assert parse_segment_name(filename) is None


def test_segment_name_round_trips_through_parse() -> None:
    for base in (0, 1, 999, 10**15, 2**63 - 1):
        assert parse_segment_name(segment_name(base) + ".log") == (base, ".log")


# ---------------------------------------------------------------------- create / append / seal
def test_create_makes_three_files_and_an_empty_active_segment(segments, tmp_path: pathlib.Path) -> None:
    seg = segments.create(100)
    s = stem(tmp_path, 100)
    assert seg.file_paths() == [f"{s}.log", f"{s}.index", f"{s}.timeindex"]
    assert all(os.path.exists(p) for p in seg.file_paths())
    assert seg.active
    assert (seg.size, seg.next_offset, seg.max_timestamp, seg.record_count) == (0, 100, -1, 0)
    assert seg.info() == SegmentInfo(100, 0, 0, -1, 100, True)


def test_create_refuses_an_existing_non_empty_segment(segments, tmp_path: pathlib.Path) -> None:
    stem(tmp_path).with_suffix(".log").write_bytes(b"x" * 10)
    with pytest.raises(FileExistsError, match="already exists with 10 bytes"):
        segments.create(0)
    assert stem(tmp_path).with_suffix(".log").read_bytes() == b"x" * 10


def test_append_assigns_offsets_and_stamps_base_offset_and_epoch(segments, builder: BatchBuilder) -> None:
    seg = segments.create(50, leader_epoch=7)
    assert seg.append_batch(builder.build([b"a", b"b"], base_offset=999)) == 50
    assert seg.append_batch(builder.build([b"c"], base_offset=0)) == 52
    assert seg.next_offset == 53 and seg.record_count == 3
    h0 = parse_header(seg.buffer, 0)
    h1 = parse_header(seg.buffer, h0.size)
    assert (h0.base_offset, h0.partition_leader_epoch) == (50, 7)
    assert (h1.base_offset, h1.partition_leader_epoch) == (52, 7)


def test_bytes_and_bytearray_appends_write_identical_files(segments, tmp_path: pathlib.Path, builder: BatchBuilder) -> None:
    # bytes go through the map (copy), bytearrays through pwrite (external append).
    a = segments.create(0)
    b = segments.create(0, directory=tmp_path / "other")
    for i in range(5):
        batch = builder.build([b"x%d" % i] * (i + 1), timestamps=[i] * (i + 1))
        assert a.append_batch(bytes(batch)) == b.append_batch(bytearray(batch)) == i * (i + 1) // 2
    a.seal()
    b.seal()
    for pa, pb in zip(a.file_paths(), b.file_paths()):
        assert pathlib.Path(pa).read_bytes() == pathlib.Path(pb).read_bytes()


def test_append_larger_than_max_batch_bytes_returns_too_large_and_writes_nothing(segments, builder: BatchBuilder) -> None:
    seg = segments.create(0, max_batch_bytes=200)
    assert seg.append_batch(builder.build([b"z" * 300])) == lib.LS_ERR_TOO_LARGE
    assert (seg.size, seg.next_offset) == (0, 0)


def test_append_past_segment_bytes_returns_full(segments, builder: BatchBuilder) -> None:
    seg = segments.create(0, segment_bytes=1000)
    first = builder.build([b"a" * 500])
    assert seg.append_batch(first) == 0
    assert seg.should_roll_for(600)
    assert seg.append_batch(builder.build([b"b" * 600])) == lib.LS_ERR_FULL
    assert (seg.size, seg.next_offset) == (len(first), 1)


def test_oversized_first_batch_sits_alone_in_its_segment(segments, builder: BatchBuilder, decoder: RecordDecoder) -> None:
    seg = segments.create(0, segment_bytes=1000)
    big = builder.build([b"q" * 5000])
    assert seg.append_batch(big) == 0
    assert seg.size == len(big)
    assert seg.append_batch(builder.build([b"r"])) == lib.LS_ERR_FULL
    assert offsets(seg, decoder) == [0]


def test_append_grows_the_map_beyond_the_first_step(segments, builder: BatchBuilder, decoder: RecordDecoder) -> None:
    seg = segments.create(0, segment_bytes=64 << 20)
    chunk = b"m" * (1 << 20)
    for i in range(10):  # 10 MiB > the first 8 MiB map
        assert seg.append_batch(builder.build([chunk])) == i
    assert seg.size > 8 << 20
    assert offsets(seg, decoder, 9) == [9]


def test_seal_trims_files_to_their_data_and_adds_final_time_entry(segments, builder: BatchBuilder) -> None:
    seg = segments.create(0)
    fill(seg, builder, 4)
    seg.append_batch(builder.build([b"late"], timestamps=[5000]))
    seg.seal(fsync=False)
    assert not seg.active
    assert os.path.getsize(seg.path) == seg.size
    assert os.path.getsize(seg.offset_index.path) == 8 * seg.offset_index.entries
    assert os.path.getsize(seg.time_index.path) == 12 * seg.time_index.entries
    assert seg.offset_index.entries == 4  # every batch but the first at interval 0
    assert seg.time_index.last_entry() == (5000, 12)
    assert seg.max_timestamp == 5000
    seg.seal()  # sealing twice is harmless
    assert os.path.getsize(seg.path) == seg.size


def test_close_then_open_learns_facts_from_the_files(segments, builder: BatchBuilder, decoder: RecordDecoder) -> None:
    seg = segments.create(10)
    fill(seg, builder, 3)
    size, max_ts = seg.size, seg.max_timestamp
    seg.close()
    again = segments.open(10)
    assert not again.active
    assert (again.size, again.next_offset, again.max_timestamp, again.record_count) == (size, 19, max_ts, 9)
    again.check_indexes()
    assert offsets(again, decoder, 10) == list(range(10, 19))


def test_reopened_segment_can_be_activated_and_appended_to(segments, builder: BatchBuilder, decoder: RecordDecoder) -> None:
    seg = segments.create(0)
    fill(seg, builder, 2)
    seg.close()
    again = segments.open(0)
    again.activate()
    assert again.active
    assert again.append_batch(builder.build([b"more"])) == 6
    assert offsets(again, decoder) == list(range(7))
    assert again.record_count == 7


# ---------------------------------------------------------------------- reads
def test_read_from_the_middle_of_a_batch_skips_earlier_records(segments, builder, decoder) -> None:
    seg = segments.create(0)
    fill(seg, builder, 4)
    assert offsets(seg, decoder, 4) == list(range(4, 12))


def test_read_stops_before_max_offset_batch(segments, builder, decoder) -> None:
    seg = segments.create(0)
    fill(seg, builder, 4)
    assert [r.offset for r in seg.read(decoder, 0, 1 << 20, 6, None)] == list(range(6))


def test_read_of_an_empty_segment_is_empty(segments, decoder) -> None:
    assert segments.create(0).read(decoder, 0, 1 << 20, -1, None) == []


def test_read_with_tiny_max_bytes_still_returns_one_whole_batch(segments, builder, decoder) -> None:
    seg = segments.create(0)
    seg.append_batch(builder.build([b"x" * 5000, b"y" * 5000]))
    records = seg.read(decoder, 0, 1, -1, None)
    assert [r.offset for r in records] == [0, 1]


def test_find_position_is_the_index_floor(segments, builder) -> None:
    seg = segments.create(0)
    positions = fill(seg, builder, 4)  # batches hold 0-2, 3-5, 6-8, 9-11
    # Entries (last offset of the batch, position): none for the first batch.
    assert seg.find_position(0) == 0
    assert seg.find_position(4) == 0        # entry (5, p1) is above 4
    assert seg.find_position(5) == positions[1]
    assert seg.find_position(10) == positions[2]
    assert seg.find_position(11) == positions[3]


def test_offset_for_timestamp_returns_first_record_at_or_after(segments, builder, decoder) -> None:
    seg = segments.create(0)
    fill(seg, builder, 4)  # record o has timestamp 1000 + 10 * o
    assert seg.offset_for_timestamp(decoder, 1000).offset == 0
    assert seg.offset_for_timestamp(decoder, 1051).offset == 6
    assert seg.offset_for_timestamp(decoder, 1110).offset == 11
    assert seg.offset_for_timestamp(decoder, 1111) is None


# ---------------------------------------------------------------------- recovery
def test_recover_clean_segment_keeps_everything(segments, builder, decoder) -> None:
    seg = segments.create(0)
    fill(seg, builder, 3)
    size = seg.size
    seg.close()
    again = segments.open(0)
    res = again.recover()
    assert (res.valid_bytes, res.truncated_bytes, res.status) == (size, 0, lib.LS_OK)
    assert (res.last_offset, res.records) == (8, 9)
    assert offsets(again, decoder) == list(range(9))


def test_recover_zero_tail_reports_no_truncated_bytes(segments, builder, decoder) -> None:
    seg = segments.create(0)
    fill(seg, builder, 3)
    size = seg.size
    seg.abandon()  # crash: the .log keeps its mapped, zero-filled tail
    assert os.path.getsize(seg.path) > size
    again = segments.open(0)
    res = again.recover()
    assert res.truncated_bytes == 0
    assert res.status == lib.LS_ERR_ZERO
    assert res.valid_bytes == size
    assert os.path.getsize(again.path) == size  # the zero tail is cut
    assert again.next_offset == 9
    assert offsets(again, decoder) == list(range(9))


def test_recover_garbage_tail_reports_the_non_zero_bytes_dropped(segments, builder, decoder) -> None:
    seg = segments.create(0)
    fill(seg, builder, 3)
    size = seg.size
    seg.close()
    garbage = bytes(random.Random(7).randrange(1, 256) for _ in range(37))
    with open(seg.path, "ab") as f:
        f.write(garbage + bytes(500))  # a torn write followed by the unwritten zero tail
    again = segments.open(0)
    res = again.recover()
    assert res.truncated_bytes == len(garbage)
    assert res.status not in (lib.LS_OK, lib.LS_ERR_ZERO)
    assert res.valid_bytes == size
    assert os.path.getsize(again.path) == size
    assert offsets(again, decoder) == list(range(9))


def test_recover_truncates_at_the_first_invalid_batch(segments, builder, decoder) -> None:
    seg = segments.create(0)
    positions = fill(seg, builder, 5)
    size = seg.size
    seg.close()
    with open(seg.path, "r+b") as f:  # flip a bit inside the third batch's records
        f.seek(positions[2] + HEADER_SIZE + 2)
        byte = f.read(1)[0]
        f.seek(positions[2] + HEADER_SIZE + 2)
        f.write(bytes([byte ^ 1]))
    data_end = len(pathlib.Path(seg.path).read_bytes().rstrip(b"\0"))
    again = segments.open(0)
    res = again.recover()
    assert res.status == lib.LS_ERR_CRC
    assert res.valid_bytes == positions[2]
    # Dropped bytes are counted up to the last non-zero byte: trailing zeros cannot be told from
    # the unwritten tail (a record without headers ends in a zero varint).
    assert size - positions[2] - 1 <= res.truncated_bytes == data_end - positions[2]
    assert os.path.getsize(again.path) == positions[2]
    assert (res.last_offset, res.records) == (5, 6)
    assert again.next_offset == 6
    assert offsets(again, decoder) == list(range(6))
    again.check_indexes()
    assert again.offset_index.last_entry()[1] < again.size


def test_recover_rebuilds_damaged_indexes(segments, builder, tmp_path: pathlib.Path) -> None:
    seg = segments.create(0)
    fill(seg, builder, 5)
    seg.close()
    good = pathlib.Path(seg.offset_index.path).read_bytes()
    pathlib.Path(seg.offset_index.path).write_bytes(struct.pack(">ii", 9, 1) * 3 + b"\x01")
    again = segments.open(0)
    with pytest.raises(CorruptIndexError):
        again.check_indexes()
    again.recover()
    again.check_indexes()
    assert pathlib.Path(again.offset_index.path).read_bytes() == good


def test_recover_refuses_kafka_v0_v1_segment_and_changes_nothing(segments, builder) -> None:
    seg = segments.create(0)
    fill(seg, builder, 2)
    seg.close()
    data = bytearray(pathlib.Path(seg.path).read_bytes())
    data[lib.LS_POS_MAGIC] = 1
    pathlib.Path(seg.path).write_bytes(data)
    again = segments.open(0)
    with pytest.raises(CorruptRecordError, match="v0/v1"):
        again.recover()
    assert pathlib.Path(seg.path).read_bytes() == data


def test_recover_of_an_empty_file(segments) -> None:
    seg = segments.create(5)
    seg.close()
    again = segments.open(5)
    res = again.recover()
    assert (res.valid_bytes, res.truncated_bytes, res.last_offset, res.records) == (0, 0, -1, 0)
    assert again.next_offset == 5 and again.max_timestamp == -1


# ---------------------------------------------------------------------- rebuild_indexes
@pytest.mark.parametrize("interval", [0, 100, 300])
def test_rebuild_indexes_reproduces_the_appenders_files(segments, builder, tmp_path: pathlib.Path, interval: int) -> None:
    rng = random.Random(interval)
    seg = segments.create(0, index_interval_bytes=interval)
    for _ in range(40):
        n = rng.randint(1, 4)
        seg.append_batch(builder.build([b"p" * rng.randint(0, 120) for _ in range(n)],
                                       timestamps=[rng.randint(0, 10_000) for _ in range(n)]))
    seg.seal()
    written = [pathlib.Path(p).read_bytes() for p in seg.file_paths()[1:]]
    assert len(written[0]) > 0 and len(written[1]) > 0
    seg.close()
    for p in seg.file_paths()[1:]:
        os.unlink(p)
    again = segments.open(0, index_interval_bytes=interval)
    again.rebuild_indexes()
    assert [pathlib.Path(p).read_bytes() for p in again.file_paths()[1:]] == written
    again.check_indexes()


def test_rebuild_indexes_in_place_replaces_corrupt_entries(segments, builder) -> None:
    seg = segments.create(0)
    fill(seg, builder, 6)
    seg.seal()
    good = pathlib.Path(seg.time_index.path).read_bytes()
    seg.close()
    pathlib.Path(seg.time_index.path).write_bytes(struct.pack(">qi", 99999, 1) * 2)
    again = segments.open(0)
    again.rebuild_indexes()
    assert pathlib.Path(again.time_index.path).read_bytes() == good
    assert again.max_timestamp == 1000 + 10 * 17


# ---------------------------------------------------------------------- check_indexes
def test_check_indexes_rejects_entry_pointing_past_the_log(segments, builder) -> None:
    seg = segments.create(0)
    fill(seg, builder, 2)
    size = seg.size
    seg.close()
    pathlib.Path(seg.offset_index.path).write_bytes(struct.pack(">ii", 2, size))
    again = segments.open(0)
    with pytest.raises(CorruptIndexError, match=rf"points at position {size}, past the log's {size} bytes"):
        again.check_indexes()


def test_check_indexes_rejects_time_entries_for_an_empty_segment(segments) -> None:
    seg = segments.create(0)
    seg.close()
    pathlib.Path(seg.time_index.path).write_bytes(struct.pack(">qi", 5, 0))
    with pytest.raises(CorruptIndexError, match="empty segment"):
        segments.open(0).check_indexes()


# ---------------------------------------------------------------------- truncate_to
@pytest.mark.parametrize("sealed", [False, True])
def test_truncate_mid_batch_with_offset_deltas_keeps_original_offsets(segments, builder, decoder, sealed: bool) -> None:
    seg = segments.create(0)
    assert seg.append_batch(builder.build([b"a", b"b", b"c"], offset_deltas=[0, 2, 5], timestamps=[10, 20, 30])) == 0
    assert seg.next_offset == 6
    assert seg.append_batch(builder.build([b"d"], timestamps=[40])) == 6
    if sealed:
        seg.seal()
    removed = seg.truncate_to(3, builder, decoder)
    records = seg.read(decoder, 0, 1 << 20, -1, None)
    assert [(r.offset, r.value, r.timestamp) for r in records] == [(0, b"a", 10), (2, b"b", 20)]
    assert seg.next_offset == 3
    h = parse_header(seg.buffer, 0)
    assert (h.base_offset, h.last_offset_delta, h.records_count, h.max_timestamp) == (0, 2, 2, 20)
    assert removed > 0 and seg.size == h.size
    assert os.path.getsize(seg.path) >= seg.size


def test_truncate_into_an_offset_gap_ends_exactly_at_the_offset(segments, builder, decoder) -> None:
    seg = segments.create(0)
    seg.append_batch(builder.build([b"a", b"b", b"c"], offset_deltas=[0, 2, 5], timestamps=[10, 20, 30]))
    seg.truncate_to(4, builder, decoder)
    assert [r.offset for r in seg.read(decoder, 0, 1 << 20, -1, None)] == [0, 2]
    assert seg.next_offset == 4


@pytest.mark.parametrize("sealed", [False, True])
def test_truncate_mid_batch_keeps_codec_timestamp_type_and_producer_fields(segments, builder, decoder, sealed: bool) -> None:
    seg = segments.create(0)
    seg.append_batch(builder.build([b"a" * 50, b"b" * 50, b"c" * 50], timestamps=[1, 2, 3], codec=compression.GZIP,
                                   timestamp_type=1, log_append_time=777, producer_id=42, producer_epoch=3,
                                   base_sequence=9))
    if sealed:
        seg.seal()
    seg.truncate_to(2, builder, decoder)
    h = parse_header(seg.buffer, 0)
    assert h.compression == compression.GZIP
    assert h.timestamp_type is TimestampType.LOG_APPEND_TIME and h.max_timestamp == 777
    assert (h.producer_id, h.producer_epoch, h.base_sequence) == (42, 3, 9)
    assert [(r.offset, r.timestamp) for r in seg.read(decoder, 0, 1 << 20, -1, None)] == [(0, 777), (1, 777)]


def test_truncate_at_a_batch_boundary_removes_whole_batches(segments, builder, decoder) -> None:
    seg = segments.create(0)
    positions = fill(seg, builder, 4)
    size = seg.size
    assert seg.truncate_to(6, builder, decoder) == size - positions[2]
    assert seg.size == positions[2] and seg.next_offset == 6
    assert offsets(seg, decoder) == list(range(6))
    assert seg.offset_index.entries == 1  # the entry (5, p1) stays, (8, p2) and (11, p3) go
    assert seg.max_timestamp == 1050


def test_truncate_at_or_past_the_end_is_a_no_op(segments, builder, decoder) -> None:
    seg = segments.create(0)
    fill(seg, builder, 2)
    size = seg.size
    assert seg.truncate_to(6, builder, decoder) == 0
    assert seg.truncate_to(100, builder, decoder) == 0
    assert seg.size == size and seg.next_offset == 6


def test_truncate_to_base_empties_the_segment(segments, builder, decoder) -> None:
    seg = segments.create(10)
    fill(seg, builder, 3)
    size = seg.size
    assert seg.truncate_to(10, builder, decoder) == size
    assert (seg.size, seg.next_offset, seg.offset_index.entries) == (0, 10, 0)
    assert seg.append_batch(builder.build([b"again"])) == 10


def test_truncated_records_do_not_come_back_after_a_crash(segments, builder, decoder) -> None:
    seg = segments.create(0)
    positions = fill(seg, builder, 4)
    seg.truncate_to(7, builder, decoder)
    seg.abandon()  # no seal: the zeroed range stays inside the mapped file
    again = segments.open(0)
    res = again.recover()
    assert res.truncated_bytes == 0
    assert res.last_offset == 6
    assert offsets(again, decoder) == list(range(7))
    assert again.size > positions[2]


def test_active_segment_keeps_appending_after_truncation(segments, builder, decoder) -> None:
    seg = segments.create(0)
    fill(seg, builder, 3)
    seg.truncate_to(4, builder, decoder)
    assert seg.append_batch(builder.build([b"new"], timestamps=[1])) == 4
    assert [(r.offset, r.value) for r in seg.read(decoder, 3, 1 << 20, -1, None)] == [(3, b"v3"), (4, b"new")]


# ---------------------------------------------------------------------- lifecycle
def test_rename_suffix_renames_all_three_files(segments, builder, tmp_path: pathlib.Path) -> None:
    seg = segments.create(0)
    fill(seg, builder, 2)
    seg.seal()
    seg.rename_suffix(".deleted")
    s = stem(tmp_path)
    assert sorted(os.listdir(tmp_path)) == sorted(
        [f"{s.name}.log.deleted", f"{s.name}.index.deleted", f"{s.name}.timeindex.deleted"])
    assert seg.file_paths() == [f"{s}.log.deleted", f"{s}.index.deleted", f"{s}.timeindex.deleted"]


def test_close_is_idempotent_and_trims(segments, builder) -> None:
    seg = segments.create(0)
    fill(seg, builder, 2)
    size = seg.size
    seg.close()
    seg.close()
    assert seg.closed
    assert os.path.getsize(seg.path) == size


def test_close_without_trim_keeps_the_preallocated_files(segments, builder) -> None:
    seg = segments.create(0)
    fill(seg, builder, 2)
    size = seg.size
    seg.close(trim=False)
    assert os.path.getsize(seg.path) > size
    assert os.path.getsize(seg.offset_index.path) == 4096
