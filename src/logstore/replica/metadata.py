"""A replica set's topic metadata changed at runtime: :class:`ReplicatedMetadata`, records in
the replicated ``__cluster_metadata`` topic, and :class:`ReplicaAdminApis`, the admin handlers
that make the changes through it (CreateTopics: ``ReplicaKafkaApis.make_topic``).

Each node of a replica set has its own store, so a topic's config override or a new partition
made in one store would never reach the others. As Kafka's KRaft keeps such facts in
``__cluster_metadata`` (ConfigRecord, PartitionRecord), a replica set keeps them in a replicated
``__cluster_metadata`` topic (one partition, compacted, replicated like ``__consumer_offsets``):

- A **topic record** (key ``topic:<topic>``) holds a topic CreateTopics made: ``{"topic": ...,
  "count": n, "configs": {...}}`` (Kafka writes a TopicRecord, a PartitionRecord per partition
  and a ConfigRecord per config). Its id is the one every node derives from its name
  (:func:`~logstore.replica.context.replica_topic_id`): topics are never deleted (DeleteTopics
  is refused), so a name has one id for the set's life.
- A **topic config record** (key ``topic-config:<topic>``) holds the topic's whole set of
  overrides after a change, by Kafka's names (``{"topic": ..., "configs": {"retention.ms":
  "1000", ...}}``): the set AlterConfigs would write. Kafka writes one ConfigRecord per config
  name; one record per topic keeps compaction's rule simple (its newest record is the topic's
  overrides) and the change atomic.
- A **partitions record** (key ``partitions:<topic>``) holds the topic's partition count after a
  CreatePartitions (``{"topic": ..., "count": n}``; Kafka's PartitionRecord names one new
  partition each, with its replicas: here every partition's replicas are the voters).

A change is made by the leader of ``__cluster_metadata-0``: it checks the change against its
own store (the rules of :mod:`logstore.kafka.configs` and of
:meth:`LogStore.alter_topic_config` / :meth:`LogStore.create_partitions`, which has applied
every committed record), appends the record as acks=all
(:class:`~logstore.replica.replicatedlog.ReplicatedLog`), and answers once a majority holds it,
after applying it to its own store. The other nodes forward AlterConfigs,
IncrementalAlterConfigs and CreatePartitions to that leader
(:class:`~logstore.replica.kafkaapis.ReplicaKafkaApis`).

Every node applies the records below its high watermark, in order, to its store (the topic's
open logs take a new config at once; new partitions become replicated partitions with their
own elections and fetchers, through the ``grow`` hook its node gives): as its node's metadata
thread finds the high watermark moved (never on the thread that ticks the elections), and from
the log's start when the node starts. Records below the offset applied to are committed: a
high watermark that goes back (a follower taking a new leader's, still behind) is waited out,
never read from again; the start's replay takes each topic's configs from its newest record
only, so a checkpointed high watermark older than what was applied cannot undo a change. A node that was down
during a change catches up when it rejoins: its fetcher copies the records, the leader's answer
moves its high watermark, it applies them. Applying is idempotent (a record sets a state, it
does not add to one: a topic record, "the topic exists with at least its count of partitions
and exactly its overrides", whatever the node's store had, a topic named on its command line
too), so a record applied again after a restart changes nothing. A record
that cannot be applied (say the disk refused a partition directory) is logged and skipped, and
tried again at the node's next start.

The topics named on ``logstore node``'s command line (``--topic name:partitions``) are created
when missing; the partition count the metadata records wins over the count there (a node
restarted with its old ``--topic`` keeps the partitions CreatePartitions added), and a node
replicates every topic its store has, those CreateTopics made too.

Broker configs (the dynamic defaults), and those of any resource but a topic, are refused on a
replica set (POLICY_VIOLATION): each node's are its own store's, fixed when it starts.

Thread-safety: thread-safe. Durability: a change returns once a majority holds it; each node's
store takes it durably (the store's own rules) when the node applies it.
"""

from __future__ import annotations

import json
import logging
import threading
from typing import Any, Callable, Mapping

from ..errorcodes import ErrorCode
from ..errors import (InvalidPartitionsError, LogstoreError, NotLeaderOrFollowerError,
                      TopicExistsError, UnknownTopicOrPartitionError)
from ..kafka import configs as kafkaconfigs
from ..kafka.admin import AdminApis
from ..log.config import LogConfig
from ..store.kafkadirs import is_internal_topic
from ..store.store import LogStore
from .context import NodeContext
from .leader import LeaderSide
from .quorum import Role
from .replicatedlog import WRITE_TIMEOUT_S, ReplicatedLog

__all__ = ["ReplicatedMetadata", "ReplicaAdminApis", "METADATA_TOPIC", "METADATA_TOPIC_CONFIG", "MAX_PARTITIONS_PER_CHANGE"]

logger = logging.getLogger("logstore.replication.metadata")

#: Kafka's name for the cluster's metadata log
METADATA_TOPIC = "__cluster_metadata"
#: its config: compacted (a key's newest record is the fact)
METADATA_TOPIC_CONFIG = dict(cleanup_policy="compact", min_cleanable_dirty_ratio=0.5)
_TOPIC_PREFIX = b"topic:"
_CONFIG_PREFIX = b"topic-config:"
_PARTITIONS_PREFIX = b"partitions:"
_READ_BYTES = 1 << 20


def topic_record(topic: str, count: int, configs: Mapping[str, str]) -> tuple[bytes, bytes]:
    """(key, value) of a topic record: a topic created with its partition count and overrides.
    Pure."""
    return _TOPIC_PREFIX + topic.encode(), json.dumps({"topic": topic, "count": count,
                                                       "configs": dict(configs)}).encode()


def config_record(topic: str, configs: Mapping[str, str]) -> tuple[bytes, bytes]:
    """(key, value) of a topic config record: the topic's whole set of overrides. Pure."""
    return _CONFIG_PREFIX + topic.encode(), json.dumps({"topic": topic, "configs": dict(configs)}).encode()


def partitions_record(topic: str, count: int) -> tuple[bytes, bytes]:
    """(key, value) of a partitions record: the topic's partition count. Pure."""
    return _PARTITIONS_PREFIX + topic.encode(), json.dumps({"topic": topic, "count": count}).encode()


#: the most partitions one change creates (a CreateTopics topic, a CreatePartitions growth):
#: every node makes them, their files and their fetchers when it applies the change, so one
#: change stays bounded (Kafka's controller also caps the partitions one request creates)
MAX_PARTITIONS_PER_CHANGE = 10_000


def _check_new_partitions(name: str, count: int) -> None:
    """Raise InvalidPartitionsError unless one change may create ``count`` partitions. Pure."""
    if not 1 <= count <= MAX_PARTITIONS_PER_CHANGE:
        raise InvalidPartitionsError(f"topic {name!r}: {count} new partition(s); a replica set creates 1 to "
                                     f"{MAX_PARTITIONS_PER_CHANGE} in one change")


def _topic_of(key: bytes | None, value: bytes | None) -> str | None:
    """The topic a record names (None: a record naming none, or unreadable). Pure."""
    if key is None or value is None:
        return None
    try:
        topic = json.loads(value)["topic"]
    except (ValueError, KeyError, TypeError):
        return None
    return topic if isinstance(topic, str) else None


class ReplicatedMetadata:
    """The topic metadata of a replica set (see the module docstring). Thread-safe.

    Args:
        context: the node's context (its ``__cluster_metadata-0`` replica).
        leader: the node's leader side (the high watermark of its writes).
        store: the node's store, which each record is applied to.
        grow: ``grow(topic, count)``: the node replicates ``topic``'s partitions up to
            ``count`` (the store already has them).
        timeout_s: how long a change waits for the majority.
    """

    def __init__(self, context: NodeContext, leader: LeaderSide, store: LogStore, grow: Callable[[str, int], None],
                 timeout_s: float = WRITE_TIMEOUT_S) -> None:
        self.context = context
        self.leader = leader
        self.store = store
        self.grow = grow
        self.timeout_s = timeout_s
        self._lock = threading.RLock()  # applying (the metadata thread's and a change's)
        self._update_lock = threading.Lock()  # one change at a time
        self._read_to = -1  # the offset the records were applied up to

    def _replica(self):  # type: ignore[no-untyped-def]
        rep = self.context.replica(METADATA_TOPIC, 0)
        if rep is None:
            raise LogstoreError(f"node {self.context.node_id} does not replicate {METADATA_TOPIC}")
        return rep

    # ------------------------------------------------------------------ applying
    def catch_up(self) -> None:
        """Apply every committed record not applied yet (one attribute read when none is new).
        Records below the offset applied to are committed: a high watermark below it (a new
        leader's, not yet moved) is waited out, never read from again. The first call (the
        node's start) replays the log from its start; there a topic's configs are taken from
        its newest record only (see :meth:`_newest_configs`). A record that cannot be applied
        is logged and skipped."""
        log = self._replica().log
        if log.high_watermark <= self._read_to:
            return
        with self._lock:
            hw = log.high_watermark
            if hw <= self._read_to:
                return
            newest = self._newest_configs(log) if self._read_to < 0 else None
            offset = max(self._read_to, log.log_start_offset)
            while offset < hw:
                records = log.read(offset, max_bytes=_READ_BYTES, max_offset=hw)
                if not records:
                    break
                for record in records:
                    configs = newest is None or newest.get(_topic_of(record.key, record.value)) == record.offset
                    self._apply(record.key, record.value, record.offset, configs)
                offset = records[-1].offset + 1
            self._read_to = hw

    @staticmethod
    def _newest_configs(log: Any) -> dict[str | None, int]:
        """The offset of each topic's newest record carrying its configs (a topic or topic
        config record), in the whole log up to its end, committed or not. A restart replays the
        log up to its checkpointed high watermark, which may be older than what was applied
        before; the store already holds the newest configs applied, so an older record must
        not undo them: only the newest is applied again (a newer one above the high watermark
        is applied when it commits; one that was applied is committed, so it stays)."""
        newest: dict[str | None, int] = {}
        offset = log.log_start_offset
        while True:
            records = log.read(offset, max_bytes=_READ_BYTES)
            if not records:
                return newest
            for record in records:
                if record.key is not None and record.key.startswith((_TOPIC_PREFIX, _CONFIG_PREFIX)):
                    newest[_topic_of(record.key, record.value)] = record.offset
            offset = records[-1].offset + 1

    def _apply(self, key: bytes | None, value: bytes | None, offset: int, configs: bool = True) -> None:
        """Apply one record to the store: a topic record as "the topic exists with at least its
        count of partitions (and, with ``configs``, exactly its overrides)", whatever the store
        had (a topic named on the command line too); a config record's overrides (with
        ``configs``); a partitions record's count."""
        if key is None or value is None:
            return
        try:
            fact = json.loads(value)
            topic = fact["topic"]
            if key.startswith(_TOPIC_PREFIX):
                count = int(fact["count"])
                overrides = kafkaconfigs.store_keywords(fact["configs"])
                self.store.create_topic(topic, count, exist_ok=True, **overrides)
                if self.store.partitions_for(topic) < count:
                    self.store.create_partitions(topic, count)
                if configs:
                    self.store.alter_topic_config(topic, lambda _current: overrides)
                self.grow(topic, self.store.partitions_for(topic))
            elif key.startswith(_CONFIG_PREFIX):
                if configs:
                    new = kafkaconfigs.store_keywords(fact["configs"])
                    self.store.alter_topic_config(topic, lambda _current: new)
            elif key.startswith(_PARTITIONS_PREFIX):
                count = int(fact["count"])
                if self.store.partitions_for(topic) < count:
                    self.store.create_partitions(topic, count)
                self.grow(topic, count)
            else:
                logger.warning("%s-0 at %d: unknown record key %r, skipped", METADATA_TOPIC, offset, key)
        except (ValueError, KeyError, TypeError, LogstoreError, OSError) as exc:
            logger.error("node %d: the %s-0 record at %d could not be applied: %s", self.context.node_id,
                         METADATA_TOPIC, offset, exc)

    # ------------------------------------------------------------------ the leader and its changes
    def leader_id(self) -> int:
        """The node that leads ``__cluster_metadata-0`` (-1: none known)."""
        election = self._replica().election
        return election.leader if election.leader >= 0 else -1

    def leading(self) -> bool:
        """Whether this node leads ``__cluster_metadata-0`` (and so makes the changes)."""
        return self._replica().election.role is Role.LEADER

    def _change(self, check: Callable[[], tuple[bytes, bytes] | None]) -> None:
        """Run ``check`` over the store with every committed record applied (it raises to
        refuse, or returns the record to write; None: nothing to write), append the record as
        the leader, wait for the majority, and apply it here.

        Raises:
            NotLeaderOrFollowerError: this node does not lead ``__cluster_metadata-0`` (or lost
                it before the majority took the change).
            RequestTimedOutError: no majority within ``timeout_s`` (the change may still commit).
        """
        with self._update_lock:
            rep = self._replica()
            with rep.cond:
                election = rep.election
                if election.role is not Role.LEADER:
                    raise NotLeaderOrFollowerError(f"node {self.context.node_id} does not lead {METADATA_TOPIC}-0")
                epoch = election.epoch
                caught_up = rep.hw >= rep.log.log_end_offset
            if not caught_up:  # a new leader's first change waits for its log to be committed
                raise NotLeaderOrFollowerError(f"{METADATA_TOPIC}-0's new leader has not committed its log yet")
            self.catch_up()
            record = check()
            if record is None:
                return
            log = ReplicatedLog(self.context, self.leader, rep, epoch, self.timeout_s)
            log.append_batch([record[1]], [record[0]])
            log.flush()
            self.catch_up()

    def create_topic(self, name: str, count: int, configs: Mapping[str, str]) -> None:
        """Create ``name`` with ``count`` partitions and the overrides ``configs`` (Kafka's
        names, checked by the caller) on every node (as :meth:`LogStore.create_topic`, whose
        errors it raises; the leader only, see :meth:`_change`). Its topic id is the one every
        node derives from its name (:func:`~logstore.replica.context.replica_topic_id`): a
        replica set's topics are never deleted.

        Every node applies the record, so it is checked first as :meth:`LogStore.create_topic`
        would check it (a record no node can apply is never written), and the answer is an
        error when this node could not apply it.

        Raises:
            TopicExistsError: the topic exists (its creation committed meanwhile).
            InvalidPartitionsError: ``count`` is below 1, or above :data:`MAX_PARTITIONS_PER_CHANGE`.
            InvalidConfigError: an override the store refuses.
            LogstoreError: committed, but this node's store could not take it (logged).
        """
        def check() -> tuple[bytes, bytes] | None:
            try:
                self.store.partitions_for(name)
            except UnknownTopicOrPartitionError:
                _check_new_partitions(name, count)
                if LogConfig.from_kafka({**self.store.defaults.to_kafka(), **configs}).remote_storage_enable:
                    self.store.check_remote_storage(name)  # (every node has the set's object store)
                return topic_record(name, count, configs)
            raise TopicExistsError(f"topic {name!r} already exists")
        self._change(check)
        try:
            self.store.partitions_for(name)
        except UnknownTopicOrPartitionError:
            raise LogstoreError(f"topic {name!r} was committed to {METADATA_TOPIC} but this node could not create "
                                "it (see its log)") from None

    def alter_topic_config(self, name: str, edit: Callable[[dict[str, str]], Mapping[str, Any]],
                           validate_only: bool = False) -> None:
        """Replace ``name``'s overrides by ``edit(current)`` on every node (as
        :meth:`LogStore.alter_topic_config`, whose errors it raises; the leader only, see
        :meth:`_change`)."""
        def check() -> tuple[bytes, bytes] | None:
            new = self.store.alter_topic_config(name, edit, validate_only=True)
            return None if validate_only else config_record(name, new)
        self._change(check)

    def create_partitions(self, name: str, count: int, validate_only: bool = False) -> None:
        """Grow ``name`` to ``count`` partitions on every node (as
        :meth:`LogStore.create_partitions`, whose errors it raises; the leader only, see
        :meth:`_change`)."""
        def check() -> tuple[bytes, bytes] | None:
            self.store.create_partitions(name, count, validate_only=True)
            _check_new_partitions(name, count - self.store.partitions_for(name))
            return None if validate_only else partitions_record(name, count)
        self._change(check)


class ReplicaAdminApis(AdminApis):
    """:class:`~logstore.kafka.admin.AdminApis` of a replica node: CreatePartitions and topic
    configs through the set's :class:`ReplicatedMetadata` (the leader of
    ``__cluster_metadata-0`` answers; the node's Kafka listener forwards to it), a new
    partition's replicas being the voters; the configs of any other resource (a broker's, a
    group's) refused (see the module docstring).
    Thread-safety: as AdminApis."""

    def __init__(self, apis: Any, metadata: ReplicatedMetadata, **kwargs: Any) -> None:
        super().__init__(apis, **kwargs)
        self.metadata = metadata

    def grow_topic(self, name: str, count: int, validate_only: bool) -> None:
        self.metadata.create_partitions(name, count, validate_only)

    def alter_topic(self, name: str, edit: Callable[[dict[str, str]], Mapping[str, Any]],
                    validate_only: bool) -> None:
        self.metadata.alter_topic_config(name, edit, validate_only)

    def resource_refusal(self, resource_type: int, resource_name: str) -> tuple[int, str] | None:
        if resource_type == kafkaconfigs.TOPIC:
            if is_internal_topic(resource_name):
                return ErrorCode.policy_violation, (
                    f"internal topic {resource_name!r} keeps the configs the replica set gives it: its replication "
                    "and its coordinators rely on them (a compacted metadata log, leader-change records)")
            return None
        return ErrorCode.policy_violation, ("only topic configs are replicated on a replica set: its broker configs "
                                            "(dynamic defaults) and any other resource's are fixed when each node "
                                            "starts")


def known_partitions(store: LogStore, topic: str, asked: int) -> int:
    """How many partitions a node replicates of a topic named on its command line with
    ``asked`` partitions (created with them when missing): the store's count once the topic
    exists, which holds what the metadata's committed records grew it to (the metadata wins;
    see the module docstring)."""
    try:
        count = store.partitions_for(topic)
    except UnknownTopicOrPartitionError:
        return asked
    if count != asked:
        logger.warning("topic %s: %d partition(s) (as created, and grown by CreatePartitions), not the %d named on "
                       "the command line: the metadata wins", topic, count, asked)
    return count
