"""Tiered storage on a replica set (KIP-405): :class:`RemoteMetadataLog`, the replicated
``__remote_log_metadata-0`` as each node's remote log metadata manager sees it,
:class:`PartitionLeadership`, which tells a node's remote log manager the partitions it tiers,
and :class:`TierCatchUp`, a follower's start past what the leader holds only in the tier.

The set shares one object store. Each node's store has a
:class:`~logstore.tiered.manager.RemoteLogManager` that copies and expires only the partitions
this node leads in the current epoch (:class:`PartitionLeadership`); for the others it applies
local retention alone (the segments the tier holds leave the local disk), and its reads below
the local segments go to the tier. Every node's
:class:`~logstore.tiered.rlmm.TopicBasedRemoteLogMetadataManager` reads the node's own replica
of ``__remote_log_metadata-0`` up to its high watermark (committed events only: none a new
leader may truncate) and writes its events through that partition's leader
(:class:`RemoteMetadataLog`): appended as acks=all when this node leads it
(:class:`~logstore.replica.replicatedlog.ReplicatedLog`), else produced with acks=all to the
leader by the replica user, the one principal whose produce to that internal topic the leader
takes (:class:`~logstore.replica.kafkaapis.ReplicaKafkaApis`); either way the write returns once
this node's replica has committed it, so the manager reads back its own event.

A follower whose fetch offset its leader holds only in the remote tier (the leader's local
retention dropped it: OFFSET_MOVED_TO_TIERED_STORAGE) restarts past the remote segment ending
below the leader's local log start, with that segment's leader epochs and producer snapshot
(:class:`TierCatchUp`), as Kafka's follower does; a node restarted with an empty disk catches up
so, without fetching what the tier holds.

Durability: a write returns once a majority holds it and this node's high watermark passed it.
Thread-safety: thread-safe (the metadata manager serialises its writes; each thread's flush waits
for its own last append).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from ..errorcodes import ErrorCode
from ..errors import LogstoreError, NotLeaderOrFollowerError, RequestTimedOutError
from ..kafka.apikeys import LIST_OFFSETS, PRODUCE
from ..records.batch import BatchBuilder
from .client import PeerConnections
from .context import NodeContext
from .leader import LeaderSide
from .quorum import Role
from .replicatedlog import WRITE_TIMEOUT_S, ReplicatedLog
from ..tiered.metadata import IndexType

__all__ = ["RemoteMetadataLog", "PartitionLeadership", "TierCatchUp", "parse_leader_epochs", "REMOTE_LOG_METADATA_TOPIC", "REMOTE_LOG_METADATA_CONFIG"]

logger = logging.getLogger("logstore.replication.tiering")

#: Kafka's internal topic of the remote segments' metadata (the store's name for it)
REMOTE_LOG_METADATA_TOPIC = "__remote_log_metadata"
#: its config: every event kept (the metadata manager folds the whole log), never tiered itself
REMOTE_LOG_METADATA_CONFIG = dict(retention_ms=-1, retention_bytes=-1, remote_storage_enable=False)


class RemoteMetadataLog:
    """``__remote_log_metadata-0`` of a replica node with the shape of
    :class:`~logstore.log.log.Log` that the topic-based metadata manager uses (see the module
    docstring): reads of the local replica, writes through the leader. Until :meth:`bind` gives
    it the node's parts, every write raises NotLeaderOrFollowerError. Thread-safe.

    Args:
        log: this node's replica of the partition (owned by the node's store).
        timeout_s: how long a write waits for the leader and the majority.
    """

    def __init__(self, log: Any, timeout_s: float = WRITE_TIMEOUT_S) -> None:
        self._log = log
        self.timeout_s = timeout_s
        self._context: NodeContext | None = None
        self._leader: LeaderSide | None = None
        self._connections: PeerConnections | None = None
        self._builder = BatchBuilder()
        self._pending = threading.local()  # each thread's last write, for its flush

    def bind(self, context: NodeContext, leader: LeaderSide) -> None:
        """Give the node's context and leader side (the writes go through them from now on)."""
        self._context, self._leader = context, leader
        self._connections = context.new_peer_connections()

    def close(self) -> None:
        """Close the connections to the peers (a write blocked on one fails at once)."""
        if self._connections is not None:
            self._connections.close()

    @property
    def log_start_offset(self) -> int:
        return self._log.log_start_offset  # type: ignore[no-any-return]

    @property
    def log_end_offset(self) -> int:
        return self._log.log_end_offset  # type: ignore[no-any-return]

    def committed_end(self) -> int:
        """This replica's high watermark: how far the metadata manager reads."""
        return min(self._log.high_watermark, self._log.log_end_offset)  # type: ignore[no-any-return]

    def read(self, offset: int, **kwargs: Any) -> Any:
        """This replica's records from ``offset`` (Log.read's arguments)."""
        return self._log.read(offset, **kwargs)

    def append_batch(self, values: list[bytes | None], keys: list[bytes | None]) -> None:
        """Write one batch through the partition's leader; :meth:`flush` waits until this
        replica has committed it.

        Raises:
            NotLeaderOrFollowerError: no leader is known, or it refused (nothing was written).
            RequestTimedOutError: the leader did not answer in time (the batch may commit).
            LogstoreError, OSError: the leader's log or the connection failed.
        """
        context, leader_side = self._context, self._leader
        if context is None or leader_side is None:
            raise NotLeaderOrFollowerError(f"{REMOTE_LOG_METADATA_TOPIC}-0: the node is not running yet")
        rep = context.replica(REMOTE_LOG_METADATA_TOPIC, 0)
        if rep is None:
            raise LogstoreError(f"node {context.node_id} does not replicate {REMOTE_LOG_METADATA_TOPIC}")
        with rep.cond:
            role, epoch, leader = rep.election.role, rep.election.epoch, rep.election.leader
        if role is Role.LEADER:
            log = ReplicatedLog(context, leader_side, rep, epoch, self.timeout_s)
            log.append_batch(values, keys)
            self._pending.write = log
            return
        if leader not in context.peers:
            raise NotLeaderOrFollowerError(f"no leader of {REMOTE_LOG_METADATA_TOPIC}-0 is known yet")
        batch = self._builder.build(values, keys)
        fields = {"transactional_id": None, "acks": -1, "timeout": int(self.timeout_s * 1000),
                  "topic_data": [{"name": REMOTE_LOG_METADATA_TOPIC,
                                  "partition_data": [{"index": 0, "records": batch}]}]}
        assert self._connections is not None
        answer = self._connections.request(leader, PRODUCE, fields, self.timeout_s + 5.0)
        entry = answer.responses[0].partition_responses[0]
        code = int(entry.error_code)
        if code == ErrorCode.request_timed_out:
            raise RequestTimedOutError(f"{REMOTE_LOG_METADATA_TOPIC}-0: node {leader} did not commit the write in "
                                       f"{self.timeout_s:g} s: {entry.error_message}")
        if code != ErrorCode.none:
            raise NotLeaderOrFollowerError(f"{REMOTE_LOG_METADATA_TOPIC}-0: node {leader} refused the write: "
                                           f"{ErrorCode(code).name}: {entry.error_message}")
        self._pending.write = int(entry.base_offset) + len(values) - 1

    def flush(self) -> None:
        """Wait until this thread's last write is committed and below this replica's high
        watermark.

        Raises:
            NotLeaderOrFollowerError: the leadership was lost first (the record may be lost).
            RequestTimedOutError: not within the timeout (the record may still commit).
        """
        write = getattr(self._pending, "write", None)
        self._pending.write = None
        if write is None:
            return
        if isinstance(write, ReplicatedLog):
            write.flush()
            return
        context = self._context
        assert context is not None
        rep = context.replica(REMOTE_LOG_METADATA_TOPIC, 0)
        assert rep is not None
        deadline = time.monotonic() + self.timeout_s
        with rep.cond:
            while rep.hw <= write:
                left = deadline - time.monotonic()
                if context.stopping.is_set() or left <= 0:
                    raise RequestTimedOutError(f"{REMOTE_LOG_METADATA_TOPIC}-0: the write at {write} committed but "
                                               f"node {context.node_id} had not replicated it in {self.timeout_s:g} s")
                rep.cond.wait(min(left, 0.05))


class PartitionLeadership:
    """The remote log manager's ``leads`` hook of a replica node: whether this node leads a
    log's partition in the current epoch with its high watermark established (a new leader's
    first committed record of its epoch), so that one node at a time copies and expires it.
    Thread-safe."""

    def __init__(self, context: NodeContext) -> None:
        self._context = context

    def __call__(self, log: Any) -> bool:
        rep = self._context.replica(log.topic, log.partition)
        if rep is None or self._context.stopping.is_set():
            return False
        with rep.cond:
            return rep.election.role is Role.LEADER and rep.hw > rep.epoch_start


class TierCatchUp:
    """A follower's start past the records its leader holds only in the remote tier (Kafka's
    follower on OFFSET_MOVED_TO_TIERED_STORAGE; the fetchers' ``from_tier``): it asks the leader
    for its local log start (ListOffsets, EARLIEST_LOCAL_TIMESTAMP -4), finds the remote segment
    holding the offset just below it, fetches that segment's leader-epoch checkpoint and
    producer snapshot, and restarts its log, empty, past that segment with them
    (:meth:`~logstore.log.log.Log.start_from_tier`), its log start the leader's; its fetches then
    go on from there, and its reads below go to the tier. A node restarted with an empty disk
    catches up this way. Thread-safe (one fetcher per partition calls it).

    Args:
        context: the node's context.
        manager: returns the node's remote log manager (None: the node has no remote tier).
    """

    def __init__(self, context: NodeContext, manager: Any) -> None:
        self._context = context
        self._manager = manager

    def __call__(self, rep: Any, conn: Any, leader_log_start: int) -> bool:
        """Restart ``rep``'s log past the remote tier (see the class docstring); True when it
        did (or there is nothing to do any more), False when it could not yet (logged; the
        fetcher retries)."""
        context, log = self._context, rep.log
        where = f"node {context.node_id}: {rep.topic}-{rep.partition}"
        manager = self._manager()
        tier = log.remote_tier
        if manager is None or tier is None:
            logger.error("%s: the leader holds offset %d only in the remote tier and this node has no remote tier "
                         "for the partition: it cannot follow", where, log.log_end_offset)
            context.stopping.wait(context.election_timeout_s)
            return False
        local_start = self._leader_local_start(rep, conn)
        if local_start <= log.log_end_offset:
            return True  # (the leader's local segments reach us again: fetch on)
        rlmm, rsm = manager.rlmm, manager.rsm
        metadata = rlmm.segment_for_offset(tier.tp, local_start - 1)
        if metadata is None:
            rlmm.catch_up()
            metadata = rlmm.segment_for_offset(tier.tp, local_start - 1)
        if metadata is None:
            logger.info("%s: no remote segment known here holds offset %d yet (the leader's local log starts at "
                        "%d): waiting for the replicated metadata", where, local_start - 1, local_start)
            context.stopping.wait(0.1)
            return False
        epochs = parse_leader_epochs(rsm.fetch_index(metadata, IndexType.LEADER_EPOCH))
        snapshot = rsm.fetch_index(metadata, IndexType.PRODUCER_SNAPSHOT) or None
        start = metadata.end_offset + 1
        with rep.cond:
            if rep.election.role is not Role.FOLLOWER:
                return False
            log.start_from_tier(start, min(max(leader_log_start, 0), start), epochs, snapshot)
            rep.hw = log.high_watermark
        logger.warning("%s: the leader's records below %d are in the remote tier: restarted there (from %s)", where,
                       start, metadata.describe())
        return True

    def _leader_local_start(self, rep: Any, conn: Any) -> int:
        """The leader's local log start (ListOffsets v8, timestamp -4)."""
        fields = {"replica_id": self._context.node_id, "isolation_level": 0, "topics": [
            {"name": rep.topic, "partitions": [{"partition_index": rep.partition,
                                                "current_leader_epoch": rep.election.epoch, "timestamp": -4}]}]}
        answer = conn.request(LIST_OFFSETS, fields, self._context.election_timeout_s)
        entry = answer.topics[0].partitions[0]
        if entry.error_code != ErrorCode.none:
            raise LogstoreError(f"{rep.topic}-{rep.partition}: the leader's local log start: "
                                f"{ErrorCode(int(entry.error_code)).name}")
        return int(entry.offset)


def parse_leader_epochs(data: bytes) -> list[tuple[int, int]]:
    """The (epoch, start offset) entries of a leader-epoch checkpoint's bytes (Kafka's text
    format: version 0, the count, one "epoch offset" line each). Pure.

    Raises:
        LogstoreError: the bytes are not such a checkpoint.
    """
    lines = data.decode("ascii", "replace").split("\n")
    try:
        if lines[0].strip() != "0":
            raise ValueError(f"version {lines[0]!r}")
        count = int(lines[1])
        out = []
        for line in lines[2:2 + count]:
            epoch, offset = line.split()
            out.append((int(epoch), int(offset)))
        if len(out) != count:
            raise ValueError(f"{len(out)} entries, the header says {count}")
    except (IndexError, ValueError) as exc:
        raise LogstoreError(f"a damaged leader-epoch checkpoint from the remote tier: {exc}") from None
    return out
