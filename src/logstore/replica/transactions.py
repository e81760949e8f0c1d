"""Transactions on a replica set: the coordinator's slot, its marker writer and the produce
path's verification.

A replica set coordinates transactions as a Kafka cluster does, with one ``__transaction_state``
partition replicated like any other:

- **Who coordinates.** The leader of ``__transaction_state-0``, one
  :class:`~logstore.txn.coordinator.TransactionCoordinator` per leadership epoch, with that epoch
  as its coordinator epoch (written into every marker, so partitions refuse a deposed
  coordinator's: TRANSACTION_COORDINATOR_FENCED). :class:`TxnCoordinatorSlot` holds it: its
  thread loads one when the node leads the partition in a new epoch, and closes it when the
  leadership goes. It loads only once the partition's high watermark reached its log end,
  stricter than Kafka (which reads to the log end): a re-elected node whose uncommitted tail is
  later lost must not act on a Prepare record no majority holds, or it could commit a
  transaction in one partition that its successor aborts in another.
- **State writes** go through :class:`~logstore.replica.replicatedlog.ReplicatedLog` with the
  coordinator's ``fsync`` on: every state change a client or a marker relies on is held by a
  majority first. A write that times out waiting for the majority may still commit after the
  coordinator gave it up, so the slot loads the coordinator again from the log.
- **Markers** (:class:`ReplicaMarkers`, the coordinator's ``write_markers``): to each
  partition's leader, this node's own with :meth:`~logstore.replica.leader.LeaderSide.append_marker`,
  the peers' with Kafka's WriteTxnMarkers (v1), one request per peer at a time on the sender's
  own connection (a marker held for the high watermark must not delay votes). A partition's
  answer comes once a majority holds its marker, so the Complete record the coordinator writes
  next never outlives a lost marker.
- **Verification** (KIP-890 part 1, :class:`TxnVerifier`): a transactional batch that opens the
  producer's transaction in a partition is appended only if the coordinator says the partition
  is in the producer's ongoing transaction (the local coordinator, or AddPartitionsToTxn v4 with
  ``verify_only`` to the node that coordinates).

Thread-safety: every class here is thread-safe.
"""

from __future__ import annotations

import logging
import threading
from concurrent.futures import Future
from dataclasses import replace
from typing import Any, Callable

from ..errorcodes import ErrorCode
from ..errors import LogClosedError, LogstoreError
from ..kafka.apikeys import ADD_PARTITIONS_TO_TXN, WRITE_TXN_MARKERS
from ..txn.coordinator import TopicPartition, TransactionCoordinator, TxnConfig
from ..txn.metadata import TRANSACTION_STATE_TOPIC
from .client import NodeConnection
from .context import NodeContext
from .leader import LeaderSide
from .peerapis import MARKER_COMMIT_TIMEOUT_S
from .quorum import NONE, Role
from .replicatedlog import WRITE_TIMEOUT_S, ReplicatedLog

__all__ = ["TxnCoordinatorSlot", "ReplicaMarkers", "TxnVerifier", "TXN_STATE_KEY"]

logger = logging.getLogger("logstore.replication.txn")

#: the partition whose leader coordinates every transaction
TXN_STATE_KEY = (TRANSACTION_STATE_TOPIC, 0)
#: how often the slot looks at the state partition's leadership
_CHECK_INTERVAL_S = 0.02
#: how long a verification asks the coordinating node
_VERIFY_TIMEOUT_S = 5.0


class TxnCoordinatorSlot:
    """This node's transaction coordinator while it leads ``__transaction_state-0`` (see the
    module docstring). Owns the thread ``replica-<id>-txn``, which loads and closes the
    coordinators (never the tick or network threads: a close waits for the marker thread).

    Args:
        context: the node's context.
        leader: the node's leader side.
        write_markers: the coordinators' marker writer (:class:`ReplicaMarkers`).
        new_producer_id: allocates a producer id unique in the replica set.
        config: the coordinator's settings (``fsync`` is forced on: state writes wait for the
            majority).
        write_timeout_s: how long a state write waits for the majority (then the request gets
            COORDINATOR_NOT_AVAILABLE and the coordinator is loaded again).
    """

    def __init__(self, context: NodeContext, leader: LeaderSide, write_markers: Any,
                 new_producer_id: Callable[[], int], config: TxnConfig,
                 write_timeout_s: float = WRITE_TIMEOUT_S) -> None:
        self._context = context
        self._leader = leader
        self._write_markers = write_markers
        self._new_producer_id = new_producer_id
        self._config = replace(config, fsync=True)
        self._write_timeout_s = write_timeout_s
        self._rep = context.replica(*TXN_STATE_KEY)
        self._lock = threading.Lock()
        self._current: TransactionCoordinator | None = None
        self._log: ReplicatedLog | None = None
        self._epoch = -1
        #: the coordinator made last (closed ones answer COORDINATOR_NOT_AVAILABLE themselves)
        self._last: TransactionCoordinator | None = None
        self._closed = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Start the slot's thread (once)."""
        if self._rep is None or self._thread is not None:
            return
        self._thread = threading.Thread(target=self._run, name=f"replica-{self._context.node_id}-txn", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._closed.wait(_CHECK_INTERVAL_S) and not self._context.stopping.is_set():
            try:
                self._check()
            except LogClosedError:  # the node closed its store: nothing more to coordinate
                break
            except Exception:  # a bug: log it and keep watching
                logger.exception("node %d: the transaction coordinator's slot failed a check", self._context.node_id)
        self._retire()

    def _check(self) -> None:
        rep = self._rep
        assert rep is not None
        with rep.cond:
            election = rep.election
            leading, epoch = election.role is Role.LEADER, election.epoch
            ready = rep.hw >= rep.log.log_end_offset
        with self._lock:
            current, log, current_epoch = self._current, self._log, self._epoch
        if current is not None and (not leading or current_epoch != epoch or (log is not None and log.uncertain)):
            if leading and current_epoch == epoch:
                logger.warning("node %d: a %s write may have committed after the coordinator gave it up: "
                               "loading again", self._context.node_id, TRANSACTION_STATE_TOPIC)
            self._retire()
            current = None
        if current is None and leading and ready:
            self._load(epoch)

    def _load(self, epoch: int) -> None:
        rep = self._rep
        assert rep is not None
        log = ReplicatedLog(self._context, self._leader, rep, epoch, self._write_timeout_s)
        coordinator = TransactionCoordinator(log, self._new_producer_id, self._write_markers,  # type: ignore[arg-type]
                                             config=self._config, coordinator_epoch=epoch)
        try:
            loaded = coordinator.load()  # (requests meanwhile: COORDINATOR_LOAD_IN_PROGRESS, from coordinator())
        except Exception as exc:
            logger.error("node %d: loading %s in epoch %d failed: %s", self._context.node_id,
                         TRANSACTION_STATE_TOPIC, epoch, exc, exc_info=not isinstance(exc, (LogstoreError, OSError)))
            coordinator.close()
            self._closed.wait(1.0)  # (then the next check tries again)
            return
        with self._lock:
            self._current, self._log, self._epoch, self._last = coordinator, log, epoch, coordinator
        logger.info("node %d coordinates transactions in epoch %d (%d transactional ids)", self._context.node_id,
                    epoch, loaded)

    def _retire(self) -> None:
        with self._lock:
            current, self._current, self._log, self._epoch = self._current, None, None, -1
        if current is not None:
            current.close()

    def coordinator(self) -> tuple[TransactionCoordinator | None, int]:
        """(the live, loaded coordinator, 0), or (None, NOT_COORDINATOR) when this node does not
        lead ``__transaction_state-0``, (None, COORDINATOR_LOAD_IN_PROGRESS) while it takes it up."""
        rep = self._rep
        if rep is None:
            return None, ErrorCode.coordinator_not_available
        election = rep.election  # read without the lock: the coordinator's own writes check it again
        if election.role is not Role.LEADER:
            return None, ErrorCode.not_coordinator
        with self._lock:
            current, epoch = self._current, self._epoch
        if current is None or epoch != election.epoch:
            return None, ErrorCode.coordinator_load_in_progress
        return current, ErrorCode.none

    @property
    def last(self) -> TransactionCoordinator | None:
        """The coordinator made last, live or closed (a closed one answers every request
        COORDINATOR_NOT_AVAILABLE), or None before the first."""
        return self._last

    def leader(self) -> int:
        """The node leading ``__transaction_state-0`` as this node knows it (-1: none)."""
        if self._rep is None:
            return -1
        leader = self._rep.election.leader
        return leader if leader != NONE else -1

    def close(self) -> None:
        """Stop the thread and close the coordinator (its marker thread joined). Idempotent."""
        self._closed.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(35)
        self._retire()


class _MarkerRequest:
    """One marker for a peer's partitions, and its future (partition -> error code)."""

    def __init__(self, producer_id: int, producer_epoch: int, commit: bool, coordinator_epoch: int,
                 partitions: list[TopicPartition]) -> None:
        self.producer_id = producer_id
        self.producer_epoch = producer_epoch
        self.commit = commit
        self.coordinator_epoch = coordinator_epoch
        self.partitions = partitions
        self.future: Future[dict[TopicPartition, int]] = Future()

    def fields(self) -> dict[str, Any]:
        topics: dict[str, list[int]] = {}
        for topic, partition in self.partitions:
            topics.setdefault(topic, []).append(partition)
        return {"producer_id": self.producer_id, "producer_epoch": self.producer_epoch,
                "transaction_result": self.commit, "coordinator_epoch": self.coordinator_epoch,
                "topics": [{"name": name, "partition_indexes": ps} for name, ps in sorted(topics.items())]}


class _PeerSender:
    """Sends the markers queued for one peer, as one WriteTxnMarkers request per round (those
    of distinct producers: the answer is keyed by producer id), on its own connection. Its
    thread ``replica-<id>-txn-markers-<peer>`` starts on first use and ends at close."""

    def __init__(self, context: NodeContext, peer: int) -> None:
        self._context = context
        self._peer = peer
        self._cond = threading.Condition()
        self._queue: list[_MarkerRequest] = []
        self._closed = False
        self._conn: NodeConnection | None = None
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name=f"replica-{context.node_id}-txn-markers-{peer}")
        self._thread.start()

    def send(self, request: _MarkerRequest) -> None:
        with self._cond:
            if self._closed:
                request.future.set_exception(ConnectionError(f"node {self._context.node_id} is stopping"))
                return
            self._queue.append(request)
            self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._closed:
                    self._cond.wait()
                if self._closed:
                    break
                batch: list[_MarkerRequest] = []
                rest: list[_MarkerRequest] = []
                seen: set[int] = set()
                for request in self._queue:
                    (rest if request.producer_id in seen else batch).append(request)
                    seen.add(request.producer_id)
                self._queue = rest
            self._exchange(batch)
        with self._cond:
            left, self._queue = self._queue, []
        for request in left:
            request.future.set_exception(ConnectionError(f"node {self._context.node_id} is stopping"))
        self._drop()

    def _exchange(self, batch: list[_MarkerRequest]) -> None:
        timeout = MARKER_COMMIT_TIMEOUT_S + 2.0
        try:
            if self._conn is None:
                self._conn = self._context.connect(self._peer, timeout)
            answer = self._conn.request(WRITE_TXN_MARKERS, {"markers": [r.fields() for r in batch]}, timeout)
        except (OSError, LogstoreError) as exc:
            self._drop()
            for request in batch:
                request.future.set_exception(exc)
            return
        by_producer: dict[int, dict[TopicPartition, int]] = {}
        for marker in answer.markers:
            errors = by_producer.setdefault(int(marker.producer_id), {})
            for topic in marker.topics:
                for p in topic.partitions:
                    errors[(topic.name, int(p.partition_index))] = int(p.error_code)
        for request in batch:
            request.future.set_result(by_producer.get(request.producer_id, {}))

    def _drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        conn = self._conn
        if conn is not None:
            conn.close()  # a request blocked on it fails at once
        self._thread.join(5)


class ReplicaMarkers:
    """The coordinator's ``write_markers`` on a replica set (see the module docstring): each
    partition's marker to its leader as this node knows it. A partition without a known leader
    is NOT_LEADER_OR_FOLLOWER (the coordinator retries), one the set does not replicate
    UNKNOWN_TOPIC_OR_PARTITION; a peer that cannot be reached fails the future (retried). Never
    blocks. Thread-safe."""

    def __init__(self, context: NodeContext, leader: LeaderSide) -> None:
        self._context = context
        self._leader = leader
        self._lock = threading.Lock()
        self._senders: dict[int, _PeerSender] = {}
        self._closed = False

    def __call__(self, producer_id: int, producer_epoch: int, commit: bool, coordinator_epoch: int,
                 partitions: list[TopicPartition]) -> "Future[dict[TopicPartition, int]]":
        context = self._context
        results: dict[TopicPartition, int] = {}
        waiting: list[tuple[list[TopicPartition], Future]] = []
        by_peer: dict[int, list[TopicPartition]] = {}
        for tp in partitions:
            rep = context.replica(*tp)
            if rep is None:
                results[tp] = ErrorCode.unknown_topic_or_partition
                continue
            leader = rep.election.leader
            if leader == context.node_id:
                waiting.append(([tp], self._leader.append_marker(rep, producer_id, producer_epoch, commit,
                                                                 coordinator_epoch, MARKER_COMMIT_TIMEOUT_S)))
            elif leader == NONE or leader not in context.peers:
                results[tp] = ErrorCode.not_leader_or_follower
            else:
                by_peer.setdefault(leader, []).append(tp)
        for peer, tps in by_peer.items():
            request = _MarkerRequest(producer_id, producer_epoch, commit, coordinator_epoch, tps)
            waiting.append((tps, request.future))
            sender = self._sender(peer)
            if sender is None:
                request.future.set_exception(ConnectionError(f"node {context.node_id} is stopping"))
            else:
                sender.send(request)
        return _combine(results, waiting)

    def _sender(self, peer: int) -> _PeerSender | None:
        with self._lock:
            if self._closed:
                return None
            sender = self._senders.get(peer)
            if sender is None:
                sender = self._senders[peer] = _PeerSender(self._context, peer)
            return sender

    def close(self) -> None:
        """Stop the senders (markers still queued fail). Idempotent."""
        with self._lock:
            self._closed = True
            senders, self._senders = list(self._senders.values()), {}
        for sender in senders:
            sender.close()


def _combine(results: dict[TopicPartition, int],
             waiting: list[tuple[list[TopicPartition], Future]]) -> "Future[dict[TopicPartition, int]]":
    """One future of every partition's error: ``results`` now, plus each waiting future's (an
    int for its one partition, or a dict by partition); it fails when a peer's does (the
    coordinator retries the whole write)."""
    done: Future[dict[TopicPartition, int]] = Future()
    if not waiting:
        done.set_result(results)
        return done
    left = [len(waiting)]
    failure: list[BaseException] = []
    lock = threading.Lock()

    def one(tps: list[TopicPartition], future: Future) -> None:
        exc = future.exception()
        with lock:
            if exc is not None:
                failure.append(exc)
            else:
                value = future.result()
                if isinstance(value, dict):
                    results.update({tp: value[tp] for tp in tps if tp in value})
                else:
                    results[tps[0]] = int(value)
            left[0] -= 1
            last = left[0] == 0
        if last:
            if failure:
                done.set_exception(failure[0])
            else:
                done.set_result(results)

    for tps, future in waiting:
        future.add_done_callback(lambda f, tps=tps: one(tps, f))
    return done


class TxnVerifier:
    """Asks the coordinator whether a partition is in a producer's ongoing transaction (KIP-890
    part 1): the slot's own coordinator when this node coordinates, else the coordinating node
    with AddPartitionsToTxn v4 ``verify_only`` (on this verifier's connections, one per peer).
    The result is the coordinator's error code (0: it is); COORDINATOR_NOT_AVAILABLE when no
    node is known to coordinate or it cannot be reached. Blocks the calling thread up to a few
    seconds. Thread-safe."""

    def __init__(self, context: NodeContext, slot: TxnCoordinatorSlot) -> None:
        self._context = context
        self._slot = slot
        self._connections = context.new_peer_connections()

    def verify(self, transactional_id: str, producer_id: int, producer_epoch: int, tp: TopicPartition) -> int:
        coordinator, error = self._slot.coordinator()
        if coordinator is not None:
            return coordinator.verify_partitions(transactional_id, producer_id, producer_epoch, [tp])[tp]
        node = self._slot.leader()
        if node < 0 or node == self._context.node_id or node not in self._context.peers:
            return error if node == self._context.node_id else ErrorCode.coordinator_not_available
        fields = {"transactions": [{"transactional_id": transactional_id, "producer_id": producer_id,
                                    "producer_epoch": producer_epoch, "verify_only": True,
                                    "topics": [{"name": tp[0], "partitions": [tp[1]]}]}]}
        try:
            answer = self._connections.request(node, ADD_PARTITIONS_TO_TXN, fields, _VERIFY_TIMEOUT_S)
        except (OSError, LogstoreError) as exc:
            logger.info("verifying %s's transaction at node %d failed: %s", transactional_id, node, exc)
            return ErrorCode.coordinator_not_available
        if answer.error_code != ErrorCode.none:
            return int(answer.error_code)
        for result in answer.results_by_transaction:
            for topic in result.topic_results:
                for p in topic.results_by_partition:
                    if topic.name == tp[0] and p.partition_index == tp[1]:
                        return int(p.partition_error_code)
        return ErrorCode.unknown_server_error

    def close(self) -> None:
        """Close the connections. Idempotent."""
        self._connections.close()
