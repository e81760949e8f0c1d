"""Replication's requests on a replica node's Kafka listener, as KRaft's (KIP-595) are:

- **Fetch** (v12, flexible) with the follower's ``replica_id``: ``current_leader_epoch`` is the
  epoch the follower is in, ``fetch_offset`` its log end and ``last_fetched_epoch`` its latest
  epoch. The answer carries batches from that offset, or the ``diverging_epoch`` (epoch and where
  it ends in the leader's log) to truncate to (KIP-320/595), and always ``current_leader``
  (leader id and epoch) and the high watermark. A caught-up follower's fetch is held up to its
  ``max_wait``. One partition per request (each follower partition has its own connection).
- **Vote** (v2, with ``pre_vote``: KIP-996) and **BeginQuorumEpoch** (v1): a candidate asks for
  votes, a winner announces its epoch; the rules are :mod:`~logstore.replica.quorum`'s, run by
  :mod:`~logstore.replica.elections`.
- **WriteTxnMarkers** (v1): the transaction coordinator (the leader of ``__transaction_state``)
  asks the leader of each partition of a transaction to append its COMMIT or ABORT marker; each
  partition is answered once the marker is held by a majority (as Kafka appends markers with
  acks=all).
- **DescribeQuorum** (v1): each partition's leader, epoch and high watermark as this node knows
  them, and at a leader its voters' log end offsets and fetch times. (Kafka answers it at the
  leader only; here every node answers with its view, which is what ``Client.metadata`` shows.)

Every one of them but DescribeQuorum is the peers' business: a connection must have logged in
as :data:`~logstore.replica.client.REPLICA_USER` (with the set's shared secret), else the
answer is CLUSTER_AUTHORIZATION_FAILED, as Kafka's authorizer answers a ClusterAction a
principal lacks. A request naming another cluster id gets INCONSISTENT_CLUSTER_ID, and a Vote or
BeginQuorumEpoch whose ``voter_id`` names another node INCONSISTENT_VOTER_SET (a peer address
that leads to the wrong node must not count as that node's vote).

Thread-safety: every method may be called from any thread (the listener's workers).
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import Future
from typing import Any

from .quorum import NONE, Role
from ..errorcodes import ErrorCode
from ..kafka.wire import KafkaRequest
from ..net.purgatory import when_settled
from .context import NodeContext
from .elections import ElectionDriver
from .leader import FetchAnswer, LeaderSide
from .client import REPLICA_USER

__all__ = ["PeerApis", "PEER_VERSIONS", "MARKER_COMMIT_TIMEOUT_S", "gather"]

#: what the peer APIs add to the listener's served versions (the transaction coordinator's
#: WriteTxnMarkers; KRaft's). A follower's Fetch is v12 (by topic name), within the clients' range.
PEER_VERSIONS = {27: (1, 1), 52: (2, 2), 53: (1, 1), 55: (1, 1)}
#: how long a partition leader holds a marker's answer for the high watermark
MARKER_COMMIT_TIMEOUT_S = 10.0
_PRINCIPAL = f"User:{REPLICA_USER}"

logger = logging.getLogger("logstore.replication")


class PeerApis:
    """The answers to replication's requests on a node's listener (see the module docstring):
    votes and announcements go to ``elections``, followers' fetches to ``leader``. Thread-safe."""

    def __init__(self, context: NodeContext, elections: ElectionDriver, leader: LeaderSide) -> None:
        self.context = context
        self.elections = elections
        self.leader = leader
        self._foreign_clusters: set[str] = set()  # the other clusters' ids refused (logged once each)

    def refusal(self, request: KafkaRequest) -> int:
        """The top-level error of a peer request (0: go ahead)."""
        if request.principal != _PRINCIPAL:
            return ErrorCode.cluster_authorization_failed
        cluster = getattr(request.body, "cluster_id", None)
        if cluster is not None and cluster != self.context.cluster_id:
            if cluster not in self._foreign_clusters:
                self._foreign_clusters.add(cluster)
                logger.error("node %d refuses %s from %s: it belongs to cluster %r, this node to %r "
                             "(INCONSISTENT_CLUSTER_ID)", self.context.node_id, request.name, request.client_host,
                             cluster, self.context.cluster_id)
            return ErrorCode.inconsistent_cluster_id
        voter = getattr(request.body, "voter_id", -1)
        if voter >= 0 and voter != self.context.node_id:  # meant for another voter (KIP-853)
            return ErrorCode.inconsistent_voter_set
        return ErrorCode.none

    # ------------------------------------------------------------------ Fetch from a follower
    def on_replica_fetch(self, request: KafkaRequest) -> dict[str, Any] | Future:
        """A follower's Fetch (``replica_id`` >= 0)."""
        body = request.body
        wanted = [(t.topic, p) for t in body.topics for p in t.partitions]
        error = self.refusal(request)
        if not error and (request.api_version != 12 or len(wanted) != 1):
            # last_fetched_epoch needs v12, topics by name v12 at most; one partition per request
            error = ErrorCode.invalid_request
        if error:
            return {"throttle_time": 0, "error_code": error, "session_id": 0, "responses": []}
        topic, p = wanted[0]
        rep = self.context.replica(topic, p.partition)
        if rep is None:
            answer: FetchAnswer | Future = FetchAnswer(ErrorCode.unknown_topic_or_partition, NONE, -1)
        else:
            answer = self.leader.follower_fetch(rep, int(body.replica_id), int(p.current_leader_epoch),
                                                int(p.fetch_offset), int(p.last_fetched_epoch),
                                                min(int(p.partition_max_bytes), int(body.max_bytes)),
                                                body.max_wait.total_seconds(), int(p.log_start_offset))
        if isinstance(answer, Future):
            out: Future = Future()

            def settle(f: Future) -> None:
                error = f.exception()
                if error is not None:  # the connection is closed, as for any failed handler
                    out.set_exception(error)
                else:
                    out.set_result(_fetch_response(topic, p.partition, f.result()))

            answer.add_done_callback(settle)
            return out
        return _fetch_response(topic, p.partition, answer)

    # ------------------------------------------------------------------ transaction markers
    def on_write_txn_markers(self, request: KafkaRequest) -> dict[str, Any] | Future:
        """The transaction coordinator's WriteTxnMarkers (v1): each marker appended to each of
        its partitions that this node leads (:meth:`LeaderSide.append_marker`), answered once
        every one is held by a majority or failed (per partition error codes). Only a peer may
        send it (CLUSTER_AUTHORIZATION_FAILED otherwise, for every partition: the answer has no
        top-level error)."""
        error = self.refusal(request)
        results: list[dict[str, Any]] = []
        waiting: list[tuple[dict[str, Any], Future]] = []
        for marker in request.body.markers:
            topics = []
            for topic in marker.topics:
                partitions = []
                for index in topic.partition_indexes:
                    entry = {"partition_index": index, "error_code": error}
                    rep = None if error else self.context.replica(topic.name, index)
                    if not error and rep is None:
                        entry["error_code"] = ErrorCode.unknown_topic_or_partition
                    elif rep is not None:
                        waiting.append((entry, self.leader.append_marker(
                            rep, int(marker.producer_id), int(marker.producer_epoch), bool(marker.transaction_result),
                            int(marker.coordinator_epoch), MARKER_COMMIT_TIMEOUT_S)))
                    partitions.append(entry)
                topics.append({"name": topic.name, "partitions": partitions})
            results.append({"producer_id": marker.producer_id, "topics": topics})
        answer = {"markers": results}
        return gather(answer, waiting)

    # ------------------------------------------------------------------ elections
    def _each_partition(self, request: KafkaRequest, empty: dict[str, Any],
                        answer: Any) -> dict[str, Any]:
        """The answer to a request of topics and partitions: for each partition ``empty``'s
        fields, updated by ``answer(replica, partition data)`` when this node replicates it,
        else UNKNOWN_TOPIC_OR_PARTITION."""
        topics = []
        for t in request.body.topics:
            partitions = []
            for p in t.partitions:
                rep = self.context.replica(t.topic_name, p.partition_index)
                entry = {"partition_index": p.partition_index, "error_code": ErrorCode.none, **empty}
                if rep is None:
                    entry["error_code"] = ErrorCode.unknown_topic_or_partition
                else:
                    entry.update(answer(rep, p))
                partitions.append(entry)
            topics.append({"topic_name": t.topic_name, "partitions": partitions})
        return {"error_code": ErrorCode.none, "topics": topics}

    def on_vote(self, request: KafkaRequest) -> dict[str, Any]:
        error = self.refusal(request)
        if error:
            return {"error_code": error, "topics": []}

        def vote(rep: Any, p: Any) -> dict[str, Any]:
            epoch, granted, leader = self.elections.on_vote(
                rep, int(p.replica_epoch), int(p.replica_id), int(p.last_offset_epoch), int(p.last_offset),
                bool(p.pre_vote))
            return {"leader_id": leader if leader != NONE else -1, "leader_epoch": epoch, "vote_granted": granted}

        return self._each_partition(request, {"leader_id": -1, "leader_epoch": -1, "vote_granted": False}, vote)

    def on_begin_quorum_epoch(self, request: KafkaRequest) -> dict[str, Any]:
        error = self.refusal(request)
        if error:
            return {"error_code": error, "topics": []}

        def begin(rep: Any, p: Any) -> dict[str, Any]:
            epoch, leader = self.elections.on_begin_epoch(rep, int(p.leader_epoch), int(p.leader_id))
            return {"leader_id": leader if leader != NONE else -1, "leader_epoch": epoch}

        return self._each_partition(request, {"leader_id": -1, "leader_epoch": -1}, begin)

    def on_describe_quorum(self, request: KafkaRequest) -> dict[str, Any]:
        context = self.context
        now = time.monotonic()
        wall = time.time()

        def ms(at: float | None) -> int:
            return -1 if at is None else int((wall - (now - at)) * 1000)

        def describe(rep: Any, p: Any) -> dict[str, Any]:
            with rep.cond:
                election = rep.election
                entry: dict[str, Any] = {"leader_id": election.leader if election.leader != NONE else -1,
                                         "leader_epoch": election.epoch, "high_watermark": rep.hw}
                if election.role is not Role.LEADER:
                    entry["current_voters"] = [{"replica_id": v, "log_end_offset": -1} for v in context.voters]
                    return entry
                entry["current_voters"] = [
                    {"replica_id": context.node_id, "log_end_offset": rep.log.log_end_offset,
                     "last_fetch_timestamp": int(wall * 1000), "last_caught_up_timestamp": int(wall * 1000)}
                ] + [{"replica_id": peer, "log_end_offset": rep.leo.get(peer, -1),
                      "last_fetch_timestamp": ms(rep.contact.get(peer)),
                      "last_caught_up_timestamp": ms(rep.caught_up.get(peer))} for peer in sorted(context.peers)]
                return entry

        return self._each_partition(request, {"leader_id": -1, "leader_epoch": -1, "high_watermark": -1,
                                              "current_voters": [], "observers": []}, describe)


def gather(answer: dict[str, Any], waiting: list[tuple[dict[str, Any], Future]]) -> dict[str, Any] | Future:
    """``answer`` once every future of ``waiting`` settled, each writing its error code (an int
    result; REQUEST_TIMED_OUT for an exception) into its entry's ``error_code``: the answer now
    when nothing waits, else its Future."""
    if not waiting:
        return answer
    return when_settled(answer, waiting, _fill_error_code)


def _fill_error_code(entry: dict[str, Any], future: Future) -> None:
    entry["error_code"] = future.result() if future.exception() is None else ErrorCode.request_timed_out


def _fetch_response(topic: str, partition: int, answer: FetchAnswer) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "partition_index": partition, "error_code": answer.code, "high_watermark": answer.high_watermark,
        "last_stable_offset": answer.high_watermark, "log_start_offset": answer.log_start_offset,
        "current_leader": {"leader_id": answer.leader if answer.leader != NONE else -1,
                           "leader_epoch": answer.epoch},
        "aborted_transactions": None, "preferred_read_replica": -1, "records": answer.records}
    if answer.diverging_epoch != -1 or answer.diverging_end != -1:
        entry["diverging_epoch"] = {"epoch": answer.diverging_epoch, "end_offset": answer.diverging_end}
    return {"throttle_time": 0, "error_code": ErrorCode.none, "session_id": 0,
            "responses": [{"topic": topic, "partitions": [entry]}]}
