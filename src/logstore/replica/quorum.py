"""Leader election state of a replica node: the ``quorum-state`` file and the voting rules.

The rules are Raft's, as Kafka's KRaft applies them (KIP-595):

* Every node keeps ``(epoch, voted_for, leader)`` in ``<data dir>/quorum-state``, written
  atomically and fsynced *before* the node acts on it (votes, campaigns, leads), so that a node
  restarted after a crash can never vote twice in one epoch or lead an epoch it did not win.
* A candidate moves to ``epoch + 1``, votes for itself and asks the others. A voter grants at
  most one vote per epoch, and only to a candidate whose log is at least as up to date as its
  own: ``(last epoch, end offset)`` compared as a pair.
* A request or response from a higher epoch turns any node into a follower of that epoch.
* A candidate with votes from a majority of the voters (itself included) leads the epoch.

The file is JSON with Kafka's field names (``leaderId``, ``leaderEpoch``, ``votedId``,
``currentVoters``, ``data_version``); -1 means none.

Thread-safety: :class:`Election` is not thread-safe; the node serialises calls.
"""

from __future__ import annotations

import enum
import json
import logging
import os
import random
from dataclasses import dataclass, replace
from typing import Iterable

from .. import _fileio
from ..errors import LogstoreError

logger = logging.getLogger("logstore.replica.quorum")

__all__ = ["QuorumState", "QuorumStateFile", "Election", "Role", "QUORUM_STATE_FILE"]

QUORUM_STATE_FILE = "quorum-state"
NONE = -1


class Role(enum.Enum):
    """What a node is in its current epoch."""

    FOLLOWER = "follower"
    CANDIDATE = "candidate"
    LEADER = "leader"


#: epochs are int32 on the wire and a candidate needs epoch + 1
MAX_EPOCH = 2**31 - 1


@dataclass(frozen=True)
class QuorumState:
    """The persisted election state: epoch, whom this node voted for in it, and its leader."""

    epoch: int = 0
    voted_for: int = NONE
    leader: int = NONE


class QuorumStateFile:
    """Owner of ``quorum-state``. Durability: :meth:`save` returns once the file is fsynced."""

    def __init__(self, directory: str, voters: Iterable[int]) -> None:
        self.path = os.path.join(directory, QUORUM_STATE_FILE)
        self.voters = sorted(set(voters))

    def load(self) -> QuorumState:
        """The saved state, or a fresh one when there is no file.

        Raises:
            LogstoreError: the file is not a quorum state (a node must not guess its vote).
        """
        if not _fileio.ops.exists(self.path):
            return QuorumState()
        raw = _fileio.ops.read_file(self.path)
        try:
            data = json.loads(raw.decode("utf-8"))
            state = QuorumState(int(data["leaderEpoch"]), int(data["votedId"]), int(data["leaderId"]))
        except (ValueError, KeyError, TypeError, UnicodeDecodeError) as exc:
            raise LogstoreError(f"{self.path} is damaged ({exc}); restore it or remove it only if this "
                                "node's data directory is being rebuilt") from None
        if state.epoch < 0 or state.voted_for < NONE or state.leader < NONE:
            raise LogstoreError(f"{self.path}: negative epoch or node id in {state}")
        return state

    def save(self, state: QuorumState) -> None:
        """Replace the file with ``state`` durably (temp file, fsync, rename, directory fsync)."""
        data = {"clusterId": "", "leaderId": state.leader, "leaderEpoch": state.epoch,
                "votedId": state.voted_for, "appliedOffset": 0, "currentVoters": [{"voterId": v} for v in self.voters],
                "data_version": 0}
        _fileio.ops.write_file_atomic(self.path, json.dumps(data, sort_keys=True).encode())


class Election:
    """The voting state machine of node ``node_id`` among ``voters`` (node ids, itself included)."""

    def __init__(self, node_id: int, voters: Iterable[int], state_file: QuorumStateFile) -> None:
        self.node_id = node_id
        self.voters = sorted(set(voters))
        if node_id not in self.voters:
            raise ValueError(f"node {node_id} is not one of the voters {self.voters}")
        self._file = state_file
        self.state = state_file.load()
        self.role = Role.LEADER if self.state.leader == node_id else Role.FOLLOWER
        if self.role is Role.LEADER:
            # A restarted leader does not resume leading: it may have been deposed while down.
            self.role = Role.FOLLOWER
            self._persist(replace(self.state, leader=NONE))
        self._votes: set[int] = set()

    @property
    def epoch(self) -> int:
        """The current epoch."""
        return self.state.epoch

    @property
    def leader(self) -> int:
        """The current epoch's leader, or -1 when unknown."""
        return self.state.leader

    @property
    def granted_by(self) -> list[int]:
        """The voters (itself included) that granted this node's latest campaign."""
        return sorted(self._votes)

    @property
    def majority(self) -> int:
        """Votes needed to win: more than half of the voters."""
        return len(self.voters) // 2 + 1

    def _persist(self, state: QuorumState) -> None:
        self._file.save(state)  # durable before anyone hears of it
        self.state = state
        logger.debug("node %d: %s (role %s)", self.node_id, state, self.role.value)

    # ------------------------------------------------------------------ transitions
    def observe_epoch(self, epoch: int, leader: int = NONE) -> bool:
        """A message from ``epoch`` arrived (naming its leader when known). A higher epoch makes
        this node a follower of it; returns True when the state changed.

        Only winning a vote makes this node a leader: a message naming this node (or a node
        that is not a voter) as leader is taken as naming none, and an epoch that could not be
        followed by another (2^31 - 1 and up) is ignored."""
        if epoch >= MAX_EPOCH:
            logger.warning("node %d: ignoring epoch %d from a peer (beyond %d)", self.node_id, epoch, MAX_EPOCH - 1)
            return False
        if leader == self.node_id or leader not in self.voters:
            leader = NONE
        if epoch > self.state.epoch:
            self._persist(QuorumState(epoch, NONE, leader))
            self.role = Role.FOLLOWER
            self._votes = set()
            return True
        if epoch == self.state.epoch and leader != NONE and self.state.leader == NONE:
            if self.role is Role.LEADER and leader != self.node_id:
                raise LogstoreError(f"two leaders in epoch {epoch}: {self.node_id} and {leader}")
            self._persist(replace(self.state, leader=leader))
            self.role = Role.LEADER if leader == self.node_id else Role.FOLLOWER
            return True
        return False

    def start_campaign(self) -> QuorumState:
        """Become a candidate of the next epoch, voting for itself (persisted first)."""
        self._persist(QuorumState(self.state.epoch + 1, self.node_id, NONE))
        self.role = Role.CANDIDATE
        self._votes = {self.node_id}
        if len(self._votes) >= self.majority:  # a single-voter set
            self._become_leader()
        return self.state

    def on_vote_request(self, epoch: int, candidate: int, last_epoch: int, end_offset: int,
                        my_last_epoch: int, my_end_offset: int) -> tuple[bool, int]:
        """Decide a vote; returns (granted, this node's epoch afterwards). The vote is persisted
        before this returns, so it is never given twice in one epoch."""
        if candidate not in self.voters or candidate == self.node_id:
            return False, self.state.epoch
        if epoch < self.state.epoch or epoch >= MAX_EPOCH:
            return False, self.state.epoch
        self.observe_epoch(epoch)
        if self.state.voted_for not in (NONE, candidate) or self.state.leader not in (NONE, candidate):
            return False, self.state.epoch
        if (last_epoch, end_offset) < (my_last_epoch, my_end_offset):
            return False, self.state.epoch
        if self.state.voted_for != candidate:
            self._persist(replace(self.state, voted_for=candidate))
        return True, self.state.epoch

    def would_grant_pre_vote(self, epoch: int, candidate: int, last_epoch: int, end_offset: int,
                             my_last_epoch: int, my_end_offset: int) -> bool:
        """Pre-vote (Raft §9.6, Kafka's KIP-996): would a vote for ``candidate`` in the epoch it
        proposes be granted on the log alone? Nothing is persisted and no epoch changes; the
        caller also refuses while it still hears from a leader."""
        if candidate not in self.voters or candidate == self.node_id or not self.state.epoch < epoch < MAX_EPOCH:
            return False
        return (last_epoch, end_offset) >= (my_last_epoch, my_end_offset)

    def on_vote_response(self, epoch: int, voter: int, granted: bool) -> bool:
        """Count a vote for the current campaign; returns True when this node became leader."""
        if epoch > self.state.epoch:
            self.observe_epoch(epoch)
            return False
        if self.role is not Role.CANDIDATE or epoch != self.state.epoch or not granted or voter not in self.voters:
            return False
        self._votes.add(voter)
        if len(self._votes) >= self.majority:
            self._become_leader()
            return True
        return False

    def _become_leader(self) -> None:
        self._persist(replace(self.state, leader=self.node_id))
        self.role = Role.LEADER

    def step_down(self) -> None:
        """Stop leading (lost contact with a majority); the epoch stays, a new one elects."""
        if self.role is not Role.FOLLOWER:
            self.role = Role.FOLLOWER
        if self.state.leader == self.node_id:
            self._persist(replace(self.state, leader=NONE))

    @staticmethod
    def election_timeout(base_s: float, rng: random.Random | None = None) -> float:
        """A randomised election timeout in [base, 2 * base), as Raft prescribes."""
        return (rng or random).uniform(base_s, 2 * base_s)
