"""Unit tests of logstore.errors: the hierarchy, messages and pickling."""

from __future__ import annotations

import pickle

import pytest

import logstore
from logstore import errors
from logstore.errors import (
    CorruptIndexError,
    CorruptRecordError,
    InvalidConfigError,
    InvalidTopicError,
    LogClosedError,
    LogLockedError,
    LogstoreError,
    OffsetOutOfRangeError,
    RecordTooLargeError,
    UnsupportedCodecError,
)


# ---------------------------------------------------------------------- hierarchy
@pytest.mark.parametrize("name", [n for n in errors.__all__ if n != "LogstoreError"])
def test_every_error_derives_from_logstore_error(name: str) -> None:
    cls = getattr(errors, name)
    assert issubclass(cls, LogstoreError)
    assert cls is not LogstoreError


def test_logstore_error_is_an_exception_but_not_a_value_error() -> None:
    assert issubclass(LogstoreError, Exception)
    assert not issubclass(LogstoreError, ValueError)


@pytest.mark.parametrize("cls", [InvalidTopicError, InvalidConfigError])
def test_bad_name_and_bad_config_errors_are_also_value_errors(cls: type) -> None:
    assert issubclass(cls, ValueError)
    with pytest.raises(ValueError):
        raise cls("x")


@pytest.mark.parametrize("cls", [CorruptRecordError, CorruptIndexError, OffsetOutOfRangeError, RecordTooLargeError,
                                 LogClosedError, LogLockedError, UnsupportedCodecError])
def test_data_and_state_errors_are_not_value_errors(cls: type) -> None:
    # except ValueError around argument checks must never swallow corruption or state errors.
    assert not issubclass(cls, ValueError)


def test_package_reexports_the_errors() -> None:
    for name in errors.__all__:
        assert getattr(logstore, name) is getattr(errors, name)


# ---------------------------------------------------------------------- messages
def test_corrupt_record_message_names_file_position_and_crcs_in_hex() -> None:
    e = CorruptRecordError("/data/t-0/00000000000000000000.log", 4096, "CRC32C mismatch",
                           stored_crc=0x8541895A, computed_crc=0x0000BEEF)
    msg = str(e)
    assert "/data/t-0/00000000000000000000.log at position 4096" in msg
    assert "CRC32C mismatch" in msg
    assert "stored crc = 0x8541895a" in msg
    assert "computed crc = 0x0000beef" in msg  # zero-padded to 8 hex digits
    assert (e.path, e.position, e.reason, e.stored_crc, e.computed_crc) == (
        "/data/t-0/00000000000000000000.log", 4096, "CRC32C mismatch", 0x8541895A, 0xBEEF)


def test_corrupt_record_without_path_or_position_says_buffer() -> None:
    e = CorruptRecordError(None, None, "batch is truncated")
    assert str(e) == "Record is corrupt in <buffer>: batch is truncated"
    assert e.stored_crc is None and e.computed_crc is None


def test_corrupt_record_with_position_but_no_path() -> None:
    assert str(CorruptRecordError(None, 0, "bad")) == "Record is corrupt in <buffer> at position 0: bad"


def test_corrupt_record_omits_crc_part_unless_both_crcs_known() -> None:
    assert "crc" not in str(CorruptRecordError("f", 1, "bad", stored_crc=5))
    assert "crc" not in str(CorruptRecordError("f", 1, "bad", computed_crc=5))
    assert "stored crc = 0x00000000" in str(CorruptRecordError("f", 1, "bad", 0, 1))


def test_corrupt_index_message_names_file_and_reason() -> None:
    e = CorruptIndexError("/d/00000000000000000000.index", "entry 3 is out of order")
    assert str(e) == "Corrupt index /d/00000000000000000000.index: entry 3 is out of order"
    assert (e.path, e.reason) == ("/d/00000000000000000000.index", "entry 3 is out of order")


def test_offset_out_of_range_message_gives_offset_and_valid_range() -> None:
    e = OffsetOutOfRangeError(42, 10, 20)
    assert str(e) == "offset 42 is out of range; valid offsets are [10, 20]"
    assert (e.offset, e.log_start_offset, e.log_end_offset) == (42, 10, 20)
    assert str(OffsetOutOfRangeError(1, 2, 3, "read from /d")).startswith("read from /d: offset 1")


def test_record_too_large_message_gives_size_and_limit() -> None:
    e = RecordTooLargeError(2000, 1000)
    assert "2000 bytes" in str(e) and "max_message_bytes = 1000" in str(e)
    assert "nothing was written" in str(e)
    assert (e.size, e.limit) == (2000, 1000)


# ---------------------------------------------------------------------- pickling
PICKLABLE = [
    CorruptRecordError("f.log", 12, "CRC32C mismatch", 1, 2),
    CorruptRecordError(None, None, "truncated"),
    CorruptIndexError("f.index", "partial entry"),
    OffsetOutOfRangeError(5, 0, 3),
    RecordTooLargeError(10, 5),
    LogClosedError("closed"),
    LogLockedError("locked by pid 1"),
    InvalidTopicError("bad topic"),
    UnsupportedCodecError("lz4 missing"),
    InvalidConfigError("segment_bytes must be an int"),
]


@pytest.mark.parametrize("exc", PICKLABLE, ids=lambda e: type(e).__name__)
def test_errors_pickle_round_trip_with_type_message_and_attributes(exc: Exception) -> None:
    back = pickle.loads(pickle.dumps(exc))
    assert type(back) is type(exc)
    assert str(back) == str(exc)
    assert vars(back) == vars(exc)


def test_offset_out_of_range_pickle_keeps_the_what_prefix() -> None:
    e = OffsetOutOfRangeError(5, 0, 3, "read from /data/t-0")
    assert str(pickle.loads(pickle.dumps(e))) == str(e)
