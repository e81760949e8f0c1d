"""The CPython extension that builds Record objects from the C core's decoded rows
(``logstore._native._records``): what it builds, what it refuses, and what it holds on to."""

from __future__ import annotations

import gc
import pickle
import struct
import sys

import pytest
from logstore._native import ffi
from logstore._native._records import build, column
from logstore.records.batch import NO_HEADERS, BatchBuilder, Record, RecordDecoder, TimestampType

TYPES = (TimestampType.CREATE_TIME, TimestampType.LOG_APPEND_TIME)


def _rows(n: int):
    """An ls_records_out of capacity n, its arrays kept alive by the returned tuple."""
    out = ffi.new("ls_records_out *")
    keep = [ffi.new("int64_t[]", n), ffi.new("int64_t[]", n), ffi.new("int8_t[]", n)] + [
        ffi.new("int32_t[]", n) for _ in range(7)]
    (out.offsets, out.timestamps, out.timestamp_types, out.key_pos, out.key_len, out.value_pos,
     out.value_len, out.headers_pos, out.headers_len, out.header_count) = keep
    out.capacity = n
    return out, keep


def _address(out) -> int:
    return int(ffi.cast("uintptr_t", out))


def _no_headers_call(*args):
    raise AssertionError(f"headers asked for a record without headers: {args}")


def test_rows_become_records_with_copied_keys_and_values():
    buf = bytearray(b"key1value-one" + b"v2")
    out, _keep = _rows(3)
    rows = [(7, 1000, 0, 0, 4, 4, 9), (8, 1001, 1, 0, -1, 13, 2), (9, 1002, 0, 0, 0, 0, -1)]
    for i, (off, ts, tt, kp, kl, vp, vl) in enumerate(rows):
        out.offsets[i], out.timestamps[i], out.timestamp_types[i] = off, ts, tt
        out.key_pos[i], out.key_len[i], out.value_pos[i], out.value_len[i] = kp, kl, vp, vl
    into: list[Record] = []
    build(Record, buf, _address(out), 3, TYPES, NO_HEADERS, _no_headers_call, into)
    assert into == [Record(7, 1000, TimestampType.CREATE_TIME, b"key1", b"value-one", []),
                    Record(8, 1001, TimestampType.LOG_APPEND_TIME, None, b"v2", []),
                    Record(9, 1002, TimestampType.CREATE_TIME, b"", None, [])]
    assert all(type(r) is Record and r.headers is NO_HEADERS for r in into)
    assert type(into[0].key) is bytes and type(into[0].offset) is int
    buf[:4] = b"XXXX"  # copies, not views of the caller's buffer
    assert into[0].key == b"key1"
    assert pickle.loads(pickle.dumps(into)) == into
    assert into[0] < into[1] and into[0] == Record(*into[0])


def test_a_record_with_headers_gets_what_the_headers_function_returns_and_stays_tracked():
    out, _keep = _rows(1)
    out.header_count[0], out.headers_pos[0], out.headers_len[0] = 2, 3, 5
    out.key_len[0] = out.value_len[0] = -1
    calls = []

    def headers(buf, position, length, count):
        calls.append((bytes(buf), position, length, count))
        return [("a", b"1"), ("b", None)]

    into: list[Record] = []
    build(Record, b"0123456789", _address(out), 1, TYPES, NO_HEADERS, headers, into)
    assert calls == [(b"0123456789", 3, 5, 2)]
    assert into[0].headers == [("a", b"1"), ("b", None)]
    assert gc.is_tracked(into[0])  # its headers list is a container that could hold a cycle


def test_records_without_headers_are_left_to_reference_counting():
    raw = _batch([b"a", b"b"], headers=[None, [("h", b"x")]])
    records, _ = RecordDecoder().decode(raw, 0, len(raw))
    assert [gc.is_tracked(r) for r in records] == [False, True]
    assert records[1].headers == [("h", b"x")]


def _batch(values, headers=None) -> bytes:
    return bytes(BatchBuilder().build(values, headers=headers))


@pytest.mark.parametrize("pos,length", [(-1, 1), (0, 11), (10, 1), (11, 0), (2**31 - 1, 1), (0, -2)])
def test_a_span_outside_the_buffer_is_refused_before_any_byte_is_read(pos, length):
    out, _keep = _rows(2)
    out.value_len[0] = 1  # row 0 is fine and is kept
    out.key_len[0] = out.key_len[1] = -1
    out.value_pos[1], out.value_len[1] = pos, length
    into: list[Record] = []
    with pytest.raises(ValueError, match="outside the 10-byte buffer"):
        build(Record, b"0123456789", _address(out), 2, TYPES, NO_HEADERS, _no_headers_call, into)
    assert [r.value for r in into] == [b"0"]


def test_bad_arguments_are_refused():
    out, _keep = _rows(2)
    args = [Record, b"", _address(out), 2, TYPES, NO_HEADERS, _no_headers_call, []]
    for at, bad, error in [(0, dict, TypeError), (1, 5, TypeError), (3, 3, ValueError), (3, -1, ValueError),
                           (4, TYPES[:1], TypeError), (6, None, TypeError), (7, (), TypeError),
                           (2, -1, OverflowError)]:
        wrong = list(args)
        wrong[at] = bad
        with pytest.raises(error):
            build(*wrong)
    with pytest.raises(TypeError):
        build(*args[:7])


def test_nothing_is_leaked():
    values = [b"v%d" % i for i in range(500)]
    raw = _batch(values)
    decoder = RecordDecoder()
    decoder.decode(raw, 0, len(raw))
    before = (sys.getrefcount(NO_HEADERS), sys.getrefcount(TimestampType.CREATE_TIME))
    for _ in range(20):
        records, _ = decoder.decode(raw, 0, len(raw))
        assert [r.value for r in records] == values
        del records
    assert (sys.getrefcount(NO_HEADERS), sys.getrefcount(TimestampType.CREATE_TIME)) == before


def test_columns_for_the_encoder_are_gathered_in_c_or_left_to_the_general_path():
    items = [b"abc", None, b"", b"x" * 300]
    for seq in (items, tuple(items)):
        data, lens = column(seq, True)
        assert data == b"abc" + b"x" * 300
        assert struct.unpack(f"={len(items)}i", lens) == (3, -1, 0, 300)
    assert column([], True) == (b"", b"")
    # Anything else is the general path's to judge (and to name in its error).
    for other, nullable in [([b"a", None], False), ([b"a", bytearray(b"b")], True), ([b"a", memoryview(b"b")], True),
                            ([b"a", "str"], True), (iter([b"a"]), True), ([b"a", 5], True)]:
        assert column(other, nullable) is None
    with pytest.raises(TypeError):
        column([b"a"])


def test_the_batch_encoder_takes_both_paths_alike():
    values = [b"v%d" % i if i % 3 else None for i in range(50)]
    keys = [b"k%d" % i for i in range(50)]
    fast = bytes(BatchBuilder().build(values, keys, timestamps=[7] * 50))
    slow = bytes(BatchBuilder().build([bytearray(v) if v else v for v in values], keys, timestamps=[7] * 50))
    assert fast == slow
    with pytest.raises(TypeError, match=r"keys\[2\]"):
        BatchBuilder().build(values, keys[:2] + ["str"] + keys[3:])
