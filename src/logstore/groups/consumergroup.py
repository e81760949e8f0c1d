"""Kafka's consumer group protocol (KIP-848): ConsumerGroupHeartbeat, ConsumerGroupDescribe, fenced commits.

A consumer group of the new protocol is driven by its members' heartbeats alone; the
coordinator computes the assignment (Kafka's GroupMetadataManager, ConsumerGroup,
ConsumerGroupMember). Three epochs order everything:

- the *group epoch*, bumped whenever the group's membership, a member's subscription or the
  subscribed topics' partition counts change;
- the *target assignment epoch*: the group epoch the target assignment was last computed for.
  A heartbeat that finds it behind the group epoch runs the group's server-side assignor
  (:mod:`~logstore.groups.assignors`: ``uniform`` or ``range``, the members' ``server_assignor``
  choice, else the first of ``group.consumer.assignors``);
- each *member epoch*: a member reaches the target epoch step by step
  (:mod:`~logstore.groups.reconciliation`): it first revokes what the target takes from it,
  and gets a partition only once its previous holder has released it.

Requests and errors, as Kafka's: a member joins with epoch 0 (v1: with the id it generated;
v0: the coordinator gives one), heartbeats with its epoch (FENCED_MEMBER_EPOCH when the epoch
is not its own, or its previous one with nothing it no longer holds; UNKNOWN_MEMBER_ID when the
coordinator does not know it), and leaves with -1. A static member (``instance_id``) leaves
with -2 and keeps its assignment: a new process with the same instance id takes the member's
place, epoch and assignment without a rebalance (UNRELEASED_INSTANCE_ID while the old one has
not left). A member that sends no heartbeat within ``group.consumer.session.timeout.ms`` is
fenced (its partitions are released, the group epoch bumped), and so is one that has not
revoked its partitions within its rebalance timeout. Group states: Empty, Assigning (the
target is behind the group epoch), Reconciling (a member is not yet at the target), Stable.

Mixed groups (Kafka's upgrade path): a member of the classic protocol may belong to a consumer
group (:meth:`ConsumerGroupCoordinator.classic_join`, ``classic_sync``, ``classic_heartbeat``,
``classic_leave``: Kafka's classicGroup*ToConsumerGroup). Its subscription and owned partitions
come from its JoinGroup's ConsumerProtocolSubscription, its generation is its member epoch, its
SyncGroup hands it its current partitions, and its Heartbeat answers REBALANCE_IN_PROGRESS when
it must rejoin to move on (the group epoch passed its own, it must revoke, or what it waits for
is free). Its session timeout and protocols are kept in its member record (ClassicMemberMetadata).
Where ``group.consumer.migration.policy`` allows, a consumer-protocol member joining a classic
group with members converts it (online upgrade: :meth:`GroupCoordinator.hand_over`), and the
last consumer-protocol member leaving a group of classic members converts it back (online
downgrade: :meth:`GroupCoordinator.adopt`); each conversion is one batch of records, made under
both groups' locks (the classic group's taken first).

Offset commits of a consumer group (:meth:`ConsumerGroupCoordinator.check_commit`) must come
from a member at its current epoch (STALE_MEMBER_EPOCH for an older one, FENCED_MEMBER_EPOCH
for a newer, UNKNOWN_MEMBER_ID for a stranger); epoch -1 without a member id (admin tools) is
accepted while the group has no members.

Durability: every change is written to ``__consumer_offsets`` as Kafka's consumer group
records (:mod:`~logstore.groups.consumerrecords`, through the :class:`OffsetStore` the classic
groups use) before the heartbeat that made it is answered (fsynced, or held by a majority on a
replica set); changes made by timers are written without waiting. A coordinator that starts
over the same records (a restart, a new leader of the offsets partition) takes every group up
where it was: epochs, subscriptions, target and current assignments; each member's session
starts again. A write that fails answers COORDINATOR_NOT_AVAILABLE and the group is read
back from its records.

Timers (sessions, revocations) are watches in the server's
:class:`~logstore.net.purgatory.Purgatory`.

Thread-safety: every method may be called from any thread; each group has its own lock,
taken before the :class:`OffsetStore`'s (and after a classic group's, in a conversion).
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping

from ..errorcodes import ErrorCode
from ..errors import CorruptRecordError, LogstoreError
from ..net.purgatory import Purgatory
from . import consumerrecords as rec
from .assignors import ASSIGNORS, Assignment, assign
from .consumerprotocol import assigned_partitions, encode_assignment, parse_subscription, subscription_version
from .coordinator import GroupCoordinator, delete_unsubscribed_offsets
from .metadata import GroupMember, GroupMetadata, encode_group_key, encode_group_value
from .offsets import OffsetStore
from .reconciliation import STABLE, STATE_NAMES, UNRELEASED_PARTITIONS, UNREVOKED_PARTITIONS, MemberAssignment, \
    reconcile, subset
from .topicregex import InvalidTopicRegex, topic_matcher

__all__ = ["ConsumerGroupConfig", "ConsumerGroupCoordinator", "HeartbeatRequest", "ClassicJoin", "LEAVE",
           "LEAVE_STATIC", "CONSUMER_PROTOCOL_TYPE", "MIGRATION_POLICIES"]

logger = logging.getLogger("logstore.groups.consumer")

#: the member epochs of a leave, and of a static member's temporary leave
LEAVE = -1
LEAVE_STATIC = -2
#: the protocol type ListGroups and DescribeGroups name a consumer group by
CONSUMER_PROTOCOL_TYPE = "consumer"
EMPTY, ASSIGNING, RECONCILING, STABLE_STATE = "Empty", "Assigning", "Reconciling", "Stable"
#: Kafka's ConsumerGroupMigrationPolicy values (``group.consumer.migration.policy``, any case there)
BIDIRECTIONAL, UPGRADE, DOWNGRADE, DISABLED = "bidirectional", "upgrade", "downgrade", "disabled"
MIGRATION_POLICIES = (BIDIRECTIONAL, UPGRADE, DOWNGRADE, DISABLED)


@dataclass(frozen=True)
class ConsumerGroupConfig:
    """The consumer group coordinator's settings, by Kafka's broker settings of the same names.

    Attributes:
        session_timeout_ms: ``group.consumer.session.timeout.ms`` (45000).
        heartbeat_interval_ms: ``group.consumer.heartbeat.interval.ms`` (5000).
        assignors: ``group.consumer.assignors``: the server-side assignors a member may name;
            the first is the default.
        max_size: ``group.consumer.max.size``: GROUP_MAX_SIZE_REACHED past it.
        migration_policy: ``group.consumer.migration.policy``: ``bidirectional`` (Kafka 4's
            default), ``upgrade``, ``downgrade`` or ``disabled``: whether a classic group with
            members becomes a consumer group when a member of the consumer protocol joins it,
            and whether a consumer group whose last consumer-protocol member leaves becomes a
            classic group again.
    """

    session_timeout_ms: int = 45000
    heartbeat_interval_ms: int = 5000
    assignors: tuple[str, ...] = ASSIGNORS
    max_size: int = 2 ** 31 - 1
    migration_policy: str = BIDIRECTIONAL

    def __post_init__(self) -> None:
        unknown = [a for a in self.assignors if a not in ASSIGNORS]
        if unknown or not self.assignors:
            raise ValueError(f"group.consumer.assignors must name some of {', '.join(ASSIGNORS)}, not {unknown}")
        if self.migration_policy not in MIGRATION_POLICIES:
            raise ValueError(f"group.consumer.migration.policy must be one of {', '.join(MIGRATION_POLICIES)}, "
                             f"not {self.migration_policy!r}")

    @property
    def upgrades(self) -> bool:
        """Whether a classic group may become a consumer group (online upgrade)."""
        return self.migration_policy in (BIDIRECTIONAL, UPGRADE)

    @property
    def downgrades(self) -> bool:
        """Whether a consumer group may become a classic group (online downgrade)."""
        return self.migration_policy in (BIDIRECTIONAL, DOWNGRADE)


@dataclass(frozen=True)
class HeartbeatRequest:
    """A ConsumerGroupHeartbeat's fields (None: unchanged since the last heartbeat)."""

    group_id: str
    member_id: str
    member_epoch: int
    instance_id: str | None = None
    rack_id: str | None = None
    rebalance_timeout_ms: int = -1
    subscribed_topic_names: tuple[str, ...] | None = None
    subscribed_topic_regex: str | None = None
    server_assignor: str | None = None
    owned: Assignment | None = None
    client_id: str = ""
    client_host: str = ""
    #: v0: a joining member may come without an id (the coordinator makes one)
    version: int = 1
    #: whether the member's principal may describe a topic (an authorizer's DESCRIBE, asked
    #: live); a regex subscription resolves only to those topics (Kafka's regex refresh with
    #: the authorizer). None: every topic (no authorizer).
    may_describe: Callable[[str], bool] | None = None


@dataclass(frozen=True)
class ClassicJoin:
    """A JoinGroup's fields, for a consumer group that takes classic members."""

    group_id: str
    member_id: str
    instance_id: str | None
    client_id: str
    client_host: str
    session_timeout_ms: int
    rebalance_timeout_ms: int
    protocol_type: str
    protocols: tuple[tuple[str, bytes], ...]
    #: JoinGroup v4+: a dynamic member without an id gets one with MEMBER_ID_REQUIRED first
    require_known_member_id: bool


class _HeartbeatError(Exception):
    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class _Member:
    __slots__ = ("member_id", "meta", "at", "deadline", "session_watch", "revoke_watch", "may_describe", "resolved")

    def __init__(self, member_id: str, meta: rec.MemberMetadata, at: MemberAssignment) -> None:
        self.member_id = member_id
        self.meta = meta
        self.at = at
        self.deadline = 0.0  # the session ends unless a heartbeat comes first (monotonic)
        self.session_watch = 0  # the session timer that counts (a shorter timeout starts a new one)
        self.revoke_watch = -1  # the epoch a revocation timer watches, -1 none
        #: its principal's DESCRIBE on a topic, from its last heartbeat (not durable: None, every
        #: topic, until a heartbeat to this coordinator gives it)
        self.may_describe: Callable[[str], bool] | None = None
        #: the topic names its subscription resolved to at the group's last target computation
        self.resolved: frozenset[str] | None = None


class _Group:
    """One consumer group's state (see the module docstring); guarded by ``lock``."""

    def __init__(self, group_id: str) -> None:
        self.group_id = group_id
        self.lock = threading.RLock()
        self.epoch = 0
        self.assignment_epoch = 0
        self.target: dict[str, Assignment] = {}
        self.members: dict[str, _Member] = {}
        self.static: dict[str, str] = {}  # instance id -> member id
        self.topics: dict[uuid.UUID, tuple[str, int]] = {}  # the subscribed topics at the last epoch bump
        self.assignor = ""
        #: deleted (DeleteGroups): a request that found it before then looks again
        self.dead = False

    def kill(self) -> None:
        """The group is gone from this coordinator (deleted, or now a classic group): a request
        that found it looks again, and its members' timers find nobody."""
        self.dead = True
        self.members = {}
        self.static = {}
        self.target = {}

    def state(self) -> str:
        if not self.members:
            return EMPTY
        if self.assignment_epoch != self.epoch:
            return ASSIGNING
        if any(m.at.epoch != self.assignment_epoch or m.at.state != STABLE for m in self.members.values()):
            return RECONCILING
        return STABLE_STATE

    def owner_epochs(self, but: str) -> dict[tuple[uuid.UUID, int], int]:
        """(topic id, partition) -> the epoch of the member other than ``but`` holding it."""
        out = {}
        for m in self.members.values():
            if m.member_id == but:
                continue
            for parts in (m.at.assigned, m.at.pending_revocation):
                for topic, ps in parts.items():
                    for p in ps:
                        out[(topic, p)] = m.at.epoch
        return out


def _partitions(assignment: Assignment | None) -> str:
    """``assignment`` for a log line (None: not said)."""
    if assignment is None:
        return "(not said)"
    return "{" + ", ".join(f"{topic}: {sorted(parts)}" for topic, parts in sorted(assignment.items()) if parts) + "}"


def _empty_at() -> MemberAssignment:
    return MemberAssignment(0, 0, STABLE, {}, {})


class ConsumerGroupCoordinator:
    """The coordinator of every consumer group (KIP-848) of one server (see the module docstring).

    Args:
        offsets: the store's ``__consumer_offsets`` (shared with the classic coordinator).
        purgatory: the server's purgatory (its timer runs sessions and revocation timeouts).
        topics: ``() -> {topic name: (topic id, partition count)}`` of every topic a group may
            subscribe to (internal ones left out).
        config: :class:`ConsumerGroupConfig`.
        classic: the classic protocol's coordinator of the same ``__consumer_offsets``, which
            groups are converted from and to (None: no classic groups, no conversions).
        timeouts: ``group id -> (session timeout ms, heartbeat interval ms)``: a group's own
            ``consumer.session.timeout.ms`` and ``consumer.heartbeat.interval.ms`` (Kafka's group
            configs), asked at each heartbeat, so a change counts from a member's next one;
            None: ``config``'s for every group.
    """

    def __init__(self, offsets: OffsetStore, purgatory: Purgatory,
                 topics: Callable[[], Mapping[str, tuple[uuid.UUID, int]]],
                 config: ConsumerGroupConfig = ConsumerGroupConfig(),
                 classic: GroupCoordinator | None = None,
                 timeouts: Callable[[str], tuple[int, int]] | None = None) -> None:
        self.offsets = offsets
        self.purgatory = purgatory
        self.topics = topics
        self.config = config
        self.timeouts = timeouts or (lambda group_id: (config.session_timeout_ms, config.heartbeat_interval_ms))
        self.classic = classic
        self._groups: dict[str, _Group] = {}
        self._lock = threading.Lock()
        self._closed = False
        self._load()

    # ------------------------------------------------------------------ loading
    def _load(self) -> None:
        """Take every group up from its records (see the module docstring)."""
        by_group: dict[str, list[tuple[int, str | None, bytes]]] = {}
        for key, value in self.offsets.consumer_group_records().items():
            try:
                parsed = rec.decode_key(key)
            except CorruptRecordError as exc:
                logger.warning("skipping a consumer group record: %s", exc)
                continue
            if parsed is not None:
                by_group.setdefault(parsed[1], []).append((parsed[0], parsed[2], value))
        for group_id, records in by_group.items():
            group = self._group_from(group_id, records)
            if group is not None:
                self._groups[group_id] = group
                logger.info("consumer group %s: loaded at epoch %d with %d members", group_id, group.epoch,
                            len(group.members))

    def _group_from(self, group_id: str, records: list[tuple[int, str | None, bytes]]) -> _Group | None:
        group = _Group(group_id)
        metas: dict[str, rec.MemberMetadata] = {}
        current: dict[str, rec.CurrentAssignment] = {}
        exists = False
        for version, member, value in records:
            try:
                decoded = rec.decode_value(version, value)
            except CorruptRecordError as exc:
                logger.warning("consumer group %s: skipping a record: %s", group_id, exc)
                continue
            if decoded is None:
                continue
            if version == rec.GROUP_METADATA:
                group.epoch, exists = decoded, True
            elif version == rec.TARGET_METADATA:
                group.assignment_epoch = decoded
            elif version == rec.PARTITION_METADATA:
                group.topics = decoded
            elif version == rec.MEMBER_METADATA and member is not None:
                metas[member] = decoded
            elif version == rec.TARGET_MEMBER and member is not None:
                group.target[member] = decoded
            elif version == rec.CURRENT_ASSIGNMENT and member is not None:
                current[member] = decoded
        if not exists:
            return None
        now = time.monotonic()
        for member_id, meta in metas.items():
            c = current.get(member_id)
            at = MemberAssignment(*c) if c is not None else _empty_at()
            member = group.members[member_id] = _Member(member_id, meta, at)
            if meta.instance_id is not None:
                group.static[meta.instance_id] = member_id
            member.deadline = now + self._session_ms(group, member) / 1000.0
            self._watch_session(group, member)
        group.target = {m: a for m, a in group.target.items() if m in group.members}
        group.assignor = self._assignor(group)
        return group

    def _records_of(self, group_id: str) -> dict[bytes, tuple[int, str | None, bytes]]:
        """Every live record of ``group_id``: key -> (key version, member id or None, value)."""
        out = {}
        for key, value in self.offsets.consumer_group_records().items():
            try:
                parsed = rec.decode_key(key)
            except CorruptRecordError:
                continue
            if parsed is not None and parsed[1] == group_id:
                out[key] = (parsed[0], parsed[2], value)
        return out

    def _reload(self, group_id: str) -> None:
        """Read one group back from its records (after a write that failed: what the log holds
        wins over what this coordinator had in memory)."""
        group = self._group_from(group_id, list(self._records_of(group_id).values()))
        with self._lock:
            if group is None:
                self._groups.pop(group_id, None)
            else:
                self._groups[group_id] = group

    # ------------------------------------------------------------------ queries
    def owns(self, group_id: str) -> bool:
        """Whether ``group_id`` is a consumer group here (its classic requests are refused)."""
        with self._lock:
            return group_id in self._groups

    def has_members(self, group_id: str) -> bool:
        """Whether the consumer group ``group_id`` has members."""
        group = self._get(group_id)
        if group is None:
            return False
        with group.lock:
            return bool(group.members)

    def _get(self, group_id: str) -> _Group | None:
        with self._lock:
            return self._groups.get(group_id)

    def groups(self) -> list[tuple[str, str]]:
        """(group id, state) of every consumer group (ListGroups)."""
        with self._lock:
            groups = list(self._groups.values())
        out = []
        for group in groups:
            with group.lock:
                out.append((group.group_id, group.state()))
        return sorted(out)

    # ------------------------------------------------------------------ heartbeat
    def heartbeat(self, request: HeartbeatRequest) -> dict[str, Any]:
        """A ConsumerGroupHeartbeat: its answer's fields (named as in its latest version)."""
        try:
            _validate(request, self.config)
        except _HeartbeatError as exc:
            return _error(exc.code, exc.message, request.member_id)
        if self._closed:
            return _error(ErrorCode.not_coordinator, "the coordinator is closing", request.member_id)
        if request.member_epoch == 0 and self.classic_has_members(request.group_id) and \
                not self._upgrade(request.group_id):
            return _error(ErrorCode.group_id_not_found, f"group {request.group_id} is a classic group with members "
                          f"(group.consumer.migration.policy {self.config.migration_policy})", request.member_id)
        with self._lock:
            group = self._groups.get(request.group_id)
            if group is None and request.member_epoch == 0:
                group = self._groups[request.group_id] = _Group(request.group_id)
        if group is None:
            return _error(ErrorCode.unknown_member_id, f"group {request.group_id} has no member {request.member_id}",
                          request.member_id)
        writes: list[tuple[bytes, bytes | None]] = []
        with group.lock:
            if group.dead:  # deleted meanwhile: a new group of that id, or an unknown member
                return self.heartbeat(request)
            try:
                if request.member_epoch in (LEAVE, LEAVE_STATIC):
                    answer = self._leave(group, request, writes)
                else:
                    answer = self._heartbeat(group, request, writes)
            except _HeartbeatError as exc:
                return _error(exc.code, exc.message, request.member_id)
            if writes and not self._write(group, writes, durable=True):
                return _error(ErrorCode.coordinator_not_available, "the group's records could not be written",
                              request.member_id)
            return answer

    def _write(self, group: _Group, writes: list[tuple[bytes, bytes | None]], durable: bool) -> bool:
        """Write a change's records (holds the group's lock); on failure the group is read
        back from its records."""
        try:
            self.offsets.append_records(writes, durable=durable)
        except (LogstoreError, OSError, ValueError) as exc:
            logger.error("consumer group %s: its records could not be written: %s", group.group_id, exc)
            self._reload(group.group_id)
            return False
        return True

    def _heartbeat(self, group: _Group, request: HeartbeatRequest, writes: list[tuple[bytes, bytes | None]]
                   ) -> dict[str, Any]:
        member_id = request.member_id or (str(uuid.uuid4()) if request.version == 0 else "")
        member = group.members.get(member_id)
        bump = False
        full = request.member_epoch == 0
        if request.member_epoch == 0:
            if member is None and request.instance_id is not None and request.instance_id in group.static:
                member = self._replace_static(group, request.instance_id, member_id, writes)
            if member is None:
                if len(group.members) >= self.config.max_size:
                    raise _HeartbeatError(ErrorCode.group_max_size_reached,
                                          f"group {group.group_id} has {len(group.members)} members")
                member = _Member(member_id, rec.MemberMetadata(request.instance_id, None, request.client_id,
                                 request.client_host, (), None, -1, None), _empty_at())
                group.members[member_id] = member
                if request.instance_id is not None:
                    group.static[request.instance_id] = member_id
                bump = True
                logger.info("consumer group %s: member %s joins", group.group_id, member_id)
        else:
            if member is None:
                raise _HeartbeatError(ErrorCode.unknown_member_id,
                                      f"group {group.group_id} has no member {member_id}")
            at = member.at
            if request.member_epoch > at.epoch or (request.member_epoch < at.epoch and (
                    request.member_epoch != at.previous_epoch or not subset(request.owned, at.assigned))):
                raise _HeartbeatError(ErrorCode.fenced_member_epoch,
                                      f"member {member_id} is at epoch {at.epoch}, not {request.member_epoch}")
        before = self._advance(group, member, _updated(member.meta, request), request.may_describe, request.owned,
                               writes, bump)
        after = member.at
        send = full or after != before or (request.owned is not None and {
            t: p for t, p in request.owned.items() if p} != {t: p for t, p in after.assigned.items() if p})
        if logger.isEnabledFor(logging.DEBUG):
            logger.debug("consumer group %s (epoch %d, target %d): member %s at epoch %d owning %s -> epoch %d %s, "
                         "assigned %s, revoking %s, assignment %s", group.group_id, group.epoch,
                         group.assignment_epoch, member_id, request.member_epoch, _partitions(request.owned),
                         after.epoch, STATE_NAMES[after.state], _partitions(after.assigned),
                         _partitions(after.pending_revocation), "sent" if send else "not sent")
        return {"throttle_time": 0, "error_code": ErrorCode.none, "error_message": None, "member_id": member_id,
                "member_epoch": after.epoch, "heartbeat_interval": self.timeouts(group.group_id)[1],
                "assignment": {"topic_partitions": [{"topic_id": t, "partitions": sorted(p)}
                                                    for t, p in sorted(after.assigned.items()) if p]}
                if send else None}

    def _advance(self, group: _Group, member: _Member, meta: rec.MemberMetadata,
                 may_describe: Callable[[str], bool] | None, owned: Assignment | None,
                 writes: list[tuple[bytes, bytes | None]], bump: bool) -> MemberAssignment:
        """A member's request of either protocol, past its checks: its new metadata (written
        when changed; the group epoch bumped when its subscription or the subscribed topics
        changed, or ``bump``), the target computed when behind the group epoch, the member's
        next reconciliation step from what it says it ``owned``, its session renewed. Returns
        where the member stood before (its new place is ``member.at``). Holds the group's lock."""
        resolved_before = member.resolved if member.resolved is not None else \
            frozenset(self._member_topics(member.meta, self.topics(), member.may_describe))
        member.may_describe = may_describe
        if meta != member.meta:
            if (meta.subscribed_topic_names, meta.subscribed_topic_regex, meta.server_assignor) != (
                    member.meta.subscribed_topic_names, member.meta.subscribed_topic_regex,
                    member.meta.server_assignor):
                bump = True
            member.meta = meta
            writes.append((rec.encode_key(rec.MEMBER_METADATA, group.group_id, member.member_id),
                           rec.encode_value(rec.MEMBER_METADATA, meta)))
        if frozenset(self._member_topics(member.meta, self.topics(), member.may_describe)) != resolved_before:
            bump = True  # the topics its regex may resolve to changed (its ACLs, or new topics)
        topics = self._subscribed_topics(group)
        if topics != group.topics:
            group.topics = topics
            writes.append((rec.encode_key(rec.PARTITION_METADATA, group.group_id),
                           rec.encode_value(rec.PARTITION_METADATA, topics)))
            bump = True
        if bump or not group.epoch:
            self._bump(group, writes)
        if group.assignment_epoch != group.epoch:
            self._compute_target(group, writes)
        before = member.at
        owners = group.owner_epochs(member.member_id)
        after = reconcile(before, group.assignment_epoch, group.target.get(member.member_id, {}),
                          lambda t, p: owners.get((t, p), -1), owned)
        if after != before:
            member.at = after
            writes.append(self._current_record(group, member))
            if after.state == UNREVOKED_PARTITIONS and member.revoke_watch != after.epoch:
                self._watch_revocation(group, member)
        self._touch(group, member)
        return before

    def _replace_static(self, group: _Group, instance_id: str, member_id: str,
                        writes: list[tuple[bytes, bytes | None]], classic: bool = False) -> _Member:
        """A static member's new process takes the place of its old one: same assignment, no
        rebalance. Between members of the consumer protocol the old one must have left with
        epoch -2, and the new one takes its epoch; when either speaks the classic protocol
        (``classic``: the new one does) it is replaced at once, from epoch 0 (Kafka's rule)."""
        old = group.members[group.static[instance_id]]
        either_classic = classic or old.meta.classic is not None
        if old.at.epoch != LEAVE_STATIC and not either_classic:
            raise _HeartbeatError(ErrorCode.unreleased_instance_id,
                                  f"instance {instance_id} is still held by member {old.member_id}")
        target = group.target.get(old.member_id)
        self._remove(group, old, writes)
        at = old.at._replace(epoch=0, previous_epoch=0) if either_classic else \
            old.at._replace(epoch=old.at.previous_epoch)
        member = group.members[member_id] = _Member(member_id, old.meta, at)
        group.static[instance_id] = member_id
        if target is not None:
            group.target[member_id] = target
        writes.append((rec.encode_key(rec.MEMBER_METADATA, group.group_id, member_id),
                       rec.encode_value(rec.MEMBER_METADATA, old.meta)))
        writes.append((rec.encode_key(rec.TARGET_MEMBER, group.group_id, member_id),
                       rec.encode_value(rec.TARGET_MEMBER, group.target.get(member_id, {}))))
        writes.append(self._current_record(group, member))
        logger.info("consumer group %s: static member %s (%s) replaces %s", group.group_id, member_id, instance_id,
                    old.member_id)
        return member

    def _leave(self, group: _Group, request: HeartbeatRequest, writes: list[tuple[bytes, bytes | None]]
               ) -> dict[str, Any]:
        member = group.members.get(request.member_id)
        if member is None and request.instance_id is not None:
            found = group.static.get(request.instance_id)
            member = group.members.get(found) if found is not None else None
        if member is None:
            raise _HeartbeatError(ErrorCode.unknown_member_id,
                                  f"group {group.group_id} has no member {request.member_id}")
        if request.member_epoch == LEAVE_STATIC and member.meta.instance_id is not None:
            if member.at.epoch != LEAVE_STATIC:
                member.at = member.at._replace(epoch=LEAVE_STATIC, previous_epoch=member.at.epoch)
                writes.append(self._current_record(group, member))
                logger.info("consumer group %s: static member %s (%s) leaves for now", group.group_id,
                            member.member_id, member.meta.instance_id)
        elif not self._downgrade(group, member, durable=True):
            self._remove(group, member, writes)
            self._bump(group, writes)
            logger.info("consumer group %s: member %s leaves", group.group_id, member.member_id)
        return {"throttle_time": 0, "error_code": ErrorCode.none, "error_message": None,
                "member_id": member.member_id, "member_epoch": request.member_epoch, "heartbeat_interval": 0,
                "assignment": None}

    def _remove(self, group: _Group, member: _Member, writes: list[tuple[bytes, bytes | None]]) -> None:
        """Forget a member (its partitions are free at once); tombstones for its records."""
        group.members.pop(member.member_id, None)
        group.target.pop(member.member_id, None)
        if member.meta.instance_id is not None and group.static.get(member.meta.instance_id) == member.member_id:
            del group.static[member.meta.instance_id]
        for version in (rec.CURRENT_ASSIGNMENT, rec.TARGET_MEMBER, rec.MEMBER_METADATA):
            writes.append((rec.encode_key(version, group.group_id, member.member_id), None))

    def _bump(self, group: _Group, writes: list[tuple[bytes, bytes | None]]) -> None:
        group.epoch += 1
        writes.append((rec.encode_key(rec.GROUP_METADATA, group.group_id),
                       rec.encode_value(rec.GROUP_METADATA, group.epoch)))

    def _current_record(self, group: _Group, member: _Member) -> tuple[bytes, bytes]:
        return (rec.encode_key(rec.CURRENT_ASSIGNMENT, group.group_id, member.member_id),
                rec.encode_value(rec.CURRENT_ASSIGNMENT, rec.CurrentAssignment(*member.at)))

    def _assignor(self, group: _Group) -> str:
        """The members' most named server assignor, else the default (Kafka's rule)."""
        named = Counter(m.meta.server_assignor for m in group.members.values() if m.meta.server_assignor)
        return named.most_common(1)[0][0] if named else self.config.assignors[0]

    def _member_topics(self, meta: rec.MemberMetadata, topics: Mapping[str, tuple[uuid.UUID, int]],
                       may_describe: Callable[[str], bool] | None) -> dict[str, tuple[uuid.UUID, int]]:
        """The topics a member's subscription names: its topic names (their DESCRIBE was
        checked when it sent them), and those its regex matches that ``may_describe`` allows."""
        names = {n: topics[n] for n in meta.subscribed_topic_names if n in topics}
        if meta.subscribed_topic_regex:
            try:
                matches = topic_matcher(meta.subscribed_topic_regex)
            except InvalidTopicRegex as exc:  # (kept by a version that checked less: it matches nothing)
                logger.warning("subscription regex %r matches no topic: %s", meta.subscribed_topic_regex, exc)
                return names
            names.update({n: v for n, v in topics.items() if matches(n) and n not in names
                          and (may_describe is None or may_describe(n))})
        return names

    def _subscribed_topics(self, group: _Group) -> dict[uuid.UUID, tuple[str, int]]:
        topics = self.topics()
        out: dict[uuid.UUID, tuple[str, int]] = {}
        for member in group.members.values():
            for name, (tid, count) in self._member_topics(member.meta, topics, member.may_describe).items():
                out[tid] = (name, count)
        return out

    def _compute_target(self, group: _Group, writes: list[tuple[bytes, bytes | None]]) -> None:
        topics = {name: (tid, count) for tid, (name, count) in group.topics.items()}
        subscriptions = {}
        for m in group.members.values():
            resolved = self._member_topics(m.meta, topics, m.may_describe)
            m.resolved = frozenset(resolved)
            subscriptions[m.member_id] = frozenset(tid for tid, _ in resolved.values())
        group.assignor = self._assignor(group)
        target = assign(group.assignor, subscriptions, {tid: n for tid, (_, n) in group.topics.items()},
                        group.target)
        for member_id, assignment in target.items():
            if group.target.get(member_id) != assignment:
                writes.append((rec.encode_key(rec.TARGET_MEMBER, group.group_id, member_id),
                               rec.encode_value(rec.TARGET_MEMBER, assignment)))
        group.target = target
        group.assignment_epoch = group.epoch
        writes.append((rec.encode_key(rec.TARGET_METADATA, group.group_id),
                       rec.encode_value(rec.TARGET_METADATA, group.epoch)))
        logger.info("consumer group %s: target assignment of epoch %d (%s) for %d members", group.group_id,
                    group.epoch, group.assignor, len(target))

    # ------------------------------------------------------------------ timers
    def _session_ms(self, group: _Group, member: _Member) -> int:
        """A member's session timeout: a classic member's own, else the group's."""
        classic = member.meta.classic
        return classic.session_timeout_ms if classic is not None else self.timeouts(group.group_id)[0]

    def _touch(self, group: _Group, member: _Member) -> None:
        before = member.deadline
        member.deadline = time.monotonic() + self._session_ms(group, member) / 1000.0
        if before <= 0 or member.deadline < before:  # (a shorter session timeout: a new, earlier timer)
            self._watch_session(group, member)

    def _watch_session(self, group: _Group, member: _Member) -> None:
        member.session_watch += 1
        mine = member.session_watch

        def attempt(expired: bool) -> bool | None:
            if not expired:
                return None
            if self._closed or member.session_watch != mine:
                return True
            writes: list[tuple[bytes, bytes | None]] = []
            with group.lock:
                if group.members.get(member.member_id) is member:
                    now = time.monotonic()
                    if now >= member.deadline:
                        logger.info("consumer group %s: member %s fenced: its session timed out", group.group_id,
                                    member.member_id)
                        if self._downgrade(group, member, durable=False):
                            return True
                        self._remove(group, member, writes)
                        self._bump(group, writes)
                        self._write(group, writes, durable=False)
                    else:
                        self.purgatory.watch(("consumer-member", group.group_id, member.member_id), attempt,
                                             member.deadline - now)
            return True

        timeout = max(0.0, member.deadline - time.monotonic())
        self.purgatory.watch(("consumer-member", group.group_id, member.member_id), attempt, timeout)

    def _watch_revocation(self, group: _Group, member: _Member) -> None:
        epoch = member.revoke_watch = member.at.epoch
        timeout_ms = member.meta.rebalance_timeout_ms if member.meta.rebalance_timeout_ms > 0 else \
            self.timeouts(group.group_id)[0]

        def attempt(expired: bool) -> bool | None:
            if not expired:
                return None
            if self._closed:
                return True
            writes: list[tuple[bytes, bytes | None]] = []
            with group.lock:
                if group.members.get(member.member_id) is member and member.at.epoch == epoch and \
                        member.at.state == UNREVOKED_PARTITIONS:
                    logger.info("consumer group %s: member %s fenced: it did not revoke its partitions within "
                                "%d ms", group.group_id, member.member_id, timeout_ms)
                    if self._downgrade(group, member, durable=False):
                        return True
                    self._remove(group, member, writes)
                    self._bump(group, writes)
                    self._write(group, writes, durable=False)
            return True

        self.purgatory.watch(("consumer-revoke", group.group_id, member.member_id, epoch), attempt,
                             timeout_ms / 1000.0)

    # ------------------------------------------------------------------ offsets
    def check_commit(self, group_id: str, member_id: str, member_epoch: int, instance_id: str | None = None,
                     api_version: int | None = None) -> int | None:
        """Whether a commit for ``group_id`` may be made by this member at this epoch: None when
        ``group_id`` is no consumer group (the classic rules apply), else an error code (0: yes).
        ``api_version``: the OffsetCommit's (a member of this protocol must use v9 or later;
        None for a transactional commit, which has no such rule). An empty consumer group
        answers None too: its id may have become a classic group's (a JoinGroup takes it
        over, as in Kafka), and the classic rules accept an admin's commit to an empty group."""
        group = self._get(group_id)
        if group is None:
            return None
        with group.lock:
            if not group.members:
                return None
            if member_epoch < 0 and not member_id:
                return ErrorCode.unknown_member_id
            member = group.members.get(member_id)
            if member is None:
                return ErrorCode.unknown_member_id
            if member.meta.classic is not None:  # a classic member commits with its generation
                return ErrorCode.none if member_epoch == member.at.epoch else ErrorCode.illegal_generation
            if api_version is not None and api_version < 9:
                return ErrorCode.unsupported_version
            if member_epoch > member.at.epoch:
                return ErrorCode.fenced_member_epoch
            if member_epoch < member.at.epoch:
                return ErrorCode.stale_member_epoch
            return ErrorCode.none

    def check_offset_fetch(self, group_id: str, member_id: str | None, member_epoch: int) -> int:
        """Whether an OffsetFetch (v9+) naming a member may read the group's offsets: 0, or
        UNKNOWN_MEMBER_ID / STALE_MEMBER_EPOCH (Kafka's validateOffsetFetch)."""
        group = self._get(group_id)
        if group is None or (member_epoch < 0 and not member_id):
            return ErrorCode.none
        with group.lock:
            member = group.members.get(member_id or "")
            if member is None:
                return ErrorCode.unknown_member_id
            return ErrorCode.none if member_epoch == member.at.epoch else ErrorCode.stale_member_epoch

    # ------------------------------------------------------------------ classic members
    def takes_classic(self, group_id: str) -> bool:
        """Whether the classic requests (JoinGroup, SyncGroup, Heartbeat, LeaveGroup) of
        ``group_id`` are this coordinator's: it is a consumer group with members. (An empty one's
        id is taken over by a classic group, as Kafka's.)"""
        return self.has_members(group_id)

    def classic_join(self, join: ClassicJoin) -> dict[str, Any]:
        """A JoinGroup into a consumer group (Kafka's classicGroupJoinToConsumerGroup): the
        member's subscription and owned partitions are read from its first protocol's
        ConsumerProtocolSubscription, the group's assignor computes its partitions, and the
        answer (no leader, no member list: nothing for the member to assign) carries its member
        epoch as the generation. Its answer's fields; durable before it returns. Thread-safe."""
        if self._closed:
            return _classic_join_error(ErrorCode.not_coordinator, join.member_id)
        if self.classic is not None and not \
                self.classic.min_session_ms <= join.session_timeout_ms <= self.classic.max_session_ms:
            return _classic_join_error(ErrorCode.invalid_session_timeout, join.member_id)  # Kafka's bounds
        group = self._get(join.group_id)
        if group is None:
            return _classic_join_error(ErrorCode.coordinator_not_available, join.member_id)
        writes: list[tuple[bytes, bytes | None]] = []
        with group.lock:
            if group.dead:
                return self.classic_join(join)
            try:
                answer = self._classic_join(group, join, writes)
            except _HeartbeatError as exc:
                logger.info("consumer group %s: classic join of %r refused: %s", group.group_id, join.member_id,
                            exc.message)
                return _classic_join_error(exc.code, join.member_id)
            if writes and not self._write(group, writes, durable=True):
                return _classic_join_error(ErrorCode.coordinator_not_available, join.member_id)
            return answer

    def _supports_classic(self, group: _Group, protocol_type: str, names: Iterable[str]) -> bool:
        """Kafka's supportsClassicProtocols: a ``consumer`` protocol type, and a protocol every
        classic member of the group supports (any, in a group without classic members)."""
        names = set(names)
        if protocol_type != CONSUMER_PROTOCOL_TYPE or not names:
            return False
        for member in group.members.values():
            if member.meta.classic is not None:
                names &= {name for name, _ in member.meta.classic.protocols}
        return bool(names)

    def _classic_join(self, group: _Group, join: ClassicJoin, writes: list[tuple[bytes, bytes | None]]
                      ) -> dict[str, Any]:
        member_id = join.member_id or str(uuid.uuid4())
        if not self._supports_classic(group, join.protocol_type, (name for name, _ in join.protocols)):
            raise _HeartbeatError(ErrorCode.inconsistent_group_protocol,
                                  f"member {member_id}'s protocols are not supported by group {group.group_id}")
        if not join.member_id and join.require_known_member_id and join.instance_id is None:
            return _classic_join_error(ErrorCode.member_id_required, member_id)
        try:
            subscription = parse_subscription(join.protocols[0][1])
        except ValueError as exc:
            raise _HeartbeatError(ErrorCode.inconsistent_group_protocol, str(exc)) from None
        bump = replaced = False
        member = None
        held = group.static.get(join.instance_id) if join.instance_id is not None else None
        if held is not None and not join.member_id:  # a static member's new process takes its place
            member = self._replace_static(group, join.instance_id or "", member_id, writes, classic=True)
            replaced = True
        elif held is not None and held != member_id:
            raise _HeartbeatError(ErrorCode.fenced_instance_id,
                                  f"instance {join.instance_id} is held by member {held}, not {member_id}")
        else:
            member = group.members.get(member_id)
        if member is None:
            if len(group.members) >= self.config.max_size:
                raise _HeartbeatError(ErrorCode.group_max_size_reached,
                                      f"group {group.group_id} has {len(group.members)} members")
            member = group.members[member_id] = _Member(member_id, rec.MemberMetadata(
                join.instance_id, None, join.client_id, join.client_host, (), None, -1, None), _empty_at())
            if join.instance_id is not None:
                group.static[join.instance_id] = member_id
            bump = True
            logger.info("consumer group %s: classic member %s joins", group.group_id, member_id)
        elif member.meta.classic is None and not replaced:
            raise _HeartbeatError(ErrorCode.unknown_member_id, f"member {member_id} uses the consumer protocol")
        topics = self.topics()
        owned = {topics[name][0]: parts for name, parts in subscription.owned.items() if name in topics}
        meta = rec.MemberMetadata(join.instance_id, subscription.rack_id, join.client_id or member.meta.client_id,
                                  join.client_host or member.meta.client_host,
                                  tuple(sorted(set(subscription.topics))), None, join.rebalance_timeout_ms, None,
                                  rec.ClassicMemberMetadata(join.session_timeout_ms, tuple(join.protocols)))
        self._advance(group, member, meta, None, owned, writes, bump)
        return {"throttle_time": 0, "error_code": ErrorCode.none, "generation_id": member.at.epoch,
                "protocol_type": CONSUMER_PROTOCOL_TYPE, "protocol_name": join.protocols[0][0], "leader": "",
                "skip_assignment": False, "member_id": member_id, "members": []}

    def _classic_member(self, group: _Group, member_id: str, instance_id: str | None) -> _Member:
        """The classic member a request names (Kafka's validateConsumerGroupMember): by its
        instance id when given (FENCED_INSTANCE_ID when another member id holds it), else by id."""
        if instance_id is not None:
            held = group.static.get(instance_id)
            if held is None:
                raise _HeartbeatError(ErrorCode.unknown_member_id, f"no member has instance id {instance_id}")
            if held != member_id:
                raise _HeartbeatError(ErrorCode.fenced_instance_id,
                                      f"instance {instance_id} is held by member {held}, not {member_id}")
        member = group.members.get(member_id)
        if member is None or member.meta.classic is None:
            raise _HeartbeatError(ErrorCode.unknown_member_id,
                                  f"group {group.group_id} has no classic member {member_id}")
        return member

    def classic_sync(self, group_id: str, generation: int, member_id: str, instance_id: str | None,
                     protocol_type: str | None, protocol_name: str | None) -> dict[str, Any]:
        """A SyncGroup of a classic member: its current partitions as a ConsumerProtocolAssignment
        of its subscription's version (ILLEGAL_GENERATION for another generation than its member
        epoch, REBALANCE_IN_PROGRESS when the group moved on and it must rejoin first). Its
        answer's fields. Thread-safe."""
        group = self._get(group_id)
        if group is None:
            return _sync_answer(ErrorCode.unknown_member_id)
        with group.lock:
            if group.dead:  # it became a classic group meanwhile: the member joins that
                return _sync_answer(ErrorCode.rebalance_in_progress)
            try:
                member = self._classic_member(group, member_id, instance_id)
                classic = member.meta.classic
                assert classic is not None
                if generation != member.at.epoch:
                    raise _HeartbeatError(ErrorCode.illegal_generation, f"member {member_id} is at epoch "
                                          f"{member.at.epoch}, not {generation}")
                if (protocol_type is not None and protocol_type != CONSUMER_PROTOCOL_TYPE) or (
                        protocol_name is not None and protocol_name not in {n for n, _ in classic.protocols}):
                    raise _HeartbeatError(ErrorCode.inconsistent_group_protocol,
                                          f"protocol {protocol_type}/{protocol_name} is not the member's")
                if group.epoch > member.at.epoch and member.at.state != UNREVOKED_PARTITIONS:
                    raise _HeartbeatError(ErrorCode.rebalance_in_progress, f"group {group_id} is at epoch "
                                          f"{group.epoch}: member {member_id} must rejoin")
            except _HeartbeatError as exc:
                return _sync_answer(exc.code)
            self._touch(group, member)
            names = {tid: name for name, (tid, _) in self.topics().items()}
            names.update({tid: name for tid, (name, _) in group.topics.items()})
            try:
                version = subscription_version(classic.protocols[0][1])
            except ValueError:
                version = 0
            assignment = encode_assignment({names[t]: p for t, p in member.at.assigned.items() if p and t in names},
                                           version)
            return _sync_answer(ErrorCode.none, assignment, protocol_type or CONSUMER_PROTOCOL_TYPE,
                                protocol_name or classic.protocols[0][0])

    def classic_heartbeat(self, group_id: str, generation: int, member_id: str, instance_id: str | None) -> int:
        """A Heartbeat of a classic member: its error code. REBALANCE_IN_PROGRESS (rejoin) when
        the group epoch passed its own, when it must revoke partitions, or when partitions it
        waits for are free (Kafka's classicGroupHeartbeatToConsumerGroup). Thread-safe."""
        group = self._get(group_id)
        if group is None:
            return ErrorCode.unknown_member_id
        with group.lock:
            if group.dead:  # it became a classic group meanwhile: the member joins that
                return ErrorCode.rebalance_in_progress
            try:
                member = self._classic_member(group, member_id, instance_id)
            except _HeartbeatError as exc:
                return exc.code
            if generation != member.at.epoch:
                return ErrorCode.illegal_generation
            self._touch(group, member)
            at = member.at
            if at.epoch < group.epoch or at.state == UNREVOKED_PARTITIONS or (
                    at.state == UNRELEASED_PARTITIONS and not self._waits_for_others(group, member)):
                return ErrorCode.rebalance_in_progress
            return ErrorCode.none

    def _waits_for_others(self, group: _Group, member: _Member) -> bool:
        """Whether a partition of the member's target that it does not hold is held by another."""
        owners = group.owner_epochs(member.member_id)
        return any((t, p) in owners for t, ps in group.target.get(member.member_id, {}).items() for p in ps
                   if p not in member.at.assigned.get(t, frozenset()))

    def classic_leave(self, group_id: str, members: Iterable[tuple[str, str | None]]) -> list[int]:
        """A LeaveGroup of classic members, ``(member id, instance id)`` pairs (an empty member
        id with an instance id: an admin's removal): an error code for each; the group epoch is
        bumped once for those that left. Durable before it returns. Thread-safe."""
        members = list(members)
        group = self._get(group_id)
        if group is None:
            return [ErrorCode.unknown_member_id for _ in members]
        writes: list[tuple[bytes, bytes | None]] = []
        errors = []
        with group.lock:
            if group.dead and self.classic is not None:  # it became a classic group meanwhile
                return self.classic.leave(group_id, members)
            for member_id, instance_id in members:
                try:
                    if instance_id is not None and not member_id:
                        held = group.static.get(instance_id)
                        if held is None:
                            raise _HeartbeatError(ErrorCode.unknown_member_id, f"no instance {instance_id}")
                        member_id = held
                    member = self._classic_member(group, member_id, instance_id)
                except _HeartbeatError as exc:
                    errors.append(exc.code)
                    continue
                self._remove(group, member, writes)
                logger.info("consumer group %s: classic member %s leaves", group_id, member_id)
                errors.append(ErrorCode.none)
            if writes:
                topics = self._subscribed_topics(group)
                if topics != group.topics:
                    group.topics = topics
                    writes.append((rec.encode_key(rec.PARTITION_METADATA, group_id),
                                   rec.encode_value(rec.PARTITION_METADATA, topics)))
                self._bump(group, writes)
                if not self._write(group, writes, durable=True):
                    return [ErrorCode.coordinator_not_available for _ in members]
        return errors

    # ------------------------------------------------------------------ conversions
    def classic_has_members(self, group_id: str) -> bool:
        """Whether a classic group ``group_id`` has members (its classic coordinator's)."""
        if self.classic is None:
            return False
        found = self.classic.describe(group_id)
        return found is not None and bool(found["members"])

    def _upgrade(self, group_id: str) -> bool:
        """Kafka's online upgrade: the classic group ``group_id`` becomes a consumer group (where
        ``group.consumer.migration.policy`` allows, its protocol type is ``consumer`` and its
        size fits), each member keeping its generation's assignment (ConsumerGroup.fromClassicGroup);
        the classic group's tombstone and the consumer group's records go in one batch, and
        neither kind of request for the group is answered in between. Whether it was done."""
        if self.classic is None or not self.config.upgrades:
            return False
        held: list[_Group] = []

        def convert(stored: GroupMetadata) -> list[tuple[bytes, bytes | None]] | None:
            if stored.protocol_type != CONSUMER_PROTOCOL_TYPE or len(stored.members) >= self.config.max_size:
                return None
            try:
                group, writes = self._from_classic(group_id, stored)
            except ValueError as exc:
                logger.warning("classic group %s cannot become a consumer group: %s", group_id, exc)
                return None
            group.lock.acquire()
            held.append(group)
            with self._lock:
                old = self._groups.get(group_id)
                if old is not None:
                    old.kill()
                self._groups[group_id] = group
            return writes

        try:
            done = self.classic.hand_over(group_id, convert)
            if held and not done:  # the batch was not written: the classic group stays
                held[0].kill()
                with self._lock:
                    if self._groups.get(group_id) is held[0]:
                        del self._groups[group_id]
            if done:
                logger.info("classic group %s: became a consumer group (online upgrade)", group_id)
                for member in held[0].members.values():
                    self._watch_session(held[0], member)
            return done
        finally:
            if held:
                held[0].lock.release()

    def _from_classic(self, group_id: str, stored: GroupMetadata
                      ) -> tuple[_Group, list[tuple[bytes, bytes | None]]]:
        """A consumer group of a classic group's members, and its records: the group epoch and
        every member's epoch is the classic generation, its current and target assignment the
        partitions it was handed.

        Raises:
            ValueError: a member's subscription or assignment is not the consumer protocol's.
        """
        group = _Group(group_id)
        group.epoch = group.assignment_epoch = stored.generation
        topics = self.topics()
        now = time.monotonic()
        for m in stored.members:
            subscription = parse_subscription(m.subscription)
            assigned = {topics[name][0]: frozenset(parts)
                        for name, parts in assigned_partitions(m.assignment).items() if name in topics and parts}
            meta = rec.MemberMetadata(m.group_instance_id, subscription.rack_id, m.client_id, m.client_host,
                                      tuple(sorted(set(subscription.topics))), None, m.rebalance_timeout_ms, None,
                                      rec.ClassicMemberMetadata(m.session_timeout_ms,
                                                                ((stored.protocol or "", m.subscription),)))
            member = group.members[m.member_id] = _Member(
                m.member_id, meta, MemberAssignment(stored.generation, stored.generation, STABLE, assigned, {}))
            member.deadline = now + m.session_timeout_ms / 1000.0
            if m.group_instance_id is not None:
                group.static[m.group_instance_id] = m.member_id
            group.target[m.member_id] = assigned
        group.topics = self._subscribed_topics(group)
        group.assignor = self._assignor(group)
        writes: list[tuple[bytes, bytes | None]] = [
            (rec.encode_key(rec.GROUP_METADATA, group_id), rec.encode_value(rec.GROUP_METADATA, group.epoch)),
            (rec.encode_key(rec.PARTITION_METADATA, group_id), rec.encode_value(rec.PARTITION_METADATA, group.topics)),
            (rec.encode_key(rec.TARGET_METADATA, group_id), rec.encode_value(rec.TARGET_METADATA, group.epoch))]
        for member in group.members.values():
            writes.append((rec.encode_key(rec.MEMBER_METADATA, group_id, member.member_id),
                           rec.encode_value(rec.MEMBER_METADATA, member.meta)))
            writes.append((rec.encode_key(rec.TARGET_MEMBER, group_id, member.member_id),
                           rec.encode_value(rec.TARGET_MEMBER, member.at.assigned)))
            writes.append(self._current_record(group, member))
        return group, writes

    def _downgrade(self, group: _Group, leaving: _Member, durable: bool) -> bool:
        """Kafka's online downgrade, when ``leaving`` (leaving or fenced) is the group's last
        member of the consumer protocol and classic members remain (where
        ``group.consumer.migration.policy`` allows): the group becomes a classic group of those
        members, each handed its target partitions at the group epoch as generation
        (ClassicGroup.fromConsumerGroup), which rebalances at once. The consumer group's
        tombstones and the classic group's metadata record go in one batch (``durable``: waited
        for). Whether it was done (else the caller removes the member). Holds the group's lock."""
        others = [m for m in group.members.values() if m is not leaving]
        if self.classic is None or not self.config.downgrades or leaving.meta.classic is not None or not others \
                or any(m.meta.classic is None for m in others):
            return False
        common = None
        for m in others:
            names = [name for name, _ in m.meta.classic.protocols]  # type: ignore[union-attr]
            common = names if common is None else [n for n in common if n in names]
        if not common:
            return False
        protocol = common[0]
        by_id = {tid: name for tid, (name, _) in group.topics.items()}
        members = []
        for m in others:
            metadata = dict(m.meta.classic.protocols)[protocol]  # type: ignore[union-attr]
            try:
                version = subscription_version(metadata)
            except ValueError:
                version = 0
            target = group.target.get(m.member_id, m.at.assigned)
            members.append(GroupMember(m.member_id, m.meta.instance_id, m.meta.client_id, m.meta.client_host,
                                       m.meta.rebalance_timeout_ms, self._session_ms(group, m), metadata,
                                       encode_assignment({by_id[t]: p for t, p in target.items() if p and t in by_id},
                                                         version)))
        stored = GroupMetadata(CONSUMER_PROTOCOL_TYPE, group.epoch, protocol, members[0].member_id,
                               int(time.time() * 1000), tuple(members))
        writes: list[tuple[bytes, bytes | None]] = [(key, None) for key in self._records_of(group.group_id)]
        writes.append((encode_group_key(group.group_id), encode_group_value(stored)))
        try:
            self.offsets.append_records(writes, durable=durable)
        except (LogstoreError, OSError, ValueError) as exc:
            logger.error("consumer group %s: could not become a classic group: %s", group.group_id, exc)
            return False
        self.classic.adopt(group.group_id, stored)  # first: a request for the group finds one kind or the other
        group.kill()
        with self._lock:
            if self._groups.get(group.group_id) is group:
                del self._groups[group.group_id]
        logger.info("consumer group %s: became a classic group of %d members when member %s left (online "
                    "downgrade)", group.group_id, len(members), leaving.member_id)
        return True

    # ------------------------------------------------------------------ deletion
    def delete_group(self, group_id: str) -> int | None:
        """A DeleteGroups of ``group_id``: None when it is no consumer group here (the classic
        rules apply), else an error code: NON_EMPTY_GROUP while it has members, else 0 once
        its records and committed offsets are tombstoned, in one batch (Kafka's deletion of an
        empty consumer group; the id may then start a group of either protocol).

        Durability: fsynced (or held by a majority) before this returns. Thread-safe."""
        group = self._get(group_id)
        if group is None:
            return None
        with group.lock:
            if group.dead:
                return None
            if group.members:
                return ErrorCode.non_empty_group
            try:
                self.offsets.delete_group(group_id, self._records_of(group_id))
            except (LogstoreError, OSError, ValueError) as exc:
                logger.error("consumer group %s: could not be deleted: %s", group_id, exc)
                self._reload(group_id)
                return ErrorCode.coordinator_not_available
            group.kill()
            with self._lock:
                if self._groups.get(group_id) is group:
                    del self._groups[group_id]
            logger.info("consumer group %s: deleted", group_id)
            return ErrorCode.none

    def delete_offsets(self, group_id: str, partitions: Iterable[tuple[str, int]],
                       partition_exists: Callable[[str, int], bool]) -> tuple[int, list[int]] | None:
        """An OffsetDelete for ``group_id``: None when it is no consumer group here (the classic
        rules apply), else (the group's error, an error per partition), as Kafka's: a partition
        of a topic some member's subscription resolves to is kept (GROUP_SUBSCRIBED_TO_TOPIC),
        one of no topic here is UNKNOWN_TOPIC_OR_PARTITION, the others' offsets are deleted.

        Durability: the tombstones are fsynced before this returns. Thread-safe."""
        group = self._get(group_id)
        if group is None:
            return None
        with group.lock:
            if group.dead:
                return None
            topics = self.topics()
            subscribed = set()
            for member in group.members.values():
                subscribed.update(self._member_topics(member.meta, topics, member.may_describe))
            return delete_unsubscribed_offsets(self.offsets, group_id, partitions, partition_exists, subscribed)

    # ------------------------------------------------------------------ describe
    def describe(self, group_id: str) -> dict[str, Any] | None:
        """A group as ConsumerGroupDescribe names it (topics by id and name), or None."""
        group = self._get(group_id)
        if group is None:
            return None
        with group.lock:
            def named(assignment: Assignment) -> dict[str, Any]:
                return {"topic_partitions": [{"topic_id": t, "topic_name": group.topics.get(t, ("", 0))[0],
                                              "partitions": sorted(p)} for t, p in sorted(assignment.items()) if p]}
            return {"group_id": group_id, "group_state": group.state(), "group_epoch": group.epoch,
                    "assignment_epoch": group.assignment_epoch, "assignor_name": group.assignor or
                    self._assignor(group),
                    "members": [{"member_id": m.member_id, "instance_id": m.meta.instance_id,
                                 "rack_id": m.meta.rack_id, "member_epoch": m.at.epoch,
                                 "client_id": m.meta.client_id, "client_host": m.meta.client_host,
                                 "subscribed_topic_names": list(m.meta.subscribed_topic_names),
                                 "subscribed_topic_regex": m.meta.subscribed_topic_regex,
                                 "assignment": named(m.at.assigned),
                                 "target_assignment": named(group.target.get(m.member_id, {})),
                                 "member_type": 0 if m.meta.classic is not None else 1, "state": STATE_NAMES.get(m.at.state, "UNKNOWN")}
                                for m in group.members.values()]}

    def close(self) -> None:
        """Stop acting on timers (the server is stopping, or the node no longer coordinates)."""
        self._closed = True


# ---------------------------------------------------------------------- request checks
def _validate(request: HeartbeatRequest, config: ConsumerGroupConfig) -> None:
    """Kafka's throwIfConsumerGroupHeartbeatRequestIsInvalid, and the assignor and regex."""
    def invalid(message: str) -> _HeartbeatError:
        return _HeartbeatError(ErrorCode.invalid_request, message)

    if not request.group_id:
        raise invalid("GroupId can't be empty.")
    if request.instance_id is not None and not request.instance_id:
        raise invalid("InstanceId can't be empty.")
    if request.rack_id is not None and not request.rack_id:
        raise invalid("RackId can't be empty.")
    epoch = request.member_epoch
    if not request.member_id and (request.version >= 1 or epoch != 0):
        raise invalid("MemberId can't be empty.")
    if epoch == 0:
        if request.rebalance_timeout_ms == -1:
            raise invalid("RebalanceTimeoutMs must be provided in first request.")
        if request.owned is None or any(request.owned.values()):
            raise invalid("TopicPartitions must be empty when (re-)joining.")
        if request.subscribed_topic_names is None and request.subscribed_topic_regex is None:
            raise invalid("SubscribedTopicNames or SubscribedTopicRegex must be set in first request.")
    elif epoch == LEAVE_STATIC:
        if request.instance_id is None:
            raise invalid("InstanceId can't be null.")
    elif epoch < LEAVE_STATIC:
        raise invalid(f"MemberEpoch {epoch} is invalid.")
    if request.server_assignor is not None and request.server_assignor not in config.assignors:
        raise _HeartbeatError(ErrorCode.unsupported_assignor,
                              f"ServerAssignor {request.server_assignor} is not supported. Supported assignors: "
                              f"{', '.join(config.assignors)}.")
    if request.subscribed_topic_regex:
        check_regex(request.subscribed_topic_regex)


def check_regex(pattern: str) -> None:
    """Refuse a subscription regex that RE2 (Kafka's RE2/J) cannot compile."""
    try:
        topic_matcher(pattern)
    except InvalidTopicRegex as exc:
        raise _HeartbeatError(ErrorCode.invalid_regular_expression,
                              f"SubscribedTopicRegex {pattern!r} is not a valid regular expression: {exc}") from None


def _updated(meta: rec.MemberMetadata, request: HeartbeatRequest) -> rec.MemberMetadata:
    """The member's metadata with what the request changes (its null fields change nothing)."""
    names = meta.subscribed_topic_names if request.subscribed_topic_names is None else \
        tuple(sorted(set(request.subscribed_topic_names)))
    regex = meta.subscribed_topic_regex if request.subscribed_topic_regex is None else \
        (request.subscribed_topic_regex or None)
    return rec.MemberMetadata(
        request.instance_id if request.instance_id is not None else meta.instance_id,
        request.rack_id if request.rack_id is not None else meta.rack_id,
        request.client_id or meta.client_id, request.client_host or meta.client_host, names, regex,
        request.rebalance_timeout_ms if request.rebalance_timeout_ms != -1 else meta.rebalance_timeout_ms,
        request.server_assignor if request.server_assignor is not None else meta.server_assignor)


def _classic_join_error(code: int, member_id: str) -> dict[str, Any]:
    return {"throttle_time": 0, "error_code": code, "generation_id": -1, "protocol_type": None,
            "protocol_name": "", "leader": "", "skip_assignment": False, "member_id": member_id, "members": []}


def _sync_answer(code: int, assignment: bytes = b"", protocol_type: str | None = None,
                 protocol_name: str | None = None) -> dict[str, Any]:
    return {"throttle_time": 0, "error_code": code, "protocol_type": protocol_type, "protocol_name": protocol_name,
            "assignment": assignment}


def _error(code: int, message: str, member_id: str) -> dict[str, Any]:
    return {"throttle_time": 0, "error_code": code, "error_message": message, "member_id": member_id or None,
            "member_epoch": -1, "heartbeat_interval": 0, "assignment": None}


def owned_partitions(topic_partitions: Iterable[Any] | None) -> Assignment | None:
    """A request's ``topic_partitions`` (kio entities with ``topic_id`` and ``partitions``) as
    an assignment; None when the request has none."""
    if topic_partitions is None:
        return None
    out: dict[uuid.UUID, frozenset[int]] = {}
    for tp in topic_partitions:
        if tp.topic_id is not None:
            out[tp.topic_id] = out.get(tp.topic_id, frozenset()) | frozenset(int(p) for p in tp.partitions)
    return out
