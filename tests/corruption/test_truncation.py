"""A torn write: the active segment cut at every byte of its last three batches (LevelDB
log_test's ``TruncatedTrailingRecordIsIgnored`` at every length, Kafka LogSegmentTest's
truncated-tail recovery).

Survivors must be exactly the batches that end at or before the cut, and the recovery report must
count exactly the bytes of the partial batch it dropped.
"""

from __future__ import annotations

import os
import random

import pytest

from .helpers import (
    Rec,
    Written,
    assert_append_continues,
    batch_positions,
    copy_log,
    dropped_bytes,
    ensure_room,
    make_log,
    open_log,
    read_bytes,
    read_everything,
    remove_clean_marker,
    segment_logs,
    shrink,
    timestamp_of,
)


def _append_known_tail(log, written: Written) -> None:
    """Three last batches of different shapes: headers and keys, a single record, a tombstone."""
    first = log.log_end_offset
    values = [b"v%d" % i * (i + 1) for i in range(4)]
    keys = [b"k0", None, b"k2", b"k3"]
    headers = [[("a", b"1")], [], [("b", None), ("c", b"")], []]
    assert log.append_batch(values, keys=keys, headers=headers,
                            timestamps=[timestamp_of(first + i) for i in range(4)]) == first
    written.records += [Rec(first + i, timestamp_of(first + i), keys[i], values[i], headers[i]) for i in range(4)]
    written.batches.append((first, first + 3))
    o = first + 4
    assert log.append(b"single", key=b"ks", headers=[("h", b"x" * 20)], timestamp=timestamp_of(o)) == o
    written.records.append(Rec(o, timestamp_of(o), b"ks", b"single", [("h", b"x" * 20)]))
    written.batches.append((o, o))
    o += 1
    assert log.append_batch([None, b"last"], keys=[b"dead", b"alive"],
                            timestamps=[timestamp_of(o), timestamp_of(o + 1)]) == o
    written.records += [Rec(o, timestamp_of(o), b"dead", None, []), Rec(o + 1, timestamp_of(o + 1), b"alive", b"last", [])]
    written.batches.append((o, o + 1))


@pytest.fixture(params=["closed", "abandon"])
def pristine(request, tmp_path):
    """A log of several segments whose active segment ends with three known batches, left as a
    clean close without its marker (``closed``) or as a crashed writer (``abandon``)."""
    root = tmp_path / "pristine"
    path = str(root / "t-0")
    rng = random.Random(3)
    log, written = make_log(path, rng, 70)
    ensure_room(log, rng, written, 400)
    _append_known_tail(log, written)
    assert len(log.segments) >= 2
    if request.param == "closed":
        log.close()
        remove_clean_marker(path)
    else:
        log._abandon()
    return request.param, root, written


def test_active_segment_cut_at_every_byte_of_last_three_batches(tmp_path, pristine):
    how, root, written = pristine
    active_name = os.path.basename(segment_logs(root / "t-0")[-1])
    data = read_bytes(root / "t-0" / active_name)
    batches = batch_positions(data)
    assert [(b.base_offset, b.last_offset) for b in batches[-3:]] == written.batches[-3:]
    first_cut = batches[-3].position
    # With a crashed writer the file also holds the mapped zero tail: cut into it as well.
    last_cut = batches[-1].end + (100 if how == "abandon" else 0)
    assert last_cut <= len(data)

    for cut in range(first_cut, last_cut + 1):
        root_copy = tmp_path / f"cut-{cut}"
        copy_log(root, root_copy)
        active = str(root_copy / "t-0" / active_name)
        shrink(active, cut)
        whole = [b for b in batches if b.end <= cut]
        boundary = whole[-1].end
        end_offset = whole[-1].last_offset + 1
        expected = written.upto(end_offset)

        log = open_log(root_copy / "t-0")
        try:
            report = log.recovery_report
            assert not report.clean_shutdown
            assert report.bytes_truncated == dropped_bytes(data[:cut], boundary), f"cut at {cut}"
            assert report.segments_deleted == 0
            assert log.log_end_offset == end_offset, f"cut at {cut}"
            assert log.segments[-1].size == boundary
            assert read_everything(log) == expected, f"cut at {cut}"
            if cut in (first_cut, boundary + 1, last_cut) or cut % 17 == 0:
                assert_append_continues(log, expected)
        finally:
            log.close()


def test_truncated_tail_is_reported_once_and_not_again_after_reopen(tmp_path, pristine):
    how, root, written = pristine
    path = root / "t-0"
    active = segment_logs(path)[-1]
    batches = batch_positions(read_bytes(active))
    cut = batches[-2].position + 30  # inside the single-record batch
    shrink(active, cut)

    log = open_log(path)
    try:
        assert log.recovery_report.bytes_truncated == 30
        assert read_everything(log) == written.upto(batches[-2].base_offset)
    finally:
        log.close()
    remove_clean_marker(path)  # even a second recovery finds nothing more to drop
    log = open_log(path)
    try:
        assert log.recovery_report.bytes_truncated == 0
        assert read_everything(log) == written.upto(batches[-2].base_offset)
    finally:
        log.close()


def test_cut_inside_first_batch_of_active_segment_keeps_sealed_segments(tmp_path, pristine):
    how, root, written = pristine
    path = root / "t-0"
    active = segment_logs(path)[-1]
    base = int(os.path.basename(active)[:20])
    first = batch_positions(read_bytes(active))[0]
    shrink(active, first.size - 1)

    log = open_log(path)
    try:
        assert log.recovery_report.bytes_truncated == first.size - 1
        assert log.log_end_offset == base
        assert log.segments[-1].size == 0
        assert read_everything(log) == written.upto(base)
        assert_append_continues(log, written.upto(base))
    finally:
        log.close()
