"""A replicated partition as a coordinator's log: :class:`ReplicatedLog`.

The group coordinator keeps its offsets and groups in ``__consumer_offsets`` and the transaction
coordinator its state in ``__transaction_state``; on a replica set each of them is the leader of
that topic's one partition, and both write their records as the leader's produce does: appended
to the leader's log, then held until the high watermark passed them (acks=all), so a record a
coordinator acted on survives the loss of any minority. :class:`ReplicatedLog` gives them that
log, with the shape of :class:`~logstore.log.log.Log` they use (``log_start_offset``,
``log_end_offset``, ``read``, ``read_raw``, ``append_batch``, ``flush``), for one leadership
epoch: once the node no longer leads in that epoch, every write fails.

Durability: ``append_batch`` puts the records in the leader's log; ``flush`` returns once a
majority holds the calling thread's last append (NotLeaderOrFollowerError when the leadership
was lost first, RequestTimedOutError after ``timeout_s``, which also marks the log
``uncertain``: the record may still commit after its writer gave it up, so a coordinator whose
memory follows its writes must be loaded again from the log).

Thread-safety: thread-safe; an append takes the partition's lock inside the node's purgatory's
deferred block, as a client's produce does; each thread's flush waits for its own last append.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from ..errors import NotLeaderOrFollowerError, RequestTimedOutError
from .context import NodeContext
from .leader import LeaderSide
from .partition import PartitionReplica
from .quorum import Role

__all__ = ["ReplicatedLog", "WRITE_TIMEOUT_S"]

#: how long a coordinator's write waits for the majority by default
WRITE_TIMEOUT_S = 10.0


class ReplicatedLog:
    """The leader's log of ``rep`` in leadership ``epoch``, written as acks=all (see the module
    docstring). Thread-safe.

    Args:
        context: the node's context (its stop flag and purgatory).
        leader: the node's leader side (moves the high watermark).
        rep: the replicated partition.
        epoch: the leadership epoch the writes belong to.
        timeout_s: how long :meth:`flush` waits for the majority.
    """

    def __init__(self, context: NodeContext, leader: LeaderSide, rep: PartitionReplica, epoch: int,
                 timeout_s: float = WRITE_TIMEOUT_S) -> None:
        self.context = context
        self.leader = leader
        self.rep = rep
        self.epoch = epoch
        self.timeout_s = timeout_s
        #: a write timed out waiting for the majority: it may still commit (see the module docstring)
        self.uncertain = False
        self._pending = threading.local()  # each thread's last append, for its flush

    @property
    def log_start_offset(self) -> int:
        return self.rep.log.log_start_offset  # type: ignore[no-any-return]

    @property
    def log_end_offset(self) -> int:
        return self.rep.log.log_end_offset  # type: ignore[no-any-return]

    def read(self, offset: int, **kwargs: Any) -> Any:
        """The leader's records from ``offset`` (Log.read's arguments)."""
        return self.rep.log.read(offset, **kwargs)

    def read_raw(self, offset: int, max_bytes: int) -> bytes:
        """The leader's batches from ``offset`` as stored (Log.read_raw)."""
        return self.rep.log.read_raw(offset, max_bytes)  # type: ignore[no-any-return]

    def leading(self) -> bool:
        """Whether this node still leads the partition in this log's epoch (and is not stopping)."""
        election = self.rep.election
        return election.role is Role.LEADER and election.epoch == self.epoch and not self.context.stopping.is_set()

    def _where(self) -> str:
        return f"{self.rep.topic}-{self.rep.partition}"

    def append_batch(self, values: list[bytes | None], keys: list[bytes | None], **fields: Any) -> None:
        """Append one batch as the leader (``fields``: Log.append_batch's, e.g. a transactional
        commit's producer fields); :meth:`flush` then waits for the majority.

        Raises:
            NotLeaderOrFollowerError: this node no longer leads in this epoch; nothing was written.
            LogstoreError, OSError: what the log raises.
        """
        rep = self.rep
        with self.context.purgatory.deferred(), rep.cond:
            if not self.leading():
                raise NotLeaderOrFollowerError(f"node {self.context.node_id} no longer leads {self._where()} "
                                               f"in epoch {self.epoch}")
            rep.log.append_batch(values, keys, **fields)
            self._pending.last = rep.log.log_end_offset - 1
            self.leader.advance_hw(rep)  # a set of one commits on its own append
            rep.changed()  # answer the followers' held fetches

    def flush(self) -> None:
        """Wait until this thread's last append is below the high watermark: held by a majority,
        durable as acks=all.

        Raises:
            NotLeaderOrFollowerError: the leadership was lost first (the record may be lost).
            RequestTimedOutError: no majority took it within ``timeout_s`` (it may still commit;
                the log is marked :attr:`uncertain`).
        """
        last = getattr(self._pending, "last", None)
        if last is None:
            return
        self._pending.last = None
        rep = self.rep
        deadline = time.monotonic() + self.timeout_s
        with rep.cond:
            while True:
                # Role and epoch first: a node deposed meanwhile may have learnt a high watermark
                # past `last` from the new leader, for records that replaced ours.
                if not self.leading():
                    raise NotLeaderOrFollowerError(f"node {self.context.node_id} lost the leadership of "
                                                   f"{self._where()} before its write at {last} was replicated")
                if rep.hw > last:
                    return
                left = deadline - time.monotonic()
                if left <= 0:
                    self.uncertain = True
                    raise RequestTimedOutError(f"the {self._where()} write at {last} was not replicated to a "
                                               f"majority within {self.timeout_s:g} s")
                rep.cond.wait(min(left, 0.1))
