"""Election driving of a replica node: timers, pre-vote, campaigns, Vote and BeginQuorumEpoch.

:mod:`~logstore.replica.quorum` holds the pure Raft rules (KIP-595) and the persisted
``quorum-state``; this module runs them over the network for each partition of a replica node:

* the node's tick thread calls :meth:`ElectionDriver.tick` for every partition: a leader that
  no longer hears from a majority steps down; a follower whose election timer fired first asks
  its peers whether a live leader of a newer epoch exists, then campaigns;
* a campaign is preceded by a pre-vote (nothing persisted anywhere), so that a node that was cut
  off, or restarted, cannot depose a leader the others still hear from;
* every peer is asked at once (one thread each), so that a dead peer delays nothing;
* the votes (Kafka's Vote v2, whose ``pre_vote`` flag marks a pre-vote: KIP-996) and
  BeginQuorumEpoch announcements of other nodes are answered here (their Kafka requests are
  read and written by :mod:`~logstore.replica.peerapis`);
* the election timers are this module's: a won election hands the partition to the leader's
  side (:meth:`~logstore.replica.leader.LeaderSide.become_leader`), and the follower's fetcher
  reports here when its leader answered or went away.

Thread-safety: every method may be called from any thread; each partition's state is changed
under its ``cond``.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from typing import Any, Callable

from .quorum import NONE, Election, Role
from ..errors import LogstoreError
from .partition import PartitionReplica
from .client import BEGIN_QUORUM_EPOCH, METADATA, VOTE, metadata_request
from .context import NodeContext
from .leader import LeaderSide

__all__ = ["ElectionDriver"]

logger = logging.getLogger("logstore.replication")


class ElectionDriver:
    """Drives the elections of every partition of a node (its settings are read from
    ``context`` at each use); an election won makes ``leader`` take up the epoch. Owns the
    random source of the election timers. Thread-safe."""

    def __init__(self, context: NodeContext, leader: LeaderSide) -> None:
        self._context = context
        self._leader = leader
        self._rng = random.Random()
        self._foreign_clusters: set[str | None] = set()  # other clusters' ids seen in peers' answers (logged once)

    # ------------------------------------------------------------------ timers
    def next_deadline(self, now: float | None = None) -> float:
        """When an election timer set now fires: after a random election timeout."""
        return (time.monotonic() if now is None else now) + Election.election_timeout(
            self._context.election_timeout_s, self._rng)

    def heard_from_leader(self, rep: PartitionReplica) -> None:
        """The leader answered this follower: its election timer starts again, and a pre-vote
        is refused while the leader stays live (caller holds rep.cond)."""
        rep.deadline = self.next_deadline()
        rep.leader_seen = time.monotonic()
        rep.leader_lost = False

    def leader_gone(self, rep: PartitionReplica, leader: int) -> None:
        """The leader refused or dropped our connection: its process is most likely gone (a
        partition or a pause shows as a timeout instead). Campaign within a random fraction of
        the election timeout rather than waiting all of it out."""
        with rep.cond:
            if rep.election.role is Role.FOLLOWER and rep.election.leader == leader:
                rep.leader_lost = True
                soon = time.monotonic() + self._rng.uniform(0.0, self._context.election_timeout_s / 2)
                rep.deadline = min(rep.deadline, soon)

    def tick(self, rep: PartitionReplica, now: float) -> None:
        """One step of ``rep``'s election timer (called every tick by the node's tick thread):
        a leader checks its majority; a follower whose timer fired looks for a leader, then
        campaigns. Never raises: a failed step is logged and retried after a timeout."""
        context = self._context
        try:
            if rep.election.role is Role.LEADER:
                self.check_leadership(rep, now)
            elif now >= rep.deadline:
                if rep.election.leader == NONE and self.discover_leader(rep):
                    with rep.cond:
                        rep.deadline = self.next_deadline(now)
                    return
                self.campaign(rep)
        except LogstoreError as exc:
            logger.warning("node %d: %s-%d: %s", context.node_id, rep.topic, rep.partition, exc)
        except Exception:  # noqa: BLE001 - e.g. an OSError persisting the election state
            logger.exception("node %d: %s-%d: election step failed; retrying after a timeout",
                             context.node_id, rep.topic, rep.partition)
            with rep.cond:
                rep.deadline = self.next_deadline()

    def check_leadership(self, rep: PartitionReplica, now: float) -> None:
        """A leader that has not heard from a majority within the election timeout steps down."""
        context = self._context
        heard = 1 + sum(1 for p in context.peers if now - rep.contact.get(p, 0) < 2 * context.election_timeout_s)
        if heard < rep.election.majority:
            with rep.cond:
                rep.election.step_down()
                rep.deadline = self.next_deadline(now)
                rep.changed()
            logger.info("node %d steps down from %s-%d (epoch %d): lost its majority", context.node_id,
                        rep.topic, rep.partition, rep.election.epoch)

    def discover_leader(self, rep: PartitionReplica) -> bool:
        """A node that does not know the leader (it restarted, or missed BeginQuorumEpoch) first asks
        its peers: following a live leader of a newer epoch beats starting an election that would
        depose it. A peer whose answer names another cluster id is not followed. Returns True when
        it found one."""
        context = self._context
        for peer in context.peers:
            try:
                answer = context.peer_connections.request(peer, METADATA, metadata_request([rep.topic]),
                                                          timeout=context.election_timeout_s / 4)
            except (OSError, LogstoreError):
                continue
            cluster = getattr(answer, "cluster_id", None)
            if cluster != context.cluster_id:  # a node of another cluster: never followed
                if cluster not in self._foreign_clusters:
                    self._foreign_clusters.add(cluster)
                    logger.error("node %d: node %d belongs to cluster %r, this node to %r: not followed "
                                 "(INCONSISTENT_CLUSTER_ID)", context.node_id, peer, cluster, context.cluster_id)
                continue
            for t in answer.topics:
                for p in t.partitions:
                    leader, epoch = int(p.leader_id), int(p.leader_epoch)
                    if ((t.name, p.partition_index) != (rep.topic, rep.partition)
                            or leader in (-1, NONE, context.node_id)):
                        continue
                    if epoch > rep.election.epoch or (epoch == rep.election.epoch and rep.election.leader == NONE):
                        with rep.cond:
                            rep.election.observe_epoch(epoch, leader)
                        return rep.election.leader == leader
        return False

    # ------------------------------------------------------------------ campaigns
    def campaign(self, rep: PartitionReplica) -> None:
        """Start an election if the deadline is still due (a vote granted or a leader heard from
        meanwhile pushes it back: the check and the campaign's start are one step under the
        partition's lock), then ask every peer at once, so that a dead peer delays nothing."""
        context = self._context
        with rep.cond:
            now = time.monotonic()
            if now < rep.deadline or rep.election.role is Role.LEADER:
                return
            rep.deadline = token = self.next_deadline(now)
            base_epoch = rep.election.epoch
        if len(context.voters) > 1 and not self.pre_vote(rep, base_epoch + 1):
            return
        with rep.cond:
            # Still due? A vote granted or a leader heard from meanwhile moved the deadline.
            if rep.deadline != token or rep.election.epoch != base_epoch or rep.election.role is Role.LEADER:
                return
            state = rep.election.start_campaign()
            if rep.election.role is Role.LEADER:  # a single-voter set
                self.lead_or_step_down(rep)
                return
            last_epoch, end = rep.log.latest_epoch, rep.log.log_end_offset
        payload = self._vote_request(rep, state.epoch, last_epoch, end, pre_vote=False)
        won = threading.Event()

        def count(peer: int, epoch: int, granted: bool) -> None:
            try:
                with rep.cond:
                    if rep.election.epoch == state.epoch and rep.election.on_vote_response(epoch, peer, bool(granted)):
                        self.lead_or_step_down(rep)
                        if rep.election.role is Role.LEADER:
                            won.set()
                    elif epoch > state.epoch:
                        rep.election.observe_epoch(epoch)
            except Exception:  # noqa: BLE001 - a vote thread must not die silently
                logger.exception("node %d: %s-%d: counting the vote of %d failed", context.node_id,
                                 rep.topic, rep.partition, peer)

        self._vote_round(payload, count)
        if won.is_set():
            self.announce(rep)

    def pre_vote(self, rep: PartitionReplica, epoch: int) -> bool:
        """Ask every peer at once whether it would vote for this node in ``epoch`` (nothing is
        persisted by anyone). Only with a majority does the real campaign start, so a node that
        was cut off, or restarted, cannot depose a leader the others still hear from."""
        context = self._context
        with rep.cond:
            last_epoch, end = rep.log.latest_epoch, rep.log.log_end_offset
        payload = self._vote_request(rep, epoch, last_epoch, end, pre_vote=True)
        grants = [context.node_id]
        lock = threading.Lock()

        def count(peer: int, their_epoch: int, granted: bool) -> None:
            if granted:
                with lock:
                    grants.append(peer)
            elif their_epoch >= epoch:
                with rep.cond:
                    rep.election.observe_epoch(their_epoch)

        self._vote_round(payload, count)
        if len(grants) < rep.election.majority:
            logger.debug("node %d: pre-vote for %s-%d epoch %d: %d of %d", context.node_id, rep.topic,
                         rep.partition, epoch, len(grants), len(context.voters))
            return False
        return True

    def _vote_request(self, rep: PartitionReplica, epoch: int, last_epoch: int, end: int,
                      pre_vote: bool) -> dict[str, Any]:
        """A Vote request's fields (KIP-595; ``pre_vote``: KIP-996)."""
        context = self._context
        return {"cluster_id": context.cluster_id, "voter_id": -1, "topics": [
            {"topic_name": rep.topic, "partitions": [
                {"partition_index": rep.partition, "replica_epoch": epoch, "replica_id": context.node_id,
                 "replica_directory_id": None, "voter_directory_id": None, "last_offset_epoch": last_epoch,
                 "last_offset": end, "pre_vote": pre_vote}]}]}

    def _vote_round(self, fields: dict[str, Any], on_answer: Callable[[int, int, bool], None]) -> None:
        """Send the Vote request ``fields`` to every peer at once and call on_answer(peer, its
        epoch, granted) for each answer (on the asking thread); a peer that does not answer
        within half an election timeout is left out."""
        context = self._context

        def ask(peer: int) -> None:
            try:
                answer = context.peer_connections.request(peer, VOTE, {**fields, "voter_id": peer},
                                                          timeout=context.election_timeout_s / 2)
                if answer.error_code:
                    logger.warning("node %d: node %d refused a vote request: error %d", context.node_id, peer,
                                   int(answer.error_code))
                    return
                p = answer.topics[0].partitions[0]
                if p.error_code:
                    return
                epoch, granted = int(p.leader_epoch), bool(p.vote_granted)
            except (OSError, LogstoreError, IndexError):
                return
            on_answer(peer, epoch, granted)

        self.each_peer_at_once(ask)

    def lead_or_step_down(self, rep: PartitionReplica) -> None:
        """Set up leadership of the epoch just won; if that fails (a full disk when writing
        the epoch checkpoint or the leader change record), give the epoch up at once rather
        than lead without an epoch stamp and a record of its own (caller holds rep.cond)."""
        context = self._context
        try:
            self._leader.become_leader(rep)
        except Exception:
            logger.exception("node %d: could not take up leadership of %s-%d in epoch %d; stepping down",
                             context.node_id, rep.topic, rep.partition, rep.election.epoch)
            rep.election.step_down()
            rep.deadline = self.next_deadline()
            rep.changed()

    def announce(self, rep: PartitionReplica) -> None:
        """Tell every peer at once (a dead peer delays nothing) that this node leads the epoch."""
        context = self._context
        fields = {"cluster_id": context.cluster_id, "voter_id": -1, "topics": [
            {"topic_name": rep.topic, "partitions": [
                {"partition_index": rep.partition, "voter_directory_id": None, "leader_id": context.node_id,
                 "leader_epoch": rep.election.epoch}]}], "leader_endpoints": []}

        def tell(peer: int) -> None:
            try:
                context.peer_connections.request(peer, BEGIN_QUORUM_EPOCH, {**fields, "voter_id": peer},
                                                 timeout=context.election_timeout_s / 2)
            except (OSError, LogstoreError):
                pass

        self.each_peer_at_once(tell)

    def each_peer_at_once(self, call: Callable[[int], Any]) -> None:
        """Run call(peer) for every peer in parallel threads and wait for all (each call bounds
        its own wait), so that one dead peer delays nothing."""
        threads = [threading.Thread(target=call, args=(peer,), daemon=True) for peer in self._context.peers]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    # ------------------------------------------------------------------ requests of other nodes
    def on_vote(self, rep: PartitionReplica, epoch: int, candidate: int, last_epoch: int, end: int,
                pre_vote: bool) -> tuple[int, bool, int]:
        """Answer a vote request (a pre-vote, or a vote that may be persisted): (this node's
        epoch, granted, the leader it knows)."""
        context = self._context
        if candidate not in context.peers:
            with rep.cond:
                return rep.election.epoch, False, rep.election.leader
        if pre_vote:
            with rep.cond:
                election = rep.election
                alive = election.role is Role.LEADER or (
                    election.leader != NONE and not rep.leader_lost
                    and time.monotonic() - rep.leader_seen < context.election_timeout_s)
                granted = not alive and election.would_grant_pre_vote(
                    epoch, candidate, last_epoch, end, rep.log.latest_epoch, rep.log.log_end_offset)
                return election.epoch, granted, election.leader
        with rep.cond:
            was_leader = rep.election.role is Role.LEADER
            granted, now_epoch = rep.election.on_vote_request(epoch, candidate, last_epoch, end,
                                                              rep.log.latest_epoch, rep.log.log_end_offset)
            if was_leader and rep.election.role is not Role.LEADER:
                rep.changed()
            if granted:
                rep.deadline = self.next_deadline()
            return now_epoch, bool(granted), rep.election.leader

    def on_begin_epoch(self, rep: PartitionReplica, epoch: int, leader: int) -> tuple[int, int]:
        """Answer BeginQuorumEpoch: a leader announces the epoch it won. Returns (this node's
        epoch, the leader it knows)."""
        if leader not in self._context.peers:
            with rep.cond:
                return rep.election.epoch, rep.election.leader
        with rep.cond:
            rep.election.observe_epoch(epoch, leader)
            if rep.election.epoch == epoch and rep.election.leader == leader:
                rep.leader_seen = time.monotonic()
                rep.leader_lost = False
            rep.deadline = self.next_deadline()
            rep.changed()
            return rep.election.epoch, rep.election.leader
