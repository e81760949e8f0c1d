"""A replica set's ACLs: :class:`ReplicatedAcls`, records in the replicated ``__acls`` topic.

On a replica set every node authorizes the requests it serves, so every node needs the same
ACLs, and a change must survive the loss of any minority: the ACLs are records in ``__acls``
(one partition, compacted, replicated like ``__consumer_offsets``, and only with an
authorizer). Each record is the whole set of bindings, in the file format of
:mod:`~logstore.kafka.aclfile`, under the key ``acls``; the newest committed record is the
ACLs. A whole set per record keeps the rule simple (no replay of deltas; compaction keeps one
record) and costs little: ACLs are few and change rarely.

- A change is made by the leader of ``__acls-0``: the newest committed set, changed, appended
  as acks=all (:class:`~logstore.replica.replicatedlog.ReplicatedLog`); it returns once a
  majority holds it. Another node forwards CreateAcls and DeleteAcls to that leader
  (:class:`~logstore.replica.kafkaapis.ReplicaKafkaApis`).
- Every node reads the records below its high watermark, so it enforces committed ACLs only:
  on a follower, a change counts once the leader's next fetch answer told it the new high
  watermark (within ``replica.fetch.wait.max.ms``).

Why not the store's ``.acls`` file: each node has its own store, and a file written on one
would never reach the others.

Thread-safety: thread-safe. Durability: :meth:`ReplicatedAcls.update` returns once a majority
holds the change.
"""

from __future__ import annotations

import logging
import threading
from typing import Callable, TypeVar

from ..errors import LogstoreError, NotLeaderOrFollowerError
from ..kafka.aclfile import decode, encode
from ..kafka.acls import ACLS_TOPIC, AclError, AclSet
from .context import NodeContext
from .leader import LeaderSide
from .quorum import Role
from .replicatedlog import WRITE_TIMEOUT_S, ReplicatedLog

__all__ = ["ReplicatedAcls", "ACLS_TOPIC", "ACLS_TOPIC_CONFIG", "ACLS_KEY"]

logger = logging.getLogger("logstore.replication.acls")

#: Its config: compacted (the newest record of the key is the ACLs).
ACLS_TOPIC_CONFIG = dict(cleanup_policy="compact", min_cleanable_dirty_ratio=0.5)
#: The key of every record.
ACLS_KEY = b"acls"
_READ_BYTES = 1 << 20

R = TypeVar("R")


class ReplicatedAcls:
    """The ACLs of a replica set (see the module docstring): an
    :class:`~logstore.kafka.acls.AclSource`. Thread-safe.

    Args:
        context: the node's context (its ``__acls-0`` replica).
        leader: the node's leader side (the high watermark of its writes).
        timeout_s: how long a change waits for the majority.
    """

    def __init__(self, context: NodeContext, leader: LeaderSide, timeout_s: float = WRITE_TIMEOUT_S) -> None:
        self.context = context
        self.leader = leader
        self.timeout_s = timeout_s
        self._lock = threading.Lock()
        self._update_lock = threading.Lock()
        self._acls = AclSet()
        self._read_to = -1  # the high watermark the ACLs were read up to

    def _replica(self):  # type: ignore[no-untyped-def]
        rep = self.context.replica(ACLS_TOPIC, 0)
        if rep is None:
            raise LogstoreError(f"node {self.context.node_id} does not replicate {ACLS_TOPIC}")
        return rep

    def current(self) -> AclSet:
        """The newest ACLs committed that this node knows (one attribute read when nothing
        changed)."""
        log = self._replica().log
        hw = log.high_watermark
        if hw == self._read_to:
            return self._acls
        with self._lock:
            if hw != self._read_to:
                start = self._read_to if 0 <= self._read_to < hw else log.log_start_offset
                newest = None
                offset = start
                try:
                    while offset < hw:
                        records = log.read(offset, max_bytes=_READ_BYTES, max_offset=hw)
                        if not records:
                            break
                        for record in records:
                            if record.key == ACLS_KEY and record.value is not None:
                                newest = record.value
                        offset = records[-1].offset + 1
                    if newest is not None:
                        self._acls = decode(newest, f"{ACLS_TOPIC}-0 at {offset - 1}")
                    self._read_to = hw
                except (AclError, LogstoreError, OSError) as exc:
                    logger.error("keeping the ACLs read before: %s", exc)
            return self._acls

    def leader_id(self) -> int:
        """The node that leads ``__acls-0`` (-1: none known)."""
        election = self._replica().election
        return election.leader if election.leader >= 0 else -1

    def leading(self) -> bool:
        """Whether this node leads ``__acls-0`` (and so makes the changes)."""
        return self._replica().election.role is Role.LEADER

    def update(self, change: Callable[[AclSet], tuple[AclSet, R]]) -> R:
        """Apply ``change`` to the newest committed ACLs and append the result, waiting for the
        majority (the leader only).

        Raises:
            NotLeaderOrFollowerError: this node does not lead ``__acls-0`` (or lost it before
                the majority took the change).
            RequestTimedOutError: no majority within ``timeout_s`` (the change may still
                commit).
        """
        with self._update_lock:
            rep = self._replica()
            with rep.cond:
                election = rep.election
                if election.role is not Role.LEADER:
                    raise NotLeaderOrFollowerError(f"node {self.context.node_id} does not lead {ACLS_TOPIC}-0")
                epoch = election.epoch
                caught_up = rep.hw >= rep.log.log_end_offset
            if not caught_up:  # a new leader's first change waits for its log to be committed
                raise NotLeaderOrFollowerError(f"{ACLS_TOPIC}-0's new leader has not committed its log yet")
            new, result = change(self.current())
            log = ReplicatedLog(self.context, self.leader, rep, epoch, self.timeout_s)
            log.append_batch([encode(new)], [ACLS_KEY])
            log.flush()
            return result
