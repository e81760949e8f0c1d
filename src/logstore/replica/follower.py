"""The follower's side of replication: one fetcher thread per partition, copying the leader's log.

A fetcher follows its partition's leader while this node is one of its followers: it sends
Kafka's Fetch (v12) with its replica id, its epoch, its log end offset and last fetched epoch on
its own connection to the leader's listener (so that one partition's long-polling fetch never
holds up another's), appends the batches byte for byte, and takes the leader's high watermark.
When the leader names a diverging epoch it truncates (KIP-101/279/320); when the leader's log
starts past its end it restarts empty there. When the leader's records from its offset are only
in the remote tier (OFFSET_MOVED_TO_TIERED_STORAGE: tiered storage), it restarts at the leader's
local log start with the state the tier keeps below it (``from_tier``:
:class:`~logstore.replica.tiering.TierCatchUp`), or, without a remote tier, logs why it cannot
follow and retries. The election timers are the election driver's:
a fetch the leader answered pushes the partition's timer back, and a refused or dropped
connection to the leader makes the node campaign soon rather than after a whole election
timeout.

Thread-safety: :meth:`Fetchers.run` is each fetcher thread's body; :meth:`Fetchers.close` may be
called from any thread. Each partition's state is changed under its ``cond``.
"""

from __future__ import annotations

import logging
import threading
from typing import Callable

from .quorum import NONE, Role
from ..errorcodes import ErrorCode
from ..errors import LogstoreError
from ..records.batch import parse_header
from .partition import PartitionReplica
from .client import FETCH, NodeConnection, refused
from .context import NodeContext
from .elections import ElectionDriver

__all__ = ["Fetchers"]

logger = logging.getLogger("logstore.replication")


class Fetchers:
    """The fetchers of every partition of a node (its settings are read from ``context`` at
    each use); what they learn of the leader goes to ``elections``. ``from_tier(rep, conn,
    leader's log start)`` restarts a follower whose fetch offset the leader holds only in the
    remote tier (True: fetch on; False: it could not, yet); None: such a follower logs an error
    and retries. Thread-safe."""

    def __init__(self, context: NodeContext, elections: ElectionDriver,
                 from_tier: Callable[[PartitionReplica, NodeConnection, int], bool] | None = None) -> None:
        self._context = context
        self._from_tier = from_tier
        self._elections = elections
        self._lock = threading.Lock()
        self._conns: dict[tuple[str, int], NodeConnection] = {}

    def close(self) -> None:
        """Close every fetcher's connection (a fetch blocked on one fails at once). Call after
        the node's stop flag (``context.stopping``) is set: a fetcher that connects afterwards
        closes its connection."""
        with self._lock:
            conns = list(self._conns.values())
        for conn in conns:
            conn.close()

    def run(self, rep: PartitionReplica) -> None:
        """Follow ``rep``'s leader while this node is one of its followers, until the node stops."""
        context = self._context
        key = (rep.topic, rep.partition)
        conn: NodeConnection | None = None
        conn_peer = NONE
        try:
            while not context.stopping.is_set():
                leader = rep.election.leader
                if rep.election.role is not Role.FOLLOWER or leader not in context.peers:
                    context.stopping.wait(0.01)
                    continue
                try:
                    if conn is None or conn_peer != leader:
                        if conn is not None:
                            conn.close()
                        conn, conn_peer = None, leader
                        conn = context.connect(leader, context.election_timeout_s)
                        with self._lock:
                            if context.stopping.is_set():
                                conn.close()
                                return
                            self._conns[key] = conn
                    if not self.fetch_once(rep, leader, conn):
                        context.stopping.wait(0.01)  # refused (not the leader, stale epoch): do not spin
                except (OSError, LogstoreError) as exc:
                    logger.debug("node %d: fetch from %d failed: %s", context.node_id, leader, exc)
                    if conn is not None:
                        conn.close()
                        conn = None
                    if refused(exc):
                        self._elections.leader_gone(rep, leader)
                    context.stopping.wait(0.01)
                except Exception:  # noqa: BLE001 - the fetcher must outlive one bad answer
                    logger.exception("node %d: %s-%d: fetch from %d failed", context.node_id, rep.topic,
                                     rep.partition, leader)
                    if conn is not None:
                        conn.close()
                        conn = None
                    context.stopping.wait(0.1)
        finally:
            with self._lock:
                self._conns.pop(key, None)
            if conn is not None:
                conn.close()

    def fetch_once(self, rep: PartitionReplica, leader: int, conn: NodeConnection) -> bool:
        """One fetch; returns False when the leader refused it."""
        context = self._context
        log = rep.log
        offset = log.log_end_offset
        last_epoch = log.latest_epoch
        fields = {"cluster_id": context.cluster_id, "replica_id": context.node_id,
                  "max_wait": int(context.fetch_wait_s * 1000), "min_bytes": 1, "max_bytes": context.fetch_max_bytes,
                  "isolation_level": 0, "session_id": 0, "session_epoch": -1, "rack_id": "",
                  "forgotten_topics_data": [], "topics": [
                      {"topic": rep.topic, "partitions": [
                          {"partition": rep.partition, "current_leader_epoch": rep.election.epoch,
                           "fetch_offset": offset, "last_fetched_epoch": last_epoch,
                           "log_start_offset": log.log_start_offset,
                           "partition_max_bytes": context.fetch_max_bytes}]}]}
        # The leader holds a caught-up fetch for up to fetch_wait_s: allow for that.
        answer = conn.request(FETCH, fields, timeout=context.election_timeout_s + context.fetch_wait_s)
        if answer.error_code:  # not authorized, another cluster: a configuration error
            logger.warning("node %d: node %d refused a fetch: error %d", context.node_id, leader,
                           int(answer.error_code))
            context.stopping.wait(context.election_timeout_s)  # (not a warning every 10 ms)
            return False
        p = answer.responses[0].partitions[0]
        code, hw, log_start = int(p.error_code), int(p.high_watermark), int(p.log_start_offset)
        leader_id, epoch = int(p.current_leader.leader_id), int(p.current_leader.leader_epoch)
        div_epoch, div_end = int(p.diverging_epoch.epoch), int(p.diverging_epoch.end_offset)
        data = p.records  # appended as it is
        with rep.cond:
            if epoch > rep.election.epoch:
                known = code in (ErrorCode.none, ErrorCode.fenced_leader_epoch) and leader_id >= 0
                rep.election.observe_epoch(epoch, leader_id if known else NONE)
            if code == ErrorCode.offset_out_of_range and epoch == rep.election.epoch and log_start > offset:
                # The leader's log now starts past our end (retention or DeleteRecords there):
                # nothing we hold can be kept; restart empty at its log start and fetch from it.
                logger.warning("node %d: %s-%d: the leader's log starts at %d, past our end %d; restarting there",
                               context.node_id, rep.topic, rep.partition, log_start, offset)
                log.truncate_fully_and_start_at(log_start)
                return True
            tiered = code == ErrorCode.offset_moved_to_tiered_storage and epoch == rep.election.epoch
            if not tiered and (code != ErrorCode.none or epoch != rep.election.epoch):
                if code == ErrorCode.not_leader_or_follower and leader_id >= 0 and leader_id != leader:
                    rep.election.observe_epoch(epoch, leader_id)
                return False
            self._elections.heard_from_leader(rep)
        if tiered:
            # The leader holds our next offset only in the remote tier: restart past it (network
            # I/O, outside the partition's lock).
            if self._from_tier is None:
                logger.error("node %d: %s-%d: the leader holds offset %d only in the remote tier and this node has "
                             "no remote storage (give it the set's --remote-storage): it cannot follow",
                             context.node_id, rep.topic, rep.partition, offset)
                context.stopping.wait(context.election_timeout_s)  # (not an error every 10 ms)
                return False
            return self._from_tier(rep, conn, log_start)
        if div_epoch != -1 or (data is None and div_end >= 0):
            # KIP-279: the leader named the largest epoch it has at or below ours and where that
            # epoch ends in its log. Our history agrees up to the smaller of that end and the end
            # of the same epoch (or, lacking it, of our largest older one) in our own log. Each
            # round shortens the log or lowers our latest epoch, so a history that diverged over
            # several epochs converges in a few fetches.
            own_end = log.end_offset_for_epoch(div_epoch)[1] if div_epoch >= 0 else div_end
            target = min(div_end, own_end if own_end >= 0 else div_end, log.log_end_offset)
            logger.info("node %d: %s-%d diverges from the leader (its epoch %d ends at %d); truncating to %d",
                        context.node_id, rep.topic, rep.partition, div_epoch, div_end, target)
            log.truncate_to(max(target, 0))
            return True
        if data:
            base = parse_header(data, 0).base_offset
            if base < offset and log.log_start_offset == offset:
                # Restarted past its end, the log is empty, but the leader's log start lies
                # inside this batch: start at the batch instead (as Kafka's follower does).
                log.truncate_fully_and_start_at(base)
            log.append_replicated(data)  # (the log's producer state learns the batches)
        with rep.cond:
            if rep.election.role is Role.FOLLOWER and rep.election.epoch == epoch:
                end = log.log_end_offset
                log.high_watermark = max(log.log_start_offset, min(hw, end))
                rep.hw = log.high_watermark
                if log_start > log.log_start_offset:
                    # The leader's log start moved (DeleteRecords there, or its retention): ours
                    # follows, as far as our high watermark (Kafka's follower does so); our
                    # next fetch tells the leader, whose DeleteRecords answer waits for it.
                    log.delete_records_before(min(log_start, log.high_watermark))
        return True
