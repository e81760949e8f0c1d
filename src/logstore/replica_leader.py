"""The leader's side of replication: taking up an epoch, answering fetches and produces, and the
high watermark and in-sync replicas they move.

* Taking up an epoch stamps it into the log (leader-epoch-checkpoint) and appends a leader change
  control record, so that records of earlier epochs can commit (Raft §5.4.2).
* A follower's FETCH (replica id >= 0) tells the leader how far the follower holds the log; the
  answer is batches from its offset, or the diverging epoch it must truncate to (KIP-101/279). A
  caught-up follower's fetch is held until records arrive (replica.fetch.wait.max.ms), in the
  node's purgatory: no thread waits, and the append that ends the wait writes the answer.
* A client's FETCH (replica id -1) is answered with committed batches only.
* PRODUCE validates the client's batch whole, appends it as it is (a retry of one of the
  producer's last five batches, known to the log's producer state, gets the offsets it already
  has), and with acks="all" is held in the purgatory
  until the high watermark passes it (the follower fetch that moves it writes the answer).
* The high watermark is the largest offset a majority holds, counted over the leader's own epoch;
  a follower is in sync while it reached the leader's end within replica.lag.time.max.ms.

Thread-safety: every method may be called from any thread (handlers run on the network layer's
workers); each partition's state is read and changed under its ``cond``.
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import Future
from typing import TYPE_CHECKING

from .election import NONE, Role
from .errors import CorruptRecordError, InvalidRecordError, OffsetOutOfRangeError, RecordTooLargeError
from .records import batch_headers, leader_change_record, validate_client_batch
from .replica_partition import PartitionReplica, partition_of
from .wire import (
    CORRUPT_BATCH,
    FENCED_EPOCH,
    INVALID,
    INVALID_RECORD,
    NOT_ENOUGH_REPLICAS,
    NOT_LEADER,
    OK,
    OUT_OF_RANGE,
    RECORD_TOO_LARGE,
    TIMEOUT,
    UNKNOWN_PARTITION,
    Reader,
    Writer,
)

if TYPE_CHECKING:
    from .replication import ReplicaNode

__all__ = ["LeaderSide"]

logger = logging.getLogger("logstore.replication")


def _fetch_answer(code: int, leader: int, epoch: int, hw: int = 0, div_epoch: int = -1, div_end: int = -1,
                  data: bytes | None = None) -> bytes:
    """A FETCH answer's payload (FORMAT.md §13)."""
    return (Writer().int16(code).int32(leader).int32(epoch).int64(hw).int32(div_epoch).int64(div_end)
            .blob(data).payload())


def _produce_answer(code: int, leader: int, first: int = -1, last: int = -1) -> bytes:
    """A PRODUCE answer's payload (FORMAT.md §13)."""
    return Writer().int16(code).int32(leader).int64(first).int64(last).payload()


def _now_or_later(answer: "Future[bytes]") -> "bytes | Future[bytes]":
    """A delayed answer as it is when it is already there, else its Future."""
    return answer.result() if answer.done() else answer


class LeaderSide:
    """What a node does for the partitions it leads (its settings are read from the node at
    each use). Thread-safe."""

    def __init__(self, node: "ReplicaNode") -> None:
        self._node = node

    # ------------------------------------------------------------------ epoch, ISR, high watermark
    def become_leader(self, rep: PartitionReplica) -> None:
        """Take up the epoch ``rep`` just won (caller holds rep.cond). Raises what the log
        raises writing the epoch or the leader change record (the caller steps down)."""
        node = self._node
        epoch = rep.election.epoch
        rep.log.assign_leader_epoch(epoch)
        rep.epoch_start = rep.log.log_end_offset
        # A record of the new epoch, as KRaft's leader writes at once: the high watermark only
        # counts records of the leader's own epoch (counting older ones by their replicas is
        # unsafe, Raft §5.4.2), so without it records of earlier epochs would stay uncommitted
        # until the next produce, and a retried produce of such a record would wait forever.
        # What followers hold is learnt afresh in this epoch: their offsets from the previous one
        # must not count towards the high watermark.
        rep.leo = {}
        now = time.monotonic()
        rep.contact = {p: now for p in node.peers}
        # Every replica starts in sync (as Kafka's new leader keeps the ISR it inherits); one
        # that does not catch up within replica_lag_time_max_ms drops out.
        rep.caught_up = {p: now for p in node.peers}
        key, value = leader_change_record(node.node_id, node.voters, rep.election.granted_by)
        rep.log.append_batch([value], [key], control=True)
        self.advance_hw(rep)  # a set of one commits at once
        logger.info("node %d leads %s-%d in epoch %d", node.node_id, rep.topic, rep.partition, epoch)

    def advance_hw(self, rep: PartitionReplica) -> None:
        """HW = the largest offset held by a majority, counted only over records of this epoch
        (caller holds rep.cond)."""
        ends = sorted([rep.log.log_end_offset] + [rep.leo.get(p, 0) for p in self._node.peers], reverse=True)
        majority_end = ends[rep.election.majority - 1]
        if majority_end > rep.hw and majority_end > rep.epoch_start:
            rep.hw = majority_end
            rep.log.high_watermark = majority_end
            rep.changed()

    def in_sync_followers(self, rep: PartitionReplica, now: float) -> list[int]:
        """The followers in sync with this leader (caller holds rep.cond)."""
        return rep.in_sync_followers(self._node.peers, now, self._node.replica_lag_s)

    # ------------------------------------------------------------------ fetch
    def on_fetch(self, r: Reader) -> "bytes | Future[bytes]":
        """Answer a FETCH: a follower's (replica id >= 0) or a client's (-1)."""
        node = self._node
        replica_id = r.int32("replica id")
        rep = partition_of(node._replicas, r)
        epoch, offset, last_epoch = r.int32(), r.int64(), r.int32()
        max_bytes = r.int32("max bytes")
        r.end()
        if rep is None:
            return _fetch_answer(UNKNOWN_PARTITION, NONE, -1)
        if max_bytes <= 0:
            return _fetch_answer(INVALID, NONE, -1)
        max_bytes = min(max_bytes, node.fetch_max_bytes)
        if replica_id < 0:
            return self._on_consumer_fetch(rep, offset, max_bytes)
        with node.purgatory.deferred(), rep.cond:  # answers written after the lock
            election = rep.election
            if replica_id not in node.peers:  # only a voter's fetch may move our epoch
                return _fetch_answer(INVALID, election.leader, election.epoch)
            if epoch > election.epoch:
                election.observe_epoch(epoch)
                rep.changed()
            if election.role is not Role.LEADER or epoch < election.epoch:
                code = NOT_LEADER if election.role is not Role.LEADER else FENCED_EPOCH
                return _fetch_answer(code, election.leader, election.epoch)
            log = rep.log
            if last_epoch < 0 and offset > log.log_start_offset:
                # Records without an epoch history (a lost leader-epoch-checkpoint): nothing
                # proves they match ours, so the follower starts again from our log start.
                return _fetch_answer(OK, node.node_id, election.epoch, rep.hw, -1, log.log_start_offset)
            # KIP-101/279: the follower's last epoch must end where the leader's history says.
            if last_epoch >= 0:
                div_epoch, div_end = log.end_offset_for_epoch(last_epoch)
                if div_epoch != last_epoch or div_end < offset:
                    return _fetch_answer(OK, node.node_id, election.epoch, rep.hw, div_epoch,
                                         div_end if div_end >= 0 else 0)
            now = time.monotonic()
            rep.contact[replica_id] = now
            end = log.log_end_offset
            rep.leo[replica_id] = min(offset, end)  # never count what we do not hold ourselves
            if offset >= end:
                rep.caught_up[replica_id] = now
            self.advance_hw(rep)
            if offset != end:
                return self._records(rep, offset, end, max_bytes)
        # Caught up: hold the fetch until a produce appends (or leadership changes), as Kafka's
        # replica.fetch.wait.max.ms does, instead of letting the follower poll. No thread waits.
        return _now_or_later(node.purgatory.watch(
            rep.key, lambda expired: self._held_fetch(rep, replica_id, epoch, offset, max_bytes, expired),
            node.fetch_wait_s))

    def _held_fetch(self, rep: PartitionReplica, replica_id: int, epoch: int, offset: int, max_bytes: int,
                    expired: bool) -> bytes | None:
        """A held follower fetch's answer once records arrived past ``offset``, leadership
        changed or its wait ran out; None while it waits (see purgatory)."""
        with rep.cond:
            election = rep.election
            if election.role is not Role.LEADER or election.epoch != epoch:
                return _fetch_answer(NOT_LEADER, election.leader, election.epoch)
            end = rep.log.log_end_offset
            if end == offset and not expired and not self._node._stop.is_set():
                return None
            rep.caught_up[replica_id] = time.monotonic()
            return self._records(rep, offset, end, max_bytes)

    def _records(self, rep: PartitionReplica, offset: int, end: int, max_bytes: int) -> bytes:
        """A follower fetch's answer: the batches from ``offset`` (caller holds rep.cond)."""
        node, log = self._node, rep.log
        try:
            data = log.read_raw(offset, max_bytes) if offset < end else b""
        except OffsetOutOfRangeError:
            return _fetch_answer(OUT_OF_RANGE, node.node_id, rep.election.epoch, rep.hw, -1, log.log_start_offset)
        return _fetch_answer(OK, node.node_id, rep.election.epoch, rep.hw, data=data)

    def _on_consumer_fetch(self, rep: PartitionReplica, offset: int, max_bytes: int) -> bytes:
        """A client's fetch, answered by the leader only (so that a produce acknowledged with
        acks="all" is visible to the next fetch): whole batches from ``offset`` up to the high
        watermark (a consumer never sees a record that is not committed)."""
        with rep.cond:
            election = rep.election
            hw = min(rep.hw, rep.log.log_end_offset)
            leader = election.leader
            if election.role is not Role.LEADER:
                return _fetch_answer(NOT_LEADER, leader, election.epoch, hw)
        log = rep.log
        start = log.log_start_offset
        if offset < start or offset > hw:
            return _fetch_answer(OUT_OF_RANGE, leader, election.epoch, hw, -1, start)
        try:
            data = log.read_raw(offset, max_bytes) if offset < hw else b""
        except OffsetOutOfRangeError as exc:  # retention or truncation moved the range meanwhile
            return _fetch_answer(OUT_OF_RANGE, leader, election.epoch, hw, -1, exc.log_start_offset)
        # Cut the answer at the high watermark (always a batch boundary: every replica's log
        # end is one, and the high watermark is one of them).
        position = next((p for p, h in batch_headers(data) if h.last_offset >= hw), len(data))
        return _fetch_answer(OK, leader, election.epoch, hw, data=data[:position])

    # ------------------------------------------------------------------ produce
    def on_produce(self, r: Reader) -> "bytes | Future[bytes]":
        """Answer a PRODUCE: validate the batch, append it (once), and with acks="all" wait
        until it is committed or the request's timeout passes."""
        node = self._node
        rep = partition_of(node._replicas, r)
        acks, timeout_ms = r.int8(), r.int32()
        batch = r.blob_view("record batch")
        r.end()
        if rep is None or batch is None:
            return _produce_answer(UNKNOWN_PARTITION if rep is None else INVALID, NONE)
        try:
            # Checked before the lock: a bad batch costs the sender, not the partition.
            validate_client_batch(batch, rep.log.config.max_message_bytes)
        except CorruptRecordError:
            return _produce_answer(CORRUPT_BATCH, node.node_id)
        except RecordTooLargeError:
            return _produce_answer(RECORD_TOO_LARGE, node.node_id)
        except InvalidRecordError:
            return _produce_answer(INVALID_RECORD, node.node_id)
        with node.purgatory.deferred(), rep.cond:  # answers written after the lock
            election = rep.election
            if election.role is not Role.LEADER:
                return _produce_answer(NOT_LEADER, election.leader)
            epoch = election.epoch
            if acks == -1 and 1 + len(self.in_sync_followers(rep, time.monotonic())) < node.min_insync:
                return _produce_answer(NOT_ENOUGH_REPLICAS, node.node_id)
            try:
                # The client's sequence skips the numbers of refused produces: duplicates are
                # recognised (a retry gets the offsets it already has), gaps accepted.
                first, last, duplicate = rep.log.append_idempotent(batch, check_sequence=False)
            except InvalidRecordError:  # e.g. a record without a key in a compacted log
                return _produce_answer(INVALID_RECORD, node.node_id)
            if not duplicate:
                self.advance_hw(rep)  # a set of one commits on its own append
                rep.changed()  # answer the followers' held fetches
        if acks != -1:
            return _produce_answer(OK, node.node_id, first, last)
        # acks="all": answered once the high watermark passes the batch. No thread waits.
        return _now_or_later(node.purgatory.watch(
            rep.key, lambda expired: self._committed(rep, epoch, first, last, expired), timeout_ms / 1000.0))

    def _committed(self, rep: PartitionReplica, epoch: int, first: int, last: int, expired: bool) -> bytes | None:
        """An acks="all" produce's answer once the high watermark passed ``last``, leadership
        changed or its timeout ran out; None while it waits (see purgatory)."""
        with rep.cond:
            election = rep.election
            # Role and epoch first: a node deposed meanwhile may have learnt a high watermark
            # past `last` from the new leader, for records that replaced ours.
            if election.role is not Role.LEADER or election.epoch != epoch or self._node._stop.is_set():
                return _produce_answer(NOT_LEADER, election.leader, first, last)
            if rep.hw > last:
                return _produce_answer(OK, self._node.node_id, first, last)
            return _produce_answer(TIMEOUT, self._node.node_id, first, last) if expired else None
