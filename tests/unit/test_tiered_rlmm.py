"""The remote log metadata manager (logstore.tiered.rlmm) over a real log in a temporary directory:
every transition, refusals before anything is written, lookups at the edges, sizes, restarts,
damaged records, a follower's catch-up, and a stateful test against a model."""

from __future__ import annotations

import os

import logging
import shutil
import tempfile
import threading
import uuid

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from logstore import Log
from logstore.errors import LogClosedError, RemoteResourceNotFoundError
from logstore.tiered import records
from logstore.tiered.metadata import (
    RemoteLogSegmentId,
    RemoteLogSegmentMetadata,
    RemoteLogSegmentMetadataUpdate,
    RemoteLogSegmentState,
    RemotePartitionDeleteMetadata,
    RemotePartitionDeleteState,
    TopicIdPartition,
)
from logstore.tiered.rlmm import RemoteLogMetadataManager, TopicBasedRemoteLogMetadataManager

S = RemoteLogSegmentState
P = RemotePartitionDeleteState
TP = TopicIdPartition(uuid.UUID(int=1), "orders", 0)
TP2 = TopicIdPartition(uuid.UUID(int=2), "events", 4)


def segment(tp: TopicIdPartition, start: int, end: int, epochs: dict[int, int] | None = None,
            size: int = 100) -> RemoteLogSegmentMetadata:
    return RemoteLogSegmentMetadata(RemoteLogSegmentId.generate(tp), start, end, 1000 + end, 0, 1, size,
                                    {0: start} if epochs is None else epochs)


def move(seg: RemoteLogSegmentMetadata, state: RemoteLogSegmentState, custom: bytes | None = None
         ) -> RemoteLogSegmentMetadataUpdate:
    return RemoteLogSegmentMetadataUpdate(seg.segment_id, 2, state, 0, custom)


def deletion(tp: TopicIdPartition, state: RemotePartitionDeleteState) -> RemotePartitionDeleteMetadata:
    return RemotePartitionDeleteMetadata(tp, state, 3, 0)


class Opened:
    """A ``__remote_log_metadata-0`` log in a directory, and a manager over it; reopened at will."""

    def __init__(self, root: str) -> None:
        self.path = f"{root}/__remote_log_metadata-0"
        self.log = Log.open(self.path)
        self.rlmm = TopicBasedRemoteLogMetadataManager(self.log)

    def reopen(self) -> TopicBasedRemoteLogMetadataManager:
        self.rlmm.close()
        self.log.close()
        self.log = Log.open(self.path)
        self.rlmm = TopicBasedRemoteLogMetadataManager(self.log)
        return self.rlmm

    def close(self) -> None:
        self.rlmm.close()
        self.log.close()


@pytest.fixture
def opened(tmp_path):
    o = Opened(str(tmp_path))
    yield o
    o.close()


def finish(rlmm: RemoteLogMetadataManager, seg: RemoteLogSegmentMetadata) -> RemoteLogSegmentMetadata:
    rlmm.add_remote_log_segment_metadata(seg)
    rlmm.update_remote_log_segment_metadata(move(seg, S.COPY_SEGMENT_FINISHED))
    return seg


def snapshot(rlmm: RemoteLogMetadataManager, tps=(TP, TP2), offsets=range(0, 400, 7), epochs=range(4)) -> dict:
    """Every answer the manager gives about ``tps``."""
    out = {}
    for tp in tps:
        out[tp] = (rlmm.list_remote_log_segments(tp), [rlmm.list_remote_log_segments(tp, e) for e in epochs],
                   rlmm.remote_log_size(tp), rlmm.partition_delete_state(tp), rlmm.remote_log_start_offset(tp),
                   rlmm.remote_log_end_offset(tp), [rlmm.highest_offset_for_epoch(tp, e) for e in epochs],
                   [rlmm.segment_for_offset(tp, o) for o in offsets],
                   [rlmm.remote_log_segment_metadata(tp, e, o) for e in epochs for o in offsets])
    return out


# ---------------------------------------------------------------------- transitions
def test_a_segment_goes_through_every_state_and_is_forgotten_when_deleted(opened):
    rlmm = opened.rlmm
    seg = segment(TP, 0, 99, size=1000)
    rlmm.add_remote_log_segment_metadata(seg)
    assert [s.state for s in rlmm.list_remote_log_segments(TP)] == [S.COPY_SEGMENT_STARTED]
    assert rlmm.segment_for_offset(TP, 0) is None and rlmm.remote_log_size(TP) == 0  # not readable yet
    assert opened.log.log_end_offset == 1
    rlmm.update_remote_log_segment_metadata(move(seg, S.COPY_SEGMENT_FINISHED, b"where"))
    found = rlmm.segment_for_offset(TP, 50)
    assert found is not None and found.state == S.COPY_SEGMENT_FINISHED and found.custom_metadata == b"where"
    assert rlmm.remote_log_size(TP) == 1000
    assert (rlmm.remote_log_start_offset(TP), rlmm.remote_log_end_offset(TP)) == (0, 99)
    rlmm.update_remote_log_segment_metadata(move(seg, S.DELETE_SEGMENT_STARTED))
    assert [s.state for s in rlmm.list_remote_log_segments(TP)] == [S.DELETE_SEGMENT_STARTED]
    assert rlmm.segment_for_offset(TP, 50) is None and rlmm.remote_log_size(TP) == 0
    assert rlmm.remote_log_segment_metadata(TP, 0, 50) is None
    assert rlmm.remote_log_start_offset(TP) is None
    rlmm.update_remote_log_segment_metadata(move(seg, S.DELETE_SEGMENT_FINISHED))
    assert rlmm.list_remote_log_segments(TP) == []
    assert rlmm.highest_offset_for_epoch(TP, 0) == 99  # Kafka's: never lowered by a deletion
    assert opened.log.log_end_offset == 4
    before = snapshot(rlmm)
    assert snapshot(opened.reopen()) == before


def test_a_copy_that_never_finished_is_deleted_without_being_read(opened):
    rlmm = opened.rlmm
    seg = segment(TP, 0, 9)
    rlmm.add_remote_log_segment_metadata(seg)
    rlmm.update_remote_log_segment_metadata(move(seg, S.DELETE_SEGMENT_STARTED))
    assert rlmm.highest_offset_for_epoch(TP, 0) is None and rlmm.remote_log_size(TP) == 0
    rlmm.update_remote_log_segment_metadata(move(seg, S.DELETE_SEGMENT_FINISHED))
    assert rlmm.list_remote_log_segments(TP) == []


def test_invalid_events_are_refused_before_anything_is_written(opened):
    rlmm = opened.rlmm
    seg = segment(TP, 0, 9)
    finish(rlmm, seg)
    end = opened.log.log_end_offset
    before = snapshot(rlmm)
    with pytest.raises(ValueError, match="added at COPY_SEGMENT_STARTED, not COPY_SEGMENT_FINISHED"):
        rlmm.add_remote_log_segment_metadata(RemoteLogSegmentMetadata(
            RemoteLogSegmentId.generate(TP), 10, 19, 0, 0, 0, 1, {0: 10}, S.COPY_SEGMENT_FINISHED))
    with pytest.raises(ValueError, match="known already"):
        rlmm.add_remote_log_segment_metadata(seg)
    for state in (S.COPY_SEGMENT_STARTED, S.COPY_SEGMENT_FINISHED, S.DELETE_SEGMENT_FINISHED):
        with pytest.raises(ValueError, match="no valid transition"):
            rlmm.update_remote_log_segment_metadata(move(seg, state))
    with pytest.raises(RemoteResourceNotFoundError, match="no remote log segment metadata"):
        rlmm.update_remote_log_segment_metadata(move(segment(TP, 0, 9), S.COPY_SEGMENT_FINISHED))
    for state in (P.DELETE_PARTITION_STARTED, P.DELETE_PARTITION_FINISHED):
        with pytest.raises(ValueError, match="deletion not marked -> "):
            rlmm.put_remote_partition_delete_metadata(deletion(TP, state))
    with pytest.raises(ValueError, match="size"):  # a value Kafka's record cannot hold
        rlmm.add_remote_log_segment_metadata(segment(TP, 10, 19, size=2**31))
    with pytest.raises(TypeError):
        rlmm.add_remote_log_segment_metadata(TP)  # type: ignore[arg-type]
    assert opened.log.log_end_offset == end
    assert snapshot(rlmm) == before


def test_a_partitions_deletion_moves_forward_and_forgets_its_segments(opened):
    rlmm = opened.rlmm
    seg = finish(rlmm, segment(TP, 0, 9))
    finish(rlmm, segment(TP2, 0, 9))
    rlmm.put_remote_partition_delete_metadata(deletion(TP, P.DELETE_PARTITION_MARKED))
    rlmm.put_remote_partition_delete_metadata(deletion(TP, P.DELETE_PARTITION_MARKED))  # a retry: allowed
    assert rlmm.partition_delete_state(TP) == P.DELETE_PARTITION_MARKED
    with pytest.raises(ValueError, match="being deleted"):
        rlmm.add_remote_log_segment_metadata(segment(TP, 10, 19))
    with pytest.raises(ValueError, match="DELETE_PARTITION_MARKED -> DELETE_PARTITION_FINISHED"):
        rlmm.put_remote_partition_delete_metadata(deletion(TP, P.DELETE_PARTITION_FINISHED))
    with pytest.raises(ValueError, match="forgotten only after DELETE_PARTITION_FINISHED"):
        rlmm.forget_partition(TP)
    rlmm.put_remote_partition_delete_metadata(deletion(TP, P.DELETE_PARTITION_STARTED))
    rlmm.update_remote_log_segment_metadata(move(seg, S.DELETE_SEGMENT_STARTED))  # the deleter's work
    rlmm.put_remote_partition_delete_metadata(deletion(TP, P.DELETE_PARTITION_FINISHED))
    assert rlmm.partition_delete_state(TP) == P.DELETE_PARTITION_FINISHED
    assert rlmm.list_remote_log_segments(TP) == [] and rlmm.highest_offset_for_epoch(TP, 0) is None
    with pytest.raises(ValueError, match="DELETE_PARTITION_FINISHED -> DELETE_PARTITION_MARKED"):
        rlmm.put_remote_partition_delete_metadata(deletion(TP, P.DELETE_PARTITION_MARKED))
    assert len(rlmm.list_remote_log_segments(TP2)) == 1  # the other partition is untouched
    before = snapshot(rlmm)
    assert snapshot(opened.reopen()) == before
    rlmm = opened.rlmm
    rlmm.forget_partition(TP)
    assert rlmm.partition_delete_state(TP) is None and rlmm.partitions() == [TP2]
    rlmm.forget_partition(TP)  # nothing kept: nothing to do
    # in memory only: loaded again, the log says the deletion finished
    assert opened.reopen().partition_delete_state(TP) == P.DELETE_PARTITION_FINISHED


# ---------------------------------------------------------------------- lookups
def test_lookups_by_offset_and_epoch_at_the_edges(opened):
    rlmm = opened.rlmm
    first = finish(rlmm, segment(TP, 0, 99, {0: 0, 1: 50}, size=10))
    second = finish(rlmm, segment(TP, 100, 199, {1: 100, 3: 180}, size=20))
    started = segment(TP, 200, 299, {3: 200})
    rlmm.add_remote_log_segment_metadata(started)
    by_id = lambda found: None if found is None else found.segment_id  # noqa: E731
    assert by_id(rlmm.segment_for_offset(TP, 0)) == first.segment_id
    assert by_id(rlmm.segment_for_offset(TP, 99)) == first.segment_id
    assert by_id(rlmm.segment_for_offset(TP, 100)) == second.segment_id
    assert by_id(rlmm.segment_for_offset(TP, 199)) == second.segment_id
    assert rlmm.segment_for_offset(TP, 200) is None  # copy under way
    assert rlmm.segment_for_offset(TP2, 0) is None
    assert by_id(rlmm.remote_log_segment_metadata(TP, 0, 0)) == first.segment_id
    assert by_id(rlmm.remote_log_segment_metadata(TP, 0, 49)) == first.segment_id
    assert rlmm.remote_log_segment_metadata(TP, 0, 50) is None  # epoch 1 from 50 on
    assert by_id(rlmm.remote_log_segment_metadata(TP, 1, 50)) == first.segment_id
    assert by_id(rlmm.remote_log_segment_metadata(TP, 1, 99)) == first.segment_id
    assert by_id(rlmm.remote_log_segment_metadata(TP, 1, 100)) == second.segment_id
    assert by_id(rlmm.remote_log_segment_metadata(TP, 1, 179)) == second.segment_id
    assert rlmm.remote_log_segment_metadata(TP, 1, 180) is None
    assert by_id(rlmm.remote_log_segment_metadata(TP, 3, 199)) == second.segment_id
    assert rlmm.remote_log_segment_metadata(TP, 3, 200) is None
    assert rlmm.remote_log_segment_metadata(TP, 2, 120) is None  # no such epoch
    assert rlmm.remote_log_segment_metadata(TP, 1, 49) is None  # before the epoch's first offset
    assert [rlmm.highest_offset_for_epoch(TP, e) for e in range(5)] == [49, 179, None, 199, None]
    assert [s.segment_id for s in rlmm.list_remote_log_segments(TP)] == [first.segment_id, second.segment_id,
                                                                       started.segment_id]
    assert [s.segment_id for s in rlmm.list_remote_log_segments(TP, 3)] == [second.segment_id, started.segment_id]
    assert [s.segment_id for s in rlmm.list_remote_log_segments(TP, 0)] == [first.segment_id]
    assert rlmm.list_remote_log_segments(TP, 2) == [] and rlmm.list_remote_log_segments(TP2) == []
    assert rlmm.remote_log_size(TP) == 30 and rlmm.remote_log_size(TP2) == 0
    assert (rlmm.remote_log_start_offset(TP), rlmm.remote_log_end_offset(TP)) == (0, 199)
    assert (rlmm.remote_log_start_offset(TP2), rlmm.remote_log_end_offset(TP2)) == (None, None)


def test_a_new_leaders_copy_of_the_same_range_replaces_the_old_one(opened):
    # Kafka's case 1: L0 uploaded 0-100, L1 uploaded 0-200 (a superset): reads find L1's copy.
    rlmm = opened.rlmm
    old = finish(rlmm, segment(TP, 0, 100, {0: 0}, size=5))
    new = finish(rlmm, segment(TP, 0, 200, {0: 0}, size=7))
    assert rlmm.remote_log_segment_metadata(TP, 0, 50).segment_id == new.segment_id
    assert rlmm.segment_for_offset(TP, 50).segment_id == new.segment_id
    # the old copy stays listed (the deleter removes it) and counts until it goes
    assert {s.segment_id for s in rlmm.list_remote_log_segments(TP, 0)} == {old.segment_id, new.segment_id}
    assert rlmm.remote_log_size(TP) == 12
    # Kafka's case 2: L0 uploaded 10-90, L1 5-100: offset 95 is in L1's copy only
    a = finish(rlmm, segment(TP2, 10, 90, {0: 10}))
    b = finish(rlmm, segment(TP2, 5, 100, {0: 5}))
    assert rlmm.remote_log_segment_metadata(TP2, 0, 95).segment_id == b.segment_id
    assert rlmm.segment_for_offset(TP2, 95).segment_id == b.segment_id
    assert rlmm.segment_for_offset(TP2, 50).segment_id == b.segment_id
    assert (rlmm.remote_log_start_offset(TP2), rlmm.remote_log_end_offset(TP2)) == (5, 100)
    # a copy lying inside a referenced one is not what a reader gets
    inner = finish(rlmm, segment(TP2, 20, 30, {0: 20}))
    assert rlmm.segment_for_offset(TP2, 25).segment_id == b.segment_id
    assert {s.segment_id for s in rlmm.list_remote_log_segments(TP2)} == {a.segment_id, b.segment_id,
                                                                         inner.segment_id}
    before = snapshot(rlmm)
    assert snapshot(opened.reopen()) == before


def test_overlapping_copies_are_read_from_the_one_reaching_furthest(opened):
    rlmm = opened.rlmm
    a = finish(rlmm, segment(TP, 0, 60, {0: 0}))
    b = finish(rlmm, segment(TP, 40, 120, {0: 40}))
    assert rlmm.segment_for_offset(TP, 39).segment_id == a.segment_id
    assert rlmm.segment_for_offset(TP, 40).segment_id == b.segment_id  # both hold it: the later start
    assert rlmm.segment_for_offset(TP, 120).segment_id == b.segment_id
    rlmm.update_remote_log_segment_metadata(move(b, S.DELETE_SEGMENT_STARTED))
    assert rlmm.segment_for_offset(TP, 50).segment_id == a.segment_id
    assert rlmm.segment_for_offset(TP, 61) is None


# ---------------------------------------------------------------------- the log
def test_a_restart_sees_the_same_state(opened):
    rlmm = opened.rlmm
    finish(rlmm, segment(TP, 0, 99, {0: 0, 2: 60}))
    doomed = finish(rlmm, segment(TP, 100, 149, {2: 100}))
    rlmm.update_remote_log_segment_metadata(move(doomed, S.DELETE_SEGMENT_STARTED))
    rlmm.add_remote_log_segment_metadata(segment(TP, 150, 199, {2: 150}))
    finish(rlmm, segment(TP2, 0, 9))
    rlmm.put_remote_partition_delete_metadata(deletion(TP2, P.DELETE_PARTITION_MARKED))
    before = snapshot(rlmm)
    again = opened.reopen()
    assert snapshot(again) == before
    assert again.next_offset == opened.log.log_end_offset


def test_a_log_with_damaged_and_unknown_records_loads_the_rest(opened, caplog):
    rlmm = opened.rlmm
    good = finish(rlmm, segment(TP, 0, 9))
    valid = records.encode(segment(TP, 10, 19))
    log = opened.log
    log.append_batch([b"\x01\x00\x00garbage"], [None])  # truncated
    log.append_batch([b"\x01\x07\x00" + valid[3:]], [None])  # an apiKey Kafka may add one day
    log.append_batch([b"\x01\x00\x05" + valid[3:]], [None])  # a version too new
    log.append_batch([None], [None])  # no value at all
    log.append_batch([records.encode(move(segment(TP, 0, 1), S.COPY_SEGMENT_FINISHED))], [None])  # unknown segment
    log.append_batch([records.encode(move(good, S.COPY_SEGMENT_STARTED))], [None])  # backwards: a second writer's
    log.append_batch([valid], [None])
    log.flush()
    with caplog.at_level(logging.WARNING, logger="logstore.tiered.rlmm"):
        again = opened.reopen()
    assert [s.start_offset for s in again.list_remote_log_segments(TP)] == [0, 10]
    assert again.segment_for_offset(TP, 5).segment_id == good.segment_id
    skipped = [r.getMessage() for r in caplog.records if "skipping the record" in r.getMessage()]
    assert len(skipped) == 6
    assert "at offset 2 " in skipped[0] and "runs past" in skipped[0]
    assert "apiKey 7" in skipped[1] and "version 5 is newer" in skipped[2] and "no value" in skipped[3]
    assert "no remote log segment metadata" in skipped[4] and "no valid transition" in skipped[5]
    # and the manager goes on writing after them
    again.update_remote_log_segment_metadata(move(segment_with_id(again, 10), S.COPY_SEGMENT_FINISHED))
    assert again.segment_for_offset(TP, 15) is not None


def segment_with_id(rlmm: RemoteLogMetadataManager, start: int) -> RemoteLogSegmentMetadata:
    return next(s for s in rlmm.list_remote_log_segments(TP) if s.start_offset == start)


def test_catch_up_applies_what_another_writer_appended(opened):
    follower = TopicBasedRemoteLogMetadataManager(opened.log)
    leader = opened.rlmm
    seg = finish(leader, segment(TP, 0, 9))
    assert follower.segment_for_offset(TP, 5) is None  # not read yet
    assert follower.catch_up() == 2
    assert follower.segment_for_offset(TP, 5) == leader.segment_for_offset(TP, 5)
    assert follower.catch_up() == 0
    # records appended behind the manager's back (another process's writer) are read first by a write
    opened.log.append_batch([records.encode(move(seg, S.DELETE_SEGMENT_STARTED))], [None])
    with pytest.raises(ValueError, match="DELETE_SEGMENT_STARTED -> DELETE_SEGMENT_STARTED"):
        leader.update_remote_log_segment_metadata(move(seg, S.DELETE_SEGMENT_STARTED))  # already done
    leader.update_remote_log_segment_metadata(move(seg, S.DELETE_SEGMENT_FINISHED))
    assert follower.catch_up() == 2 and snapshot(follower) == snapshot(leader)
    follower.close()


def test_a_follower_reads_only_to_its_limit_and_reloads_after_a_truncation(opened):
    leader = opened.rlmm
    limit = [0]
    follower = TopicBasedRemoteLogMetadataManager(opened.log, read_to=lambda: limit[0])
    first = finish(leader, segment(TP, 0, 9))
    finish(leader, segment(TP, 10, 19))
    limit[0] = 2
    assert follower.catch_up() == 2 and follower.segment_for_offset(TP, 15) is None
    limit[0] = 4
    assert follower.catch_up() == 2 and follower.segment_for_offset(TP, 15) is not None
    # the log loses its last records (a new leader's truncation): the follower loads what is left
    opened.log.truncate_to(2)
    limit[0] = 2
    assert follower.catch_up() == 2
    assert [s.segment_id for s in follower.list_remote_log_segments(TP)] == [first.segment_id]
    assert follower.next_offset == 2
    follower.close()


def test_concurrent_writers_lose_nothing(opened):
    rlmm = opened.rlmm

    def copy(base: int) -> None:
        for i in range(10):
            finish(rlmm, segment(TP, base + 10 * i, base + 10 * i + 9))

    threads = [threading.Thread(target=copy, args=(1000 * t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(rlmm.list_remote_log_segments(TP)) == 40 and rlmm.remote_log_size(TP) == 4000
    before = snapshot(rlmm, offsets=range(0, 4000, 5))
    assert snapshot(opened.reopen(), offsets=range(0, 4000, 5)) == before


def test_a_closed_manager_refuses_every_call(opened):
    rlmm = opened.rlmm
    rlmm.close()
    rlmm.close()
    with pytest.raises(LogClosedError):
        rlmm.segment_for_offset(TP, 0)
    with pytest.raises(LogClosedError):
        rlmm.add_remote_log_segment_metadata(segment(TP, 0, 9))
    with pytest.raises(LogClosedError):
        rlmm.catch_up()
    assert not opened.log.closed  # the log belongs to its owner


# ---------------------------------------------------------------------- stateful, against a model
_OFFSETS = range(0, 48)
_EPOCHS = range(4)


class Model:
    """What the manager should answer, computed the plain way."""

    def __init__(self) -> None:
        self.segments: dict[TopicIdPartition, dict[RemoteLogSegmentId, RemoteLogSegmentMetadata]] = {}
        self.deletion: dict[TopicIdPartition, RemotePartitionDeleteState] = {}
        self.referenced: dict[TopicIdPartition, list[RemoteLogSegmentId]] = {}
        self.highest: dict[tuple[TopicIdPartition, int], int] = {}
        self.forgotten: set[TopicIdPartition] = set()

    def find(self, segment_id: RemoteLogSegmentId) -> RemoteLogSegmentMetadata | None:
        return self.segments.get(segment_id.topic_id_partition, {}).get(segment_id)

    def add(self, seg: RemoteLogSegmentMetadata) -> bool:
        tp = seg.topic_id_partition
        if tp in self.forgotten or seg.state != S.COPY_SEGMENT_STARTED or self.find(seg.segment_id) \
                or tp in self.deletion:
            return False
        self.segments.setdefault(tp, {})[seg.segment_id] = seg
        return True

    def update(self, upd: RemoteLogSegmentMetadataUpdate) -> str:
        tp = upd.segment_id.topic_id_partition
        old = self.find(upd.segment_id)
        if old is None:
            return "unknown"
        allowed = {S.COPY_SEGMENT_STARTED: {S.COPY_SEGMENT_FINISHED, S.DELETE_SEGMENT_STARTED},
                   S.COPY_SEGMENT_FINISHED: {S.DELETE_SEGMENT_STARTED},
                   S.DELETE_SEGMENT_STARTED: {S.DELETE_SEGMENT_FINISHED}}.get(old.state, set())
        if upd.state not in allowed:
            return "invalid"
        new = old.with_update(upd)
        if new.state == S.DELETE_SEGMENT_FINISHED:
            del self.segments[tp][upd.segment_id]
            return "ok"
        self.segments[tp][upd.segment_id] = new
        refs = self.referenced.setdefault(tp, [])
        if new.state == S.COPY_SEGMENT_FINISHED:
            segs = self.segments[tp]
            refs[:] = [r for r in refs if not (new.start_offset <= segs[r].start_offset
                                               and segs[r].end_offset <= new.end_offset)]
            if not any(segs[r].start_offset <= new.start_offset and new.end_offset <= segs[r].end_offset
                       for r in refs):
                refs.append(new.segment_id)
            epochs = sorted(new.segment_leader_epochs.items())
            for i, (epoch, _) in enumerate(epochs):
                end = epochs[i + 1][1] - 1 if i + 1 < len(epochs) else new.end_offset
                self.highest[tp, epoch] = max(self.highest.get((tp, epoch), end), end)
        elif upd.segment_id in refs:
            refs.remove(upd.segment_id)
        return "ok"

    def delete(self, d: RemotePartitionDeleteMetadata) -> bool:
        tp = d.topic_id_partition
        allowed = {None: {P.DELETE_PARTITION_MARKED},
                   P.DELETE_PARTITION_MARKED: {P.DELETE_PARTITION_MARKED, P.DELETE_PARTITION_STARTED},
                   P.DELETE_PARTITION_STARTED: {P.DELETE_PARTITION_STARTED, P.DELETE_PARTITION_FINISHED},
                   P.DELETE_PARTITION_FINISHED: {P.DELETE_PARTITION_FINISHED}}[self.deletion.get(tp)]
        if tp in self.forgotten or d.state not in allowed:
            return False
        self.deletion[tp] = d.state
        if d.state == P.DELETE_PARTITION_FINISHED:
            self.segments.pop(tp, None)
            self.referenced.pop(tp, None)
            for key in [k for k in self.highest if k[0] == tp]:
                del self.highest[key]
        return True

    def forget(self, tp: TopicIdPartition) -> bool:
        if tp not in self.deletion:
            return tp not in self.segments  # nothing kept: nothing to do; a partition kept: refused
        if self.deletion[tp] != P.DELETE_PARTITION_FINISHED:
            return False
        del self.deletion[tp]
        self.forgotten.add(tp)
        return True

    def reopened(self) -> None:
        """A manager loaded from the log: forgotten partitions are back, their deletion finished."""
        for tp in self.forgotten:
            self.deletion[tp] = P.DELETE_PARTITION_FINISHED
        self.forgotten.clear()

    def listing(self, tp: TopicIdPartition) -> list[RemoteLogSegmentMetadata]:
        segs = list(self.segments.get(tp, {}).values())  # added order
        return sorted(segs, key=lambda s: s.start_offset)  # stable: equal starts keep the added order

    def segment_for_offset(self, tp: TopicIdPartition, offset: int) -> RemoteLogSegmentMetadata | None:
        segs = self.segments.get(tp, {})
        holding = [segs[r] for r in self.referenced.get(tp, []) if segs[r].start_offset <= offset <= segs[r].end_offset]
        return max(holding, key=lambda s: s.start_offset) if holding else None


_tps = st.sampled_from([TP, TP2])


@st.composite
def new_segments(draw):
    tp = draw(_tps)
    start = draw(st.integers(0, 36))
    end = start + draw(st.integers(0, 10))
    first_epoch = draw(st.sampled_from(_EPOCHS))
    epochs = {first_epoch: start}
    if first_epoch < 3 and end > start and draw(st.booleans()):
        epochs[draw(st.integers(first_epoch + 1, 3))] = draw(st.integers(start + 1, end))
    state = draw(st.sampled_from([S.COPY_SEGMENT_STARTED] * 5 + [S.COPY_SEGMENT_FINISHED]))
    return RemoteLogSegmentMetadata(RemoteLogSegmentId.generate(tp), start, end, 0, 0, 0,
                                    draw(st.integers(0, 1000)), epochs, state)


class RlmmMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.root = tempfile.mkdtemp(prefix="rlmm-")
        self.opened = Opened(self.root)
        self.model = Model()
        self.known: list[RemoteLogSegmentMetadata] = []

    def teardown(self) -> None:
        self.opened.close()
        shutil.rmtree(self.root, ignore_errors=True)

    def _refused(self, call, event, errors) -> None:
        end = self.opened.log.log_end_offset
        with pytest.raises(errors):
            call(event)
        assert self.opened.log.log_end_offset == end

    @rule(seg=new_segments())
    def add(self, seg):
        self.known.append(seg)
        rlmm = self.opened.rlmm
        if self.model.add(seg):
            rlmm.add_remote_log_segment_metadata(seg)
        else:
            self._refused(rlmm.add_remote_log_segment_metadata, seg, ValueError)

    @precondition(lambda self: self.known)
    @rule(data=st.data(), state=st.sampled_from(list(S)))
    def update(self, data, state):
        seg = data.draw(st.sampled_from(self.known))
        upd = move(seg, state, data.draw(st.none() | st.binary(max_size=4)))
        rlmm = self.opened.rlmm
        outcome = self.model.update(upd)
        if outcome == "ok":
            rlmm.update_remote_log_segment_metadata(upd)
        else:
            self._refused(rlmm.update_remote_log_segment_metadata, upd,
                          RemoteResourceNotFoundError if outcome == "unknown" else ValueError)

    @precondition(lambda self: any(s.state == S.COPY_SEGMENT_STARTED for s in self.model.listing(TP)))
    @rule(data=st.data())
    def finish_a_copy(self, data):
        """The common case, made likelier: a copy under way finishes."""
        seg = data.draw(st.sampled_from([s for s in self.model.listing(TP) if s.state == S.COPY_SEGMENT_STARTED]))
        upd = move(seg, S.COPY_SEGMENT_FINISHED)
        assert self.model.update(upd) == "ok"
        self.opened.rlmm.update_remote_log_segment_metadata(upd)

    @precondition(lambda self: self.known)
    @rule(data=st.data(), state=st.sampled_from([S.COPY_SEGMENT_FINISHED, S.DELETE_SEGMENT_STARTED]))
    def another_writer(self, data, state):
        """A record appended by someone else, then read by catch_up (applied or skipped)."""
        upd = move(data.draw(st.sampled_from(self.known)), state)
        self.opened.log.append_batch([records.encode(upd)], [None])
        applied = self.model.update(upd) == "ok"
        assert self.opened.rlmm.catch_up() == int(applied)

    @rule(tp=_tps, state=st.sampled_from(list(P)))
    def delete_partition(self, tp, state):
        d = deletion(tp, state)
        rlmm = self.opened.rlmm
        if self.model.delete(d):
            rlmm.put_remote_partition_delete_metadata(d)
        else:
            self._refused(rlmm.put_remote_partition_delete_metadata, d, ValueError)

    @rule(tp=_tps)
    def forget(self, tp):
        if self.model.forget(tp):
            self.opened.rlmm.forget_partition(tp)
        else:
            with pytest.raises(ValueError):
                self.opened.rlmm.forget_partition(tp)

    @rule()
    def reopen(self):
        before = snapshot(self.opened.rlmm, offsets=_OFFSETS, epochs=_EPOCHS)
        forgotten = set(self.model.forgotten)
        self.opened.reopen()
        self.model.reopened()
        after = snapshot(self.opened.rlmm, offsets=_OFFSETS, epochs=_EPOCHS)
        for tp in (TP, TP2):
            if tp not in forgotten:  # (a forgotten partition is back as DELETE_PARTITION_FINISHED)
                assert after[tp] == before[tp]

    @invariant()
    def answers_match_the_model(self):
        rlmm, model = self.opened.rlmm, self.model
        for tp in (TP, TP2):
            assert rlmm.list_remote_log_segments(tp) == model.listing(tp)
            for epoch in _EPOCHS:
                assert rlmm.list_remote_log_segments(tp, epoch) == [
                    s for s in model.listing(tp) if epoch in s.segment_leader_epochs]
                assert rlmm.highest_offset_for_epoch(tp, epoch) == model.highest.get((tp, epoch))
            finished = [s for s in model.listing(tp) if s.state == S.COPY_SEGMENT_FINISHED]
            assert rlmm.remote_log_size(tp) == sum(s.segment_size_in_bytes for s in finished)
            assert rlmm.partition_delete_state(tp) == model.deletion.get(tp)
            referenced = [model.segments[tp][r] for r in model.referenced.get(tp, [])]
            assert rlmm.remote_log_start_offset(tp) == min((s.start_offset for s in referenced), default=None)
            assert rlmm.remote_log_end_offset(tp) == max((s.end_offset for s in referenced), default=None)
            for offset in _OFFSETS:
                assert rlmm.segment_for_offset(tp, offset) == model.segment_for_offset(tp, offset)
                for epoch in _EPOCHS:
                    found = rlmm.remote_log_segment_metadata(tp, epoch, offset)
                    if found is not None:  # Kafka's epoch rule: what it finds is finished and holds it
                        epochs = sorted(found.segment_leader_epochs.items())
                        i = [e for e, _ in epochs].index(epoch)
                        last = epochs[i + 1][1] - 1 if i + 1 < len(epochs) else found.end_offset
                        assert found.state == S.COPY_SEGMENT_FINISHED and epochs[i][1] <= offset <= last


TestRlmmStateful = RlmmMachine.TestCase
#: 30 sequences in make test (about 5 s); LOGSTORE_STATEFUL_EXAMPLES raises it for a soak
TestRlmmStateful.settings = settings(max_examples=int(os.environ.get("LOGSTORE_STATEFUL_EXAMPLES", "30")),
                                     stateful_step_count=30, deadline=None)
