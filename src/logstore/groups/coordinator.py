"""Kafka's classic consumer-group protocol: a group coordinator over the store's committed offsets.

A group moves through Kafka's states (GroupCoordinator's): *Empty* (no members), then
*PreparingRebalance* while the members (re)join, *CompletingRebalance* once every member has
joined and the leader computes the assignment, *Stable* once the leader's SyncGroup delivered it.
The rules, as Kafka's:

- JoinGroup: a member without an id gets one; from version 4 it is first handed back with
  MEMBER_ID_REQUIRED (KIP-394) and joins with it. The join completes when every member has
  rejoined (or when the rebalance timeout passes: those that did not are removed), with a new
  generation, the protocol every member supports that most members prefer, and a leader, which
  alone receives the members' metadata. A leader's rejoin, or a member's with new metadata,
  starts a rebalance; a follower's unchanged rejoin gets the current generation.
- SyncGroup: the leader's assignment is handed to every member; a member that does not ask for
  it within the rebalance timeout is removed.
- Heartbeat: a member that sends none within its session timeout (and is not waiting in a join
  or sync) is removed and the group rebalances; the answer says REBALANCE_IN_PROGRESS while the
  group prepares one.
- Fencing: an unknown member gets UNKNOWN_MEMBER_ID, a stale generation ILLEGAL_GENERATION, a
  replaced static member (``group.instance.id``) FENCED_INSTANCE_ID.
- OffsetCommit/OffsetFetch read and write the same ``__consumer_offsets`` records as the library's
  consumers (:mod:`logstore.groups.offsets`), so Kafka clients, ``store.consumer`` and ``logstore stats``
  agree on a group's offsets. A commit from a member of a stale generation is refused; a commit
  with generation -1 (assign-only consumers, admin tools) is accepted while the group has no
  members. A commit returns after its batch is fsynced.

Durability: offsets are durable, and so is membership, as in Kafka: each stable generation, each
member's removal (it left, or its session ended) and a group becoming empty are written to
``__consumer_offsets`` as a group metadata record (:mod:`~logstore.groups.metadata`): a stable
generation fsynced before the leader's SyncGroup is answered (if it cannot be written, the sync
fails and the group rebalances), removals and emptying written without waiting (timers make
them). A coordinator that starts over the same store (a restart,
or another process taking over the store's group lock) loads every group at its last generation
with its members, and, unlike Kafka, starts a rebalance at once: the live members learn it from
their next heartbeat and join again (their commits of the old generation are still accepted
meanwhile), so a removal or a rebalance that the old coordinator had under way is never lost,
and a member that died with it is dropped when the rebalance timeout passes without its join.

A group of protocol type ``consumer`` may be handed over to the KIP-848 coordinator
(:meth:`GroupCoordinator.hand_over`: Kafka's online upgrade) and taken back from it
(:meth:`GroupCoordinator.adopt`: the online downgrade, which rebalances at once).

Timers (session, rebalance and pending-member timeouts) are watches in the server's
:class:`~logstore.net.purgatory.Purgatory`; no thread waits per group or member.

Thread-safety: every method may be called from any thread; each group has its own lock, and the
answers a call completes are completed after that lock is released.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import uuid
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, Sequence

from ..errors import LogstoreError
from ..errorcodes import ErrorCode
from .consumerprotocol import subscribed_topics
from .metadata import GroupMember, GroupMetadata, encode_group_key
from .offsets import OffsetStore
from ..net.purgatory import Purgatory

__all__ = ["GroupConfig", "GroupCoordinator", "listed_by", "EMPTY", "PREPARING_REBALANCE", "COMPLETING_REBALANCE", "STABLE", "DEAD",
           "CLASSIC"]

logger = logging.getLogger("logstore.kafka.groups")

EMPTY = "Empty"
PREPARING_REBALANCE = "PreparingRebalance"
COMPLETING_REBALANCE = "CompletingRebalance"
STABLE = "Stable"
#: a deleted group (DeleteGroups): whoever still holds it finds it gone
DEAD = "Dead"
#: ListGroups' type of the groups of this protocol (KIP-848 names its own "consumer")
CLASSIC = "classic"


#: Kafka's offset.metadata.max.bytes.
MAX_METADATA_BYTES = 4096

#: (future, answer) pairs to complete once a group's lock is released.
Done = list[tuple[Future, Any]]
#: A joining member's client id, client host, session and rebalance timeouts (ms), protocols.
_MemberArgs = tuple[str, str, int, int, list[tuple[str, bytes]]]


def _complete(done: Done) -> None:
    for future, answer in done:
        if not future.done():
            future.set_result(answer)


def _join_error(error: int, member_id: str = "") -> dict[str, Any]:
    return {"throttle_time": 0, "error_code": error, "generation_id": -1, "protocol_type": None,
            "protocol_name": "", "leader": "", "skip_assignment": False, "member_id": member_id, "members": []}


def _sync_answer(error: int, assignment: bytes = b"", protocol_type: str | None = None,
                 protocol: str | None = None) -> dict[str, Any]:
    return {"throttle_time": 0, "error_code": error, "protocol_type": protocol_type, "protocol_name": protocol,
            "assignment": assignment}


class _Member:
    __slots__ = ("member_id", "instance_id", "client_id", "client_host", "session_ms", "rebalance_ms", "protocols",
                 "join", "sync", "assignment", "deadline", "watched")

    def __init__(self, member_id: str, instance_id: str | None, client_id: str, client_host: str,
                 session_ms: int, rebalance_ms: int, protocols: list[tuple[str, bytes]]) -> None:
        self.member_id = member_id
        self.instance_id = instance_id
        self.client_id = client_id
        self.client_host = client_host
        self.session_ms = session_ms
        self.rebalance_ms = rebalance_ms
        self.protocols = protocols
        self.join: Future | None = None  # a JoinGroup waiting for the join to complete
        self.sync: Future | None = None  # a SyncGroup waiting for the leader's assignment
        self.assignment = b""
        self.deadline = 0.0  # the session ends unless a heartbeat comes first (monotonic)
        self.watched = False  # a session watch is registered

    def metadata(self, protocol: str) -> bytes:
        return next(meta for name, meta in self.protocols if name == protocol)

    def names(self) -> list[str]:
        return [name for name, _ in self.protocols]


class _Group:
    """One group's state (see the module docstring); guarded by ``lock``."""

    def __init__(self, group_id: str) -> None:
        self.group_id = group_id
        self.lock = threading.RLock()
        self.state = EMPTY
        self.generation = 0
        self.protocol_type: str | None = None
        self.protocol: str | None = None
        self.leader: str | None = None
        self.members: dict[str, _Member] = {}  # in join order
        self.pending: set[str] = set()  # ids handed out with MEMBER_ID_REQUIRED, not joined yet
        self.static: dict[str, str] = {}  # group.instance.id -> member id
        self.pending_sync: set[str] = set()
        self.round = 0  # bumped by every rebalance: a join timer of an older round does nothing
        self.join_not_before = 0.0
        self.join_deadline = 0.0

    def group_type(self) -> str:
        """The group's type as ListGroups v5 and DescribeGroups name it: the one place a group
        says which protocol it speaks (KIP-848's groups are "consumer")."""
        return CLASSIC

    def rebalance_timeout_s(self) -> float:
        return max((m.rebalance_ms for m in self.members.values()), default=0) / 1000.0

    def all_joined(self) -> bool:
        return not self.pending and all(m.join is not None for m in self.members.values())

    def supports(self, protocol_type: str, names: Sequence[str]) -> bool:
        if not self.members:
            return bool(protocol_type) and bool(names)
        return protocol_type == self.protocol_type and any(
            all(name in m.names() for m in self.members.values()) for name in names)

    def select_protocol(self) -> str:
        """The protocol every member supports that most members list first (Kafka's vote)."""
        members = list(self.members.values())
        common = [n for n in members[0].names() if all(n in m.names() for m in members)]
        votes = {name: 0 for name in common}
        for m in members:
            votes[next(n for n in m.names() if n in votes)] += 1
        return max(common, key=lambda n: votes[n])


def listed_by(state: str, group_type: str, states: Iterable[str], types: Iterable[str]) -> bool:
    """Whether ListGroups' filters keep a group in ``state`` of ``group_type``: ``states`` and
    ``types``, when not empty, keep only the groups in one of them, compared ignoring case (as
    Kafka's ListGroups v4 and v5 filters)."""
    wanted_states = {s.lower() for s in states}
    wanted_types = {t.lower() for t in types}
    return (not wanted_states or state.lower() in wanted_states) and (not wanted_types or group_type.lower() in wanted_types)


def delete_unsubscribed_offsets(offsets: OffsetStore, group_id: str, partitions: Iterable[tuple[str, int]],
                                partition_exists: Callable[[str, int], bool], subscribed: set[str] | None
                                ) -> tuple[int, list[int]]:
    """OffsetDelete's rule for a group of either protocol, its lock held: (the group's error,
    an error per partition): a partition of no topic here is UNKNOWN_TOPIC_OR_PARTITION, one of
    a topic in ``subscribed`` (None: every topic) GROUP_SUBSCRIBED_TO_TOPIC, and the others'
    offsets are deleted, the tombstones fsynced (COORDINATOR_NOT_AVAILABLE if they cannot be)."""
    errors: list[int] = []
    doomed = []
    for topic, partition in partitions:
        if not partition_exists(topic, partition):
            errors.append(ErrorCode.unknown_topic_or_partition)
        elif subscribed is None or topic in subscribed:
            errors.append(ErrorCode.group_subscribed_to_topic)
        else:
            doomed.append((topic, partition))
            errors.append(ErrorCode.none)
    try:
        offsets.delete(group_id, doomed, durable=True)
    except (LogstoreError, OSError, ValueError) as exc:
        logger.error("group %s: offsets could not be deleted: %s", group_id, exc)
        return ErrorCode.coordinator_not_available, []
    return ErrorCode.none, errors


@dataclass(frozen=True)
class GroupConfig:
    """The coordinator's settings, as Kafka's broker settings of the same names.

    Attributes:
        min_session_timeout_ms, max_session_timeout_ms: ``group.min.session.timeout.ms`` and
            ``group.max.session.timeout.ms``: the session timeouts a member may ask for.
        initial_rebalance_delay_ms: ``group.initial.rebalance.delay.ms``: how long the first
            rebalance of an empty group waits for more members (0 here, as test brokers set it;
            Kafka's default is 3000).
    """

    min_session_timeout_ms: int = 6000
    max_session_timeout_ms: int = 1_800_000
    initial_rebalance_delay_ms: int = 0
    #: ``liveness(client_id)``: False when the member's process is known to be gone (the store's
    #: own coordinator asks the member's lock file, see :mod:`logstore.client.groupservice`); a rebalance
    #: then does not wait for that member's join. None: no such knowledge (Kafka's rules only).
    liveness: Callable[[str], bool] | None = None


class GroupCoordinator:
    """The coordinator of every consumer group of one server.

    Args:
        offsets: the store's committed offsets (``__consumer_offsets``).
        purgatory: the server's purgatory (its timer runs the group timeouts).
        partition_exists: ``(topic, partition) -> bool``, for commits.
        config: timeouts and delays (:class:`GroupConfig`).
    """

    def __init__(self, offsets: OffsetStore, purgatory: Purgatory, partition_exists: Callable[[str, int], bool],
                 config: GroupConfig = GroupConfig()) -> None:
        self.offsets = offsets
        self.purgatory = purgatory
        self.partition_exists = partition_exists
        self.initial_delay_s = config.initial_rebalance_delay_ms / 1000.0
        self.min_session_ms = config.min_session_timeout_ms
        self.max_session_ms = config.max_session_timeout_ms
        self.liveness = config.liveness
        #: ``(group, member id, generation or member epoch, instance id) -> error code or None``:
        #: the committers of a group another protocol coordinates (KIP-848's consumer groups,
        #: :meth:`~logstore.groups.consumergroup.ConsumerGroupCoordinator.check_commit`) are
        #: checked by it; None: not such a group, the classic rules apply. Set by the owner.
        self.committer_check: Callable[[str, str, int, str | None], int | None] | None = None
        self._groups: dict[str, _Group] = {}
        self._lock = threading.Lock()
        self._load()

    def _load(self) -> None:
        """Take up every group's last stored generation (see the module docstring)."""
        for group_id, stored in self.offsets.group_metadata().items():
            if stored.members:
                self._take_up(group_id, stored, "a new coordinator took the group over")

    def _take_up(self, group_id: str, stored: GroupMetadata, why: str) -> None:
        """Make ``group_id`` a group at ``stored``'s generation and members, and start a rebalance."""
        group = _Group(group_id)
        group.state = STABLE
        group.generation = stored.generation
        group.protocol_type = stored.protocol_type
        group.protocol = stored.protocol or ""
        group.leader = stored.leader if stored.leader in {m.member_id for m in stored.members} else None
        for m in stored.members:
            rebalance_ms = m.rebalance_timeout_ms if m.rebalance_timeout_ms >= 0 else m.session_timeout_ms
            member = _Member(m.member_id, m.group_instance_id, m.client_id, m.client_host, m.session_timeout_ms,
                             rebalance_ms, [(group.protocol, m.subscription)])
            member.assignment = m.assignment
            group.members[m.member_id] = member
            if m.group_instance_id is not None:
                group.static[m.group_instance_id] = m.member_id
            self._touch(group, member)
        if group.leader is None:
            group.leader = next(iter(group.members))
        with self._lock:
            old = self._groups.get(group_id)
            if old is not None:
                old.state = DEAD
            self._groups[group_id] = group
        logger.info("group %s: taken up at generation %d with %d members (%s)", group_id, group.generation,
                    len(group.members), why)
        done: Done = []
        with group.lock:
            self._prepare_rebalance(group, why, done)
        _complete(done)

    # ------------------------------------------------------------------ conversions (KIP-848 mixed groups)
    def adopt(self, group_id: str, stored: GroupMetadata) -> None:
        """Take up a group another protocol's coordinator hands over (a KIP-848 consumer group
        whose last member of the consumer protocol left: Kafka's online downgrade), at
        ``stored``'s generation and members, and start a rebalance. ``stored`` is already
        written (with the other coordinator's tombstones, in one batch). Thread-safe."""
        self._take_up(group_id, stored, "converted from a consumer group")

    def hand_over(self, group_id: str, convert: Callable[[GroupMetadata], list[tuple[bytes, bytes | None]] | None]
                  ) -> bool:
        """Give a group with members to another protocol's coordinator (Kafka's online upgrade to
        a KIP-848 consumer group): ``convert`` gets the group as its metadata record would hold
        it (each member's subscription of the chosen protocol, or of its first while none is
        chosen) and answers the records that make it the other kind (None: it refuses); they
        are written with this group's tombstone in one batch, the group is gone from here and
        its waiting joins and syncs are answered REBALANCE_IN_PROGRESS. Whether it was handed
        over. ``convert`` runs under the group's lock (a lock taken after it). Thread-safe."""
        group = self._group(group_id, create=False)
        if group is None:
            return False
        done: Done = []
        with group.lock:
            if group.state == DEAD or not group.members:
                return False
            members = tuple(GroupMember(m.member_id, m.instance_id, m.client_id, m.client_host, m.rebalance_ms,
                                        m.session_ms, m.metadata(group.protocol) if group.protocol else
                                        m.protocols[0][1], m.assignment) for m in group.members.values())
            stored = GroupMetadata(group.protocol_type or "", group.generation,
                                   group.protocol or next(iter(group.members.values())).names()[0], group.leader,
                                   int(time.time() * 1000), members)
            writes = convert(stored)
            if writes is None:
                return False
            try:
                self.offsets.append_records([(encode_group_key(group_id), None)] + writes, durable=True)
            except (LogstoreError, OSError, ValueError) as exc:
                logger.error("group %s: could not be handed over: %s", group_id, exc)
                return False
            for member in group.members.values():
                if member.join is not None:
                    done.append((member.join, _join_error(ErrorCode.rebalance_in_progress, member.member_id)))
                    member.join = None
                if member.sync is not None:
                    done.append((member.sync, _sync_answer(ErrorCode.rebalance_in_progress)))
                    member.sync = None
            group.state = DEAD
            group.members = {}  # its timers find nobody
            group.static = {}
            group.pending = set()
            with self._lock:
                if self._groups.get(group_id) is group:
                    del self._groups[group_id]
            logger.info("group %s: handed over at generation %d with %d members", group_id, group.generation,
                        len(members))
        _complete(done)
        return True

    def _store(self, group: _Group, durable: bool = True) -> bool:
        """Write the group's membership (holds the group's lock); whether it was written (a
        failure is logged: offsets are unaffected). ``durable`` False (removals and emptying,
        which timers make): written, not waited for, so that no timer waits on the disk or a
        majority."""
        members = tuple(GroupMember(m.member_id, m.instance_id, m.client_id, m.client_host, m.rebalance_ms,
                                    m.session_ms, m.metadata(group.protocol) if group.protocol else b"", m.assignment)
                        for m in group.members.values())
        stored = GroupMetadata(group.protocol_type or "", group.generation, group.protocol if members else None,
                               group.leader if members else None, int(time.time() * 1000), members)
        try:
            self.offsets.store_group(group.group_id, stored, durable=durable)
        except (LogstoreError, OSError, ValueError) as exc:
            logger.error("group %s: its generation %d could not be stored: %s", group.group_id, group.generation, exc)
            return False
        return True

    def _group(self, group_id: str, create: bool) -> _Group | None:
        with self._lock:
            group = self._groups.get(group_id)
            if group is None and create:
                group = self._groups[group_id] = _Group(group_id)
            return group

    # ------------------------------------------------------------------ JoinGroup
    def join(self, group_id: str, member_id: str, instance_id: str | None, client_id: str, client_host: str,
             session_ms: int, rebalance_ms: int, protocol_type: str, protocols: list[tuple[str, bytes]],
             require_known_member_id: bool) -> dict[str, Any] | Future:
        """A JoinGroup: its answer's fields now, or a Future of them once the join completes."""
        if not group_id:
            return _join_error(ErrorCode.invalid_group_id, member_id)
        if not self.min_session_ms <= session_ms <= self.max_session_ms:
            return _join_error(ErrorCode.invalid_session_timeout, member_id)
        group = self._group(group_id, create=not member_id)
        if group is None:
            return _join_error(ErrorCode.unknown_member_id, member_id)
        done: Done = []
        with group.lock:
            if group.state == DEAD:  # deleted meanwhile: the member finds the coordinator again
                return _join_error(ErrorCode.coordinator_not_available, member_id)
            answer = self._join(group, member_id, instance_id, (client_id, client_host, session_ms, rebalance_ms,
                                protocols), protocol_type, require_known_member_id, done)
            if group.state == PREPARING_REBALANCE:
                self._maybe_complete_join(group, done)
        _complete(done)
        return answer

    def _join(self, group: _Group, member_id: str, instance_id: str | None, args: _MemberArgs, protocol_type: str,
              require_known: bool, done: Done) -> dict[str, Any] | Future:
        client_id, _, session_ms, _, protocols = args
        if not group.supports(protocol_type, [name for name, _ in protocols]):
            return _join_error(ErrorCode.inconsistent_group_protocol, member_id)
        if not member_id:
            new_id = f"{instance_id or client_id}-{uuid.uuid4()}"
            if instance_id is not None:
                old = group.static.get(instance_id)
                if old is not None:  # a restarted static member replaces its old self
                    return self._replace_static(group, group.members[old], new_id, args, done)
                return self._add_member(group, new_id, instance_id, protocol_type, args, done)
            if require_known:  # KIP-394: hand the id out, the member joins with it
                group.pending.add(new_id)
                self._watch_pending(group, new_id, session_ms)
                return _join_error(ErrorCode.member_id_required, new_id)
            return self._add_member(group, new_id, None, protocol_type, args, done)
        if member_id in group.pending:
            group.pending.discard(member_id)
            return self._add_member(group, member_id, None, protocol_type, args, done)
        error = self._validate_member(group, member_id, instance_id)
        if error:
            return _join_error(error, member_id)
        member = group.members[member_id]
        if group.state == PREPARING_REBALANCE:
            return self._update_member(group, member, args, done)
        if group.state == COMPLETING_REBALANCE and member.protocols == protocols:
            return self._current_generation(group, member_id)  # its join answer was lost: again
        if group.state == STABLE and member_id != group.leader and member.protocols == protocols:
            return self._current_generation(group, member_id)
        if group.state in (COMPLETING_REBALANCE, STABLE):
            return self._update_member(group, member, args, done)
        return _join_error(ErrorCode.unknown_member_id, member_id)

    def _replace_static(self, group: _Group, old: _Member, new_id: str, args: _MemberArgs,
                        done: Done) -> dict[str, Any] | Future:
        """A static member joins again under a new member id (KIP-345, Kafka's
        updateStaticMemberAndRebalance): its old id is fenced (what waits on it gets
        FENCED_INSTANCE_ID) and the new one takes its place and its assignment. In a Stable group
        whose protocol the new metadata leaves unchanged there is no rebalance: the generation
        is stored with the new id and the member gets the current generation, named with the
        old leader id so that no member takes itself for a new leader; otherwise (or when that
        generation cannot be stored) the group rebalances and the member's join waits for it."""
        assert old.instance_id is not None
        logger.info("group %s: static member %s replaces %s", group.group_id, new_id, old.member_id)
        old_leader = group.leader
        member = _Member(new_id, old.instance_id, *args)
        member.assignment = old.assignment
        if old.join is not None:
            done.append((old.join, _join_error(ErrorCode.fenced_instance_id, old.member_id)))
        if old.sync is not None:
            done.append((old.sync, _sync_answer(ErrorCode.fenced_instance_id)))
        group.members = {(new_id if mid == old.member_id else mid): (member if m is old else m)
                         for mid, m in group.members.items()}
        group.static[old.instance_id] = new_id
        if old.member_id in group.pending_sync:
            group.pending_sync.discard(old.member_id)
            group.pending_sync.add(new_id)
        if group.leader == old.member_id:
            group.leader = new_id
        self._touch(group, member)
        reason = f"static member {new_id} rejoins with new metadata"
        if group.state == STABLE and group.protocol == group.select_protocol():
            if self._store(group):
                return dict(self._current_generation(group, new_id), leader=old_leader or "", members=[])
            reason = f"static member {new_id} could not be stored"
        answer = member.join = Future()
        if group.state != PREPARING_REBALANCE:
            self._prepare_rebalance(group, reason, done)
        return answer

    def _current_generation(self, group: _Group, member_id: str) -> dict[str, Any]:
        assert group.protocol is not None
        members = []
        if member_id == group.leader:
            members = [{"member_id": m.member_id, "group_instance_id": m.instance_id,
                        "metadata": m.metadata(group.protocol)} for m in group.members.values()]
        return {"throttle_time": 0, "error_code": ErrorCode.none, "generation_id": group.generation,
                "protocol_type": group.protocol_type, "protocol_name": group.protocol, "leader": group.leader or "",
                "skip_assignment": False, "member_id": member_id, "members": members}

    def _add_member(self, group: _Group, member_id: str, instance_id: str | None, protocol_type: str,
                    args: _MemberArgs, done: Done) -> Future:
        member = _Member(member_id, instance_id, *args)
        if not group.members:
            group.protocol_type = protocol_type
        group.members[member_id] = member
        if instance_id is not None:
            group.static[instance_id] = member_id
        answer = member.join = Future()
        logger.info("group %s: member %s joins (%s)", group.group_id, member_id, group.state)
        if group.state == PREPARING_REBALANCE and group.generation == 0 and self.initial_delay_s:
            group.join_not_before = min(time.monotonic() + self.initial_delay_s, group.join_deadline)
        self._touch(group, member)
        if group.state != PREPARING_REBALANCE:
            self._prepare_rebalance(group, f"member {member_id} joins", done)  # may answer at once
        return answer

    def _update_member(self, group: _Group, member: _Member, args: _MemberArgs, done: Done) -> Future:
        member.client_id, member.client_host, member.session_ms, member.rebalance_ms, member.protocols = args
        if member.join is not None:  # a second JoinGroup while one waits: the first is void
            done.append((member.join, _join_error(ErrorCode.rebalance_in_progress, member.member_id)))
        answer = member.join = Future()
        if group.state != PREPARING_REBALANCE:
            self._prepare_rebalance(group, f"member {member.member_id} rejoins", done)  # may answer at once
        return answer

    # ------------------------------------------------------------------ rebalancing
    def _prepare_rebalance(self, group: _Group, reason: str, done: Done) -> None:
        if group.state == COMPLETING_REBALANCE:
            for member in group.members.values():
                if member.sync is not None:
                    done.append((member.sync, _sync_answer(ErrorCode.rebalance_in_progress)))
                    member.sync = None
        group.pending_sync.clear()
        first = group.state == EMPTY
        group.state = PREPARING_REBALANCE
        group.round += 1
        now = time.monotonic()
        group.join_deadline = now + group.rebalance_timeout_s()
        group.join_not_before = min(now + self.initial_delay_s, group.join_deadline) if first else now
        logger.info("group %s: preparing to rebalance after generation %d (%s)", group.group_id, group.generation,
                    reason)
        self._drop_dead(group)
        self._maybe_complete_join(group, done)
        if group.state == PREPARING_REBALANCE:
            self._watch_join(group)

    def _maybe_complete_join(self, group: _Group, done: Done) -> None:
        if group.all_joined() and time.monotonic() >= group.join_not_before:
            self._complete_join(group, done)

    def _drop_dead(self, group: _Group) -> None:
        """Forget the members yet to join whose process is gone (with ``liveness`` only)."""
        if self.liveness is None:
            return
        for member in list(group.members.values()):
            if member.join is None and member.sync is None:
                try:
                    alive = self.liveness(member.client_id)
                except Exception:  # noqa: BLE001 - a failed probe proves nothing
                    logger.exception("group %s: the liveness probe of %s failed", group.group_id, member.member_id)
                    alive = True
                if not alive:
                    logger.info("group %s: member %s is gone (its process ended)", group.group_id, member.member_id)
                    self._forget(group, member)

    def _watch_join(self, group: _Group) -> None:
        """A timer for the join: at its first point in time it completes, or watches again (and
        with ``liveness``, every 100 ms, to drop the members whose process ended)."""
        round_ = group.round
        now = time.monotonic()
        at = group.join_not_before if now < group.join_not_before else group.join_deadline
        if self.liveness is not None:
            at = min(at, now + 0.1)

        def attempt(expired: bool) -> bool | None:
            if not expired:
                return None
            done: Done = []
            with group.lock:
                if group.round == round_ and group.state == PREPARING_REBALANCE:
                    self._drop_dead(group)
                    now = time.monotonic()
                    if now >= group.join_deadline or (group.all_joined() and now >= group.join_not_before):
                        self._complete_join(group, done)
                    else:
                        self._watch_join(group)
            _complete(done)
            return True

        self.purgatory.watch(("group-join", group.group_id, round_), attempt, max(0.0, at - now))

    def _complete_join(self, group: _Group, done: Done) -> None:
        for member in list(group.members.values()):
            if member.join is None and member.instance_id is None:
                logger.info("group %s: member %s did not rejoin in time", group.group_id, member.member_id)
                self._forget(group, member)
        if group.members and all(m.join is None for m in group.members.values()):
            # Only static members, none rejoined: wait for them, or for their sessions to end.
            group.join_deadline = time.monotonic() + group.rebalance_timeout_s()
            self._watch_join(group)
            return
        group.generation += 1
        if not group.members:
            group.state, group.protocol, group.leader = EMPTY, None, None
            logger.info("group %s: empty at generation %d", group.group_id, group.generation)
            self._store(group, durable=False)
            return
        group.protocol = group.select_protocol()
        if group.leader not in group.members or group.members[group.leader].join is None:
            group.leader = next(m.member_id for m in group.members.values() if m.join is not None)
        group.state = COMPLETING_REBALANCE
        group.pending_sync = set(group.members)
        logger.info("group %s: generation %d with %d members, protocol %s, leader %s", group.group_id,
                    group.generation, len(group.members), group.protocol, group.leader)
        for member in group.members.values():
            if member.join is not None:
                done.append((member.join, self._current_generation(group, member.member_id)))
                member.join = None
            self._touch(group, member)
        self._watch_sync(group)

    def _watch_sync(self, group: _Group) -> None:
        """Members that do not ask for their assignment within the rebalance timeout are removed."""
        generation = group.generation

        def attempt(expired: bool) -> bool | None:
            if not expired:
                return None
            done: Done = []
            with group.lock:
                if (group.generation == generation and group.state in (COMPLETING_REBALANCE, STABLE)
                        and group.pending_sync):
                    missing = sorted(group.pending_sync)
                    for member_id in missing:
                        self._forget(group, group.members[member_id])
                    self._prepare_rebalance(group, f"no SyncGroup from {', '.join(missing)}", done)
            _complete(done)
            return True

        self.purgatory.watch(("group-sync", group.group_id, generation), attempt, group.rebalance_timeout_s())

    # ------------------------------------------------------------------ members leaving
    def _forget(self, group: _Group, member: _Member) -> None:
        """Remove a member (no rebalance: the caller decides)."""
        del group.members[member.member_id]
        group.pending_sync.discard(member.member_id)
        if member.instance_id is not None and group.static.get(member.instance_id) == member.member_id:
            del group.static[member.instance_id]
        if group.leader == member.member_id:
            group.leader = next(iter(group.members), None)

    def _drop(self, group: _Group, member: _Member, error: int, done: Done) -> None:
        """Remove a member and answer what it waits for with ``error`` (no rebalance)."""
        if member.join is not None:
            member_id = "" if error == ErrorCode.unknown_member_id else member.member_id
            done.append((member.join, _join_error(error, member_id)))
            member.join = None
        if member.sync is not None:
            done.append((member.sync, _sync_answer(error)))
            member.sync = None
        self._forget(group, member)

    def _remove_and_rebalance(self, group: _Group, member: _Member, reason: str, done: Done) -> None:
        self._drop(group, member, ErrorCode.unknown_member_id, done)
        logger.info("group %s: member %s removed: %s", group.group_id, member.member_id, reason)
        if group.members:
            self._store(group, durable=False)  # a coordinator taking over must not wait for it
        if group.state in (STABLE, COMPLETING_REBALANCE):
            self._prepare_rebalance(group, reason, done)
        elif group.state == PREPARING_REBALANCE:
            self._maybe_complete_join(group, done)

    def _touch(self, group: _Group, member: _Member) -> None:
        """Start the member's session again (a heartbeat, or an answered join or sync)."""
        member.deadline = time.monotonic() + member.session_ms / 1000.0
        if not member.watched:
            member.watched = True
            self._watch_session(group, member, member.session_ms / 1000.0)

    def _watch_session(self, group: _Group, member: _Member, timeout_s: float) -> None:
        def attempt(expired: bool) -> bool | None:
            if not expired:
                return None
            done: Done = []
            with group.lock:
                if group.members.get(member.member_id) is member:
                    now = time.monotonic()
                    if member.join is not None or member.sync is not None:
                        member.deadline = now + member.session_ms / 1000.0  # waiting on us: alive
                    if now >= member.deadline:
                        member.watched = False
                        self._remove_and_rebalance(group, member, "its session timed out", done)
                    else:
                        self._watch_session(group, member, member.deadline - now)
            _complete(done)
            return True

        self.purgatory.watch(("group-member", group.group_id, member.member_id), attempt, timeout_s)

    def _watch_pending(self, group: _Group, member_id: str, session_ms: int) -> None:
        def attempt(expired: bool) -> bool | None:
            if not expired:
                return None
            done: Done = []
            with group.lock:
                if member_id in group.pending:
                    group.pending.discard(member_id)
                    if group.state == PREPARING_REBALANCE:
                        self._maybe_complete_join(group, done)
            _complete(done)
            return True

        self.purgatory.watch(("group-pending", group.group_id, member_id), attempt, session_ms / 1000.0)

    def _validate_member(self, group: _Group, member_id: str, instance_id: str | None) -> int:
        if instance_id is not None:
            current = group.static.get(instance_id)
            if current is None:
                return ErrorCode.unknown_member_id
            return ErrorCode.fenced_instance_id if current != member_id else ErrorCode.none
        return ErrorCode.none if member_id in group.members else ErrorCode.unknown_member_id

    # ------------------------------------------------------------------ SyncGroup, Heartbeat, LeaveGroup
    def sync(self, group_id: str, generation: int, member_id: str, instance_id: str | None,
             assignments: dict[str, bytes], protocol_type: str | None = None,
             protocol: str | None = None) -> dict[str, Any] | Future:
        """A SyncGroup: the member's assignment now, or a Future of it once the leader's comes.
        ``protocol_type`` and ``protocol`` (SyncGroup v5), when given, must be the group's
        (INCONSISTENT_GROUP_PROTOCOL otherwise)."""
        group = self._group(group_id, create=False)
        if group is None:
            return _sync_answer(ErrorCode.unknown_member_id)
        done: Done = []
        with group.lock:
            if group.state == DEAD:
                return _sync_answer(ErrorCode.coordinator_not_available)
            error = self._validate_member(group, member_id, instance_id)
            if not error and generation != group.generation:
                error = ErrorCode.illegal_generation
            if not error and ((protocol_type is not None and protocol_type != group.protocol_type)
                              or (protocol is not None and protocol != group.protocol)):
                error = ErrorCode.inconsistent_group_protocol
            if error:
                return _sync_answer(error)
            if group.state == EMPTY:
                return _sync_answer(ErrorCode.unknown_member_id)
            if group.state == PREPARING_REBALANCE:
                return _sync_answer(ErrorCode.rebalance_in_progress)
            member = group.members[member_id]
            group.pending_sync.discard(member_id)
            if group.state == STABLE:
                self._touch(group, member)
                return _sync_answer(ErrorCode.none, member.assignment, group.protocol_type, group.protocol)
            if member.sync is not None:
                done.append((member.sync, _sync_answer(ErrorCode.rebalance_in_progress)))
            answer = member.sync = Future()
            if member_id == group.leader:
                for other in group.members.values():
                    other.assignment = assignments.get(other.member_id, b"")
                stored = self._store(group)
                error = ErrorCode.none if stored else ErrorCode.coordinator_not_available
                for other in group.members.values():
                    if other.sync is not None:
                        done.append((other.sync, _sync_answer(error, other.assignment, group.protocol_type,
                                                              group.protocol) if stored else _sync_answer(error)))
                        other.sync = None
                if stored:
                    group.state = STABLE
                    logger.info("group %s: generation %d is stable", group_id, group.generation)
                else:  # as Kafka: the members join again rather than go on unrecorded
                    self._prepare_rebalance(group, "its generation could not be stored", done)
            self._touch(group, member)
        _complete(done)
        return answer

    def heartbeat(self, group_id: str, generation: int, member_id: str, instance_id: str | None) -> int:
        """A Heartbeat: its error code (REBALANCE_IN_PROGRESS tells the member to rejoin)."""
        group = self._group(group_id, create=False)
        if group is None:
            return ErrorCode.unknown_member_id
        with group.lock:
            if group.state == DEAD:
                return ErrorCode.coordinator_not_available
            error = self._validate_member(group, member_id, instance_id)
            if error:
                return error
            if generation != group.generation:
                return ErrorCode.illegal_generation
            if group.state == EMPTY:
                return ErrorCode.unknown_member_id
            self._touch(group, group.members[member_id])
            return ErrorCode.rebalance_in_progress if group.state == PREPARING_REBALANCE else ErrorCode.none

    def leave(self, group_id: str, members: Iterable[tuple[str, str | None]]) -> list[int]:
        """A LeaveGroup of ``(member id, group instance id)`` pairs: an error code for each."""
        group = self._group(group_id, create=False)
        if group is None:
            return [ErrorCode.unknown_member_id for _ in members]
        errors = []
        done: Done = []
        with group.lock:
            for member_id, instance_id in members:
                if not member_id and instance_id is not None:  # an admin removing a static member
                    member_id = group.static.get(instance_id, "")
                    instance_id = None
                if member_id in group.pending:
                    group.pending.discard(member_id)
                    if group.state == PREPARING_REBALANCE:
                        self._maybe_complete_join(group, done)
                    errors.append(ErrorCode.none)
                    continue
                error = (self._validate_member(group, member_id, instance_id) if member_id
                         else ErrorCode.unknown_member_id)
                if not error:
                    self._remove_and_rebalance(group, group.members[member_id], "it left the group", done)
                errors.append(error)
        _complete(done)
        return errors

    # ------------------------------------------------------------------ offsets
    def commit_offsets(self, group_id: str, generation: int, member_id: str, instance_id: str | None,
                       offsets: Sequence[tuple[str, int, int, int, str | None]], api_version: int = 8) -> list[int]:
        """An OffsetCommit of ``(topic, partition, offset, leader epoch, metadata)``: an error
        code for each (the leader epoch is stored with the offset; -1 for none).

        ``generation`` is OffsetCommit's ``generation_id_or_member_epoch``: for a classic group
        the generation. A commit naming a generation of a group this coordinator does not know
        gets GROUP_ID_NOT_FOUND from version 9 (ILLEGAL_GENERATION before), as Kafka's.

        The accepted ones are committed in one batch, fsynced before this returns. The check
        of the member's generation and the append happen under the group's lock, so that no
        commit of a member the group has just removed lands after its successor's.
        """
        group = self._group(group_id, create=False) if group_id else None
        if group is None:
            errors = self._commit(group_id, generation, member_id, instance_id, offsets, api_version)
        else:
            with group.lock:
                errors = self._commit(group_id, generation, member_id, instance_id, offsets, api_version)
        if ErrorCode.none in errors:
            try:
                self.offsets.sync()  # fsynced (or held by a majority), outside the group's lock
            except (LogstoreError, OSError, ValueError) as exc:
                logger.error("group %s: offset commit failed: %s", group_id, exc)
                return [ErrorCode.coordinator_not_available if e == ErrorCode.none else e for e in errors]
        return errors

    def _commit(self, group_id: str, generation: int, member_id: str, instance_id: str | None,
                offsets: Sequence[tuple[str, int, int, int, str | None]], api_version: int) -> list[int]:
        error = self._check_committer(group_id, generation, member_id, instance_id)
        if error == ErrorCode.illegal_generation and api_version >= 9 and self._group(group_id, False) is None:
            error = ErrorCode.group_id_not_found
        if error:
            return [error] * len(offsets)
        errors: list[int] = []
        accepted: dict[tuple[str, int], tuple[int, str, int]] = {}
        for topic, partition, offset, leader_epoch, metadata in offsets:
            if not self.partition_exists(topic, partition):
                errors.append(ErrorCode.unknown_topic_or_partition)
            elif metadata is not None and len(metadata.encode("utf-8")) > MAX_METADATA_BYTES:
                errors.append(ErrorCode.offset_metadata_too_large)
            elif offset < 0:
                errors.append(ErrorCode.invalid_commit_offset_size)
            else:
                accepted[(topic, partition)] = (offset, metadata or "", leader_epoch if leader_epoch >= 0 else -1)
                errors.append(ErrorCode.none)
        if accepted:
            try:
                self.offsets.commit(group_id, accepted, durable=False)
            except (LogstoreError, OSError, ValueError) as exc:  # the store refused: nothing committed
                logger.error("group %s: offset commit failed: %s", group_id, exc)
                return [ErrorCode.coordinator_not_available if e == ErrorCode.none else e for e in errors]
        return errors

    def check_transactional_commit(self, group_id: str, generation: int, member_id: str,
                                   instance_id: str | None) -> int:
        """Whether a transactional producer may commit offsets for this member of the group
        (TxnOffsetCommit v3+ names the consumer's generation and member, KIP-447): Kafka's
        validateOffsetCommit, as for the member's own commit. Thread-safe."""
        return self._check_committer(group_id, generation, member_id, instance_id)

    def _check_committer(self, group_id: str, generation: int, member_id: str, instance_id: str | None) -> int:
        """Whether this member may commit for the group (Kafka's validateOffsetCommit of a
        classic group; ``generation`` is the request's generation id or member epoch, and a
        group of KIP-848's protocol would fence by member epoch here instead)."""
        if not group_id:
            return ErrorCode.invalid_group_id
        if self.committer_check is not None:
            checked = self.committer_check(group_id, member_id, generation, instance_id)
            if checked is not None:
                return checked
        group = self._group(group_id, create=generation < 0)
        if group is None:
            return ErrorCode.illegal_generation  # a member of a group this coordinator does not know (a restart)
        with group.lock:
            if group.state == DEAD:
                return ErrorCode.coordinator_not_available
            if generation < 0 and group.state == EMPTY:
                return ErrorCode.none  # not using group management: allowed while nobody is a member
            if generation >= 0 or member_id or instance_id is not None:
                error = self._validate_member(group, member_id, instance_id)
                if not error and generation != group.generation:
                    error = ErrorCode.illegal_generation
                if error:
                    return error
            elif group.state != EMPTY:
                return ErrorCode.unknown_member_id
            if group.state == COMPLETING_REBALANCE:
                return ErrorCode.rebalance_in_progress
            if member_id in group.members:
                self._touch(group, group.members[member_id])
            return ErrorCode.none

    def fetch_offsets(self, group_id: str, partitions: Sequence[tuple[str, int]] | None
                      ) -> list[tuple[str, int, int, int, str]]:
        """Committed ``(topic, partition, offset, leader epoch, metadata)``: of ``partitions``
        (-1, -1 and "" where none is committed), or every partition the group committed when
        None. A classic group answers whoever asks (OffsetFetch v9's member id and epoch are
        checked only by KIP-848's groups, as Kafka's ClassicGroup.validateOffsetFetch)."""
        if partitions is None:
            found = self.offsets.group_entries(group_id)
            return [(topic, partition, offset, epoch, metadata)
                    for (topic, partition), (offset, metadata, epoch) in sorted(found.items())]
        out = []
        for topic, partition in partitions:
            got = self.offsets.committed_entry(group_id, topic, partition)
            offset, metadata, epoch = got if got is not None else (-1, "", -1)
            out.append((topic, partition, offset, epoch, metadata))
        return out

    def delete_offsets(self, group_id: str, partitions: Sequence[tuple[str, int]]) -> tuple[int, list[int]]:
        """An OffsetDelete: (the group's error, an error per partition). As Kafka's: an empty
        group's offsets are deleted for every partition asked; a group of the consumer protocol
        with members keeps those of the topics its members subscribe to (GROUP_SUBSCRIBED_TO_TOPIC,
        read from each member's subscription) and loses the others; any other group with members
        gets NON_EMPTY_GROUP, an unknown one GROUP_ID_NOT_FOUND, a partition of no topic here
        UNKNOWN_TOPIC_OR_PARTITION.

        Durability: the tombstones are fsynced before this returns. Thread-safe."""
        if not group_id:
            return ErrorCode.invalid_group_id, []
        with self._existing(group_id) as group:
            if group is None:
                return ErrorCode.group_id_not_found, []
            if group.state == EMPTY:
                subscribed: set[str] | None = set()
            elif group.protocol_type == "consumer":
                subscribed = self._subscribed_topics(group)
            else:
                return ErrorCode.non_empty_group, []
            return delete_unsubscribed_offsets(self.offsets, group_id, partitions, self.partition_exists, subscribed)

    def _subscribed_topics(self, group: _Group) -> set[str] | None:
        """The topics the members of a consumer-protocol group subscribe to (every protocol's
        metadata while no generation has chosen one); None when a subscription cannot be read
        (then every topic counts as subscribed). Holds the group's lock."""
        topics: set[str] = set()
        for member in group.members.values():
            for name, metadata in member.protocols:
                if group.protocol and name != group.protocol:
                    continue
                try:
                    topics.update(subscribed_topics(metadata))
                except ValueError as exc:
                    logger.warning("group %s: member %s: %s", group.group_id, member.member_id, exc)
                    return None
        return topics

    def delete_groups(self, group_ids: Sequence[str]) -> list[int]:
        """A DeleteGroups: an error code for each group. As Kafka's: an empty group is deleted
        with its committed offsets and membership (tombstones in one batch, so a crash leaves it
        whole or gone, never back after a restart); a group with members gets NON_EMPTY_GROUP,
        an unknown one GROUP_ID_NOT_FOUND, an empty id INVALID_GROUP_ID.

        Durability: each deletion is fsynced before this returns. Thread-safe."""
        return [self._delete_group(group_id) for group_id in group_ids]

    def _delete_group(self, group_id: str) -> int:
        if not group_id:
            return ErrorCode.invalid_group_id
        with self._existing(group_id) as group:
            if group is None:
                return ErrorCode.group_id_not_found
            if group.state != EMPTY:
                return ErrorCode.non_empty_group
            try:
                self.offsets.delete_group(group_id)
            except (LogstoreError, OSError, ValueError) as exc:
                logger.error("group %s: could not be deleted: %s", group_id, exc)
                return ErrorCode.coordinator_not_available
            group.state = DEAD
            with self._lock:
                if self._groups.get(group_id) is group:
                    del self._groups[group_id]
            logger.info("group %s: deleted", group_id)
            return ErrorCode.none

    @contextlib.contextmanager
    def _existing(self, group_id: str) -> Iterator[_Group | None]:
        """The group, locked, if it exists (known here, or with committed offsets or stored
        membership: Kafka's groups loaded Empty), else None. A group known only by its offsets
        gets an entry for the while, so that commits and joins wait for what is done with it;
        the entry then goes, marked Dead, so that one of them that found it meanwhile tries
        again (COORDINATOR_NOT_AVAILABLE) rather than joining a group nobody holds."""
        with self._lock:
            group = self._groups.get(group_id)
            placeholder = group is None
            if placeholder:
                group = self._groups[group_id] = _Group(group_id)
        assert group is not None
        with group.lock:
            try:
                if group.state == DEAD or (placeholder and not self._stored(group_id)):
                    yield None
                else:
                    yield group
            finally:
                if placeholder and not group.members:
                    group.state = DEAD
                    with self._lock:
                        if self._groups.get(group_id) is group:
                            del self._groups[group_id]

    def _stored(self, group_id: str) -> bool:
        """Whether the store holds committed offsets or membership of the group."""
        return bool(self.offsets.group_offsets(group_id)) or group_id in self.offsets.group_metadata()

    # ------------------------------------------------------------------ inspection
    def describe(self, group_id: str) -> dict[str, Any] | None:
        """A group's state, type, protocol and members (DescribeGroups), or None when unknown
        (a group known only by its committed offsets is Empty, as Kafka loads it)."""
        group = self._group(group_id, create=False)
        if group is None:
            if not group_id or not self._stored(group_id):
                return None
            return {"group_id": group_id, "state": EMPTY, "type": CLASSIC, "protocol_type": "", "protocol": "",
                    "generation": 0, "members": []}
        with group.lock:
            if group.state == DEAD:
                return None
            stable = group.state == STABLE
            return {"group_id": group_id, "state": group.state, "type": group.group_type(),
                    "protocol_type": group.protocol_type or "", "protocol": group.protocol or "",
                    "generation": group.generation,
                    "members": [{"member_id": m.member_id, "group_instance_id": m.instance_id,
                                 "client_id": m.client_id, "client_host": m.client_host,
                                 "metadata": m.metadata(group.protocol) if stable and group.protocol else b"",
                                 "assignment": m.assignment if stable else b""}
                                for m in group.members.values()]}

    def groups(self, states: Iterable[str] = (), types: Iterable[str] = ()) -> list[tuple[str, str, str, str]]:
        """(group id, protocol type, state, group type) of every group (ListGroups): those with
        members here, and those with committed offsets only (the library's consumers, earlier
        lives), which are Empty. ``states`` and ``types``, when not empty, keep only the groups
        in one of them (compared ignoring case, as Kafka's ListGroups v4 and v5 filters)."""
        with self._lock:
            groups = list(self._groups.values())
        out: dict[str, tuple[str, str, str]] = {}
        for group in groups:
            with group.lock:
                if group.state != DEAD:
                    out[group.group_id] = (group.protocol_type or "", group.state, group.group_type())
        for group_id in self.offsets.groups():
            out.setdefault(group_id, ("", EMPTY, CLASSIC))
        return [(group_id, kind, state, group_type) for group_id, (kind, state, group_type) in sorted(out.items())
                if listed_by(state, group_type, states, types)]

    def close(self) -> None:
        """Answer every waiting join and sync (the server is stopping): the members look for the
        coordinator again."""
        done: Done = []
        with self._lock:
            groups = list(self._groups.values())
        for group in groups:
            with group.lock:
                for member in group.members.values():
                    if member.join is not None:
                        done.append((member.join, _join_error(ErrorCode.coordinator_not_available, member.member_id)))
                        member.join = None
                    if member.sync is not None:
                        done.append((member.sync, _sync_answer(ErrorCode.coordinator_not_available)))
                        member.sync = None
        _complete(done)
