"""The leader's side of replication: taking up an epoch, answering followers' fetches, and the
high watermark and in-sync replicas they move.

* Taking up an epoch stamps it into the log (leader-epoch-checkpoint) and appends a leader change
  control record, so that records of earlier epochs can commit (Raft §5.4.2).
* A follower's fetch (Kafka's Fetch with its replica id, current leader epoch and last fetched
  epoch, answered by :mod:`~logstore.replica.peerapis`) tells the leader how far the follower
  holds the log; the answer is batches from its offset, or the diverging epoch it must truncate
  to (KIP-101/279/595). A caught-up follower's fetch is held until records arrive (its
  ``max_wait``), in the node's purgatory: no thread waits, and the append that ends the wait
  writes the answer.
* Clients' produces and fetches are Kafka's (:mod:`~logstore.replica.kafkaapis`), appended with the
  log's idempotent path; they move the high watermark through :meth:`LeaderSide.advance_hw`.
* The high watermark is the largest offset a majority holds, counted over the leader's own epoch;
  a follower is in sync while it reached the leader's end within replica.lag.time.max.ms.

Answers carry Kafka's error codes. Thread-safety: every method may be called from any thread
(handlers run on the network layer's workers); each partition's state is read and changed under
its ``cond``.
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import Future
from typing import NamedTuple

from .._fileio import FileRegion
from .quorum import NONE, Role
from ..errorcodes import ErrorCode, code_for
from ..errors import (InvalidProducerEpochError, LogstoreError, OffsetMovedToTieredStorageError, OffsetOutOfRangeError,
                      TransactionCoordinatorFencedError)
from ..records.control import leader_change_record
from .partition import PartitionReplica
from .context import NodeContext

__all__ = ["LeaderSide", "FetchAnswer"]

logger = logging.getLogger("logstore.replication")


class FetchAnswer(NamedTuple):
    """A leader's answer to one follower fetch (immutable)."""

    #: Kafka's error code (an ErrorCode: none, not_leader_or_follower, fenced_leader_epoch, ...)
    code: int
    #: the leader this node knows and its epoch
    leader: int
    epoch: int
    high_watermark: int = -1
    #: the diverging epoch and where it ends in the leader's log (-1, -1: none); (-1, start)
    #: with no records: the follower's records have no epoch history, restart from ``start``
    diverging_epoch: int = -1
    diverging_end: int = -1
    log_start_offset: int = -1
    #: the batches from the follower's offset, as a file region to send with sendfile (the
    #: answer's owner closes it) or bytes; None with an error or a divergence
    records: "FileRegion | bytes | None" = None


def _now_or_later(answer: "Future[FetchAnswer]") -> "FetchAnswer | Future[FetchAnswer]":
    """A delayed answer as it is when it is already there, else its Future."""
    return answer.result() if answer.done() else answer


class LeaderSide:
    """What a node does for the partitions it leads (its settings are read from ``context`` at
    each use). Thread-safe."""

    def __init__(self, context: NodeContext) -> None:
        self._context = context

    # ------------------------------------------------------------------ epoch, ISR, high watermark
    def become_leader(self, rep: PartitionReplica) -> None:
        """Take up the epoch ``rep`` just won (caller holds rep.cond). Raises what the log
        raises writing the epoch or the leader change record (the caller steps down)."""
        context = self._context
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
        rep.starts = {}
        now = time.monotonic()
        rep.contact = {p: now for p in context.peers}
        # Every replica starts in sync (as Kafka's new leader keeps the ISR it inherits); one
        # that does not catch up within replica_lag_time_max_ms drops out.
        rep.caught_up = {p: now for p in context.peers}
        rep.fetch_marks = {}
        key, value = leader_change_record(context.node_id, context.voters, rep.election.granted_by)
        rep.log.append_batch([value], [key], control=True)
        self.advance_hw(rep)  # a set of one commits at once
        logger.info("node %d leads %s-%d in epoch %d", context.node_id, rep.topic, rep.partition, epoch)

    def advance_hw(self, rep: PartitionReplica) -> None:
        """HW = the largest offset held by a majority, counted only over records of this epoch
        (caller holds rep.cond)."""
        ends = sorted([rep.log.log_end_offset] + [rep.leo.get(p, 0) for p in self._context.peers], reverse=True)
        majority_end = ends[rep.election.majority - 1]
        if majority_end > rep.hw and majority_end > rep.epoch_start:
            rep.hw = majority_end
            rep.log.high_watermark = majority_end
            rep.changed()

    def in_sync_followers(self, rep: PartitionReplica, now: float) -> list[int]:
        """The followers in sync with this leader (caller holds rep.cond)."""
        return rep.in_sync_followers(self._context.peers, now, self._context.replica_lag_s)

    def await_commit(self, rep: PartitionReplica, epoch: int, first: int, last: int,
                     timeout_s: float) -> "Future[tuple[int, int, str | None]]":
        """The outcome (error, base offset, message) of an acks=all produce that appended
        ``first``..``last`` in ``epoch``, once the high watermark passed ``last``, leadership
        changed or ``timeout_s`` ran out: REQUEST_TIMED_OUT then. No thread waits (the node's
        purgatory holds it; the partition's changes answer it)."""
        return self._context.purgatory.watch(
            rep.key, lambda expired: self._committed(rep, epoch, first, last, expired), timeout_s)

    def _committed(self, rep: PartitionReplica, epoch: int, first: int, last: int,
                   expired: bool) -> tuple[int, int, str | None] | None:
        """An acks=all produce's outcome (error, base offset, message) once the high watermark
        passed ``last``, leadership changed or its timeout ran out; None while it waits (see
        purgatory)."""
        with rep.cond:
            election = rep.election
            # Role and epoch first: a node deposed meanwhile may have learnt a high watermark
            # past `last` from the new leader, for records that replaced ours.
            if election.role is not Role.LEADER or election.epoch != epoch or self._context.stopping.is_set():
                return (ErrorCode.not_leader_or_follower, -1,
                        f"node {self._context.node_id} lost the leadership of {rep.topic}-{rep.partition}")
            if rep.hw > last:
                return ErrorCode.none, first, None
        if expired:
            return ErrorCode.request_timed_out, -1, "timed out waiting for a majority to hold the batch"
        return None

    # ------------------------------------------------------------------ transaction markers
    def append_marker(self, rep: PartitionReplica, producer_id: int, producer_epoch: int, commit: bool,
                      coordinator_epoch: int, timeout_s: float) -> "Future[int]":
        """Write a transaction marker (COMMIT with ``commit``, else ABORT) of the producer to
        ``rep`` as its leader (Kafka's WriteTxnMarkers, appended with acks=all); the future's
        result is Kafka's error code once the high watermark passed the marker (0), leadership
        changed (NOT_LEADER_OR_FOLLOWER) or ``timeout_s`` ran out (REQUEST_TIMED_OUT). A
        marker counts only once a majority holds it: one lost with a deposed leader would leave
        its transaction open for good after the coordinator wrote it complete. Refused at once:
        NOT_LEADER_OR_FOLLOWER, NOT_ENOUGH_REPLICAS (fewer in sync than ``min_insync``),
        INVALID_PRODUCER_EPOCH, TRANSACTION_COORDINATOR_FENCED, KAFKA_STORAGE_ERROR."""
        context = self._context

        def now(code: int) -> "Future[int]":
            done: Future[int] = Future()
            done.set_result(code)
            return done

        with context.purgatory.deferred(), rep.cond:
            election = rep.election
            if election.role is not Role.LEADER or context.stopping.is_set():
                return now(ErrorCode.not_leader_or_follower)
            epoch = election.epoch
            if 1 + len(self.in_sync_followers(rep, time.monotonic())) < context.min_insync:
                return now(ErrorCode.not_enough_replicas)
            try:
                offset = rep.log.append_txn_marker(producer_id, producer_epoch, commit, coordinator_epoch)
            except (InvalidProducerEpochError, TransactionCoordinatorFencedError) as exc:
                return now(code_for(exc))
            except (LogstoreError, OSError) as exc:
                logger.warning("writing a transaction marker to %s-%d failed: %s", rep.topic, rep.partition, exc)
                return now(ErrorCode.kafka_storage_error)
            self.advance_hw(rep)  # a set of one commits on its own append
            rep.changed()
        committed: Future[int] = Future()
        self.await_commit(rep, epoch, offset, offset, timeout_s).add_done_callback(
            lambda f: committed.set_result(f.result()[0] if f.exception() is None else ErrorCode.request_timed_out))
        return committed

    # ------------------------------------------------------------------ DeleteRecords
    def delete_records(self, rep: PartitionReplica, offset: int, timeout_s: float) -> "Future[tuple[int, int]]":
        """Move ``rep``'s log start to ``offset`` (at most the high watermark; the caller checked)
        as its leader (Kafka's DeleteRecords): the future's result is (error code, low
        watermark) once every voter reported a log start at or past it (the followers learn it
        from their fetches' answers; Kafka's DelayedDeleteRecords), so that no leader elected
        later shows the records again; NOT_LEADER_OR_FOLLOWER when the leadership goes,
        REQUEST_TIMED_OUT after ``timeout_s`` (the leader's log start has moved; the followers
        take it up when they fetch).

        Every voter, not the followers in sync as Kafka's ISR: Kafka elects only a replica of
        the ISR, but a vote here compares (last epoch, end offset) alone, so a follower that
        was out of sync, with a log as long, can win the next election and would lead with
        the old log start. A voter down makes DeleteRecords time out rather than answer a
        success a later leader could undo."""
        context = self._context
        with context.purgatory.deferred(), rep.cond:
            election = rep.election
            if election.role is not Role.LEADER or context.stopping.is_set():
                done: Future[tuple[int, int]] = Future()
                done.set_result((ErrorCode.not_leader_or_follower, -1))
                return done
            epoch = election.epoch
            target = rep.log.delete_records_before(offset)
            rep.changed()  # held follower fetches answer: their followers learn the new start
        return context.purgatory.watch(rep.key, lambda expired: self._deleted(rep, epoch, target, expired), timeout_s)

    def _deleted(self, rep: PartitionReplica, epoch: int, target: int, expired: bool) -> tuple[int, int] | None:
        """A DeleteRecords' outcome once every follower moved its log start to ``target``; None
        while it waits (see purgatory)."""
        with rep.cond:
            election = rep.election
            if election.role is not Role.LEADER or election.epoch != epoch or self._context.stopping.is_set():
                return ErrorCode.not_leader_or_follower, -1
            behind = [p for p in self._context.peers if rep.starts.get(p, -1) < target]
            if not behind:
                return ErrorCode.none, rep.log.log_start_offset
        if expired:
            return ErrorCode.request_timed_out, -1
        return None

    # ------------------------------------------------------------------ follower fetch
    def follower_fetch(self, rep: PartitionReplica, replica_id: int, epoch: int, offset: int, last_epoch: int,
                       max_bytes: int, max_wait_s: float, log_start: int = -1) -> "FetchAnswer | Future[FetchAnswer]":
        """Answer the fetch of follower ``replica_id`` (a voter) that holds ``rep``'s log up to
        ``offset`` with ``last_epoch`` its latest epoch and ``log_start`` its log start (-1:
        unknown), in ``epoch``: batches from ``offset`` (at most ``max_bytes``, at least one),
        or where it diverges; a caught-up follower's is held up to ``max_wait_s`` for records,
        or for our log start to move past its (a Future then)."""
        context = self._context
        if max_bytes <= 0:
            return FetchAnswer(ErrorCode.invalid_request, NONE, -1)
        max_bytes = min(max_bytes, context.fetch_max_bytes)
        with context.purgatory.deferred(), rep.cond:  # answers written after the lock
            election = rep.election
            if replica_id not in context.peers:  # only a voter's fetch may move our epoch
                return FetchAnswer(ErrorCode.invalid_request, election.leader, election.epoch)
            if epoch > election.epoch:
                election.observe_epoch(epoch)
                rep.changed()
            if election.role is not Role.LEADER or epoch < election.epoch:
                code = (ErrorCode.not_leader_or_follower if election.role is not Role.LEADER
                        else ErrorCode.fenced_leader_epoch)
                return FetchAnswer(code, election.leader, election.epoch)
            log = rep.log
            if last_epoch < 0 and offset > log.log_start_offset:
                # Records without an epoch history (a lost leader-epoch-checkpoint): nothing
                # proves they match ours, so the follower starts again from our log start.
                return FetchAnswer(ErrorCode.none, context.node_id, election.epoch, rep.hw, -1, log.log_start_offset,
                                   log.log_start_offset)
            # KIP-101/279: the follower's last epoch must end where the leader's history says.
            if last_epoch >= 0:
                div_epoch, div_end = log.end_offset_for_epoch(last_epoch)
                if div_epoch != last_epoch or div_end < offset:
                    return FetchAnswer(ErrorCode.none, context.node_id, election.epoch, rep.hw, div_epoch,
                                       div_end if div_end >= 0 else 0, log.log_start_offset)
            now = time.monotonic()
            rep.contact[replica_id] = now
            if log_start >= 0 and rep.starts.get(replica_id) != log_start:
                rep.starts[replica_id] = log_start
                rep.changed()  # a DeleteRecords may wait for it
            end = log.log_end_offset
            rep.leo[replica_id] = min(offset, end)  # never count what we do not hold ourselves
            mark = rep.fetch_marks.get(replica_id)
            if offset >= end:
                rep.caught_up[replica_id] = now
            elif mark is not None and offset >= mark[0]:  # caught up as of its previous fetch
                rep.caught_up[replica_id] = max(rep.caught_up.get(replica_id, 0.0), mark[1])
            rep.fetch_marks[replica_id] = (end, now)
            self.advance_hw(rep)
            if offset != end or max_wait_s <= 0:
                return self._records(rep, offset, end, max_bytes)
        # Caught up: hold the fetch until a produce appends (or leadership changes), as Kafka's
        # replica.fetch.wait.max.ms does, instead of letting the follower poll. No thread waits.
        return _now_or_later(context.purgatory.watch(
            rep.key, lambda expired: self._held_fetch(rep, replica_id, epoch, offset, max_bytes, expired),
            min(max_wait_s, context.election_timeout_s / 2)))

    def _held_fetch(self, rep: PartitionReplica, replica_id: int, epoch: int, offset: int, max_bytes: int,
                    expired: bool) -> FetchAnswer | None:
        """A held follower fetch's answer once records arrived past ``offset``, leadership
        changed or its wait ran out; None while it waits (see purgatory)."""
        with rep.cond:
            election = rep.election
            if election.role is not Role.LEADER or election.epoch != epoch:
                return FetchAnswer(ErrorCode.not_leader_or_follower, election.leader, election.epoch)
            end = rep.log.log_end_offset
            moved = rep.log.log_start_offset > rep.starts.get(replica_id, -1) >= 0  # the follower must learn it
            if end == offset and not moved and not expired and not self._context.stopping.is_set():
                return None
            rep.caught_up[replica_id] = time.monotonic()
            return self._records(rep, offset, end, max_bytes)

    def _records(self, rep: PartitionReplica, offset: int, end: int, max_bytes: int) -> FetchAnswer:
        """A follower fetch's answer: the batches from ``offset`` (caller holds rep.cond)."""
        context, log = self._context, rep.log
        try:
            # A region of the segment file, written to the follower's socket with sendfile.
            data = (log.read_region(offset, max_bytes) or b"") if offset < end else b""
        except OffsetMovedToTieredStorageError:
            # Tiered storage: only the remote tier holds it; the follower restarts at our local
            # log start with the tier's state below it (replica.tiering.TierCatchUp).
            return FetchAnswer(ErrorCode.offset_moved_to_tiered_storage, context.node_id, rep.election.epoch, rep.hw,
                               -1, -1, log.log_start_offset)
        except OffsetOutOfRangeError:
            return FetchAnswer(ErrorCode.offset_out_of_range, context.node_id, rep.election.epoch, rep.hw, -1, -1,
                               log.log_start_offset)
        return FetchAnswer(ErrorCode.none, context.node_id, rep.election.epoch, rep.hw,
                           log_start_offset=log.log_start_offset, records=data)
