"""Transactions in the log layer: markers, the last stable offset, the ``.txnindex``, reads.

The formats are checked against independent encoders: bytes packed by hand from Kafka's schemas
(ControlRecordType, EndTxnMarker, AbortedTxn) and kafka-python's record codec, which builds
client transactional batches and parses the control batches the log writes.
"""

from __future__ import annotations

import os
import pathlib
import struct

import pytest
from kafka.record.default_records import DefaultRecordBatchBuilder
from kafka.record.memory_records import MemoryRecords

from logstore import InvalidProducerEpochError, InvalidTxnStateError, TransactionCoordinatorFencedError
from logstore.errors import CorruptIndexError, InvalidRecordError
from logstore.index import AbortedTxn, TransactionIndex
from logstore.log.log import Log
from logstore.records.batch import BatchBuilder, validate_client_batch
from logstore.records.control import (ControlType, end_txn_marker_record, marker_coordinator_epoch, read_control_record,
                                      read_marker)


def client_batch(pid: int, epoch: int, seq: int, values: list[bytes], transactional: bool = True) -> bytes:
    """A batch as a Kafka client sends it, encoded by kafka-python (not by logstore)."""
    builder = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=transactional,
                                        producer_id=pid, producer_epoch=epoch, base_sequence=seq, batch_size=1 << 20)
    for i, value in enumerate(values):
        builder.append(i, timestamp=1_700_000_000_000 + i, key=None, value=value, headers=[])
    return bytes(builder.build())


def segment_bytes(path: pathlib.Path) -> bytes:
    return b"".join(p.read_bytes() for p in sorted(path.glob("*.log")))


def values(records) -> list[tuple[int, bytes]]:
    return [(r.offset, r.value) for r in records]


# ---------------------------------------------------------------------- formats
def test_marker_record_is_kafkas_control_key_and_end_txn_marker():
    key, value = end_txn_marker_record(commit=True, coordinator_epoch=9)
    assert key == struct.pack(">hh", 0, 1) and value == struct.pack(">hi", 0, 9)
    key, value = end_txn_marker_record(commit=False, coordinator_epoch=0)
    assert key == struct.pack(">hh", 0, 0)
    assert marker_coordinator_epoch(struct.pack(">hi", 0, 77)) == 77
    with pytest.raises(ValueError):
        end_txn_marker_record(True, 2**31)


def test_markers_the_log_writes_are_control_batches_to_kafka_python(tmp_path):
    with Log.open(tmp_path / "t-0") as log:
        log.append_idempotent(client_batch(5, 3, 0, [b"a", b"b"]))
        commit = log.append_txn_marker(5, 3, commit=True, coordinator_epoch=2)
        log.append_idempotent(client_batch(5, 3, 2, [b"c"]))
        abort = log.append_txn_marker(5, 3, commit=False, coordinator_epoch=2)
        assert (commit, abort) == (2, 4)
    records = MemoryRecords(segment_bytes(tmp_path / "t-0"))
    seen = []
    while (batch := records.next_batch()) is not None:
        assert batch.validate_crc()
        seen.append((batch.base_offset, batch.is_transactional, batch.is_control_batch, batch.producer_id,
                     batch.producer_epoch, batch.base_sequence, [getattr(r, "type", None) for r in batch]))
    assert seen == [(0, True, False, 5, 3, 0, [None, None]), (2, True, True, 5, 3, -1, [1]),
                    (3, True, False, 5, 3, 2, [None]), (4, True, True, 5, 3, -1, [0])]


def test_read_marker_bounds_checks_the_record():
    key, value = end_txn_marker_record(False, 4)
    batch = BatchBuilder().build([value], [key], control=True, transactional=True, producer_id=1, producer_epoch=0)
    assert read_marker(batch, 0, len(batch)) == (ControlType.ABORT, 4)
    assert read_control_record(batch, 0, len(batch)) == (0, value)
    from logstore.errors import CorruptRecordError
    for cut in (62, 63, 66, len(batch) - 3):
        with pytest.raises(CorruptRecordError):
            read_marker(batch[:cut], 0, cut)


def test_a_client_may_send_transactional_batches_but_never_control_ones():
    header = validate_client_batch(client_batch(3, 0, 0, [b"x"]), 1 << 20)
    assert header.producer_id == 3
    key, value = end_txn_marker_record(True, 0)
    forged = BatchBuilder().build([value], [key], control=True, transactional=True, producer_id=3, producer_epoch=0,
                                  base_sequence=0)
    with pytest.raises(InvalidRecordError, match="control"):
        validate_client_batch(forged, 1 << 20)


# ---------------------------------------------------------------------- the transaction index
def test_txnindex_entries_are_kafkas_34_byte_layout(tmp_path):
    path = str(tmp_path / "00000000000000000000.txnindex")
    index = TransactionIndex(path, 0)
    assert not index.exists and len(index) == 0
    index.append(AbortedTxn(7, 3, 10, 11))
    index.append(AbortedTxn(8, 5, 12, 13))
    index.flush()
    raw = pathlib.Path(path).read_bytes()
    assert raw == struct.pack(">hqqqq", 0, 7, 3, 10, 11) + struct.pack(">hqqqq", 0, 8, 5, 12, 13)
    with pytest.raises(ValueError):
        index.append(AbortedTxn(9, 1, 12, 13))  # markers must follow each other
    index.close()
    again = TransactionIndex(path, 0)
    assert again.entries == [AbortedTxn(7, 3, 10, 11), AbortedTxn(8, 5, 12, 13)]
    # Kafka's collectAbortedTxns: overlapping entries, and whether the search is complete
    assert again.collect(11, 12) == ([AbortedTxn(8, 5, 12, 13)], True)
    assert again.collect(0, 4) == ([AbortedTxn(7, 3, 10, 11)], True)
    assert again.collect(0, 100) == ([AbortedTxn(7, 3, 10, 11), AbortedTxn(8, 5, 12, 13)], False)
    again.truncate_to(12)
    assert again.entries == [AbortedTxn(7, 3, 10, 11)] and os.path.getsize(path) == 34
    again.close()


@pytest.mark.parametrize("damage", ["cut", "version", "order", "below base"])
def test_a_damaged_txnindex_fails_its_sanity_check(tmp_path, damage):
    path = tmp_path / "00000000000000000100.txnindex"
    good = struct.pack(">hqqqq", 0, 7, 100, 110, 111)
    data = {"cut": good + good[:20], "version": struct.pack(">hqqqq", 1, 7, 100, 110, 111),
            "order": good + good, "below base": struct.pack(">hqqqq", 0, 7, 50, 60, 61)}[damage]
    path.write_bytes(data)
    index = TransactionIndex(str(path), 100)
    with pytest.raises(CorruptIndexError):
        index.sanity_check()


# ---------------------------------------------------------------------- the log
def test_lso_follows_open_transactions_and_markers(tmp_path):
    with Log.open(tmp_path / "t-0") as log:
        log.append(b"plain")
        assert log.last_stable_offset == 1
        log.append_idempotent(client_batch(1, 0, 0, [b"a1", b"a2"]))   # 1, 2
        log.append_idempotent(client_batch(2, 0, 0, [b"b1"]))          # 3
        assert log.last_stable_offset == 1 and log.producer_transactions() == {1: 1, 2: 3}
        log.append_txn_marker(1, 0, commit=True)                       # 4
        assert log.last_stable_offset == 3
        log.append_txn_marker(2, 0, commit=False)                      # 5
        assert log.last_stable_offset == 6 == log.log_end_offset
        assert log.aborted_transactions(0, 6) == [AbortedTxn(2, 3, 5, 6)]
        assert values(log.read(0, isolation_level="read_committed")) == [(0, b"plain"), (1, b"a1"), (2, b"a2")]
        assert values(log.read(0)) == [(0, b"plain"), (1, b"a1"), (2, b"a2"), (3, b"b1")]
        with pytest.raises(ValueError):
            log.read(0, isolation_level="serializable")


def test_an_abort_records_the_lso_of_the_other_open_transactions(tmp_path):
    with Log.open(tmp_path / "t-0") as log:
        log.append_idempotent(client_batch(1, 0, 0, [b"a"]))   # 0: producer 1 open
        log.append_idempotent(client_batch(2, 0, 0, [b"b"]))   # 1: producer 2 open
        log.append_txn_marker(2, 0, commit=False)              # 2: producer 1 still open at 0
        assert log.aborted_transactions(0, 3) == [AbortedTxn(2, 1, 2, 0)]
        assert log.last_stable_offset == 0
        assert log.read(0, isolation_level="read_committed") == []


def test_high_watermark_holds_back_the_lso_until_it_passes_the_marker(tmp_path):
    with Log.open(tmp_path / "t-0") as log:
        log.append_idempotent(client_batch(1, 0, 0, [b"a"]))
        log.append_txn_marker(1, 0, commit=True)
        log.high_watermark = 1       # the marker is not replicated yet
        assert log.last_stable_offset == 0
        log.high_watermark = 2
        assert log.last_stable_offset == 2


def test_the_producer_state_checks_transactional_writes(tmp_path):
    with Log.open(tmp_path / "t-0") as log:
        log.append_idempotent(client_batch(1, 4, 0, [b"a"]))
        with pytest.raises(InvalidTxnStateError, match="non-transactional"):
            log.append_idempotent(client_batch(1, 4, 1, [b"b"], transactional=False))
        log.append_txn_marker(1, 4, commit=True, coordinator_epoch=6)
        with pytest.raises(TransactionCoordinatorFencedError):
            log.append_txn_marker(1, 4, commit=True, coordinator_epoch=5)
        with pytest.raises(InvalidProducerEpochError):
            log.append_txn_marker(1, 3, commit=False, coordinator_epoch=6)
        assert log.append_idempotent(client_batch(1, 4, 1, [b"b"], transactional=False)).first_offset == 2
        # A retry of a transactional batch is a duplicate, answered with its offsets.
        first = log.append_idempotent(client_batch(1, 4, 2, [b"c"]))
        again = log.append_idempotent(client_batch(1, 4, 2, [b"c"]))
        assert again.duplicate and again.first_offset == first.first_offset
        with pytest.raises(ValueError):
            log.append_batch([b"x"], transactional=True)  # no producer id


def test_open_transactions_and_the_index_survive_a_clean_restart(tmp_path):
    path = tmp_path / "t-0"
    with Log.open(path) as log:
        log.append_idempotent(client_batch(1, 0, 0, [b"a"]))
        log.append_txn_marker(1, 0, commit=False)
        log.append_idempotent(client_batch(2, 0, 0, [b"b"]))   # 2: open across the restart
        log.append(b"plain")
    with Log.open(path) as log:
        assert log.last_stable_offset == 2 and log.producer_transactions() == {2: 2}
        assert log.aborted_transactions(0, 4) == [AbortedTxn(1, 0, 1, 2)]
        log.append_txn_marker(2, 0, commit=True)
        assert log.last_stable_offset == 5
        assert values(log.read(0, isolation_level="read_committed")) == [(2, b"b"), (3, b"plain")]


def test_recovery_rebuilds_a_lost_txnindex_from_the_markers(tmp_path):
    path = tmp_path / "t-0"
    log = Log.open(path, segment_bytes=4096)
    for i in range(40):
        pid = i % 3
        log.append_idempotent(client_batch(pid, 0, i // 3, [b"v%d" % i]))
        log.append(b"p%d" % i)
        if i % 3 == 2:
            for p in range(3):
                log.append_txn_marker(p, 0, commit=p != 1)
    expected_aborts = log.aborted_transactions(0, log.log_end_offset)
    expected = values(log.iter(isolation_level="read_committed"))
    assert len(expected_aborts) == 13 and len(log.segments) > 3
    log._abandon()  # a crash: no clean shutdown marker, the tail is recovered
    for index in path.glob("*.txnindex"):
        index.unlink()  # as if the index writes never reached the disk
    (path.parent / "recovery-point-offset-checkpoint").unlink()  # every segment is scanned
    with Log.open(path, segment_bytes=4096) as log:
        assert log.aborted_transactions(0, log.log_end_offset) == expected_aborts
        assert values(log.iter(isolation_level="read_committed")) == expected


def test_a_damaged_txnindex_is_rebuilt_at_open(tmp_path):
    path = tmp_path / "t-0"
    with Log.open(path) as log:
        log.append_idempotent(client_batch(1, 0, 0, [b"a"]))
        log.append_txn_marker(1, 0, commit=False)
        log.append(b"b")
    index = next(path.glob("*.txnindex"))
    index.write_bytes(index.read_bytes()[:-3])
    with Log.open(path) as log:
        assert log.aborted_transactions(0, 3) == [AbortedTxn(1, 0, 1, 2)]
        assert values(log.read(0, isolation_level="read_committed")) == [(2, b"b")]
    assert index.stat().st_size == 34


def test_truncation_cuts_the_index_and_reopens_a_transaction(tmp_path):
    with Log.open(tmp_path / "t-0") as log:
        log.append_idempotent(client_batch(1, 0, 0, [b"a", b"b"]))   # 0, 1
        log.append_txn_marker(1, 0, commit=False)                     # 2
        assert log.last_stable_offset == 3
        log.truncate_to(2)  # the marker is gone: the transaction is open again
        assert log.aborted_transactions(0, 3) == [] and log.last_stable_offset == 0
        assert log.producer_transactions() == {1: 0}
        log.truncate_to(0)
        assert log.last_stable_offset == 0 and log.producer_transactions() == {}


def test_deleted_segments_take_their_txnindex_with_them(tmp_path):
    path = tmp_path / "t-0"
    with Log.open(path, segment_bytes=1024, file_delete_delay_ms=0) as log:
        log.append_idempotent(client_batch(1, 0, 0, [b"a"]))
        log.append_txn_marker(1, 0, commit=False)
        log.roll()
        log.append(b"x" * 10)
        assert len(list(path.glob("*.txnindex"))) == 1
        log.delete_records_before(2)
        assert list(path.glob("*.txnindex*")) == []


def test_a_follower_copy_indexes_the_leaders_aborts(tmp_path):
    with Log.open(tmp_path / "leader-0") as leader, Log.open(tmp_path / "follower-0") as follower:
        leader.append_idempotent(client_batch(1, 0, 0, [b"a"]))
        leader.append_txn_marker(1, 0, commit=False)
        leader.append_idempotent(client_batch(2, 0, 0, [b"b"]))
        while follower.log_end_offset < leader.log_end_offset:  # (read_raw stops at a segment's end)
            follower.append_replicated(leader.read_raw(follower.log_end_offset, 1 << 20))
        assert follower.aborted_transactions(0, 3) == leader.aborted_transactions(0, 3) == [AbortedTxn(1, 0, 1, 2)]
        assert follower.last_stable_offset == leader.last_stable_offset == 2
        assert follower.producer_transactions() == {2: 2}


# ---------------------------------------------------------------------- the tools
def _aborting_log(path, segment_bytes=2048):
    with Log.open(path, segment_bytes=segment_bytes) as log:
        for i in range(30):
            pid = i % 3
            log.append_idempotent(client_batch(pid, 0, i // 3, [b"v%d" % i]))
            if i % 3 == 2:
                for p in range(3):
                    log.append_txn_marker(p, 0, commit=p != 1, coordinator_epoch=4)


def test_dump_prints_txnindex_entries_and_markers_as_kafka_dump_log(tmp_path):
    from logstore.tools.dump import dump_file
    path = tmp_path / "t-0"
    _aborting_log(path)
    index = sorted(path.glob("*.txnindex"))[0]
    entries = list(dump_file(str(index)))
    assert entries[0] == {"kind": "txnindex", "slot": 0, "version": 0, "producer_id": 1, "first_offset": 1,
                          "last_offset": 4, "last_stable_offset": 2}
    batches = [b for log in sorted(path.glob("*.log")) for b in dump_file(str(log))]
    markers = [b for b in batches if b.get("is_control")]
    assert markers[0]["control_type"] == "COMMIT" and markers[1]["control_type"] == "ABORT"
    assert markers[0]["coordinator_epoch"] == 4


def test_verify_checks_txnindex_against_the_markers(tmp_path):
    from logstore.tools.verify import verify
    path = tmp_path / "t-0"
    _aborting_log(path)
    assert verify(str(path)).ok
    index = sorted(path.glob("*.txnindex"))[0]
    data = index.read_bytes()
    index.write_bytes(data[:34])                    # entries lost
    problems = [p.what for p in verify(str(path)).problems]
    assert problems and all("missing entry" in p for p in problems)
    forged = bytearray(data)
    forged[10:18] = (0).to_bytes(8, "big")          # the first entry's first offset
    index.write_bytes(bytes(forged))
    assert [p.what for p in verify(str(path)).problems] == ["entry 0 says the transaction began at 0, the log says 1"]


# ---------------------------------------------------------------------- other readers
def _mixed_log(path):
    log = Log.open(path)
    log.append(b"p0")
    log.append_idempotent(client_batch(1, 0, 0, [b"a1", b"a2"]))   # aborted below
    log.append_idempotent(client_batch(2, 0, 0, [b"c1"]))          # committed below
    log.append(b"p1")
    log.append_txn_marker(1, 0, commit=False)
    log.append_idempotent(client_batch(2, 0, 1, [b"c2"]))
    log.append_txn_marker(2, 0, commit=True)
    log.append_idempotent(client_batch(3, 0, 0, [b"open"]))         # open: the LSO
    log.append(b"p2")
    return log


def test_read_arrow_read_committed(tmp_path):
    pytest.importorskip("pyarrow")
    with _mixed_log(tmp_path / "t-0") as log:
        committed = log.read_arrow(isolation_level="read_committed", columns=["offset", "value"]).to_pydict()
        assert list(zip(committed["offset"], committed["value"])) == [(0, b"p0"), (3, b"c1"), (4, b"p1"), (6, b"c2")]
        assert log.committed_ranges(0, log.last_stable_offset) == [(0, 1), (3, 8)]
        assert log.read_arrow(isolation_level="read_committed", max_records=2).num_rows == 2
        assert log.read_arrow().num_rows == 10 - 2  # read_uncommitted: every record but the two markers
        with pytest.raises(ValueError):
            log.read_arrow(isolation_level="nope")


def test_library_consumer_read_committed(tmp_path):
    from logstore import LogStore
    with LogStore(tmp_path / "store") as store:
        store.create_topic("t", 1)
        log = store.partition("t", 0)
        log.append(b"p0")
        log.append_batch([b"a"], producer_id=1, producer_epoch=0, base_sequence=0, transactional=True)
        log.append_txn_marker(1, 0, commit=False)
        log.append_batch([b"c"], producer_id=2, producer_epoch=0, base_sequence=0, transactional=True)
        consumer = store.consumer("g", "t", isolation_level="read_committed")
        assert [r.value for r in consumer.poll(1.0)] == [b"p0"]
        assert consumer.poll(0.1) == [] and consumer.lag() == {("t", 0): 0}  # past the aborted record
        log.append_txn_marker(2, 0, commit=True)
        assert [r.value for r in consumer.poll(1.0)] == [b"c"]
        everything = store.consumer("h", "t")
        assert [r.value for r in everything.poll(1.0)] == [b"p0", b"a", b"c"]
        from logstore import InvalidConfigError
        with pytest.raises(InvalidConfigError):
            store.consumer("x", "t", isolation_level="snapshot")


def test_cli_consume_read_committed(tmp_path):
    import io
    from logstore import LogStore
    from logstore.cli import main
    with LogStore(tmp_path / "store") as store:
        store.create_topic("t", 1)
        log = store.partition("t", 0)
        log.append(b"p0")
        log.append_batch([b"aborted"], producer_id=1, producer_epoch=0, base_sequence=0, transactional=True)
        log.append_txn_marker(1, 0, commit=False)
        log.append(b"p1")
    for level, expected in (("read_committed", "p0\np1\n"), ("read_uncommitted", "p0\naborted\np1\n")):
        out = io.StringIO()
        assert main(["consume", str(tmp_path / "store"), "t", "--from-beginning", "--isolation-level", level],
                    stdout=out) == 0
        assert out.getvalue() == expected
