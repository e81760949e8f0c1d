"""A Log's producer state (logproducers.ProducerStateManager): idempotent appends, the state
across reopens and crashes, the .snapshot files at roll and close, pruning, truncation, the log
start, followers' copies, shared logs."""

from __future__ import annotations

import logging
import os
import struct

import crc32c
import pytest

from logstore import InvalidProducerEpochError, Log, OutOfOrderSequenceError
from logstore.log.producers import SNAPSHOTS_KEPT, snapshot_offsets, snapshot_path
from logstore.records.batch import BatchBuilder, parse_header

SMALL = dict(segment_bytes=2048, index_interval_bytes=256, file_delete_delay_ms=0)


def batch(values, pid=7, seq=0, epoch=0, builder=BatchBuilder()):
    return bytes(builder.build(values, producer_id=pid, producer_epoch=epoch, base_sequence=seq))


class Producer:
    """Idempotent batches of one producer, numbered as Kafka's producer numbers them."""

    def __init__(self, pid=7, epoch=0):
        self.pid, self.epoch, self.seq = pid, epoch, 0
        self.sent: list[bytes] = []

    def next(self, n=1, size=40):
        data = batch([b"%d" % (self.seq + i) + b"x" * size for i in range(n)], self.pid, self.seq, self.epoch)
        self.seq += n
        self.sent.append(data)
        return data


@pytest.fixture
def path(tmp_path):
    return str(tmp_path / "t-0")


# ---------------------------------------------------------------------- appends
def test_a_duplicate_is_answered_with_the_original_offsets_and_not_appended(path):
    p = Producer()
    with Log.open(path) as log:
        log.append(b"plain")
        first = log.append_idempotent(p.next(3))
        assert first == (1, 3, False)
        assert log.append_idempotent(p.sent[0]) == (1, 3, True)
        assert log.append_encoded(p.sent[0]) == 1
        assert log.log_end_offset == 4
        with pytest.raises(OutOfOrderSequenceError):
            log.append_idempotent(batch([b"gap"], seq=10))
        assert log.log_end_offset == 4


def test_a_fenced_epoch_and_a_new_epoch(path):
    with Log.open(path) as log:
        log.append_idempotent(batch([b"a"], seq=0, epoch=3))
        with pytest.raises(InvalidProducerEpochError):
            log.append_idempotent(batch([b"b"], seq=1, epoch=2))
        with pytest.raises(OutOfOrderSequenceError):
            log.append_idempotent(batch([b"b"], seq=1, epoch=4))
        assert log.append_idempotent(batch([b"b"], seq=0, epoch=4)) == (1, 1, False)
        assert log.log_end_offset == 2


def test_batches_without_producer_ids_are_never_checked(path):
    with Log.open(path) as log:
        plain = bytes(BatchBuilder().build([b"a"]))
        assert [log.append_idempotent(plain).duplicate for _ in range(3)] == [False] * 3
        assert log.log_end_offset == 3
        assert log.active_producers() == {}


def test_a_log_that_never_sees_a_producer_id_writes_no_snapshot(path):
    with Log.open(path, **SMALL) as log:
        for i in range(100):
            log.append(b"x" * 50)
        assert len(log.segments) > 2
    assert snapshot_offsets(path) == []


def test_append_batch_and_reencoded_client_batches_teach_the_state(tmp_path):
    with Log.open(str(tmp_path / "a-0")) as log:
        log.active_producers()  # loaded: from now on every append teaches it
        log.append_batch([b"a", b"b"], producer_id=5, producer_epoch=2, base_sequence=0)
        assert parse_header(log.read_raw(0)).producer_epoch == 2
        assert log.append_idempotent(batch([b"a", b"b"], pid=5, seq=0, epoch=2)) == (0, 1, True)
    # A compacted log and a forced codec encode the records again, keeping id, epoch, sequence.
    for name, config in (("c-0", dict(cleanup_policy="compact")), ("g-0", dict(compression_type="gzip")),
                         ("t-0", dict(message_timestamp_type="LogAppendTime"))):
        with Log.open(str(tmp_path / name), **config) as log:
            keyed = bytes(BatchBuilder().build([b"v"] * 3, [b"k"] * 3, producer_id=9, producer_epoch=4,
                                               base_sequence=6))
            assert log.append_idempotent(keyed) == (0, 2, False)
            h = parse_header(log.read_raw(0))
            assert (h.producer_id, h.producer_epoch, h.base_sequence) == (9, 4, 6)
            assert log.append_idempotent(keyed) == (0, 2, True)
            assert log.log_end_offset == 3


# ---------------------------------------------------------------------- reopen and crash
@pytest.mark.parametrize("how", ["close", "crash"])
def test_a_retry_after_reopen_is_still_a_duplicate(path, how):
    p, q = Producer(7), Producer(8)
    log = Log.open(path, **SMALL)
    for i in range(40):
        log.append_idempotent((p if i % 3 else q).next(2))
    assert len(log.segments) > 2
    end = log.log_end_offset
    log.close() if how == "close" else log._abandon()
    with Log.open(path, **SMALL) as log:
        assert log.log_end_offset == end
        last_p = parse_header(p.sent[-1])
        info = log.append_idempotent(p.sent[-1])
        assert info.duplicate and info.last_offset - info.first_offset == last_p.last_offset_delta
        assert log.append_idempotent(q.sent[-1]).duplicate
        assert log.log_end_offset == end
        assert log.append_idempotent(p.next()).duplicate is False
        with pytest.raises(OutOfOrderSequenceError):
            log.append_idempotent(batch([b"gap"], pid=8, seq=q.seq + 1))


def test_after_a_crash_the_batches_since_the_last_snapshot_are_replayed(path):
    p = Producer()
    log = Log.open(path, **SMALL)
    for _ in range(30):
        log.append_idempotent(p.next())
    assert snapshot_offsets(path)  # written at the rolls
    last_snapshot = snapshot_offsets(path)[-1]
    assert last_snapshot < log.log_end_offset
    log._abandon()
    with Log.open(path, **SMALL) as log:
        # All of the last five batches, replayed after the snapshot, are still recognised.
        for sent in p.sent[-5:]:
            assert log.append_idempotent(sent).duplicate
        with pytest.raises(OutOfOrderSequenceError):
            log.append_idempotent(p.sent[-6])  # the sixth back: forgotten


def test_a_reload_from_a_snapshot_knows_each_producers_last_batch_only(path):
    p = Producer()
    with Log.open(path) as log:
        for _ in range(3):
            log.append_idempotent(p.next())
    with Log.open(path) as log:  # the snapshot at the log end holds the last batch
        assert log.append_idempotent(p.sent[-1]).duplicate
        with pytest.raises(OutOfOrderSequenceError):  # as Kafka answers it
            log.append_idempotent(p.sent[-2])


# ---------------------------------------------------------------------- snapshot files
def test_snapshots_are_written_at_roll_and_close_and_pruned(path):
    p = Producer()
    log = Log.open(path, **SMALL)
    log.append_idempotent(p.next())
    assert snapshot_offsets(path) == []
    while len(log.segments) < 2:
        log.append_idempotent(p.next())
    assert snapshot_offsets(path) == [log.segments[-1].base_offset]
    while len(log.segments) < 8:
        log.append_idempotent(p.next())
    bases = [s.base_offset for s in log.segments]
    assert snapshot_offsets(path) == bases[-SNAPSHOTS_KEPT:]
    end = log.log_end_offset
    log.close()
    assert snapshot_offsets(path) == bases[-SNAPSHOTS_KEPT + 1:] + [end]
    with Log.open(path, **SMALL) as log:  # nothing new: the close writes nothing
        pass
    assert snapshot_offsets(path) == bases[-SNAPSHOTS_KEPT + 1:] + [end]


def test_truncation_deletes_the_snapshots_above_the_new_end_and_reloads(path):
    p = Producer()
    with Log.open(path, **SMALL) as log:
        while len(log.segments) < 4:
            log.append_idempotent(p.next())
        offsets = snapshot_offsets(path)
        cut = offsets[-2] + 1
        log.truncate_to(cut)
        assert snapshot_offsets(path) == [o for o in offsets if o <= cut]
        # The batches from the cut on are gone: their retries are appended again ...
        kept = [b for b in p.sent if parse_header(b).base_sequence < cut]
        lost = p.sent[len(kept)]
        assert log.append_idempotent(lost) == (cut, cut, False)
        # ... while those before it are still duplicates.
        assert log.append_idempotent(kept[-1]).duplicate
        log.truncate_to(0)
        assert snapshot_offsets(path) == []
        assert log.active_producers() == {}
        assert log.append_idempotent(batch([b"any"], seq=1234)) == (0, 0, False)


def test_a_snapshot_above_the_log_end_at_open_is_deleted(path):
    p = Producer()
    with Log.open(path, **SMALL) as log:
        for _ in range(5):
            log.append_idempotent(p.next())
        end = log.log_end_offset
    stray = os.path.join(path, f"{end + 100:020d}.snapshot")
    with open(os.path.join(path, f"{end:020d}.snapshot"), "rb") as f:
        data = f.read()
    with open(stray, "wb") as f:
        f.write(data)  # as if recovery had cut the tail it described
    with Log.open(path, **SMALL) as log:
        assert not os.path.exists(stray)
        assert log.append_idempotent(p.sent[-1]).duplicate


def test_a_corrupt_snapshot_is_deleted_and_an_older_one_or_the_log_used(path, caplog):
    p = Producer()
    log = Log.open(path, **SMALL)
    while len(log.segments) < 4:
        log.append_idempotent(p.next())
    log.close()
    older, newest = snapshot_offsets(path)[-2:]
    newest_path = os.path.join(path, f"{newest:020d}.snapshot")
    with open(newest_path, "r+b") as f:
        data = bytearray(f.read())
        data[-9] ^= 1  # a bit of the timestamp
        f.seek(0)
        f.write(data)
    with caplog.at_level(logging.WARNING, logger="logstore.log.log"), Log.open(path, **SMALL) as log:
        # The older snapshot's last batch and the batches replayed after it.
        for sent in p.sent[older - 1:]:
            assert log.append_idempotent(sent).duplicate
        assert "snapshot is corrupt" in caplog.text
        assert newest not in snapshot_offsets(path)
    # Every snapshot damaged: the log itself is replayed from its start.
    for offset in snapshot_offsets(path):
        with open(os.path.join(path, f"{offset:020d}.snapshot"), "wb") as f:
            f.write(b"\0\1garbage")
    with Log.open(path, **SMALL) as log:
        assert log.append_idempotent(p.sent[-1]).duplicate


def test_the_log_start_forgets_producers_and_old_snapshots(path):
    old, new = Producer(1), Producer(2)
    with Log.open(path, **SMALL) as log:
        log.append_idempotent(old.next())
        while len(log.segments) < 6:
            log.append_idempotent(new.next())
        assert sorted(log.active_producers()) == [1, 2]
        start = log.segments[3].base_offset
        log.delete_records_before(start)
        assert sorted(log.active_producers()) == [2]
        assert min(snapshot_offsets(path)) >= log.segments[0].base_offset
        # Producer 1's batches are gone: it is unknown, so any sequence is accepted again.
        assert log.append_idempotent(batch([b"back"], pid=1, seq=99)).duplicate is False
    with Log.open(path, **SMALL) as log:
        assert log.active_producers()[1].last_sequence == 99


def test_retention_deletes_the_snapshots_below_the_first_segment(path):
    p = Producer()
    with Log.open(path, **SMALL, retention_bytes=4096) as log:
        while len(log.segments) < 8:
            log.append_idempotent(p.next())
        assert log.enforce_retention() > 0
        first = log.segments[0].base_offset
        assert snapshot_offsets(path) and min(snapshot_offsets(path)) >= first
        assert log.append_idempotent(p.sent[-1]).duplicate


def test_truncate_fully_and_start_at_forgets_everything(path):
    p = Producer()
    with Log.open(path, **SMALL) as log:
        while len(log.segments) < 3:
            log.append_idempotent(p.next())
        log.truncate_fully_and_start_at(5000)
        assert snapshot_offsets(path) == [] and log.active_producers() == {}
        assert log.append_idempotent(p.sent[-1]) == (5000, 5000, False)
    with Log.open(path, **SMALL) as log:
        assert log.append_idempotent(p.sent[-1]) == (5000, 5000, True)


# ---------------------------------------------------------------------- followers, Kafka's files
def test_a_followers_copy_learns_the_batches_it_copies(tmp_path):
    p = Producer()
    with Log.open(str(tmp_path / "leader-0"), **SMALL) as leader, \
            Log.open(str(tmp_path / "follower-0"), **SMALL) as follower:
        follower.active_producers()
        for _ in range(20):
            leader.append_idempotent(p.next())
        offset = 0
        while offset < leader.log_end_offset:
            offset = follower.append_replicated(leader.read_raw(offset, 1000))
        assert follower.append_idempotent(p.sent[-1]) == leader.append_idempotent(p.sent[-1])
        assert follower.active_producers() == leader.active_producers()


def test_a_kafka_written_snapshot_is_read(path):
    """A partition directory as Kafka leaves it: the snapshot at the log end, written from
    Kafka's format description (struct and the crc32c package, not our encoder)."""
    p = Producer(pid=4242, epoch=3)
    with Log.open(path) as log:
        for _ in range(3):
            log.append_idempotent(p.next(2))
        end = log.log_end_offset
    for offset in snapshot_offsets(path):
        os.unlink(snapshot_path(path, offset))
    last = parse_header(p.sent[-1])
    body = struct.pack(">i", 1) + struct.pack(">qhiqiqiq", 4242, 3, 5, end - 1, 1, last.max_timestamp, -1, -1)
    with open(os.path.join(path, f"{end:020d}.snapshot"), "wb") as f:
        f.write(struct.pack(">hI", 1, crc32c.crc32c(body)) + body)
    with Log.open(path) as log:
        assert log.append_idempotent(p.sent[-1]) == (end - 2, end - 1, True)
        assert log.active_producers()[4242].epoch == 3


# ---------------------------------------------------------------------- shared logs
def test_a_shared_log_checks_against_what_other_processes_appended(path):
    a = Log.open_shared(path, **SMALL)
    b = Log.open_shared(path, **SMALL)
    try:
        p = Producer()
        assert a.append_idempotent(p.next()).duplicate is False
        # b never saw the state: it learns a's batch before checking the retry.
        assert b.append_idempotent(p.sent[-1]).duplicate
        assert b.append_idempotent(p.next()).duplicate is False
        assert a.append_idempotent(p.sent[-1]).duplicate  # and a learns b's
        with pytest.raises(OutOfOrderSequenceError):
            a.append_idempotent(batch([b"gap"], seq=p.seq + 3))
        # Through rolls by either process (snapshots written from a current table).
        for i in range(40):
            (a if i % 2 else b).append_idempotent(p.next())
        assert len(a.segments) > 2
        assert a.append_idempotent(p.sent[-1]).duplicate and b.append_idempotent(p.sent[-2]).duplicate
        # A truncation by one process is seen by the other.
        cut = a.log_end_offset - 3
        a.truncate_to(cut)
        retry = p.sent[-3]
        assert parse_header(retry).base_offset == 0  # (a client batch carries no offset)
        assert b.append_idempotent(retry).duplicate is False
        assert a.append_idempotent(retry).duplicate
        assert a.log_end_offset == cut + 1
    finally:
        a.close()
        b.close()
    with Log.open(path, **SMALL) as log:
        assert log.append_idempotent(p.sent[-3]).duplicate


# ---------------------------------------------------------------------- compaction
@pytest.mark.parametrize("retain", [True, False])
def test_compaction_keeps_a_producers_last_batch_so_its_state_survives_without_snapshots(path, retain, monkeypatch):
    """As Kafka's cleaner: an idempotent producer's last batch is kept (as an empty batch when
    every record in it is superseded), so that the state rebuilt from the log alone still knows
    its last sequence and a retry of that batch is a duplicate. retain=False shows what is lost
    without it (the same scenario with the rule switched off)."""
    from logstore import cleaner

    if not retain:
        real = cleaner.compact_segments
        monkeypatch.setattr(cleaner, "compact_segments", lambda *args, **kw: real(*args[:7]))
    keyed = BatchBuilder()
    mine = bytes(keyed.build([b"old"], [b"k"], producer_id=7, producer_epoch=0, base_sequence=0))
    with Log.open(path, cleanup_policy="compact", min_cleanable_dirty_ratio=0.0, **SMALL) as log:
        first, last, duplicate = log.append_idempotent(mine)
        assert (first, last, duplicate) == (0, 0, False)
        for i in range(60):  # key k superseded, then enough other records to seal the segments
            log.append_batch([b"new %d" % i], [b"k" if i == 0 else b"other %d" % i])
        log.roll()
        log.compact()
        headers = [parse_header(data, at) for data, at in _batches(log)]
        ours = [h for h in headers if h.producer_id == 7]
        assert [(h.base_offset, h.records_count, h.base_sequence) for h in ours] == \
            ([(0, 0, 0)] if retain else [])
        assert [r.value for r in log.iter()][:1] == [b"new 0"]  # the record itself is gone
    for offset in snapshot_offsets(path):  # the state must come from the log alone
        os.unlink(snapshot_path(path, offset))
    with Log.open(path, cleanup_policy="compact", **SMALL) as log:
        end = log.log_end_offset
        assert log.append_idempotent(mine)[2] is retain
        assert log.log_end_offset == (end if retain else end + 1)



def test_compacting_a_log_without_producer_ids_loads_no_producer_state(path):
    """The rule above asks for the producer state only when a pass would drop a batch that
    carries a producer id: a compacted log that never sees one still writes no snapshot."""
    with Log.open(path, cleanup_policy="compact", min_cleanable_dirty_ratio=0.0, **SMALL) as log:
        for i in range(80):
            log.append_batch([b"v %d" % i], [b"k %d" % (i % 5)])
        log.roll()
        assert log.compact().records_dropped > 0
        assert not log._producers.loaded
        log.append_batch([b"after"], [b"k 0"])
    assert snapshot_offsets(path) == []

def _batches(log):
    """(segment bytes, position) of every batch in the log, oldest first."""
    out = []
    for data, _ in [(s.buffer, s) for s in log._segments.sealed()] + [(log._segments.last.buffer, None)]:
        at = 0
        while at + 61 <= len(data):
            length = struct.unpack_from(">i", data, at + 8)[0]
            if length <= 0:
                break
            out.append((data, at))
            at += 12 + length
    return out
