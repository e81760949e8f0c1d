"""ProducerStateTable: each producer's epoch and last five batches, the check of a client's
batch (Kafka's ProducerAppendInfo), truncation, head removal, and Kafka's snapshot format."""

from __future__ import annotations

import ast
import doctest
import pathlib
import struct

import crc32c
import pytest

from logstore import InvalidProducerEpochError, InvalidRecordError, Log, OutOfOrderSequenceError
from logstore.log import producerstate
from logstore.log.producerstate import (
    BATCHES_RETAINED,
    BatchMetadata,
    CorruptSnapshotError,
    ProducerStateEntry,
    ProducerStateTable,
    decrement_sequence,
    increment_sequence,
    replay,
)
from logstore.records.batch import BatchBuilder

MAX_SEQ = 2**31 - 1


def batch(values, producer_id=-1, base_sequence=-1, epoch=0):
    return bytes(BatchBuilder().build(values, producer_id=producer_id, producer_epoch=epoch if producer_id >= 0 else -1,
                                      base_sequence=base_sequence))


def fill(table, pid=1, epoch=0, batches=6, size=2, first_offset=0):
    """Record ``batches`` consecutive batches of ``size`` records from sequence 0."""
    for i in range(batches):
        seq = i * size
        table.record(pid, epoch, seq, seq + size - 1, first_offset + seq, first_offset + seq + size - 1, 1000 + i)


def test_docstring_examples():
    result = doctest.testmod(producerstate)
    assert result.attempted > 0 and result.failed == 0


# ---------------------------------------------------------------------- duplicates
def test_a_retry_of_any_of_the_last_five_batches_is_a_duplicate_but_not_the_sixth_back():
    table = ProducerStateTable()
    fill(table, batches=6)  # sequences 0-1, 2-3, ..., 10-11
    assert len(table.entry(1).batches) == BATCHES_RETAINED
    for i in range(1, 6):
        seq = 2 * i
        assert table.check(1, 0, seq, seq + 1) == BatchMetadata(seq, seq + 1, seq, seq + 1, 1000 + i)
    # The first batch is the sixth back: forgotten, so its retry is out of order.
    with pytest.raises(OutOfOrderSequenceError) as info:
        table.check(1, 0, 0, 1)
    assert (info.value.first_sequence, info.value.last_sequence) == (0, 11)
    # A duplicate must repeat the sequences exactly.
    with pytest.raises(OutOfOrderSequenceError):
        table.check(1, 0, 10, 10)


def test_a_duplicate_needs_the_same_epoch():
    table = ProducerStateTable()
    table.record(1, 3, 0, 1, 0, 1)
    assert table.check(1, 3, 0, 1) is not None
    assert table.check(1, 4, 0, 1) is None  # a new epoch starting at 0: a new batch
    with pytest.raises(InvalidProducerEpochError):
        table.check(1, 2, 0, 1)


def test_a_batch_without_a_producer_id_is_neither_checked_nor_tracked():
    table = ProducerStateTable()
    table.record(-1, 0, 0, 0, 0, 0)
    assert len(table) == 0
    assert table.check(-1, -1, -1, -1) is None


# ---------------------------------------------------------------------- sequences and epochs
def test_the_next_batch_must_follow_the_last_sequence():
    table = ProducerStateTable()
    fill(table, batches=2)  # last sequence 3
    assert table.check(1, 0, 4, 9) is None
    for gap in (5, 3, 0, 100):
        with pytest.raises(OutOfOrderSequenceError) as info:
            table.check(1, 0, gap, gap)
        assert info.value.last_sequence == 3 and "expected 4" in str(info.value)


def test_an_older_epoch_is_fenced_and_a_newer_one_must_start_at_zero():
    table = ProducerStateTable()
    table.record(1, 5, 0, 9, 0, 9)
    with pytest.raises(InvalidProducerEpochError) as info:
        table.check(1, 4, 10, 10)
    assert (info.value.epoch, info.value.current_epoch) == (4, 5)
    with pytest.raises(OutOfOrderSequenceError) as seq:
        table.check(1, 6, 10, 10)
    assert "expected 0" in str(seq.value)
    assert table.check(1, 6, 0, 0) is None
    # Once the new epoch's batch is appended, the old epoch's batches are forgotten.
    table.record(1, 6, 0, 0, 10, 10)
    entry = table.entry(1)
    assert entry.epoch == 6 and list(entry.batches) == [BatchMetadata(0, 0, 10, 10, -1)]
    with pytest.raises(InvalidProducerEpochError):
        table.check(1, 5, 0, 9)  # a retry from the fenced epoch is no duplicate


def test_sequences_wrap_after_two_to_the_31_minus_one():
    assert increment_sequence(MAX_SEQ, 1) == 0 and increment_sequence(MAX_SEQ - 1, 3) == 1
    assert decrement_sequence(0, 1) == MAX_SEQ and decrement_sequence(1, 3) == MAX_SEQ - 1
    table = ProducerStateTable()
    table.record(1, 0, MAX_SEQ - 1, MAX_SEQ, 0, 1)
    assert table.check(1, 0, 0, 4) is None
    with pytest.raises(OutOfOrderSequenceError):
        table.check(1, 0, 2**31, 2**31)
    # A batch that wraps inside itself.
    table.record(1, 0, MAX_SEQ, 1, 2, 4)
    assert table.check(1, 0, MAX_SEQ, 1).first_offset == 2
    assert table.check(1, 0, 2, 2) is None


def test_an_unknown_producer_is_accepted_with_any_sequence_and_epoch():
    table = ProducerStateTable()
    assert table.check(42, 7, 12345, 12350) is None
    fill(table, pid=1)
    assert table.check(2, 0, 99, 99) is None  # another producer


def test_without_sequence_checks_duplicates_and_fencing_remain():
    table = ProducerStateTable()
    fill(table, epoch=2, batches=2)
    assert table.check(1, 2, 100, 100, check_sequence=False) is None
    assert table.check(1, 3, 100, 100, check_sequence=False) is None
    assert table.check(1, 2, 2, 3, check_sequence=False) is not None
    with pytest.raises(InvalidProducerEpochError):
        table.check(1, 1, 0, 0, check_sequence=False)


def test_the_errors_are_invalid_record_errors_and_pickle():
    import pickle

    for exc in (OutOfOrderSequenceError(1, 0, 5, 3, "t-0"), InvalidProducerEpochError(1, 2, 3, "t-0")):
        assert isinstance(exc, InvalidRecordError)
        again = pickle.loads(pickle.dumps(exc))
        assert type(again) is type(exc) and str(again) == str(exc)


# ---------------------------------------------------------------------- forgetting
def test_truncation_forgets_the_batches_that_reach_the_new_end_and_emptied_producers():
    table = ProducerStateTable()
    fill(table, pid=1, batches=3)             # offsets 0-5
    fill(table, pid=2, batches=1, first_offset=10)  # offsets 10-11
    assert table.truncate_to(3) == 3  # 2-3, 4-5 of producer 1, 10-11 of producer 2
    assert list(table) == [1] and table.entry(1).last_sequence == 1
    assert table.check(1, 0, 2, 3) is None  # the truncated batch may come again
    assert table.truncate_to(100) == 0
    assert table.truncate_to(0) == 1 and len(table) == 0


def test_head_removal_forgets_producers_whose_last_batch_is_below_the_log_start():
    table = ProducerStateTable()
    fill(table, pid=1, batches=2)                    # offsets 0-3
    fill(table, pid=2, batches=2, first_offset=4)    # offsets 4-7
    assert table.truncate_head(4) == 1
    assert list(table) == [2]
    assert table.truncate_head(7) == 0  # its last batch still reaches 7
    assert table.check(1, 0, 99, 99) is None  # forgotten: any sequence again


def test_learning_from_batch_headers_and_a_replay():
    table = ProducerStateTable()
    data = b"".join(bytes(BatchBuilder().build([b"x"] * n, base_offset=o, producer_id=p, producer_epoch=e,
                                               base_sequence=s))
                    for o, n, p, e, s in [(0, 2, 7, 1, 0), (2, 1, -1, -1, -1), (3, 3, 7, 1, 2), (6, 1, 8, 0, 40)])
    assert table.record_batches(data, from_offset=3) == 7  # the first two end below 3
    assert list(table.entry(7).batches) == [BatchMetadata(2, 4, 3, 5, table.entry(7).last_timestamp)]
    assert table.entry(8).last_batch.first_offset == 6
    again = ProducerStateTable()
    replay(again, lambda offset, max_bytes: data if offset == 0 else b"", 0, 7)
    assert [b.first_offset for b in again.entry(7).batches] == [0, 3]


# ---------------------------------------------------------------------- snapshots
def test_snapshot_round_trip_keeps_each_producers_epoch_and_last_batch():
    table = ProducerStateTable()
    fill(table, pid=1, epoch=3, batches=4)
    table.record(2**62, 32767, MAX_SEQ, 3, 100, 104, -5)   # a wrapping batch, extreme ids
    table.record_header(type("H", (), dict(producer_id=9, producer_epoch=2, attributes=0x20, base_offset=50,
                                           last_offset_delta=0, max_timestamp=77, base_sequence=-1))())
    data = table.to_snapshot()
    back = ProducerStateTable.from_snapshot(data)
    assert sorted(back) == [1, 9, 2**62]
    e1 = back.entry(1)
    assert (e1.epoch, list(e1.batches), e1.last_timestamp) == (3, [BatchMetadata(6, 7, 6, 7, 1003)], 1003)
    big = back.entry(2**62)
    assert list(big.batches) == [BatchMetadata(MAX_SEQ, 3, 100, 104, -5)] and big.epoch == 32767
    marker = back.entry(9)  # a control batch moved the epoch; no data batch
    assert (marker.epoch, list(marker.batches), marker.last_timestamp) == (2, [], 77)
    assert back.to_snapshot() == data
    assert back.check(1, 3, 6, 7) is not None  # the last batch is still recognised


def test_a_snapshot_built_by_hand_from_kafkas_format_decodes():
    # Kafka's ProducerSnapshot v1: int16 version, uint32 CRC32C of the rest, then the
    # ProducerEntries array (non-flexible: int32 length) of (int64 producerId, int16 epoch,
    # int32 lastSequence, int64 lastOffset, int32 offsetDelta, int64 timestamp,
    # int32 coordinatorEpoch, int64 currentTxnFirstOffset).
    entries = [(1000, 2, 14, 120, 4, 1726045957397, -1, -1), (77, 0, -1, -1, 0, -1, 5, -1)]
    body = struct.pack(">i", len(entries))
    for pid, epoch, seq, offset, delta, ts, coord, txn in entries:
        body += (pid.to_bytes(8, "big", signed=True) + epoch.to_bytes(2, "big", signed=True)
                 + seq.to_bytes(4, "big", signed=True) + offset.to_bytes(8, "big", signed=True)
                 + delta.to_bytes(4, "big", signed=True) + ts.to_bytes(8, "big", signed=True)
                 + coord.to_bytes(4, "big", signed=True) + txn.to_bytes(8, "big", signed=True))
    data = (1).to_bytes(2, "big") + crc32c.crc32c(body).to_bytes(4, "big") + body
    table = ProducerStateTable.from_snapshot(data)
    entry = table.entry(1000)
    assert entry.epoch == 2 and list(entry.batches) == [BatchMetadata(10, 14, 116, 120, 1726045957397)]
    assert table.entry(77) == ProducerStateEntry(77, 0, (), -1, coordinator_epoch=5)  # kept, as Kafka keeps it
    assert table.check(1000, 2, 15, 15) is None and table.check(1000, 2, 10, 14).first_offset == 116
    # An empty snapshot (what Kafka writes for a partition without producers) is 10 bytes.
    empty = (1).to_bytes(2, "big") + crc32c.crc32c(b"\0\0\0\0").to_bytes(4, "big") + b"\0\0\0\0"
    assert ProducerStateTable().to_snapshot() == empty and len(ProducerStateTable.from_snapshot(empty)) == 0


@pytest.mark.parametrize("damage", ["crc", "version", "short", "length", "delta"])
def test_a_damaged_snapshot_is_refused(damage):
    table = ProducerStateTable()
    fill(table, batches=2)
    data = bytearray(table.to_snapshot())
    if damage == "crc":
        data[-1] ^= 1
    elif damage == "version":
        data[1] = 2
    elif damage == "short":
        data = data[:5]
    elif damage == "length":
        data = data[:-1]
        data[2:6] = crc32c.crc32c(bytes(data[6:])).to_bytes(4, "big")
    else:  # an offset delta larger than the offset
        data[6 + 4 + 8 + 2 + 4 + 8:6 + 4 + 8 + 2 + 4 + 8 + 4] = (1 << 20).to_bytes(4, "big")
        data[2:6] = crc32c.crc32c(bytes(data[6:])).to_bytes(4, "big")
    with pytest.raises(CorruptSnapshotError):
        ProducerStateTable.from_snapshot(bytes(data), "x.snapshot")


# ---------------------------------------------------------------------- a log's table
def test_a_logs_active_producers_after_appends(tmp_path):
    with Log.open(str(tmp_path / "p-0")) as log:
        assert log.append_encoded(batch([b"a", b"b"], producer_id=7, base_sequence=0)) == 0
        log.append_encoded(batch([b"plain"]))
        assert log.append_encoded(batch([b"c"], producer_id=7, base_sequence=2)) == 3
        assert log.append_encoded(batch([b"d"], producer_id=8, base_sequence=0)) == 4
        producers = log.active_producers()
        assert sorted(producers) == [7, 8]
        assert [(b.first_sequence, b.first_offset) for b in producers[7].batches] == [(0, 0), (2, 3)]
        producers[7].batches.clear()  # a copy
        assert len(log.active_producers()[7].batches) == 2


def test_producerstate_imports_nothing_above_the_log_layer():
    tree = ast.parse(pathlib.Path(producerstate.__file__).read_text())
    ours = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.level > 0}
    assert ours <= {"records.batch", "records.control", "errors", "_native"}
