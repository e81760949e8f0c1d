"""Unit tests of logstore.records.batch: BatchBuilder, RecordDecoder and the batch helpers."""

from __future__ import annotations

import struct

import pytest

from logstore.records import compression
from logstore._native import lib
from logstore.errors import CorruptRecordError, RecordTooLargeError
from logstore.records.batch import (
    HEADER_SIZE,
    LOG_OVERHEAD,
    NO_HEADERS,
    BatchBuilder,
    BatchHeader,
    Record,
    RecordDecoder,
    TimestampType,
    decode_batches,
    encode_headers,
    now_ms,
    parse_header,
    validate_batch,
)


@pytest.fixture
def builder() -> BatchBuilder:
    return BatchBuilder()


def fix_crc(batch: bytearray) -> None:
    """Recompute the CRC32C of a batch after an edit inside the CRC-covered range."""
    crc = lib.ls_crc32c(0, bytes(batch[lib.LS_POS_ATTRIBUTES:]), len(batch) - lib.LS_POS_ATTRIBUTES)
    batch[lib.LS_POS_CRC : lib.LS_POS_CRC + 4] = struct.pack(">I", crc)


def batches(builder: BatchBuilder, n: int, per_batch: int = 2) -> tuple[bytes, list[int]]:
    """n consecutive batches of per_batch records; returns the bytes and each batch's start position."""
    out = bytearray()
    starts = []
    for i in range(n):
        starts.append(len(out))
        base = i * per_batch
        out += builder.build([b"v%d" % (base + j) for j in range(per_batch)],
                             timestamps=[1000 + base + j for j in range(per_batch)], base_offset=base)
    return bytes(out), starts


# ---------------------------------------------------------------------- small types
def test_timestamp_type_values_are_kafkas_attribute_bit() -> None:
    assert TimestampType.CREATE_TIME == 0 and TimestampType.LOG_APPEND_TIME == 1


def test_now_ms_is_wall_clock_milliseconds() -> None:
    import time

    before = int(time.time() * 1000)
    value = now_ms()
    after = int(time.time() * 1000)
    assert before - 1 <= value <= after + 1


def test_batch_header_derived_properties(builder: BatchBuilder) -> None:
    batch = builder.build([b"a", b"b", b"c"], timestamps=[5, 9, 7], base_offset=40,
                          codec=compression.GZIP, timestamp_type=1, log_append_time=77)
    h = parse_header(batch)
    assert isinstance(h, BatchHeader)
    assert h.last_offset == 42
    assert h.size == len(batch) == LOG_OVERHEAD + h.batch_length
    assert h.compression == compression.GZIP
    assert h.timestamp_type is TimestampType.LOG_APPEND_TIME


# ---------------------------------------------------------------------- building
def test_build_and_decode_round_trip_all_fields(builder: BatchBuilder) -> None:
    values = [b"v0", None, b"", bytearray(b"v3"), memoryview(b"v4")]
    keys = [b"k0", b"k1", None, b"", b"k4"]
    headers = [[("h", b"1"), ("null", None)], None, [], [("", b"")], [("ü", b"\x00\xff")]]
    stamps = [10, 5, 30, 20, 25]
    batch = builder.build(values, keys, headers, stamps, base_offset=7)
    records = decode_batches(batch)
    assert records == [
        Record(7, 10, TimestampType.CREATE_TIME, b"k0", b"v0", [("h", b"1"), ("null", None)]),
        Record(8, 5, TimestampType.CREATE_TIME, b"k1", None, []),
        Record(9, 30, TimestampType.CREATE_TIME, None, b"", []),
        Record(10, 20, TimestampType.CREATE_TIME, b"", b"v3", [("", b"")]),
        Record(11, 25, TimestampType.CREATE_TIME, b"k4", b"v4", [("ü", b"\x00\xff")]),
    ]


def test_header_fields_are_written_as_given(builder: BatchBuilder) -> None:
    batch = builder.build([b"a", b"b"], timestamps=[50, 20], base_offset=1000, partition_leader_epoch=7,
                          producer_id=123456789, producer_epoch=3, base_sequence=42)
    h = validate_batch(batch)
    assert h.magic == 2
    assert (h.base_offset, h.partition_leader_epoch) == (1000, 7)
    assert (h.producer_id, h.producer_epoch, h.base_sequence) == (123456789, 3, 42)
    assert h.base_timestamp == 50      # the first record's timestamp
    assert h.max_timestamp == 50       # the largest, not the last
    assert h.records_count == 2 and h.last_offset_delta == 1
    assert h.attributes == 0
    assert builder.last_max_timestamp == 50


def test_default_producer_fields_are_kafkas_none_values(builder: BatchBuilder) -> None:
    h = parse_header(builder.build([b"a"]))
    assert (h.partition_leader_epoch, h.producer_id, h.producer_epoch, h.base_sequence) == (-1, -1, -1, -1)


def test_missing_timestamps_use_the_current_time(builder: BatchBuilder) -> None:
    before = now_ms()
    records = decode_batches(builder.build([b"a", b"b"]))
    after = now_ms()
    assert all(before <= r.timestamp <= after for r in records)
    assert records[0].timestamp == records[1].timestamp


def test_extreme_timestamps_round_trip(builder: BatchBuilder) -> None:
    stamps = [-(2**63), 2**63 - 1, -1, 0]
    assert [r.timestamp for r in decode_batches(builder.build([b"x"] * 4, timestamps=stamps))] == stamps


def test_offset_deltas_keep_non_contiguous_offsets(builder: BatchBuilder) -> None:
    batch = builder.build([b"a", b"b", b"c"], offset_deltas=[0, 2, 5], base_offset=10, timestamps=[1, 2, 3])
    h = parse_header(batch)
    assert h.last_offset_delta == 5 and h.records_count == 3 and h.last_offset == 15
    assert [r.offset for r in decode_batches(batch)] == [10, 12, 15]


def test_offset_deltas_need_not_start_at_zero(builder: BatchBuilder) -> None:
    batch = builder.build([b"a", b"b"], offset_deltas=[3, 4])
    assert [r.offset for r in decode_batches(batch)] == [3, 4]


@pytest.mark.parametrize("deltas", [[1, 1], [2, 1], [-1, 0], [0]])
def test_invalid_offset_deltas_are_value_errors(builder: BatchBuilder, deltas: list[int]) -> None:
    with pytest.raises(ValueError):
        builder.build([b"a", b"b"], offset_deltas=deltas)


@pytest.mark.parametrize("kwargs", [
    dict(offset_deltas=[2**31]),
    dict(base_offset=2**63),
    dict(partition_leader_epoch=2**31),
    dict(base_sequence=2**31),
    dict(producer_id=2**63),
], ids=lambda kw: next(iter(kw)))
def test_out_of_range_integer_arguments_are_value_errors(builder: BatchBuilder, kwargs: dict) -> None:
    with pytest.raises(ValueError):
        builder.build([b"a"], **kwargs)


def test_log_append_time_stamps_every_record(builder: BatchBuilder) -> None:
    batch = builder.build([b"a", b"b"], timestamps=[5, 7], timestamp_type=1, log_append_time=1234)
    h = parse_header(batch)
    assert h.timestamp_type is TimestampType.LOG_APPEND_TIME
    assert h.max_timestamp == 1234
    assert builder.last_max_timestamp == 1234
    assert [(r.timestamp, r.timestamp_type) for r in decode_batches(batch)] == [
        (1234, TimestampType.LOG_APPEND_TIME), (1234, TimestampType.LOG_APPEND_TIME)]


def test_log_append_time_alone_makes_a_log_append_time_batch(builder: BatchBuilder) -> None:
    batch = builder.build([b"a", b"b"], timestamps=[5, 7], log_append_time=1234)
    h = parse_header(batch)
    assert h.timestamp_type is TimestampType.LOG_APPEND_TIME
    assert {r.timestamp for r in decode_batches(batch)} == {1234}


@pytest.mark.parametrize("codec", [compression.GZIP, compression.ZSTD])
def test_compressed_batch_round_trip(builder: BatchBuilder, codec: int) -> None:
    values = [b"value-%d" % i * 20 for i in range(50)]
    batch = builder.build(values, keys=[b"k"] * 50, timestamps=list(range(50)), codec=codec, base_offset=3)
    h = validate_batch(batch)
    assert h.compression == codec
    assert len(batch) < sum(map(len, values))
    records = decode_batches(batch)
    assert [r.value for r in records] == values
    assert [r.offset for r in records] == list(range(3, 53))


def test_copy_false_returns_a_writable_view_of_the_same_bytes(builder: BatchBuilder) -> None:
    copied = builder.build([b"one"], timestamps=[1])
    view = builder.build([b"one"], timestamps=[1], copy=False)
    assert isinstance(copied, bytes)
    assert isinstance(view, memoryview) and not view.readonly
    assert bytes(view) == copied


def test_copy_false_view_is_reused_but_copies_are_not(builder: BatchBuilder) -> None:
    kept = builder.build([b"one"], timestamps=[1])
    view = builder.build([b"one"], timestamps=[1], copy=False)
    builder.build([b"two"], timestamps=[2], copy=False)
    assert bytes(view) != kept  # documented: valid only until the next call
    assert decode_batches(kept)[0].value == b"one"


def test_copy_false_compressed_batch_is_a_fresh_bytearray(builder: BatchBuilder) -> None:
    batch = builder.build([b"x" * 100], codec=compression.GZIP, copy=False)
    assert isinstance(batch, bytearray)
    assert decode_batches(batch)[0].value == b"x" * 100


def test_builder_grows_its_scratch_for_large_batches(builder: BatchBuilder) -> None:
    big = b"z" * (200 << 10)
    assert decode_batches(builder.build([big, big]))[1].value == big


@pytest.mark.parametrize("call, exc, match", [
    (lambda b: b.build([]), ValueError, "at least one record"),
    (lambda b: b.build(["text"]), TypeError, r"values\[0\] must be bytes or None"),
    (lambda b: b.build([b"a"], keys=[b"k", b"k"]), ValueError, "keys has 2 items but values has 1"),
    (lambda b: b.build([b"a"], keys=[1]), TypeError, r"keys\[0\]"),
    (lambda b: b.build([b"a"], timestamps=[1, 2]), ValueError, "timestamps has 2 items"),
    (lambda b: b.build([b"a"], timestamps=["x"]), TypeError, "timestamps must be ints"),
    (lambda b: b.build([b"a"], timestamps=[2**63]), ValueError, "signed 64-bit"),
    (lambda b: b.build([b"a"], headers=[[], []]), ValueError, "headers has 2 items"),
    (lambda b: b.build([b"a"], headers=[[("k",)]]), TypeError, r"headers\[0\] must hold"),
    (lambda b: b.build([b"a"], headers=[[(1, b"v")]]), TypeError, "header key must be str"),
    (lambda b: b.build([b"a"], headers=[[("k", "v")]]), TypeError, "header value"),
    (lambda b: b.build([b"a"], offset_deltas=[0, 1]), ValueError, "offset_deltas has 2 items"),
    (lambda b: b.build([b"a"], codec=9), ValueError, "codec"),
    (lambda b: b.build([b"a"], producer_epoch=2**15), ValueError, "invalid argument"),
])
def test_argument_errors_are_type_or_value_errors(builder: BatchBuilder, call, exc: type, match: str) -> None:
    with pytest.raises(exc, match=match):
        call(builder)


def test_builder_is_usable_after_an_argument_error(builder: BatchBuilder) -> None:
    with pytest.raises(TypeError):
        builder.build([b"a", "b"])
    assert decode_batches(builder.build([b"ok"]))[0].value == b"ok"


# ---------------------------------------------------------------------- encode_headers
def test_encode_headers_matches_the_record_wire_format() -> None:
    raw, count = encode_headers([("k", b"v"), ("n", None), ("", b"")])
    # zigzag varints: len("k")=1 -> 0x02, len(b"v")=1 -> 0x02, null value -1 -> 0x01, 0 -> 0x00
    assert raw == b"\x02k\x02v" + b"\x02n\x01" + b"\x00\x00"
    assert count == 3


def test_encode_headers_utf8_keys_and_empty_list() -> None:
    raw, count = encode_headers([("é", bytearray(b"x"))])
    assert raw == b"\x04\xc3\xa9\x02x" and count == 1
    assert encode_headers([]) == (b"", 0)


@pytest.mark.parametrize("headers, match", [
    ([("k",)], "pairs"),
    ([5], "pairs"),
    ([(b"k", b"v")], "header key must be str"),
    ([("k", "v")], "header value must be bytes or None"),
])
def test_encode_headers_rejects_malformed_pairs(headers: list, match: str) -> None:
    with pytest.raises(TypeError, match=match):
        encode_headers(headers)


# ---------------------------------------------------------------------- NO_HEADERS
def test_records_without_headers_share_no_headers(builder: BatchBuilder) -> None:
    records = decode_batches(builder.build([b"a", b"b"], headers=[None, [("h", b"1")]]))
    assert records[0].headers is NO_HEADERS
    assert records[1].headers == [("h", b"1")] and records[1].headers is not NO_HEADERS
    records[1].headers.append(("mine", None))  # a record's own list is an ordinary list


def test_no_headers_equals_empty_list() -> None:
    assert NO_HEADERS == []
    assert isinstance(NO_HEADERS, list)
    assert len(NO_HEADERS) == 0 and not NO_HEADERS
    assert repr(NO_HEADERS) == "[]"
    assert list(NO_HEADERS) + [("a", None)] == [("a", None)]


@pytest.mark.parametrize("mutate", [
    lambda h: h.append(("k", b"v")),
    lambda h: h.extend([("k", b"v")]),
    lambda h: h.insert(0, ("k", b"v")),
    lambda h: h.remove(("k", b"v")),
    lambda h: h.pop(),
    lambda h: h.clear(),
    lambda h: h.sort(),
    lambda h: h.reverse(),
    lambda h: h.__setitem__(slice(0, 0), [("k", b"v")]),
    lambda h: h.__delitem__(slice(None)),
    lambda h: h.__iadd__([("k", b"v")]),
    lambda h: h.__imul__(2),
])
def test_no_headers_refuses_mutation(mutate) -> None:
    with pytest.raises(TypeError, match="read-only"):
        mutate(NO_HEADERS)
    assert NO_HEADERS == []


def test_no_headers_augmented_assignment_is_refused() -> None:
    headers = NO_HEADERS
    with pytest.raises(TypeError):
        headers += [("k", b"v")]
    assert NO_HEADERS == []


# ---------------------------------------------------------------------- RecordDecoder
def test_decode_returns_records_and_end_position(builder: BatchBuilder) -> None:
    buf, _ = batches(builder, 4)
    records, stopped = RecordDecoder().decode(buf, 0, len(buf))
    assert [r.offset for r in records] == list(range(8))
    assert [r.value for r in records] == [b"v%d" % i for i in range(8)]
    assert stopped == len(buf)


def test_decode_from_a_middle_batch_boundary(builder: BatchBuilder) -> None:
    buf, starts = batches(builder, 4)
    records, stopped = RecordDecoder().decode(buf, starts[2], len(buf))
    assert [r.offset for r in records] == [4, 5, 6, 7]
    assert stopped == len(buf)


def test_decode_of_an_empty_range_returns_nothing(builder: BatchBuilder) -> None:
    buf, starts = batches(builder, 2)
    assert RecordDecoder().decode(buf, starts[1], starts[1]) == ([], starts[1])


def test_min_offset_skips_records_inside_a_batch(builder: BatchBuilder) -> None:
    buf, _ = batches(builder, 4)
    records, stopped = RecordDecoder().decode(buf, 0, len(buf), min_offset=3)
    assert [r.offset for r in records] == [3, 4, 5, 6, 7]
    assert stopped == len(buf)


def test_max_offset_stops_before_the_batch_starting_there(builder: BatchBuilder) -> None:
    buf, starts = batches(builder, 4)
    records, stopped = RecordDecoder().decode(buf, 0, len(buf), min_offset=1, max_offset=4)
    assert [r.offset for r in records] == [1, 2, 3]
    assert stopped == starts[2]


def test_max_offset_inside_a_batch_keeps_that_whole_batch(builder: BatchBuilder) -> None:
    buf, starts = batches(builder, 4)
    records, stopped = RecordDecoder().decode(buf, 0, len(buf), max_offset=3)
    assert [r.offset for r in records] == [0, 1, 2, 3]  # batch [2, 3] starts below 3
    assert stopped == starts[2]


def test_max_records_never_cuts_a_batch(builder: BatchBuilder) -> None:
    buf, _ = batches(builder, 5, per_batch=3)
    records, stopped = RecordDecoder().decode(buf, 0, len(buf), max_records=4)
    assert len(records) >= 4
    assert len(records) % 3 == 0
    assert [r.offset for r in records] == list(range(len(records)))


def test_max_records_stops_at_the_first_batch_boundary_past_it(builder: BatchBuilder) -> None:
    buf, starts = batches(builder, 10)
    records, stopped = RecordDecoder().decode(buf, 0, len(buf), max_records=3)
    assert [r.offset for r in records] == [0, 1, 2, 3]
    assert stopped == starts[2]


def test_partial_tail_ok_ends_at_the_last_whole_batch(builder: BatchBuilder) -> None:
    buf, starts = batches(builder, 3)
    for cut in (starts[2] + 1, starts[2] + HEADER_SIZE - 1, starts[2] + HEADER_SIZE + 1, len(buf) - 1):
        records, stopped = RecordDecoder().decode(buf, 0, cut, partial_tail_ok=True)
        assert [r.offset for r in records] == [0, 1, 2, 3]
        assert stopped == starts[2]


def test_partial_tail_without_permission_is_corrupt_at_that_batch(builder: BatchBuilder) -> None:
    buf, starts = batches(builder, 3)
    with pytest.raises(CorruptRecordError, match=rf"f\.log at position {starts[2]}: batch is truncated") as info:
        RecordDecoder().decode(buf, 0, len(buf) - 1, path="f.log")
    assert info.value.position == starts[2]


def test_crc_mismatch_names_file_position_and_both_crcs(builder: BatchBuilder) -> None:
    buf, starts = batches(builder, 3)
    bad = bytearray(buf)
    bad[starts[1] + HEADER_SIZE + 3] ^= 0x40  # inside the second batch's records
    stored = struct.unpack_from(">I", bad, starts[1] + lib.LS_POS_CRC)[0]
    end = starts[2]
    computed = lib.ls_crc32c(0, bytes(bad[starts[1] + lib.LS_POS_ATTRIBUTES : end]), end - starts[1] - lib.LS_POS_ATTRIBUTES)
    assert stored != computed
    with pytest.raises(CorruptRecordError) as info:
        RecordDecoder().decode(bytes(bad), 0, len(bad), path="seg.log")
    e = info.value
    assert (e.path, e.position, e.stored_crc, e.computed_crc) == ("seg.log", starts[1], stored, computed)
    assert f"stored crc = {stored:#010x}" in str(e) and f"computed crc = {computed:#010x}" in str(e)


def test_decoder_grows_for_a_batch_larger_than_its_capacity(builder: BatchBuilder) -> None:
    batch = builder.build([b"%d" % i for i in range(100)], timestamps=[7] * 100)
    decoder = RecordDecoder(capacity=4)
    records, _ = decoder.decode(batch, 0, len(batch))
    assert [r.offset for r in records] == list(range(100))
    assert decoder.capacity >= 100


def test_compressed_batch_between_plain_ones_decodes_in_order(builder: BatchBuilder) -> None:
    buf = (builder.build([b"a", b"b"], base_offset=0)
           + builder.build([b"c", b"d", b"e"], base_offset=2, codec=compression.GZIP)
           + builder.build([b"f"], base_offset=5))
    records, stopped = RecordDecoder().decode(buf, 0, len(buf), min_offset=3)
    assert [(r.offset, r.value) for r in records] == [(3, b"d"), (4, b"e"), (5, b"f")]
    assert stopped == len(buf)


def test_compressed_batch_with_garbage_payload_is_corrupt_at_its_position(builder: BatchBuilder) -> None:
    first = builder.build([b"a"], base_offset=0)
    bad = bytearray(builder.build([b"x" * 200], base_offset=1, codec=compression.GZIP))
    bad[HEADER_SIZE + 12 : HEADER_SIZE + 20] = b"\xff" * 8
    fix_crc(bad)
    with pytest.raises(CorruptRecordError) as info:
        RecordDecoder().decode(first + bytes(bad), 0, len(first) + len(bad), path="seg.log")
    assert info.value.path == "seg.log"
    assert info.value.position == len(first)


def test_decode_accepts_any_buffer_type(builder: BatchBuilder) -> None:
    buf, _ = batches(builder, 2)
    for b in (buf, bytearray(buf), memoryview(buf)):
        assert [r.offset for r in RecordDecoder().decode(b, 0, len(buf))[0]] == [0, 1, 2, 3]


def test_decode_batches_is_a_whole_buffer_convenience(builder: BatchBuilder) -> None:
    buf, _ = batches(builder, 3)
    assert [r.offset for r in decode_batches(buf, min_offset=5)] == [5]
    with pytest.raises(CorruptRecordError):
        decode_batches(buf[:-1])


# ---------------------------------------------------------------------- parse_header / validate_batch
def test_parse_header_does_not_validate_the_crc(builder: BatchBuilder) -> None:
    batch = bytearray(builder.build([b"a"], base_offset=9))
    batch[-1] ^= 0xFF
    assert parse_header(batch).base_offset == 9
    with pytest.raises(CorruptRecordError, match="CRC32C mismatch"):
        validate_batch(batch)


def test_parse_header_at_a_position(builder: BatchBuilder) -> None:
    buf, starts = batches(builder, 3)
    assert parse_header(buf, starts[2]).base_offset == 4


def test_parse_header_of_a_short_buffer_is_truncated() -> None:
    with pytest.raises(CorruptRecordError, match="at position 0: batch is truncated"):
        parse_header(b"\x00" * (HEADER_SIZE - 1))


def test_validate_batch_returns_the_header_of_a_good_batch(builder: BatchBuilder) -> None:
    buf, starts = batches(builder, 2)
    h = validate_batch(buf, starts[1])
    assert (h.base_offset, h.records_count, h.size) == (2, 2, len(buf) - starts[1])


def test_validate_batch_rejects_old_magic(builder: BatchBuilder) -> None:
    batch = bytearray(builder.build([b"a"]))
    batch[lib.LS_POS_MAGIC] = 1
    with pytest.raises(CorruptRecordError, match=r"p\.log at position 0: unsupported magic"):
        validate_batch(batch, path="p.log")


def test_validate_batch_rejects_impossible_length(builder: BatchBuilder) -> None:
    batch = bytearray(builder.build([b"a"]))
    batch[lib.LS_POS_BATCH_LENGTH : lib.LS_POS_BATCH_LENGTH + 4] = struct.pack(">i", 10)
    with pytest.raises(CorruptRecordError, match="malformed"):
        validate_batch(batch)


def test_validate_batch_with_size_limit_raises_record_too_large(builder: BatchBuilder) -> None:
    batch = builder.build([b"a" * 100])
    assert validate_batch(batch, 0, len(batch)).size == len(batch)
    with pytest.raises(RecordTooLargeError):
        validate_batch(batch, 0, len(batch) - 1)


def test_record_too_large_from_validation_names_size_and_limit(builder: BatchBuilder) -> None:
    batch = builder.build([b"a" * 100])
    with pytest.raises(RecordTooLargeError) as info:
        validate_batch(batch, 0, 50)
    assert (info.value.size, info.value.limit) == (len(batch), 50)


def test_decoder_max_batch_bytes_rejects_larger_batches(builder: BatchBuilder) -> None:
    batch = builder.build([b"a" * 100])
    with pytest.raises(RecordTooLargeError):
        RecordDecoder(max_batch_bytes=50).decode(batch, 0, len(batch))
    assert len(RecordDecoder(max_batch_bytes=len(batch)).decode(batch, 0, len(batch))[0]) == 1


def test_records_are_immutable_tuples(builder: BatchBuilder) -> None:
    record = decode_batches(builder.build([b"a"], keys=[b"k"], timestamps=[3]))[0]
    assert record == (0, 3, TimestampType.CREATE_TIME, b"k", b"a", [])
    with pytest.raises(AttributeError):
        record.value = b"b"  # type: ignore[misc]


# ---------------------------------------------------------------------- control batches
def test_leader_change_record_is_kafkas_control_key_and_flexible_message() -> None:
    from logstore.records.control import leader_change_record

    key, value = leader_change_record(1, [0, 1, 2], [1, 2])
    assert key == bytes.fromhex("0000 0002")  # ControlRecordType version 0, type 2 (LEADER_CHANGE)
    # version 0, leader 1, voters [0, 1, 2] and granting [1, 2] as compact arrays of
    # (int32 id, empty tagged fields), then the message's empty tagged fields.
    assert value == bytes.fromhex("0000 00000001 04 0000000000 0000000100 0000000200"
                                  " 03 0000000100 0000000200 00")


@pytest.mark.parametrize("codec", [compression.NONE, compression.GZIP])
def test_control_batches_are_validated_and_passed_over_by_the_decoder(builder: BatchBuilder, codec: int) -> None:
    data = bytes(builder.build([b"a", b"b"], base_offset=0))
    control = bytes(builder.build([b"ctl"], [b"\0\0\0\2"], base_offset=2, codec=codec, control=True))
    assert parse_header(control).attributes & lib.LS_ATTR_CONTROL
    data += control + bytes(builder.build([b"c"], base_offset=3))
    records, end = RecordDecoder().decode(data, 0, len(data))
    assert [(r.offset, r.value) for r in records] == [(0, b"a"), (1, b"b"), (3, b"c")]
    assert end == len(data)
    # From inside the control batch the next record is the one after it.
    assert [r.offset for r in decode_batches(data, min_offset=2)] == [3]
    # A damaged control batch is still an error: it is validated like any other.
    broken = bytearray(data)
    position = data.index(control) + HEADER_SIZE
    broken[position] ^= 0xFF
    with pytest.raises(CorruptRecordError):
        RecordDecoder().decode(bytes(broken), 0, len(broken))


# ---------------------------------------------------------------------- client batches
def test_client_batches_are_checked_whole_before_a_leader_stores_them(builder: BatchBuilder) -> None:
    from logstore.errors import InvalidRecordError
    from logstore.records.batch import validate_client_batch

    good = bytes(builder.build([b"a", b"b"], [b"k", None], producer_id=7, producer_epoch=0, base_sequence=3))
    h = validate_client_batch(good, 1 << 20)
    assert (h.records_count, h.producer_id, h.base_sequence) == (2, 7, 3)
    zipped = bytes(builder.build([b"z" * 100] * 5, codec=compression.GZIP))
    assert validate_client_batch(zipped, 1 << 20).records_count == 5
    with pytest.raises(CorruptRecordError):
        validate_client_batch(good[:-1], 1 << 20)          # cut short
    with pytest.raises(CorruptRecordError):
        validate_client_batch(good + good, 1 << 20)        # two batches
    with pytest.raises(CorruptRecordError):
        validate_client_batch(b"\0" * 10, 1 << 20)          # not even a header
    flipped = bytearray(good)
    flipped[-1] ^= 1
    with pytest.raises(CorruptRecordError):
        validate_client_batch(bytes(flipped), 1 << 20)     # CRC
    # A valid CRC over malformed records (a bad record length), as a buggy client could send.
    bad_records = bytearray(good)
    bad_records[HEADER_SIZE] = 0x7F
    fix_crc(bad_records)
    with pytest.raises(CorruptRecordError):
        validate_client_batch(bytes(bad_records), 1 << 20)
    with pytest.raises(RecordTooLargeError):
        validate_client_batch(good, len(good) - 1)
    with pytest.raises(InvalidRecordError, match="control"):
        validate_client_batch(bytes(builder.build([b"c"], [b"k"], control=True)), 1 << 20)
    with pytest.raises(InvalidRecordError, match="last offset delta"):
        validate_client_batch(bytes(builder.build([b"a", b"b"], offset_deltas=[0, 2])), 1 << 20)


def test_exact_max_records_builds_no_more_records_but_consumes_whole_batches(builder: BatchBuilder) -> None:
    buf, starts = batches(builder, 5, per_batch=3)
    records, stopped = RecordDecoder().decode(buf, 0, len(buf), min_offset=4, max_records=1, exact=True)
    assert [r.offset for r in records] == [4]  # inside the second batch [3, 5]
    assert stopped == starts[2]  # after that whole batch
    records, stopped = RecordDecoder().decode(buf, 0, len(buf), max_records=4, exact=True)
    assert [r.offset for r in records] == [0, 1, 2, 3] and stopped == starts[2]


def test_entry_extent_of_a_v2_batch_and_of_a_legacy_message() -> None:
    from logstore.records.batch import ENTRY_HEAD_SIZE, entry_extent

    batch = BatchBuilder().build([b"a", b"b", b"c"], base_offset=40)
    assert entry_extent(bytes(batch[:ENTRY_HEAD_SIZE])) == (len(batch), 42)
    # A legacy (v0/v1) message: offset, size, then crc, magic 1, ...: its own offset is its last.
    legacy = (7).to_bytes(8, "big") + (30).to_bytes(4, "big") + b"\0" * 4 + b"\x01" + b"\0" * 25
    assert entry_extent(legacy[:ENTRY_HEAD_SIZE]) == (42, 7)
    assert entry_extent(legacy[:12]) == (42, 7)
