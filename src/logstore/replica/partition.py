"""The state a replica node keeps for each replicated partition (:class:`PartitionReplica`).

One :class:`PartitionReplica` per (topic, partition): its Log, its Raft election, the election
timer, the high watermark, what the leader knows of each follower (log end, last fetch, last
time caught up); the producer state is the Log's own (:mod:`~logstore.log.producers`). The
node's election driver, leader side and fetchers all read and change it, always under its
``cond`` (a Condition whose lock serialises them), and call :meth:`PartitionReplica.changed`
after a change that a waiting request may wait for (the node's purgatory then answers the held
fetches and acks="all" produces that can be answered).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

from .quorum import Election

__all__ = ["PartitionReplica"]


@dataclass
class PartitionReplica:
    """One replicated partition on one node.

    Thread-safety: every field is read and written under ``cond`` (the Log and the Election
    are safe to read without it, but the decisions made from them are not).
    """

    topic: str
    partition: int
    log: Any
    election: Election
    #: when the election timer fires (monotonic)
    deadline: float = 0.0
    #: the high watermark this node knows
    hw: int = 0
    #: follower -> its log end offset as the leader learnt it in this epoch
    leo: dict[int, int] = field(default_factory=dict)
    #: follower -> its log start offset as its last fetch reported it (Kafka's replica
    #: logStartOffset: a DeleteRecords is answered once every follower in sync moved past it)
    starts: dict[int, int] = field(default_factory=dict)
    #: follower -> its last fetch (monotonic)
    contact: dict[int, float] = field(default_factory=dict)
    #: follower -> the last time it was at the leader's log end (monotonic)
    caught_up: dict[int, float] = field(default_factory=dict)
    #: follower -> (the leader's log end, the time) at its previous fetch: a fetch from at least
    #: that end means the follower was caught up then (Kafka's lastFetchLeaderLogEndOffset)
    fetch_marks: dict[int, tuple[int, float]] = field(default_factory=dict)
    #: the leader's log end when its epoch began: the high watermark only counts records past it
    epoch_start: int = 0
    #: when a leader last answered this follower (monotonic), and whether its connection to
    #: the leader was refused or dropped since: a pre-vote is granted only without a live leader
    leader_seen: float = 0.0
    leader_lost: bool = False
    cond: threading.Condition = field(default_factory=threading.Condition)
    #: called by :meth:`changed` (the node checks its purgatory for this partition)
    on_change: Callable[["PartitionReplica"], Any] | None = None

    @property
    def key(self) -> tuple[str, int]:
        """(topic, partition)."""
        return self.topic, self.partition

    def changed(self) -> None:
        """Wake what waits for this partition: threads waiting on ``cond`` and the node's
        delayed requests (the caller holds ``cond``, which is re-entrant)."""
        self.cond.notify_all()
        if self.on_change is not None:
            self.on_change(self)

    def in_sync_followers(self, followers: Iterable[int], now: float, lag_s: float) -> list[int]:
        """The followers in sync (Kafka's ISR less the leader): each caught up within the last
        ``lag_s`` seconds (replica.lag.time.max.ms) by Kafka's lastCaughtUpTime rule (a fetch
        from the leader's log end, or from where that end was at the follower's previous fetch,
        which counts from that previous fetch's time): a follower that stops fetching drops out
        even while the partition is idle, and one that keeps up under a steady load stays in.
        Meaningful on the leader only; the caller holds ``cond``."""
        return [p for p in followers if now - self.caught_up.get(p, -1e9) < lag_s]

