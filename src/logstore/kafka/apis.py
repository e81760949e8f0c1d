"""What a Kafka-protocol server answers, API by API, over a LogStore (Kafka's KafkaApis).

Each ``on_<api>`` method takes a parsed :class:`~logstore.kafka.wire.KafkaRequest` and returns the
response's fields as a mapping (named as in the latest version; :func:`logstore.kafka.wire.encode` writes
what the request's version has), a Future of one (a fetch that waits for records), or None (a
produce with acks=0, which gets no response).

- Produce: each partition's batch is validated whole (CRC, every record, sizes), checked
  against the log's producer state and stored byte for byte (``Log.append_idempotent``); a
  refused batch writes nothing and gets Kafka's error for its partition (a magic v0/v1
  message set INVALID_RECORD, an idempotent producer's old epoch INVALID_PRODUCER_EPOCH, a gap
  in its sequence OUT_OF_ORDER_SEQUENCE_NUMBER). A retry of one of a producer's last five
  batches gets the offsets that batch already has.
- Fetch: whole batches from the one holding the fetch offset, at least one batch per partition
  even past the byte limits (KIP-74), as file regions that the network layer writes with
  sendfile; a fetch with fewer than ``min_bytes`` waits up to ``max_wait_ms`` in the purgatory
  for an append, through this server or by any process sharing the store. Below the local
  segments (tiered storage), a partition's batches come from the object store on the remote
  reader's threads, the fetch waiting at most ``remote.fetch.max.wait.ms`` for them
  (:mod:`~logstore.kafka.remotefetch`).
- Metadata names this one broker as the leader, replica and in-sync replica of every
  partition; a topic asked for that does not exist is created when the server auto-creates
  topics (Kafka's ``auto.create.topics.enable``). DescribeTopicPartitions (KIP-966) and
  DescribeCluster answer from the same hooks (:meth:`KafkaApis.brokers`,
  :meth:`KafkaApis.partition_states`, ...), which a replica set's listener overrides.
- Topic ids (KIP-516): the store's (:mod:`logstore.store.topicids`), given by Metadata v10+,
  CreateTopics v7 and DescribeTopicPartitions; Metadata v12 and DeleteTopics v6 look topics up
  by id, and Fetch v13+ names them only so: an id no topic has (a topic deleted, perhaps
  created again) is UNKNOWN_TOPIC_ID, never another topic's records.
- Transactions (KIP-98): this broker is every transactional id's coordinator
  (the store's :func:`~logstore.txn.local.store_coordinator`, shared with the library's
  transactional producers and the other processes of the store). It writes the COMMIT/ABORT
  markers into the partitions' logs itself (``Log.append_txn_marker``); a transactional
  produce is refused for a partition the transaction has not added (INVALID_TXN_STATE), and
  TxnOffsetCommit writes the offsets as the producer's transactional batch, applied by the
  group's offsets at its COMMIT marker.

Thread-safety: every method may be called from several threads at once; each partition's
producer state is the log's, checked and changed under the log's lock.
"""

from __future__ import annotations

import logging
import re
import threading
import uuid
from dataclasses import replace
from concurrent.futures import Future
from contextlib import ExitStack
from typing import Any, Callable, Iterable, Mapping, NamedTuple

from .._fileio import FileRegion
from ..errorcodes import ErrorCode, code_for
from ..errors import (
    CorruptRecordError,
    InvalidConfigError,
    InvalidProducerEpochError,
    InvalidRecordError,
    InvalidTopicError,
    LogstoreError,
    OffsetMovedToTieredStorageError,
    OffsetOutOfRangeError,
    OutOfOrderSequenceError,
    RecordTooLargeError,
    RemoteStorageError,
    TopicExistsError,
    UnknownTopicIdError,
    UnknownTopicOrPartitionError,
    UnsupportedCodecError,
)
from . import aclapis, aclguard, configs as kafkaconfigs
from .aclfile import AclFile
from .acls import Authorizer
from .admin import AdminApis
from .groupconfigfile import GroupConfigFile
from .._native import lib
from ..log.config import LogConfig
from ..log.epochs import UNDEFINED_EPOCH, UNDEFINED_OFFSET
from ..records.batch import decode_batches, parse_header
from ..txn.producerids import ProducerIds
from ..groups.offsets import OFFSETS_TOPIC, offset_store
from ..groups.coordinator import GroupConfig, GroupCoordinator, listed_by
from .scramusers import ScramUsers
from ..groups.consumergroup import (CONSUMER_PROTOCOL_TYPE, ClassicJoin, ConsumerGroupConfig,
                                    ConsumerGroupCoordinator, HeartbeatRequest, owned_partitions)
from .apikeys import API_VERSIONS, CONSUMER_GROUP_DESCRIBE, CONSUMER_GROUP_HEARTBEAT, FETCH, PRODUCE
from .wire import SUPPORTED, KafkaRequest
from ..net.protocol import Offload
from ..net.purgatory import Purgatory
from .remotefetch import NO_OFFSETS, RemoteFetch, RemoteRead, RemoteReader
from ..store.kafkadirs import is_internal_topic
from ..store.store import LogStore
from ..store.topicids import ZERO_TOPIC_ID, topic_id_text
from ..txn.coordinator import TransactionCoordinator, TxnConfig
from ..txn.local import store_coordinator

__all__ = ["KafkaApis", "one_v2_batch_problem", "delete_topics_asked", "FetchTopic", "UNKNOWN_OPERATIONS",
           "is_internal_topic", "internal_topic_refusal"]

logger = logging.getLogger("logstore.kafka")

#: Kafka's "authorized operations not asked for / not known" (KIP-430's INT32_MIN): what the
#: handlers answer; :mod:`~logstore.kafka.aclguard` puts the principal's operations in their
#: place when a request asks for them
UNKNOWN_OPERATIONS = -2147483648
#: DescribeTopicPartitions' ceiling on partitions per answer (Kafka's
#: ``max.request.partition.size.limit`` default)
MAX_REQUEST_PARTITION_SIZE_LIMIT = 2000
#: ApiVersions v3+'s client software name and version (Kafka's ApiVersionsRequest.isValid)
_SOFTWARE = re.compile(r"[a-zA-Z0-9](?:[a-zA-Z0-9\-.]*[a-zA-Z0-9])?")
#: A fetched partition's offsets when it is answered with an error (Kafka's: unknown).
_NO_OFFSETS = NO_OFFSETS


def internal_topic_refusal(topic: str) -> tuple[int, int, str] | None:
    """A client's produce to ``topic`` refused as Kafka's ReplicaManager refuses an append to an
    internal topic, whatever the ACLs say (INVALID_TOPIC_EXCEPTION, base offset -1, why), or
    None: not internal. Only the server's own coordinators write internal topics. Pure."""
    if not is_internal_topic(topic):
        return None
    return ErrorCode.invalid_topic_exception, -1, f"Cannot append to internal topic {topic}"


def one_v2_batch_problem(records: bytes | memoryview) -> str | None:
    """Why a Produce (v3+) partition's records are not one magic 2 batch, or None. Only the
    framing is looked at here (a message set's first message has its magic byte where a batch
    has it): the batch itself is validated whole by the append."""
    if len(records) == 0:
        return "no record batch: Produce v3 and later carry exactly one per partition"
    if len(records) > lib.LS_POS_MAGIC and records[lib.LS_POS_MAGIC] != lib.LS_MAGIC:
        return f"a magic {records[lib.LS_POS_MAGIC]} message set: Produce v3 and later carry magic 2 batches only"
    if len(records) >= lib.LS_LOG_OVERHEAD:
        length = int.from_bytes(records[lib.LS_POS_BATCH_LENGTH:lib.LS_LOG_OVERHEAD], "big", signed=True)
        size = lib.LS_LOG_OVERHEAD + length
        if lib.LS_LOG_OVERHEAD < size < len(records):
            return f"{len(records) - size} bytes after the first batch: Produce v3 and later carry exactly one"
    return None



def keyless_record_errors(config: LogConfig, records: bytes | None) -> list[dict[str, Any]]:
    """ProduceResponse's ``record_errors`` for a batch a compacted log refused
    (INVALID_RECORD): the index in the batch of each record without a key, as Kafka's
    LogValidator names them. A client tells those records (INVALID_RECORD) from the rest of
    the batch by them (librdkafka fails the others with INVALID_DIFFERENT_RECORD, which the
    application may produce again); for any other refusal the list is empty. Pure, thread-safe."""
    if not config.compacted or not records:
        return []
    try:
        keys = [record.key for record in decode_batches(records)]
    except (LogstoreError, ValueError):  # a batch refused for being corrupt: no record to name
        return []
    return [{"batch_index": i, "batch_index_error_message": "a compacted topic does not accept a record without a key"}
            for i, key in enumerate(keys) if key is None]

class KafkaApis:
    """The request handlers of one server over ``store`` (see the module docstring).

    Args:
        store: the LogStore served.
        node_id, host, port: how Metadata names this broker (the advertised listener).
        cluster_id: Metadata's cluster id.
        auto_create_topics, num_partitions: Kafka's ``auto.create.topics.enable`` and
            ``num.partitions``.
        group_config: the group coordinator's settings.
        consumer_group_config: the consumer group protocol's (KIP-848), or None to serve only
            the classic protocol (Kafka's ``group.coordinator.rebalance.protocols=classic``).
        txn_config: the transaction coordinator's settings.
        group_config_bounds: the broker's bounds of a consumer group's own configs
            (``group.consumer.min/max.*``).
        fsync_acks_all: answer an acks=all produce only once its batches are fsynced.
        purgatory: the purgatory to hold fetches in (a replica node's, whose partitions' changes
            wake them); None: one of its own, closed by :meth:`close`.

    A subclass serving a replicated store (:mod:`logstore.replica.kafkaapis`) says per partition whether this
    broker may answer for it (:meth:`partition_error`); fetches stop at the log's high
    watermark in any case.
    """

    def __init__(self, store: LogStore, *, node_id: int, host: str, port: int, cluster_id: str,
                 auto_create_topics: bool = True, num_partitions: int = 1,
                 group_config: GroupConfig = GroupConfig(), fsync_acks_all: bool = False,
                 purgatory: Purgatory | None = None, txn_config: TxnConfig = TxnConfig(),
                 consumer_group_config: ConsumerGroupConfig | None = ConsumerGroupConfig(),
                 group_config_bounds: kafkaconfigs.GroupConfigBounds = kafkaconfigs.GroupConfigBounds()) -> None:
        self.store = store
        self.node_id = node_id
        self.host = host
        self.port = port
        self.cluster_id = cluster_id
        self.auto_create_topics = auto_create_topics
        self.num_partitions = num_partitions
        self._owns_purgatory = purgatory is None
        self.purgatory = purgatory if purgatory is not None else Purgatory(f"kafka-{node_id}")
        self._appends = _AppendWatcher(store, self.purgatory, f"kafka-{node_id}-appends")
        #: the threads that read the remote tier for fetches (tiered storage)
        self.remote_reader = RemoteReader(f"kafka-{node_id}-remote-reader")
        self.producer_ids = ProducerIds(store.root)
        self._groups_lock = threading.Lock()
        self.group_config = group_config
        #: acks=all answers after an fsync of the partitions written (else once in the log)
        self.fsync_acks_all = fsync_acks_all
        self._groups: GroupCoordinator | None = None
        self.consumer_group_config = consumer_group_config
        self._consumer_groups: ConsumerGroupCoordinator | None = None
        #: the groups' own configs (resource type GROUP), durable in the store's directory
        self.group_configs = GroupConfigFile(store.root)
        self.group_config_bounds = group_config_bounds
        self.txn_config = txn_config
        self._txn: TransactionCoordinator | None = None
        #: api key -> (lowest, highest) version served (what ApiVersions advertises)
        self.supported: dict[int, tuple[int, int]] = dict(SUPPORTED)
        #: the APIs answered on the network loop, not on a worker: they never block (a Produce
        #: or Fetch that would wait is handed to a worker from there: on_produce, on_fetch)
        self.inline: frozenset[int] = frozenset({API_VERSIONS, PRODUCE, FETCH})
        #: a Fetch on the network loop holds its logs without waiting, or goes to a worker
        #: (on_fetch); False: it reads as on a worker (a subclass whose reads take other locks)
        self.fetch_holds_logs = True
        self.handlers: dict[int, Callable[[KafkaRequest], Any]] = {
            0: self.on_produce, 1: self.on_fetch, 2: self.on_list_offsets, 3: self.on_metadata,
            18: self.on_api_versions, 19: self.on_create_topics, 20: self.on_delete_topics,
            22: self.on_init_producer_id, 8: self.on_offset_commit, 9: self.on_offset_fetch,
            10: self.on_find_coordinator, 11: self.on_join_group, 12: self.on_heartbeat, 13: self.on_leave_group,
            14: self.on_sync_group, 15: self.on_describe_groups, 16: self.on_list_groups,
            32: self.on_describe_configs, 17: self.on_sasl_handshake, 36: self.on_sasl_authenticate,
            24: self.on_add_partitions_to_txn, 25: self.on_add_offsets_to_txn, 26: self.on_end_txn,
            28: self.on_txn_offset_commit, 61: self.on_describe_producers, 65: self.on_describe_transactions,
            66: self.on_list_transactions, 42: self.on_delete_groups, 47: self.on_offset_delete,
            50: self.on_describe_user_scram_credentials, 51: self.on_alter_user_scram_credentials,
            29: self.on_describe_acls, 30: self.on_create_acls, 31: self.on_delete_acls,
            60: self.on_describe_cluster, 75: self.on_describe_topic_partitions, 23: self.on_offset_for_leader_epoch,
            CONSUMER_GROUP_HEARTBEAT: self.on_consumer_group_heartbeat,
            CONSUMER_GROUP_DESCRIBE: self.on_consumer_group_describe,
        }
        if consumer_group_config is None:  # only the classic protocol: 68 and 69 not advertised
            for key in (CONSUMER_GROUP_HEARTBEAT, CONSUMER_GROUP_DESCRIBE):
                self.supported.pop(key, None)
                self.handlers.pop(key)
        #: CreatePartitions, AlterConfigs, IncrementalAlterConfigs, DeleteRecords, DescribeLogDirs,
        #: ElectLeaders
        self.admin = AdminApis(self)
        self.handlers.update({37: self.admin.on_create_partitions, 33: self.admin.on_alter_configs,
                              44: self.admin.on_incremental_alter_configs, 21: self.admin.on_delete_records,
                              35: self.admin.on_describe_log_dirs, 43: self.admin.on_elect_leaders})
        #: SCRAM users over the protocol, over the listener's SASL users (the server sets them)
        self.scram_users = ScramUsers(None)
        #: Kafka's authorizer (None: everyone may do everything); see :meth:`guard_handlers`
        self.authorizer: Authorizer | None = None

    def new_authorizer(self, super_users: Iterable[str] = (), allow_everyone_if_no_acl_found: bool = False
                       ) -> Authorizer:
        """Kafka's authorizer over this server's ACLs: the store's ``.acls`` file
        (:class:`~logstore.kafka.aclfile.AclFile`; a replica node's are replicated)."""
        return Authorizer(AclFile(self.store.root), super_users, allow_everyone_if_no_acl_found)

    def guard_handlers(self, authorizer: Authorizer | None) -> None:
        """Put every handler behind its authorization rule
        (:data:`~logstore.kafka.aclguard.RULES`), checked with ``authorizer``; None: no
        authorizer (everyone may do everything; KIP-430's authorized operations are all).
        Called once, by the server, when every handler is in :attr:`handlers`."""
        self.authorizer = authorizer
        self.handlers = aclguard.guard(self.handlers, authorizer,
                                       aclguard.GuardContext(lambda name: self._partition_exists(name, 0),
                                                             lambda: self.auto_create_topics, self._topic_name,
                                                             self.known_topics))

    def _topic_name(self, topic_id: uuid.UUID) -> str | None:
        try:
            return self.store.topic_name(topic_id)
        except UnknownTopicIdError:
            return None

    def close(self) -> None:
        """Answer the fetches, joins and syncs still waiting (the server is stopping)."""
        self._appends.close()
        self.remote_reader.close()
        if self._groups is not None:
            self._groups.close()
        if self._consumer_groups is not None:
            self._consumer_groups.close()
        if self._owns_purgatory:
            self.purgatory.close()

    @property
    def groups(self) -> GroupCoordinator:
        """The group coordinator (``__consumer_offsets`` is created on first use)."""
        if self._groups is None:
            with self._groups_lock:
                if self._groups is None:
                    self._groups = self.group_coordinators(offset_store(self.store))
        return self._groups

    @property
    def consumer_groups(self) -> ConsumerGroupCoordinator | None:
        """The consumer group protocol's coordinator (KIP-848), over the classic one's offsets;
        None when only the classic protocol is served."""
        _ = self.groups  # made with the classic coordinator (a replica node's: for its epoch)
        return self._consumer_groups

    def group_coordinators(self, offsets: Any) -> GroupCoordinator:
        """Make the classic coordinator over ``offsets`` (an OffsetStore) and, when served,
        the consumer group coordinator beside it (``self._consumer_groups``), which checks the
        commits of its groups (holds: the groups' lock)."""
        classic = GroupCoordinator(offsets, self.purgatory, self._partition_exists, self.group_config)
        if self.consumer_group_config is not None:
            consumer = ConsumerGroupCoordinator(offsets, self.purgatory, self.subscribable_topics,
                                                self.consumer_group_config, classic, self.group_timeouts)
            classic.committer_check = consumer.check_commit
            self._consumer_groups = consumer
        return classic

    def subscribable_topics(self) -> dict[str, tuple[uuid.UUID, int]]:
        """``{name: (topic id, partition count)}`` of the topics a consumer group may subscribe to."""
        out = {}
        for name in self.store.topics():
            try:
                out[name] = (self.store.topic_id(name), self.store.partitions_for(name))
            except (UnknownTopicOrPartitionError, InvalidTopicError):
                continue  # deleted meanwhile
        return out

    @property
    def txn(self) -> TransactionCoordinator:
        """The store's transaction coordinator (:func:`~logstore.txn.local.store_coordinator`:
        ``__transaction_state`` is created and loaded on first use; it closes with the store)."""
        if self._txn is None:
            config = self.txn_config
            if self.store.transaction_fsync and not config.fsync:
                config = replace(config, fsync=True)
            self._txn = store_coordinator(self.store, config)
        return self._txn

    def _partition_exists(self, topic: str, partition: int) -> bool:
        try:
            return 0 <= partition < self.store.partitions_for(topic)
        except (UnknownTopicOrPartitionError, InvalidTopicError):
            return False

    # ------------------------------------------------------------------ ApiVersions
    def on_api_versions(self, request: KafkaRequest) -> dict[str, Any]:
        body = request.body
        if request.api_version >= 3 and not (_SOFTWARE.fullmatch(body.client_software_name)
                                             and _SOFTWARE.fullmatch(body.client_software_version)):
            # As Kafka: an invalid client software name or version is INVALID_REQUEST, no ranges
            return {"error_code": ErrorCode.invalid_request, "api_keys": [], "throttle_time": 0}
        return {"error_code": ErrorCode.none, "api_keys": api_version_ranges(self.supported), "throttle_time": 0}

    # ------------------------------------------------------------------ the cluster and its topics
    # Metadata, DescribeTopicPartitions and DescribeCluster answer from these; a replica set's
    # listener overrides them (its brokers, topics and partitions' leaders).
    def brokers(self) -> list[dict[str, Any]]:
        """Every broker of the cluster as Metadata names them (node id, advertised host and port)."""
        return [{"node_id": self.node_id, "host": self.host, "port": self.port, "rack": None}]

    def controller_id(self) -> int:
        """The broker named as the controller (Metadata, DescribeCluster)."""
        return self.node_id

    def known_topics(self) -> list[str]:
        """The topics an all-topics Metadata or DescribeTopicPartitions lists, sorted."""
        return self.store.topics()

    def partition_states(self, name: str) -> list[dict[str, Any]]:
        """Each partition of topic ``name`` as Metadata describes it (error code, index, leader
        and its epoch, replicas, in-sync and offline replicas).

        Raises:
            UnknownTopicOrPartitionError, InvalidTopicError: no such topic (or name).
        """
        me = [self.node_id]
        return [{"error_code": ErrorCode.none, "partition_index": p, "leader_id": self.node_id, "leader_epoch": 0,
                 "replica_nodes": me, "isr_nodes": me, "offline_replicas": []}
                for p in range(self.store.partitions_for(name))]

    def leader_hint(self, topic: str, partition: int) -> tuple[int, int] | None:
        """(leader id, leader epoch) of a partition this broker refused as NOT_LEADER_OR_FOLLOWER,
        for the ``current_leader`` of Fetch v12+ and Produce v10+ answers (KIP-951), or None
        when not known. A single store leads every partition."""
        return None

    def leader_epoch(self, topic: str, partition: int) -> int:
        """The leader epoch this broker leads a partition in (Metadata's ``leader_epoch``): a
        single store's is always 0."""
        return 0

    def _endpoints(self, node_ids: set[int]) -> list[dict[str, Any]]:
        """Fetch v16's and Produce v10's ``node_endpoints``: the brokers named in ``current_leader``."""
        return [b for b in self.brokers() if b["node_id"] in node_ids]

    # ------------------------------------------------------------------ Metadata
    def on_metadata(self, request: KafkaRequest) -> dict[str, Any]:
        body = request.body
        version = request.api_version
        allow_create = self.auto_create_topics and getattr(body, "allow_auto_topic_creation", True)
        if body.topics is None or (version == 0 and not body.topics):  # v0: an empty list means every topic
            topics = [self._topic_metadata(request, name, False) for name in self.known_topics()]
        else:
            topics = []
            for t in body.topics:
                topic_id = getattr(t, "topic_id", None) or ZERO_TOPIC_ID
                if t.name is None and version < 12 or topic_id != ZERO_TOPIC_ID and version < 12:
                    # As Kafka: v10 and v11 carry ids but may not look a topic up by one
                    topics.append(_topic_refused(t.name, ErrorCode.invalid_request, topic_id))
                elif t.name is None:  # v12: by id (never auto-created)
                    try:
                        name = self.store.topic_name(topic_id)
                    except UnknownTopicIdError:
                        topics.append(_topic_refused(None, ErrorCode.unknown_topic_id, topic_id))
                        continue
                    topics.append(self._topic_metadata(request, name, False))
                else:
                    topics.append(self._topic_metadata(request, t.name, allow_create))
        return {
            "throttle_time": 0,
            "brokers": self.brokers(),
            "cluster_id": self.cluster_id,
            "controller_id": self.controller_id(),
            "topics": topics,
            "cluster_authorized_operations": UNKNOWN_OPERATIONS,
        }

    def _topic_metadata(self, request: KafkaRequest, name: str, create: bool) -> dict[str, Any]:
        try:
            partitions = self.partition_states(name)
        except UnknownTopicOrPartitionError:
            partitions = []
        except InvalidTopicError:
            return _topic_refused(name, ErrorCode.invalid_topic_exception)
        if not partitions and create:
            try:
                self.store.create_topic(name, self.num_partitions, exist_ok=True)
                partitions = self.partition_states(name)
                logger.info("created topic %s (%d partitions) for a metadata request", name, len(partitions))
            except InvalidTopicError:
                return _topic_refused(name, ErrorCode.invalid_topic_exception)
        if not partitions:
            return _topic_refused(name, ErrorCode.unknown_topic_or_partition)
        return {"error_code": ErrorCode.none, "name": name, "topic_id": self.store.topic_id(name),
                "is_internal": is_internal_topic(name), "partitions": partitions,
                "topic_authorized_operations": UNKNOWN_OPERATIONS}

    # ------------------------------------------------------------------ DescribeTopicPartitions
    def on_describe_topic_partitions(self, request: KafkaRequest) -> dict[str, Any]:
        """KIP-966: topics (every one when none is named) with their ids and partitions, sorted
        by name, at most ``response_partition_limit`` partitions per answer (and at most
        :data:`MAX_REQUEST_PARTITION_SIZE_LIMIT`); ``next_cursor`` names where the next request
        starts (Kafka's rules, DescribeTopicPartitionsRequestHandler)."""
        body = request.body
        cursor = body.cursor
        start_name = cursor.topic_name if cursor is not None else ""
        every = not body.topics
        names = self.known_topics() if every else sorted({t.name for t in body.topics})
        names = [n for n in names if n >= start_name]
        problem = None
        if cursor is not None and not every and cursor.topic_name not in names:
            problem = f"the topic list should contain the cursor topic {cursor.topic_name!r}"
        elif cursor is not None and cursor.partition_index < 0:
            problem = f"the cursor's partition must be valid, not {cursor.partition_index}"
        if problem is not None:  # Kafka's error response: every topic asked for with the error
            return {"throttle_time": 0, "next_cursor": None,
                    "topics": [{**_topic_refused(t.name, ErrorCode.invalid_request), "partitions": []}
                               for t in body.topics]}
        remaining = max(min(MAX_REQUEST_PARTITION_SIZE_LIMIT, body.response_partition_limit), 1)
        topics: list[dict[str, Any]] = []
        next_cursor = None
        for name in names:
            if remaining == 0:  # the next answer starts with this topic
                next_cursor = {"topic_name": name, "partition_index": 0}
                break
            try:
                states = self.partition_states(name)
            except (UnknownTopicOrPartitionError, InvalidTopicError) as exc:
                if not every:
                    error = ErrorCode.invalid_topic_exception if isinstance(exc, InvalidTopicError) \
                        else ErrorCode.unknown_topic_or_partition
                    topics.append(_topic_refused(name, error))
                continue
            first = cursor.partition_index if cursor is not None and name == cursor.topic_name else 0
            chosen = [p for p in states if p["partition_index"] >= first][:remaining]
            for p in chosen:
                p.update(eligible_leader_replicas=[], last_known_elr=[])
            topics.append({"error_code": ErrorCode.none, "name": name, "topic_id": self.store.topic_id(name),
                           "is_internal": is_internal_topic(name), "partitions": chosen,
                           "topic_authorized_operations": UNKNOWN_OPERATIONS})
            left = [p for p in states if p["partition_index"] >= first][len(chosen):]
            if left:
                next_cursor = {"topic_name": name, "partition_index": left[0]["partition_index"]}
                break
            remaining -= len(chosen)
        return {"throttle_time": 0, "topics": topics, "next_cursor": next_cursor}

    # ------------------------------------------------------------------ OffsetForLeaderEpoch
    def on_offset_for_leader_epoch(self, request: KafkaRequest) -> dict[str, Any]:
        """A consumer's check of its position after a leader change (KIP-320): per partition the
        largest epoch at or below the one asked for and where it ends in the leader's log (the
        log end offset for the current epoch), as Kafka's ``endOffsetForEpoch``. A request whose
        ``current_leader_epoch`` is older than the partition's gets FENCED_LEADER_EPOCH, a newer
        one UNKNOWN_LEADER_EPOCH; a partition this broker does not lead, its error."""
        topics = []
        for topic in request.body.topics:
            partitions = []
            for p in topic.partitions:
                entry = {"partition": p.partition, "error_code": ErrorCode.none, "leader_epoch": UNDEFINED_EPOCH,
                         "end_offset": UNDEFINED_OFFSET}
                partitions.append(entry)
                refused = self.partition_error(topic.topic, p.partition)
                try:
                    if refused:
                        raise UnknownTopicOrPartitionError(f"{topic.topic}-{p.partition}")
                    log = self.store.partition(topic.topic, p.partition)
                except (UnknownTopicOrPartitionError, InvalidTopicError):
                    entry["error_code"] = refused or ErrorCode.unknown_topic_or_partition
                    continue
                current = self.leader_epoch(topic.topic, p.partition)
                if 0 <= p.current_leader_epoch < current:
                    entry["error_code"] = ErrorCode.fenced_leader_epoch
                elif p.current_leader_epoch > current:
                    entry["error_code"] = ErrorCode.unknown_leader_epoch
                elif log.latest_epoch < 0:  # a single store's log has no epoch history: all of it is epoch 0
                    if p.leader_epoch == 0:
                        entry.update(leader_epoch=0, end_offset=log.log_end_offset)
                else:
                    epoch, end = log.end_offset_for_epoch(p.leader_epoch)
                    entry.update(leader_epoch=epoch, end_offset=end)
            topics.append({"topic": topic.topic, "partitions": partitions})
        return {"throttle_time": 0, "topics": topics}

    # ------------------------------------------------------------------ DescribeCluster
    def on_describe_cluster(self, request: KafkaRequest) -> dict[str, Any]:
        body = request.body
        endpoint_type = getattr(body, "endpoint_type", 1)
        answer: dict[str, Any] = {"throttle_time": 0, "error_code": ErrorCode.none, "error_message": None,
                                  "endpoint_type": endpoint_type, "cluster_id": self.cluster_id,
                                  "controller_id": self.controller_id(), "brokers": [],
                                  "cluster_authorized_operations": UNKNOWN_OPERATIONS}
        if endpoint_type != 1:  # 1: brokers; 2: controllers, which a broker does not list (as Kafka's)
            answer.update(error_code=ErrorCode.unsupported_endpoint_type, controller_id=-1,
                          error_message=f"endpoint type {endpoint_type} is not served by a broker (1: brokers)")
            return answer
        answer["brokers"] = [{"broker_id": b["node_id"], "host": b["host"], "port": b["port"], "rack": b["rack"],
                              "is_fenced": False} for b in self.brokers()]
        return answer

    # ------------------------------------------------------------------ Produce
    def on_produce(self, request: KafkaRequest) -> dict[str, Any] | None | Offload:
        """Append each partition's batch; the answer once appended (acks=0: none). On the
        network loop (a small request, see ``KafkaProtocol.inline``) a one-partition request
        whose append need not wait is answered there (:meth:`_produce_at_once`), any other
        through a worker (an :class:`~logstore.net.protocol.Offload`)."""
        if request.on_loop:
            answer = self._produce_at_once(request)
            if answer is not _WOULD_WAIT:
                return answer  # type: ignore[no-any-return]
            return Offload(lambda: self._produce(request))
        return self._produce(request)

    def _produce_at_once(self, request: KafkaRequest) -> Any:
        """A Produce answered without waiting (on the network loop): one partition's
        non-transactional batch, its log open and held without waiting
        (:meth:`~logstore.log.log.Log.exclusive_if_free`), appended through
        :meth:`~logstore.log.log.Log.try_append_idempotent`; else ``_WOULD_WAIT``, nothing
        appended (a refusal too: the worker's path answers it, with its logging). The fetches
        waiting on the partition are answered by the append watcher, woken by the append's
        notification, not here: their reads may wait."""
        body = request.body
        acks = body.acks
        if (acks != 1 and acks != 0 and (acks != -1 or self.fsync_acks_all)) or len(body.topic_data) != 1:
            return _WOULD_WAIT
        topic = body.topic_data[0]
        if len(topic.partition_data) != 1:
            return _WOULD_WAIT
        data = topic.partition_data[0]
        records = data.records
        log = self.store.opened(topic.name, data.index)
        if (log is None or records is None or len(records) < lib.LS_BATCH_HEADER_SIZE
                or internal_topic_refusal(topic.name) is not None or one_v2_batch_problem(records) is not None
                or parse_header(records).attributes & lib.LS_ATTR_TRANSACTIONAL):
            return _WOULD_WAIT
        try:
            with log.exclusive_if_free() as held:  # (so that reading the log start waits for nothing)
                if held is None:
                    return _WOULD_WAIT
                appended = log.try_append_idempotent(records, in_place=True)
                start = log.log_start_offset
        except LogstoreError:
            return _WOULD_WAIT  # refused (nothing appended): answered by the worker's path
        if appended is None:
            return _WOULD_WAIT
        if acks == 0:
            return None
        return {"responses": [{"name": topic.name, "partition_responses": [
            {"index": data.index, "error_code": ErrorCode.none, "base_offset": appended.first_offset,
             "log_append_time": None, "log_start_offset": start, "record_errors": [],
             "error_message": None}]}], "throttle_time": 0}

    def _produce(self, request: KafkaRequest) -> dict[str, Any] | None:
        """A Produce answered where it may wait (a worker)."""
        body = request.body
        acks = body.acks
        answers = []
        for topic in body.topic_data:
            partitions = []
            for data in topic.partition_data:
                if acks not in (0, 1, -1):
                    error, base = ErrorCode.invalid_required_acks, -1
                    message = f"acks must be 0, 1 or -1, not {acks}"
                else:
                    error, base, message = self._append(topic.name, data.index, data.records,
                                                        body.transactional_id)
                # As Kafka: a refused partition's log start offset is unknown (-1).
                start = self._log_start(topic.name, data.index) if error == ErrorCode.none else -1
                refused = keyless_record_errors(self.store.partition(topic.name, data.index).config,
                                                data.records) if error == ErrorCode.invalid_record else []
                partitions.append({"index": data.index, "error_code": error, "base_offset": base,
                                   "log_append_time": None, "log_start_offset": start,
                                   "record_errors": refused, "error_message": message})
            answers.append({"name": topic.name, "partition_responses": partitions})
        if acks == -1 and self.fsync_acks_all:
            self._fsync(answers)
        if acks == 0:
            return None
        return {"responses": answers, "throttle_time": 0}

    def _fsync(self, answers: list[dict[str, Any]]) -> None:
        """acks=all means fsynced (``fsync_acks_all``): flush every partition appended to before
        answering. Log.flush shares one fsync between the requests that wait at once."""
        for topic in answers:
            for part in topic["partition_responses"]:
                if part["error_code"] != ErrorCode.none:
                    continue
                try:
                    self.store.partition(topic["name"], part["index"]).flush()
                except (OSError, LogstoreError) as exc:
                    logger.error("fsync of %s-%d failed: %s", topic["name"], part["index"], exc)
                    part["error_code"] = ErrorCode.kafka_storage_error
                    part["error_message"] = f"fsync failed: {exc}"

    def _append(self, topic: str, partition: int, records: bytes | None,
                transactional_id: str | None = None) -> tuple[int, int, str | None]:
        """Validate and append one partition's batch: (error code, base offset, error message).
        A retry of a batch already in the log gets that batch's base offset (Kafka answers a
        duplicate so). As Kafka's ProduceRequest.validateRecords: exactly one magic 2 batch. A
        transactional batch must come with the request's transactional id and go to a
        partition of the producer's ongoing transaction. An internal topic is refused first."""
        refused_internal = internal_topic_refusal(topic)
        if refused_internal is not None:
            logger.info("refused a produce to %s-%d: %s", topic, partition, refused_internal[2])
            return refused_internal
        try:
            log = self.store.partition(topic, partition)
        except (UnknownTopicOrPartitionError, InvalidTopicError):
            return ErrorCode.unknown_topic_or_partition, -1, f"{topic}-{partition} does not exist"
        if records is None:
            return ErrorCode.corrupt_message, -1, "null records"
        refused = one_v2_batch_problem(records)
        if refused is not None:
            logger.info("refused a produce to %s-%d: %s", topic, partition, refused)
            return ErrorCode.invalid_record, -1, refused
        header = parse_header(records) if len(records) >= lib.LS_BATCH_HEADER_SIZE else None
        if header is not None and header.attributes & lib.LS_ATTR_TRANSACTIONAL:  # (a short one: the append says why)
            error, message = self._verify_transactional(topic, partition, header.producer_id,
                                                        header.producer_epoch, transactional_id)
            if error != ErrorCode.none:
                logger.info("refused a transactional produce to %s-%d: %s", topic, partition, message)
                return error, -1, message
        try:
            # A large request's records are a view of its frame, which is this request's alone:
            # stamped there rather than copied (see wire.parse_produce_body).
            first, _, duplicate = log.append_idempotent(records, in_place=True)
        except (CorruptRecordError, RecordTooLargeError, OutOfOrderSequenceError, InvalidProducerEpochError,
                InvalidRecordError, UnsupportedCodecError) as exc:
            # InvalidRecordError: e.g. a keyless record in a compacted topic; UnsupportedCodecError:
            # a codec id Kafka does not know, or whose library is missing (UNSUPPORTED_COMPRESSION_TYPE)
            logger.info("refused a produce to %s-%d: %s", topic, partition, exc)
            return code_for(exc), -1, str(exc)
        if not duplicate:
            self.purgatory.check((topic, partition))
        return ErrorCode.none, first, None

    def _verify_transactional(self, topic: str, partition: int, pid: int, epoch: int,
                              transactional_id: str | None) -> tuple[int, str | None]:
        """May producer ``pid``'s transactional batch be appended (Kafka's verification of
        KIP-890 part 1)?"""
        if not transactional_id:
            return ErrorCode.invalid_txn_state, "a transactional batch in a produce request without a transactional id"
        error = self.verify_partition(transactional_id, pid, epoch, (topic, partition))
        if error == ErrorCode.none:
            return error, None
        if error == ErrorCode.producer_fenced:
            return ErrorCode.invalid_producer_epoch, f"producer {pid} epoch {epoch} is fenced by a newer epoch"
        if error == ErrorCode.transaction_abortable:
            return ErrorCode.invalid_txn_state, (f"{topic}-{partition} is not in the ongoing transaction of "
                                                 f"{transactional_id!r} (AddPartitionsToTxn first)")
        if error in _VERIFY_RETRIABLE:  # as Kafka's ReplicaManager: the producer retries the batch
            return ErrorCode.not_enough_replicas, (f"the transaction of {transactional_id!r} could not be verified "
                                                   f"now: {ErrorCode(error).name}")
        return error, f"the transaction of {transactional_id!r}: {ErrorCode(error).name}"

    def verify_partition(self, transactional_id: str, producer_id: int, producer_epoch: int,
                         tp: tuple[str, int]) -> int:
        """The coordinator's answer (an error code; 0: yes) to whether ``tp`` is in the ongoing
        transaction of ``transactional_id``'s producer at that id and epoch. A replicated
        store's listener asks the node that coordinates."""
        return self.txn.verify_partitions(transactional_id, producer_id, producer_epoch, [tp])[tp]

    def partition_error(self, topic: str, partition: int) -> int:
        """Why this broker does not answer for the partition (Kafka's error code), or 0: a
        single store answers for all of its partitions; a replica only for those it leads."""
        return ErrorCode.none

    def _log_start(self, topic: str, partition: int) -> int:
        try:
            return self.store.partition(topic, partition).log_start_offset
        except LogstoreError:
            return -1

    # ------------------------------------------------------------------ Fetch
    def on_fetch(self, request: KafkaRequest) -> dict[str, Any] | Future | Offload:
        """The records at each partition's fetch offset, or a wait in the purgatory for them
        (up to max_wait_ms, until min_bytes). On the network loop (``fetch_holds_logs``), a
        fetch whose logs are open, can be held without waiting and are read in their active
        segments (the pages just written) at most :data:`INLINE_FETCH_LAG` records behind their
        ends is answered there, its logs held while it reads
        (:meth:`~logstore.log.log.Log.exclusive_if_free`); any other through a worker."""
        if request.on_loop and self.fetch_holds_logs:
            return self._fetch_at_once(request)
        return self._fetch_request(request)

    def _fetch_at_once(self, request: KafkaRequest) -> dict[str, Any] | Future | Offload:
        """A Fetch on the network loop: answered there with its logs held (see on_fetch), or
        handed to a worker."""
        logs = []
        keys = [self._fetch_topic(request, topic) for topic in request.body.topics]
        for key, topic in zip(keys, request.body.topics):
            for p in topic.partitions:
                log = None if key.name is None else self.store.opened(key.name, p.partition)
                if log is None:
                    return Offload(lambda: self._fetch_request(request, keys))
                logs.append((log, p.fetch_offset))
        with ExitStack() as holds:
            for log, offset in logs:
                try:
                    held = holds.enter_context(log.exclusive_if_free())
                except LogstoreError:
                    held = None  # (closed or offline: the worker's read answers it)
                # Older pages may be read from disk; a consumer far behind reads much (its batches
                # checked whole): both are a worker's, a consumer at the tail is the loop's.
                if (held is None or offset < log.active_base_offset
                        or log.log_end_offset - offset > INLINE_FETCH_LAG):
                    return Offload(lambda: self._fetch_request(request, keys))
            return self._fetch_request(request, keys)

    def _fetch_request(self, request: KafkaRequest,
                       keys: list["FetchTopic"] | None = None) -> dict[str, Any] | Future:
        """A Fetch answered where it may wait (a worker), or with its logs held; ``keys``: its
        topics' names (:meth:`_fetch_topic`) when looked up already."""
        body = request.body
        max_wait_ms = int(body.max_wait.total_seconds() * 1000)
        if keys is None:
            keys = [self._fetch_topic(request, t) for t in body.topics]
        wanted = [(key, p.partition, p.fetch_offset, p.partition_max_bytes)
                  for key, t in zip(keys, body.topics) for p in t.partitions]

        read_committed = body.isolation_level == 1

        def attempt(expired: bool) -> dict[str, Any] | None:
            answer, size = self._fetch(wanted, body.max_bytes, read_committed)
            if expired or size >= body.min_bytes or size < 0:
                return answer
            _release(answer)
            return None

        counter = self.store.notification()  # appends from here on wake the wait below
        reads: list[RemoteRead] = []
        answer, size = self._fetch(wanted, body.max_bytes, read_committed, reads)
        if reads:  # records only the remote tier holds: answered once read, whatever min_bytes says
            return RemoteFetch(answer, reads).watch(self.purgatory, self._remote_fetch_max_wait_ms())
        if size >= body.min_bytes or size < 0 or max_wait_ms <= 0 or not wanted:
            return answer
        _release(answer)
        keys = {(topic.name, partition) for topic, partition, _, _ in wanted}
        if len(keys) == 1:
            waiting = self.purgatory.watch(next(iter(keys)), attempt, max_wait_ms / 1000.0)
        else:  # several partitions: one wait, checked by an append to any of them
            waiting = _watch_any(self.purgatory, keys, attempt, max_wait_ms / 1000.0)
        self._appends.watch(counter, keys)
        return waiting

    def _fetch_topic(self, request: KafkaRequest, topic: Any) -> "FetchTopic":
        """A Fetch request's topic: by name before v13, by id from v13 on (KIP-516), its name
        then looked up (None: no topic has the id, as after a delete and re-create)."""
        if request.api_version < 13:
            return FetchTopic(topic.topic, None)
        try:
            return FetchTopic(self.store.topic_name(topic.topic_id), topic.topic_id)
        except UnknownTopicIdError:
            return FetchTopic(None, topic.topic_id)

    def _remote_fetch_max_wait_ms(self) -> int:
        """Kafka's ``remote.fetch.max.wait.ms``: the store's (500 without a remote tier)."""
        manager = self.store.remote_log_manager
        return 500 if manager is None else int(manager.config.fetch_max_wait_ms)

    def _fetch(self, wanted: list[tuple["FetchTopic", int, int, int]], max_bytes: int,
               read_committed: bool = False, reads: list[RemoteRead] | None = None) -> tuple[dict[str, Any], int]:
        """The answer to a fetch now, and the record bytes in it (-1: answer now, with an error
        to report, or records below the local segments that only a new fetch reads).

        A partition whose records at the fetch offset are only in the remote tier (below the
        local segments) gets a read on the :class:`~logstore.kafka.remotefetch.RemoteReader`
        appended to ``reads`` (its records filled in when it finishes, by
        :class:`~logstore.kafka.remotefetch.RemoteFetch`), its ``limit`` counted as read for the
        partitions after it; without ``reads`` (a fetch waiting in the purgatory, whose attempts
        run on whatever thread checks) none is read and the answer is due now.

        As Kafka's: a partition in error has no offsets (-1); read_committed reads stop at the
        last stable offset and list the aborted transactions that overlap the records returned
        (from the segments' ``.txnindex``), read_uncommitted reads stop at the high watermark
        and have null for that list. A topic asked for by an id no topic has gets
        UNKNOWN_TOPIC_ID; a partition this broker does not lead, its leader when known."""
        topics: dict["FetchTopic", list[dict[str, Any]]] = {}
        total = 0
        errors = False
        leaders: set[int] = set()
        for key, partition, offset, partition_max in wanted:
            topic = key.name
            entry = {"partition_index": partition, "error_code": ErrorCode.none, "high_watermark": -1,
                     "last_stable_offset": -1, "log_start_offset": -1, "aborted_transactions": None,
                     "preferred_read_replica": -1, "records": b""}
            topics.setdefault(key, []).append(entry)
            if topic is None:
                entry["error_code"] = ErrorCode.unknown_topic_id
                errors = True
                continue
            refused = self.partition_error(topic, partition)
            if refused:
                entry["error_code"] = refused
                hint = self.leader_hint(topic, partition) if refused == ErrorCode.not_leader_or_follower else None
                if hint is not None:
                    entry["current_leader"] = {"leader_id": hint[0], "leader_epoch": hint[1]}
                    leaders.add(hint[0])
                errors = True
                continue
            try:
                log = self.store.partition(topic, partition)
            except (UnknownTopicOrPartitionError, InvalidTopicError):
                entry["error_code"] = ErrorCode.unknown_topic_or_partition
                errors = True
                continue
            hw, start = log.high_watermark, log.log_start_offset
            if offset < start or offset > max(hw, log.log_end_offset):
                entry["error_code"] = ErrorCode.offset_out_of_range
                errors = True
                continue
            stable = log.last_stable_offset
            entry.update(high_watermark=hw, last_stable_offset=stable, log_start_offset=start,
                         aborted_transactions=[] if read_committed else None)
            visible = stable if read_committed else hw
            if offset >= visible:  # nothing committed (or stable) there yet: an empty answer
                continue
            # KIP-74: the first partition with records gets at least one batch whatever the
            # limits, and no more than both limits allow after it; the others get whole batches
            # within theirs, or none.
            limit = min(partition_max, max_bytes - total)
            if limit <= 0:
                continue
            try:
                data = log.read_region(offset, max(limit, 1), max_offset=visible,  # written with sendfile
                                       end_offset=read_committed)
            except OffsetMovedToTieredStorageError:
                # Below the local segments (tiered storage): whole batches from the object store,
                # CRC-checked, all below the high watermark (only those are copied), read on the
                # remote reader's threads.
                if reads is None:
                    errors = True  # (answered now: the client's next fetch reads it)
                    continue
                try:
                    future = self.remote_reader.read(log, offset, limit, visible, read_committed)
                except LogstoreError:  # the server stops
                    continue
                reads.append(RemoteRead(entry, f"{topic}-{partition} at {offset}", limit, total == 0, future))
                total += max(limit, 1)
                continue
            except OffsetOutOfRangeError:
                entry.update(_NO_OFFSETS, error_code=ErrorCode.offset_out_of_range)
                errors = True
                continue
            except CorruptRecordError as exc:
                logger.error("fetch from %s-%d at %d: %s", topic, partition, offset, exc)
                entry.update(_NO_OFFSETS, error_code=ErrorCode.unknown_server_error)
                errors = True
                continue
            if data is not None and total and len(data) > limit:
                if isinstance(data, FileRegion):
                    data.close()  # a later partition's first batch alone is over what is left: none
                data = None
            if data is not None:
                entry["records"] = data
                total += len(data)
                if read_committed:  # Kafka's rule: the aborted transactions overlapping the data
                    entry["aborted_transactions"] = [
                        {"producer_id": txn.producer_id, "first_offset": txn.first_offset}
                        for txn in log.aborted_transactions(offset, data.end_offset)]
        answer = {"throttle_time": 0, "error_code": ErrorCode.none, "session_id": 0,
                  "responses": [{"topic": t.name or "", "topic_id": t.topic_id or ZERO_TOPIC_ID, "partitions": parts}
                                for t, parts in topics.items()],
                  "node_endpoints": self._endpoints(leaders)}
        return answer, (-1 if errors else total)

    # ------------------------------------------------------------------ ListOffsets
    def on_list_offsets(self, request: KafkaRequest) -> dict[str, Any]:
        """Kafka's ListOffsets: -1 the last fetchable offset (high watermark, or the last stable
        offset for read_committed), -2 the log start (with tiered storage, the remote tier's
        first offset), -3 (v7+, KIP-734) the first record with the largest timestamp (the remote
        segments' too), -4 (v8+, KIP-1005) the local log start (the first offset on local disk),
        else the first record at or after the timestamp below the last fetchable offset (read
        from the remote tier when it lies there; its failure is UNKNOWN_SERVER_ERROR for the
        partition). A sentinel the version cannot carry is UNSUPPORTED_VERSION for its partition, a
        partition named twice INVALID_REQUEST (as Kafka's ReplicaManager). The leader epoch is
        the epoch cache's for the offset (the partition's for -1)."""
        body = request.body
        read_committed = getattr(body, "isolation_level", 0) == 1
        named = [(t.name, p.partition_index) for t in body.topics for p in t.partitions]
        topics = []
        for topic in body.topics:
            partitions = []
            for p in topic.partitions:
                entry = {"partition_index": p.partition_index, "error_code": ErrorCode.none, "timestamp": -1,
                         "offset": -1, "leader_epoch": -1}
                ts = int(p.timestamp.timestamp() * 1000) if hasattr(p.timestamp, "timestamp") else int(p.timestamp)
                if named.count((topic.name, p.partition_index)) > 1:
                    entry["error_code"] = ErrorCode.invalid_request
                elif ts < 0 and request.api_version < _LIST_OFFSETS_SENTINELS.get(ts, 1 << 15):
                    entry["error_code"] = ErrorCode.unsupported_version
                else:
                    entry.update(self._list_offset(topic.name, p.partition_index, ts, read_committed))
                partitions.append(entry)
            topics.append({"name": topic.name, "partitions": partitions})
        return {"throttle_time": 0, "topics": topics}

    def _list_offset(self, topic: str, partition: int, ts: int, read_committed: bool) -> dict[str, Any]:
        refused = self.partition_error(topic, partition)
        try:
            if refused:
                raise UnknownTopicOrPartitionError(f"{topic}-{partition}")
            log = self.store.partition(topic, partition)
        except (UnknownTopicOrPartitionError, InvalidTopicError):
            return {"error_code": refused or ErrorCode.unknown_topic_or_partition}
        try:
            return self._list_log_offset(log, ts, read_committed)
        except RemoteStorageError as exc:  # the object store failed: Kafka answers this way too
            logger.error("list offsets of %s-%d at %d from the remote tier: %s", topic, partition, ts, exc)
            return {"error_code": ErrorCode.unknown_server_error}

    def _list_log_offset(self, log: Any, ts: int, read_committed: bool) -> dict[str, Any]:
        # Kafka's lastFetchableOffset: read_committed (v2+) sees up to the LSO
        visible = log.last_stable_offset if read_committed else log.high_watermark
        if ts == -1:
            return {"offset": visible, "leader_epoch": max(log.latest_epoch, 0)}
        if ts in (-2, -4):  # -4: the first offset on local disk (KIP-1005; tiered storage keeps less)
            start = log.log_start_offset if ts == -2 else log.local_log_start_offset
            return {"offset": start, "leader_epoch": _epoch_at(log, start)}
        if ts == -3:
            infos = log.segments
            newest = max((info.max_timestamp for info in infos), default=-1)
            if log.remote_tier is not None:
                newest = max(newest, log.remote_tier.max_timestamp())
            found = log.offset_for_timestamp(newest) if newest >= 0 else None
            wanted = newest
        else:
            found = log.offset_for_timestamp(ts)
            wanted = ts
        if found is None or found >= visible:
            return {}  # none, or not committed (or stable) yet: not to be seen
        # Kafka answers with the found record's own timestamp, not the one asked.
        try:
            record = log.read(found, max_records=1)
        except OffsetOutOfRangeError:  # deleted by retention meanwhile
            return {}
        except CorruptRecordError as exc:  # a fetch from there reports it
            logger.error("list offsets of %s at %d: %s", log.path, found, exc)
            record = []
        return {"offset": found, "timestamp": record[0].timestamp if record else wanted,
                "leader_epoch": _epoch_at(log, found)}

    # ------------------------------------------------------------------ topics
    def on_create_topics(self, request: KafkaRequest) -> dict[str, Any]:
        body = request.body
        results = []
        for topic in body.topics:
            partitions = topic.num_partitions if topic.num_partitions != -1 else self.num_partitions
            configs = {c.name: c.value for c in topic.configs}
            # Kafka's checks in its order (ReplicationControlManager.createTopics), validate_only too
            error, message = self._check_new_topic(topic.name, configs)
            if error == ErrorCode.none and topic.assignments:
                # Kafka: an explicit assignment comes with num_partitions and replication_factor -1
                error, message, partitions = self._check_assignment(topic)
            elif error == ErrorCode.none and topic.replication_factor not in (-1, len(self.replica_nodes())):
                error = ErrorCode.invalid_replication_factor
                message = f"every partition has {len(self.replica_nodes())} replica(s), on {self.replica_nodes()}"
            if error == ErrorCode.none and partitions <= 0:
                error, message = ErrorCode.invalid_partitions, f"{partitions} partitions"
            if error == ErrorCode.none and not body.validate_only:
                error, message = self.make_topic(topic.name, partitions, configs)
            result = {"name": topic.name, "error_code": error, "error_message": message, "topic_id": ZERO_TOPIC_ID,
                      "num_partitions": -1, "replication_factor": -1, "configs": []}
            if error == ErrorCode.none and request.api_version >= 5:
                # v5+ (KIP-525): what the topic was created with; v7+: its id (none when only validated)
                result.update(num_partitions=partitions, replication_factor=len(self.replica_nodes()),
                              configs=kafkaconfigs.new_topic_configs(self.store, configs))
                if not body.validate_only:
                    result["topic_id"] = self.store.topic_id(topic.name)
            results.append(result)
        return {"throttle_time": 0, "topics": results}

    def _check_assignment(self, topic: Any) -> tuple[int, str | None, int]:
        """(error, message, partition count) of CreateTopics' explicit replica assignment: as
        Kafka, partitions numbered 0..n-1 and no num_partitions or replication_factor beside
        it; each partition's replicas must be :meth:`replica_nodes`."""
        if topic.num_partitions != -1 or topic.replication_factor != -1:
            return (ErrorCode.invalid_request, "Both numPartitions or replicationFactor and replicasAssignments "
                    "were set. Both cannot be used at the same time.", 0)
        indexes = sorted(a.partition_index for a in topic.assignments)
        if indexes != list(range(len(indexes))):
            return ErrorCode.invalid_replica_assignment, f"partitions {indexes} are not numbered 0..n-1", 0
        replicas = sorted(self.replica_nodes())
        for a in topic.assignments:
            if sorted(a.broker_ids) != replicas or len(set(a.broker_ids)) != len(a.broker_ids):
                return (ErrorCode.invalid_replica_assignment, f"partition {a.partition_index}: replicas "
                        f"{list(a.broker_ids)}, but every partition's replicas are {replicas}", 0)
        return ErrorCode.none, None, len(indexes)

    def replica_nodes(self) -> list[int]:
        """The brokers every partition's replicas are on: this broker (a replica set: its voters)."""
        return [self.node_id]

    def _check_new_topic(self, name: str, configs: dict[str, str | None]) -> tuple[int, str | None]:
        """A legal name not taken, and topic configs by Kafka's names with valid values (a null
        value is INVALID_CONFIG, as in Kafka)."""
        try:
            self.store.partitions_for(name)
            return ErrorCode.topic_already_exists, f"topic {name!r} already exists"
        except InvalidTopicError as exc:
            return ErrorCode.invalid_topic_exception, str(exc)
        except UnknownTopicOrPartitionError:
            pass
        if is_internal_topic(name):  # as LogStore.create_topic
            return (ErrorCode.invalid_topic_exception,
                    f"topic names starting with '__' are reserved for internal topics: {name!r}")
        nulls = sorted(k for k, v in configs.items() if v is None)
        unknown = sorted(k for k in configs if k in kafkaconfigs.NOT_TOPIC_CONFIGS)
        if nulls:
            return ErrorCode.invalid_config, f"null value not supported for topic configs: {', '.join(nulls)}"
        if unknown:
            return ErrorCode.invalid_config, f"unknown topic config name: {', '.join(unknown)}"
        try:
            config = LogConfig.from_kafka({**self.store.defaults.to_kafka(), **configs})
        except (InvalidConfigError, TypeError, ValueError) as exc:
            return ErrorCode.invalid_config, str(exc)
        if config.remote_storage_enable:
            refused = self.remote_storage_refusal(name)
            if refused is not None:
                return ErrorCode.invalid_config, refused
        return ErrorCode.none, None

    def remote_storage_refusal(self, topic: str) -> str | None:
        """Why ``topic`` may not enable remote storage (tiered storage) on this broker, or
        None: the store's reason (it has no object store)."""
        try:
            self.store.check_remote_storage(topic)
        except InvalidConfigError as exc:
            return str(exc)
        return None

    def make_topic(self, name: str, partitions: int, configs: dict[str, str | None]) -> tuple[int, str | None]:
        """(error, message) of CreateTopics' creation of a checked topic (a replica set
        replicates it)."""
        # By Kafka's names, as strings: the store reads a dotted name as Kafka's; the one without
        # a dot (preallocate) is also a LogConfig field, which takes the typed value.
        try:
            typed = LogConfig.from_kafka({k: v for k, v in configs.items() if "." not in k})
            overrides = {k: v if "." in k else getattr(typed, k) for k, v in configs.items()}
            self.store.create_topic(name, partitions, **overrides)
        except TopicExistsError:
            return ErrorCode.topic_already_exists, f"topic {name!r} already exists"
        except InvalidTopicError as exc:
            return ErrorCode.invalid_topic_exception, str(exc)
        except (InvalidConfigError, TypeError, ValueError) as exc:
            return ErrorCode.invalid_config, str(exc)
        return ErrorCode.none, None

    def on_delete_topics(self, request: KafkaRequest) -> dict[str, Any]:
        results = []
        for name, topic_id, error, message in delete_topics_asked(request):
            if error == ErrorCode.none and name is None:
                try:
                    name = self.store.topic_name(topic_id)
                except UnknownTopicIdError:
                    error, message = ErrorCode.unknown_topic_id, f"no topic has id {topic_id_text(topic_id)}"
            if error == ErrorCode.none:
                try:
                    found = self.store.topic_id(name)
                    if topic_id is not None and found != topic_id:  # deleted and created again meanwhile
                        raise UnknownTopicIdError(topic_id_text(topic_id))
                    self.store.delete_topic(name)
                    topic_id = found
                except UnknownTopicIdError:
                    error, message = ErrorCode.unknown_topic_id, f"no topic has id {topic_id_text(topic_id)}"
                except (UnknownTopicOrPartitionError, InvalidTopicError):
                    error, message = ErrorCode.unknown_topic_or_partition, f"topic {name!r} does not exist"
            results.append({"name": name, "topic_id": topic_id or ZERO_TOPIC_ID, "error_code": error,
                            "error_message": message})
        return {"throttle_time": 0, "responses": results}

    def on_sasl_handshake(self, request: KafkaRequest) -> dict[str, Any]:
        """SASL is answered before authentication and to re-authenticate (:mod:`~logstore.kafka.auth`);
        here (a session without a lifetime, a second re-authentication within a second, a
        listener without SASL) it is Kafka's ILLEGAL_SASL_STATE."""
        return {"error_code": ErrorCode.illegal_sasl_state, "mechanisms": []}

    def on_sasl_authenticate(self, request: KafkaRequest) -> dict[str, Any]:
        """As :meth:`on_sasl_handshake` (a SaslAuthenticate without its SaslHandshake)."""
        return {"error_code": ErrorCode.illegal_sasl_state, "auth_bytes": b"", "session_lifetime": 0,
                "error_message": "SaslAuthenticate after authentication, or on a listener without SASL"}

    def on_describe_user_scram_credentials(self, request: KafkaRequest) -> dict[str, Any]:
        return self.scram_users.describe(request)

    def on_alter_user_scram_credentials(self, request: KafkaRequest) -> dict[str, Any]:
        return self.scram_users.alter(request)

    # ------------------------------------------------------------------ producers
    def on_init_producer_id(self, request: KafkaRequest) -> dict[str, Any]:
        body = request.body
        if body.transactional_id is None:
            return {"throttle_time": 0, "error_code": ErrorCode.none, "producer_id": self.producer_ids.next_id(),
                    "producer_epoch": 0}
        timeout_ms = int(body.transaction_timeout.total_seconds() * 1000)
        error, pid, epoch = self.txn.init_producer_id(body.transactional_id, timeout_ms,
                                                      getattr(body, "producer_id", -1),
                                                      getattr(body, "producer_epoch", -1))
        if error == ErrorCode.producer_fenced and request.api_version < 4:
            error = ErrorCode.invalid_producer_epoch  # (PRODUCER_FENCED is known to v4+ clients)
        return {"throttle_time": 0, "error_code": error, "producer_id": pid, "producer_epoch": epoch}

    # ------------------------------------------------------------------ transactions
    def _txn_error(self, error: int, version: int, fenced_from: int) -> int:
        """PRODUCER_FENCED as INVALID_PRODUCER_EPOCH to a version older than ``fenced_from``
        (Kafka answers so: the older clients do not know the code)."""
        if error == ErrorCode.producer_fenced and version < fenced_from:
            return ErrorCode.invalid_producer_epoch
        return error

    def on_add_partitions_to_txn(self, request: KafkaRequest) -> dict[str, Any]:
        body = request.body
        wanted = [(t.name, p) for t in body.v3_and_below_topics for p in t.partitions]
        unknown = {tp for tp in wanted if not self._partition_exists(*tp)}
        if unknown:  # Kafka: the unknown ones fail, the rest are not attempted
            errors = {tp: ErrorCode.unknown_topic_or_partition if tp in unknown else ErrorCode.operation_not_attempted
                      for tp in wanted}
        else:
            errors = self.txn.add_partitions(body.v3_and_below_transactional_id, body.v3_and_below_producer_id,
                                             body.v3_and_below_producer_epoch, wanted)
        topics: dict[str, list[dict[str, Any]]] = {}
        for topic, partition in wanted:
            error = self._txn_error(errors.get((topic, partition), ErrorCode.none), request.api_version, 2)
            topics.setdefault(topic, []).append({"partition_index": partition, "partition_error_code": error})
        return {"throttle_time": 0, "error_code": ErrorCode.none, "results_by_transaction": [],
                "results_by_topic_v3_and_below": [{"name": t, "results_by_partition": r} for t, r in topics.items()]}

    def on_add_offsets_to_txn(self, request: KafkaRequest) -> dict[str, Any]:
        body = request.body
        self.groups  # (__consumer_offsets exists before the transaction names it)
        error = self.txn.add_offsets(body.transactional_id, body.producer_id, body.producer_epoch, body.group_id,
                                     lambda group: 0)  # every group's offsets are in partition 0
        return {"throttle_time": 0, "error_code": self._txn_error(error, request.api_version, 2)}

    def on_end_txn(self, request: KafkaRequest) -> Future:
        body = request.body
        decided = self.txn.end_txn(body.transactional_id, body.producer_id, body.producer_epoch, body.committed)
        answer: Future = Future()

        def done(future: Future) -> None:
            try:
                error = self._txn_error(future.result(), request.api_version, 2)
            except Exception as exc:  # noqa: BLE001 - a bug: the client gets an error, not silence
                logger.exception("EndTxn of %s failed", body.transactional_id)
                answer.set_exception(exc)
                return
            answer.set_result({"throttle_time": 0, "error_code": error, "producer_id": -1, "producer_epoch": -1})

        decided.add_done_callback(done)
        return answer

    def on_txn_offset_commit(self, request: KafkaRequest) -> dict[str, Any]:
        body = request.body
        wanted = [(t.name, p.partition_index, p.committed_offset, p.committed_metadata or "",
                   getattr(p, "committed_leader_epoch", -1)) for t in body.topics for p in t.partitions]
        error = self.verify_partition(body.transactional_id, body.producer_id, body.producer_epoch, (OFFSETS_TOPIC, 0))
        if error == ErrorCode.transaction_abortable:
            error = ErrorCode.invalid_txn_state  # AddOffsetsToTxn did not come first
        error = self._txn_error(error, request.api_version, 3)
        if error == ErrorCode.none and getattr(body, "generation_id", -1) >= 0:
            error = self.groups.check_transactional_commit(body.group_id, body.generation_id, body.member_id,
                                                           getattr(body, "group_instance_id", None))
        errors: dict[tuple[str, int], int] = {}
        if error == ErrorCode.none:
            for topic, partition, *_ in wanted:
                if not self._partition_exists(topic, partition):
                    errors[(topic, partition)] = ErrorCode.unknown_topic_or_partition
            good = {(t, p): (o, m, max(e, -1)) for t, p, o, m, e in wanted if (t, p) not in errors}
            try:
                self.groups.offsets.commit_transactional(body.group_id, good, body.producer_id, body.producer_epoch)
            except (LogstoreError, OSError) as exc:
                logger.error("TxnOffsetCommit of %s for %s failed: %s", body.transactional_id, body.group_id, exc)
                error = ErrorCode.unknown_server_error if isinstance(exc, LogstoreError) else ErrorCode.kafka_storage_error
        topics: dict[str, list[dict[str, Any]]] = {}
        for topic, partition, *_ in wanted:
            topics.setdefault(topic, []).append(
                {"partition_index": partition, "error_code": error or errors.get((topic, partition), ErrorCode.none)})
        return {"throttle_time": 0, "topics": [{"name": t, "partitions": ps} for t, ps in topics.items()]}

    def on_describe_transactions(self, request: KafkaRequest) -> dict[str, Any]:
        states = []
        for d in self.txn.describe(request.body.transactional_ids):
            states.append({"error_code": d.error, "transactional_id": d.transactional_id,
                           "transaction_state": d.state, "transaction_timeout": d.txn_timeout_ms,
                           "transaction_start_time": d.txn_start_timestamp, "producer_id": d.producer_id,
                           "producer_epoch": d.producer_epoch,
                           "topics": [{"topic": t, "partitions": list(ps)} for t, ps in d.topics]})
        return {"throttle_time": 0, "transaction_states": states}

    def on_list_transactions(self, request: KafkaRequest) -> dict[str, Any]:
        body = request.body
        listing = self.txn.list(body.state_filters, body.producer_id_filters,
                                getattr(body, "duration_filter", -1))
        return {"throttle_time": 0, "error_code": listing.error,
                "unknown_state_filters": list(listing.unknown_state_filters),
                "transaction_states": [{"transactional_id": t.transactional_id, "producer_id": t.producer_id,
                                        "transaction_state": t.state} for t in listing.transactions]}

    def on_describe_producers(self, request: KafkaRequest) -> dict[str, Any]:
        topics = []
        for topic in request.body.topics:
            partitions = []
            for index in topic.partition_indexes:
                entry: dict[str, Any] = {"partition_index": index, "error_code": ErrorCode.none,
                                         "error_message": None, "active_producers": []}
                refused = self.partition_error(topic.name, index)
                try:
                    if refused:
                        raise UnknownTopicOrPartitionError(f"{topic.name}-{index}")
                    log = self.store.partition(topic.name, index)
                    producers = log.active_producers()
                except (UnknownTopicOrPartitionError, InvalidTopicError):
                    entry.update(error_code=refused or ErrorCode.unknown_topic_or_partition,
                                 error_message=f"{topic.name}-{index} is not served here")
                else:
                    entry["active_producers"] = [
                        {"producer_id": p.producer_id, "producer_epoch": p.epoch, "last_sequence": p.last_sequence,
                         "last_timestamp": p.last_timestamp, "coordinator_epoch": p.coordinator_epoch,
                         "current_txn_start_offset": p.current_txn_first_offset} for p in producers.values()]
                partitions.append(entry)
            topics.append({"name": topic.name, "partitions": partitions})
        return {"throttle_time": 0, "topics": topics}


    # ------------------------------------------------------------------ ACLs
    def on_describe_acls(self, request: KafkaRequest) -> dict[str, Any]:
        return aclapis.describe_acls(self.authorizer, request.body)

    def on_create_acls(self, request: KafkaRequest) -> dict[str, Any]:
        return aclapis.create_acls(self.authorizer, request.body)

    def on_delete_acls(self, request: KafkaRequest) -> dict[str, Any]:
        return aclapis.delete_acls(self.authorizer, request.body)

    # ------------------------------------------------------------------ configs
    def on_describe_configs(self, request: KafkaRequest) -> dict[str, Any]:
        body = request.body
        results = []
        for resource in body.resources:
            keys = None if resource.configuration_keys is None else list(resource.configuration_keys)
            if resource.resource_type == kafkaconfigs.TOPIC:
                error, message, configs = kafkaconfigs.describe_topic(self.store, resource.resource_name, keys,
                                                                      body.include_synonyms)
            elif resource.resource_type == kafkaconfigs.BROKER:
                error, message, configs = kafkaconfigs.describe_broker(self.node_id, resource.resource_name,
                                                                       self.broker_settings(), keys,
                                                                       body.include_synonyms, self.store)
            elif resource.resource_type == kafkaconfigs.GROUP:
                error, message, configs = kafkaconfigs.describe_group(
                    resource.resource_name, self.group_configs.of(resource.resource_name), self.group_settings(),
                    keys, body.include_synonyms)
            else:
                error, configs = ErrorCode.invalid_request, []
                message = f"resource type {resource.resource_type} has no configs"
            results.append({"error_code": error, "error_message": message, "resource_type": resource.resource_type,
                            "resource_name": resource.resource_name, "configs": configs})
        return {"throttle_time": 0, "results": results}

    def broker_settings(self) -> dict[str, Any]:
        """This broker's settings by Kafka's names (DescribeConfigs of the broker)."""
        group = self.group_config
        return {"node.id": self.node_id, "broker.id": self.node_id, "num.partitions": self.num_partitions,
                "auto.create.topics.enable": self.auto_create_topics, "default.replication.factor": 1,
                "offsets.topic.num.partitions": 1, "offsets.topic.replication.factor": 1,
                "group.min.session.timeout.ms": group.min_session_timeout_ms,
                "group.max.session.timeout.ms": group.max_session_timeout_ms,
                "group.initial.rebalance.delay.ms": group.initial_rebalance_delay_ms,
                "log.dirs": self.store.root, **self._consumer_group_settings(), **self._remote_settings()}

    def _remote_settings(self) -> dict[str, Any]:
        """Tiered storage's broker settings by Kafka's names (the store's remote log manager's)."""
        manager = self.store.remote_log_manager
        settings: dict[str, Any] = {"remote.log.storage.system.enable": manager is not None,
                                    "remote.log.reader.threads": self.remote_reader.threads}
        if manager is not None:
            settings.update({"remote.log.manager.task.interval.ms": manager.config.task_interval_ms,
                             "remote.fetch.max.wait.ms": manager.config.fetch_max_wait_ms,
                             "remote.log.index.file.cache.total.size.bytes": manager.config.index_cache_size_bytes})
        return settings

    def _consumer_group_settings(self) -> dict[str, Any]:
        """KIP-848's broker settings by Kafka's names."""
        consumer = self.consumer_group_config
        if consumer is None:
            return {"group.coordinator.rebalance.protocols": "classic"}
        return {"group.coordinator.rebalance.protocols": "classic,consumer", **self.group_settings(),
                "group.consumer.assignors": ",".join(consumer.assignors),
                "group.consumer.max.size": consumer.max_size,
                "group.consumer.migration.policy": consumer.migration_policy.upper()}

    def group_settings(self) -> dict[str, int]:
        """The broker's ``group.consumer.*`` defaults and bounds of a group's own configs
        (:meth:`GroupConfigBounds.settings <logstore.kafka.configs.GroupConfigBounds.settings>`)."""
        consumer = self.consumer_group_config or ConsumerGroupConfig()
        return self.group_config_bounds.settings(consumer.session_timeout_ms, consumer.heartbeat_interval_ms)

    def group_timeouts(self, group_id: str) -> tuple[int, int]:
        """A consumer group's (session timeout, heartbeat interval) in ms: its own configs
        (``consumer.session.timeout.ms``, ``consumer.heartbeat.interval.ms``), else the broker's."""
        own = self.group_configs.of(group_id)
        consumer = self.consumer_group_config or ConsumerGroupConfig()
        defaults = (consumer.session_timeout_ms, consumer.heartbeat_interval_ms)
        try:
            return (int(own.get("consumer.session.timeout.ms", defaults[0])),
                    int(own.get("consumer.heartbeat.interval.ms", defaults[1])))
        except ValueError:  # (a file edited by hand: AlterConfigs never writes one)
            logger.error("consumer group %s: invalid configs %s in %s; using the broker's", group_id, dict(own),
                         self.group_configs.path)
            return defaults

    # ------------------------------------------------------------------ consumer groups
    def coordinator_of(self, key_type: int, key: str) -> dict[str, Any]:
        """FindCoordinator's answer for one key (``node_id``, ``host``, ``port``, ``error_code``,
        ``error_message``): this broker coordinates every group (key type 0) and transactional
        id (1); other key types get INVALID_REQUEST. A subclass that coordinates elsewhere
        overrides this, and every version's shape follows."""
        if key_type not in (0, 1):
            return {"error_code": ErrorCode.invalid_request, "error_message": f"unknown coordinator key type {key_type}",
                    "node_id": -1, "host": "", "port": -1}
        return {"error_code": ErrorCode.none, "error_message": None, "node_id": self.node_id, "host": self.host,
                "port": self.port}

    def on_find_coordinator(self, request: KafkaRequest) -> dict[str, Any]:
        body = request.body
        key_type = getattr(body, "key_type", 0)
        if request.api_version >= 4:  # batched keys (KIP-699), one answer each
            return {"throttle_time": 0, "coordinators": [dict(self.coordinator_of(key_type, key), key=key)
                                                         for key in body.coordinator_keys]}
        return dict(self.coordinator_of(key_type, body.key), throttle_time=0)

    def on_join_group(self, request: KafkaRequest) -> dict[str, Any] | Future:
        body = request.body
        session_ms = _ms(body.session_timeout)
        rebalance_ms = _ms(body.rebalance_timeout) if request.api_version >= 1 else session_ms
        if getattr(body, "reason", None):
            logger.info("group %s: member %r joins: %s", body.group_id, body.member_id, body.reason)
        consumer = self.consumer_groups
        if consumer is not None and consumer.takes_classic(body.group_id):  # a classic member of a consumer group
            return consumer.classic_join(ClassicJoin(
                body.group_id, body.member_id, getattr(body, "group_instance_id", None), request.client_id or "",
                request.client_host, session_ms, rebalance_ms, body.protocol_type,
                tuple((p.name, p.metadata) for p in body.protocols), request.api_version >= 4))
        return self.groups.join(body.group_id, body.member_id, getattr(body, "group_instance_id", None),
                                request.client_id or "", request.client_host, session_ms, rebalance_ms,
                                body.protocol_type,
                                [(p.name, p.metadata) for p in body.protocols], request.api_version >= 4)

    def on_sync_group(self, request: KafkaRequest) -> dict[str, Any] | Future:
        body = request.body
        consumer = self.consumer_groups
        if consumer is not None and consumer.takes_classic(body.group_id):
            return consumer.classic_sync(body.group_id, body.generation_id, body.member_id,
                                         getattr(body, "group_instance_id", None),
                                         getattr(body, "protocol_type", None), getattr(body, "protocol_name", None))
        return self.groups.sync(body.group_id, body.generation_id, body.member_id,
                                getattr(body, "group_instance_id", None),
                                {a.member_id: a.assignment for a in body.assignments},
                                getattr(body, "protocol_type", None), getattr(body, "protocol_name", None))

    def on_heartbeat(self, request: KafkaRequest) -> dict[str, Any]:
        body = request.body
        consumer = self.consumer_groups
        on = consumer.classic_heartbeat if consumer is not None and consumer.takes_classic(body.group_id) else \
            self.groups.heartbeat
        error = on(body.group_id, body.generation_id, body.member_id, getattr(body, "group_instance_id", None))
        return {"throttle_time": 0, "error_code": error}

    def on_leave_group(self, request: KafkaRequest) -> dict[str, Any]:
        body = request.body
        consumer = self.consumer_groups
        leave = consumer.classic_leave if consumer is not None and consumer.takes_classic(body.group_id) else \
            self.groups.leave
        if request.api_version < 3:
            (error,) = leave(body.group_id, [(body.member_id, None)])
            return {"throttle_time": 0, "error_code": error}
        for m in body.members:
            if getattr(m, "reason", None):
                logger.info("group %s: member %r leaves: %s", body.group_id, m.member_id or m.group_instance_id,
                            m.reason)
        members = [(m.member_id, m.group_instance_id) for m in body.members]
        errors = leave(body.group_id, members)
        return {"throttle_time": 0, "error_code": ErrorCode.none,
                "members": [{"member_id": member_id, "group_instance_id": instance_id, "error_code": error}
                            for (member_id, instance_id), error in zip(members, errors)]}

    def on_offset_commit(self, request: KafkaRequest) -> dict[str, Any]:
        body = request.body
        items = [(t.name, p.partition_index, p.committed_offset, getattr(p, "committed_leader_epoch", -1),
                  p.committed_metadata) for t in body.topics for p in t.partitions]
        consumer = self.consumer_groups
        refused = consumer.check_commit(body.group_id, body.member_id, body.generation_id_or_member_epoch,
                                        getattr(body, "group_instance_id", None), request.api_version) \
            if consumer is not None else None
        errors = [refused] * len(items) if refused else \
            self.groups.commit_offsets(body.group_id, body.generation_id_or_member_epoch, body.member_id,
                                       getattr(body, "group_instance_id", None), items, request.api_version)
        topics: dict[str, list[dict[str, Any]]] = {}
        for (topic, partition, _, _, _), error in zip(items, errors):
            topics.setdefault(topic, []).append({"partition_index": partition, "error_code": error})
        return {"throttle_time": 0, "topics": [{"name": t, "partitions": parts} for t, parts in topics.items()]}

    def on_offset_fetch(self, request: KafkaRequest) -> dict[str, Any]:
        """Up to v7 one group (its answer at the top level), from v8 several (KIP-709: one answer
        each, in ``groups``)."""
        body = request.body
        if request.api_version < 8:
            answer = self._group_offsets(body.group_id, body.topics)
            return {"throttle_time": 0, "error_code": answer["error_code"], "topics": answer["topics"]}
        return {"throttle_time": 0, "groups": [
            self._group_offsets(g.group_id, g.topics, getattr(g, "member_id", None), getattr(g, "member_epoch", -1))
            for g in body.groups]}

    def _group_offsets(self, group_id: str, topics: Any, member_id: str | None = None,
                       member_epoch: int = -1) -> dict[str, Any]:
        """One group's OffsetFetch answer (``group_id``, ``error_code``, ``topics``). From v9 a
        consumer group's member names itself: an unknown member or a stale epoch is refused
        (KIP-848; a classic group ignores them, as Kafka's)."""
        if not group_id:
            return {"group_id": group_id, "error_code": ErrorCode.invalid_group_id, "topics": []}
        consumer = self.consumer_groups
        refused = consumer.check_offset_fetch(group_id, member_id, member_epoch) if consumer is not None else 0
        if refused:
            return {"group_id": group_id, "error_code": refused, "topics": []}
        wanted = None if topics is None else [(t.name, p) for t in topics for p in t.partition_indexes]
        answers: dict[str, list[dict[str, Any]]] = {}
        for topic, partition, offset, epoch, metadata in self.groups.fetch_offsets(group_id, wanted):
            answers.setdefault(topic, []).append({"partition_index": partition, "committed_offset": offset,
                                                  "committed_leader_epoch": epoch, "metadata": metadata,
                                                  "error_code": ErrorCode.none})
        return {"group_id": group_id, "error_code": ErrorCode.none,
                "topics": [{"name": t, "partitions": parts} for t, parts in answers.items()]}

    def on_offset_delete(self, request: KafkaRequest) -> dict[str, Any]:
        body = request.body
        wanted = [(t.name, p.partition_index) for t in body.topics for p in t.partitions]
        consumer = self.consumer_groups
        done = consumer.delete_offsets(body.group_id, wanted, self._partition_exists) \
            if consumer is not None and body.group_id and not consumer.classic_has_members(body.group_id) else None
        error, errors = done if done is not None else self.groups.delete_offsets(body.group_id, wanted)
        topics: dict[str, list[dict[str, Any]]] = {}
        for (topic, partition), code in zip(wanted, errors):
            topics.setdefault(topic, []).append({"partition_index": partition, "error_code": code})
        return {"throttle_time": 0, "error_code": error,
                "topics": [{"name": t, "partitions": parts} for t, parts in topics.items()]}

    def on_delete_groups(self, request: KafkaRequest) -> dict[str, Any]:
        return {"throttle_time": 0, "results": [{"group_id": g, "error_code": self._delete_group(g)}
                                                for g in request.body.groups_names]}

    def _delete_group(self, group_id: str) -> int:
        """One group of a DeleteGroups: a consumer group's (KIP-848) by its coordinator, unless
        its id has become a classic group's with members; else the classic coordinator's."""
        consumer = self.consumer_groups
        if consumer is not None and group_id and not consumer.classic_has_members(group_id):
            error = consumer.delete_group(group_id)
            if error is not None:
                if error == ErrorCode.none:  # a classic group's empty entry of that id goes too
                    self.groups.delete_groups([group_id])
                return error
        return self.groups.delete_groups([group_id])[0]

    def on_describe_groups(self, request: KafkaRequest) -> dict[str, Any]:
        groups = []
        consumer = self.consumer_groups
        for group_id in request.body.groups:
            found = self.groups.describe(group_id)
            error, message = ErrorCode.none, None
            described = consumer.describe(group_id) if consumer is not None and found is None else None
            if described is not None:  # a consumer group (KIP-848): its type, state and members
                found = {"state": described["group_state"], "protocol_type": CONSUMER_PROTOCOL_TYPE, "protocol": "",
                         "members": [{"member_id": m["member_id"], "group_instance_id": m["instance_id"],
                                      "client_id": m["client_id"], "client_host": m["client_host"],
                                      "metadata": b"", "assignment": b""} for m in described["members"]]}
            if found is None:  # Kafka describes an unknown group as a dead one (v6: GROUP_ID_NOT_FOUND)
                found = {"state": "Dead", "protocol_type": "", "protocol": "", "members": []}
                if request.api_version >= 6:
                    error, message = ErrorCode.group_id_not_found, f"group {group_id!r} not found"
            groups.append({"error_code": error, "error_message": message, "group_id": group_id,
                           "group_state": found["state"],
                           "protocol_type": found["protocol_type"], "protocol_data": found["protocol"],
                           "members": [{"member_id": m["member_id"], "group_instance_id": m["group_instance_id"],
                                        "client_id": m["client_id"], "client_host": m["client_host"],
                                        "member_metadata": m["metadata"], "member_assignment": m["assignment"]}
                                       for m in found["members"]],
                           "authorized_operations": -2147483648})  # KIP-430's: filled in by kafka.aclguard when asked
        return {"throttle_time": 0, "groups": groups}

    def on_list_groups(self, request: KafkaRequest) -> dict[str, Any]:
        body = request.body
        listed = {g: (t, state, kind) for g, t, state, kind in self.groups.groups()}
        consumer = self.consumer_groups
        if consumer is not None:
            for group_id, state in consumer.groups():  # an empty one may have become a classic group
                if state != "Empty" or listed.get(group_id, ("", "Empty", ""))[1] == "Empty":
                    listed[group_id] = (CONSUMER_PROTOCOL_TYPE, state, CONSUMER_PROTOCOL_TYPE)
        states, types = getattr(body, "states_filter", ()), getattr(body, "types_filter", ())
        return {"throttle_time": 0, "error_code": ErrorCode.none,
                "groups": [{"group_id": g, "protocol_type": t, "group_state": state, "group_type": kind}
                           for g, (t, state, kind) in sorted(listed.items()) if listed_by(state, kind, states, types)]}

    # ------------------------------------------------------------------ consumer groups (KIP-848)
    def on_consumer_group_heartbeat(self, request: KafkaRequest) -> dict[str, Any]:
        body = request.body
        consumer = self.consumer_groups
        assert consumer is not None  # served only with it
        return consumer.heartbeat(HeartbeatRequest(
            body.group_id, body.member_id, body.member_epoch, body.instance_id, body.rack_id,
            _ms(body.rebalance_timeout), body.subscribed_topic_names,
            getattr(body, "subscribed_topic_regex", None), body.server_assignor,
            owned_partitions(body.topic_partitions), request.client_id or "", request.client_host,
            request.api_version, aclguard.topic_describer(self.authorizer, request)))

    def on_consumer_group_describe(self, request: KafkaRequest) -> dict[str, Any]:
        consumer = self.consumer_groups
        assert consumer is not None
        groups = []
        for group_id in request.body.group_ids:
            found = consumer.describe(group_id)
            if found is None:
                groups.append({"error_code": ErrorCode.group_id_not_found, "group_id": group_id,
                               "error_message": f"group {group_id} is not a consumer group", "group_state": "Dead",
                               "group_epoch": -1, "assignment_epoch": -1, "assignor_name": "", "members": [],
                               "authorized_operations": -2147483648})
            else:
                groups.append({"error_code": ErrorCode.none, "error_message": None,
                               "authorized_operations": -2147483648, **found})
        return {"throttle_time": 0, "groups": groups}


#: what a transactional produce's verification may answer while the coordinator is busy or
#: moving: the batch is refused with NOT_ENOUGH_REPLICAS, which producers retry (Kafka's
#: ReplicaManager maps them so)
_VERIFY_RETRIABLE = frozenset({ErrorCode.concurrent_transactions, ErrorCode.coordinator_load_in_progress,
                               ErrorCode.coordinator_not_available, ErrorCode.not_coordinator})


#: ListOffsets' sentinel timestamps and the first version that carries each (Kafka's
#: ReplicaManager.timestampMinSupportedVersion); another negative timestamp is never carried
_LIST_OFFSETS_SENTINELS = {-1: 0, -2: 0, -3: 7, -4: 8}
#: KafkaApis._produce_at_once: the request must go where it may wait.
_WOULD_WAIT = object()
#: The most records a Fetch answered on the network loop may be behind the log end (a consumer
#: at the tail); one further behind reads on a worker, its read's CPU beside the loop's.
INLINE_FETCH_LAG = 1000


def _epoch_at(log: Any, offset: int) -> int:
    """The leader epoch that wrote ``offset``, from the log's epoch cache (-1: before its first
    entry); a log without epochs (a single store's, whose Metadata names epoch 0) is all epoch 0."""
    if log.latest_epoch < 0:
        return 0
    return log.leader_epochs.epoch_for_offset(offset)  # type: ignore[no-any-return]


def _topic_refused(name: str | None, error: ErrorCode, topic_id: uuid.UUID = ZERO_TOPIC_ID) -> dict[str, Any]:
    """Metadata's (and DescribeTopicPartitions') answer for a topic it cannot describe."""
    return {"error_code": error, "name": name, "topic_id": topic_id, "is_internal": False, "partitions": [],
            "topic_authorized_operations": UNKNOWN_OPERATIONS}


def delete_topics_asked(request: KafkaRequest) -> list[tuple[str | None, uuid.UUID | None, int, str | None]]:
    """A DeleteTopics request's topics as (name, id, error code, message): by name before v6,
    by name or by id from v6 on, where one with both, with neither, or named twice is refused
    with INVALID_REQUEST (Kafka's ControllerApis.deleteTopics)."""
    body = request.body
    if request.api_version < 6:
        return [(name, None, ErrorCode.none, None) for name in body.topic_names]
    names = [t.name for t in body.topics if t.name is not None]
    ids = [t.topic_id for t in body.topics if t.topic_id not in (None, ZERO_TOPIC_ID)]
    out: list[tuple[str | None, uuid.UUID | None, int, str | None]] = []
    for t in body.topics:
        topic_id = t.topic_id if t.topic_id not in (None, ZERO_TOPIC_ID) else None
        if t.name is None and topic_id is None:
            out.append((None, None, ErrorCode.invalid_request, "neither a topic name nor a topic id"))
        elif t.name is not None and topic_id is not None:
            out.append((t.name, topic_id, ErrorCode.invalid_request, "both a topic name and a topic id"))
        elif (names.count(t.name) if t.name is not None else ids.count(topic_id)) > 1:
            out.append((t.name, topic_id, ErrorCode.invalid_request,
                        "duplicate topic name" if t.name is not None else "duplicate topic id"))
        else:
            out.append((t.name, topic_id, ErrorCode.none, None))
    return out


def _ms(value: Any) -> int:
    """Milliseconds of a kio duration (a timedelta) or an int."""
    return int(value.total_seconds() * 1000) if hasattr(value, "total_seconds") else int(value)


def api_version_ranges(supported: Mapping[int, tuple[int, int]] = SUPPORTED) -> list[dict[str, int]]:
    """ApiVersions' list: every API served and its version range."""
    return [{"api_key": key, "min_version": low, "max_version": high}
            for key, (low, high) in sorted(supported.items())]


class FetchTopic(NamedTuple):
    """A topic of a Fetch request: its name (None when asked for by an id no topic has) and
    the id it was asked for by (Fetch v13+; None before)."""

    name: str | None
    topic_id: uuid.UUID | None


class _AppendWatcher:
    """Wakes the fetches waiting in the purgatory when any process appends to the store: a
    thread sleeps on the store's notification page (a futex every append bumps, in this process
    or another sharing the store) while fetches wait, and checks their partitions when it moves.
    Appends made through this server check their partition themselves, at once."""

    def __init__(self, store: LogStore, purgatory: Purgatory, name: str) -> None:
        self.store = store
        self.purgatory = purgatory
        self.name = name
        self._wanted = threading.Event()
        self._closed = False
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def watch(self, counter: int, keys: set[tuple[str, int]]) -> None:
        """A fetch waits on ``keys`` since the notification counter read ``counter``: make sure
        the thread watches, and check at once if an append came meanwhile (before the thread
        could have seen it)."""
        if self._thread is None:
            with self._lock:
                if self._thread is None and not self._closed:
                    thread = threading.Thread(target=self._run, name=self.name, daemon=True)
                    thread.start()
                    self._thread = thread
        self._wanted.set()
        if self.store.notification() != counter:
            for key in keys:
                self.purgatory.check(key)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            thread = self._thread
        self._wanted.set()
        if thread is not None:
            thread.join(2)

    def _run(self) -> None:
        # ``seen`` is only ever replaced by a value read before the keys that are then checked:
        # an append after that read is caught by the next wait, and every fetch registered
        # before it by the check. Re-reading it while idle would lose an append that lands
        # between a fetch's own check (watch) and that read.
        seen = self.store.notification()
        while not self._closed:
            if not self._fetch_keys():
                self._wanted.clear()
                if not self._fetch_keys():
                    self._wanted.wait(1.0)
                continue
            try:
                self.store.wait(seen, 0.25)
                now = self.store.notification()
            except LogstoreError:  # the store is closing
                return
            if now != seen:
                seen = now
                for key in self._fetch_keys():
                    self.purgatory.check(key)

    def _fetch_keys(self) -> list[tuple[str, int]]:
        return [key for key in self.purgatory.keys() if isinstance(key, tuple) and len(key) == 2]


def _release(answer: Mapping[str, Any]) -> None:
    """Close the file regions of a fetch answer that will not be sent."""
    for topic in answer["responses"]:
        for partition in topic["partitions"]:
            if isinstance(partition["records"], FileRegion):
                partition["records"].close()


def _watch_any(purgatory: Purgatory, keys: set[tuple[str, int]], attempt: Callable[[bool], Any],
               timeout_s: float) -> Future:
    """Watch several keys with one answer: the first completion wins, the others are dropped."""
    answer: Future = Future()
    lock = threading.Lock()

    def settle(done: Future) -> None:
        with lock:
            if answer.done():
                return
            exc = done.exception()
            if exc is not None:
                answer.set_exception(exc)
            else:
                answer.set_result(done.result())

    def once(expired: bool) -> Any:
        return True if answer.done() else attempt(expired)  # answered through another key: drop

    for key in keys:
        purgatory.watch(key, once, timeout_s).add_done_callback(settle)
    return answer
