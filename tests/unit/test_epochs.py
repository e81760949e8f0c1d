"""Leader epoch cache (leader-epoch-checkpoint) and the Log's replication primitives."""

from __future__ import annotations

import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from logstore import CorruptRecordError, Log, OffsetOutOfRangeError
from logstore.log.epochs import UNDEFINED_EPOCH, UNDEFINED_OFFSET, LeaderEpochCache
from logstore.records.batch import parse_header


def test_cache_assign_persist_and_kafka_file_format(tmp_path):
    cache = LeaderEpochCache(str(tmp_path))
    assert cache.latest_epoch == UNDEFINED_EPOCH
    assert cache.assign(0, 0) is True
    assert cache.assign(0, 5) is False  # an epoch keeps its first start offset
    assert cache.assign(3, 10) is True
    assert open(os.path.join(tmp_path, "leader-epoch-checkpoint")).read() == "0\n2\n0 0\n3 10\n"
    assert LeaderEpochCache(str(tmp_path)).entries == [(0, 0), (3, 10)]
    with pytest.raises(ValueError):
        cache.assign(-1, 0)


def test_end_offset_for_epoch_follows_kafka():
    cache = LeaderEpochCache.__new__(LeaderEpochCache)
    cache.entries = [(1, 0), (3, 10), (5, 20)]
    assert cache.end_offset_for(5, 25) == (5, 25)        # latest epoch: the log end
    assert cache.end_offset_for(3, 25) == (3, 20)        # start of the next epoch
    assert cache.end_offset_for(4, 25) == (3, 20)        # unknown epoch: floor epoch, next start
    assert cache.end_offset_for(0, 25) == (0, 0)         # before the first epoch
    assert cache.end_offset_for(6, 25) == (UNDEFINED_EPOCH, UNDEFINED_OFFSET)
    assert cache.end_offset_for(UNDEFINED_EPOCH, 25) == (UNDEFINED_EPOCH, UNDEFINED_OFFSET)
    assert cache.epoch_for_offset(15) == 3 and cache.epoch_for_offset(0) == 1


def test_truncation_from_end_and_start(tmp_path):
    cache = LeaderEpochCache(str(tmp_path))
    for epoch, offset in [(1, 0), (3, 10), (5, 20)]:
        cache.assign(epoch, offset)
    cache.truncate_from_end(20)
    assert cache.entries == [(1, 0), (3, 10)]
    cache.truncate_from_start(12)
    assert cache.entries == [(3, 12)]
    assert LeaderEpochCache(str(tmp_path)).entries == [(3, 12)]


@pytest.mark.parametrize("text", ["0\n1\n3 1\n2 5\n", "0\n2\n1 5\n2 4\n", "0\n1\nx 1\n", "1\n0\n", "0\n1\n-1 0\n"])
def test_damaged_checkpoint_is_refused(tmp_path, text):
    with open(os.path.join(tmp_path, "leader-epoch-checkpoint"), "w") as f:
        f.write(text)
    from logstore.checkpoint import CorruptCheckpointError
    with pytest.raises(CorruptCheckpointError):
        LeaderEpochCache(str(tmp_path))


def test_a_log_with_a_damaged_epoch_file_still_opens(tmp_path):
    path = str(tmp_path / "t-0")
    with Log.open(path) as log:
        log.assign_leader_epoch(2)
        log.append(b"x")
    with open(os.path.join(path, "leader-epoch-checkpoint"), "w") as f:
        f.write("garbage")
    with Log.open(path) as log:
        assert log.latest_epoch == -1
        assert log.read(0)[0].value == b"x"


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 30), st.integers(0, 200)), max_size=12),
       st.integers(0, 250), st.integers(0, 250))
def test_cache_stays_monotonic(tmp_path_factory, ops, end, start):
    cache = LeaderEpochCache(str(tmp_path_factory.mktemp("e")))
    for epoch, offset in ops:
        cache.assign(epoch, offset)
        es = cache.entries
        assert all(a[0] < b[0] and a[1] <= b[1] for a, b in zip(es, es[1:]))
        assert es[-1] == (epoch, offset) or es[-1][0] == epoch
    cache.truncate_from_end(end)
    assert all(o < end for _, o in cache.entries)
    cache.truncate_from_start(start)
    assert all(o >= start for _, o in cache.entries)


# ---------------------------------------------------------------------- Log primitives
def test_assign_leader_epoch_stamps_batches_and_survives_reopen(tmp_path):
    path = str(tmp_path / "t-0")
    with Log.open(path, segment_bytes=1024) as log:
        log.append(b"before")
        log.assign_leader_epoch(4)
        for i in range(30):
            log.append(b"x" * 50)
        assert log.end_offset_for_epoch(4) == (4, 31)
        with pytest.raises(ValueError):
            log.assign_leader_epoch(3)
        raw = log.read_raw(1)
        assert parse_header(raw, 0).partition_leader_epoch == 4
        assert parse_header(log.read_raw(0), 0).partition_leader_epoch == -1
    with Log.open(path, segment_bytes=1024) as log:
        assert log.latest_epoch == 4
        log.append(b"after")
        assert parse_header(log.read_raw(31), 0).partition_leader_epoch == 4
        log.truncate_to(1)
        assert log.leader_epochs.entries == []  # epoch 4 started at offset 1


def test_follower_copies_batches_byte_for_byte(tmp_path):
    leader = Log.open(str(tmp_path / "leader-0"), segment_bytes=2048)
    follower = Log.open(str(tmp_path / "follower-0"), segment_bytes=2048)
    try:
        leader.assign_leader_epoch(1)
        leader.append_batch([b"a" * 30] * 5, compression="zstd")
        leader.assign_leader_epoch(3)
        for i in range(40):
            leader.append(f"{i}".encode() * 10, key=b"k")
        offset = 0
        while offset < leader.log_end_offset:
            data = leader.read_raw(offset, max_bytes=700)
            assert data
            offset = follower.append_replicated(data)
        assert follower.log_end_offset == leader.log_end_offset
        assert follower.leader_epochs.entries == [(1, 0), (3, 5)]
        assert [r[:2] + r[3:] for r in follower.iter()] == [r[:2] + r[3:] for r in leader.iter()]
        ours = b"".join(follower.read_raw(o, 1) for o in range(follower.log_end_offset))
        theirs = b"".join(leader.read_raw(o, 1) for o in range(leader.log_end_offset))
        assert ours == theirs  # identical bytes, batch by batch
        with pytest.raises(OffsetOutOfRangeError):
            follower.append_replicated(leader.read_raw(0))
        bad = bytearray(leader.read_raw(10))
        bad[-1] ^= 0xFF
        with pytest.raises(CorruptRecordError):
            Log.open(str(tmp_path / "other-0")).append_replicated(bytes(bad))
    finally:
        leader.close()
        follower.close()


def test_follower_of_a_log_that_starts_late(tmp_path):
    leader = Log.open(str(tmp_path / "leader-0"), segment_bytes=1024, file_delete_delay_ms=0)
    for i in range(60):
        leader.append(b"y" * 40)
    leader.delete_records_before(30)
    start = leader.log_start_offset
    follower = Log.open(str(tmp_path / "f-0"))
    try:
        follower.append_replicated(leader.read_raw(start, 1 << 20))
        assert follower.log_start_offset == start
        assert follower.read(start)[0].offset == start
    finally:
        leader.close()
        follower.close()
    with Log.open(str(tmp_path / "f-0")) as again:
        assert again.log_start_offset == start
