"""Transactions on a replica set, part by part, on one node's real parts with no network: the
state log that waits for the majority (ReplicatedLog), the coordinator's slot (loads only once
the high watermark reached the log end, with the leader epoch as coordinator epoch, and goes
with the leadership or after a write of unknown fate), a partition leader's marker append
(answered once a majority holds it) and the marker writer's routing by partition leader. The
followers' fetches are made by calling the leader's side as the listener would."""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future

import pytest

from logstore import Log
from logstore.errorcodes import ErrorCode
from logstore.errors import NotLeaderOrFollowerError, RequestTimedOutError
from logstore.net.purgatory import Purgatory
from logstore.replica.context import NodeContext
from logstore.replica.leader import LeaderSide
from logstore.replica.partition import PartitionReplica
from logstore.replica.quorum import Election, QuorumStateFile, Role
from logstore.replica.replicatedlog import ReplicatedLog
from logstore.replica.transactions import ReplicaMarkers, TxnCoordinatorSlot
from logstore.txn.coordinator import TxnConfig
from logstore.txn.metadata import TRANSACTION_STATE_TOPIC, TRANSACTION_STATE_TOPIC_CONFIG


class Node:
    """Node 0 of voters 0, 1, 2 (the peers never answer: their fetches are made by the test)."""

    def __init__(self, tmp_path, min_insync=1):
        self.context = NodeContext(0, {1: ("127.0.0.1", 1), 2: ("127.0.0.1", 2)}, b"s", election_timeout_s=1.0,
                                   replica_lag_s=10.0, fetch_wait_s=0.0, min_insync=min_insync,
                                   fetch_max_bytes=1 << 20, client_tls=None, purgatory=Purgatory("test"))
        self.leader = LeaderSide(self.context)
        self.logs = []
        self.state = self.add(tmp_path, TRANSACTION_STATE_TOPIC, 0, **TRANSACTION_STATE_TOPIC_CONFIG)

    def add(self, tmp_path, topic, partition, **config):
        log = Log.open(str(tmp_path / f"{topic}-{partition}"), **config)
        self.logs.append(log)
        election = Election(0, [0, 1, 2], QuorumStateFile(log.path, [0, 1, 2]))
        rep = PartitionReplica(topic, partition, log, election,
                               on_change=lambda r: self.context.purgatory.check(r.key))  # as the node's
        self.context.add_replica(rep)
        return rep

    def lead(self, rep):
        """Win an election (votes of node 1) and take the epoch up."""
        with rep.cond:
            rep.election.start_campaign()
            assert rep.election.on_vote_response(rep.election.epoch, 1, True)
            self.leader.become_leader(rep)
        return rep.election.epoch

    def follower_caught_up(self, rep, follower=1):
        """Follower ``follower`` fetches from the leader's end: the HW moves to it."""
        with rep.cond:
            end, epoch = rep.log.log_end_offset, rep.election.epoch
        self.leader.follower_fetch(rep, follower, epoch, end, epoch, 1 << 20, 0)

    def depose(self, rep):
        with rep.cond:
            rep.election.observe_epoch(rep.election.epoch + 1)
            rep.changed()

    def close(self):
        self.context.stopping.set()
        self.context.purgatory.close()
        for log in self.logs:
            log.close()


@pytest.fixture
def node(tmp_path):
    n = Node(tmp_path)
    yield n
    n.close()


def test_a_replicated_log_write_returns_once_a_majority_holds_it(node):
    rep = node.state
    epoch = node.lead(rep)
    log = ReplicatedLog(node.context, node.leader, rep, epoch, timeout_s=0.3)
    log.append_batch([b"v"], [b"k"])
    with pytest.raises(RequestTimedOutError):
        log.flush()  # no follower has it
    assert log.uncertain  # it may still commit
    done = threading.Event()  # (each thread's flush waits for its own last append)
    threading.Thread(target=lambda: (log.append_batch([b"w"], [b"k"]), log.flush(), done.set()), daemon=True).start()
    time.sleep(0.05)
    assert not done.is_set()
    node.follower_caught_up(rep)
    assert done.wait(2)
    assert [r.value for r in log.read(log.log_start_offset) if not r.offset < 1] == [b"v", b"w"]


def test_a_replicated_log_refuses_writes_once_the_leadership_is_lost(node):
    rep = node.state
    epoch = node.lead(rep)
    log = ReplicatedLog(node.context, node.leader, rep, epoch, timeout_s=5)
    log.append_batch([b"v"], [b"k"])
    threading.Timer(0.1, node.depose, (rep,)).start()
    with pytest.raises(NotLeaderOrFollowerError):
        log.flush()  # deposed while waiting: the record may be lost
    end = rep.log.log_end_offset
    with pytest.raises(NotLeaderOrFollowerError):
        log.append_batch([b"x"], [b"k"])
    assert rep.log.log_end_offset == end


def test_the_slot_loads_a_coordinator_once_the_state_log_is_committed_and_drops_it_with_the_leadership(node):
    rep = node.state
    markers = ReplicaMarkers(node.context, node.leader)
    slot = TxnCoordinatorSlot(node.context, node.leader, markers, iter(range(1000, 2000)).__next__, TxnConfig())
    assert slot.coordinator() == (None, ErrorCode.not_coordinator)
    slot.start()
    try:
        epoch = node.lead(rep)
        time.sleep(0.2)  # the leader change record is not committed: no load
        assert slot.coordinator() == (None, ErrorCode.coordinator_load_in_progress)
        node.follower_caught_up(rep)
        deadline = time.monotonic() + 5
        while slot.coordinator()[0] is None and time.monotonic() < deadline:
            time.sleep(0.01)
        coordinator, error = slot.coordinator()
        assert error == ErrorCode.none and coordinator.coordinator_epoch == epoch
        # A state write waits for the majority: InitProducerId is answered once it is held.
        answer: Future = Future()
        threading.Thread(target=lambda: answer.set_result(coordinator.init_producer_id("t", 60000)),
                         daemon=True).start()
        time.sleep(0.1)
        assert not answer.done()
        node.follower_caught_up(rep)
        assert answer.result(5) == (ErrorCode.none, 1000, 0)
        node.depose(rep)
        assert slot.coordinator() == (None, ErrorCode.not_coordinator)
        deadline = time.monotonic() + 5
        while slot.last.init_producer_id("t", 60000)[0] != ErrorCode.coordinator_not_available:
            assert time.monotonic() < deadline  # the deposed coordinator is closed
            time.sleep(0.01)
    finally:
        slot.close()
        markers.close()


def test_a_state_write_of_unknown_fate_makes_the_slot_load_the_coordinator_again(node):
    """A state write that times out waiting for the majority is answered
    COORDINATOR_NOT_AVAILABLE, but it may still commit: the slot loads a new coordinator from
    the log once it is committed, which knows what the record says."""
    rep = node.state
    markers = ReplicaMarkers(node.context, node.leader)
    slot = TxnCoordinatorSlot(node.context, node.leader, markers, iter(range(1000, 2000)).__next__, TxnConfig(),
                              write_timeout_s=0.3)
    slot.start()
    try:
        node.lead(rep)
        node.follower_caught_up(rep)
        deadline = time.monotonic() + 5
        while slot.coordinator()[0] is None:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        first = slot.coordinator()[0]
        assert first.init_producer_id("t", 60000)[0] == ErrorCode.coordinator_not_available  # timed out
        assert first.describe(["t"])[0].producer_epoch == -1  # the transition to epoch 0 given up in memory
        node.follower_caught_up(rep)  # the record commits after all
        deadline = time.monotonic() + 5
        while slot.coordinator()[0] in (None, first):
            assert time.monotonic() < deadline
            time.sleep(0.01)
        second = slot.coordinator()[0]
        described = second.describe(["t"])[0]
        assert (described.error, described.state, described.producer_id, described.producer_epoch) == (
            ErrorCode.none, "Empty", 1000, 0)
    finally:
        slot.close()
        markers.close()


def test_a_marker_is_answered_once_a_majority_holds_it(tmp_path):
    node = Node(tmp_path, min_insync=1)
    try:
        rep = node.add(tmp_path, "t", 0)
        epoch = node.lead(rep)
        node.follower_caught_up(rep)
        future = node.leader.append_marker(rep, 5, 0, True, 3, timeout_s=5)
        time.sleep(0.05)
        assert not future.done()
        node.follower_caught_up(rep)
        assert future.result(2) == ErrorCode.none
        # an older coordinator's marker, an older producer epoch: refused, nothing written
        end = rep.log.log_end_offset
        assert node.leader.append_marker(rep, 5, 0, False, 2, 5).result(1) == ErrorCode.transaction_coordinator_fenced
        assert rep.log.log_end_offset == end
        newer = node.leader.append_marker(rep, 5, 1, False, 3, 5)
        node.follower_caught_up(rep)
        assert newer.result(2) == ErrorCode.none
        end = rep.log.log_end_offset
        assert node.leader.append_marker(rep, 5, 0, False, 3, 5).result(1) == ErrorCode.invalid_producer_epoch
        assert rep.log.log_end_offset == end
        timed_out = node.leader.append_marker(rep, 6, 0, True, 3, timeout_s=0.2)
        assert timed_out.result(2) == ErrorCode.request_timed_out
        node.depose(rep)
        assert node.leader.append_marker(rep, 7, 0, True, 3, 5).result(1) == ErrorCode.not_leader_or_follower
        assert epoch < rep.election.epoch
    finally:
        node.close()


def test_markers_go_to_each_partitions_leader(node, tmp_path):
    """This node's own partitions are appended here; one without a known leader is
    NOT_LEADER_OR_FOLLOWER (the coordinator retries), one the set does not replicate
    UNKNOWN_TOPIC_OR_PARTITION."""
    led = node.add(tmp_path, "t", 0)
    node.add(tmp_path, "t", 1)  # no leader elected
    node.lead(led)
    node.follower_caught_up(led)
    markers = ReplicaMarkers(node.context, node.leader)
    try:
        future = markers(5, 0, True, 1, [("t", 0), ("t", 1), ("nope", 0)])
        time.sleep(0.05)
        node.follower_caught_up(led)
        assert future.result(2) == {("t", 0): ErrorCode.none, ("t", 1): ErrorCode.not_leader_or_follower,
                                    ("nope", 0): ErrorCode.unknown_topic_or_partition}
        assert led.election.role is Role.LEADER
    finally:
        markers.close()
