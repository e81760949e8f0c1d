"""Garbage from a random position to the end of the active segment (Kafka LogSegmentTest's
``testRecoveryWithCorruptMessage``, LevelDB log_test's random tails).

A crash while appending leaves anything at all after the last complete batch: a torn batch, bytes
of an older life of the file, or random garbage. Recovery must keep exactly the batches that are
intact and come before the damage, report the bytes it dropped, and let appends continue at the
next offset. Nothing derived from garbage may ever be returned.
"""

from __future__ import annotations

import os
import random

import pytest

from .helpers import (
    Written,
    assert_append_continues,
    assert_log_is,
    batch_positions,
    dropped_bytes,
    garbage_tail,
    has_clean_marker,
    make_log,
    open_log,
    read_bytes,
    read_everything,
    remove_clean_marker,
    segment_logs,
    zero_tail,
)

SEEDS = range(100)
CODECS = (None, "gzip", None, "zstd")


def _crashed_log(tmp_path, seed: int, how: str) -> tuple[str, Written, random.Random]:
    """A log of a few segments whose writer crashed (``abandon``) or closed cleanly and then
    lost its clean-shutdown marker (``closed``): both make the next open recover the active
    segment."""
    rng = random.Random(seed)
    path = str(tmp_path / "t-0")
    log, written = make_log(path, rng, rng.randrange(50, 130), codecs=CODECS)
    assert len(log.segments) >= 2
    if how == "abandon":
        log._abandon()
        assert not has_clean_marker(path)
    else:
        log.close()
        remove_clean_marker(path)
    return path, written, rng


def _survivors(before: bytes, after: bytes, written: Written, base: int) -> tuple[list, int]:
    """Expected records and valid prefix length: the batches of the active segment that come
    before the first batch whose bytes changed."""
    valid = 0
    end_offset = base
    for batch in batch_positions(before):
        if after[batch.position : batch.end] != before[batch.position : batch.end]:
            break
        valid = batch.end
        end_offset = batch.last_offset + 1
    return written.upto(end_offset), valid


@pytest.mark.parametrize("how", ["abandon", "closed"])
@pytest.mark.parametrize("seed", SEEDS)
def test_random_garbage_tail_of_active_segment_leaves_exact_prefix(tmp_path, seed, how):
    path, written, rng = _crashed_log(tmp_path, seed, how)
    active = segment_logs(path)[-1]
    base = int(os.path.basename(active)[:20])
    before = read_bytes(active)
    data_end = batch_positions(before)[-1].end
    # Mostly inside the data; sometimes in the zero tail of a mapped segment, or at its last byte.
    position = rng.choice([rng.randrange(0, data_end + 1), rng.randrange(0, len(before))])
    garbage_tail(active, position, rng)
    after = read_bytes(active)
    expected, valid = _survivors(before, after, written, base)

    log = open_log(path)
    try:
        report = log.recovery_report
        assert not report.clean_shutdown
        assert report.segments_recovered >= 1
        assert report.bytes_truncated == dropped_bytes(after, valid)
        assert_log_is(log, expected, expected[-1].offset + 1 if expected else base)
        assert log.segments[-1].size == valid
        appended = assert_append_continues(log, expected)
    finally:
        log.close()
    # The repaired log survives a clean reopen as it is (nothing garbage-derived resurfaces).
    log = open_log(path)
    try:
        assert log.recovery_report.clean_shutdown
        assert_log_is(log, expected + appended, appended[-1].offset + 1)
    finally:
        log.close()


@pytest.mark.parametrize("seed", range(20))
def test_zero_fill_from_random_position_leaves_exact_prefix(tmp_path, seed):
    """A torn write that left zeros (a page never written back) from a random position on."""
    path, written, rng = _crashed_log(tmp_path, seed, "closed")
    active = segment_logs(path)[-1]
    base = int(os.path.basename(active)[:20])
    before = read_bytes(active)
    position = rng.randrange(0, len(before) + 1)
    zero_tail(active, position)
    after = read_bytes(active)
    expected, valid = _survivors(before, after, written, base)

    log = open_log(path)
    try:
        # Zeros from a batch boundary on look exactly like a preallocated tail: no loss reported.
        assert log.recovery_report.bytes_truncated == dropped_bytes(after, valid)
        assert read_everything(log) == expected
        assert_append_continues(log, expected)
    finally:
        log.close()


@pytest.mark.parametrize("seed", range(10))
def test_crash_with_preallocated_zero_tail_loses_nothing(tmp_path, seed):
    path, written, _ = _crashed_log(tmp_path, seed, "abandon")
    active = segment_logs(path)[-1]
    data = read_bytes(active)
    data_end = batch_positions(data)[-1].end
    assert data_end < len(data) and not any(data[data_end:]), "the mapped segment should have a zero tail"

    log = open_log(path)
    try:
        report = log.recovery_report
        assert not report.clean_shutdown
        assert report.bytes_truncated == 0
        assert report.segments_deleted == 0
        assert read_everything(log) == written.records
        assert_append_continues(log, written.records)
    finally:
        log.close()


@pytest.mark.parametrize("extra", [1, 61, 4096, 100_000])
def test_zero_extension_of_closed_segment_loses_nothing(tmp_path, extra):
    """A preallocating tool (or a crash after fallocate) left zeros after the trimmed data."""
    path, written, _ = _crashed_log(tmp_path, 7, "closed")
    active = segment_logs(path)[-1]
    size = os.path.getsize(active)
    with open(active, "ab") as f:
        f.write(bytes(extra))

    log = open_log(path)
    try:
        assert log.recovery_report.bytes_truncated == 0
        assert read_everything(log) == written.records
        assert log.segments[-1].size == size
        assert_append_continues(log, written.records)
    finally:
        log.close()
